/*
 * ws_session.c - the agent socket "warren.session.v1" (ws_session.h).
 *
 * Admission runs before the upgrade (ws_session_confirm, from the HTTP protocol's
 * CONFIRM_UPGRADE): path and Sec-WebSocket-Protocol must agree, the caller must be
 * authorized for the sandbox, the sandbox must exist and have room for one more
 * socket; a refusal is an ordinary JSON error answer, never a WebSocket close.
 *
 * Requests: each message is decoded whole (session_frame.c); a malformed one closes
 * this socket only, with 1008 (or 1009 when too big) and a reason. Each request is a
 * struct sreq, the user pointer of its one sbx op; its answers are queued as encoded
 * messages and go out from WRITEABLE, one lws_write each.
 *
 * Output pacing: a streamed byte is acknowledged to the table (sbx_op_consumed, which
 * returns credit to the guest) only once its message was handed to lws_write, and
 * while more than session_send_queue_bytes are queued the acknowledgements are held
 * back until the queue is down to half. The guest sends at most one window
 * (PROTO_WINDOW) unacknowledged per stream, so a socket holds at most the queue limit
 * plus one window per streaming request: a slow agent slows its foreground execs, and
 * its attached readers fall behind into the guest's ring (and get "lost" frames).
 *
 * Ping/pong: lws answers a PING itself, and sends a pending PONG before it offers
 * WRITEABLE to us, so a backlog of ours never delays it beyond the bytes already in
 * the kernel's socket buffer; nothing here times a busy socket out.
 *
 * Lifetimes: sink->done moves a request to the socket's graveyard instead of freeing
 * it, since sbx_op_write/consumed may call done while a caller still holds the
 * request; the graveyard is emptied at the start of the socket's next lws callback
 * and when it closes.
 */
#include <ctype.h>
#include <stdarg.h>

#include "http_int.h"
#include "sbx_json.h"
#include "sbx_snap.h"
#include "session_frame.h"
#include "watch_ev.h"
#include "ws_rx.h"
#include "ws_session.h"

#define SESS_PROTO  "warren.session.v1"
#define SESS_PREFIX "/v1/sandboxes/"

struct sout {
    struct sout *next;
    sbx_op_t op;   /* credit for this op once written */
    size_t credit; /* stream bytes it carries */
    struct sf_buf b;
};

struct held {
    sbx_op_t op;
    size_t n;
};

struct sess;

struct sreq {
    struct sreq *next;
    struct sess *s;
    uint32_t id;
    enum sf_op kind;
    sbx_op_t op;
    bool live;
    bool bg;       /* exec: background or PTY */
    uint64_t roff; /* read_file: offset of the next data */
    uint64_t size; /* read_file: size announced by the guest */
    /* write_file: the bytes still to feed */
    unsigned char *wdata;
    size_t wlen, woff;
    bool in_write, finished;
    /* run_code, run_read, contexts: the exchange with the kernel bridge in place of op */
    struct klink *kl;
    unsigned lines;     /* lines sent */
    json_t *answer;     /* contexts: the bridge's answer, until done */
    const char *action; /* contexts: its action (a static string) */
    /* watch: the ops it walks through (as watch.c's REST requests do), and its lines */
    enum { SW_COUNT, SW_EXEC, SW_CHECK, SW_STREAM } wstep;
    bool wstarted;  /* its first frame ("watch") went out */
    uint32_t wpid;  /* the watch's id: its process */
    uint64_t wfrom; /* offset its stream starts at */
    char *wpath;
    bool wrec;
    struct watch_ev wev;
};

struct sess {
    struct lws *wsi;
    struct http_server *srv;
    bool linked;   /* counted in the vhost's sockets per sandbox */
    bool may_exec; /* its key or token covers the exec op (the "exec" scope) */
    char sbx[API_ID_MAX + 1];
    struct sreq *reqs, *grave;
    unsigned nreqs;
    struct sout *qh, *qt;
    size_t qbytes;
    bool holding; /* credit is held back until the queue drains to half */
    struct held *held;
    size_t nheld, heldcap;
    struct ws_rx rx; /* a message arriving in pieces */
    /* The sandbox was paused: its resume is in flight, reading is paused, and the
     * messages that came meanwhile wait, in order, as they arrived. */
    bool resuming;
    sbx_op_t resume_op;
    struct waiting *wq, *wq_tail;
    unsigned nwq; /* held messages: at most session_max_requests, as requests in flight */
};

struct waiting {
    struct waiting *next;
    size_t n;
    unsigned char b[];
};

/* Sockets per sandbox: one entry per sandbox that has sockets, not one per socket,
 * so admitting a socket costs O(sandboxes). A walk over every socket (with a strcmp
 * each) took ~40% of the loop while 19,000 sockets were opened (load/wsbench.py). */
struct sbx_socks {
    struct sbx_socks *next;
    unsigned n;
    char sbx[API_ID_MAX + 1];
};

struct vhd {
    struct sbx_socks *counts;
};

/* ------------------------------------------------------------ admission */

/* The sandbox id of ".../v1/sandboxes/{id}/session" into id, or -1. */
static int session_path(const char *uri, char id[API_ID_MAX + 1])
{
    const char *p, *slash;
    size_t n;

    if (strncmp(uri, SESS_PREFIX, strlen(SESS_PREFIX)))
        return -1;
    p = uri + strlen(SESS_PREFIX);
    if (!(slash = strchr(p, '/')) || strcmp(slash, "/session"))
        return -1;
    n = (size_t)(slash - p);
    if (!n || n > API_ID_MAX)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)p[i]) || p[i] == '-' || p[i] == '_'))
            return -1;
    memcpy(id, p, n);
    id[n] = 0;
    return 0;
}

static bool offers_proto(struct lws *wsi)
{
    char v[256], *save = NULL, *t;
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_PROTOCOL);

    if (n <= 0 || n >= (int)sizeof(v) || lws_hdr_copy(wsi, v, sizeof(v), WSI_TOKEN_PROTOCOL) < 0)
        return false;
    for (t = strtok_r(v, ", ", &save); t; t = strtok_r(NULL, ", ", &save))
        if (!strcmp(t, SESS_PROTO))
            return true;
    return false;
}

/* The query may carry an access token and nothing else, as REST judges its routes'
 * queries: 0, or -1 with *e. */
static int check_query(struct lws *wsi, struct api_err *e)
{
    char frag[QUERY_STORE];

    for (int i = 0; i < QUERY_FRAGS_MAX; i++) {
        int len = lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i);

        if (len <= 0)
            return 0;
        if (len >= (int)sizeof(frag) ||
            lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i) < 0) {
            *e = (struct api_err){.status = 400, .code = "bad_request"};
            snprintf(e->msg, sizeof(e->msg), "query string too long");
            return -1;
        }
        if (http_query_frag_spurious(wsi, i, frag))
            continue;
        if (strncmp(frag, HTTP_TOKEN_PARAM, strlen(HTTP_TOKEN_PARAM))) {
            *e = (struct api_err){.status = 400, .code = "invalid_argument"};
            snprintf(e->msg, sizeof(e->msg), "unknown query parameter '%.*s'",
                     (int)strcspn(frag, "="), frag);
            return -1;
        }
    }
    return 0;
}

static struct api_err bad_request(const char *msg)
{
    struct api_err e = {.status = 400, .code = "bad_request"};

    snprintf(e.msg, sizeof(e.msg), "%s", msg);
    return e;
}

static struct sbx_socks **socks_find(struct vhd *v, const char *id)
{
    struct sbx_socks **pp = &v->counts;

    while (*pp && strcmp((*pp)->sbx, id))
        pp = &(*pp)->next;
    return pp;
}

static unsigned sockets_of(struct vhd *v, const char *id)
{
    struct sbx_socks *c = v ? *socks_find(v, id) : NULL;

    return c ? c->n : 0;
}

static struct vhd *vhd_of(struct lws *wsi)
{
    /* lws keeps its own copy of the protocols array: find ours by name. */
    struct lws_vhost *vh = lws_get_vhost(wsi);
    const struct lws_protocols *pr = lws_vhost_name_to_protocol(vh, SESS_PROTO);

    return pr ? lws_protocol_vh_priv_get(vh, pr) : NULL;
}

int ws_session_confirm(struct lws *wsi)
{
    struct http_server *srv = lws_context_user(lws_get_context(wsi));
    char uri[512], id[API_ID_MAX + 1];
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI);
    bool path_ok, proto_ok = offers_proto(wsi);
    struct api_err e;

    path_ok = n > 0 && n < (int)sizeof(uri) &&
              lws_hdr_copy(wsi, uri, sizeof(uri), WSI_TOKEN_GET_URI) > 0 && !session_path(uri, id);
    if (!path_ok && !proto_ok)
        return WS_NOT_MINE;
    if (!path_ok)
        e = bad_request("the " SESS_PROTO " protocol is served at GET /v1/sandboxes/{id}/session "
                        "only");
    else if (!proto_ok)
        e = bad_request("the agent socket needs Sec-WebSocket-Protocol: " SESS_PROTO);
    else if (http_authorize(NULL, wsi, id, "session", &e))
        ;
    else if (!http_origin_allowed(srv, wsi))
        e = (struct api_err){.status = 403,
                             .code = "origin_not_allowed",
                             .msg = "this Origin may not open sockets here (allowed_origins)"};
    else if (check_query(wsi, &e) || http_ws_sandbox_open(srv, id, &e))
        ;
    else if (sockets_of(vhd_of(wsi), id) >= srv->cfg->sess_max_sockets) {
        e = (struct api_err){.status = 429, .code = "too_many_sockets"};
        snprintf(e.msg, sizeof(e.msg),
                 "sandbox %s already has %u agent sockets (session_max_sockets_per_sandbox); "
                 "close one",
                 id, srv->cfg->sess_max_sockets);
    } else
        return 0;
    return http_ws_refuse(wsi, &e);
}

/* ---------------------------------------------------------------- output */

static void want_write(struct sess *s)
{
    lws_callback_on_writable(s->wsi);
}

/* Queue an encoded message (takes b's buffer). credit: stream bytes of op it carries. */
static void queue(struct sess *s, struct sf_buf *b, sbx_op_t op, size_t credit)
{
    struct sout *o = calloc(1, sizeof(*o));

    if (!o) {
        sf_buf_free(b);
        /* The bytes are dropped; the credit is still returned so the stream goes on. */
        if (credit)
            sbx_op_consumed(s->srv->t, op, credit);
        return;
    }
    o->b = *b;
    o->op = op;
    o->credit = credit;
    if (s->qt)
        s->qt->next = o;
    else
        s->qh = o;
    s->qt = o;
    s->qbytes += sf_buf_msg_len(&o->b);
    if (s->qbytes > s->srv->cfg->sess_send_queue)
        s->holding = true;
    want_write(s);
}

static void send_json(struct sess *s, uint32_t id, const char *type, json_t *obj)
{
    json_t *empty = obj ? NULL : json_object();
    struct sf_buf b;

    sf_buf_init(&b, LWS_PRE);
    if ((obj || empty) && !sf_enc_json(&b, id, type, obj ? obj : empty))
        queue(s, &b, 0, 0);
    json_decref(empty);
}

static void send_error(struct sess *s, uint32_t id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void send_error(struct sess *s, uint32_t id, const char *code, const char *fmt, ...)
{
    char msg[SBX_ERR_MSG_MAX];
    struct sf_buf b;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sf_buf_init(&b, LWS_PRE);
    if (!sf_enc_error(&b, id, code, msg))
        queue(s, &b, 0, 0);
}

static void credit(struct sess *s, sbx_op_t op, size_t n)
{
    if (!s->holding) {
        sbx_op_consumed(s->srv->t, op, n);
        return;
    }
    if (s->nheld && s->held[s->nheld - 1].op == op) {
        s->held[s->nheld - 1].n += n;
        return;
    }
    if (s->nheld == s->heldcap) {
        size_t cap = s->heldcap ? s->heldcap * 2 : 8;
        struct held *h = realloc(s->held, cap * sizeof(*h));
        if (!h) {
            sbx_op_consumed(s->srv->t, op, n);
            return;
        }
        s->held = h;
        s->heldcap = cap;
    }
    s->held[s->nheld++] = (struct held){op, n};
}

/* Return held credit. Each entry is taken off before its call, which may call sinks
 * that queue more (and so may start holding again). */
static void release(struct sess *s)
{
    size_t i = 0;

    s->holding = false;
    while (i < s->nheld && !s->holding) {
        struct held h = s->held[i++];
        sbx_op_consumed(s->srv->t, h.op, h.n);
    }
    memmove(s->held, s->held + i, (s->nheld - i) * sizeof(*s->held));
    s->nheld -= i;
}

static int writeable(struct sess *s)
{
    struct sout *o = s->qh;
    size_t n;

    if (!o)
        return 0;
    n = sf_buf_msg_len(&o->b);
    if (lws_write(s->wsi, sf_buf_msg(&o->b), n, LWS_WRITE_BINARY) < (int)n)
        return -1;
    if (!(s->qh = o->next))
        s->qt = NULL;
    s->qbytes -= n;
    if (o->credit)
        credit(s, o->op, o->credit);
    sf_buf_free(&o->b);
    free(o);
    if (s->holding && s->qbytes <= s->srv->cfg->sess_send_queue / 2) {
        release(s);
        for (struct sreq *r = s->reqs; r && !s->holding; r = r->next)
            klink_resume(r->kl);
    }
    if (s->qh)
        want_write(s);
    return 0;
}

/* ------------------------------------------------------------------ sink */

static void req_unlink(struct sreq *r)
{
    struct sess *s = r->s;

    for (struct sreq **pp = &s->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    s->nreqs--;
    r->live = false;
    r->next = s->grave;
    s->grave = r;
}

static void reap(struct sess *s)
{
    while (s->grave) {
        struct sreq *r = s->grave;
        s->grave = r->next;
        free(r->wdata);
        json_decref(r->answer);
        free(r->wpath);
        watch_ev_free(&r->wev);
        free(r);
    }
}

/* ------------------------------------------------------------ watch */

static const struct sbx_sink sink;

static void watch_started(struct sreq *r)
{
    json_t *j =
        json_pack("{s:I,s:I}", "watch", (json_int_t)r->wpid, "offset", (json_int_t)r->wfrom);

    r->wstarted = true;
    send_json(r->s, r->id, "watch", j);
    json_decref(j);
}

static void watch_fail(struct sreq *r, const char *code, const char *msg)
{
    send_error(r->s, r->id, code, "%s", msg);
    req_unlink(r);
}

static void watch_follow(struct sreq *r)
{
    struct sbx_err err;

    r->wstep = SW_STREAM;
    watch_ev_init(&r->wev, r->s->srv->cfg->watch_line_max, r->wfrom);
    if (sbx_proc_output(r->s->srv->t, r->s->sbx, r->wpid, r->wfrom, true, &sink, r, &r->op, &err)) {
        watch_fail(r, sbx_err_name(err.code), err.msg);
        return;
    }
    if (!r->wpath) /* a resume: nothing to wait for */
        watch_started(r);
}

/* The op before the stream is over: go on to the next (watch.c's steps, as frames). */
static void watch_done(struct sreq *r, const struct sbx_err *err, json_t *body)
{
    struct sess *s = r->s;
    struct sbx_err e2;
    json_t *b;

    if (err) {
        if (r->wstep == SW_CHECK && err->code == SBX_E_PROCESS_NOT_FOUND)
            watch_fail(r, "watch_not_found", err->msg);
        else
            watch_fail(r, sbx_err_name(err->code), err->msg);
        return;
    }
    switch (r->wstep) {
    case SW_COUNT:
        if (watch_running(body) >= s->srv->cfg->watch_max_per_sbx) {
            watch_fail(r, "too_many_watches", "the sandbox runs watch_max_per_sandbox watches");
            return;
        }
        if (!(b = watch_exec_body(s->srv->cfg, r->wpath, r->wrec))) {
            watch_fail(r, "internal", "out of memory");
            return;
        }
        r->wstep = SW_EXEC;
        if (sbx_json_call_exec(s->srv->t, s->sbx, b, false, &sink, r, &r->op, &e2))
            watch_fail(r, sbx_err_name(e2.code), e2.msg);
        json_decref(b);
        return;
    case SW_EXEC:
        r->wpid = (uint32_t)json_integer_value(json_object_get(body, "pid"));
        watch_follow(r);
        return;
    case SW_CHECK:
        if (!watch_proc_is(body)) {
            watch_fail(r, "watch_not_found", "that process is not a watch");
            return;
        }
        if (r->wfrom > (uint64_t)json_integer_value(json_object_get(body, "output_end"))) {
            watch_fail(r, "bad_offset", "the offset is past the end of the watch");
            return;
        }
        watch_follow(r);
        return;
    case SW_STREAM:
        if (!r->wstarted) {
            watch_fail(r, "internal", "the watch ended before it started");
            return;
        }
        b = json_is_object(body) ? json_incref(body) : json_object();
        json_object_set_new(b, "offset", json_integer((json_int_t)r->wev.next));
        send_json(s, r->id, "end", b);
        json_decref(b);
        req_unlink(r);
        return;
    }
}

/* One checked line of the watch: a frame (the first one starts the watch, or fails it). */
static int watch_event(void *user, json_t *ev)
{
    struct sreq *r = user;
    const char *type = json_string_value(json_object_get(ev, "type"));

    if (!r->wstarted) {
        if (!strcmp(type, "error")) {
            const char *code = json_string_value(json_object_get(ev, "code"));
            const char *msg = json_string_value(json_object_get(ev, "message"));
            sbx_op_cancel(r->s->srv->t, r->op);
            watch_fail(r,
                       !strcmp(code, "not_found")         ? "file_not_found"
                       : !strcmp(code, "not_a_directory") ? "not_a_directory"
                       : !strcmp(code, "internal")        ? "internal"
                                                          : "bad_request",
                       msg ? msg : "the path cannot be watched");
            return 1;
        }
        watch_started(r);
    }
    send_json(r->s, r->id, NULL, ev);
    return 0;
}

static void watch_data(struct sreq *r, uint64_t off, const void *p, size_t n)
{
    if (r->wstep != SW_STREAM)
        return;
    if (watch_ev_feed(&r->wev, off, p, n, watch_event, r) || !r->live)
        return;
    /* Acknowledged as the socket's queue allows (held back while it is over its limit). */
    credit(r->s, r->op, n);
}

static void watch_lost(struct sreq *r, uint64_t off, uint64_t n)
{
    json_t *j;

    if (r->wstep != SW_STREAM)
        return;
    watch_ev_gap(&r->wev, off + n);
    if (!r->wstarted)
        watch_started(r);
    j = json_pack("{s:I,s:I}", "offset", (json_int_t)(off + n), "bytes", (json_int_t)n);
    send_json(r->s, r->id, "lost", j);
    json_decref(j);
}

/* ------------------------------------------------------------ sink */

static void sink_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct sreq *r = user;
    struct sess *s = r->s;
    json_t *body;

    if (!r->live)
        return;
    body = sbx_json_result(res);
    if (r->kind == SF_OP_WATCH) {
        watch_done(r, err, body);
        json_decref(body);
        return;
    }
    if (err) {
        send_error(s, r->id, sbx_err_name(err->code), "%s", err->msg);
    } else if (r->kind == SF_OP_EXEC) {
        send_json(s, r->id,
                  r->bg                           ? "started"
                  : json_object_get(body, "type") ? NULL
                                                  : "exit",
                  body);
    } else if (r->kind == SF_OP_ATTACH) {
        send_json(s, r->id, json_object_get(body, "type") ? NULL : "exit", body);
    } else if (r->kind == SF_OP_READ_FILE) {
        json_t *end = json_pack("{s:I}", "size", (json_int_t)r->roff);
        send_json(s, r->id, "end", end);
        json_decref(end);
    } else {
        send_json(s, r->id, "result", body);
    }
    json_decref(body);
    req_unlink(r);
}

static void sink_head(void *user, uint64_t size)
{
    struct sreq *r = user;

    r->size = size;
}

static void sink_data(void *user, int fd, uint64_t off, const void *p, size_t n)
{
    struct sreq *r = user;
    struct sf_buf b;
    const char *type = fd == 1 ? "stdout" : fd == 2 ? "stderr" : "data";

    if (!r->live)
        return;
    if (r->kind == SF_OP_WATCH) {
        watch_data(r, off, p, n);
        return;
    }
    if (fd == 0) {
        off = r->roff;
        r->roff += n;
    }
    sf_buf_init(&b, LWS_PRE);
    if (sf_enc_data(&b, r->id, type, off, p, n)) {
        sbx_op_consumed(r->s->srv->t, r->op, n);
        return;
    }
    queue(r->s, &b, r->op, n);
}

static void sink_lost(void *user, uint64_t off, uint64_t n)
{
    struct sreq *r = user;
    json_t *j;

    if (!r->live)
        return;
    if (r->kind == SF_OP_WATCH) {
        watch_lost(r, off, n);
        return;
    }
    j = json_pack("{s:I, s:I}", "offset", (json_int_t)off, "bytes", (json_int_t)n);
    send_json(r->s, r->id, "lost", j);
    json_decref(j);
}

static void feed(struct sreq *r)
{
    struct sbx_table *t = r->s->srv->t;

    if (r->in_write || r->finished)
        return;
    r->in_write = true;
    while (r->live && r->woff < r->wlen) {
        size_t took = sbx_op_write(t, r->op, r->wdata + r->woff, r->wlen - r->woff);
        if (!took)
            break;
        r->woff += took;
    }
    if (r->live && r->woff == r->wlen) {
        r->finished = true;
        sbx_op_finish(t, r->op);
    }
    r->in_write = false;
}

static void sink_writable(void *user)
{
    struct sreq *r = user;

    if (r->live)
        feed(r);
}

static const struct sbx_sink sink = {
    .done = sink_done,
    .head = sink_head,
    .data = sink_data,
    .writable = sink_writable,
    .lost = sink_lost,
};

/* ------------------------------------------------- code runs and contexts */

static void code_started(void *user, uint32_t pid)
{
    struct sreq *r = user;
    json_t *j = json_pack("{s:I}", "run_id", (json_int_t)pid);

    send_json(r->s, r->id, "started", j);
    json_decref(j);
}

/* Each line of a run is one frame, its fields as the bridge wrote them. */
static void code_line(void *user, const struct klink_line *l)
{
    struct sreq *r = user;
    json_t *o = klink_line_object(l, r->s->srv->cfg->run_max_line);

    r->lines++;
    if (o)
        send_json(r->s, r->id, NULL, o);
    json_decref(o);
    /* A slow agent: the run goes on in the guest, its output waits in the ring. */
    if (r->s->holding)
        klink_pause(r->kl);
}

static void code_done(void *user, const struct sbx_err *err)
{
    struct sreq *r = user;

    r->kl = NULL;
    if (err && !r->lines) {
        send_error(r->s, r->id, sbx_err_name(err->code), "%s", err->msg);
    } else if (err) {
        json_t *o = klink_error_object("KernelUnavailable", err->msg);
        if (o)
            send_json(r->s, r->id, NULL, o);
        json_decref(o);
        send_json(r->s, r->id, "end_of_execution", NULL);
    }
    req_unlink(r);
}

static const struct klink_cb run_cb = {
    .started = code_started,
    .line = code_line,
    .done = code_done,
};

static void ctx_line(void *user, const struct klink_line *l)
{
    struct sreq *r = user;

    if (l->kind == KLINK_LINE_OK && !r->answer && (r->answer = json_copy(l->obj)))
        json_object_del(r->answer, "type");
}

static void ctx_done(void *user, const struct sbx_err *err)
{
    struct sreq *r = user;
    json_t *body = NULL;

    r->kl = NULL;
    if (err) {
        send_error(r->s, r->id, sbx_err_name(err->code), "%s", err->msg);
    } else if (!r->answer) {
        send_error(r->s, r->id, "kernel_unavailable",
                   "the kernel bridge answered nothing that is a JSON object");
    } else {
        /* A context's own "id" would clash with the frame's: it is wrapped. */
        if (!strcmp(r->action, "context_create") || !strcmp(r->action, "context_get"))
            body = json_pack("{s:O}", "context", r->answer);
        else if (!strcmp(r->action, "context_list"))
            body = json_incref(r->answer);
        send_json(r->s, r->id, "result", body);
        json_decref(body);
    }
    req_unlink(r);
}

static const struct klink_cb ctx_cb = {
    .line = ctx_line,
    .done = ctx_done,
};

/* The contexts op: {"action": "create"|"list"|"get"|"delete"|"restart"|"interrupt",
 * "context_id" (all but create and list), create's "language", "cwd", "env"}. */
static int contexts_start(struct sess *s, struct sreq *r, json_t *args, struct sbx_err *err)
{
    static const char *const actions[][2] = {
        {"create", "context_create"},   {"list", "context_list"},
        {"get", "context_get"},         {"delete", "context_delete"},
        {"restart", "context_restart"}, {"interrupt", "context_interrupt"},
    };
    const char *a = json_string_value(json_object_get(args, "action"));
    json_t *ctx = json_object_get(args, "context_id");
    struct klink_opts o = {.max_line = s->srv->cfg->run_max_line, .single = true};
    json_t *req;
    size_t i;
    int rc;

    for (i = 0; a && i < sizeof(actions) / sizeof(actions[0]); i++)
        if (!strcmp(a, actions[i][0]))
            break;
    if (!a || i == sizeof(actions) / sizeof(actions[0]))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "'action' must be create, list, get, delete, restart or interrupt");
    r->action = actions[i][1];
    if (i >= 2 &&
        (!json_is_string(ctx) || !json_string_length(ctx) || json_string_length(ctx) > API_ID_MAX))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "'context_id' must name a context");
    if (i < 2 && ctx)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "%s takes no context_id", a);
    json_object_del(args, "action");
    json_object_del(args, "context_id");
    if ((rc =
             klink_context_req(r->action, i >= 2 ? json_string_value(ctx) : NULL, args, &req, err)))
        return rc;
    rc = klink_request(s->srv->t, s->srv->loop, s->sbx, req, &o, &ctx_cb, r, &r->kl, err);
    json_decref(req);
    return rc;
}

static int run_start(struct sess *s, struct sreq *r, json_t *args, struct sbx_err *err)
{
    struct klink_opts o = {.max_line = s->srv->cfg->run_max_line};
    json_t *req;
    int rc;

    if ((rc = klink_run_req(args, o.max_line, &req, err)))
        return rc;
    rc = klink_request(s->srv->t, s->srv->loop, s->sbx, req, &o, &run_cb, r, &r->kl, err);
    json_decref(req);
    return rc;
}

/* run_read {"pid", "offset"?}: a run's lines again from that byte offset. */
static int run_read_start(struct sess *s, struct sreq *r, uint32_t pid, json_t *args,
                          struct sbx_err *err)
{
    struct klink_opts o = {.max_line = s->srv->cfg->run_max_line};
    json_t *off = json_object_get(args, "offset");

    if (off && (!json_is_integer(off) || json_integer_value(off) < 0))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "'offset' must be a byte offset");
    return klink_read(s->srv->t, s->srv->loop, s->sbx, pid,
                      off ? (uint64_t)json_integer_value(off) : 0, &o, &run_cb, r, &r->kl, err);
}

/* -------------------------------------------------------------- requests */

static struct sreq *req_find(struct sess *s, uint32_t id)
{
    for (struct sreq *r = s->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/* pid from args (removed from them): 0 when missing or wrong. */
static uint32_t take_pid(json_t *args)
{
    json_t *v = json_object_get(args, "pid");
    json_int_t pid = json_is_integer(v) ? json_integer_value(v) : 0;

    json_object_del(args, "pid");
    return pid > 0 && pid <= UINT32_MAX ? (uint32_t)pid : 0;
}

static const char *take_path(json_t *args, const char *key, struct api_err *e)
{
    const char *p = json_string_value(json_object_get(args, key));

    if (api_path_check(key, p, e))
        return NULL;
    return p;
}

/* Start one decoded request. Answers (errors included) go out as frames. */
static void dispatch(struct sess *s, struct sf_req *q)
{
    struct sbx_table *t = s->srv->t;
    struct sbx_err err = {0};
    struct api_err e;
    struct sreq *r;
    uint32_t pid = 0;
    int rc = 0;

    if (req_find(s, q->id)) {
        send_error(s, q->id, "bad_request", "request id %u is already in flight", q->id);
        return;
    }
    if (q->op == SF_OP_DETACH) {
        json_t *v = json_object_get(q->args, "target");
        struct sreq *a =
            json_is_integer(v) && json_integer_value(v) >= 0 && json_integer_value(v) <= UINT32_MAX
                ? req_find(s, (uint32_t)json_integer_value(v))
                : NULL;
        if (!a || (a->kind != SF_OP_ATTACH && a->kind != SF_OP_WATCH)) {
            send_error(s, q->id, "invalid_argument",
                       "'target' must be the id of an attach or a watch in flight on this "
                       "socket");
            return;
        }
        sbx_op_cancel(t, a->op);
        send_json(s, a->id, "detached", NULL);
        req_unlink(a);
        send_json(s, q->id, "result", NULL);
        return;
    }
    if (s->nreqs >= s->srv->cfg->sess_max_requests) {
        send_error(s, q->id, "too_many_requests",
                   "%u requests are in flight on this socket (session_max_requests): wait for "
                   "some to finish",
                   s->nreqs);
        return;
    }
    if (!(r = calloc(1, sizeof(*r)))) {
        send_error(s, q->id, "internal", "out of memory");
        return;
    }
    r->s = s;
    r->id = q->id;
    r->kind = q->op;
    r->live = true;

    switch (q->op) {
    case SF_OP_EXEC: {
        struct sbx_json_exec x;
        if (!s->may_exec) {
            free(r);
            send_error(s, q->id, "token_wrong_scope",
                       "the access token's scope does not include \"exec\"");
            return;
        }
        rc = sbx_json_exec(q->args, &x, &err);
        r->bg = x.req.background == 1 || x.req.pty;
        if (rc == 0)
            rc = sbx_exec(t, s->sbx, &x.req, !r->bg, &sink, r, &r->op, &err);
        sbx_json_exec_free(&x);
        break;
    }
    case SF_OP_STDIN:
    case SF_OP_SIGNAL:
    case SF_OP_RESIZE: {
        struct sbx_proc_ctl c = {0};
        unsigned char *raw = NULL;
        if (!(pid = take_pid(q->args))) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "'pid' must be a process id");
            break;
        }
        if (q->op == SF_OP_STDIN) {
            json_t *eof = json_object_get(q->args, "eof");
            if (q->data_len > SBX_PROC_STDIN_MAX) {
                rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT,
                                 "at most %d bytes of stdin per request", SBX_PROC_STDIN_MAX);
                break;
            }
            if ((!q->data && !json_is_true(eof)) || (eof && !json_is_boolean(eof))) {
                rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT,
                                 "stdin takes 'data' (bin) and/or 'eof': true");
                break;
            }
            c.data = q->data;
            c.len = q->data_len;
            c.eof = json_is_true(eof);
        } else if (api_proc_ctl_parse(q->op == SF_OP_SIGNAL ? API_PROC_SIGNAL : API_PROC_RESIZE,
                                      q->args, &c, &raw, &e)) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "%s", e.msg);
            break;
        }
        rc = sbx_proc_ctl(t, s->sbx, pid, &c, &sink, r, &r->op, &err);
        free(raw);
        break;
    }
    case SF_OP_ATTACH: {
        json_t *off = json_object_get(q->args, "offset");
        if (!(pid = take_pid(q->args)) ||
            (off && (!json_is_integer(off) || json_integer_value(off) < 0))) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT,
                             "attach takes 'pid' and an 'offset' >= 0");
            break;
        }
        rc = sbx_proc_output(t, s->sbx, pid, off ? (uint64_t)json_integer_value(off) : 0, true,
                             &sink, r, &r->op, &err);
        break;
    }
    case SF_OP_PROCESSES:
        pid = take_pid(q->args);
        rc = sbx_proc_list(t, s->sbx, pid, &sink, r, &r->op, &err);
        break;
    case SF_OP_READ_FILE: {
        const char *path = take_path(q->args, "path", &e);
        if (!path) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "%s", e.msg);
            break;
        }
        rc = sbx_file_read(t, s->sbx, path, &sink, r, &r->op, &err);
        break;
    }
    case SF_OP_WRITE_FILE: {
        const char *path = take_path(q->args, "path", &e);
        json_t *mode = json_object_get(q->args, "mode");
        if (!path) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "%s", e.msg);
            break;
        }
        if (!q->data || (mode && (!json_is_integer(mode) || json_integer_value(mode) < 0 ||
                                  json_integer_value(mode) > 07777))) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT,
                             "write_file takes 'path', 'data' (bin) and an optional 'mode' "
                             "(0..07777)");
            break;
        }
        if (q->data_len && !(r->wdata = malloc(q->data_len))) {
            rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
            break;
        }
        if (q->data_len)
            memcpy(r->wdata, q->data, q->data_len);
        r->wlen = q->data_len;
        rc = sbx_file_write(t, s->sbx, path, mode ? (unsigned)json_integer_value(mode) : 0644,
                            &sink, r, &r->op, &err);
        break;
    }
    case SF_OP_STAT:
    case SF_OP_LIST:
    case SF_OP_MKDIR:
    case SF_OP_REMOVE:
    case SF_OP_RENAME: {
        if (!take_path(q->args, "path", &e) ||
            (q->op == SF_OP_RENAME && !take_path(q->args, "to", &e))) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "%s", e.msg);
            break;
        }
        static const enum sbx_file_kind kinds[] = {[SF_OP_STAT] = SBX_FILE_STAT,
                                                   [SF_OP_LIST] = SBX_FILE_LIST,
                                                   [SF_OP_MKDIR] = SBX_FILE_MKDIR,
                                                   [SF_OP_REMOVE] = SBX_FILE_REMOVE,
                                                   [SF_OP_RENAME] = SBX_FILE_RENAME};
        struct sbx_file_req fr;
        rc = sbx_json_file(kinds[q->op], q->args, &fr, &err);
        if (rc == 0)
            rc = sbx_file_op(t, s->sbx, &fr, &sink, r, &r->op, &err);
        break;
    }
    case SF_OP_RUN_CODE:
    case SF_OP_RUN_READ:
    case SF_OP_RUN_STOP:
    case SF_OP_CONTEXTS:
        /* Code runs as the sandbox's user, as an exec does: the same scope opens it. */
        if (!s->may_exec) {
            free(r);
            send_error(s, q->id, "token_wrong_scope",
                       "the access token's scope does not include \"exec\"");
            return;
        }
        if (q->op == SF_OP_RUN_CODE) {
            rc = run_start(s, r, q->args, &err);
        } else if (q->op == SF_OP_CONTEXTS) {
            rc = contexts_start(s, r, q->args, &err);
        } else if (!(pid = take_pid(q->args))) {
            rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "'pid' must be a run id");
        } else if (q->op == SF_OP_RUN_READ) {
            rc = run_read_start(s, r, pid, q->args, &err);
        } else {
            rc = klink_stop(t, s->sbx, pid, &sink, r, &r->op, &err);
        }
        break;
    case SF_OP_WATCH: {
        /* A new watch ("path", "recursive"), or one already running read again ("watch":
         * its id, "offset"). */
        json_t *wid = json_object_get(q->args, "watch"), *off = json_object_get(q->args, "offset");
        json_t *rec = json_object_get(q->args, "recursive");
        if (wid) {
            if (!json_is_integer(wid) || json_integer_value(wid) < 1 ||
                json_integer_value(wid) > API_PID_MAX ||
                (off && (!json_is_integer(off) || json_integer_value(off) < 0))) {
                rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT,
                                 "watch takes 'watch' (an id) and an 'offset' >= 0");
                break;
            }
            r->wpid = (uint32_t)json_integer_value(wid);
            r->wfrom = off ? (uint64_t)json_integer_value(off) : 0;
            r->wstep = SW_CHECK;
            rc = sbx_proc_list(t, s->sbx, r->wpid, &sink, r, &r->op, &err);
            break;
        }
        {
            const char *path = take_path(q->args, "path", &e);
            if (!path || (rec && !json_is_boolean(rec)) || off) {
                rc = sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "%s",
                                 path ? "watch takes 'path' and an optional 'recursive' (boolean)"
                                      : e.msg);
                break;
            }
            if (!(r->wpath = strdup(path))) {
                rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
                break;
            }
        }
        r->wrec = json_is_true(rec);
        r->wstep = SW_COUNT;
        rc = sbx_proc_list(t, s->sbx, 0, &sink, r, &r->op, &err);
        break;
    }
    default:
        rc = sbx_err_set(&err, SBX_E_BAD_REQUEST, "op not handled");
        break;
    }
    if (rc) {
        send_error(s, q->id, sbx_err_name(err.code), "%s", err.msg);
        free(r->wdata);
        free(r->wpath);
        free(r);
        return;
    }
    r->next = s->reqs;
    s->reqs = r;
    s->nreqs++;
    if (q->op == SF_OP_WRITE_FILE)
        feed(r);
}

/* The resume is over: the messages that waited for it run (or get its error). */
static void on_resumed(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct sess *s = user;
    struct waiting *m;

    (void)res;
    s->resuming = false;
    while ((m = s->wq)) {
        struct sf_req q;
        char why[120];

        s->wq = m->next;
        if (!sf_decode(m->b, m->n, &q, why, sizeof(why))) { /* it decoded when it came */
            if (err)
                send_error(s, q.id, sbx_err_name(err->code), "%s", err->msg);
            else
                dispatch(s, &q);
            sf_req_clear(&q);
        }
        free(m);
    }
    s->wq_tail = NULL;
    s->nwq = 0;
    lws_rx_flow_control(s->wsi, 1);
}

static const struct sbx_sink resume_sink = {.done = on_resumed};

/* A request on a paused (or starting) sandbox waits for its resume, as the REST routes
 * do. 1: held (or answered), 0: go on, -1: out of memory. */
static int wait_for_resume(struct sess *s, const void *p, size_t n, const struct sf_req *q)
{
    struct sbx_err err;
    struct waiting *m;
    json_t *out = NULL;

    if (!s->resuming && (q->op == SF_OP_DETACH || !sbx_coming_back(s->srv->t, s->sbx)))
        return 0;
    if (!s->resuming) {
        if (sbx_resume(s->srv->t, s->sbx, &resume_sink, s, &s->resume_op, &out, &err)) {
            send_error(s, q->id, sbx_err_name(err.code), "%s", err.msg);
            return 1;
        }
        if (out) { /* back already */
            json_decref(out);
            return 0;
        }
        s->resuming = true;
        lws_rx_flow_control(s->wsi, 0); /* what lws read already may still come */
    }
    if (s->nwq >= s->srv->cfg->sess_max_requests) {
        send_error(s, q->id, "too_many_requests",
                   "%u requests wait for the sandbox's resume on this socket "
                   "(session_max_requests): wait for their answers",
                   s->nwq);
        return 1;
    }
    if (!(m = malloc(sizeof(*m) + n)))
        return -1;
    m->next = NULL;
    m->n = n;
    memcpy(m->b, p, n);
    if (s->wq_tail)
        s->wq_tail->next = m;
    else
        s->wq = m;
    s->wq_tail = m;
    s->nwq++;
    return 1;
}

/* A whole message: -1 closes the socket (the close reason is set). */
static int on_message(struct sess *s, const void *p, size_t n)
{
    struct sf_req q;
    char why[120];
    int w;

    if (sf_decode(p, n, &q, why, sizeof(why))) {
        LOG(LOG_DEBUG, "%s: agent socket: malformed message: %s", s->sbx, why);
        lws_close_reason(s->wsi, LWS_CLOSE_STATUS_POLICY_VIOLATION, (unsigned char *)why,
                         strlen(why));
        return -1;
    }
    if (!(w = wait_for_resume(s, p, n, &q)))
        dispatch(s, &q);
    sf_req_clear(&q);
    return w < 0 ? -1 : 0;
}

static int on_receive(struct sess *s, const void *in, size_t len)
{
    size_t max = s->srv->cfg->sess_max_frame;
    const unsigned char *msg;
    size_t n;
    int rc =
        ws_rx_add(&s->rx, in, len, lws_is_first_fragment(s->wsi), lws_is_final_fragment(s->wsi),
                  lws_remaining_packet_payload(s->wsi), max, &msg, &n);

    if (rc == -EMSGSIZE) {
        char why[96];
        int k = snprintf(why, sizeof(why),
                         "message larger than %zu bytes (session_max_frame_bytes)", max);
        lws_close_reason(s->wsi, LWS_CLOSE_STATUS_MESSAGE_TOO_LARGE, (unsigned char *)why,
                         (size_t)k);
        return -1;
    }
    if (rc < 0)
        return -1;
    if (rc == WS_RX_MORE)
        return 0;
    rc = on_message(s, msg, n);
    /* An idle socket holds no receive buffer. */
    ws_rx_free(&s->rx);
    return rc;
}

/* -------------------------------------------------------------- callback */

static void sess_end(struct sess *s)
{
    struct vhd *v = vhd_of(s->wsi);

    while (s->reqs) {
        struct sreq *r = s->reqs;
        if (r->kl)
            klink_cancel(r->kl); /* a run goes on in the guest */
        else
            sbx_op_cancel(s->srv->t, r->op);
        r->kl = NULL;
        req_unlink(r);
    }
    reap(s);
    if (s->resuming) {
        s->resuming = false;
        sbx_op_cancel(s->srv->t, s->resume_op);
    }
    while (s->wq) {
        struct waiting *m = s->wq;
        s->wq = m->next;
        free(m);
    }
    s->wq_tail = NULL;
    while (s->qh) {
        struct sout *o = s->qh;
        s->qh = o->next;
        sf_buf_free(&o->b);
        free(o);
    }
    s->qt = NULL;
    free(s->held);
    ws_rx_free(&s->rx);
    if (s->linked && v) {
        struct sbx_socks **pp = socks_find(v, s->sbx), *c = *pp;
        if (c && !--c->n) {
            *pp = c->next;
            free(c);
        }
    }
    s->linked = false;
    s->srv = NULL;
}

static int sess_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len)
{
    struct sess *s = user;
    struct http_server *srv = wsi ? lws_context_user(lws_get_context(wsi)) : NULL;

    switch (reason) {
    case LWS_CALLBACK_PROTOCOL_INIT:
        if (wsi && !lws_protocol_vh_priv_zalloc(lws_get_vhost(wsi), lws_get_protocol(wsi),
                                                sizeof(struct vhd)))
            return -1;
        return 0;
    case LWS_CALLBACK_ADD_HEADERS:
        return http_ws_add_headers(wsi, in);
    case LWS_CALLBACK_ESTABLISHED: {
        char uri[512];
        struct vhd *v = vhd_of(wsi);
        int n = lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI);
        memset(s, 0, sizeof(*s));
        if (!srv || n <= 0 || n >= (int)sizeof(uri) ||
            lws_hdr_copy(wsi, uri, sizeof(uri), WSI_TOKEN_GET_URI) <= 0 ||
            session_path(uri, s->sbx))
            return -1; /* confirm let it through: cannot happen */
        s->wsi = wsi;
        s->srv = srv;
        {
            /* Judged once, with the same credential the upgrade was admitted by. */
            struct api_err e;
            s->may_exec = http_authorize(NULL, wsi, s->sbx, "exec", &e) == 0;
        }
        if (v) {
            struct sbx_socks **pp = socks_find(v, s->sbx);
            if (!*pp) {
                if (!(*pp = calloc(1, sizeof(**pp))))
                    return -1;
                memcpy((*pp)->sbx, s->sbx, sizeof(s->sbx));
            }
            (*pp)->n++;
            s->linked = true;
        }
        LOG(LOG_DEBUG, "%s: agent socket open", s->sbx);
        return 0;
    }
    case LWS_CALLBACK_RECEIVE:
        if (!s || !s->srv)
            return -1;
        reap(s);
        return on_receive(s, in, len);
    case LWS_CALLBACK_SERVER_WRITEABLE:
        if (!s || !s->srv)
            return 0;
        reap(s);
        return writeable(s);
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        return http_ws_peer_close(wsi, in, len);
    case LWS_CALLBACK_CLOSED:
        if (s && s->srv) {
            LOG(LOG_DEBUG, "%s: agent socket closed", s->sbx);
            sess_end(s);
        }
        return 0;
    default:
        return 0;
    }
}

const struct lws_protocols ws_session_protocol = {
    .name = SESS_PROTO,
    .callback = sess_cb,
    .per_session_data_size = sizeof(struct sess),
    /* lws hands a message over in pieces of at most this; bigger ones are joined here */
    .rx_buffer_size = 0,
};
