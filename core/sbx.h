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
 * The core speaks C: requests are the structs below (decoded by each door
 * from its wire), results are records (struct sbx_result and what it points
 * to), and errors are transport-neutral (sbx_err.h): a code and a message.
 * Each door turns them into its own forms (the REST door: JSON and an HTTP
 * status). Ownership is said at each struct: requests are borrowed for the
 * call, records are borrowed from the core.
 */
#ifndef WARREN_SBX_H
#define WARREN_SBX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ev.h>

#include "sbx_err.h"

struct sbx_table;
struct srv_config;

/* Room for a sandbox's or a snapshot's id and its NUL: a kind, this host's id and 16
 * random hex digits ("sb-h2-0123456789abcdef"), so a proxy in front of several hosts
 * routes by the id alone. Ids of warrends before host ids ("sb-" + 16 hex) stay valid. */
#define SBX_ID_CAP 40

/* A byte string: p NULL means absent; it may hold NUL bytes when the wire allows. */
struct sbx_str {
    const char *p;
    size_t n;
};

/* One entry of a string map (env, metadata): key NUL-terminated (a key holding a NUL
 * byte is the door's to refuse), val of val.n bytes. */
struct sbx_kv {
    const char *key;
    struct sbx_str val;
};

/*
 * ---- records ----
 * What the core hands back. A record and everything it points to are the
 * core's, borrowed: in a callback for the call; from a synchronous call until
 * the caller next calls into the table or returns to the loop. Each door turns
 * them into its own wire (server/sbx_json.c: the REST JSON). Strings are
 * bytes as they are (a guest's may be any bytes): making them text is the
 * door's.
 */

/* An egress policy: each list ", "-separated ("" for none), addresses apart from names. */
struct sbx_net_rec {
    bool internet;
    const char *allow_out, *allow_names, *deny_out, *deny_names;
    unsigned rate_mbit, max_connections;
};

/* A sandbox, as GET shows it. Times are ms since the epoch, 0 for unset. */
struct sbx_rec {
    const char *id, *tmpl;
    const char *state; /* the state's name as clients see it */
    int64_t created_ms, expires_ms;
    unsigned idle_s, mem_mb, vcpus;
    const struct sbx_kv *metadata;
    size_t nmetadata;
    const char *vm_id; /* NULL: none */
    bool frozen, paged_out, keep_running, persistent, auto_pause;
    bool has_network; /* false: networking is off */
    struct sbx_net_rec network;
    const uint16_t *public_ports;
    size_t npublic;
    bool paused;
    int64_t paused_ms;
    const char *source;      /* "snapshot", "pool", "clone" or "boot" */
    const char *snapshot_id; /* NULL: none */
    bool ended;              /* then ended_ms and end_reason */
    int64_t ended_ms;
    const char *end_reason;
};

/* A command's exit: an exec's (with its output when buffered) or an attach's end. */
struct sbx_exec_rec {
    bool streamed; /* the end of streamed output: shown as {"type": "exit", ...} */
    int64_t exit_code;
    int64_t signal; /* 0: none */
    bool timed_out;
    bool has_duration; /* an exec's: its duration_ms */
    int64_t duration_ms;
    bool buffered; /* out[0] (stdout) and out[1] (stderr) hold its output */
    struct sbx_str out[2];
    bool truncated; /* the output passed exec_max_output */
};

/* A background process or PTY, as the guest listed it (checked). */
struct sbx_proc_rec {
    uint32_t pid;
    struct sbx_str tag; /* p NULL: none */
    struct sbx_str cmd; /* p NULL: "" */
    bool pty;
    unsigned cols, rows; /* a PTY's */
    bool running, stdin_open;
    uint64_t output_start, output_end;
    uint64_t started_ms;       /* 0: unknown */
    int64_t exit_code, signal; /* once not running; signal 0: none */
};

/* A file's stat (or one listing entry): each field absent when its has_ / p is not set. */
struct sbx_stat_rec {
    struct sbx_str name, path, type;
    bool has_size, has_mode, has_mtime;
    uint64_t size, mode;
    int64_t mtime; /* seconds since the epoch */
};

/* A snapshot (sbx_snap.h), as GET shows it. */
struct sbx_snap_rec {
    const char *id;
    const char *parent;      /* the sandbox it was taken of */
    const char *parent_snap; /* the snapshot that sandbox came from; NULL: none */
    const char *tmpl;
    const char *type; /* "sandbox", "fork" or "pause" */
    unsigned mem_mb, vcpus;
    uint64_t size; /* bytes its own files take */
    int64_t created_ms;
    const struct sbx_kv *metadata;
    size_t nmetadata;
    bool has_network; /* networking was on: the policy its sandboxes keep */
    struct sbx_net_rec network;
};

enum sbx_res_kind {
    SBX_RES_SANDBOX,   /* sandbox */
    SBX_RES_EXEC,      /* exec: an exec's exit, or an attached process's */
    SBX_RES_STARTED,   /* started: a background exec runs */
    SBX_RES_PROCS,     /* procs: the process list */
    SBX_RES_PROC,      /* procs: one process, procs.v[0] */
    SBX_RES_CAUGHT_UP, /* offset: an output read without follow reached the end */
    SBX_RES_STAT,      /* stat */
    SBX_RES_LISTING,   /* listing */
    SBX_RES_PATH,      /* file.path: mkdir, remove or rename done */
    SBX_RES_WRITTEN,   /* file: an upload done, file.size bytes */
    SBX_RES_DONE,      /* nothing to tell: a process control done */
    SBX_RES_SNAPSHOT,  /* snap: a snapshot taken */
    SBX_RES_FORK       /* fork: the sandboxes a fork made, and its snapshot */
};

struct sbx_result {
    enum sbx_res_kind kind;
    union {
        const struct sbx_rec *sandbox;
        const struct sbx_exec_rec *exec;
        struct {
            uint32_t pid;
            const char *tag; /* NULL: none */
        } started;
        struct {
            const struct sbx_proc_rec *v;
            size_t n;
        } procs;
        uint64_t offset;
        const struct sbx_stat_rec *stat;
        struct {
            const char *path;
            const struct sbx_stat_rec *entries;
            size_t n;
            bool truncated;
        } listing;
        struct {
            const char *path;
            uint64_t size;
        } file;
        const struct sbx_snap_rec *snap;
        struct {
            const struct sbx_rec *v;
            size_t n;
            const char *snapshot_id;
        } fork;
    } u;
};

typedef uint64_t sbx_op_t; /* 0 is never a valid op */

struct sbx_sink {
    /* Final answer. Success: err is NULL and res the result (or NULL: nothing, as at a
     * download's end). Failure: err is set and res is NULL. Both borrowed for the call.
     * For streamed results (exec output, file read) done comes after the last data; res
     * is then the trailing record (exec: its exit) or NULL. */
    void (*done)(void *user, const struct sbx_err *err, const struct sbx_result *res);
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

/*
 * ---- requests ----
 * Each door (REST JSON, the agent socket's msgpack, ...) decodes its wire into
 * these structs and checks only what is particular to that wire (types, unknown
 * fields); every rule about the values (ranges, combinations, names) is the
 * core's and is checked by the call that takes the request, the same for
 * every door. A door that finds a value of the wrong type for a field the core
 * checks passes it in a form that check refuses (SBX_NOT_INT, an empty string,
 * SIZE_MAX entries or bytes), so that each message is written once, here.
 * A request and everything it points to are the caller's and are only
 * borrowed for the call: the core copies what it keeps.
 */

/* A number a request leaves out (the default applies), and one the door could
 * not read as an integer (refused by the core with the field's range). */
#define SBX_UNSET   INT64_MIN
#define SBX_NOT_INT (INT64_MIN + 1)

/* An egress policy (docs/NETWORK.md), as given at create or by PATCH .../network.
 * Each list entry is an IPv4 address or CIDR or a domain name; a NULL entry is one
 * the door found was not a string (refused with its index). */
struct sbx_net_req {
    int internet; /* -1: the configured default; 0 or 1 */
    const char *const *allow_out;
    size_t nallow_out;
    const char *const *deny_out;
    size_t ndeny_out;
    int64_t rate_mbit, max_connections; /* SBX_UNSET: the configured default */
};

#define SBX_PUBLIC_PORTS_MAX 16 /* create option public_ports: entries */

struct sbx_create_req {
    const char *tmpl;                        /* NULL: the configured default (or the snapshot's) */
    const char *snapshot_id;                 /* NULL: not from a snapshot */
    bool tmpl_given;                         /* a template was named (refused with snapshot_id) */
    int64_t ttl_s, idle_s, memory_mb, vcpus; /* SBX_UNSET: the configured default */
    const struct sbx_kv *env;                /* nenv entries, for every exec */
    size_t nenv;
    const struct sbx_kv *metadata; /* nmetadata entries, shown and filtered on */
    size_t nmetadata;
    bool keep_running, persistent;
    bool auto_pause;                   /* the TTL pauses it instead of ending it */
    const struct sbx_net_req *network; /* NULL: the default policy */
    const int64_t *public_ports;       /* npublic ports reachable without auth */
    size_t npublic;
};

#define SBX_TAG_MAX 256 /* longest tag of a background process */

struct sbx_exec_req {
    struct sbx_str cmd;         /* a shell command line; or */
    const struct sbx_str *argv; /* argc arguments (argv non-NULL: given) */
    size_t argc;
    const char *cwd;  /* NULL: the guest's default */
    const char *user; /* NULL: "root"; else "root" or "user" */
    struct sbx_str stdin_data;
    bool has_timeout;
    double timeout_s;         /* when has_timeout: (0, 86400] */
    const struct sbx_kv *env; /* over the sandbox's env */
    size_t nenv;
    int background;     /* -1: not said; 0 or 1 */
    struct sbx_str tag; /* a background process's tag */
    bool pty;           /* run in a PTY of cols x rows (always in the background) */
    int64_t cols, rows;
};

enum sbx_file_kind {
    SBX_FILE_STAT,
    SBX_FILE_LIST,
    SBX_FILE_MKDIR,
    SBX_FILE_REMOVE,
    SBX_FILE_RENAME
};

struct sbx_file_req {
    enum sbx_file_kind kind;
    const char *path;
    const char *to; /* rename: the new path */
    int64_t depth;  /* list: 1..10, SBX_UNSET: 1 */
    bool recursive; /* remove: a directory and what it holds */
};

int sbx_table_new(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table **out);
/* Stop everything. kill_vms false leaves VMs running for adoption by the next warrend. */
void sbx_table_free(struct sbx_table *t, bool kill_vms);

/* ---- synchronous calls: 0 and a new result in *out, or an sbx_errcode with *err ---- */

/* The sandbox's record (borrowed, see records). */
int sbx_get(struct sbx_table *t, const char *id, struct sbx_rec *out, struct sbx_err *err);
/* The sandboxes in state (NULL or "": running and frozen) whose metadata holds every
 * entry of the filter (nfilter entries): *n records in *out, an array the caller frees
 * (free()); the records in it are borrowed. */
int sbx_list(struct sbx_table *t, const char *state, const struct sbx_kv *filter, size_t nfilter,
             struct sbx_rec **out, size_t *n, struct sbx_err *err);
/* End a sandbox: its record, now "ended". */
int sbx_delete(struct sbx_table *t, const char *id, struct sbx_rec *out, struct sbx_err *err);
/* A new time to live of ttl_s seconds from now (SBX_UNSET: refused as missing): the
 * record with its new expiry. */
int sbx_set_timeout(struct sbx_table *t, const char *id, int64_t ttl_s, struct sbx_rec *out,
                    struct sbx_err *err);

/* ---- asynchronous operations: 0 and *op (sink->done will follow), or an sbx_errcode
 * with *err and no callback ---- */

/* Create: done(NULL, SBX_RES_SANDBOX) once the guest answered. */
int sbx_create(struct sbx_table *t, const struct sbx_create_req *req, const struct sbx_sink *sink,
               void *user, sbx_op_t *op, struct sbx_err *err);

/* Exec. stream=false: done(NULL, SBX_RES_EXEC with the output buffered).
 * stream=true: data(fd 1|2) calls, then done(NULL, SBX_RES_EXEC, streamed). */
int sbx_exec(struct sbx_table *t, const char *id, const struct sbx_exec_req *req, bool stream,
             const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* File download: head(size), data(fd 0)..., done(NULL, NULL); or done(err, NULL). */
int sbx_file_read(struct sbx_table *t, const char *id, const char *path,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* File upload: feed with sbx_op_write()/sbx_op_finish(); done(NULL, SBX_RES_WRITTEN). */
int sbx_file_write(struct sbx_table *t, const char *id, const char *path, unsigned mode,
                   const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* stat/list/mkdir/remove/rename: done(NULL, SBX_RES_STAT, _LISTING or _PATH). */
int sbx_file_op(struct sbx_table *t, const char *id, const struct sbx_file_req *req,
                const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* ---- processes that belong to the sandbox (background execs and PTYs) ----
 * sbx_exec with "background": true or "pty": {"cols","rows"} in its body starts one and
 * answers done(NULL, SBX_RES_STARTED) as soon as it runs. The guest keeps them and
 * their output; these calls ask it. */

/* pid 0: done(NULL, SBX_RES_PROCS); else done(NULL, SBX_RES_PROC: that process) or
 * SBX_E_PROCESS_NOT_FOUND. */
int sbx_proc_list(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_sink *sink,
                  void *user, sbx_op_t *op, struct sbx_err *err);

/* Output from offset: lost() when bytes are gone, data(fd 1|2, off, ...) acknowledged with
 * sbx_op_consumed(), then done(NULL, SBX_RES_EXEC, streamed) once the process exited and
 * all was sent, or (follow false) done(NULL, SBX_RES_CAUGHT_UP) once caught up.
 * SBX_E_BAD_OFFSET for an offset past the end. */
int sbx_proc_output(struct sbx_table *t, const char *id, uint32_t pid, uint64_t offset, bool follow,
                    const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* One action on a process: sig (1..64), or cols+rows (a PTY's new size), or stdin bytes
 * (at most PROTO_MAX_DATA) and/or eof. done(NULL, SBX_RES_DONE) once the guest did it. */
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

/* Upload bytes. Returns how many were taken (maybe 0: wait for sink->writable). */
size_t sbx_op_write(struct sbx_table *t, sbx_op_t op, const void *p, size_t n);
/* Upload complete. */
void sbx_op_finish(struct sbx_table *t, sbx_op_t op);
/* The requester has passed n more bytes of streamed data on (returns credit to the guest). */
void sbx_op_consumed(struct sbx_table *t, sbx_op_t op, size_t n);
/* The requester is gone: no further callbacks; a running exec is killed, an upload aborted. */
void sbx_op_cancel(struct sbx_table *t, sbx_op_t op);

/* PATCH /v1/sandboxes/{id}/network: req (as at create) replaces the running VM's policy;
 * done(NULL, SBX_RES_SANDBOX) once applied, or an error with the old policy still in
 * force. */
int sbx_set_network(struct sbx_table *t, const char *id, const struct sbx_net_req *req,
                    const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* Count of sandboxes not ended (for /healthz). */
unsigned sbx_count_live(const struct sbx_table *t);

/* One warm pool (a template at one shape): its figures (pool.h). tmpl and state are
 * borrowed as records are. */
struct sbx_pool_rec {
    const char *tmpl;
    unsigned mem_mb, vcpus;
    const char *state; /* its template's: "none", "booting", "saving" or "ready" */
    unsigned size, ready;
    bool filling;
    unsigned handed_out, rebuilds;
    bool spare;
    unsigned spares, spares_ready, spares_prefaulted;
};

#define SBX_POOLS_MAX 16 /* pools at once (pool_max_templates is capped here) */

/* The warm pools' figures: on false when the pool is off. has_default: the default
 * template's pool (at its default shape) exists and dflt holds its figures; else it is
 * "off" for default_tmpl. pools: every pool. */
struct sbx_pool_stats {
    bool on;
    const char *default_tmpl;
    bool has_default;
    struct sbx_pool_rec dflt;
    struct sbx_pool_rec pools[SBX_POOLS_MAX];
    size_t npools;
};
void sbx_pool_stats(const struct sbx_table *t, struct sbx_pool_stats *out);

#define SBX_TMPL_NAME_MAX 48 /* a template's name: [a-z0-9_-]{1,48} */

/* A template image in image_dir, with the figures of its pools. */
struct sbx_tmpl_rec {
    char name[SBX_TMPL_NAME_MAX + 1];
    bool is_default;
    uint64_t size_bytes;
    const struct sbx_pool_rec *pools; /* into the list's pools */
    size_t npools;
};

struct sbx_tmpl_list {
    struct sbx_pool_rec pools[SBX_POOLS_MAX];
    size_t n;
    struct sbx_tmpl_rec v[]; /* by name */
};
/* GET /v1/templates: every image in image_dir by name, each with its pools' figures:
 * 0 and *out, one block the caller frees (free(); its strings are borrowed as records
 * are), or an sbx_errcode with *err. */
int sbx_templates(struct sbx_table *t, struct sbx_tmpl_list **out, struct sbx_err *err);

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
