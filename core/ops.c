/*
 * ops.c - exec and file operations on a running sandbox: request
 * validation, frames to the guest, and the guest's answers back to the
 * requester (see sbx.h for the contract, sbx_int.h for lifetimes).
 *
 * Flow control: the guest may send PROTO_WINDOW bytes per stream before
 * the host returns credit. In JSON mode the host credits as it buffers
 * (up to exec_max_output_bytes, then drops and flags truncation); in
 * streaming mode only once the requester says the bytes left the host
 * (sbx_op_consumed), so host memory per stream stays bounded by the window.
 * A cancelled op keeps crediting and discarding until the guest's last
 * frame, so the guest never blocks on a stream nobody reads.
 *
 * The guest is not trusted to keep to this: op->gs (gstream.c) counts each
 * stream's offsets, the credit granted and a read's announced size, and any
 * frame outside them is a protocol violation (sbx_violation), after which
 * the op is gone. An upload's credit from the guest is clamped the same way.
 */
#include "sbx_int.h"
#include "procs.h"
#include "log.h"
#include "util.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <mbedtls/base64.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* max_operations_per_sandbox and max_operations: 0, or SBX_E_TOO_MANY_OPERATIONS with *err. Ops
 * still draining after a cancel count: they hold a stream and its credit until the guest ends them.
 */
int ops_quota(struct sandbox *sb, struct sbx_err *err)
{
    const struct srv_config *c = sb->t->cfg;
    unsigned n = 0;

    if (sb->nops >= c->max_ops_per_sbx) {
        return sbx_err_set(err, SBX_E_TOO_MANY_OPERATIONS,
                           "this sandbox has %u operations in flight, its limit", sb->nops);
    }
    for (struct op *op = sb->t->ops; op && n < c->max_ops_total; op = op->next_all)
        n++;
    if (n >= c->max_ops_total) {
        return sbx_err_set(err, SBX_E_TOO_MANY_OPERATIONS,
                           "the server has %u operations in flight, its limit", n);
    }
    return 0;
}

struct op *ops_new_str(struct sandbox *sb, enum op_kind kind, const struct sbx_sink *sink,
                       void *user, const char *s)
{
    struct sbx_table *t = sb->t;
    size_t n = s ? strlen(s) : 0;
    struct op *op = calloc(1, sizeof(*op) + n + 1);

    if (!op)
        return NULL;
    memcpy(op->str, s ? s : "", n + 1);
    op->id = ++t->next_op;
    op->kind = kind;
    op->sb = sb;
    op->sink = *sink;
    op->user = user;
    op->started_ms = sbx_now_ms();
    op->stream = kind == OP_CREATE ? 0 : ++sb->next_stream;
    gstream_init(&op->gs);
    switch (kind) {
    case OP_EXEC:
        proto_buf_init(&op->u.exec.out[0]);
        proto_buf_init(&op->u.exec.out[1]);
        break;
    case OP_FREAD:
    case OP_FWRITE:
        op->u.file.path = op->str;
        break;
    case OP_FOP:
        op->u.fop.path = op->str;
        break;
    default:
        break;
    }
    op->next_all = t->ops;
    t->ops = op;
    op->next_sb = sb->ops;
    sb->ops = op;
    sb->nops++;
    return op;
}

struct op *ops_new(struct sandbox *sb, enum op_kind kind, const struct sbx_sink *sink, void *user)
{
    return ops_new_str(sb, kind, sink, user, NULL);
}

static void op_unlink(struct op *op)
{
    struct sbx_table *t = op->sb->t;

    for (struct op **p = &t->ops; *p; p = &(*p)->next_all) {
        if (*p == op) {
            *p = op->next_all;
            break;
        }
    }
    for (struct op **p = &op->sb->ops; *p; p = &(*p)->next_sb) {
        if (*p == op) {
            *p = op->next_sb;
            op->sb->nops--;
            break;
        }
    }
}

void ops_free(struct op *op)
{
    op_unlink(op);
    if (op->kind == OP_EXEC) {
        proto_buf_free(&op->u.exec.out[0]);
        proto_buf_free(&op->u.exec.out[1]);
    } else if (op->kind == OP_FOP) {
        free(op->u.fop.entries);
        proto_buf_free(&op->u.fop.bytes);
    }
    free(op);
}

void ops_finish(struct op *op, const struct sbx_err *err, const struct sbx_result *res)
{
    /* Unlink before calling out: the callee may start new ops on this sandbox. */
    struct sbx_sink sink = op->sink;
    void *user = op->user;
    bool cancelled = op->cancelled;

    sbx_touch(op->sb);
    ops_free(op);
    if (!cancelled)
        sink.done(user, err, res);
}

void ops_finish_sandbox(struct op *op, const struct sandbox *sb)
{
    struct sbx_rec rec;
    struct sbx_result res = {.kind = SBX_RES_SANDBOX, .u.sandbox = &rec};

    sbx_rec_of(sb, &rec);
    ops_finish(op, NULL, &res);
}

struct op *ops_by_stream(struct sandbox *sb, uint32_t stream)
{
    for (struct op *op = sb->ops; op; op = op->next_sb)
        if (op->stream == stream && op->kind != OP_CREATE)
            return op;
    return NULL;
}

static struct op *op_by_id(struct sbx_table *t, sbx_op_t id)
{
    for (struct op *op = t->ops; op; op = op->next_all)
        if (op->id == id)
            return op;
    return NULL;
}

struct op *ops_by_id(struct sbx_table *t, sbx_op_t id)
{
    return op_by_id(t, id);
}

void ops_fail(struct op *op, enum sbx_errcode code, const char *fmt, ...)
{
    struct sbx_err e = {.code = code};
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
    va_end(ap);
    ops_finish(op, &e, NULL);
}

void ops_fail_all(struct sandbox *sb, enum sbx_errcode code, const char *msg)
{
    while (sb->ops)
        ops_fail(sb->ops, code, "sandbox %s: %s", sb->id, msg);
}

/* A guest errno as an error code. */
enum sbx_errcode ops_errno_code(int err)
{
    static const struct {
        int err;
        enum sbx_errcode code;
    } map[] = {
        {ENOENT, SBX_E_FILE_NOT_FOUND},
        {EEXIST, SBX_E_FILE_EXISTS},
        {ENOTEMPTY, SBX_E_DIRECTORY_NOT_EMPTY},
        {EISDIR, SBX_E_IS_A_DIRECTORY},
        {ENOTDIR, SBX_E_NOT_A_DIRECTORY},
        {EINVAL, SBX_E_INVALID_ARGUMENT},
        {ENAMETOOLONG, SBX_E_INVALID_ARGUMENT},
        {EACCES, SBX_E_PERMISSION_DENIED},
        {EPERM, SBX_E_PERMISSION_DENIED},
        {ENOSPC, SBX_E_DISK_FULL},
        {EDQUOT, SBX_E_DISK_FULL},
        {EROFS, SBX_E_READ_ONLY},
        {ELOOP, SBX_E_TOO_MANY_SYMLINKS},
        {EXDEV, SBX_E_CROSS_DEVICE},
        {EBUSY, SBX_E_CONFLICT},
    };
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (map[i].err == err)
            return map[i].code;
    return SBX_E_GUEST_ERROR;
}

/*
 * Return n bytes of credit to the guest, in batches of a quarter window: a
 * CREDIT per 4 KiB chunk doubled the frames the guest handles. The guest
 * always keeps at least three quarters of its window, so it never waits on
 * credit the host is holding back.
 */
#define CREDIT_BATCH (PROTO_WINDOW / 4)

void ops_credit(struct op *op, size_t n)
{
    struct sandbox *sb = op->sb;

    op->unacked += n;
    if (!sb->ch || op->unacked < CREDIT_BATCH)
        return;
    proto_send_credit(chan_tx(sb->ch), op->stream, op->unacked);
    gstream_granted(&op->gs, op->unacked);
    op->unacked = 0;
    chan_flush(sb->ch);
}

/*
 * A cancelled op's requester dropped the bytes it had queued without passing them on, so
 * their credit never came back: give the guest its whole window again, at once (not in
 * batches). Without it a guest whose window was full when the client stopped reading can
 * never send the rest of its output and the EXIT (or END) that frees this op: the op, its
 * stream and the process's cgroup stayed forever and the sandbox never went idle.
 */
static void credit_held_back(struct op *op)
{
    uint64_t n = op->gs.received + GSTREAM_WINDOW - op->gs.granted;

    op->unacked = 0;
    if (n == 0 || !op->sb->ch)
        return;
    proto_send_credit(chan_tx(op->sb->ch), op->stream, n);
    gstream_granted(&op->gs, n);
}

static void guest_error(struct op *op, const struct proto_frame *f)
{
    int err = proto_has(f, PK_CODE) ? (int)f->v[PK_CODE].i : EIO;

    ops_fail(op, op->kind == OP_EXEC ? SBX_E_EXEC_FAILED : ops_errno_code(err), "%.*s",
             proto_has(f, PK_MSG) ? (int)f->v[PK_MSG].s.len : 0,
             proto_has(f, PK_MSG) ? f->v[PK_MSG].s.p : "");
}

/* ---- file records ---- */

/* A stat record from the guest (a frame); strings point into it. */
static void stat_rec(const struct proto_frame *f, struct sbx_stat_rec *r)
{
    memset(r, 0, sizeof(*r));
    if (proto_has(f, PK_NAME))
        r->name = (struct sbx_str){f->v[PK_NAME].s.p, f->v[PK_NAME].s.len};
    if (proto_has(f, PK_PATH))
        r->path = (struct sbx_str){f->v[PK_PATH].s.p, f->v[PK_PATH].s.len};
    if (proto_has(f, PK_TYPE))
        r->type = (struct sbx_str){f->v[PK_TYPE].s.p, f->v[PK_TYPE].s.len};
    r->has_size = proto_has(f, PK_SIZE);
    r->size = f->v[PK_SIZE].u;
    r->has_mode = proto_has(f, PK_MODE);
    r->mode = f->v[PK_MODE].u;
    r->has_mtime = proto_has(f, PK_MTIME);
    r->mtime = f->v[PK_MTIME].i;
}

/* A string of a list entry kept in the op's bytes: its offset there (the buffer moves as
 * it grows, so pointers are made only at the end). */
static struct sbx_str keep_str(struct op *op, struct sbx_str s)
{
    struct sbx_str at = {NULL, 0};

    if (!s.p)
        return at;
    at.p = (const char *)(uintptr_t)(op->u.fop.bytes.len + 1); /* 0 stays "absent" */
    at.n = s.n;
    if (s.n && proto_buf_append(&op->u.fop.bytes, s.p, s.n) != 0)
        at.n = 0;
    return at;
}

/* A list entry is a msgpack map with the stat keys; values of the wrong type are skipped. */
static void entry_rec(const msgpack_object *m, struct sbx_stat_rec *r)
{
    static const struct {
        const char *name;
        enum proto_key key;
        bool is_str;
    } fields[] = {{"name", PK_NAME, true},  {"path", PK_PATH, true},  {"type", PK_TYPE, true},
                  {"size", PK_SIZE, false}, {"mode", PK_MODE, false}, {"mtime", PK_MTIME, false}};
    struct proto_frame f;

    memset(&f, 0, sizeof(f));
    for (uint32_t i = 0; m->type == MSGPACK_OBJECT_MAP && i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR)
            continue;
        for (size_t j = 0; j < sizeof(fields) / sizeof(fields[0]); j++) {
            if (strlen(fields[j].name) != k->via.str.size ||
                memcmp(fields[j].name, k->via.str.ptr, k->via.str.size) != 0)
                continue;
            if (fields[j].is_str && v->type == MSGPACK_OBJECT_STR) {
                f.v[fields[j].key].s.p = v->via.str.ptr;
                f.v[fields[j].key].s.len = v->via.str.size;
            } else if (!fields[j].is_str && (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ||
                                             v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)) {
                f.v[fields[j].key].i = v->via.i64; /* same bits as u64 for either sign */
            } else {
                continue;
            }
            f.have |= 1ull << fields[j].key;
        }
    }
    stat_rec(&f, r);
}

/* What one list entry counts against list_max_bytes: its strings, plus 128 for the rest
 * (keys, numbers, the JSON object itself). */
static size_t list_entry_cost(const msgpack_object *m)
{
    size_t cost = 128;

    if (m->type != MSGPACK_OBJECT_MAP)
        return cost;
    for (uint32_t i = 0; i < m->via.map.size; i++)
        if (m->via.map.ptr[i].val.type == MSGPACK_OBJECT_STR)
            cost += m->via.map.ptr[i].val.via.str.size;
    return cost;
}

/* ---- frames from the guest ---- */

static void exec_exit(struct op *op, const struct proto_frame *f)
{
    int64_t code = proto_has(f, PK_CODE) ? f->v[PK_CODE].i : -1;
    int64_t sig = proto_has(f, PK_SIG) ? f->v[PK_SIG].i : 0;
    struct sbx_exec_rec x = {0};
    struct sbx_result res = {.kind = SBX_RES_EXEC, .u.exec = &x};
    struct proto_buf out[2];

    /* 0 is "no signal"; anything but a real signal number is a lie (128 + 2^63 once
     * overflowed). */
    if (sig != 0 && !gstream_sig_ok(sig)) {
        sbx_violation(op->sb, "EXIT on stream %u with signal %" PRId64, op->stream, sig);
        return;
    }
    x.streamed = op->u.exec.stream_mode;
    /* Like a shell: a process killed by signal N exits with 128 + N. */
    x.exit_code = sig > 0 ? 128 + sig : code;
    x.signal = sig > 0 ? sig : 0;
    x.timed_out = proto_has(f, PK_TIMED_OUT) && f->v[PK_TIMED_OUT].b;
    x.has_duration = true;
    x.duration_ms = sbx_now_ms() - op->started_ms;
    x.buffered = !op->u.exec.stream_mode;
    x.truncated = op->u.exec.truncated[0] || op->u.exec.truncated[1];
    /* The output outlives the op (freed by ops_finish) until the answer is made. */
    out[0] = op->u.exec.out[0];
    out[1] = op->u.exec.out[1];
    memset(op->u.exec.out, 0, sizeof(op->u.exec.out));
    for (int i = 0; i < 2; i++)
        x.out[i] = (struct sbx_str){out[i].len ? (const char *)out[i].p : "", out[i].len};
    ops_finish(op, NULL, &res);
    proto_buf_free(&out[0]);
    proto_buf_free(&out[1]);
}

/* Count data the guest sent on op's stream; false (and the op is gone) if it broke the rules. */
static bool data_ok(struct op *op, const struct proto_frame *f, unsigned fd_index)
{
    char why[160];
    int r = gstream_rx(&op->gs, fd_index, proto_has(f, PK_OFF), f->v[PK_OFF].u, f->v[PK_DATA].s.len,
                       why, sizeof(why));

    if (r == 0)
        return true;
    sbx_violation(op->sb, "%s on stream %u: %s", proto_type_name(f->type), op->stream, why);
    return false;
}

static void exec_out(struct op *op, const struct proto_frame *f)
{
    uint64_t fd = proto_has(f, PK_FD) ? f->v[PK_FD].u : 0;
    const struct proto_str *d = &f->v[PK_DATA].s;
    size_t cap = op->sb->t->cfg->exec_max_output;

    if ((fd != 1 && fd != 2) || !proto_has(f, PK_DATA)) {
        sbx_violation(op->sb, "OUT on stream %u without data of fd 1 or 2", op->stream);
        return;
    }
    if (!data_ok(op, f, (unsigned)fd - 1))
        return;
    if (op->cancelled) {
        ops_credit(op, d->len);
    } else if (op->u.exec.stream_mode) {
        op->sink.data(op->user, (int)fd, f->v[PK_OFF].u, d->p, d->len);
    } else {
        struct proto_buf *b = &op->u.exec.out[fd - 1];
        size_t room = b->len < cap ? cap - b->len : 0;
        size_t take = d->len < room ? d->len : room;
        if (take < d->len)
            op->u.exec.truncated[fd - 1] = true;
        if (take && proto_buf_append(b, d->p, take) != 0)
            op->u.exec.truncated[fd - 1] = true;
        ops_credit(op, d->len);
    }
}

/* A kept string's offset back into a pointer into the op's bytes. */
static void fix_str(const struct op *op, struct sbx_str *s)
{
    if (s->p)
        s->p = op->u.fop.bytes.p ? (const char *)op->u.fop.bytes.p + ((uintptr_t)s->p - 1) : "";
}

static void fop_result(struct op *op, const struct proto_frame *f)
{
    struct sbx_result res = {.kind = SBX_RES_PATH};
    struct sbx_stat_rec st;

    if (op->u.fop.type == PROTO_STAT) {
        stat_rec(f, &st);
        res.kind = SBX_RES_STAT;
        res.u.stat = &st;
        ops_finish(op, NULL, &res);
        return;
    }
    if (op->u.fop.type == PROTO_LIST) {
        const struct srv_config *cfg = op->sb->t->cfg;
        bool truncated = false;
        struct sbx_stat_rec *entries;
        struct proto_buf bytes;
        char path[4096];
        size_t n;

        if (proto_has(f, PK_ENTRIES)) {
            const msgpack_object_array *a = f->v[PK_ENTRIES].arr;
            for (uint32_t i = 0; i < a->size && !truncated; i++) {
                size_t cost = list_entry_cost(&a->ptr[i]);
                struct sbx_stat_rec *e;
                /* A listing is held whole until its last frame: bounded in entries and
                 * bytes, or one 256 KiB frame of empty entries became ~65 MiB of JSON. */
                if (op->u.fop.n >= cfg->list_max_entries ||
                    cost > cfg->list_max_bytes - op->u.fop.list_bytes) {
                    truncated = true;
                    break;
                }
                if (op->u.fop.n == op->u.fop.cap) {
                    size_t cap = op->u.fop.cap ? op->u.fop.cap * 2 : 64;
                    struct sbx_stat_rec *m = realloc(op->u.fop.entries, cap * sizeof(*m));
                    if (!m) {
                        ops_fail(op, SBX_E_INTERNAL, "out of memory");
                        return;
                    }
                    op->u.fop.entries = m;
                    op->u.fop.cap = cap;
                }
                op->u.fop.list_bytes += cost;
                e = &op->u.fop.entries[op->u.fop.n++];
                entry_rec(&a->ptr[i], e);
                e->name = keep_str(op, e->name);
                e->path = keep_str(op, e->path);
                e->type = keep_str(op, e->type);
            }
        }
        if (!truncated && proto_has(f, PK_EOF) && !f->v[PK_EOF].b)
            return;
        /* Cut short: answered now; the guest's later frames for the stream are dropped
         * like any late frame of a finished op. */
        for (size_t i = 0; i < op->u.fop.n; i++) {
            fix_str(op, &op->u.fop.entries[i].name);
            fix_str(op, &op->u.fop.entries[i].path);
            fix_str(op, &op->u.fop.entries[i].type);
        }
        /* The listing outlives the op (freed by ops_finish) until the answer is made. */
        entries = op->u.fop.entries;
        n = op->u.fop.n;
        bytes = op->u.fop.bytes;
        op->u.fop.entries = NULL;
        memset(&op->u.fop.bytes, 0, sizeof(bytes));
        snprintf(path, sizeof(path), "%s", op->u.fop.path);
        res.kind = SBX_RES_LISTING;
        res.u.listing.path = path;
        res.u.listing.entries = entries;
        res.u.listing.n = n;
        res.u.listing.truncated = truncated;
        ops_finish(op, NULL, &res);
        free(entries);
        proto_buf_free(&bytes);
        return;
    }
    {
        char path[4096];
        snprintf(path, sizeof(path), "%s", op->u.fop.path);
        res.u.file.path = path;
        ops_finish(op, NULL, &res);
    }
}

void ops_frame(struct sandbox *sb, struct op *op, const struct proto_frame *f)
{
    if ((op->kind == OP_EXEC && op->u.exec.bg) || op->kind == OP_PLIST || op->kind == OP_ATTACH ||
        op->kind == OP_PCTL) {
        ops_proc_frame(op, f);
        return;
    }
    if (f->type == PROTO_ERROR) {
        guest_error(op, f);
        return;
    }
    switch (op->kind) {
    case OP_EXEC:
        if (f->type == PROTO_OUT)
            exec_out(op, f);
        else if (f->type == PROTO_EXIT)
            exec_exit(op, f);
        break;
    case OP_FREAD:
        if (f->type == PROTO_RESULT && !op->u.file.got_head) {
            uint64_t size = proto_has(f, PK_SIZE) ? f->v[PK_SIZE].u : 0;
            op->u.file.got_head = true;
            /* The download's Content-Length: the guest must then send exactly that. */
            gstream_set_size(&op->gs, size, NULL, 0);
            if (!op->cancelled)
                op->sink.head(op->user, size);
        } else if (f->type == PROTO_DATA) {
            if (!op->u.file.got_head || !proto_has(f, PK_DATA)) {
                sbx_violation(sb, "DATA on stream %u %s", op->stream,
                              op->u.file.got_head ? "without data" : "before its RESULT");
                return;
            }
            if (!data_ok(op, f, 0))
                return;
            if (op->cancelled)
                ops_credit(op, f->v[PK_DATA].s.len);
            else
                op->sink.data(op->user, 0, f->v[PK_OFF].u, f->v[PK_DATA].s.p, f->v[PK_DATA].s.len);
        } else if (f->type == PROTO_END) {
            ops_finish(op, NULL, NULL);
        }
        break;
    case OP_FWRITE:
        if (f->type == PROTO_CREDIT) {
            /* Clamped to the bytes in flight: credit for bytes never sent would let the
             * host queue more than a window toward a guest that does not read. */
            if (proto_has(f, PK_N) && gstream_tx_credit(&op->gs, f->v[PK_N].u) > 0 &&
                op->u.file.waiting_credit && !op->cancelled) {
                op->u.file.waiting_credit = false;
                op->sink.writable(op->user);
            }
        } else if (f->type == PROTO_RESULT) {
            char path[4096];
            struct sbx_result res = {.kind = SBX_RES_WRITTEN};
            snprintf(path, sizeof(path), "%s", op->u.file.path);
            res.u.file.path = path;
            res.u.file.size = proto_has(f, PK_SIZE) ? f->v[PK_SIZE].u : 0;
            ops_finish(op, NULL, &res);
        }
        break;
    case OP_FOP:
        if (f->type == PROTO_RESULT)
            fop_result(op, f);
        break;
    case OP_CREATE:
    case OP_PLIST: /* handled by ops_proc_frame above */
    case OP_ATTACH:
    case OP_PCTL:
    case OP_SNAP: /* no guest stream: a frame for its id is dropped */
    case OP_RESUME:
    case OP_NETPOL:
        break;
    }
}

/* ---- starting operations ---- */

static int check_path(const char *path, struct sbx_err *err)
{
    if (!path || path[0] != '/') {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "path must be an absolute path");
    }
    if (strlen(path) >= 4096) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "path is too long");
    }
    return 0;
}

/* The fields that make an exec a process of the sandbox: background, tag, pty. Every
 * door's exec comes through here, so these rules are written once. */
static int exec_validate_bg(const struct sbx_exec_req *r, struct sbx_err *err)
{
    bool is_bg = r->background == 1 || r->pty;

    if (r->tag.p && r->tag.n > SBX_TAG_MAX)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "tag must be a string of at most %d bytes",
                           SBX_TAG_MAX);
    if (r->tag.p && !is_bg)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "tag names a background process: give background or pty too");
    if (r->pty) {
        if (r->cols < 1 || r->rows < 1 || r->cols > PROCS_SIZE_MAX || r->rows > PROCS_SIZE_MAX)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "pty cols and rows must be 1..%d",
                               PROCS_SIZE_MAX);
        if (r->background == 0)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "a pty always runs in the background");
    }
    if (is_bg && r->stdin_data.p)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "stdin is sent to a background process later, with "
                           "POST .../processes/{pid}/stdin");
    return 0;
}

static int exec_validate(const struct sbx_exec_req *r, struct sbx_err *err)
{
    int status;

    if ((status = exec_validate_bg(r, err)))
        return status;
    if ((r->cmd.p && r->argv) || (!r->cmd.p && !r->argv && !r->pty)) {
        /* a PTY without either runs a login shell */
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "give exactly one of cmd (string) or argv (array)");
    }
    if (r->cmd.p && r->cmd.n == 0) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "cmd must be a non-empty string");
    }
    if (r->argv && r->argc == 0) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "argv must be a non-empty array of strings");
    }
    for (size_t i = 0; r->argv && i < r->argc; i++)
        if (!r->argv[i].p)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "argv must hold strings only");
    if (r->cwd && r->cwd[0] != '/') {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "cwd must be an absolute path");
    }
    if (r->user && strcmp(r->user, "root") && strcmp(r->user, "user")) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "user must be \"root\" or \"user\"");
    }
    if (r->stdin_data.p && r->stdin_data.n > PROTO_WINDOW) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "stdin must be a string of at most %d bytes", PROTO_WINDOW);
    }
    if (r->has_timeout && !(r->timeout_s > 0 && r->timeout_s <= 86400)) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "timeout_seconds must be a number in (0, 86400]");
    }
    for (size_t i = 0; i < r->nenv; i++)
        if (!r->env[i].key || !r->env[i].val.p)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "env must be an object of strings");
    return 0;
}

/* Whether kv[i]'s key comes again later in kv: then that later value is the one (as in
 * a JSON object, whose last value of a key wins). */
static bool kv_shadowed(const struct sbx_kv *kv, size_t n, size_t i)
{
    for (size_t j = i + 1; j < n; j++)
        if (strcmp(kv[i].key, kv[j].key) == 0)
            return true;
    return false;
}

/* The sandbox's env a with the exec's kv over it, as one msgpack map. A value stops at
 * its first NUL byte, as the guest's environment would cut it. */
static void pack_env(msgpack_packer *pk, const struct rec_kv *a, const struct sbx_kv *kv, size_t n)
{
    size_t count = a->n;

    for (size_t i = 0; i < n; i++)
        if (!kv_shadowed(kv, n, i) && !rec_kv_get(a, kv[i].key))
            count++;
    msgpack_pack_map(pk, count);
    for (size_t j = 0; j < a->n; j++) {
        const char *k = a->v[j].key, *s = a->v[j].val.p;
        size_t len = strlen(s);
        for (size_t i = 0; i < n; i++)
            if (strcmp(kv[i].key, k) == 0) {
                s = kv[i].val.p;
                len = strnlen(kv[i].val.p, kv[i].val.n);
            }
        msgpack_pack_str_with_body(pk, k, strlen(k));
        msgpack_pack_str_with_body(pk, s, len);
    }
    for (size_t i = 0; i < n; i++) {
        if (kv_shadowed(kv, n, i) || rec_kv_get(a, kv[i].key))
            continue;
        msgpack_pack_str_with_body(pk, kv[i].key, strlen(kv[i].key));
        msgpack_pack_str_with_body(pk, kv[i].val.p, strnlen(kv[i].val.p, kv[i].val.n));
    }
}

int sbx_exec(struct sbx_table *t, const char *id, const struct sbx_exec_req *r, bool stream,
             const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct sandbox *sb;
    struct op *op;
    struct proto_enc e;
    struct proto_buf *tx;
    char tag[SBX_TAG_MAX + 1];
    bool bg = r->background == 1 || r->pty;
    uint32_t nkeys = 5; /* t, id, argv|cmd, env, user */
    int status;

    if ((status = sbx_usable(t, id, &sb, err)) || (status = exec_validate(r, err)))
        return status;
    nkeys += (r->cwd ? 1 : 0) + (r->has_timeout ? 1 : 0) + 1 /* stdin flag */;
    nkeys += (bg ? 1 : 0) + (r->tag.p ? 1 : 0) + (r->pty ? 2 : 0);
    if (!r->argv && !r->cmd.p)
        nkeys--; /* a PTY's login shell */

    if ((status = ops_quota(sb, err)))
        return status;
    /* The tag's length was checked by exec_validate_bg (at most SBX_TAG_MAX); op->str
     * keeps it up to a NUL it may hold, as the answer shows it. */
    if (r->tag.p)
        snprintf(tag, sizeof(tag), "%.*s", (int)r->tag.n, r->tag.p);
    op = ops_new_str(sb, OP_EXEC, sink, user, r->tag.p ? tag : NULL);
    if (!op)
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    op->u.exec.stream_mode = stream && !bg;
    op->u.exec.bg = bg;
    if (op->str[0]) /* an empty tag is no tag, as the answer shows it */
        op->u.exec.tag = op->str;
    tx = chan_tx(sb->ch);
    proto_enc_begin(&e, tx, PROTO_EXEC, op->stream, nkeys);
    if (r->argv) {
        proto_enc_key(&e, PK_ARGV);
        msgpack_pack_array(&e.pk, r->argc);
        for (size_t i = 0; i < r->argc; i++)
            msgpack_pack_str_with_body(&e.pk, r->argv[i].p, r->argv[i].n);
    } else if (r->cmd.p) {
        proto_put_str(&e, PK_CMD, r->cmd.p, strnlen(r->cmd.p, r->cmd.n));
    }
    if (bg)
        proto_put_b(&e, PK_BG, true);
    if (r->tag.p)
        proto_put_str(&e, PK_TAG, r->tag.p, r->tag.n);
    if (r->pty) {
        proto_put_u(&e, PK_COLS, (uint64_t)r->cols);
        proto_put_u(&e, PK_ROWS, (uint64_t)r->rows);
    }
    proto_enc_key(&e, PK_ENV);
    pack_env(&e.pk, &sb->env, r->env, r->nenv);
    proto_put_cstr(&e, PK_USER, r->user ? r->user : "root");
    if (r->cwd)
        proto_put_cstr(&e, PK_CWD, r->cwd);
    if (r->has_timeout)
        proto_put_u(&e, PK_TIMEOUT, (uint64_t)(r->timeout_s * 1000.0));
    proto_put_b(&e, PK_STDIN, r->stdin_data.p != NULL);
    if (proto_enc_end(&e) != 0) {
        ops_free(op);
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "the command, arguments and environment are too "
                           "large (max %d bytes)",
                           PROTO_MAX_FRAME);
    }
    if (r->stdin_data.p) {
        const char *p = r->stdin_data.p;
        size_t n = r->stdin_data.n, off = 0;
        do {
            size_t chunk = n - off < PROTO_MAX_DATA ? n - off : PROTO_MAX_DATA;
            bool last = off + chunk == n;
            proto_enc_begin(&e, tx, PROTO_STDIN, op->stream, last ? 4 : 3);
            proto_put_bin(&e, PK_DATA, p + off, chunk);
            if (last)
                proto_put_b(&e, PK_EOF, true);
            proto_enc_end(&e);
            off += chunk;
        } while (off < n);
    }
    chan_flush(sb->ch);
    *opid = op->id;
    return 0;
}

/*
 * The common start of a file request: check the path and the sandbox, make
 * the op and begin its frame with {path}; the caller adds `extra` more keys
 * and calls ops_send().
 */
static int file_op_begin(struct sbx_table *t, const char *id, const char *path, enum op_kind kind,
                         enum proto_type type, uint32_t extra, const struct sbx_sink *sink,
                         void *user, struct op **opp, struct proto_enc *e, struct sbx_err *err)
{
    struct sandbox *sb;
    struct op *op;
    int status;

    *opp = NULL; /* set on every path: callers test the returned code, not *opp */
    if ((status = check_path(path, err)) || (status = sbx_usable(t, id, &sb, err)) ||
        (status = ops_quota(sb, err)))
        return status;
    /* path is bounded by check_path (under 4096 bytes). */
    if (!(op = ops_new_str(sb, kind, sink, user, path))) {
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    proto_enc_begin(e, chan_tx(sb->ch), type, op->stream, 3 + extra);
    proto_put_cstr(e, PK_PATH, path);
    *opp = op;
    return 0;
}

int ops_send(struct op *op, struct proto_enc *e, sbx_op_t *opid)
{
    proto_enc_end(e);
    chan_flush(op->sb->ch);
    *opid = op->id;
    return 0;
}

int sbx_file_read(struct sbx_table *t, const char *id, const char *path,
                  const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct op *op;
    struct proto_enc e;
    int status;

    if ((status = file_op_begin(t, id, path, OP_FREAD, PROTO_FREAD, 0, sink, user, &op, &e, err)))
        return status;
    return ops_send(op, &e, opid);
}

int sbx_file_write(struct sbx_table *t, const char *id, const char *path, unsigned mode,
                   const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct op *op;
    struct proto_enc e;
    int status;

    if ((status = file_op_begin(t, id, path, OP_FWRITE, PROTO_FWRITE, 1, sink, user, &op, &e, err)))
        return status;
    proto_put_u(&e, PK_MODE, mode ? mode : 0644);
    return ops_send(op, &e, opid);
}

int sbx_file_op(struct sbx_table *t, const char *id, const struct sbx_file_req *r,
                const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    static const enum proto_type types[] = {[SBX_FILE_STAT] = PROTO_STAT,
                                            [SBX_FILE_LIST] = PROTO_LIST,
                                            [SBX_FILE_MKDIR] = PROTO_MKDIR,
                                            [SBX_FILE_REMOVE] = PROTO_REMOVE,
                                            [SBX_FILE_RENAME] = PROTO_RENAME};
    enum proto_type type;
    struct op *op;
    struct proto_enc e;
    int status;

    if ((unsigned)r->kind >= sizeof(types) / sizeof(types[0]))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "unknown file operation %d", (int)r->kind);
    type = types[r->kind];
    if ((status = check_path(r->path, err)))
        return status;
    if (type == PROTO_RENAME && (status = check_path(r->to, err)))
        return status;
    if (r->depth != SBX_UNSET && (r->depth < 1 || r->depth > 10)) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "depth must be an integer from 1 to 10");
    }
    if ((status = file_op_begin(t, id, r->path, OP_FOP, type,
                                type == PROTO_RENAME || type == PROTO_LIST || type == PROTO_REMOVE,
                                sink, user, &op, &e, err)))
        return status;
    op->u.fop.type = type;
    if (type == PROTO_RENAME)
        proto_put_cstr(&e, PK_TO, r->to);
    else if (type == PROTO_LIST)
        proto_put_u(&e, PK_DEPTH, r->depth != SBX_UNSET ? (uint64_t)r->depth : 1);
    else if (type == PROTO_REMOVE)
        proto_put_b(&e, PK_RECURSIVE, r->recursive);
    return ops_send(op, &e, opid);
}

/* ---- requester-side calls on ops ---- */

size_t sbx_op_write(struct sbx_table *t, sbx_op_t id, const void *p, size_t n)
{
    struct op *op = op_by_id(t, id);
    size_t take, off = 0;
    struct proto_buf *tx;

    if (!op || op->kind != OP_FWRITE || op->u.file.finished_input || !op->sb->ch)
        return n; /* nothing will read it: swallow, the op's done() tells the outcome */
    take = n < gstream_tx_room(&op->gs) ? n : (size_t)gstream_tx_room(&op->gs);
    tx = chan_tx(op->sb->ch);
    while (off < take) {
        struct proto_enc e;
        size_t chunk = take - off < PROTO_MAX_DATA ? take - off : PROTO_MAX_DATA;
        proto_enc_begin(&e, tx, PROTO_DATA, op->stream, 4);
        proto_put_u(&e, PK_OFF, op->gs.tx_sent + off);
        proto_put_bin(&e, PK_DATA, (const uint8_t *)p + off, chunk);
        proto_enc_end(&e);
        off += chunk;
    }
    gstream_tx_sent(&op->gs, take);
    if (take < n)
        op->u.file.waiting_credit = true;
    chan_flush(op->sb->ch);
    sbx_touch(op->sb);
    return take;
}

void sbx_op_finish(struct sbx_table *t, sbx_op_t id)
{
    struct op *op = op_by_id(t, id);

    if (!op || op->kind != OP_FWRITE || op->u.file.finished_input || !op->sb->ch)
        return;
    op->u.file.finished_input = true;
    proto_send_end(chan_tx(op->sb->ch), op->stream);
    chan_flush(op->sb->ch);
}

void sbx_op_consumed(struct sbx_table *t, sbx_op_t id, size_t n)
{
    struct op *op = op_by_id(t, id);

    if (op)
        ops_credit(op, n);
}

void sbx_op_cancel(struct sbx_table *t, sbx_op_t id)
{
    struct op *op = op_by_id(t, id);
    struct sandbox *sb;

    if (!op)
        return;
    sb = op->sb;
    op->cancelled = true;
    switch (op->kind) {
    case OP_CREATE:
        /* Nobody will learn this sandbox's id: do not leave a VM running for nobody. */
        ops_free(op);
        sbx_end(sb, "create_cancelled: the client went away during create");
        return;
    case OP_ATTACH:
        /* Only this reader goes: the process and its ring stay. The guest answers END. */
        if (sb->ch) {
            struct proto_enc e;
            proto_enc_begin(&e, chan_tx(sb->ch), PROTO_DETACH, op->stream, 2);
            proto_enc_end(&e);
            credit_held_back(op);
            chan_flush(sb->ch);
        }
        break;
    case OP_EXEC:
        if (op->u.exec.bg)
            break; /* it belongs to the sandbox now: the client can find it in the list */
        /* fall through */
    case OP_FREAD:
    case OP_FWRITE:
        /* SIGKILL for a process; for a transfer any signal aborts it in the guest. The guest
         * still ends the stream with a last frame, which frees the op. */
        if (sb->ch) {
            struct proto_enc e;
            proto_enc_begin(&e, chan_tx(sb->ch), PROTO_SIGNAL, op->stream, 3);
            proto_put_i(&e, PK_SIG, 9);
            proto_enc_end(&e);
            credit_held_back(op);
            chan_flush(sb->ch);
        }
        break;
    case OP_FOP:
    case OP_PLIST:
    case OP_PCTL:
    case OP_SNAP: /* the snapshot completes; nobody hears of it */
    case OP_RESUME:
    case OP_NETPOL: /* the change completes; nobody hears of it */
        break;
    }
    /* Drain: the op stays until the guest's last frame for it, crediting what arrives. */
    if (!sb->ch)
        ops_free(op);
}
