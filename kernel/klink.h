/*
 * klink.h - the link to a sandbox's kernel bridge (warren-kerneld,
 * docs/KERNELD.md): code contexts, runs, and whatever else speaks its wire.
 *
 * warrend reaches kerneld only as a sandbox process: klink_request starts the
 * connector (`/proc/1/exe --connect /run/warren/kernel.sock`) in the
 * background, writes one JSON request line to its stdin and reads its NDJSON
 * answer back from the process's output ring, line by line, each line checked
 * (one JSON object with a string "type", at most max_line bytes). The
 * connector's pid names the exchange: klink_read reads the same lines again
 * from any byte offset of that ring, after a client went away or warrend
 * restarted, since the process and its ring live in the guest.
 *
 * No transport here: the REST door, the agent socket and the Jupyter door
 * turn the callbacks into their own answers. The pure parts (the line
 * splitter and checker, the JSON-mode gatherer) have no I/O and are
 * unit-tested and fuzzed.
 *
 * Ownership: a struct klink belongs to this module from the call that made it
 * until its done callback has returned or the caller called klink_cancel,
 * whichever comes first; after either it never calls back again. Callbacks
 * never run inside the call that started the exchange; klink_cancel may be
 * called from inside a callback. Lines handed to a callback are borrowed for
 * the call.
 */
#ifndef WARREN_KLINK_H
#define WARREN_KLINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <ev.h>

#include "sbx.h"

/* The connector's exit status when the sandbox has no kernel bridge at all. */
#define KLINK_EXIT_NO_KERNEL 64

/* ---- lines: pure ---- */

enum klink_line_kind {
    KLINK_LINE_OK,       /* one JSON object (type: its string "type", or NULL) */
    KLINK_LINE_TOO_LONG, /* longer than max: dropped (p is NULL) */
    KLINK_LINE_BAD,      /* not such an object: dropped (p holds it) */
    KLINK_LINE_LOST,     /* n bytes from off are gone from the guest's ring (klink.c only) */
};

struct klink_line {
    enum klink_line_kind kind;
    const char *p; /* the line, without its '\n', NUL-terminated */
    size_t n;
    uint64_t off;     /* stream offset of its first byte */
    uint64_t end;     /* stream offset just past its '\n': where the next line starts */
    json_t *obj;      /* KLINK_LINE_OK: the parsed object (borrowed), else NULL */
    const char *type; /* KLINK_LINE_OK: its string "type" (NULL if it has none), else NULL */
};

/* Nonzero stops klink_lines_feed, which returns that value. */
typedef int klink_line_fn(void *ctx, const struct klink_line *l);

struct klink_lines {
    char *buf; /* the line being gathered */
    size_t len, cap;
    size_t max;        /* longest line accepted, '\n' excluded */
    uint64_t off;      /* stream offset of the next byte fed */
    uint64_t line_off; /* stream offset of buf[0] */
    bool skip;         /* discarding up to the next '\n' */
    bool over;         /* ... because the line was too long (reported at its end) */
};

/* A splitter at stream offset off. resync: off may fall inside a line; what comes
 * before the first '\n' is dropped silently (klink_read feeds the byte before the
 * offset so a line starting exactly there is kept). */
void klink_lines_init(struct klink_lines *lb, size_t max, uint64_t off, bool resync);
/* Feed n bytes: fn for every complete line. 0, -ENOMEM, or fn's nonzero return. */
int klink_lines_feed(struct klink_lines *lb, const void *p, size_t n, klink_line_fn *fn, void *ctx);
void klink_lines_free(struct klink_lines *lb);

/* Check one line (no '\n'): one JSON object. 0 and *obj (new reference) with *type
 * pointing into it (NULL when it has no non-empty string "type"), or -EINVAL. */
int klink_line_check(const char *p, size_t n, json_t **obj, const char **type);

/* A run's line as its readers get it (new reference, NULL when out of memory): the
 * object of a line that has a "type", else an E2B-style error object saying what was
 * wrong ({"type":"error","name":"OutputTooLarge"|"BadKernelOutput"|"OutputLost",
 * "value","traceback":""}). max is the line bound, for the message. */
json_t *klink_line_object(const struct klink_line *l, size_t max);
/* An E2B-style error line's object: {"type":"error","name","value","traceback":""}. */
json_t *klink_error_object(const char *name, const char *value);

/* ---- requests: pure ---- */

/* A client's run body {"code","context_id"?,"language"?,"env"?,"timeout_seconds"?} as
 * kerneld's run request (max_line: the line bound it is told). 0 and *req (new), or
 * SBX_E_INVALID_ARGUMENT (or SBX_E_INTERNAL) with *err. */
int klink_run_req(json_t *body, size_t max_line, json_t **req, struct sbx_err *err);
/* A context op ("context_create", "context_list", "context_get", "context_delete",
 * "context_restart", "context_interrupt") for context ctx (NULL for create and list):
 * body (may be NULL) is create's {"language"?,"cwd"?,"env"?}, and must hold nothing
 * else, for the others nothing. 0 and *req, or an sbx_errcode with *err. */
int klink_context_req(const char *op, const char *ctx, json_t *body, json_t **req,
                      struct sbx_err *err);

/* ---- the JSON-mode answer: pure ---- */

struct klink_gather {
    size_t max, used; /* bytes of text and results kept, and their bound */
    bool truncated;
    char *out, *err; /* stdout and stderr texts joined */
    size_t out_len, out_cap, err_len, err_cap;
    json_t *results;  /* result objects, without "type" */
    json_t *error;    /* the first error object, without "type", or NULL */
    json_int_t count; /* execution_count, or -1 */
    bool ended;       /* end_of_execution seen */
};

void klink_gather_init(struct klink_gather *g, size_t max);
/* One checked line's object. 0 or -ENOMEM. */
int klink_gather_add(struct klink_gather *g, json_t *obj, const char *type);
/* {"stdout","stderr","results","error","execution_count","truncated"}: new, or NULL
 * when out of memory. */
json_t *klink_gather_result(const struct klink_gather *g);
void klink_gather_free(struct klink_gather *g);

/* ---- the exchange: async, on the sandbox table ---- */

struct klink;

struct klink_cb {
    /* The connector runs and has its request: pid names the exchange (a run's id). */
    void (*started)(void *user, uint32_t pid);
    /* One line, checked (see kind). */
    void (*line)(void *user, const struct klink_line *l);
    /* keepalive_ms of silence (only when klink_opts.keepalive_ms is not 0). */
    void (*keepalive)(void *user);
    /* The end: err NULL once the answer is complete (its end_of_execution, or the one
     * line of a single answer, or the connector ended); else what failed
     * (SBX_E_NO_KERNEL, SBX_E_KERNEL_UNAVAILABLE, SBX_E_CONTEXT_NOT_FOUND, a kerneld
     * "fail" line's code, or the sandbox's own errors). */
    void (*done)(void *user, const struct sbx_err *err);
};

struct klink_opts {
    size_t max_line;
    unsigned keepalive_ms; /* 0: no keepalive */
    bool single;           /* the answer is one line (context ops): done after it */
    bool open;             /* an open exchange (channels): lines both ways, no last line;
                              the connector's end is its end */
};

/* Start the connector in sandbox id and send it req (one JSON object, borrowed).
 * 0 and *out, or an sbx_errcode with *err and no callback. */
int klink_request(struct sbx_table *t, struct ev_loop *loop, const char *id, json_t *req,
                  const struct klink_opts *o, const struct klink_cb *cb, void *user,
                  struct klink **out, struct sbx_err *err);
/* Read exchange pid again from stream offset off (lines starting at or after it),
 * following it until its end. No started() call: the caller knows pid. */
int klink_read(struct sbx_table *t, struct ev_loop *loop, const char *id, uint32_t pid,
               uint64_t off, const struct klink_opts *o, const struct klink_cb *cb, void *user,
               struct klink **out, struct sbx_err *err);
/* No more callbacks. An exchange whose request is not yet sent is ended (its connector
 * killed); one under way goes on in the guest (a run outlives its reader). */
void klink_cancel(struct klink *k);
/* An open exchange: n more bytes for kerneld (whole lines, as its wire wants), written
 * to the connector's stdin in order after the request. At most KLINK_WRITE_MAX bytes
 * wait at once. 0, -EAGAIN (that many wait: retry after some lines came back), -EPIPE
 * (the exchange is not reading: not started yet, over, or cancelled), -ENOMEM. A write
 * the sandbox refuses ends the exchange (done with its error). */
#define KLINK_WRITE_MAX (1024 * 1024)
int klink_write(struct klink *k, const void *p, size_t n);
/* A reader that cannot take more for now (its client is slow): klink stops returning
 * credit to the guest, which then stops sending; resume gives it back. The run itself
 * never waits: its ring in the guest goes on, and a reader too slow is told of what was
 * lost (KLINK_LINE_LOST). */
void klink_pause(struct klink *k);
void klink_resume(struct klink *k);
/* Interrupt exchange pid (a run): its connector is ended, so kerneld interrupts the run.
 * As sbx_proc_ctl: 0 and done(NULL, {}) on sink, or an sbx_errcode with *err. */
int klink_stop(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_sink *sink,
               void *user, sbx_op_t *op, struct sbx_err *err);

#endif
