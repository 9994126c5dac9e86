/*
 * ops_proc.c - operations on the processes that belong to a sandbox:
 * background execs and PTYs (started by sbx_exec), listing them, reading
 * their output from an offset, and stdin, signals and resizes.
 *
 * The guest owns these processes and keeps each one's output in a ring
 * (protocol/README.md, "Background processes"), so the host holds no state
 * for them between requests: a list asks the guest (PLIST), a read opens an
 * ATTACH stream from the client's offset, and after a restart of warrend
 * or a channel reconnect nothing needs rebuilding.
 *
 * Untrusted input, as everywhere: an attach stream's offsets and skips are
 * counted by gstream_rx_ring(), the process list is checked by procs.c, a
 * pid the guest reports is checked against the range it can be.
 */
#include "sbx_int.h"
#include "procs.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(SBX_PROC_STDIN_MAX == PROTO_MAX_DATA, "one PCTL frame carries a call's stdin");

/* ---- frames from the guest ---- */

/* The process a process op names; 0 for a background exec (its pid is not known yet). */
static uint32_t op_pid(const struct op *op)
{
    return op->kind == OP_EXEC ? 0 : op->u.proc.pid;
}

/* An error the guest answered a process request with. */
static void proc_error(struct op *op, const struct proto_frame *f)
{
    int e = proto_has(f, PK_CODE) ? (int)f->v[PK_CODE].i : EIO;
    uint32_t pid = op_pid(op);

    switch (e) {
    case ESRCH:
        ops_fail(op, SBX_E_PROCESS_NOT_FOUND, "sandbox %s has no process %" PRIu32, op->sb->id,
                 pid);
        return;
    case ECHILD:
        ops_fail(op, SBX_E_PROCESS_EXITED, "process %" PRIu32 " has exited", pid);
        return;
    case EPIPE:
        ops_fail(op, SBX_E_STDIN_CLOSED, "the stdin of process %" PRIu32 " is closed", pid);
        return;
    case EAGAIN:
        ops_fail(op, SBX_E_STDIN_FULL,
                 "process %" PRIu32 " has not read the stdin already queued; retry later", pid);
        return;
    case EMFILE:
        ops_fail(op, SBX_E_TOO_MANY_PROCESSES,
                 "sandbox %s has %u background processes and PTYs running, its limit", op->sb->id,
                 op->sb->t->cfg->max_procs_per_sbx);
        return;
    case EINVAL:
        if (op->kind == OP_ATTACH) {
            ops_fail(op, SBX_E_BAD_OFFSET, "offset %" PRIu64 " is past the end of the output",
                     op->u.proc.attach_off);
            return;
        }
        if (op->kind == OP_PCTL && op->u.proc.resize) {
            ops_fail(op, SBX_E_NOT_A_PTY, "process %" PRIu32 " has no terminal to resize", pid);
            return;
        }
        break;
    default:
        break;
    }
    ops_fail(op, op->kind == OP_EXEC ? SBX_E_EXEC_FAILED : ops_errno_code(e), "%.*s",
             proto_has(f, PK_MSG) ? (int)f->v[PK_MSG].s.len : 0,
             proto_has(f, PK_MSG) ? f->v[PK_MSG].s.p : "");
}

/* A background exec's RESULT{pid}: the process runs; answer {pid, tag}. */
static void bg_started(struct op *op, const struct proto_frame *f)
{
    uint64_t pid = proto_has(f, PK_PID) ? f->v[PK_PID].u : 0;
    struct sbx_result res = {.kind = SBX_RES_STARTED};
    char tag[SBX_TAG_MAX + 1];

    if (pid < 1 || pid > PROCS_PID_MAX) {
        sbx_violation(op->sb, "background exec on stream %u started pid %" PRIu64, op->stream, pid);
        return;
    }
    res.u.started.pid = (uint32_t)pid;
    if (op->u.exec.tag) { /* in the op, which ops_finish frees */
        snprintf(tag, sizeof(tag), "%s", op->u.exec.tag);
        res.u.started.tag = tag;
    }
    ops_finish(op, NULL, &res);
}

static void plist_result(struct op *op, const struct proto_frame *f)
{
    static const msgpack_object_array none = {0, NULL};
    struct sbx_result res = {.kind = SBX_RES_PROCS};
    struct sbx_proc_rec *v;
    uint32_t pid = op->u.proc.pid;
    struct sandbox *sb = op->sb;
    char why[256];
    size_t n;
    int r = procs_list(proto_has(f, PK_PROCS) ? f->v[PK_PROCS].arr : &none,
                       op->sb->t->cfg->max_procs_per_sbx, &v, &n, why, sizeof(why));

    if (r == -EPROTO) {
        sbx_violation(op->sb, "process list on stream %u: %s", op->stream, why);
        return;
    }
    if (r != 0) {
        ops_fail(op, SBX_E_INTERNAL, "out of memory");
        return;
    }
    res.u.procs.v = v;
    res.u.procs.n = n;
    for (size_t i = 0; pid && i < n; i++) {
        if (v[i].pid == pid) {
            res.kind = SBX_RES_PROC;
            res.u.procs.v = &v[i];
            res.u.procs.n = 1;
        }
    }
    if (!pid || res.kind == SBX_RES_PROC)
        ops_finish(op, NULL, &res);
    else
        ops_fail(op, SBX_E_PROCESS_NOT_FOUND, "sandbox %s has no process %" PRIu32, sb->id, pid);
    free(v);
}

static void attach_out(struct op *op, const struct proto_frame *f)
{
    uint64_t fd = proto_has(f, PK_FD) ? f->v[PK_FD].u : 0;
    uint64_t lost = proto_has(f, PK_LOST) ? f->v[PK_LOST].u : 0;
    const struct proto_str *d = &f->v[PK_DATA].s;
    char why[200];

    if ((fd != 1 && fd != 2) || !proto_has(f, PK_DATA)) {
        sbx_violation(op->sb, "OUT on stream %u without data of fd 1 or 2", op->stream);
        return;
    }
    if (gstream_rx_ring(&op->gs, (unsigned)fd - 1, proto_has(f, PK_OFF), f->v[PK_OFF].u, lost,
                        d->len, why, sizeof(why)) != 0) {
        sbx_violation(op->sb, "OUT on stream %u: %s", op->stream, why);
        return;
    }
    if (op->cancelled) {
        ops_credit(op, d->len);
        return;
    }
    if (lost)
        op->sink.lost(op->user, f->v[PK_OFF].u - lost, lost);
    if (d->len)
        op->sink.data(op->user, (int)fd, f->v[PK_OFF].u, d->p, d->len);
}

static void attach_exit(struct op *op, const struct proto_frame *f)
{
    int64_t code = proto_has(f, PK_CODE) ? f->v[PK_CODE].i : -1;
    int64_t sig = proto_has(f, PK_SIG) ? f->v[PK_SIG].i : 0;

    if (sig != 0 && !gstream_sig_ok(sig)) {
        sbx_violation(op->sb, "EXIT on stream %u with signal %" PRId64, op->stream, sig);
        return;
    }
    {
        struct sbx_exec_rec x = {.streamed = true,
                                 .exit_code = sig > 0 ? 128 + sig : code,
                                 .signal = sig > 0 ? sig : 0,
                                 .timed_out = proto_has(f, PK_TIMED_OUT) && f->v[PK_TIMED_OUT].b};
        struct sbx_result res = {.kind = SBX_RES_EXEC, .u.exec = &x};
        ops_finish(op, NULL, &res);
    }
}

void ops_proc_frame(struct op *op, const struct proto_frame *f)
{
    if (f->type == PROTO_ERROR) {
        proc_error(op, f);
        return;
    }
    switch (op->kind) {
    case OP_EXEC: /* background: only its start is answered on this stream */
        if (f->type == PROTO_RESULT)
            bg_started(op, f);
        break;
    case OP_PLIST:
        if (f->type == PROTO_RESULT)
            plist_result(op, f);
        break;
    case OP_ATTACH:
        if (f->type == PROTO_OUT)
            attach_out(op, f);
        else if (f->type == PROTO_EXIT)
            attach_exit(op, f);
        else if (f->type == PROTO_END) {
            struct sbx_result res = {.kind = SBX_RES_CAUGHT_UP,
                                     .u.offset = gstream_ring_next(&op->gs)};
            ops_finish(op, NULL, &res);
        }
        break;
    case OP_PCTL:
        if (f->type == PROTO_RESULT)
            ops_finish(op, NULL, &(struct sbx_result){.kind = SBX_RES_DONE});
        break;
    default:
        break;
    }
}

/* ---- starting operations ---- */

static int proc_begin(struct sbx_table *t, const char *id, uint32_t pid, enum op_kind kind,
                      enum proto_type type, uint32_t nkeys, const struct sbx_sink *sink, void *user,
                      struct op **opp, struct proto_enc *e, struct sbx_err *err)
{
    struct sandbox *sb;
    struct op *op;
    int r;

    *opp = NULL; /* set on every path: callers test the returned code, not *opp */
    if (pid > PROCS_PID_MAX)
        return sbx_err_set(err, SBX_E_PROCESS_NOT_FOUND, "no process %" PRIu32, pid);
    if ((r = sbx_usable(t, id, &sb, err)) || (r = ops_quota(sb, err)))
        return r;
    if (!(op = ops_new(sb, kind, sink, user)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    op->u.proc.pid = pid;
    proto_enc_begin(e, chan_tx(sb->ch), type, op->stream, nkeys + (pid ? 1 : 0));
    if (pid)
        proto_put_u(e, PK_PID, pid);
    *opp = op;
    return 0;
}

int sbx_proc_list(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_sink *sink,
                  void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct op *op;
    struct proto_enc e;
    int r;

    if ((r = proc_begin(t, id, pid, OP_PLIST, PROTO_PLIST, 2, sink, user, &op, &e, err)))
        return r;
    return ops_send(op, &e, opid);
}

int sbx_proc_output(struct sbx_table *t, const char *id, uint32_t pid, uint64_t offset, bool follow,
                    const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct op *op;
    struct proto_enc e;
    int r;

    if (pid == 0)
        return sbx_err_set(err, SBX_E_PROCESS_NOT_FOUND, "no process 0");
    if ((r = proc_begin(t, id, pid, OP_ATTACH, PROTO_ATTACH, 4, sink, user, &op, &e, err)))
        return r;
    op->u.proc.attach_off = offset;
    gstream_init_ring(&op->gs, offset);
    proto_put_u(&e, PK_OFF, offset);
    proto_put_b(&e, PK_FOLLOW, follow);
    return ops_send(op, &e, opid);
}

int sbx_proc_ctl(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_proc_ctl *c,
                 const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct op *op;
    struct proto_enc e;
    uint32_t nkeys = 2;
    int r;

    if (pid == 0)
        return sbx_err_set(err, SBX_E_PROCESS_NOT_FOUND, "no process 0");
    if (c->sig) {
        if (!gstream_sig_ok(c->sig))
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "signal must be 1..64");
        nkeys += 1;
    } else if (c->cols || c->rows) {
        if (c->cols < 1 || c->rows < 1 || c->cols > PROCS_SIZE_MAX || c->rows > PROCS_SIZE_MAX)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "cols and rows must be 1..%d",
                               PROCS_SIZE_MAX);
        nkeys += 2;
    } else {
        if (c->len > PROTO_MAX_DATA)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "at most %d bytes of stdin per request",
                               PROTO_MAX_DATA);
        if (!c->len && !c->eof)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "give data, data_b64 or eof");
        nkeys += (c->len ? 1 : 0) + (c->eof ? 1 : 0);
    }
    if ((r = proc_begin(t, id, pid, OP_PCTL, PROTO_PCTL, nkeys, sink, user, &op, &e, err)))
        return r;
    if (c->sig) {
        proto_put_i(&e, PK_SIG, c->sig);
    } else if (c->cols) {
        op->u.proc.resize = true;
        proto_put_u(&e, PK_COLS, c->cols);
        proto_put_u(&e, PK_ROWS, c->rows);
    } else {
        if (c->len)
            proto_put_bin(&e, PK_DATA, c->data, c->len);
        if (c->eof)
            proto_put_b(&e, PK_EOF, true);
    }
    return ops_send(op, &e, opid);
}
