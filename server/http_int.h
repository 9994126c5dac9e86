/*
 * http_int.h - what the parts of the HTTP server (warren_http) share: the lws
 * glue (context, vhost, the protocols list, connections and their caps), the
 * REST router, its handlers and the sandbox table's sink, the response writer
 * (output queue, JSON answers, the NDJSON stream encoder, WRITEABLE), and the
 * WebSocket, port-proxy and token doors built on them.
 *
 * One struct pss per HTTP transaction, owned by lws (per_session_data);
 * p->srv is set while the transaction is live, from LWS_CALLBACK_HTTP to
 * rest_req_end. One struct http_server per lws context, found from any wsi
 * through lws_context_user().
 */
#ifndef WARREN_HTTP_INT_H
#define WARREN_HTTP_INT_H

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <arpa/inet.h>
#include <libwebsockets.h>

#include "api.h"
#include "chunked.h"
#include "config.h"
#include "log.h"
#include "sbx.h"
#include "http.h"
#include "http_phase.h"
#include "klink.h"
#include "token.h"

#define WRITE_MAX       (64 * 1024)   /* bytes per lws_write */
#define OBUF_MIN        (64 * 1024)   /* payload room of a fresh output buffer */
#define HIGH_WATER      (1024 * 1024) /* queued bytes above which credit is withheld */
#define LOW_WATER       (256 * 1024)  /* ... until the queue is back down to this */
#define RX_BUF          (64 * 1024)   /* lws read size (pt_serv_buf_size) */
#define CHUNK_HDR       10            /* "%x\r\n" for a chunk below 4 GiB */
#define CHUNK_TRL       2             /* "\r\n" after each chunk */
#define HDR_ROOM        1024          /* response header block */
#define KEEPALIVE_S     30            /* idle keep-alive connections */
#define FDS_PER_SBX     8             /* fds a sandbox costs warrend (QMP, channel, console...) */
#define QUERY_STORE     8192          /* decoded query fragments (lws caps headers at 4 KiB) */
#define QUERY_FRAGS_MAX 64
#define CLIENT_BUCKETS  1024 /* client address -> open connections */
#define CONN_FAIR       4    /* past max_connections, an address holding fewer may still connect */
#define STALL_REASON    (PENDING_TIMEOUT_USER_REASON_BASE + 1)

enum resp {
    RESP_NONE = 0,
    RESP_JSON,     /* Content-Length JSON */
    RESP_NDJSON,   /* streamed exec output: chunked (or close-delimited for HTTP/1.0) */
    RESP_DOWNLOAD, /* file bytes with Content-Length */
    RESP_STATIC,   /* a web page or file (web_serve.c): Content-Length, p->ctype */
};

/* One run of output bytes. Payload starts after LWS_PRE + CHUNK_HDR so a chunk
 * header fits in front when it is sealed. */
struct obuf {
    struct obuf *next;
    size_t cap;          /* payload room */
    size_t len;          /* payload bytes */
    size_t credit;       /* stream bytes to acknowledge once written */
    unsigned char *wire; /* set when sealed: first byte on the wire */
    size_t wire_len;
    size_t off; /* wire bytes already written */
    unsigned char mem[];
};

#define OB_PAYLOAD(ob) ((ob)->mem + LWS_PRE + CHUNK_HDR)

struct pss {
    struct lws *wsi;
    struct http_server
        *srv; /* set from LWS_CALLBACK_HTTP until rest_req_end: the transaction is live */
    sbx_op_t op;
    /* Where the request is in its lifecycle (http_phase.h); changed by req_phase only. */
    enum http_phase phase;
    enum api_route_id route;
    unsigned method;
    char sbx[API_ID_MAX + 1];
    bool http10;
    bool ndjson;  /* exec: client streams; process output: always */
    bool bg_exec; /* exec: a background process or PTY (answered 201 with its pid) */
    uint32_t pid; /* /processes/{pid} routes */

    /* chunked request body (Transfer-Encoding: chunked) */
    bool te_chunked;   /* the body is chunk-framed: decode before use */
    bool te_done;      /* its last chunk and trailer arrived */
    bool te_untimeout; /* clear the body timeout lws armed after that last chunk */
    bool te_bad;       /* its framing was malformed: the rest is ignored until closing */
    struct chunked te;

    /* streamed answer: the client must keep taking bytes */
    ev_timer stall;

    /* request body. Its end is a fact apart from the phase: it can come before the
     * request runs, while its upload op is live, or after the answer (LINGER). */
    bool body_done; /* every body byte has arrived (or none is coming) */
    char *body;
    size_t body_len, body_cap;

    /* upload */
    bool upload;
    bool rx_paused;
    bool finish_sent;
    bool in_write; /* inside sbx_op_write: no re-entry from sink->writable */
    bool kick;     /* sink->writable arrived during sbx_op_write */
    unsigned char *pend;
    size_t pend_off, pend_len, pend_cap;

    /* response */
    int status;
    enum resp kind;
    bool need_continue, continue_sent;
    bool hdrs_sent;
    bool close_after; /* close instead of keep-alive */
    bool chunked;
    bool throttled;
    uint64_t clen;      /* Content-Length of JSON and downloads */
    uint64_t dl_queued; /* download bytes queued so far */
    struct obuf *qh, *qt;
    size_t q_bytes;        /* payload bytes queued */
    size_t credit_pending; /* written but not yet acknowledged */
    struct api_utf8_hold hold[2];

    bool by_token; /* admitted by an ?access_token=, not the API key */
    /* HP_RESUMING: the args the request runs with once its sandbox is back. */
    json_t *held;
    const char *ctype;    /* RESP_STATIC: its Content-Type; JSON, NDJSON: one other than
                           * theirs (static string) */
    const char *err_code; /* an error answer's stable code (static string), or NULL */
    /* A list asked of every peer too (HP_OP with no sandbox op): the fan-out, this
     * host's own answer waiting for theirs, and the array's key in it. */
    struct fanout *fan;
    json_t *fan_local;
    const char *fan_key;
    void *jws; /* a Jupyter channels socket bound to this protocol (jupyter_ws.c) */

    /* code contexts and runs (rest_code.c): the exchange with the kernel bridge in
     * place of p->op (which stays 0), and what a JSON-mode run gathers */
    char ctx[API_ID_MAX + 1]; /* {ctx} of the path */
    struct klink *kl;
    struct klink_gather *gather;
    unsigned kl_lines; /* lines passed on */
    uint32_t run_id;   /* the run's connector pid: the X-Warren-Run header (0: none) */
    const struct code_door *code_door; /* a streamed run's door (NULL: REST's) */
    unsigned kctl_stage;               /* Jupyter interrupt/restart: 0 listing contexts, 1 acting */
    /* A file watch's request (watch.c), and the watch an NDJSON answer names in its
     * X-Warren-Watch header (0: none). */
    struct watch_req *watch;
    uint32_t watch_id;
    /* E2B's envd door (envd.c): the call's own state, or NULL for every other route */
    struct envd_req *envd;
    /* a multipart upload (multipart.h): its body is decoded before it is written */
    struct mpart *mp;
    /* a gzip upload (envd_gz.c): inflated before the multipart decoder */
    struct envd_gz *gz;
    /* E2B's control plane (e2b_api.h): its route (0: not an E2B request; its answers and
     * errors then take E2B's shapes), connect's timeout, a list's next page token. */
    unsigned e2b;
    long long e2b_timeout;
    char *xnext;    /* the x-next-token header (malloc'd), or NULL */
    char *xpartial; /* X-Warren-Partial: the peers a fleet list lacks (malloc'd), or NULL */
    char *location; /* a Location header for the answer (malloc'd), or NULL */
};

struct http_server {
    struct ev_loop *loop;
    const struct srv_config *cfg;
    struct sbx_table *t;
    char *key;
    struct lws_context *ctx;
    struct lws_vhost *vh;
    unsigned port;
    char *scratch; /* one NDJSON line being encoded */
    size_t scratch_cap;
    /* open connections, in total and per client address */
    unsigned conns;
    unsigned fd_conns; /* fds left for connections once the sandboxes have theirs */
    struct client *clients[CLIENT_BUCKETS];
    struct conn *accepted; /* counted by the filter, not yet bound to its wsi */
    /* access tokens: the HMAC key, once http_set_token_secret gave it */
    unsigned char token_key[TOKEN_SECRET_LEN];
    bool token_key_set;
    /* warrend's own listener (http.c): it reads each connection's first head to
     * route it to the port proxy or to lws */
    int lfd;
    ev_io lw;
    struct conn *pre;              /* connections whose first head is being read */
    struct ports *ports;           /* the port proxy (ports.h) */
    struct fanout_peers *peers;    /* the fleet's other hosts, for lists (fanout.h) */
    struct peers_dns *peers_dns;   /* keeps peers up to date from DNS, or NULL (peers_dns.h) */
    struct envd_watcher *watchers; /* envd's polling watchers (envd.c) */
    struct images_src *images;     /* image hashes and the source's fill, or NULL */
};

/* ---- resp.c: the response writer ---- */

/* Move p to phase to, if http_phase.h's table allows it; otherwise log, assert (debug
 * builds) and leave p where it is. */
void req_phase(struct pss *p, enum http_phase to);
/* The last byte of the answer is queued: COMPLETE, unless it is already. */
void req_complete(struct pss *p);

/* Ask lws for HTTP_WRITEABLE: all output goes out from there. */
void resp_want_write(struct pss *p);
/* A JSON answer with status. Steals body. Ignored if an answer is already under way. */
void resp_json(struct pss *p, int status, json_t *body);
/* Copy a header into buf; 0 if absent, its length, or -1 if longer than cap - 1. */
int http_hdr(struct lws *wsi, enum lws_token_indexes t, char *buf, int cap);
/* A download's answer: 200, octet-stream, Content-Length size; the op streams on. */
void resp_download_begin(struct pss *p, uint64_t size);
/* An answer without a body (204): Content-Length 0. Ignored if one is under way. */
void resp_empty(struct pss *p, int status);
/* An error answer from an api.h error, a sandbox-core error, or a status, code and message. */
void resp_api_err(struct pss *p, const struct api_err *e);
void resp_sbx_err(struct pss *p, const struct sbx_err *e);
void resp_code(struct pss *p, int status, const char *code, const char *msg);
/* NDJSON stream: the 200 head (chunked unless HTTP/1.0), lines, and the last line (exit
 * record, or an error line when status >= 400; takes body) with the end of the body. */
void resp_ndjson_begin(struct pss *p);
int resp_ndjson_append(struct pss *p, const char *s, size_t n, size_t credit);
void resp_ndjson_end(struct pss *p, int status, json_t *body);
/* The end of an NDJSON stream without a last line of its own (the chunked terminator),
 * and COMPLETE. */
void resp_ndjson_close(struct pss *p);
/* A line saying n bytes from offset off are lost (process output), after what is held. */
void resp_ndjson_lost(struct pss *p, uint64_t off, uint64_t n);
/* The output queue: room for n payload bytes at its tail (NULL: out of memory), the bytes
 * written there (and the stream credit they carry), and dropping it all. */
struct obuf *resp_q_room(struct pss *p, size_t n);
void resp_q_grew(struct pss *p, struct obuf *ob, size_t n, size_t credit);
void resp_q_free(struct pss *p);
/* A streamed answer has bytes waiting: the client must take some within
 * stall_timeout_s (rearm: restart the clock). resp_on_stall is the timer's callback. */
void resp_stall_arm(struct pss *p, bool rearm);
void resp_on_stall(struct ev_loop *loop, ev_timer *w, int revents);
/* HTTP_WRITEABLE: 0, or -1 to close the connection. */
int resp_writeable(struct pss *p);

/* ---- http.c ---- */

/* The lws timeouts of wsi's server, in seconds (its config's http_timeout_s). */
int http_timeout_s(struct lws *wsi);
/* The connection became a WebSocket: no header deadline any more. */
void http_conn_upgraded(struct lws *wsi);
/* A connection the port proxy took is closed: uncount it (ud: its struct conn). */
void http_conn_release(void *ud);

/* ---- http.c: what both WebSocket doors (ws_pty.c, ws_session.c) share ---- */

/* Refuse an upgrade from HTTP_CONFIRM_UPGRADE with e as an ordinary JSON error answer
 * (HTTP/1.1, Connection: close), as REST answers it. Returns 1 (answered: lws completes
 * the transaction), or -1 to hang up when even that could not be written. */
/* LWS_CALLBACK_ADD_HEADERS of a WebSocket handshake (in: lws_process_html_args): adds
 * X-Warren-Host, as every HTTP answer has, so a client behind a fleet's proxy sees which
 * host took its socket. 0, or -1 (no room). */
int http_ws_add_headers(struct lws *wsi, void *in);
int http_ws_refuse(struct lws *wsi, const struct api_err *e);
/* A socket may open on sandbox sbx: it exists and has not ended or died. 0, or -1 with
 * *e (404 sandbox_not_found, 409 sandbox_ended, ...). */
int http_ws_sandbox_open(struct http_server *srv, const char *sbx, struct api_err *e);
/* LWS_CALLBACK_WS_PEER_INITIATED_CLOSE: 0 lets lws echo the client's close; -1 when
 * its payload is invalid (ws_close_check), with our close (1002 or 1007) set. */
int http_ws_peer_close(struct lws *wsi, const void *in, size_t len);

/* The stream's end: what is held, then (when chunked) the empty last chunk; COMPLETE. */
void resp_stream_close(struct pss *p);

/* ---- rest.c: the REST router and handlers ---- */

/* A request head has arrived (uri: its path): route, check, and answer or start. */
void rest_request(struct pss *p, const char *uri);
/* Request body bytes as lws hands them over, and their end: 0, or -1 to close. */
int rest_body(struct pss *p, const void *in, size_t len);
int rest_body_done(struct pss *p);
/* The transaction is over (answered, or its connection closed): cancel what is in flight,
 * free its buffers, clear p->srv. Idempotent. */
void rest_req_end(struct pss *p);

/* ---- rest_code.c: code contexts and runs, over the kernel bridge (klink.h) ---- */

/* A context op ("context_list", "context_create", "context_get", ...) with its request
 * fields (body, borrowed; p->ctx names the context where the op takes one). */
void code_context_op(struct pss *p, const char *op, json_t *body);
/* POST .../run_code with its body. */
void code_run(struct pss *p, json_t *body);
/* GET .../runs/{pid}?offset=N: the run's lines again, from that byte offset. */
void code_run_read(struct pss *p, json_t *args);
/* A door that streams a run's NDJSON lines with code_stream_cb, other than REST's own
 * (p->code_door): how it answers an error known before the first line, and what
 * becomes of a run whose stream it had to drop (out of memory). */
struct code_door {
    void (*fail)(struct pss *p, const struct sbx_err *err);
    void (*abandon)(struct pss *p); /* NULL: the run goes on unread */
};
/* The bridge's lines of a run onto the NDJSON answer as they come (the exchange is
 * p->kl), a keepalive line after each silence, an error after the first line said as
 * an error line; end_of_execution is the bridge's, or added after such an error. */
extern const struct klink_cb code_stream_cb;
/* The request ends: its exchange goes on in the guest unread. */
void code_req_end(struct pss *p);
/* The client took what was queued (p->q_bytes is low again): read on. */
void code_drained(struct pss *p);
/* What the envd door (envd.c) shares with the REST router. */
/* Collect a body up to max_json_body_bytes (its end calls envd_body), or run now when
 * there is none. has_cl, cl: the request's Content-Length. */
void rest_want_body(struct pss *p, int has_cl, uint64_t cl);
/* Resume the request's paused sandbox first (envd_run runs it after). true: held. */
bool rest_resume_first(struct pss *p, json_t *args);
/* sbx_sink.writable of an upload the door started (feeds what is pending). */
void rest_upload_writable(void *user);
/* An upload op has started: phase OP, 100-continue, and what is pending is fed. empty:
 * the body is empty, finished now. */
void rest_upload_started(struct pss *p, bool empty);
/* Decoded upload bytes (after any gzip): through the multipart decoder when there is
 * one, into the upload. 0, or -1 out of memory. */
int rest_upload_bytes(struct pss *p, const void *in, size_t len);
/* The upload's body is refused midway: answered status {"code", "message": why}, its
 * op cancelled; the rest of the body is read and dropped. */
void rest_upload_fail(struct pss *p, int status, const char *why);

/* ---- envd.c: E2B's in-sandbox API (Connect over HTTP/1.1, /files, /health) ---- */

#define ENVD_PORT    49983 /* E2B's envd */
#define ENVD_CI_PORT 49999 /* E2B's code interpreter */

/* A request head: 1 if it is the door's (E2b-Sandbox-Id, or Host {port}-{id}.{domain}
 * for ports 49983 and 49999): then answered or started. 0: not the door's. */
int envd_request(struct pss *p, const char *uri, int has_cl, uint64_t cl);
/* The whole body of a door request arrived (p->body, p->body_len): run it. */
void envd_body(struct pss *p);
/* Run the request with its args (after a resume too). */
void envd_run(struct pss *p, json_t *args);
/* The transaction is over: timers stopped, state freed. Idempotent. */
void envd_req_end(struct pss *p);
/* At the server's end: forget every polling watcher. */
void envd_watchers_free(struct http_server *srv);
/* A refused upload opened its file: remove it, so that no partial file is left. */
void envd_upload_discard(struct pss *p);

/* ---- envd_gz.c: a gzip upload inflated as it arrives (POST /files) ---- */
/* p->gz made, capped at upload_gzip_max_bytes. 0, or -ENOMEM. */
int envd_gz_new(struct pss *p);
void envd_gz_free(struct pss *p);
/* Body bytes (after chunked framing) of a gzip upload. 0, or -1 out of memory. */
int envd_gz_bytes(struct pss *p, const unsigned char *in, size_t n);
/* Input waits to be inflated (the sandbox was full): the pump must drain it. */
bool envd_gz_held(const struct pss *p);
/* The sandbox takes bytes again (nothing pending): inflate what is held. */
void envd_gz_drain(struct pss *p);
/* The body is over: 1 input still held (the pump ends it), -1 refused (answered), 0 a
 * complete gzip body whose bytes were all given to the upload. */
int envd_gz_end(struct pss *p);

/* ---- watch.c: file watches (a route's handlers, and the request's end) ---- */
void watch_start(struct pss *p, json_t *args);
void watch_resume(struct pss *p, json_t *args);
void watch_delete(struct pss *p, json_t *args);
void watch_req_free(struct pss *p);
/* What both doors share: is this process (an entry of sbx_proc_list) a watch; how many
 * watches of a process list run; the sbx_exec body that starts one (NULL when out of
 * memory). */
bool watch_proc_is(json_t *proc);
unsigned watch_running(json_t *list);
json_t *watch_exec_body(const struct srv_config *cfg, const char *path, bool recursive);

/* ---- auth.c: who may do what ---- */

/* The query parameter that carries an access token. Every edge drops it from the query
 * it parses, so it never reaches an error message or a log line. */
#define HTTP_TOKEN_PARAM "access_token="

/* Admit a request for sandbox sbx_id: `Authorization: Bearer <api key>`, or, when scope
 * ("pty", "session", "files") is not NULL, an ?access_token= minted for that sandbox with
 * that scope and not expired. A request that sends the header is judged by it alone.
 * p (may be NULL) is marked by_token. 0, or -EACCES with *e: 401 unauthorized (no or
 * wrong key, a token where only the key opens), 401 token_invalid (malformed, not ours,
 * altered), 401 token_expired, 403 token_wrong_sandbox, 403 token_wrong_scope. */
int http_authorize(struct pss *p, struct lws *wsi, const char *sbx_id, const char *scope,
                   struct api_err *e);
/* The Origin rule for browser sockets (token_origin_allowed with the configured
 * allowed_origins and the request's Host). */
bool http_origin_allowed(const struct http_server *srv, struct lws *wsi);
/* true when query fragment i, frag, is lws 4.1.6's stand-in for an empty last one: a
 * query that ends in '?' or '&' ("/healthz?", "?a=1&") gets a last fragment "/". */
bool http_query_frag_spurious(struct lws *wsi, int i, const char *frag);
/* POST /v1/sandboxes/{id}/tokens with its parsed body: answers 201 or an error. */
void auth_tokens_mint(struct pss *p, json_t *body);

#endif
