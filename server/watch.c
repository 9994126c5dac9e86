/*
 * watch.c - file watches over REST: GET .../files/watch starts one, GET
 * .../files/watch/{W} resumes it from an offset, DELETE .../files/watch/{W}
 * ends it (docs/API.md, "Watching files").
 *
 * A watch is a background process of the sandbox running guest-init's --watch
 * builtin (guest-init/watch.h), tagged WATCH_TAG_PREFIX + its path, and W is its
 * pid: it is owned by the sandbox like any other process, so a client that goes
 * away (or a warrend that restarts) leaves it running, its lines waiting in the
 * guest's output ring. Each request walks a few core operations in turn on the
 * same struct pss (list the processes, start or signal one, follow its output);
 * the request stays in OP while one op hands over to the next, and the sink's
 * callbacks check the step they expect. The guest's lines become client events
 * through watch_ev.c, never passed through unchecked.
 */
#include "http_int.h"
#include "watch_ev.h"

#include <signal.h>

#define GI_WATCH_EXE   "/proc/1/exe" /* warren-init, whatever the root disk holds */
#define WATCH_TAG_MAX  256           /* a process tag's longest (ops.c) */
#define WATCH_DIRS_CAP 1048576       /* the builtin's own ceiling (GI_WATCH_MAX_LIMIT) */
#define WATCH_CO_CAP   60000

enum wstep {
    WS_COUNT,  /* start: listing the processes to count the running watches */
    WS_EXEC,   /* start: the watch's process is being started */
    WS_CHECK,  /* resume / delete: is W a watch? */
    WS_SIGNAL, /* delete: W is being signalled */
    WS_STREAM, /* following W's output */
};

struct watch_req {
    enum wstep step;
    bool del;      /* a DELETE */
    bool fresh;    /* a new watch: the answer waits for the guest's first line */
    bool started;  /* the NDJSON answer has begun */
    uint64_t from; /* offset the stream starts at */
    char *path;
    bool recursive;
    struct watch_ev ev;
};

static const struct sbx_sink wsink;

void watch_req_free(struct pss *p)
{
    struct watch_req *w = p->watch;

    if (!w)
        return;
    watch_ev_free(&w->ev);
    free(w->path);
    free(w);
    p->watch = NULL;
}

static struct watch_req *req_new(struct pss *p)
{
    watch_req_free(p);
    p->watch = calloc(1, sizeof(*p->watch));
    return p->watch;
}

/* The op chain is over with this answer. */
static void answer(struct pss *p, int status, json_t *body)
{
    if (http_phase_op_live(p->phase))
        req_phase(p, HP_ANSWER);
    resp_json(p, status, body);
    resp_want_write(p);
}

static void answer_err(struct pss *p, const struct sbx_err *e)
{
    answer(p, sbx_err_http_status(e->code), api_error_of(e));
}

static void answer_code(struct pss *p, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void answer_code(struct pss *p, int status, const char *code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    answer(p, status, api_error(code, "%s", msg));
}

/* A started op: stay in OP (or enter it); a refused one is the answer. */
static void next_op(struct pss *p, int rc, const struct sbx_err *err)
{
    if (rc) {
        answer_err(p, err);
        return;
    }
    if (p->phase != HP_OP && p->phase != HP_STREAM)
        req_phase(p, HP_OP);
}

/* The NDJSON answer's head (with X-Warren-Watch) and its first line. */
static int stream_begin(struct pss *p)
{
    struct watch_req *w = p->watch;
    char line[96];
    int n;

    w->started = true;
    resp_ndjson_begin(p);
    n = snprintf(line, sizeof(line),
                 "{\"type\":\"watch\",\"id\":%" PRIu32 ",\"offset\":%" PRIu64 "}\n", p->pid,
                 w->from);
    return resp_ndjson_append(p, line, (size_t)n, 0);
}

static void follow(struct pss *p, uint64_t offset)
{
    struct watch_req *w = p->watch;
    struct sbx_err err;
    int rc;

    w->step = WS_STREAM;
    w->from = offset;
    if (watch_ev_init(&w->ev, p->srv->cfg->watch_line_max, offset)) {
        answer_code(p, 500, "internal", "out of memory");
        return;
    }
    rc = sbx_proc_output(p->srv->t, p->sbx, p->pid, offset, true, &wsink, p, &p->op, &err);
    next_op(p, rc, &err);
    if (!rc && !w->fresh && stream_begin(p)) {
        answer_code(p, 500, "internal", "out of memory");
        sbx_op_cancel(p->srv->t, p->op);
    }
}

bool watch_proc_is(json_t *proc)
{
    const char *tag = json_string_value(json_object_get(proc, "tag"));

    return tag && !strncmp(tag, WATCH_TAG_PREFIX, sizeof(WATCH_TAG_PREFIX) - 1);
}

json_t *watch_exec_body(const struct srv_config *cfg, const char *path, bool recursive)
{
    char tag[WATCH_TAG_MAX + 1], dirs[16], co[16];
    json_t *argv;
    size_t len;

    /* The tag is a label: a long path is cut at a character's start. */
    len = (size_t)snprintf(tag, sizeof(tag), "%s%s", WATCH_TAG_PREFIX, path);
    if (len > WATCH_TAG_MAX) {
        len = WATCH_TAG_MAX;
        while (len && ((unsigned char)tag[len] & 0xc0) == 0x80)
            len--;
        tag[len] = 0;
    }
    snprintf(dirs, sizeof(dirs), "%u",
             cfg->watch_max_dirs < WATCH_DIRS_CAP ? cfg->watch_max_dirs : WATCH_DIRS_CAP);
    snprintf(co, sizeof(co), "%u",
             cfg->watch_coalesce_ms < WATCH_CO_CAP ? cfg->watch_coalesce_ms : WATCH_CO_CAP);
    argv = recursive ? json_pack("[s,s,s,s,s,s,s,s,s]", GI_WATCH_EXE, "--watch", "--recursive",
                                 "--max-watches", dirs, "--coalesce-ms", co, "--", path)
                     : json_pack("[s,s,s,s,s,s,s,s]", GI_WATCH_EXE, "--watch", "--max-watches",
                                 dirs, "--coalesce-ms", co, "--", path);
    return json_pack("{s:o*,s:b,s:s,s:s}", "argv", argv, "background", 1, "tag", tag, "user",
                     "root");
}

unsigned watch_running(json_t *list)
{
    unsigned n = 0;
    size_t i;
    json_t *proc;

    json_array_foreach(json_object_get(list, "processes"), i, proc)
    {
        if (watch_proc_is(proc) && json_is_true(json_object_get(proc, "running")))
            n++;
    }
    return n;
}

static void start_exec(struct pss *p)
{
    struct watch_req *w = p->watch;
    struct sbx_err err;
    json_t *body = watch_exec_body(p->srv->cfg, w->path, w->recursive);
    int rc;

    if (!body || !json_object_get(body, "argv")) {
        json_decref(body);
        answer_code(p, 500, "internal", "out of memory");
        return;
    }
    w->step = WS_EXEC;
    rc = sbx_exec(p->srv->t, p->sbx, body, false, &wsink, p, &p->op, &err);
    json_decref(body);
    next_op(p, rc, &err);
}

/* ------------------------------------------------------------ the sink */

/* One checked event from the guest. */
static int on_event(void *user, json_t *ev)
{
    struct pss *p = user;
    struct watch_req *w = p->watch;
    const char *type = json_string_value(json_object_get(ev, "type"));
    char *s;
    int rc;

    if (!w->started) {
        if (!strcmp(type, "error")) {
            /* The guest could not watch the path: the answer is an ordinary error. */
            const char *code = json_string_value(json_object_get(ev, "code"));
            const char *msg = json_string_value(json_object_get(ev, "message"));
            int status = !strcmp(code, "not_found") ? 404 : !strcmp(code, "internal") ? 500 : 400;

            sbx_op_cancel(p->srv->t, p->op);
            answer_code(p, status,
                        status == 404                      ? "file_not_found"
                        : !strcmp(code, "not_a_directory") ? "not_a_directory"
                        : status == 500                    ? "internal"
                                                           : "bad_request",
                        "%s", msg ? msg : "the path cannot be watched");
            return 1;
        }
        if (stream_begin(p))
            return -ENOMEM;
    }
    s = json_dumps(ev, JSON_COMPACT);
    if (!s)
        return -ENOMEM;
    rc = resp_ndjson_append(p, s, strlen(s), 0) || resp_ndjson_append(p, "\n", 1, 0) ? -ENOMEM : 0;
    free(s);
    return rc;
}

static void oom(struct pss *p)
{
    LOG(LOG_ERR, "out of memory queueing watch %" PRIu32 " of %s: closing the request", p->pid,
        p->sbx);
    p->close_after = true;
    if (http_phase_op_live(p->phase)) {
        req_phase(p, HP_ANSWER);
        req_complete(p);
        sbx_op_cancel(p->srv->t, p->op);
    }
    resp_want_write(p);
}

static void wsink_data(void *user, int fd, uint64_t off, const void *ptr, size_t n)
{
    struct pss *p = user;
    struct watch_req *w = p->watch;
    int rc;

    (void)fd; /* stdout and stderr share the offsets; the builtin writes only stdout */
    if (!http_phase_op_live(p->phase) || !w || w->step != WS_STREAM)
        return;
    rc = watch_ev_feed(&w->ev, off, ptr, n, on_event, p);
    if (rc < 0) {
        oom(p);
        return;
    }
    if (rc > 0 || !http_phase_op_live(p->phase))
        return; /* answered */
    /* Every byte was taken: its credit goes back once what it made is written. */
    if (resp_ndjson_append(p, "", 0, n)) {
        oom(p);
        return;
    }
    if (w->started)
        resp_stall_arm(p, false);
    resp_want_write(p);
}

static void wsink_lost(void *user, uint64_t off, uint64_t n)
{
    struct pss *p = user;
    struct watch_req *w = p->watch;
    char line[96];
    int len;

    if (!http_phase_op_live(p->phase) || !w || w->step != WS_STREAM)
        return;
    watch_ev_gap(&w->ev, off + n);
    if (!w->started && stream_begin(p)) {
        oom(p);
        return;
    }
    /* offset: where the stream goes on, like every event's (a resume point). */
    len =
        snprintf(line, sizeof(line),
                 "{\"type\":\"lost\",\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64 "}\n", off + n, n);
    if (resp_ndjson_append(p, line, (size_t)len, 0)) {
        oom(p);
        return;
    }
    resp_stall_arm(p, false);
    resp_want_write(p);
}

static void stream_done(struct pss *p, const struct sbx_err *err, json_t *body)
{
    struct watch_req *w = p->watch;

    if (!w->started) {
        json_decref(body);
        if (err)
            answer_err(p, err);
        else
            answer_code(p, 500, "internal",
                        "the watch ended before it started (a guest without the --watch builtin?)");
        return;
    }
    req_phase(p, HP_ANSWER);
    if (err) {
        json_decref(body);
        resp_ndjson_end(p, sbx_err_http_status(err->code), api_error_of(err));
    } else {
        /* The process's exit record, as the watch's last line. */
        if (!body)
            body = json_object();
        json_object_set_new(body, "type", json_string("end"));
        json_object_set_new(body, "offset", json_integer((json_int_t)w->ev.next));
        resp_ndjson_end(p, 200, body);
    }
    resp_want_write(p);
}

static void wsink_done(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;
    struct watch_req *w = p->watch;
    unsigned running;
    struct sbx_err e2;

    if (!http_phase_op_live(p->phase) || !w) {
        json_decref(body);
        return;
    }
    if (w->step == WS_STREAM) {
        stream_done(p, err, body);
        return;
    }
    if (err) {
        json_decref(body);
        if ((w->step == WS_CHECK || w->step == WS_SIGNAL) && err->code == SBX_E_PROCESS_NOT_FOUND) {
            if (w->step == WS_SIGNAL) /* it ended meanwhile */
                answer(p, 200, json_pack("{s:I,s:b}", "id", (json_int_t)p->pid, "running", 0));
            else
                answer_code(p, 404, "watch_not_found", "sandbox %s has no watch %" PRIu32, p->sbx,
                            p->pid);
            return;
        }
        answer_err(p, err);
        return;
    }
    switch (w->step) {
    case WS_COUNT:
        running = watch_running(body);
        json_decref(body);
        if (running >= p->srv->cfg->watch_max_per_sbx) {
            answer_code(p, 429, "too_many_watches", "sandbox %s runs %u watches already", p->sbx,
                        running);
            return;
        }
        start_exec(p);
        return;
    case WS_EXEC:
        p->pid = (uint32_t)json_integer_value(json_object_get(body, "pid"));
        json_decref(body);
        p->watch_id = p->pid;
        follow(p, 0);
        return;
    case WS_CHECK:
        if (!watch_proc_is(body)) {
            json_decref(body);
            answer_code(p, 404, "watch_not_found", "process %" PRIu32 " of %s is not a watch",
                        p->pid, p->sbx);
            return;
        }
        if (!w->del) {
            json_decref(body);
            p->watch_id = p->pid;
            follow(p, w->from);
            return;
        }
        if (!json_is_true(json_object_get(body, "running"))) {
            json_decref(body);
            answer(p, 200, json_pack("{s:I,s:b}", "id", (json_int_t)p->pid, "running", 0));
            return;
        }
        json_decref(body);
        w->step = WS_SIGNAL;
        {
            struct sbx_proc_ctl c = {.sig = SIGTERM};
            int rc = sbx_proc_ctl(p->srv->t, p->sbx, p->pid, &c, &wsink, p, &p->op, &e2);
            next_op(p, rc, &e2);
        }
        return;
    case WS_SIGNAL:
        json_decref(body);
        answer(p, 200, json_pack("{s:I,s:b}", "id", (json_int_t)p->pid, "running", 0));
        return;
    case WS_STREAM:
        break;
    }
    json_decref(body);
}

static void wsink_head(void *user, uint64_t size)
{
    (void)user;
    (void)size;
}

static void wsink_writable(void *user)
{
    (void)user;
}

static const struct sbx_sink wsink = {
    .done = wsink_done,
    .head = wsink_head,
    .data = wsink_data,
    .writable = wsink_writable,
    .lost = wsink_lost,
};

/* ------------------------------------------------------------ the routes */

void watch_start(struct pss *p, json_t *args)
{
    struct watch_req *w = req_new(p);
    struct sbx_err err;
    int rc;

    if (!w || !(w->path = strdup(json_string_value(json_object_get(args, "path"))))) {
        answer_code(p, 500, "internal", "out of memory");
        return;
    }
    w->recursive = json_is_true(json_object_get(args, "recursive"));
    w->fresh = true;
    w->step = WS_COUNT;
    rc = sbx_proc_list(p->srv->t, p->sbx, 0, &wsink, p, &p->op, &err);
    next_op(p, rc, &err);
}

void watch_resume(struct pss *p, json_t *args)
{
    struct watch_req *w = req_new(p);
    struct sbx_err err;
    int rc;

    if (!w) {
        answer_code(p, 500, "internal", "out of memory");
        return;
    }
    w->from = (uint64_t)json_integer_value(json_object_get(args, "offset"));
    w->step = WS_CHECK;
    rc = sbx_proc_list(p->srv->t, p->sbx, p->pid, &wsink, p, &p->op, &err);
    next_op(p, rc, &err);
}

void watch_delete(struct pss *p, json_t *args)
{
    struct watch_req *w = req_new(p);
    struct sbx_err err;
    int rc;

    (void)args;
    if (!w) {
        answer_code(p, 500, "internal", "out of memory");
        return;
    }
    w->del = true;
    w->step = WS_CHECK;
    rc = sbx_proc_list(p->srv->t, p->sbx, p->pid, &wsink, p, &p->op, &err);
    next_op(p, rc, &err);
}
