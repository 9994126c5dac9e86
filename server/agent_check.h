/*
 * agent_check.h - HAProxy's agent check: a TCP port that tells the proxy in
 * front of several warrend hosts how much room this one has.
 *
 * Each connection gets one line and is closed: "ready up N%" with N the share of
 * sandbox slots still free, at least 1 (HAProxy scales the server's weight by
 * it, so `balance random(2)` favours emptier hosts), or "drain" while the file
 * state_dir/drain exists (no new creates; the host's own ids still route to
 * it). While image_source lists files this host lacks, N is a quarter of that (at least
 * 1): the host still takes the odd create of a template it has, but the proxy favours
 * hosts that have them all. The port listens on the API's address; it says nothing
 * secret.
 */
#ifndef WARREN_AGENT_CHECK_H
#define WARREN_AGENT_CHECK_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

struct srv_config;
struct sbx_table;
struct agent_check;
struct images_src;

/* Listen on cfg->listen_addr:cfg->agent_check_port (which is non-zero). imgs (NULL: no
 * source) says whether images are still lacking. 0, or -errno. */
int agent_check_start(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table *t,
                      const struct images_src *imgs, struct agent_check **out);
void agent_check_stop(struct agent_check *a);
/* The line the check answers now, NUL-terminated, "\n"-ended, in buf. lacking: the image
 * source lists files this host does not have yet. */
void agent_check_line(const struct srv_config *cfg, unsigned live, bool lacking, char *buf,
                      size_t cap);

#endif
