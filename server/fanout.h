/*
 * fanout.h - ask every peer host the same GET, side by side, for lists that
 * span a fleet (GET /v1/sandboxes, /v1/snapshots through any host).
 *
 * Peers come from conf `peers`: "name=host:port,name=host:port"; the entry
 * whose name is this host's host_id is skipped, so every host can share one
 * list. Host names are resolved once, at start (a fleet's peers are stable
 * addresses, a StatefulSet's per-pod DNS names). More peers may join them from
 * DNS (peers_dns.h): those are named by their address. A fan-out copies the
 * peers it asks, so a list may be replaced while a fan-out is in flight. Each
 * peer gets
 *     GET <path> HTTP/1.1, the client's Authorization, X-Warren-Local: 1,
 *     Connection: close
 * and its answer is read whole (up to max_bytes) or abandoned at the
 * deadline. X-Warren-Local makes the peer answer with its own sandboxes only,
 * so a fan-out never fans out again. The caller gets every peer's outcome at
 * once, after the last answer or the deadline, and merges them: this module
 * knows HTTP/1.1 framing, never JSON.
 */
#ifndef WARREN_FANOUT_H
#define WARREN_FANOUT_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>

#include <sys/socket.h>

#define FANOUT_PEERS_MAX   64
#define FANOUT_HOST_ID_MAX 12 /* = CFG_HOST_ID_MAX: a name in `peers` */
/* A peer's name: a host id, or for a peer from DNS its address, "[v6]:port" at most. */
#define FANOUT_NAME_MAX 63

struct fanout_peers; /* parsed and resolved conf `peers` */
struct fanout;       /* one fan-out in flight */

struct fanout_result {
    const char *name; /* the peer's host id */
    bool ok;          /* an answer arrived, whole, with status 200 */
    int status;       /* its HTTP status, or 0 (no answer: refused, timed out, too big) */
    const char *why;  /* !ok: a short reason ("timeout", "connection refused", ...) */
    const char *head; /* ok: the status line and headers (CRLF between lines, no blank
                       * line), NUL-terminated, valid during the callback */
    const char *body; /* ok: the body, NUL-terminated, valid during the callback */
    size_t len;
};

/* Parse spec ("" gives an empty list) and resolve its hosts, skipping self. 0 and *out,
 * or -EINVAL with a message in err. */
int fanout_peers_parse(const char *spec, const char *self, struct fanout_peers **out, char *err,
                       size_t errcap);
void fanout_peers_free(struct fanout_peers *p);
unsigned fanout_peers_count(const struct fanout_peers *p);
/* A new list: base's peers, then each of the n addresses (with their port) that base does
 * not hold already and that is not an earlier one of them, named by its address, up to
 * FANOUT_PEERS_MAX in all (*dropped says how many did not fit). base may be NULL.
 * 0 and *out, or -ENOMEM. */
int fanout_peers_merge(const struct fanout_peers *base, const struct sockaddr_storage *addrs,
                       unsigned n, struct fanout_peers **out, unsigned *dropped);
/* Whether a and b name the same peers at the same addresses, in the same order. */
bool fanout_peers_same(const struct fanout_peers *a, const struct fanout_peers *b);
/* The i-th peer's name (i < count). */
const char *fanout_peer_name(const struct fanout_peers *p, unsigned i);

typedef void (*fanout_done_fn)(void *user, const struct fanout_result *r, unsigned n);

/* GET path (with its query) from every peer. auth is the client's Authorization header
 * value (or NULL). done is called exactly once, never from inside fanout_start, unless
 * fanout_cancel comes first. 0 and *out, or -errno (nothing started). */
int fanout_start(struct ev_loop *loop, const struct fanout_peers *peers, const char *path,
                 const char *auth, unsigned timeout_ms, size_t max_bytes, fanout_done_fn done,
                 void *user, struct fanout **out);
/* Abandon a fan-out: done is never called. NULL is fine. */
void fanout_cancel(struct fanout *f);

#endif
