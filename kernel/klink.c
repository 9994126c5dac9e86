/*
 * klink.c - the exchange with a sandbox's kernel bridge as a sandbox process
 * (klink.h): start the connector, write the request to its stdin, read its
 * answer from its output ring. Every sandbox-table call the code doors make
 * for kerneld is here, so they stay in one place.
 *
 * An exchange is a small state machine: START (the background exec is in
 * flight), WRITE (stdin chunks), READ (the output ring, followed). A caller
 * that cancels during START or WRITE leaves the struct alive until the op in
 * flight answers, then kills the connector: a connector that never got its
 * whole request would wait on its stdin forever. During READ cancelling only
 * stops reading: the run goes on in the guest and stays readable.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "klink.h"
#include "log.h"

/* The connector, behind a check that tells "no kernel bridge in this template"
 * (KLINK_EXIT_NO_KERNEL) from "a bridge that does not answer". exec keeps the pid. */
static const char connector_sh[] = "[ -e /usr/lib/warren/kerneld.py ] || exit 64; "
                                   "exec /proc/1/exe --connect /run/warren/kernel.sock";

#define ERRTXT_MAX 400 /* bytes of the connector's stderr kept for an error message */

enum kstate { K_START, K_WRITE, K_READ, K_DONE };

struct klink {
    struct sbx_table *t;
    struct ev_loop *loop;
    char id[128];
    enum kstate st;
    sbx_op_t op;
    uint32_t pid;
    struct klink_opts o;
    const struct klink_cb *cb;
    void *user;
    bool abandoned; /* the caller cancelled: no callbacks; free when safe */
    unsigned depth; /* inside a sink callback of ours: free deferred */
    bool dead;      /* free once depth is 0 */
    /* the request, written to stdin in SBX_PROC_STDIN_MAX pieces */
    char *req;
    size_t req_len, req_off;
    /* the answer */
    struct klink_lines lb;
    unsigned lines; /* lines seen */
    bool ended;     /* the last line came: stop reading */
    bool paused;    /* the reader is full: credit is held */
    /* klink_write: bytes for stdin after the request, one proc_ctl at a time */
    char *wq;
    size_t wq_len;
    sbx_op_t wop;
    size_t owed; /* bytes read and not yet acknowledged, while paused */
    char errtxt[ERRTXT_MAX + 1];
    size_t errlen;
    ev_timer ka;
};

static void k_free(struct klink *k)
{
    if (k->depth) {
        k->dead = true;
        return;
    }
    ev_timer_stop(k->loop, &k->ka);
    if (k->wop)
        sbx_op_cancel(k->t, k->wop);
    klink_lines_free(&k->lb);
    free(k->req);
    free(k->wq);
    free(k);
}

static void sink_ignore(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    (void)user;
    (void)err;
    (void)res;
}

static const struct sbx_sink ignore_sink = {.done = sink_ignore};

/* Send a signal to the connector, answering no one. */
static void kill_connector(struct sbx_table *t, const char *id, uint32_t pid, int sig)
{
    struct sbx_proc_ctl c = {.sig = sig};
    struct sbx_err err;
    sbx_op_t op;

    if (sbx_proc_ctl(t, id, pid, &c, &ignore_sink, NULL, &op, &err))
        LOG(LOG_DEBUG, "%s: could not signal kernel connector %" PRIu32 ": %s", id, pid, err.msg);
}

/* The end: done() once (unless abandoned), then free. */
static void finish(struct klink *k, const struct sbx_err *err)
{
    if (k->st == K_DONE)
        return;
    if (k->st == K_READ && k->op)
        sbx_op_cancel(k->t, k->op); /* the last line came, or a failure: stop following */
    k->st = K_DONE;
    k->op = 0;
    ev_timer_stop(k->loop, &k->ka);
    if (!k->abandoned && k->cb->done)
        k->cb->done(k->user, err);
    k_free(k);
}

static void fail(struct klink *k, enum sbx_errcode code, const char *fmt, const char *arg)
{
    struct sbx_err e;

    sbx_err_set(&e, code, fmt, arg);
    finish(k, &e);
}

static void on_keepalive(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct klink *k = (struct klink *)((char *)w - offsetof(struct klink, ka));

    (void)loop;
    (void)revents;
    if (!k->abandoned && k->cb->keepalive)
        k->cb->keepalive(k->user);
}

/* kerneld's {"type":"fail","code",...} as the core's error. */
static void fail_line(struct klink *k, json_t *obj)
{
    const char *code = json_string_value(json_object_get(obj, "code"));
    const char *msg = json_string_value(json_object_get(obj, "message"));
    enum sbx_errcode c = SBX_E_KERNEL_UNAVAILABLE;

    if (!code)
        code = "";
    if (!strcmp(code, "not_found"))
        c = SBX_E_CONTEXT_NOT_FOUND;
    else if (!strcmp(code, "bad_request"))
        c = SBX_E_INVALID_ARGUMENT;
    else if (!strcmp(code, "busy"))
        c = SBX_E_CONFLICT;
    fail(k, c, "%s", msg && *msg ? msg : "the kernel bridge refused the request");
}

static int on_line(void *ctx, const struct klink_line *l)
{
    struct klink *k = ctx;

    if (k->st != K_READ)
        return 1;
    k->lines++;
    if (k->o.keepalive_ms)
        ev_timer_again(k->loop, &k->ka);
    if (l->kind == KLINK_LINE_OK && l->type && !strcmp(l->type, "fail") && k->lines == 1) {
        fail_line(k, l->obj);
        return 1;
    }
    if (!k->abandoned && k->cb->line)
        k->cb->line(k->user, l);
    if (k->st != K_READ)
        return 1;
    if (k->o.single ||
        (l->kind == KLINK_LINE_OK && l->type && !strcmp(l->type, "end_of_execution"))) {
        k->ended = true;
        finish(k, NULL);
        return 1;
    }
    return 0;
}

static void out_data(void *user, int fd, uint64_t off, const void *p, size_t n)
{
    struct klink *k = user;
    sbx_op_t op = k->op;
    int rc = 0;

    if (k->st != K_READ)
        return;
    k->depth++;
    if (fd == 2) {
        size_t take = n < ERRTXT_MAX - k->errlen ? n : ERRTXT_MAX - k->errlen;
        memcpy(k->errtxt + k->errlen, p, take);
        k->errlen += take;
        k->errtxt[k->errlen] = '\0';
        /* One line of a message, for a JSON error body. */
        while (k->errlen && (k->errtxt[k->errlen - 1] == '\n' || k->errtxt[k->errlen - 1] == '\r'))
            k->errtxt[--k->errlen] = '\0';
    } else {
        /* Bytes of stderr in between moved the offset on. */
        if (off > k->lb.off)
            k->lb.off = off;
        rc = klink_lines_feed(&k->lb, p, n, on_line, k);
        if (rc == -ENOMEM)
            fail(k, SBX_E_INTERNAL, "%s", "out of memory reading the kernel bridge");
    }
    k->depth--;
    if (k->st == K_READ) {
        if (k->paused)
            k->owed += n;
        else
            sbx_op_consumed(k->t, op, n);
    }
    if (k->dead && !k->depth)
        k_free(k);
}

static void out_lost(void *user, uint64_t off, uint64_t n)
{
    struct klink *k = user;
    struct klink_line l = {.kind = KLINK_LINE_LOST, .off = off, .end = off + n, .n = (size_t)n};

    if (k->st != K_READ)
        return;
    /* What was gathered of a line is cut: start again at the next whole one. */
    klink_lines_free(&k->lb);
    klink_lines_init(&k->lb, k->o.max_line, off + n, true);
    k->depth++;
    if (!k->abandoned && k->cb->line && n)
        k->cb->line(k->user, &l);
    k->depth--;
    if (k->dead && !k->depth)
        k_free(k);
}

static void out_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct klink *k = user;
    int64_t code = res && res->kind == SBX_RES_EXEC ? res->u.exec->exit_code : -1;

    k->op = 0;
    if (k->st != K_READ)
        return;
    if (err) {
        finish(k, err);
        return;
    }
    if (k->lines && !k->o.single && !k->o.open && res && res->kind == SBX_RES_EXEC &&
        res->u.exec->signal) {
        fail(k, SBX_E_KERNEL_UNAVAILABLE, "%s",
             "the run was interrupted (DELETE of the run, or its connector was killed)");
    } else if (k->lines && !k->o.single && !k->o.open) {
        fail(k, SBX_E_KERNEL_UNAVAILABLE, "%s",
             "the kernel bridge ended before the end of the execution (did the kernel die?)");
    } else if (code == KLINK_EXIT_NO_KERNEL && !k->lines) {
        fail(k, SBX_E_NO_KERNEL, "%s",
             "this sandbox's template has no kernel: create it from the code-interpreter "
             "template (alias code-interpreter-v1)");
    } else if (!k->lines && !k->o.open) {
        fail(k, SBX_E_KERNEL_UNAVAILABLE, "the sandbox's kernel bridge does not answer: %s",
             k->errlen ? k->errtxt : "its connector ended without a word");
    } else {
        finish(k, NULL);
    }
}

static const struct sbx_sink out_sink = {
    .done = out_done,
    .data = out_data,
    .lost = out_lost,
};

/* Follow the connector's output from off. */
static int start_read(struct klink *k, uint64_t off, struct sbx_err *err)
{
    k->st = K_READ;
    if (k->o.keepalive_ms) {
        ev_timer_init(&k->ka, on_keepalive, 0., k->o.keepalive_ms / 1000.);
        ev_timer_again(k->loop, &k->ka);
    }
    return sbx_proc_output(k->t, k->id, k->pid, off, true, &out_sink, k, &k->op, err);
}

static void write_done(void *user, const struct sbx_err *err, const struct sbx_result *res);
static const struct sbx_sink write_sink = {.done = write_done};

/* The next piece of the request, or the read once it is all written. */
static int write_next(struct klink *k, struct sbx_err *err)
{
    struct sbx_proc_ctl c = {0};
    size_t n = k->req_len - k->req_off;

    if (!n)
        return start_read(k, 0, err);
    if (n > SBX_PROC_STDIN_MAX)
        n = SBX_PROC_STDIN_MAX;
    c.data = k->req + k->req_off;
    c.len = n;
    k->req_off += n;
    k->st = K_WRITE;
    return sbx_proc_ctl(k->t, k->id, k->pid, &c, &write_sink, k, &k->op, err);
}

static void write_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct klink *k = user;
    struct sbx_err e;

    (void)res;
    k->op = 0;
    if (k->abandoned) {
        kill_connector(k->t, k->id, k->pid, SIGKILL);
        finish(k, NULL);
        return;
    }
    if (err) {
        kill_connector(k->t, k->id, k->pid, SIGKILL);
        finish(k, err);
        return;
    }
    if (k->req_off == k->req_len) {
        free(k->req);
        k->req = NULL;
        if (k->cb->started)
            k->cb->started(k->user, k->pid);
        if (k->abandoned || k->st == K_DONE) {
            finish(k, NULL);
            return;
        }
    }
    if (write_next(k, &e))
        finish(k, &e);
}

static void exec_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct klink *k = user;
    struct sbx_err e;

    k->op = 0;
    if (err) {
        finish(k, err);
        return;
    }
    if (!res || res->kind != SBX_RES_STARTED) {
        fail(k, SBX_E_INTERNAL, "%s", "the kernel connector started without a pid");
        return;
    }
    k->pid = res->u.started.pid;
    if (k->abandoned) {
        kill_connector(k->t, k->id, k->pid, SIGKILL);
        finish(k, NULL);
        return;
    }
    if (write_next(k, &e))
        finish(k, &e);
}

static const struct sbx_sink exec_sink = {.done = exec_done};

static struct klink *k_new(struct sbx_table *t, struct ev_loop *loop, const char *id,
                           const struct klink_opts *o, const struct klink_cb *cb, void *user,
                           struct sbx_err *err)
{
    struct klink *k;

    if (strlen(id) >= sizeof(k->id)) {
        sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox %s", id);
        return NULL;
    }
    if (!(k = calloc(1, sizeof(*k)))) {
        sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
        return NULL;
    }
    k->t = t;
    k->loop = loop;
    strcpy(k->id, id);
    k->o = *o;
    k->cb = cb;
    k->user = user;
    klink_lines_init(&k->lb, o->max_line, 0, false);
    return k;
}

int klink_request(struct sbx_table *t, struct ev_loop *loop, const char *id, json_t *req,
                  const struct klink_opts *o, const struct klink_cb *cb, void *user,
                  struct klink **out, struct sbx_err *err)
{
    struct klink *k = k_new(t, loop, id, o, cb, user, err);
    static const struct sbx_str argv[] = {
        {"/bin/sh", 7}, {"-c", 2}, {connector_sh, sizeof(connector_sh) - 1}};
    const struct sbx_exec_req x = {
        .argv = argv,
        .argc = 3,
        .user = "root",
        .background = 1,
        .tag = {"kernel", 6},
    };
    char *s, *grown;
    int rc;

    if (!k)
        return err->code;
    /* JSON_COMPACT never writes a raw newline: the request is exactly one line. */
    if (!(s = json_dumps(req, JSON_COMPACT))) {
        k_free(k);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    k->req_len = strlen(s);
    if (!(grown = realloc(s, k->req_len + 2))) {
        free(s);
        k_free(k);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    k->req = grown;
    k->req[k->req_len++] = '\n';
    rc = sbx_exec(t, id, &x, false, &exec_sink, k, &k->op, err);
    if (rc) {
        k_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

int klink_read(struct sbx_table *t, struct ev_loop *loop, const char *id, uint32_t pid,
               uint64_t off, const struct klink_opts *o, const struct klink_cb *cb, void *user,
               struct klink **out, struct sbx_err *err)
{
    struct klink *k = k_new(t, loop, id, o, cb, user, err);
    int rc;

    if (!k)
        return err->code;
    k->pid = pid;
    /* From the byte before: a '\n' there means a line starts exactly at off. */
    if (off)
        klink_lines_init(&k->lb, o->max_line, off - 1, true);
    if ((rc = start_read(k, off ? off - 1 : 0, err))) {
        ev_timer_stop(loop, &k->ka);
        k_free(k);
        return rc;
    }
    *out = k;
    return 0;
}

void klink_cancel(struct klink *k)
{
    if (!k || k->abandoned)
        return;
    k->abandoned = true;
    if (k->st == K_DONE)
        return; /* being finished: freed by finish() */
    if (k->st == K_READ) {
        if (k->op)
            sbx_op_cancel(k->t, k->op);
        k->op = 0;
        k->st = K_DONE;
        k_free(k);
    }
    /* START or WRITE: the op in flight answers, kills the connector and frees. */
}

static void more_done(void *user, const struct sbx_err *err, const struct sbx_result *res);
static const struct sbx_sink more_sink = {.done = more_done};

/* The next piece of what klink_write queued, if none is in flight. */
static void more_next(struct klink *k)
{
    struct sbx_proc_ctl c = {0};
    struct sbx_err err;

    if (k->wop || !k->wq_len || k->st != K_READ)
        return;
    c.data = k->wq;
    c.len = k->wq_len < SBX_PROC_STDIN_MAX ? k->wq_len : SBX_PROC_STDIN_MAX;
    if (sbx_proc_ctl(k->t, k->id, k->pid, &c, &more_sink, k, &k->wop, &err)) {
        k->wop = 0;
        finish(k, &err);
        return;
    }
    /* The frame holds its own copy: what it took leaves the queue now. */
    memmove(k->wq, k->wq + c.len, k->wq_len - c.len);
    k->wq_len -= c.len;
}

static void more_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct klink *k = user;

    (void)res;
    k->wop = 0;
    if (k->st != K_READ)
        return;
    if (err) {
        finish(k, err);
        return;
    }
    more_next(k);
}

int klink_write(struct klink *k, const void *p, size_t n)
{
    char *b;

    if (!k || k->st != K_READ || k->abandoned)
        return -EPIPE;
    if (n > KLINK_WRITE_MAX - k->wq_len)
        return -EAGAIN;
    if (!(b = realloc(k->wq, k->wq_len + n ? k->wq_len + n : 1)))
        return -ENOMEM;
    k->wq = b;
    memcpy(k->wq + k->wq_len, p, n);
    k->wq_len += n;
    more_next(k);
    return 0;
}

void klink_pause(struct klink *k)
{
    if (k)
        k->paused = true;
}

void klink_resume(struct klink *k)
{
    size_t n;

    if (!k || !k->paused)
        return;
    k->paused = false;
    n = k->owed;
    k->owed = 0;
    /* May call out_data right away: nothing of k is held across it. */
    if (n && k->st == K_READ && k->op)
        sbx_op_consumed(k->t, k->op, n);
}

int klink_stop(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_sink *sink,
               void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct sbx_proc_ctl c = {.sig = SIGTERM};

    return sbx_proc_ctl(t, id, pid, &c, sink, user, op, err);
}
