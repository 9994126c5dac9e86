/*
 * sbx.h - the sandbox table: every sandbox, its VM, its guest channel and
 * the operations in flight on it.
 *
 * The table owns every sandbox; a request or socket never does. Requests
 * talk to the table through ids: a sandbox is named by its id string, an
 * operation by the sbx_op_t the table returns, and the table reports back
 * to the requester through struct sbx_sink callbacks carrying the
 * requester's own `user` pointer.
 *
 * `user` belongs to the requester: the table never dereferences or frees
 * it, only hands it back to the sink. It must stay valid until the op's
 * sink->done has been called or the requester has called sbx_op_cancel(),
 * whichever comes first: after either, the table never calls back for that
 * op again (a cancelled op stays silent even if it still drains its guest
 * stream), so a requester may free `user` right after cancelling.
 *
 * Callbacks never run inside the sbx_* call that started the operation,
 * except sink->done for errors detected synchronously, which the call
 * instead reports by returning the HTTP status with *err filled in (and no
 * callback at all).
 *
 * JSON: bodies passed in are borrowed; json_t results handed to callbacks
 * become the callee's (it must json_decref them).
 */
#ifndef WARREN_SBX_H
#define WARREN_SBX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <ev.h>

struct sbx_table;
struct srv_config;
typedef uint64_t sbx_op_t; /* 0 is never a valid op */

struct sbx_sink {
    /* Final answer: HTTP status and JSON body (error bodies use api_error()). For streamed
     * responses (exec NDJSON, file read) done comes after the last data; status is then
     * informational and body is the trailing object (exec: the exit record) or NULL. */
    void (*done)(void *user, int status, json_t *body);
    /* File read: the guest opened the file; size bytes follow. Sent before any data. */
    void (*head)(void *user, uint64_t size);
    /* Streamed bytes: exec fd 1/2 at stream offset off, or file content (fd 0). The
     * requester acknowledges what it has passed on with sbx_op_consumed(). */
    void (*data)(void *user, int fd, uint64_t off, const void *p, size_t n);
    /* Upload: the guest has room again; sbx_op_write() will accept more. */
    void (*writable)(void *user);
};

int sbx_table_new(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table **out);
/* Stop everything. kill_vms false leaves VMs running for adoption by the next warrend. */
void sbx_table_free(struct sbx_table *t, bool kill_vms);

/* Error body: {"error":{"code":code,"message":...}}. */
json_t *api_error(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- synchronous calls: return an HTTP status and set *out (a body or an error) ---- */
int sbx_get(struct sbx_table *t, const char *id, json_t **out);
int sbx_list(struct sbx_table *t, const char *state, json_t *metadata_filter, json_t **out);
int sbx_delete(struct sbx_table *t, const char *id, json_t **out);
int sbx_set_timeout(struct sbx_table *t, const char *id, json_t *body, json_t **out);

/* ---- asynchronous operations: return 0 and set *op (sink->done will follow), or an HTTP
 * status >= 400 with *err set and no callback ---- */

/* POST /v1/sandboxes body. done(201, sandbox json) once the guest answered. */
int sbx_create(struct sbx_table *t, json_t *body, const struct sbx_sink *sink, void *user,
               sbx_op_t *op, json_t **err);

/* Exec. stream=false: done(200, {exit_code, stdout, stderr, duration_ms, ...}).
 * stream=true: data(fd 1|2) calls, then done(200, {"type":"exit",...}). */
int sbx_exec(struct sbx_table *t, const char *id, json_t *body, bool stream,
             const struct sbx_sink *sink, void *user, sbx_op_t *op, json_t **err);

/* File download: head(size), data(fd 0)..., done(200, NULL); or done(4xx/5xx, error). */
int sbx_file_read(struct sbx_table *t, const char *id, const char *path,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, json_t **err);

/* File upload: feed with sbx_op_write()/sbx_op_finish(); done(200, {path,size}). */
int sbx_file_write(struct sbx_table *t, const char *id, const char *path, unsigned mode,
                   const struct sbx_sink *sink, void *user, sbx_op_t *op, json_t **err);

/* stat/list/mkdir/remove/rename: done(200, json). kind is "stat", "list", "mkdir",
 * "remove", "rename"; args holds path, depth, recursive, to as applicable. */
int sbx_file_op(struct sbx_table *t, const char *id, const char *kind, json_t *args,
                const struct sbx_sink *sink, void *user, sbx_op_t *op, json_t **err);

/* Upload bytes. Returns how many were taken (maybe 0: wait for sink->writable). */
size_t sbx_op_write(struct sbx_table *t, sbx_op_t op, const void *p, size_t n);
/* Upload complete. */
void sbx_op_finish(struct sbx_table *t, sbx_op_t op);
/* The requester has passed n more bytes of streamed data on (returns credit to the guest). */
void sbx_op_consumed(struct sbx_table *t, sbx_op_t op, size_t n);
/* The requester is gone: no further callbacks; a running exec is killed, an upload aborted. */
void sbx_op_cancel(struct sbx_table *t, sbx_op_t op);

/* Count of sandboxes not ended (for /healthz). */
unsigned sbx_count_live(const struct sbx_table *t);

#endif
