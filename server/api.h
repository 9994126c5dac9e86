/*
 * api.h - pure helpers of the REST layer: the route table (API_ROUTE_MAP) and
 * its matcher, query strings, request bodies, and the NDJSON/UTF-8/base64
 * encoding of streamed exec output. No I/O and no lws here, so everything is
 * unit-tested and fuzzed (tests/server/test_api.c, tests/fuzz/fuzz_api.c).
 *
 * Errors are reported in a struct api_err (HTTP status, stable code, message);
 * http.c turns them into {"error":{...}} bodies with api_error().
 * Ownership: json_t results (*out, q->metadata, api_query_args) belong to the
 * caller.
 * Strings in struct api_query point into the caller's fragments.
 */
#ifndef WARREN_API_H
#define WARREN_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "sbx.h" /* struct sbx_proc_ctl */

#define API_ID_MAX   64   /* longest sandbox id accepted in a path */
#define API_PATH_MAX 4096 /* longest guest path accepted */

struct api_err {
    int status;       /* HTTP status */
    const char *code; /* stable code: bad_request, not_found, ... */
    char msg[256];
};

struct sbx_err;

/* Error body: {"error":{"code":code,"message":...}} (apierr.c, like the next). */
json_t *api_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The error body of a sandbox-core error: its stable name (sbx_err_name) and message. */
json_t *api_error_of(const struct sbx_err *e);

/* ---- routes ---- */
enum api_method {
    API_GET = 1 << 0,
    API_POST = 1 << 1,
    API_PUT = 1 << 2,
    API_DELETE = 1 << 3,
    API_OTHER = 1 << 4,
    API_PATCH = 1 << 5,
};

/* How a verb's request body is taken before its handler runs. */
enum api_body {
    API_BODY_NONE = 0, /* none is read: the handler runs on the head, its query as args */
    API_BODY_JSON,     /* one JSON object, collected whole (max_json_body_bytes), then parsed */
    API_BODY_RAW,      /* streamed to the guest as it comes (an upload): needs a length */
};

/* What else a row says about a verb. */
enum api_verb_flag {
    API_VF_GUEST = 1 << 0,    /* reaches the guest: on a paused or starting sandbox it waits
                                 for the sandbox to be back */
    API_VF_DISK = 1 << 1,     /* fills the server's disk: 507 below min_free_disk_mb */
    API_VF_CREATED = 1 << 2,  /* its success is 201 */
    API_VF_NDJSON = 1 << 3,   /* Accept: application/x-ndjson streams the answer */
    API_VF_DOWNLOAD = 1 << 4, /* answers with a file's bytes (the core's head() starts them) */
    API_VF_SOCKET = 1 << 5,   /* a WebSocket: a plain GET only probes it, and the query is
                                 the socket's, not judged here */
};

/*
 * Every REST route, one row each, the only place a route is described: api.c
 * expands it into the path table (api_routes) and rest.c into its handlers, as
 * libuv expands UV_ERRNO_MAP, so the matcher stays pure (unit-tested, fuzzed)
 * while the handlers live with lws. A new route is a row here and a function in
 * rest.c.
 *
 *   R(ID, pattern, scope, V(METHOD, query, body, flags, handler)...)
 *
 * pattern: '/'-separated literals and placeholders: {id} (1..API_ID_MAX of
 *   [A-Za-z0-9_-]: a sandbox's id, or a snapshot's), {pid} (decimal 1..API_PID_MAX,
 *   no leading zero), {pid?} (the same, or absent: last only). One trailing slash is
 *   tolerated. No two patterns match the same path.
 * scope: the access-token scope that opens it besides the API key (NULL: the key
 *   only). Everything under /v1 needs one or the other, even a path that matches no
 *   row; /healthz is open.
 * One V per method the route answers (others: 405), at most API_VERBS_MAX:
 *   query: the API_Q_* keys it takes (any other: 400); one that takes path requires it.
 *   body: API_BODY_*. flags: API_VF_*.
 *   handler: a function of rest.c, void (struct pss *, json_t *args), args being the
 *   parsed JSON body, or the query as api_query_args gives it.
 */
/* clang-format off */
#define API_ROUTE_MAP(R, V)                                                                  \
    R(HEALTHZ, "/healthz", NULL,                                                             \
      V(GET, 0, NONE, 0, h_healthz))                                                         \
    R(SANDBOXES, "/v1/sandboxes", NULL,                                                      \
      V(GET, API_Q_STATE | API_Q_METADATA, NONE, 0, h_sandbox_list)                          \
      V(POST, 0, JSON, API_VF_DISK | API_VF_CREATED, h_sandbox_create))                      \
    R(SANDBOX, "/v1/sandboxes/{id}", NULL,                                                   \
      V(GET, 0, NONE, 0, h_sandbox_get)                                                      \
      V(DELETE, 0, NONE, 0, h_sandbox_delete))                                               \
    R(TIMEOUT, "/v1/sandboxes/{id}/timeout", NULL,                                           \
      V(POST, 0, JSON, 0, h_timeout))                                                        \
    R(EXEC, "/v1/sandboxes/{id}/exec", NULL,                                                 \
      V(POST, 0, JSON, API_VF_GUEST | API_VF_NDJSON, h_exec))                                \
    R(FILES, "/v1/sandboxes/{id}/files", "files",                                            \
      V(GET, API_Q_PATH, NONE, API_VF_GUEST | API_VF_DOWNLOAD, h_file_read)                  \
      V(PUT, API_Q_PATH | API_Q_MODE, RAW, API_VF_GUEST | API_VF_DISK, h_file_write)         \
      V(DELETE, API_Q_PATH | API_Q_RECURSIVE, NONE, API_VF_GUEST, h_file_remove))            \
    R(FILES_STAT, "/v1/sandboxes/{id}/files/stat", "files",                                  \
      V(GET, API_Q_PATH, NONE, API_VF_GUEST, h_file_stat))                                   \
    R(FILES_LIST, "/v1/sandboxes/{id}/files/list", "files",                                  \
      V(GET, API_Q_PATH | API_Q_DEPTH, NONE, API_VF_GUEST, h_file_list))                     \
    R(FILES_MKDIR, "/v1/sandboxes/{id}/files/mkdir", "files",                                \
      V(POST, API_Q_PATH, NONE, API_VF_GUEST, h_file_mkdir))                                 \
    R(FILES_RENAME, "/v1/sandboxes/{id}/files/rename", "files",                              \
      V(POST, 0, JSON, API_VF_GUEST, h_file_rename))                                         \
    R(FILES_WATCH, "/v1/sandboxes/{id}/files/watch", "files",                                \
      V(GET, API_Q_PATH | API_Q_RECURSIVE, NONE, API_VF_GUEST, h_watch_start))               \
    R(FILES_WATCH_ONE, "/v1/sandboxes/{id}/files/watch/{pid}", "files",                      \
      V(GET, API_Q_OFFSET, NONE, API_VF_GUEST, h_watch_resume)                               \
      V(DELETE, 0, NONE, API_VF_GUEST, h_watch_delete))                                      \
    R(PROCS, "/v1/sandboxes/{id}/processes", NULL,                                           \
      V(GET, 0, NONE, API_VF_GUEST, h_proc_list))                                            \
    R(PROC, "/v1/sandboxes/{id}/processes/{pid}", NULL,                                      \
      V(GET, 0, NONE, API_VF_GUEST, h_proc_list))                                            \
    R(PROC_OUTPUT, "/v1/sandboxes/{id}/processes/{pid}/output", NULL,                        \
      V(GET, API_Q_OFFSET | API_Q_FOLLOW, NONE, API_VF_GUEST, h_proc_output))                \
    R(PROC_STDIN, "/v1/sandboxes/{id}/processes/{pid}/stdin", NULL,                          \
      V(POST, 0, JSON, API_VF_GUEST, h_proc_stdin))                                          \
    R(PROC_SIGNAL, "/v1/sandboxes/{id}/processes/{pid}/signal", NULL,                        \
      V(POST, 0, JSON, API_VF_GUEST, h_proc_signal))                                         \
    R(PROC_RESIZE, "/v1/sandboxes/{id}/processes/{pid}/resize", NULL,                        \
      V(POST, 0, JSON, API_VF_GUEST, h_proc_resize))                                         \
    R(TOKENS, "/v1/sandboxes/{id}/tokens", NULL,                                             \
      V(POST, 0, JSON, 0, h_tokens))                                                         \
    /* A new PTY (no pid) runs a program: h_pty_probe also wants "exec" of a token. */      \
    R(PTY, "/v1/sandboxes/{id}/pty/{pid?}", "pty",                                           \
      V(GET, 0, NONE, API_VF_SOCKET, h_pty_probe))                                           \
    R(SESSION, "/v1/sandboxes/{id}/session", "session",                                      \
      V(GET, 0, NONE, API_VF_SOCKET, h_session_probe))                                       \
    R(SNAPSHOT_SB, "/v1/sandboxes/{id}/snapshot", NULL,                                      \
      V(POST, 0, JSON, API_VF_DISK | API_VF_CREATED, h_snapshot))                            \
    R(FORK, "/v1/sandboxes/{id}/fork", NULL,                                                 \
      V(POST, 0, JSON, API_VF_DISK | API_VF_CREATED, h_fork))                                \
    R(PAUSE, "/v1/sandboxes/{id}/pause", NULL,                                               \
      V(POST, 0, JSON, 0, h_pause))                                                          \
    R(NETWORK, "/v1/sandboxes/{id}/network", NULL,                                           \
      V(PATCH, 0, JSON, 0, h_network))                                                       \
    R(RESUME, "/v1/sandboxes/{id}/resume", NULL,                                             \
      V(POST, 0, JSON, 0, h_resume))                                                         \
    R(SNAPSHOTS, "/v1/snapshots", NULL,                                                      \
      V(GET, 0, NONE, 0, h_snapshot_list))                                                   \
    R(SNAPSHOT, "/v1/snapshots/{id}", NULL,                                                  \
      V(GET, 0, NONE, 0, h_snapshot_get)                                                     \
      V(DELETE, 0, NONE, 0, h_snapshot_delete))                                              \
    R(TEMPLATES, "/v1/templates", NULL,                                                      \
      V(GET, 0, NONE, 0, h_templates))
/* clang-format on */

/* API_R_HEALTHZ, API_R_SANDBOXES, ...: the rows' ids, in the map's order. */
#define API_R_ENUM_(id, ...) API_R_##id,
/* clang-format off */
enum api_route_id {
    API_R_NONE = 0,
    API_ROUTE_MAP(API_R_ENUM_, _)
    API_R_COUNT
};
/* clang-format on */
#undef API_R_ENUM_

#define API_PID_MAX   4194304 /* Linux's PID_MAX_LIMIT: the largest pid a path may name */
#define API_VERBS_MAX 3

struct api_verb {
    unsigned method; /* one API_* method */
    unsigned query;  /* API_Q_* keys it takes */
    enum api_body body;
    unsigned flags; /* API_VF_* */
};

struct api_route_def {
    const char *pattern;
    const char *scope;                    /* token scope besides the key, or NULL */
    struct api_verb verbs[API_VERBS_MAX]; /* a method of 0 ends them */
};

/* The rows of API_ROUTE_MAP, by id ([API_R_NONE] is empty). */
extern const struct api_route_def api_routes[API_R_COUNT];

struct api_route {
    enum api_route_id id;
    unsigned methods; /* API_* methods the route answers: its verbs' */
    bool auth;        /* needs the bearer key (or a token) */
    char sbx[API_ID_MAX + 1];
    uint32_t pid; /* {pid} (0: none): 1..API_PID_MAX */
};

/* Match a decoded, normalized path (no query). 0, or -ENOENT (404). */
int api_route_match(const char *path, struct api_route *r);
/* The verb of route id for method: its row's, or NULL (405). */
const struct api_verb *api_route_verb(enum api_route_id id, unsigned method);

/* ---- query strings ---- */
enum api_qparam {
    API_Q_PATH = 1 << 0,      /* path=/abs (required where taken) */
    API_Q_MODE = 1 << 1,      /* mode=0644 (octal) */
    API_Q_DEPTH = 1 << 2,     /* depth=N (1..API_DEPTH_MAX) */
    API_Q_RECURSIVE = 1 << 3, /* recursive=true|false|1|0 */
    API_Q_STATE = 1 << 4,     /* state=running */
    API_Q_METADATA = 1 << 5,  /* metadata.KEY=VALUE, repeatable */
    API_Q_OFFSET = 1 << 6,    /* offset=N (a process's output offset) */
    API_Q_FOLLOW = 1 << 7,    /* follow=true|false|1|0 */
};
#define API_DEPTH_MAX 64

struct api_query {
    unsigned seen; /* API_Q_* present */
    const char *path;
    unsigned mode;
    unsigned depth;
    bool recursive;
    const char *state;
    json_t *metadata; /* object of KEY: VALUE strings, or NULL; caller decrefs */
    uint64_t offset;  /* default 0 */
    bool follow;      /* default false */
};

/* Parse decoded "name=value" fragments (as lws hands them out: split at
 * literal '&', percent-decoded). Only parameters in `allowed` are accepted;
 * others are a 400. Defaults: mode 0644, depth 1, recursive false.
 * 0 or -EINVAL with *e filled (q->metadata is then NULL). */
int api_query_parse(const char *const *frags, size_t n, unsigned allowed, struct api_query *q,
                    struct api_err *e);
void api_query_clear(struct api_query *q);
/* The keys a verb takes (API_Q_* in keys) as the args object its handler gets, as a
 * JSON body would carry them: numbers and booleans always (defaults filled in),
 * path, state and metadata when given. NULL when out of memory. */
json_t *api_query_args(const struct api_query *q, unsigned keys);

/* An absolute guest path: non-empty, starts with '/', <= API_PATH_MAX bytes, UTF-8. */
int api_path_check(const char *what, const char *path, struct api_err *e);

/* ---- bodies ---- */
/* Parse a JSON request body of n bytes (need not be NUL-terminated). An empty
 * (or all-whitespace) body is {}. Anything but one JSON object is a 400. */
int api_body_parse(const char *buf, size_t n, json_t **out, struct api_err *e);
/* POST .../files/rename body {"from":..,"to":..} -> file-op args {"path":from,"to":to}. */
int api_rename_args(json_t *body, json_t **out, struct api_err *e);

/* ---- headers ---- */
/* Accept header lists application/x-ndjson. */
bool api_wants_ndjson(const char *accept);

/* ---- streamed exec output as NDJSON ---- */
/* Bytes of one fd that ended in the middle of a UTF-8 sequence, kept back so
 * text split across chunks stays text. */
struct api_utf8_hold {
    unsigned char b[3];
    unsigned n;
    uint64_t off; /* stream offset of b[0] */
};

bool api_utf8_valid(const unsigned char *p, size_t n);
/* Length (0..3) of a trailing, still-completable partial UTF-8 sequence. */
size_t api_utf8_partial_tail(const unsigned char *p, size_t n);

size_t api_b64_len(size_t n);
/* Writes api_b64_len(n) bytes (no NUL). */
void api_b64_encode(const unsigned char *in, size_t n, char *out);
/* Decodes standard padded base64; -1 on bad input, else the length. */
long api_b64_decode(const char *in, size_t n, unsigned char *out);

/* Most bytes one api_ndjson_chunk (or api_ndjson_flush) call writes for n input bytes,
 * whatever the offsets and the bytes held from earlier calls. */
size_t api_ndjson_max(size_t n);
/* Encode bytes of fd (1 stdout, 2 stderr) at stream offset off as zero or one
 * line {"type":"stdout","offset":N,"data":"..."}\n (or "data_b64" when not
 * valid UTF-8), prepending h's held bytes and holding back a new incomplete
 * tail. out needs api_ndjson_max(n) bytes. Returns bytes written. */
size_t api_ndjson_chunk(struct api_utf8_hold *h, int fd, uint64_t off, const unsigned char *p,
                        size_t n, char *out);
/* Emit whatever h still holds (as data_b64: it is an incomplete sequence). */
size_t api_ndjson_flush(struct api_utf8_hold *h, int fd, char *out);

/* ---- processes ---- */
#define API_PTY_SIZE_MAX 10000 /* most columns or rows of a PTY */

/* A signal as a client names it: a number 1..64, "SIGTERM", "TERM" (any case). The number,
 * or -1 when it names no signal. */
int api_signal_parse(const json_t *v);

/*
 * The JSON body of POST .../processes/{pid}/stdin ({"data": text} or {"data_b64": ...},
 * and/or {"eof": true}), .../signal ({"signal": name or number}) or .../resize
 * ({"cols": C, "rows": R}) as one action in *c. Stdin given as base64 is decoded into
 * *raw (the caller frees it; c->data points into it or into body). 0, or -EINVAL with *e
 * (then *raw is NULL).
 */
enum api_proc_action { API_PROC_STDIN, API_PROC_SIGNAL, API_PROC_RESIZE };
int api_proc_ctl_parse(enum api_proc_action a, json_t *body, struct sbx_proc_ctl *c,
                       unsigned char **raw, struct api_err *e);

#endif
