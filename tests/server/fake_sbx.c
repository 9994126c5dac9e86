/*
 * fake_sbx.c - a sandbox table without VMs, for testing the HTTP layer
 * (server/http.c) below its interface, core/sbx.h. See fake_sbx.h.
 *
 * It keeps the contract the real table keeps: callbacks never run inside
 * the call that started an operation (every step is an ev_timer), streamed
 * output stops when the requester holds `window` (PROTO_WINDOW, as the real
 * credit) unacknowledged bytes and resumes on sbx_op_consumed, and an upload
 * takes at most `room` bytes until the "guest" drains them on the next loop
 * iteration and says writable. A cancelled operation is not freed at once:
 * like the real one it drains (the guest's last frame comes later) and makes
 * no callback meanwhile; only a cancelled create is freed at once. Any call
 * on a cancelled operation, or a second cancel, is counted as misuse.
 *
 * Scripts: create {"template":"bad"} fails at once, "slow" answers after
 * fake_slow_ms. exec cmd "echo", "fail", "sleep:MS", "ndjson" (text split
 * inside UTF-8 characters, stderr, invalid bytes), "big:N" (N bytes of
 * text), "forever". File reads "/small", "/big200" (200 MiB of
 * fake_pattern), "/forever", "/missing", "/dies" (fails after 100 KiB).
 * Uploads to "/pattern" (a slow guest) and "/zeros" are checked byte by byte.
 * Process FAKE_PID_LOSSY (a PTY to attach to) is a guest that misbehaves within its
 * window: one byte of output, then a "lost" notice for the next byte, over and over
 * (notices cost no window), for as long as it is read.
 */
#include "fake_sbx.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "proto.h"
#include "sbx.h"
#include "sbx_snap.h"

unsigned fake_slow_ms = 5000;
#define CHUNK      (64 * 1024)
#define EXEC_WIN   PROTO_WINDOW
#define READ_WIN   PROTO_WINDOW
#define WRITE_ROOM PROTO_WINDOW
#define DRAIN_S    0.02 /* a cancelled op's last frame arrives this much later */

struct fake_stats fake_stats;

static void misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void misuse(const char *fmt, ...)
{
    va_list ap;

    fake_stats.misuse++;
    fprintf(stderr, "fake_sbx: contract misuse: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

enum fop_kind { OP_LATER, OP_STREAM, OP_READ, OP_WRITE };
enum script { S_NONE, S_NDJSON, S_TEXT, S_FILE, S_DIES, S_LOSSY };

struct fsbx { /* always running */
    struct fsbx *next;
    char id[32], tmpl[64];
    json_t *meta;      /* its metadata, */
    struct sbx_kv *kv; /* as a record shows it (pointing into meta) */
    size_t nkv;
};

struct fop {
    struct fop *next;
    struct sbx_table *t;
    sbx_op_t id;
    enum fop_kind kind;
    enum script script;
    const struct sbx_sink *sink;
    void *user;
    ev_timer tm;
    bool busy;      /* inside a sink callback */
    bool cancelled; /* the requester is gone: draining, no more callbacks */
    bool create;    /* a create: freed at once when cancelled, as the real table does */
    char made[32];  /* a create: the sandbox it answers with */
    /* OP_LATER */
    struct sbx_err err; /* code SBX_OK: answer with res (has_res false: nothing) */
    bool has_res;
    struct sbx_result res; /* pointing at one of these: */
    struct sbx_exec_rec exec;
    struct sbx_proc_rec proc;
    struct sbx_stat_rec stat;
    char res_path[256];
    /* streams */
    int step;
    uint64_t total, sent, unconsumed, window;
    bool head_sent;
    uint64_t fd_off[3];
    /* uploads */
    char path[64];
    uint64_t got, buffered;
    bool finished, ok;
};

struct sbx_table {
    struct ev_loop *loop;
    const struct srv_config *cfg;
    struct fsbx *sbxs;
    struct fop *ops;
    sbx_op_t next_op;
    unsigned next_sbx;
};

int sbx_table_new(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table **out)
{
    struct sbx_table *t = calloc(1, sizeof(*t));

    if (!t)
        return -12;
    t->loop = loop;
    t->cfg = cfg;
    *out = t;
    return 0;
}

static void op_free(struct fop *o)
{
    struct fop **pp;

    for (pp = &o->t->ops; *pp; pp = &(*pp)->next) {
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    }
    ev_timer_stop(o->t->loop, &o->tm);
    fake_stats.ops_live--;
    free(o);
}

void sbx_table_free(struct sbx_table *t, bool kill_vms)
{
    while (t->ops)
        op_free(t->ops);
    while (t->sbxs) {
        struct fsbx *s = t->sbxs;
        t->sbxs = s->next;
        json_decref(s->meta);
        free(s->kv);
        free(s);
    }
    free(t);
}

static struct fsbx *find(struct sbx_table *t, const char *id)
{
    for (struct fsbx *s = t->sbxs; s; s = s->next) {
        if (!strcmp(s->id, id))
            return s;
    }
    return NULL;
}

static struct fop *find_op(struct sbx_table *t, sbx_op_t id)
{
    for (struct fop *o = t->ops; o; o = o->next) {
        if (o->id == id)
            return o;
    }
    return NULL;
}

static void op_step(struct ev_loop *loop, ev_timer *w, int revents);

static struct fop *op_new(struct sbx_table *t, enum fop_kind kind, const struct sbx_sink *sink,
                          void *user, double delay, sbx_op_t *op)
{
    struct fop *o = calloc(1, sizeof(*o));

    if (!o)
        abort();
    o->t = t;
    o->id = ++t->next_op;
    o->kind = kind;
    o->sink = sink;
    o->user = user;
    o->next = t->ops;
    t->ops = o;
    ev_timer_init(&o->tm, op_step, delay, 0);
    o->tm.data = o;
    ev_timer_start(t->loop, &o->tm);
    fake_stats.ops_live++;
    *op = o->id;
    return o;
}

/* Answer later with the result kind, whose record is the op's own (o->exec, ...). */
static void later(struct fop *o, enum sbx_res_kind kind)
{
    o->err.code = SBX_OK;
    o->has_res = true;
    o->res.kind = kind;
}

static void later_err(struct fop *o, enum sbx_errcode code, const char *msg)
{
    sbx_err_set(&o->err, code, "%s", msg);
    o->has_res = false;
}

/* An exec's exit: streamed, or buffered with out as its stdout (NULL: not buffered). */
static void set_exit(struct fop *o, bool streamed, int code, int64_t duration_ms, const char *out)
{
    o->exec = (struct sbx_exec_rec){.streamed = streamed,
                                    .exit_code = code,
                                    .has_duration = duration_ms >= 0,
                                    .duration_ms = duration_ms};
    if (out) {
        o->exec.buffered = true;
        o->exec.out[0] = (struct sbx_str){out, strlen(out)};
        o->exec.out[1] = (struct sbx_str){"", 0};
    }
    o->res.u.exec = &o->exec;
}

/* A cancelled op drains: its remaining frames arrive and are dropped, then it goes. */
static void op_drain(struct fop *o)
{
    o->cancelled = true;
    ev_timer_stop(o->t->loop, &o->tm);
    if (o->create) {
        op_free(o);
        return;
    }
    ev_timer_set(&o->tm, DRAIN_S, 0);
    ev_timer_start(o->t->loop, &o->tm);
}

/* Run a sink callback; true if the op was cancelled meanwhile (it is draining, or freed
 * if a create). */
#define CALL(o, expr)                                                                              \
    ({                                                                                             \
        (o)->busy = true;                                                                          \
        expr;                                                                                      \
        (o)->busy = false;                                                                         \
        bool gone_ = (o)->cancelled;                                                               \
        if (gone_)                                                                                 \
            op_drain(o);                                                                           \
        gone_;                                                                                     \
    })

static void rec_of(const struct fsbx *s, struct sbx_rec *r)
{
    *r = (struct sbx_rec){.id = s->id,
                          .tmpl = s->tmpl,
                          .state = "running",
                          .source = "boot",
                          .metadata = s->kv,
                          .nmetadata = s->nkv};
}

/* Answer with res (NULL: nothing; its records are the op's) or, for a create, the
 * sandbox's record. */
static void finish_op(struct fop *o, const struct sbx_err *err, const struct sbx_result *res)
{
    struct fsbx *made = o->create && !err ? find(o->t, o->made) : NULL;
    struct sbx_result mine;
    struct sbx_rec rec;

    if (made) {
        rec_of(made, &rec);
        mine = (struct sbx_result){.kind = SBX_RES_SANDBOX, .u.sandbox = &rec};
        res = &mine;
    }
    if (CALL(o, o->sink->done(o->user, err, err ? NULL : res)))
        return;
    op_free(o);
}

static void fill(struct fop *o, unsigned char *buf, uint64_t off, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t k = off + i;
        buf[i] = o->script == S_TEXT ? (k % 64 == 63 ? '\n' : (unsigned char)('a' + k % 26))
                                     : fake_pattern(k);
    }
}

/* Send what the window allows; done when everything went out. */
static void pump(struct fop *o)
{
    static unsigned char buf[CHUNK];

    while (o->sent < o->total && o->unconsumed < o->window) {
        size_t n = CHUNK;
        if (n > o->total - o->sent)
            n = (size_t)(o->total - o->sent);
        if (n > o->window - o->unconsumed)
            n = (size_t)(o->window - o->unconsumed);
        if (o->script == S_DIES && o->sent >= 100 * 1024) {
            struct sbx_err e;
            sbx_err_set(&e, SBX_E_INTERNAL, "the guest went away");
            finish_op(o, &e, NULL);
            return;
        }
        fill(o, buf, o->sent, n);
        o->unconsumed += n;
        if (o->unconsumed > fake_stats.max_unconsumed)
            fake_stats.max_unconsumed = o->unconsumed;
        if (CALL(o, o->sink->data(o->user, o->kind == OP_READ ? 0 : 1, o->sent, buf, n)))
            return;
        o->sent += n;
    }
    if (o->sent == o->total) {
        if (o->kind == OP_READ)
            finish_op(o, NULL, NULL);
        else {
            later(o, SBX_RES_EXEC);
            set_exit(o, true, 0, -1, NULL);
            finish_op(o, NULL, &o->res);
        }
    }
}

static void ndjson_script(struct fop *o)
{
    /* "wörld" with ö (c3 b6) split across events; then a 4-byte emoji split 1+3. */
    static const struct {
        int fd;
        const char *s;
        size_t n;
    } ev[] = {
        {1, "hello w\xc3", 8},  {1, "\xb6rld\n", 5}, {2, "err\n", 4},
        {1, "\xff\xfe", 2},     {1, "\xf0", 1},      {1, "\x9f\x98\x80!\n", 5},
        {2, "tail\xe2\x82", 6}, /* ends inside a 3-byte sequence: flushed as base64 at exit */
    };
    uint64_t *off = o->fd_off;

    if ((size_t)o->step < sizeof(ev) / sizeof(ev[0])) {
        int i = o->step++;
        o->unconsumed += ev[i].n;
        if (CALL(o, o->sink->data(o->user, ev[i].fd, off[ev[i].fd], ev[i].s, ev[i].n)))
            return;
        off[ev[i].fd] += ev[i].n;
        ev_timer_set(&o->tm, 0.001, 0);
        ev_timer_start(o->t->loop, &o->tm);
        return;
    }
    later(o, SBX_RES_EXEC);
    set_exit(o, true, 3, 7, NULL);
    finish_op(o, NULL, &o->res);
}

/* FAKE_PID_LOSSY's output: 64 pairs of one byte and one lost byte each millisecond. */
static void lossy_script(struct fop *o)
{
    for (int i = 0; i < 64 && o->unconsumed < o->window; i++) {
        o->unconsumed++;
        if (CALL(o, o->sink->data(o->user, 1, o->sent, "x", 1)))
            return;
        if (CALL(o, o->sink->lost(o->user, o->sent + 1, 1)))
            return;
        o->sent += 2;
    }
    ev_timer_set(&o->tm, 0.001, 0);
    ev_timer_start(o->t->loop, &o->tm);
}

static void op_step(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct fop *o = w->data;

    if (o->cancelled) {
        op_free(o); /* drained */
        return;
    }
    switch (o->kind) {
    case OP_LATER:
        finish_op(o, o->err.code ? &o->err : NULL, o->has_res ? &o->res : NULL);
        break;
    case OP_STREAM:
        if (o->script == S_NDJSON)
            ndjson_script(o);
        else if (o->script == S_LOSSY)
            lossy_script(o);
        else
            pump(o);
        break;
    case OP_READ:
        if (!o->head_sent) {
            o->head_sent = true;
            if (CALL(o, o->sink->head(o->user, o->total)))
                return;
        }
        pump(o);
        break;
    case OP_WRITE:
        /* The guest drained what it had: room again, or the final answer. */
        o->buffered = 0;
        if (!strcmp(o->path, "/readonly") && o->got) {
            /* Refuses the file after its first bytes: answered before the body ends. */
            struct sbx_err e;
            sbx_err_set(&e, SBX_E_READ_ONLY, "read-only file system");
            finish_op(o, &e, NULL);
        } else if (o->finished) {
            fake_stats.upload_bytes = o->got;
            fake_stats.upload_ok = o->ok;
            later(o, SBX_RES_WRITTEN);
            o->res.u.file.path = o->path;
            o->res.u.file.size = o->got;
            finish_op(o, NULL, &o->res);
        } else {
            CALL(o, o->sink->writable(o->user));
        }
        break;
    }
}

static int need_sbx(struct sbx_table *t, const char *id, struct sbx_err *err)
{
    if (find(t, id))
        return 0;
    return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox %s", id);
}

int sbx_get(struct sbx_table *t, const char *id, struct sbx_rec *out, struct sbx_err *err)
{
    struct fsbx *s = find(t, id);

    if (!s) {
        return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox %s", id);
    }
    rec_of(s, out);
    return 0;
}

/* A request's string map as an object (the fake keeps and echoes JSON). */
static json_t *kv_json(const struct sbx_kv *kv, size_t n)
{
    json_t *o = json_object();

    for (size_t i = 0; i < n; i++)
        json_object_set_new(o, kv[i].key, json_stringn(kv[i].val.p, kv[i].val.n));
    return o;
}

static bool meta_match(const struct fsbx *s, const struct sbx_kv *filter, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *v = json_string_value(json_object_get(s->meta, filter[i].key));
        if (!v || strlen(v) != filter[i].val.n || memcmp(v, filter[i].val.p, filter[i].val.n))
            return false;
    }
    return true;
}

int sbx_list(struct sbx_table *t, const char *state, const struct sbx_kv *filter, size_t nfilter,
             struct sbx_rec **out, size_t *n, struct sbx_err *err)
{
    size_t count = 0;

    snprintf(fake_stats.list_state, sizeof(fake_stats.list_state), "%s", state ? state : "");
    json_decref(fake_stats.list_filter);
    fake_stats.list_filter = kv_json(filter, nfilter);
    for (struct fsbx *s = t->sbxs; s; s = s->next)
        count++;
    *out = calloc(count + 1, sizeof(**out));
    *n = 0;
    for (struct fsbx *s = t->sbxs; s; s = s->next)
        if ((!state || !strcmp(state, "running")) && meta_match(s, filter, nfilter))
            rec_of(s, &(*out)[(*n)++]);
    return 0;
}

int sbx_delete(struct sbx_table *t, const char *id, struct sbx_rec *out, struct sbx_err *err)
{
    static char gone[32]; /* the record's id: borrowed until the next call */
    struct fsbx **pp;

    for (pp = &t->sbxs; *pp; pp = &(*pp)->next) {
        if (!strcmp((*pp)->id, id)) {
            struct fsbx *s = *pp;
            *pp = s->next;
            snprintf(gone, sizeof(gone), "%s", id);
            json_decref(s->meta);
            free(s->kv);
            free(s);
            *out = (struct sbx_rec){.id = gone, .tmpl = "", .state = "ended", .source = "boot"};
            return 0;
        }
    }
    return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox %s", id);
}

int sbx_set_timeout(struct sbx_table *t, const char *id, int64_t ttl, struct sbx_rec *out,
                    struct sbx_err *err)
{
    struct fsbx *s = find(t, id);

    if (!s)
        return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox %s", id);
    if (ttl <= 0) {
        return sbx_err_set(err, SBX_E_BAD_REQUEST, "ttl_seconds must be a positive integer");
    }
    rec_of(s, out);
    out->idle_s = (unsigned)ttl; /* shown where the test looks for the TTL it gave */
    return 0;
}

int sbx_create(struct sbx_table *t, const struct sbx_create_req *req, const struct sbx_sink *sink,
               void *user, sbx_op_t *op, struct sbx_err *err)
{
    const char *tpl = req->tmpl ? req->tmpl : t->cfg->default_template, *k;
    struct fsbx *s;
    struct fop *o;
    json_t *v;

    if (!strcmp(tpl, "bad")) {
        return sbx_err_set(err, SBX_E_UNKNOWN_TEMPLATE, "no template %s", tpl);
    }
    s = calloc(1, sizeof(*s));
    snprintf(s->id, sizeof(s->id), "sbx-%u", ++t->next_sbx);
    snprintf(s->tmpl, sizeof(s->tmpl), "%s", tpl);
    s->meta = kv_json(req->metadata, req->nmetadata);
    s->kv = calloc(json_object_size(s->meta) + 1, sizeof(*s->kv));
    json_object_foreach(s->meta, k, v) s->kv[s->nkv++] =
        (struct sbx_kv){k, {json_string_value(v), json_string_length(v)}};
    s->next = t->sbxs;
    t->sbxs = s;
    o = op_new(t, OP_LATER, sink, user, !strcmp(tpl, "slow") ? fake_slow_ms / 1000.0 : 0.02, op);
    o->create = true;
    snprintf(o->made, sizeof(o->made), "%s", s->id);
    return 0;
}

int sbx_exec(struct sbx_table *t, const char *id, const struct sbx_exec_req *req, bool stream,
             const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    const char *cmd = req->cmd.p;
    struct fop *o;
    int st;

    if ((st = need_sbx(t, id, err)))
        return st;
    if (!cmd) {
        return sbx_err_set(err, SBX_E_BAD_REQUEST, "cmd or argv is required");
    }
    if (!strcmp(cmd, "fail")) {
        o = op_new(t, OP_LATER, sink, user, 0.01, op);
        later_err(o, SBX_E_DEAD, "the sandbox died: killed by signal 9");
        return 0;
    }
    if (!strncmp(cmd, "sleep:", 6)) {
        o = op_new(t, OP_LATER, sink, user, atoi(cmd + 6) / 1000.0, op);
        later(o, SBX_RES_EXEC);
        set_exit(o, stream, 0, stream ? -1 : atoi(cmd + 6), stream ? NULL : "");
        return 0;
    }
    if (!stream) {
        o = op_new(t, OP_LATER, sink, user, 0.01, op);
        later(o, SBX_RES_EXEC);
        set_exit(o, false, 0, 1, "hi\n");
        return 0;
    }
    o = op_new(t, OP_STREAM, sink, user, 0.001, op);
    o->window = EXEC_WIN;
    if (!strcmp(cmd, "ndjson")) {
        o->script = S_NDJSON;
    } else if (!strncmp(cmd, "big:", 4)) {
        o->script = S_TEXT;
        o->total = strtoull(cmd + 4, NULL, 10);
    } else if (!strcmp(cmd, "forever")) {
        o->script = S_TEXT;
        o->total = UINT64_MAX;
    } else {
        o->script = S_TEXT;
        o->total = 6;
    }
    return 0;
}

int sbx_file_read(struct sbx_table *t, const char *id, const char *path,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct fop *o;
    int st;

    if ((st = need_sbx(t, id, err)))
        return st;
    if (!strcmp(path, "/missing")) {
        o = op_new(t, OP_LATER, sink, user, 0.01, op);
        later_err(o, SBX_E_FILE_NOT_FOUND, "/missing: no such file");
        return 0;
    }
    o = op_new(t, OP_READ, sink, user, 0.001, op);
    o->window = READ_WIN;
    o->script = S_FILE;
    if (!strcmp(path, "/big200"))
        o->total = 200ull << 20;
    else if (!strcmp(path, "/forever"))
        o->total = 1ull << 40;
    else if (!strcmp(path, "/dies")) {
        o->total = 1 << 20;
        o->script = S_DIES;
    } else
        o->total = 11;
    return 0;
}

int sbx_file_write(struct sbx_table *t, const char *id, const char *path, unsigned mode,
                   const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct fop *o;
    int st;

    if ((st = need_sbx(t, id, err)))
        return st;
    o = op_new(t, OP_WRITE, sink, user, 0, op);
    ev_timer_stop(t->loop, &o->tm); /* the first step is a drain, after the first write */
    snprintf(o->path, sizeof(o->path), "%s", path);
    o->ok = true;
    fake_stats.upload_bytes = 0;
    fake_stats.upload_ok = false;
    return 0;
}

/* Keeps what it was asked in fake_stats, for the tests to check the door's decoding,
 * and answers as the real table does: a stat of a file, an empty listing, or the path. */
int sbx_file_op(struct sbx_table *t, const char *id, const struct sbx_file_req *req,
                const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct fop *o;
    int st;

    if ((st = need_sbx(t, id, err)))
        return st;
    fake_stats.file_kind = (int)req->kind;
    snprintf(fake_stats.file_path, sizeof(fake_stats.file_path), "%s", req->path ? req->path : "");
    snprintf(fake_stats.file_to, sizeof(fake_stats.file_to), "%s", req->to ? req->to : "");
    fake_stats.file_depth = req->depth;
    fake_stats.file_recursive = req->recursive;
    o = op_new(t, OP_LATER, sink, user, 0.005, op);
    snprintf(o->res_path, sizeof(o->res_path), "%s", req->path ? req->path : "");
    switch (req->kind) {
    case SBX_FILE_STAT:
        later(o, SBX_RES_STAT);
        o->stat = (struct sbx_stat_rec){
            .path = {o->res_path, strlen(o->res_path)}, .type = {"file", 4}, .has_size = true};
        o->res.u.stat = &o->stat;
        break;
    case SBX_FILE_LIST:
        later(o, SBX_RES_LISTING);
        o->res.u.listing.path = o->res_path;
        break;
    default:
        later(o, SBX_RES_PATH);
        o->res.u.file.path = o->res_path;
        break;
    }
    return 0;
}

/* Whether o is an upload still taking bytes; counted as misuse if not. */
static bool upload_ok(const char *call, const struct fop *o, sbx_op_t op)
{
    if (o && o->kind == OP_WRITE && !o->finished && !o->cancelled)
        return true;
    misuse("%s on op %llu (%s)", call, (unsigned long long)op,
           !o             ? "unknown"
           : o->cancelled ? "cancelled"
           : o->finished  ? "finished"
                          : "not an upload");
    return false;
}

size_t sbx_op_write(struct sbx_table *t, sbx_op_t op, const void *p, size_t n)
{
    struct fop *o = find_op(t, op);
    const unsigned char *b = p;
    size_t take;

    if (!upload_ok("sbx_op_write", o, op))
        return 0;
    fake_stats.write_calls++;
    fake_stats.write_bytes += n;
    /* "/pattern" has a slow guest with little room: most writes stall. */
    take = (strcmp(o->path, "/pattern") ? WRITE_ROOM : 16 * 1024) - o->buffered;
    if (take > n)
        take = n;
    if (take < n)
        fake_stats.upload_stalls++;
    if (!strcmp(o->path, "/zeros")) {
        static const unsigned char zero[WRITE_ROOM];
        if (memcmp(b, zero, take))
            o->ok = false;
    } else if (!strcmp(o->path, "/pattern")) {
        for (size_t i = 0; i < take && o->ok; i++) {
            if (b[i] != fake_pattern(o->got + i))
                o->ok = false;
        }
    }
    o->got += take;
    o->buffered += take;
    if (take && !ev_is_active(&o->tm)) {
        ev_timer_set(&o->tm, strcmp(o->path, "/pattern") ? 0 : 0.001, 0);
        ev_timer_start(t->loop, &o->tm);
    }
    return take;
}

void sbx_op_finish(struct sbx_table *t, sbx_op_t op)
{
    struct fop *o = find_op(t, op);

    if (!upload_ok("sbx_op_finish", o, op))
        return;
    o->finished = true;
    if (!ev_is_active(&o->tm)) {
        ev_timer_set(&o->tm, 0, 0);
        ev_timer_start(t->loop, &o->tm);
    }
}

void sbx_op_consumed(struct sbx_table *t, sbx_op_t op, size_t n)
{
    struct fop *o = find_op(t, op);

    if (!o)
        return; /* finished meanwhile: fine */
    if (o->cancelled) {
        misuse("sbx_op_consumed on cancelled op %llu", (unsigned long long)op);
        return;
    }
    if (n > o->unconsumed) {
        misuse("sbx_op_consumed(%zu) with %llu outstanding", n, (unsigned long long)o->unconsumed);
        n = (size_t)o->unconsumed;
    }
    o->unconsumed -= n;
    if ((o->kind == OP_STREAM || o->kind == OP_READ) && o->unconsumed < o->window &&
        !ev_is_active(&o->tm) && !o->busy) {
        ev_timer_set(&o->tm, 0, 0);
        ev_timer_start(t->loop, &o->tm);
    }
}

void sbx_op_cancel(struct sbx_table *t, sbx_op_t op)
{
    struct fop *o = find_op(t, op);

    if (!o)
        return;
    if (o->cancelled) {
        misuse("sbx_op_cancel twice on op %llu", (unsigned long long)op);
        return;
    }
    fake_stats.cancels++;
    if (o->busy) {
        o->cancelled = true; /* CALL drains it once the callback returns */
        ev_timer_stop(t->loop, &o->tm);
        return;
    }
    op_drain(o);
}

unsigned sbx_count_live(const struct sbx_table *t)
{
    unsigned n = 0;

    for (struct fsbx *s = t->sbxs; s; s = s->next)
        n++;
    return n;
}

/* Processes: the fake sandboxes have none (a background exec runs as a foreground one).
 * As in the real table, the answer comes later, never inside the call. */
int sbx_proc_list(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_sink *sink,
                  void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct fop *o;
    int st;

    if ((st = need_sbx(t, id, err)))
        return st;
    o = op_new(t, OP_LATER, sink, user, 0.005, op);
    if (pid == FAKE_PID_LOSSY) {
        later(o, SBX_RES_PROC);
        o->proc = (struct sbx_proc_rec){
            .pid = FAKE_PID_LOSSY, .pty = true, .cols = 80, .rows = 24, .running = true};
        o->res.u.procs.v = &o->proc;
        o->res.u.procs.n = 1;
    } else if (pid) {
        later_err(o, SBX_E_PROCESS_NOT_FOUND, "no such process");
    } else {
        later(o, SBX_RES_PROCS); /* none */
    }
    return 0;
}

int sbx_proc_output(struct sbx_table *t, const char *id, uint32_t pid, uint64_t offset, bool follow,
                    const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct fop *o;
    int st;

    if (pid != FAKE_PID_LOSSY)
        return sbx_proc_list(t, id, pid ? pid : 1, sink, user, op, err);
    if ((st = need_sbx(t, id, err)))
        return st;
    o = op_new(t, OP_STREAM, sink, user, 0.001, op);
    o->script = S_LOSSY;
    o->window = EXEC_WIN;
    return 0;
}

int sbx_proc_ctl(struct sbx_table *t, const char *id, uint32_t pid, const struct sbx_proc_ctl *c,
                 const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    return sbx_proc_list(t, id, pid ? pid : 1, sink, user, op, err);
}

void sbx_pool_stats(const struct sbx_table *t, struct sbx_pool_stats *out)
{
    memset(out, 0, sizeof(*out)); /* no pool in the fake */
}

int sbx_templates(struct sbx_table *t, struct sbx_tmpl_list **out, struct sbx_err *err)
{
    if (!(*out = calloc(1, sizeof(**out)))) /* no images in the fake */
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

/* Snapshots: none exist in the fake table (the HTTP layer only routes them). */
int sbx_snap_take(struct sbx_table *t, const char *id, const struct sbx_snap_req *req,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    if (!find(t, id))
        return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox %s", id);
    return sbx_err_set(err, SBX_E_INTERNAL, "the fake table takes no snapshots");
}

int sbx_snap_all(struct sbx_table *t, struct sbx_snap_rec **out, size_t *n, struct sbx_err *err)
{
    *n = 0;
    if (!(*out = calloc(1, sizeof(**out))))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

int sbx_snap_find(struct sbx_table *t, const char *id, struct sbx_snap_rec *out,
                  struct sbx_err *err)
{
    return sbx_err_set(err, SBX_E_SNAPSHOT_NOT_FOUND, "no snapshot with id '%s'", id);
}

int sbx_snap_drop(struct sbx_table *t, const char *id, struct sbx_snap_rec *out,
                  struct sbx_err *err)
{
    return sbx_snap_find(t, id, out, err);
}

int sbx_snap_fork(struct sbx_table *t, const char *id, const struct sbx_fork_req *req,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    return sbx_snap_take(t, id, NULL, sink, user, op, err);
}

int sbx_snap_pause(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
                   sbx_op_t *op, struct sbx_rec *out, struct sbx_err *err)
{
    *op = 0;
    return sbx_snap_take(t, id, NULL, sink, user, op, err);
}

int sbx_snap_resume(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
                    sbx_op_t *op, struct sbx_rec *out, struct sbx_err *err)
{
    *op = 0;
    return sbx_snap_take(t, id, NULL, sink, user, op, err);
}

/* The fake has no network: PATCH .../network is refused as with net_enabled off. */
int sbx_set_network(struct sbx_table *t, const char *id, const struct sbx_net_req *req,
                    const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                       "networking is off on this server (net_enabled = false)");
}

/* The fake never pauses a sandbox (its pause is a snapshot that leaves it running),
 * and its sandboxes are up from their create. */
bool sbx_coming_back(struct sbx_table *t, const char *id)
{
    return false;
}

/* The port proxy (sbx.h): no networking in the fake table. */
int sbx_port_open(struct sbx_table *t, const char *id, char *ns, size_t cap, char vm[24],
                  struct sbx_err *err)
{
    return sbx_err_set(err, SBX_E_CONFLICT, "sandbox networking is off in the fake table");
}

int sbx_port_check(struct sbx_table *t, const char *id, const char *vm, bool used)
{
    return -ESRCH;
}

bool sbx_port_public(struct sbx_table *t, const char *id, unsigned port)
{
    return false;
}

int vmm_netns_enter(const char *path, int *self)
{
    *self = -1;
    return -ENOSYS;
}

void vmm_netns_leave(int self) {}
