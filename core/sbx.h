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
 * Callbacks never run inside the sbx_* call that started the operation. A
 * call that fails synchronously returns a nonzero enum sbx_errcode with
 * *err filled in, and then no callback ever comes for it. sbx_op_write,
 * sbx_op_finish and sbx_op_consumed may call the op's sink (even done)
 * before they return: a requester must not hold state across them that a
 * callback would invalidate. sbx_op_cancel never calls back for its op.
 *
 * Errors are transport-neutral (sbx_err.h): a code and a message; the REST
 * edge turns them into an HTTP status and its JSON error body, other edges
 * into their own forms. Successful results are jansson objects whatever the
 * transport (the REST edge sends them as they are).
 *
 * JSON: bodies passed in are borrowed; json_t results handed to callbacks
 * or returned in *out become the callee's (it must json_decref them).
 */
#ifndef WARREN_SBX_H
#define WARREN_SBX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <ev.h>

#include "sbx_err.h"

struct sbx_table;
struct srv_config;

/* Room for a sandbox's or a snapshot's id and its NUL: a kind, this host's id and 16
 * random hex digits ("sb-h2-0123456789abcdef"), so a proxy in front of several hosts
 * routes by the id alone. Ids of warrends before host ids ("sb-" + 16 hex) stay valid. */
#define SBX_ID_CAP 40
typedef uint64_t sbx_op_t; /* 0 is never a valid op */

struct sbx_sink {
    /* Final answer. Success: err is NULL and body the result (or NULL). Failure: err is
     * set (borrowed for the call) and body is NULL. For streamed results (exec output,
     * file read) done comes after the last data; body is then the trailing object
     * (exec: the exit record) or NULL. Takes body. */
    void (*done)(void *user, const struct sbx_err *err, json_t *body);
    /* File read: the guest opened the file; size bytes follow. Sent before any data. */
    void (*head)(void *user, uint64_t size);
    /* Streamed bytes: exec fd 1/2 at stream offset off, or file content (fd 0). The
     * requester acknowledges what it has passed on with sbx_op_consumed(). */
    void (*data)(void *user, int fd, uint64_t off, const void *p, size_t n);
    /* Upload: the guest has room again; sbx_op_write() will accept more. */
    void (*writable)(void *user);
    /* Process output (sbx_proc_output): n bytes from offset off are gone from the ring;
     * the next data starts at off + n. Before any data, and again whenever the reader
     * fell behind so far that the ring overwrote what it had not read. */
    void (*lost)(void *user, uint64_t off, uint64_t n);
};

int sbx_table_new(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table **out);
/* Stop everything. kill_vms false leaves VMs running for adoption by the next warrend. */
void sbx_table_free(struct sbx_table *t, bool kill_vms);

/* ---- synchronous calls: 0 and a new result in *out, or an sbx_errcode with *err ---- */

/* The sandbox's record. */
int sbx_get(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
/* {"sandboxes":[...], "filter":{...}}; state and metadata_filter may be NULL. */
int sbx_list(struct sbx_table *t, const char *state, json_t *metadata_filter, json_t **out,
             struct sbx_err *err);
/* End a sandbox: its record, now "ended". */
int sbx_delete(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
/* Body {"ttl_seconds": N}: the record with its new expiry. */
int sbx_set_timeout(struct sbx_table *t, const char *id, json_t *body, json_t **out,
                    struct sbx_err *err);

/* ---- asynchronous operations: 0 and *op (sink->done will follow), or an sbx_errcode
 * with *err and no callback ---- */

/* Create from a POST /v1/sandboxes body: done(NULL, sandbox record) once the guest
 * answered. */
int sbx_create(struct sbx_table *t, json_t *body, const struct sbx_sink *sink, void *user,
               sbx_op_t *op, struct sbx_err *err);

/* Exec. stream=false: done(NULL, {exit_code, stdout, stderr, duration_ms, ...}).
 * stream=true: data(fd 1|2) calls, then done(NULL, {"type":"exit",...}). */
int sbx_exec(struct sbx_table *t, const char *id, json_t *body, bool stream,
             const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* File download: head(size), data(fd 0)..., done(NULL, NULL); or done(err, NULL). */
int sbx_file_read(struct sbx_table *t, const char *id, const char *path,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* File upload: feed with sbx_op_write()/sbx_op_finish(); done(NULL, {path,size}). */
int sbx_file_write(struct sbx_table *t, const char *id, const char *path, unsigned mode,
                   const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* stat/list/mkdir/remove/rename: done(NULL, json). kind is "stat", "list", "mkdir",
 * "remove", "rename"; args holds path, depth, recursive, to as applicable. */
int sbx_file_op(struct sbx_table *t, const char *id, const char *kind, json_t *args,
                const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* ---- processes that belong to the sandbox (background execs and PTYs) ----
 * sbx_exec with "background": true or "pty": {"cols","rows"} in its body starts one and
 * answers done(NULL, {"pid": N, "tag": ...}) as soon as it runs. The guest keeps them and
 * their output; these calls ask it. */

/* pid 0: done(NULL, {"processes": [...]}); else done(NULL, that process's object) or
 * SBX_E_PROCESS_NOT_FOUND. */
int sbx_proc_list(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_sink *sink,
                  void *user, sbx_op_t *op, struct sbx_err *err);

/* Output from offset: lost() when bytes are gone, data(fd 1|2, off, ...) acknowledged with
 * sbx_op_consumed(), then done(NULL, {"type":"exit",...}) once the process exited and all
 * was sent, or (follow false) done(NULL, {"type":"end","offset":N}) once caught up.
 * SBX_E_BAD_OFFSET for an offset past the end. */
int sbx_proc_output(struct sbx_table *t, const char *id, uint32_t pid, uint64_t offset, bool follow,
                    const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* One action on a process: sig (1..64), or cols+rows (a PTY's new size), or stdin bytes
 * (at most PROTO_MAX_DATA) and/or eof. done(NULL, {}) once the guest did it. */
#define SBX_PROC_STDIN_MAX (64 * 1024) /* bytes of stdin per call (one guest frame) */
struct sbx_proc_ctl {
    const void *data;
    size_t len;
    bool eof;
    int sig;
    unsigned cols, rows;
};
int sbx_proc_ctl(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_proc_ctl *c,
                 const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* body must be an object whose keys are all in the NULL-ended allowed list: 0, or an
 * sbx_errcode with *err. */
int sbx_check_fields(json_t *body, const char *const *allowed, struct sbx_err *err);

/* Upload bytes. Returns how many were taken (maybe 0: wait for sink->writable). */
size_t sbx_op_write(struct sbx_table *t, sbx_op_t op, const void *p, size_t n);
/* Upload complete. */
void sbx_op_finish(struct sbx_table *t, sbx_op_t op);
/* The requester has passed n more bytes of streamed data on (returns credit to the guest). */
void sbx_op_consumed(struct sbx_table *t, sbx_op_t op, size_t n);
/* The requester is gone: no further callbacks; a running exec is killed, an upload aborted. */
void sbx_op_cancel(struct sbx_table *t, sbx_op_t op);

/* PATCH /v1/sandboxes/{id}/network: body is the network object (as at create), which
 * replaces the running VM's policy; done(NULL, sandbox record) once applied, or an error
 * with the old policy still in force. */
int sbx_set_network(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
                    void *user, sbx_op_t *op, struct sbx_err *err);

/* Count of sandboxes not ended (for /healthz). */
unsigned sbx_count_live(const struct sbx_table *t);
/* The warm pool's figures (pool.h pool_stats), or JSON null when it is off. New reference. */
json_t *sbx_pool_stats(const struct sbx_table *t);
/* GET /v1/templates: {"templates":[{"name","default","size_bytes","pools":[...]}]}, every
 * image in image_dir by name, each with its pools' figures (pool.h pool_stats). 0 or
 * an SBX_E_* status (err filled). */
int sbx_templates(struct sbx_table *t, json_t **out, struct sbx_err *err);

/* ---- the port proxy (server/ports.c) ---- */
/* Sandbox id, usable as for an operation (a paused one resumes, a frozen one
 * continues, it counts as used), with networking on: 0 with its VM's
 * namespace path in ns and its VM id in vm (24 bytes); or an sbx_errcode with
 * *err (SBX_E_CONFLICT: networking is off). */
int sbx_port_open(struct sbx_table *t, const char *id, char *ns, size_t cap, char vm[24],
                  struct sbx_err *err);
/* Is sandbox id still running VM vm? 0, or -ESRCH (deleted, ended, another VM).
 * used: there was traffic: it counts as activity (idle timeout), and a frozen
 * VM continues. */
int sbx_port_check(struct sbx_table *t, const char *id, const char *vm, bool used);
/* Was sandbox id created with port in public_ports (no auth needed)? false when
 * there is no such sandbox. No side effect. */
bool sbx_port_public(struct sbx_table *t, const char *id, unsigned port);

#endif
