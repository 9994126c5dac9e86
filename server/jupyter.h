/*
 * jupyter.h - Jupyter's kernel API on warrend (docs/API.md "Jupyter kernels"),
 * what Jupyter's gateway clients (notebook 6.4, jupyter-server 1.23 with
 * --gateway-url) call: kernelspecs, kernels, and the channels WebSocket.
 *
 * A kernel is a sandbox of its kernelspec's template (jupyter_kernelspecs),
 * created and deleted with it; its UUID is kept in the sandbox's metadata
 * (JUP_META_ID), so the mapping survives a warrend restart with the index.
 * The kernel runs in the guest (docs/KERNELD.md); each channels socket gets
 * a connector process there, which outlives the socket: a reconnecting
 * client takes over a connector left by a dropped one and reads on from
 * what was last written to that one (bounded by the process's output ring;
 * a gap is told as a stderr stream message).
 *
 * The pure parts (this header's first half) are unit-tested by
 * tests/server/test_jupyter.c; the REST handlers live in jupyter_rest.c and
 * the socket in jupyter_ws.c; both reach the guest through klink.h. Ownership: returned json_t and
 * malloc'd strings are the caller's.
 */
#ifndef WARREN_JUPYTER_H
#define WARREN_JUPYTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define JUP_SPECS_MAX 16
#define JUP_NAME_MAX  64
#define JUP_UUID_LEN  36
/* A kernel id: a UUID, or on a host with a host_id one whose last group is
 * "<host>_<12 hex digits>" (still five groups of word characters, as Jupyter's URL
 * patterns want), so a fleet's proxy routes /api/kernels/{id} by the id alone. */
#define JUP_ID_MAX    (JUP_UUID_LEN + 13)
#define JUP_META_ID   "jupyter.kernel_id"
#define JUP_META_SPEC "jupyter.kernelspec"

struct jup_spec {
    char name[JUP_NAME_MAX + 1];
    char tmpl[JUP_NAME_MAX + 1];
};

/* jupyter_kernelspecs ("name=template,..."): the count (1..max), or -1 when malformed. */
int jup_specs_parse(const char *conf, struct jup_spec *out, size_t max);
/* A kernel id's shape: 8-4-4-4-12 lowercase hex digits, the last group possibly
 * "<host>_" (1-12 of a-z 0-9) and 12 hex digits. */
bool jup_id_valid(const char *s);
/* A new random (version 4) UUID in out (JUP_ID_MAX + 1 bytes), its last group carrying
 * host when host is not NULL or empty (1-12 of a-z 0-9). 0 or -errno. */
int jup_id_new(char *out, const char *host);

/* The kernelspec object of GET /api/kernelspecs/{name}. */
json_t *jup_spec_json(const struct jup_spec *s);
/* A kernel's model {id, name, last_activity, execution_state, connections}. */
json_t *jup_model(const char *id, const char *spec, const char *last_activity, const char *state,
                  unsigned conns);
/* The execution_state of an iopub status message (msg: a kernel message) when it is
 * one Jupyter defines, else NULL: the guest's words are never passed on unchecked. */
const char *jup_status_state(json_t *msg);

/*
 * One client frame (a Jupyter message as JSON text) as the line for the guest's
 * channels connection: it must be a JSON object with an object "header"; "channel",
 * when given, one of shell, control, stdin (shell when absent). *out (malloc'd,
 * '\n'-ended, no other newline) and *n; or -1 with *why.
 */
int jup_frame_line(const char *buf, size_t len, char **out, size_t *n, const char **why);

/* A message of warrend's own for the client, as Jupyter text: an iopub stream on
 * stderr (text) when kind is "stream", else a message of type kind with content. */
char *jup_notice(const char *kind, json_t *content);

/* ---- the door (needs the server) ---- */
struct pss;
struct lws;
struct http_server;

/* The REST handlers, from rest.c's rows (api.h), the kernel id in p->sbx. */
void jup_specs_list(struct pss *p, json_t *args);
void jup_spec_get(struct pss *p, json_t *args);
void jup_kernels_list(struct pss *p, json_t *args);
void jup_kernel_create(struct pss *p, json_t *body);
void jup_kernel_get(struct pss *p, json_t *args);
void jup_kernel_delete(struct pss *p, json_t *args);
void jup_kernel_interrupt(struct pss *p, json_t *body);
void jup_kernel_restart(struct pss *p, json_t *body);

/* Admit a kernel API request: the key as "Authorization: token|Bearer KEY" or ?token=KEY.
 * 0, or -1 with *status, *code and msg filled. */
struct api_err;
int jup_authorize(struct lws *wsi, const char *key, struct api_err *e);
/* The sandbox of kernel id into sbx (API_ID_MAX + 1) and its kernelspec into spec
 * (JUP_NAME_MAX + 1, may be NULL): 0, or -1 with *e (404 kernel_not_found). */
int jup_kernel_sbx(struct http_server *srv, const char *id, char *sbx, char *spec,
                   struct api_err *e);

/* The channels WebSocket (jupyter_ws.c). Bound to protocols[0] (no subprotocol), so
 * http.c hands over its WebSocket reasons. */
bool jup_ws_route(struct lws *wsi);
int jup_ws_confirm(struct http_server *srv, struct lws *wsi);
/* LWS WebSocket reasons of a channels socket; *slot is its state (in the pss). */
int jup_ws_cb(struct lws *wsi, int reason, void **slot, void *in, size_t len);
/* Sockets open on kernel sandbox sbx. */
unsigned jup_ws_count(const char *sbx);
/* The kernel's execution_state as its last iopub status relayed on a channels socket
 * of kernel sandbox sbx said it; "idle" when none was since warrend started. */
const char *jup_ws_state(const char *sbx);
/* Forget the connectors of a deleted kernel's sandbox. */
void jup_ws_forget(const char *sbx);

#endif
