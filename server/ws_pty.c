/*
 * ws_pty.c - the PTY WebSocket (ws_pty.h): upgrade checks, the socket's
 * reader of the process's output, its queue of input/resize/signal actions,
 * and flow control by client ACKs.
 *
 * Flow control: output bytes the guest sent for this socket are credited
 * back (sbx_op_consumed) only once they were written to the client and the
 * client ACKed them; an ACK of more than was written closes the socket. So
 * warrend holds at most one guest window per socket whatever the client
 * does; a client that never ACKs stalls only its own reader, which falls
 * behind in the guest's ring and is told what it lost. Lost notices cost the
 * guest no window, so the queue is capped too (pty_socket_send_queue_bytes,
 * its frames' memory): past it the socket closes with 1011.
 *
 * Input: INPUT, RESIZE and SIGNAL become sbx_proc_ctl calls, one in flight
 * per socket, the rest queued up to pty_socket_input_queue; at that point
 * reading the socket pauses until the guest caught up, so the queue (and
 * memory) stays bounded.
 *
 * Closing: a socket is closed from SERVER_WRITEABLE once its last frame
 * (exit or error) is out; a malformed client frame closes it at once with
 * 1008/1009 and a reason.
 */
#include "http_int.h"
#include "sbx_json.h"
#include "sbx_snap.h"
#include "ws_pty.h"
#include "ws_pty_frame.h"
#include "ws_rx.h"

#define WPTY_DEF_COLS 80
#define WPTY_DEF_ROWS 24
#define WPTY_CMD_MAX  4096

/* Room of a new OUTPUT frame: output that arrives while the client is behind is
 * appended to the last queued frame up to this, so a guest's small frames cost the
 * queue their bytes, not a frame each. */
#define WPTY_CHUNK (16 * 1024)

/* One frame for the client, with LWS_PRE headroom. */
struct wmsg {
    struct wmsg *next;
    size_t len;     /* frame bytes (after LWS_PRE) */
    size_t cap;     /* frame bytes it has room for */
    size_t payload; /* OUTPUT bytes it carries (0: a control frame) */
    uint64_t end;   /* OUTPUT: the offset after its last byte */
    unsigned char mem[];
};

/* One queued action on the process. */
struct wctl {
    struct wctl *next;
    struct sbx_proc_ctl c;
    unsigned char data[]; /* c.data points here */
};

/* One PTY socket (lws per_session_data). */
struct wpty {
    struct wpty *next, *prev; /* the open sockets (registry, for the limits) */
    struct http_server *srv;
    struct lws *wsi;
    bool live; /* established and registered */
    char sbx[API_ID_MAX + 1];
    uint32_t pid; /* 0 until a new PTY has started */
    bool want_new;
    unsigned cols, rows;
    char *cmd, *cwd;
    uint64_t offset;

    sbx_op_t start_op, out_op, ctl_op;
    bool start_live, out_live, ctl_live;

    struct ws_rx rx; /* a client frame being reassembled */
    bool rx_paused;

    struct wctl *cq, *cq_tail;
    unsigned cq_n;

    struct wmsg *tq, *tq_tail;
    size_t tq_bytes;  /* what tq's frames take: at most pty_socket_send_queue_bytes */
    uint64_t unacked; /* output bytes written to the client and not yet ACKed */
    bool out_dropped; /* tq overflowed: output is no longer taken */

    bool closing;   /* close once tq is empty */
    int close_code; /* ... with this code and reason (0: 1000 "done") */
    const char *close_why;
};

static struct wpty *registry;

/* -------------------------------------------------------- route, query */

/* /v1/sandboxes/{id}/pty[/{pid}]: 0 and sbx, *pid (0 for a new PTY), or -1. */
static int parse_path(const char *uri, char *sbx, uint32_t *pid)
{
    static const char pre[] = "/v1/sandboxes/";
    char tmp[64 + API_ID_MAX];
    struct api_route r;
    const char *id, *slash, *rest;
    size_t n;

    if (strncmp(uri, pre, sizeof(pre) - 1))
        return -1;
    id = uri + sizeof(pre) - 1;
    if (!(slash = strchr(id, '/')) || (n = (size_t)(slash - id)) == 0 || n > API_ID_MAX)
        return -1;
    /* The id is checked as the REST router checks it. */
    snprintf(tmp, sizeof(tmp), "%s%.*s", pre, (int)n, id);
    if (api_route_match(tmp, &r) || r.id != API_R_SANDBOX)
        return -1;
    rest = slash;
    if (!strcmp(rest, "/pty")) {
        *pid = 0;
    } else if (!strncmp(rest, "/pty/", 5) && rest[5] >= '1' && rest[5] <= '9') {
        unsigned long long v = 0;
        for (const char *c = rest + 5; *c; c++) {
            if (*c < '0' || *c > '9' || (v = v * 10 + (unsigned)(*c - '0')) > API_PID_MAX)
                return -1;
        }
        *pid = (uint32_t)v;
    } else {
        return -1;
    }
    memcpy(sbx, r.sbx, sizeof(r.sbx));
    return 0;
}

static int get_uri(struct lws *wsi, char *buf, int cap)
{
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI);

    if (n <= 0 || n >= cap || lws_hdr_copy(wsi, buf, cap, WSI_TOKEN_GET_URI) < 0)
        return -1;
    return 0;
}

bool ws_pty_route(struct lws *wsi)
{
    char uri[512], sbx[API_ID_MAX + 1];
    uint32_t pid;

    return get_uri(wsi, uri, sizeof(uri)) == 0 && parse_path(uri, sbx, &pid) == 0;
}

struct wq {
    unsigned cols, rows;
    uint64_t offset;
    char cmd[WPTY_CMD_MAX], cwd[WPTY_CMD_MAX];
    bool has_cmd, has_cwd;
};

static int parse_uint(const char *s, unsigned long long max, unsigned long long *v)
{
    char *end;

    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return errno || *end || *v > max ? -1 : 0;
}

/* The query: 0, or -1 with *e. access_token is the token check's business. */
static int parse_query(struct lws *wsi, bool is_new, struct wq *q, struct api_err *e)
{
    char frag[WPTY_CMD_MAX + 16];
    unsigned long long v;

    memset(q, 0, sizeof(*q));
    q->cols = WPTY_DEF_COLS;
    q->rows = WPTY_DEF_ROWS;
    for (int i = 0; i < QUERY_FRAGS_MAX; i++) {
        int len = lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i);
        const char *val;

        if (len < 0 || (len == 0 && lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag),
                                                          WSI_TOKEN_HTTP_URI_ARGS, i) < 0))
            return 0;
        if (len == 0)
            continue;
        if (len >= (int)sizeof(frag) ||
            lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i) < 0)
            goto bad_len;
        if (http_query_frag_spurious(wsi, i, frag))
            continue;
        val = strchr(frag, '=');
        val = val ? val + 1 : "";
        if (is_new && (!strncmp(frag, "cols=", 5) || !strncmp(frag, "rows=", 5))) {
            if (parse_uint(val, WSP_SIZE_MAX, &v) || v == 0) {
                *e = (struct api_err){.status = 400, .code = "invalid_argument"};
                snprintf(e->msg, sizeof(e->msg), "%.4s must be 1..%d", frag, WSP_SIZE_MAX);
                return -1;
            }
            *(frag[0] == 'c' ? &q->cols : &q->rows) = (unsigned)v;
        } else if (is_new && !strncmp(frag, "cmd=", 4)) {
            snprintf(q->cmd, sizeof(q->cmd), "%s", val);
            q->has_cmd = *val != '\0';
        } else if (is_new && !strncmp(frag, "cwd=", 4)) {
            snprintf(q->cwd, sizeof(q->cwd), "%s", val);
            q->has_cwd = *val != '\0';
        } else if (!is_new && !strncmp(frag, "offset=", 7)) {
            if (parse_uint(val, UINT64_MAX, &v)) {
                *e = (struct api_err){.status = 400, .code = "invalid_argument"};
                snprintf(e->msg, sizeof(e->msg), "offset must be a non-negative integer");
                return -1;
            }
            q->offset = v;
        } else if (strncmp(frag, "access_token=", 13)) {
            *e = (struct api_err){.status = 400, .code = "invalid_argument"};
            snprintf(e->msg, sizeof(e->msg), "unknown query parameter '%.*s'",
                     (int)strcspn(frag, "="), frag);
            return -1;
        }
    }
bad_len:
    *e = (struct api_err){.status = 400, .code = "bad_request"};
    snprintf(e->msg, sizeof(e->msg), "query string too long");
    return -1;
}

/* ------------------------------------------------------------- access */

static void count_socks(const struct http_server *srv, const char *sbx, uint32_t pid,
                        unsigned *per_sbx, unsigned *per_pid)
{
    *per_sbx = *per_pid = 0;
    for (struct wpty *w = registry; w; w = w->next) {
        if (w->srv != srv || strcmp(w->sbx, sbx))
            continue;
        (*per_sbx)++;
        if (pid && w->pid == pid)
            (*per_pid)++;
    }
}

/* Every check made before the upgrade (and again when lws binds the socket): 0, or -1
 * with *e. */
static int check_upgrade(struct http_server *srv, struct lws *wsi, char *sbx, uint32_t *pid,
                         struct wq *q, struct api_err *e)
{
    char uri[512], proto[256];
    unsigned n_sbx, n_pid;

    if (get_uri(wsi, uri, sizeof(uri)) || parse_path(uri, sbx, pid)) {
        *e = (struct api_err){.status = 404, .code = "not_found"};
        snprintf(e->msg, sizeof(e->msg), "no such route");
        return -1;
    }
    if (http_authorize(NULL, wsi, sbx, "pty", e))
        return -1;
    /* A new PTY runs a program (a shell, or ?cmd=): that is exec, which a token must
     * name; "pty" alone attaches to a PTY that exists. */
    if (*pid == 0 && http_authorize(NULL, wsi, sbx, "exec", e))
        return -1;
    if (!http_origin_allowed(srv, wsi)) {
        *e = (struct api_err){.status = 403, .code = "origin_not_allowed"};
        snprintf(e->msg, sizeof(e->msg), "this Origin may not open sockets here (allowed_origins)");
        return -1;
    }
    /* The protocol must name this route's socket: a path/protocol mismatch is refused
     * here rather than served by the wrong callback. */
    if (lws_hdr_total_length(wsi, WSI_TOKEN_PROTOCOL) <= 0 ||
        lws_hdr_copy(wsi, proto, sizeof(proto), WSI_TOKEN_PROTOCOL) < 0 ||
        !strstr(proto, ws_pty_protocol.name)) {
        *e = (struct api_err){.status = 400, .code = "bad_request"};
        snprintf(e->msg, sizeof(e->msg), "this route needs Sec-WebSocket-Protocol: %s",
                 ws_pty_protocol.name);
        return -1;
    }
    if (parse_query(wsi, *pid == 0, q, e))
        return -1;
    if (http_ws_sandbox_open(srv, sbx, e))
        return -1;
    count_socks(srv, sbx, *pid, &n_sbx, &n_pid);
    if (n_sbx >= srv->cfg->pty_socks_per_sbx) {
        *e = (struct api_err){.status = 429, .code = "too_many_sockets"};
        snprintf(e->msg, sizeof(e->msg),
                 "sandbox %s has %u PTY sockets open (pty_sockets_per_sandbox); close some", sbx,
                 n_sbx);
        return -1;
    }
    if (n_pid >= srv->cfg->pty_viewers) {
        *e = (struct api_err){.status = 429, .code = "too_many_viewers"};
        snprintf(e->msg, sizeof(e->msg),
                 "process %" PRIu32 " has %u viewers (pty_viewers_per_process); close some", *pid,
                 n_pid);
        return -1;
    }
    return 0;
}

int ws_pty_confirm(struct http_server *srv, struct lws *wsi)
{
    char sbx[API_ID_MAX + 1];
    struct api_err e;
    uint32_t pid;
    struct wq *q = malloc(sizeof(*q));
    int rc;

    if (!q)
        return -1;
    rc = check_upgrade(srv, wsi, sbx, &pid, q, &e);
    free(q);
    if (rc)
        return http_ws_refuse(wsi, &e);
    return 0;
}

/* ------------------------------------------------------------- output */

static void want_write(struct wpty *w)
{
    lws_callback_on_writable(w->wsi);
}

static size_t msg_size(size_t cap)
{
    return sizeof(struct wmsg) + LWS_PRE + cap;
}

static void msg_free(struct wpty *w, struct wmsg *m)
{
    w->tq_bytes -= msg_size(m->cap);
    free(m);
}

/* A frame of len bytes with room for cap, counted in tq_bytes; NULL when out of memory
 * or when the queue would grow past pty_socket_send_queue_bytes. */
static struct wmsg *msg_new(struct wpty *w, size_t len, size_t cap)
{
    struct wmsg *m;

    if (w->tq_bytes + msg_size(cap) > w->srv->cfg->pty_send_queue)
        return NULL;
    if (!(m = malloc(msg_size(cap))))
        return NULL;
    memset(m, 0, sizeof(*m));
    m->len = len;
    m->cap = cap;
    w->tq_bytes += msg_size(cap);
    return m;
}

static void msg_push(struct wpty *w, struct wmsg *m)
{
    if (w->tq_tail)
        w->tq_tail->next = m;
    else
        w->tq = m;
    w->tq_tail = m;
    want_write(w);
}

/* Nothing more can be queued for the client: drop what waits and close with code and
 * why once lws is ready. The guest's credit for dropped output is not returned: its
 * reader stalls until the socket closes and cancels it. */
static void overflow(struct wpty *w, int code, const char *why)
{
    LOG(LOG_WARN, "%s: PTY socket closed: %s", w->sbx, why);
    while (w->tq) {
        struct wmsg *m = w->tq;
        w->tq = m->next;
        msg_free(w, m);
    }
    w->tq_tail = NULL;
    w->out_dropped = true;
    w->closing = true;
    w->close_code = code;
    w->close_why = why;
    want_write(w);
}

/* A CONTROL frame with j (taken). */
static void send_control(struct wpty *w, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    size_t n = s ? strlen(s) : 0;
    struct wmsg *m;

    json_decref(j);
    if (w->out_dropped) {
        free(s);
        return;
    }
    if (!s || !(m = msg_new(w, 1 + n, 1 + n))) {
        free(s);
        overflow(w, 1011, "output queue over pty_socket_send_queue_bytes (or out of memory)");
        return;
    }
    m->mem[LWS_PRE] = WSP_CONTROL;
    memcpy(m->mem + LWS_PRE + 1, s, n);
    free(s);
    msg_push(w, m);
}

/* The last frame: the socket closes (normally) once it is out. */
static void finish(struct wpty *w, json_t *last)
{
    if (w->closing) {
        json_decref(last);
        return;
    }
    send_control(w, last);
    w->closing = true;
}

static void send_error(struct wpty *w, const char *code, const char *msg)
{
    finish(w, json_pack("{s:s,s:s,s:s}", "type", "error", "code", code, "message", msg));
}

/* Output for the client: appended to the last queued OUTPUT frame while it has room and
 * the bytes follow on, else in new frames. Its credit goes back to the guest only once
 * the client ACKs it, and the client can ACK only what was written to it (on_ack), so
 * the queue holds at most one guest window whatever the client does. */
static void on_out_data(void *user, int fd, uint64_t off, const void *p, size_t n)
{
    struct wpty *w = user;
    const unsigned char *b = p;

    (void)fd;
    if (w->out_dropped)
        return;
    while (n) {
        struct wmsg *m = w->tq_tail;
        size_t take;

        if (!m || !m->payload || m->end != off || m->len == m->cap) {
            size_t room = n > WPTY_CHUNK ? n : WPTY_CHUNK;
            if (!(m = msg_new(w, WSP_OUTPUT_HEAD, WSP_OUTPUT_HEAD + room))) {
                overflow(w, 1011,
                         "output queue over pty_socket_send_queue_bytes (or out of memory)");
                return;
            }
            wsp_output_head(m->mem + LWS_PRE, off);
            m->end = off;
            msg_push(w, m);
        }
        take = m->cap - m->len < n ? m->cap - m->len : n;
        memcpy(m->mem + LWS_PRE + m->len, b, take);
        m->len += take;
        m->payload += take;
        m->end += take;
        off += take;
        b += take;
        n -= take;
    }
}

static void on_out_lost(void *user, uint64_t off, uint64_t n)
{
    struct wpty *w = user;

    send_control(w, json_pack("{s:s,s:I,s:I}", "type", "lost", "offset", (json_int_t)off, "bytes",
                              (json_int_t)n));
}

static void on_out_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct wpty *w = user;
    json_t *body;

    w->out_live = false;
    if (err) {
        /* The sandbox ended or died, or the channel went: the process is out of reach. */
        finish(w, json_pack("{s:s,s:n,s:n,s:s,s:s}", "type", "exit", "exit_code", "signal",
                            "reason", sbx_err_name(err->code), "message", err->msg));
        return;
    }
    body = sbx_json_result(res);
    if (!body || !json_is_object(body)) {
        json_decref(body);
        body = json_pack("{s:s,s:n,s:n}", "type", "exit", "exit_code", "signal");
    }
    json_object_del(body, "timed_out");
    finish(w, body);
}

static const struct sbx_sink out_sink = {
    .done = on_out_done,
    .data = on_out_data,
    .lost = on_out_lost,
};

static void start_output(struct wpty *w)
{
    struct sbx_err err;

    send_control(w, json_pack("{s:s,s:I,s:I,s:I,s:I}", "type", "hello", "pid", (json_int_t)w->pid,
                              "cols", (json_int_t)w->cols, "rows", (json_int_t)w->rows, "offset",
                              (json_int_t)w->offset));
    if (sbx_proc_output(w->srv->t, w->sbx, w->pid, w->offset, true, &out_sink, w, &w->out_op,
                        &err)) {
        send_error(w, sbx_err_name(err.code), err.msg);
        return;
    }
    w->out_live = true;
}

static void ctl_pump(struct wpty *w);

/* The new PTY started ({"pid":N}), or the attached process's record. */
static void on_start_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct wpty *w = user;

    w->start_live = false;
    if (err) {
        send_error(w, sbx_err_name(err->code), err->msg);
        return;
    }
    if (w->want_new) {
        if (res && res->kind == SBX_RES_STARTED)
            w->pid = res->u.started.pid;
    } else if (res && res->kind == SBX_RES_PROC && res->u.procs.v->pty) {
        w->cols = res->u.procs.v->cols;
        w->rows = res->u.procs.v->rows;
    }
    if (!w->pid) {
        send_error(w, "internal", "the guest named no process");
        return;
    }
    start_output(w);
    /* Input typed before the process existed waited in the queue: send it now, or it
     * would wait for the next frame from the client (a first key sat unechoed). */
    if (!w->closing)
        ctl_pump(w);
}

static const struct sbx_sink start_sink = {.done = on_start_done};

static void start(struct wpty *w);

/* The paused sandbox this socket opened on is back (or could not come back). */
static void on_resumed(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct wpty *w = user;

    (void)res;
    w->start_live = false;
    if (err)
        send_error(w, sbx_err_name(err->code), err->msg);
    else
        start(w);
}

static const struct sbx_sink resume_sink = {.done = on_resumed};

static void start(struct wpty *w)
{
    struct sbx_err err;
    json_t *out = NULL;
    int rc;

    if (sbx_coming_back(w->srv->t, w->sbx)) {
        /* Paused or starting: an attach brings it back, and the PTY starts then. */
        rc = sbx_resume(w->srv->t, w->sbx, &resume_sink, w, &w->start_op, &out, &err);
        if (rc) {
            send_error(w, sbx_err_name(err.code), err.msg);
            return;
        }
        if (!out) {
            w->start_live = true;
            return;
        }
        json_decref(out);
    }
    if (!w->want_new) {
        rc = sbx_proc_list(w->srv->t, w->sbx, w->pid, &start_sink, w, &w->start_op, &err);
    } else {
        struct sbx_exec_req req = {
            .background = -1, .pty = true, .cols = w->cols, .rows = w->rows, .cwd = w->cwd};
        if (w->cmd) {
            req.cmd.p = w->cmd;
            req.cmd.n = strlen(w->cmd);
        }
        rc = sbx_exec(w->srv->t, w->sbx, &req, false, &start_sink, w, &w->start_op, &err);
    }
    if (rc) {
        send_error(w, sbx_err_name(err.code), err.msg);
        return;
    }
    w->start_live = true;
}

/* -------------------------------------------------------------- input */

static void on_ctl_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct wpty *w = user;

    (void)res;
    w->ctl_live = false;
    if (err)
        /* Input to a process that exited, or stdin full: the terminal shows no echo, as
         * a local one would; the socket goes on. */
        LOG(LOG_DEBUG, "%s: PTY %" PRIu32 ": %s", w->sbx, w->pid, err->msg);
    ctl_pump(w);
}

static const struct sbx_sink ctl_sink = {.done = on_ctl_done};

/* Start the next queued action if none is in flight. */
static void ctl_pump(struct wpty *w)
{
    struct sbx_err err;

    while (!w->ctl_live && w->cq && w->pid) {
        struct wctl *c = w->cq;
        int rc;

        if (!(w->cq = c->next))
            w->cq_tail = NULL;
        w->cq_n--;
        rc = sbx_proc_ctl(w->srv->t, w->sbx, w->pid, &c->c, &ctl_sink, w, &w->ctl_op, &err);
        free(c);
        if (rc == 0)
            w->ctl_live = true;
        else
            LOG(LOG_DEBUG, "%s: PTY %" PRIu32 ": %s", w->sbx, w->pid, err.msg);
    }
    if (w->rx_paused && w->cq_n < w->srv->cfg->pty_ctl_queue) {
        w->rx_paused = false;
        lws_rx_flow_control(w->wsi, 1);
    }
}

/* Queue one action: 0, or -1 (out of memory, or the client ignored the pause). */
static int ctl_push(struct wpty *w, const struct wsp_frame *f)
{
    struct wctl *c;

    if (w->cq_n >= 2 * w->srv->cfg->pty_ctl_queue)
        return -1;
    if (!(c = calloc(1, sizeof(*c) + f->len)))
        return -1;
    switch (f->op) {
    case WSP_INPUT:
        memcpy(c->data, f->data, f->len);
        c->c.data = c->data;
        c->c.len = f->len;
        break;
    case WSP_RESIZE:
        c->c.cols = f->cols;
        c->c.rows = f->rows;
        break;
    case WSP_SIGNAL:
        c->c.sig = f->sig;
        break;
    }
    if (w->cq_tail)
        w->cq_tail->next = c;
    else
        w->cq = c;
    w->cq_tail = c;
    w->cq_n++;
    if (w->cq_n >= w->srv->cfg->pty_ctl_queue && !w->rx_paused) {
        w->rx_paused = true;
        lws_rx_flow_control(w->wsi, 0);
    }
    ctl_pump(w);
    return 0;
}

/* A malformed frame: close this socket with code and reason (from inside a callback). */
static int reject(struct wpty *w, int code, const char *why)
{
    LOG(LOG_DEBUG, "%s: PTY socket closed: %d %s", w->sbx, code, why);
    lws_close_reason(w->wsi, (enum lws_close_status)code, (unsigned char *)why, strlen(why));
    return -1;
}

/* The client has shown n more output bytes: their credit goes back to the guest. It
 * can only have shown bytes written to it; claiming more would let it keep the guest
 * sending into a queue it never reads, so that ends the socket. */
static int on_ack(struct wpty *w, uint32_t n)
{
    if (n > w->unacked)
        return reject(w, WSP_CLOSE_POLICY, "ACK of more output bytes than were sent");
    w->unacked -= n;
    if (n && w->out_live)
        sbx_op_consumed(w->srv->t, w->out_op, n);
    return 0;
}

static int on_receive(struct wpty *w, const void *in, size_t len)
{
    const unsigned char *msg;
    struct wsp_frame f;
    const char *why;
    size_t n;
    int code, rc;

    if (!lws_frame_is_binary(w->wsi))
        return reject(w, WSP_CLOSE_POLICY, "text frames are not part of warren.pty.v1");
    rc = ws_rx_add(&w->rx, in, len, lws_is_first_fragment(w->wsi), lws_is_final_fragment(w->wsi),
                   lws_remaining_packet_payload(w->wsi), w->srv->cfg->pty_max_frame, &msg, &n);
    if (rc == -EMSGSIZE)
        return reject(w, WSP_CLOSE_BIG, "frame larger than pty_socket_max_frame_bytes");
    if (rc < 0)
        return reject(w, 1011, "out of memory");
    if (rc == WS_RX_MORE)
        return 0;
    code = wsp_decode(msg, n, &f, &why);
    if (code)
        return reject(w, code, why);
    if (f.op == WSP_ACK)
        return on_ack(w, f.ack);
    if (f.op == WSP_INPUT && f.len == 0)
        return 0;
    if (ctl_push(w, &f))
        return reject(w, WSP_CLOSE_POLICY, "input queue overflow");
    /* Shrink a buffer a big paste grew. */
    if (w->rx.cap > 65536)
        ws_rx_free(&w->rx);
    return 0;
}

static int on_writeable(struct wpty *w)
{
    struct wmsg *m = w->tq;

    if (m) {
        int rc = 0;

        if (!(w->tq = m->next))
            w->tq_tail = NULL;
        if (lws_write(w->wsi, m->mem + LWS_PRE, m->len, LWS_WRITE_BINARY) < (int)m->len)
            rc = -1;
        else
            w->unacked += m->payload; /* the client may ACK these now */
        msg_free(w, m);
        if (rc == 0 && (w->tq || w->closing))
            want_write(w);
        return rc;
    }
    if (w->closing) {
        const char *why = w->close_code ? w->close_why : "done";
        lws_close_reason(
            w->wsi, w->close_code ? (enum lws_close_status)w->close_code : LWS_CLOSE_STATUS_NORMAL,
            (unsigned char *)why, strlen(why));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------ lifecycle */

static int on_filter(struct wpty *w, struct http_server *srv, struct lws *wsi)
{
    struct api_err e;
    struct wq *q = malloc(sizeof(*q));
    int rc = -1;

    if (!q)
        return -1;
    if (check_upgrade(srv, wsi, w->sbx, &w->pid, q, &e)) {
        LOG(LOG_DEBUG, "PTY socket refused at bind: %s", e.msg);
        goto out;
    }
    w->want_new = w->pid == 0;
    w->cols = q->cols;
    w->rows = q->rows;
    w->offset = w->want_new ? 0 : q->offset;
    if ((q->has_cmd && !(w->cmd = strdup(q->cmd))) || (q->has_cwd && !(w->cwd = strdup(q->cwd)))) {
        free(w->cmd);
        w->cmd = NULL;
        goto out;
    }
    w->srv = srv;
    w->wsi = wsi;
    rc = 0;
out:
    free(q);
    return rc;
}

static void on_established(struct wpty *w)
{
    http_conn_upgraded(w->wsi);
    w->live = true;
    w->next = registry;
    if (registry)
        registry->prev = w;
    registry = w;
    start(w);
}

static void on_closed(struct wpty *w)
{
    if (!w->srv)
        return;
    if (w->live) {
        if (w->prev)
            w->prev->next = w->next;
        else
            registry = w->next;
        if (w->next)
            w->next->prev = w->prev;
    }
    if (w->start_live)
        sbx_op_cancel(w->srv->t, w->start_op);
    if (w->out_live)
        sbx_op_cancel(w->srv->t, w->out_op);
    if (w->ctl_live)
        sbx_op_cancel(w->srv->t, w->ctl_op);
    while (w->cq) {
        struct wctl *c = w->cq;
        w->cq = c->next;
        free(c);
    }
    while (w->tq) {
        struct wmsg *m = w->tq;
        w->tq = m->next;
        msg_free(w, m);
    }
    ws_rx_free(&w->rx);
    free(w->cmd);
    free(w->cwd);
    memset(w, 0, sizeof(*w));
}

static int ws_pty_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                     size_t len)
{
    struct wpty *w = user;
    struct http_server *srv = wsi ? lws_context_user(lws_get_context(wsi)) : NULL;

    if (!srv)
        return 0;
    switch (reason) {
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        return w ? on_filter(w, srv, wsi) : -1;
    case LWS_CALLBACK_ADD_HEADERS:
        return http_ws_add_headers(wsi, in);
    case LWS_CALLBACK_ESTABLISHED:
        if (!w || !w->srv)
            return -1;
        on_established(w);
        return 0;
    case LWS_CALLBACK_RECEIVE:
        return w && w->live ? on_receive(w, in, len) : -1;
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return w && w->live ? on_writeable(w) : 0;
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        return http_ws_peer_close(wsi, in, len);
    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_WS_SERVER_DROP_PROTOCOL:
        if (w)
            on_closed(w);
        return 0;
    default:
        return 0;
    }
}

const struct lws_protocols ws_pty_protocol = {
    .name = "warren.pty.v1",
    .callback = ws_pty_cb,
    .per_session_data_size = sizeof(struct wpty),
    .rx_buffer_size = 0,
};
