/*
 * api.h - pure helpers of the REST layer: routes, query strings, request
 * bodies, and the NDJSON/UTF-8/base64 encoding of streamed
 * exec output. No I/O and no lws here, so everything is unit-tested and
 * fuzzed (tests/server/test_api.c, tests/fuzz/fuzz_api.c).
 *
 * Errors are reported in a struct api_err (HTTP status, stable code, message);
 * http.c turns them into {"error":{...}} bodies with api_error().
 * Ownership: json_t results (*out, q->metadata) belong to the caller.
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

enum api_route_id {
    API_R_NONE = 0,
    API_R_HEALTHZ,      /* /healthz */
    API_R_SANDBOXES,    /* /v1/sandboxes */
    API_R_SANDBOX,      /* /v1/sandboxes/{id} */
    API_R_TIMEOUT,      /* /v1/sandboxes/{id}/timeout */
    API_R_EXEC,         /* /v1/sandboxes/{id}/exec */
    API_R_FILES,        /* /v1/sandboxes/{id}/files */
    API_R_FILES_STAT,   /* /v1/sandboxes/{id}/files/stat */
    API_R_FILES_LIST,   /* /v1/sandboxes/{id}/files/list */
    API_R_FILES_MKDIR,  /* /v1/sandboxes/{id}/files/mkdir */
    API_R_FILES_RENAME, /* /v1/sandboxes/{id}/files/rename */
    API_R_PROCS,        /* /v1/sandboxes/{id}/processes */
    API_R_PROC,         /* /v1/sandboxes/{id}/processes/{pid} */
    API_R_PROC_OUTPUT,  /* /v1/sandboxes/{id}/processes/{pid}/output */
    API_R_PROC_STDIN,   /* /v1/sandboxes/{id}/processes/{pid}/stdin */
    API_R_PROC_SIGNAL,  /* /v1/sandboxes/{id}/processes/{pid}/signal */
    API_R_PROC_RESIZE,  /* /v1/sandboxes/{id}/processes/{pid}/resize */
    API_R_TOKENS,       /* /v1/sandboxes/{id}/tokens (issue 7) */
    API_R_PTY,          /* /v1/sandboxes/{id}/pty[/{pid}]: a WebSocket; a plain GET probes */
    API_R_SESSION,      /* /v1/sandboxes/{id}/session: a WebSocket; a plain GET probes */
    API_R_SNAPSHOT_SB,  /* /v1/sandboxes/{id}/snapshot */
    API_R_FORK,         /* /v1/sandboxes/{id}/fork */
    API_R_PAUSE,        /* /v1/sandboxes/{id}/pause */
    API_R_NETWORK,      /* /v1/sandboxes/{id}/network */
    API_R_RESUME,       /* /v1/sandboxes/{id}/resume */
    API_R_SNAPSHOTS,    /* /v1/snapshots */
    API_R_SNAPSHOT,     /* /v1/snapshots/{id} (the id in sbx) */
    API_R_TEMPLATES,    /* /v1/templates */
};

#define API_PID_MAX 4194304 /* Linux's PID_MAX_LIMIT: the largest pid a path may name */

struct api_route {
    enum api_route_id id;
    unsigned methods; /* API_* methods the route answers */
    bool auth;        /* needs the bearer key */
    char sbx[API_ID_MAX + 1];
    uint32_t pid; /* API_R_PROC*, API_R_PTY (0: none): 1..API_PID_MAX */
};

/* Match a decoded, normalized path (no query). 0, or -ENOENT (404). */
int api_route_match(const char *path, struct api_route *r);

/* ---- query strings ---- */
enum api_qparam {
    API_Q_PATH = 1 << 0,      /* path=/abs */
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
