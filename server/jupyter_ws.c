/*
 * jupyter_ws.c - the channels WebSocket of Jupyter's kernel API (jupyter.h):
 * WS /api/kernels/{id}/channels, Jupyter's legacy JSON wire (text frames, one
 * message each, no subprotocol), relayed to the guest's kernel bridge
 * (docs/KERNELD.md, "channels") through a connector process that klink.h
 * starts and reads.
 *
 * Connectors outlive sockets. Each is a background process of the kernel's
 * sandbox and a registry entry (struct jconn) that records the offset of its
 * output up to which messages were written to a client ("delivered"), kept in
 * state_dir/jupyter/<sandbox>.<pid> too, so a warrend restarted even by
 * kill -9 knows it. A socket first takes over a connector no socket holds
 * (its output is read on from "delivered": what the dropped client missed, as
 * far as the guest's ring still has it, else a notice of the gap), after a
 * restart one found in the process list with such a file, and only then
 * starts a new one. A connector whose stdin holds half a message (its socket
 * dropped mid-frame) is killed rather than reused.
 *
 * Bounds: a client frame is at most jupyter_max_message_bytes (1009 past it);
 * frames waiting for the guest's stdin at most jupyter_input_queue_bytes, then
 * the socket is not read; past jupyter_send_queue_bytes of messages queued for
 * the client, the reader is paused (klink_pause: the guest's credit is held)
 * until half are written, so memory per socket is that queue, one guest
 * window and one line being assembled.
 *
 * The socket is bound to the HTTP protocol (lws binds a WebSocket that names no
 * subprotocol to protocols[0]); http.c hands its WebSocket reasons here and the
 * socket's state hangs off its pss (p->jws).
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_int.h"
#include "sbx_json.h"
#include "jupyter.h"
#include "klink.h"
#include "sbx_snap.h"
#include "ws_rx.h"

struct jws;

/* A connector process and how far its output reached a client. */
struct jconn {
    struct jconn *next;
    struct http_server *srv;
    char sbx[API_ID_MAX + 1];
    uint32_t pid;
    uint64_t delivered;
    struct jws *owner; /* the socket using it, or NULL */
    int fd;            /* its offset file, or -1 */
    /* The kernel's last iopub status this connector relayed (jup_status_state's
     * words, never the guest's own string), and when: seen orders it among the
     * connectors of its sandbox, every one of which gets all of the kernel's iopub. */
    const char *state;
    uint64_t seen;
};

struct jout {
    struct jout *next;
    size_t len;
    uint64_t end; /* output offset after it (0: a notice of warrend's) */
    unsigned char mem[];
};

struct jin {
    struct jin *next;
    size_t len, off; /* bytes, and how many went to stdin */
    char data[];
};

struct jws {
    struct http_server *srv;
    struct lws *wsi;
    char kernel[JUP_ID_MAX + 1];
    char sbx[API_ID_MAX + 1];
    bool live;
    struct jconn *c;
    struct klink *kl; /* reading the connector's output (klink.h), or NULL */
    sbx_op_t start_op, in_op;
    bool start_live, in_live;
    bool adopting; /* start_op lists processes (after a restart) */
    struct ws_rx rx;
    struct jin *iq, *iq_tail;
    size_t iq_bytes;
    bool rx_paused;
    struct jout *oq, *oq_tail;
    size_t oq_bytes;
    bool holding; /* the queue went over jupyter_send_queue_bytes: the reader is paused */
    bool closing;
    int close_code;
    const char *close_why;
};

static struct jconn *conns;
static uint64_t status_seq; /* stamps jconn.seen */

/* --------------------------------------------------------- registry */

static void conn_path(const struct jconn *c, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/jupyter/%s.%" PRIu32, c->srv->cfg->state_dir, c->sbx, c->pid);
}

static void conn_save(struct jconn *c)
{
    char b[32];
    int n;

    if (c->fd < 0)
        return;
    n = snprintf(b, sizeof(b), "%020" PRIu64 "\n", c->delivered);
    if (pwrite(c->fd, b, (size_t)n, 0) != n)
        LOG(LOG_WARN, "%s: cannot record the Jupyter connector's offset: %s", c->sbx,
            strerror(errno));
}

static struct jconn *conn_new(struct http_server *srv, const char *sbx, uint32_t pid,
                              uint64_t delivered)
{
    struct jconn *c = calloc(1, sizeof(*c));
    char path[4096];

    if (!c)
        return NULL;
    c->srv = srv;
    snprintf(c->sbx, sizeof(c->sbx), "%s", sbx);
    c->pid = pid;
    c->delivered = delivered;
    snprintf(path, sizeof(path), "%s/jupyter", srv->cfg->state_dir);
    mkdir(path, 0700);
    conn_path(c, path, sizeof(path));
    c->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    conn_save(c);
    c->next = conns;
    conns = c;
    return c;
}

static void conn_free(struct jconn *c, bool unlink_file)
{
    struct jconn **pp;
    char path[4096];

    for (pp = &conns; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    if (c->fd >= 0)
        close(c->fd);
    if (unlink_file) {
        conn_path(c, path, sizeof(path));
        unlink(path);
    }
    free(c);
}

static void on_kill_done_json(void *user, const struct sbx_err *err, json_t *body)
{
    (void)user;
    (void)err;
    json_decref(body);
}
SBX_JSON_DONE(on_kill_done, on_kill_done_json)

static const struct sbx_sink kill_sink = {.done = on_kill_done};

/* A connector that cannot be reused (half a message in its stdin): end it. The op is
 * never cancelled, so its sink takes no user. */
static void conn_kill(struct jconn *c)
{
    struct sbx_proc_ctl k = {.sig = 15};
    struct sbx_err err;
    sbx_op_t op;

    sbx_proc_ctl(c->srv->t, c->sbx, c->pid, &k, &kill_sink, NULL, &op, &err);
    conn_free(c, true);
}

unsigned jup_ws_count(const char *sbx)
{
    unsigned n = 0;

    for (struct jconn *c = conns; c; c = c->next)
        if (c->owner && sbx && !strcmp(c->sbx, sbx))
            n++;
    return n;
}

const char *jup_ws_state(const char *sbx)
{
    const struct jconn *last = NULL;

    for (struct jconn *c = conns; c; c = c->next)
        if (c->state && sbx && !strcmp(c->sbx, sbx) && (!last || c->seen > last->seen))
            last = c;
    return last ? last->state : "idle";
}

void jup_ws_forget(const char *sbx)
{
    struct jconn *c = conns, *next;

    for (; c; c = next) {
        next = c->next;
        if (!strcmp(c->sbx, sbx) && !c->owner)
            conn_free(c, true);
    }
}

/* Entries of sandboxes that ended without a DELETE through this door (TTL, /v1): gone. */
static void conns_sweep(struct http_server *srv)
{
    struct jconn *c = conns, *next;
    struct api_err e;

    for (; c; c = next) {
        next = c->next;
        if (!c->owner && http_ws_sandbox_open(srv, c->sbx, &e))
            conn_free(c, true);
    }
}

/* ------------------------------------------------------------ admission */

/* "/api/kernels/{id}/channels" (one trailing slash tolerated): the id into id. */
static int channels_path(const char *uri, char *id)
{
    static const char pre[] = "/api/kernels/", post[] = "/channels";
    size_t n = strlen(uri), idl;

    if (n > 1 && uri[n - 1] == '/')
        n--;
    if (n < sizeof(pre) - 1 + sizeof(post) - 1 || strncmp(uri, pre, sizeof(pre) - 1) ||
        strncmp(uri + n - (sizeof(post) - 1), post, sizeof(post) - 1))
        return -1;
    idl = n - (sizeof(pre) - 1) - (sizeof(post) - 1);
    if (idl == 0 || idl > JUP_ID_MAX || memchr(uri + sizeof(pre) - 1, '/', idl))
        return -1;
    memcpy(id, uri + sizeof(pre) - 1, idl);
    id[idl] = '\0';
    return 0;
}

static int uri_id(struct lws *wsi, char *id)
{
    char uri[512];
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI);

    if (n <= 0 || n >= (int)sizeof(uri) ||
        lws_hdr_copy(wsi, uri, sizeof(uri), WSI_TOKEN_GET_URI) < 0)
        return -1;
    return channels_path(uri, id);
}

bool jup_ws_route(struct lws *wsi)
{
    char id[JUP_ID_MAX + 1];

    return uri_id(wsi, id) == 0;
}

static int check_upgrade(struct http_server *srv, struct lws *wsi, char *id, char *sbx,
                         struct api_err *e)
{
    if (uri_id(wsi, id)) {
        *e = (struct api_err){.status = 404, .code = "not_found", .msg = "no such route"};
        return -1;
    }
    if (jup_authorize(wsi, srv->key, e))
        return -1;
    if (!http_origin_allowed(srv, wsi)) {
        *e = (struct api_err){.status = 403,
                              .code = "origin_not_allowed",
                              .msg = "this Origin may not open sockets here (allowed_origins)"};
        return -1;
    }
    /* lws would hang up on a subprotocol it has no entry for: say why instead. */
    if (lws_hdr_total_length(wsi, WSI_TOKEN_PROTOCOL) > 0) {
        *e = (struct api_err){.status = 400,
                              .code = "bad_request",
                              .msg = "the channels socket speaks Jupyter's legacy JSON wire: "
                                     "offer no Sec-WebSocket-Protocol"};
        return -1;
    }
    if (jup_kernel_sbx(srv, id, sbx, NULL, e) || http_ws_sandbox_open(srv, sbx, e))
        return -1;
    if (jup_ws_count(sbx) >= srv->cfg->jup_socks_per_kernel) {
        *e = (struct api_err){.status = 429, .code = "too_many_sockets"};
        snprintf(e->msg, sizeof(e->msg),
                 "kernel %s has %u channels sockets open (jupyter_sockets_per_kernel); close one",
                 id, srv->cfg->jup_socks_per_kernel);
        return -1;
    }
    return 0;
}

int jup_ws_confirm(struct http_server *srv, struct lws *wsi)
{
    char id[JUP_ID_MAX + 1], sbx[API_ID_MAX + 1];
    struct api_err e;

    if (check_upgrade(srv, wsi, id, sbx, &e))
        return http_ws_refuse(wsi, &e);
    return 0;
}

/* ---------------------------------------------------------------- output */

static void want_write(struct jws *w)
{
    lws_callback_on_writable(w->wsi);
}

static void close_with(struct jws *w, int code, const char *why)
{
    if (w->closing)
        return;
    w->closing = true;
    w->close_code = code;
    w->close_why = why;
    want_write(w);
}

static void push_out(struct jws *w, const char *s, size_t n, uint64_t end)
{
    struct jout *o = malloc(sizeof(*o) + LWS_PRE + n);

    if (!o) {
        close_with(w, 1011, "out of memory");
        return;
    }
    o->next = NULL;
    o->len = n;
    o->end = end;
    memcpy(o->mem + LWS_PRE, s, n);
    if (w->oq_tail)
        w->oq_tail->next = o;
    else
        w->oq = o;
    w->oq_tail = o;
    w->oq_bytes += n;
    if (w->oq_bytes >= w->srv->cfg->jup_send_queue && !w->holding && w->kl) {
        w->holding = true;
        klink_pause(w->kl);
    }
    want_write(w);
}

/* A message of warrend's own for the client (taken: content). */
static void notice(struct jws *w, const char *kind, json_t *content)
{
    char *s = jup_notice(kind, content);

    if (s) {
        push_out(w, s, strlen(s), 0);
        free(s);
    }
}

static void notice_error(struct jws *w, const char *code, const char *msg)
{
    notice(w, "warren_error", json_pack("{s:s, s:s}", "code", code, "message", msg));
}

/* One line of the connector: a Jupyter message for the client, or what went wrong. */
static void k_line(void *user, const struct klink_line *l)
{
    struct jws *w = user;
    const char *st;
    char msg[200];

    switch (l->kind) {
    case KLINK_LINE_OK:
        /* The bridge's refusal of a line is not a Jupyter message: told as ours. */
        if (l->type && !strcmp(l->type, "fail")) {
            notice(w, "warren_error", json_deep_copy(l->obj));
            return;
        }
        if (w->c && (st = jup_status_state(l->obj))) {
            w->c->state = st;
            w->c->seen = ++status_seq;
        }
        push_out(w, l->p, l->n, l->end);
        return;
    case KLINK_LINE_TOO_LONG:
        snprintf(msg, sizeof(msg),
                 "a kernel message longer than jupyter_max_message_bytes (%zu) was dropped",
                 w->srv->cfg->jup_max_msg);
        notice_error(w, "message_too_large", msg);
        return;
    case KLINK_LINE_BAD:
        notice_error(w, "bad_kernel_output",
                     "a line from the kernel bridge that is not a JSON "
                     "object was dropped");
        return;
    case KLINK_LINE_LOST:
        snprintf(msg, sizeof(msg),
                 "[warren] %zu bytes of this kernel's messages (from offset %" PRIu64
                 ") are gone from the guest's buffer (process_ring_bytes) before this client "
                 "read them\n",
                 l->n, l->off);
        LOG(LOG_INFO, "%s: Jupyter channels: %s", w->sbx, msg);
        notice(w, "stream", json_pack("{s:s, s:s}", "name", "stderr", "text", msg));
        return;
    }
}

static void in_pump(struct jws *w);

/* The connector runs and has the channels request: client messages may follow. */
static void k_started(void *user, uint32_t pid)
{
    struct jws *w = user;

    if (!(w->c = conn_new(w->srv, w->sbx, pid, 0))) {
        close_with(w, 1011, "out of memory");
        return;
    }
    w->c->owner = w;
    LOG(LOG_DEBUG, "%s: Jupyter connector %" PRIu32 " started", w->sbx, pid);
    in_pump(w);
}

static void k_done(void *user, const struct sbx_err *err)
{
    struct jws *w = user;

    w->kl = NULL; /* klink frees it once this returns */
    notice_error(w, err ? sbx_err_name(err->code) : "kernel_bridge_closed",
                 err ? err->msg : "the kernel bridge closed this connection (the kernel is gone)");
    if (w->c) {
        w->c->owner = NULL;
        conn_free(w->c, true);
        w->c = NULL;
    }
    close_with(w, 1011, "the kernel's connection ended");
}

static const struct klink_cb k_cb = {
    .started = k_started,
    .line = k_line,
    .done = k_done,
};

static struct klink_opts k_opts(const struct jws *w)
{
    struct klink_opts o = {.max_line = w->srv->cfg->jup_max_msg};
    return o;
}

/* Read the connector w->c took over on from where its last client stopped. */
static void start_output(struct jws *w)
{
    struct klink_opts o = k_opts(w);
    struct sbx_err err;

    if (klink_read(w->srv->t, w->srv->loop, w->sbx, w->c->pid, w->c->delivered, &o, &k_cb, w,
                   &w->kl, &err)) {
        notice_error(w, sbx_err_name(err.code), err.msg);
        w->c->owner = NULL;
        conn_free(w->c, true);
        w->c = NULL;
        close_with(w, 1011, "cannot read the kernel's connection");
        return;
    }
    in_pump(w);
}

/* ----------------------------------------------------------------- input */

static void in_push(struct jws *w, const char *s, size_t n, bool first)
{
    struct jin *i = malloc(sizeof(*i) + n);

    if (!i) {
        close_with(w, 1011, "out of memory");
        return;
    }
    i->len = n;
    i->off = 0;
    memcpy(i->data, s, n);
    if (first) {
        i->next = w->iq;
        w->iq = i;
        if (!w->iq_tail)
            w->iq_tail = i;
    } else {
        i->next = NULL;
        if (w->iq_tail)
            w->iq_tail->next = i;
        else
            w->iq = i;
        w->iq_tail = i;
    }
    w->iq_bytes += n;
    if (w->iq_bytes >= w->srv->cfg->jup_in_queue && !w->rx_paused) {
        w->rx_paused = true;
        lws_rx_flow_control(w->wsi, 0);
    }
}

static void on_in_done_json(void *user, const struct sbx_err *err, json_t *body)
{
    struct jws *w = user;

    json_decref(body);
    w->in_live = false;
    if (err) {
        notice_error(w, sbx_err_name(err->code), err->msg);
        close_with(w, 1011, "cannot write to the kernel's connection");
        return;
    }
    in_pump(w);
}
SBX_JSON_DONE(on_in_done, on_in_done_json)

static const struct sbx_sink in_sink = {.done = on_in_done};

/* The next piece of the oldest waiting message to the connector's stdin. */
static void in_pump(struct jws *w)
{
    struct jin *i = w->iq;
    struct sbx_proc_ctl c = {0};
    struct sbx_err err;

    while (i && i->off == i->len) {
        if (!(w->iq = i->next))
            w->iq_tail = NULL;
        w->iq_bytes -= i->len;
        free(i);
        i = w->iq;
    }
    if (w->rx_paused && w->iq_bytes < w->srv->cfg->jup_in_queue / 2) {
        w->rx_paused = false;
        lws_rx_flow_control(w->wsi, 1);
    }
    if (!i || w->in_live || !w->c || !w->kl || w->closing)
        return;
    c.data = i->data + i->off;
    c.len = i->len - i->off;
    if (c.len > SBX_PROC_STDIN_MAX)
        c.len = SBX_PROC_STDIN_MAX;
    if (sbx_proc_ctl(w->srv->t, w->sbx, w->c->pid, &c, &in_sink, w, &w->in_op, &err)) {
        notice_error(w, sbx_err_name(err.code), err.msg);
        close_with(w, 1011, "cannot write to the kernel's connection");
        return;
    }
    i->off += c.len;
    w->in_live = true;
}

/* ------------------------------------------------------------- start */

static void start_new(struct jws *w)
{
    struct klink_opts o = k_opts(w);
    struct sbx_err err;
    json_t *req = json_pack("{s:s}", "op", "channels");

    if (!req || klink_request(w->srv->t, w->srv->loop, w->sbx, req, &o, &k_cb, w, &w->kl, &err)) {
        notice_error(w, req ? sbx_err_name(err.code) : "internal", req ? err.msg : "out of memory");
        close_with(w, 1011, "cannot start the kernel's connector");
    }
    json_decref(req);
}

/* The offset recorded for a connector of an earlier warrend: 0 and *off, or -1. */
static int saved_offset(struct http_server *srv, const char *sbx, uint32_t pid, uint64_t *off)
{
    char path[4096], b[32];
    ssize_t n;
    int fd;

    snprintf(path, sizeof(path), "%s/jupyter/%s.%" PRIu32, srv->cfg->state_dir, sbx, pid);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -1;
    n = read(fd, b, sizeof(b) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    b[n] = '\0';
    *off = strtoull(b, NULL, 10);
    return 0;
}

static bool known_pid(const char *sbx, uint32_t pid)
{
    for (struct jconn *c = conns; c; c = c->next)
        if (c->pid == pid && !strcmp(c->sbx, sbx))
            return true;
    return false;
}

/* The sandbox's processes: a connector of an earlier warrend, with its offset file, is
 * taken over; otherwise a new one starts. */
static void on_listed_json(void *user, const struct sbx_err *err, json_t *body)
{
    struct jws *w = user;
    json_t *pr;
    size_t i;

    w->start_live = false;
    w->adopting = false;
    json_array_foreach(err ? NULL : json_object_get(body, "processes"), i, pr)
    {
        json_t *tag = json_object_get(pr, "tag");
        uint32_t pid = (uint32_t)json_integer_value(json_object_get(pr, "pid"));
        uint64_t off;

        /* klink tags its connectors "kernel"; a channels one has an offset file. */
        if (!json_is_string(tag) || strcmp(json_string_value(tag), "kernel") ||
            !json_is_true(json_object_get(pr, "running")) || !pid || known_pid(w->sbx, pid) ||
            saved_offset(w->srv, w->sbx, pid, &off))
            continue;
        if (!(w->c = conn_new(w->srv, w->sbx, pid, off)))
            break;
        w->c->owner = w;
        LOG(LOG_INFO, "%s: Jupyter connector %" PRIu32 " taken over from offset %" PRIu64, w->sbx,
            pid, off);
        json_decref(body);
        start_output(w);
        return;
    }
    json_decref(body);
    start_new(w);
}
SBX_JSON_DONE(on_listed, on_listed_json)

static const struct sbx_sink list_sink = {.done = on_listed};

static void start(struct jws *w);

static void on_resumed_json(void *user, const struct sbx_err *err, json_t *body)
{
    struct jws *w = user;

    json_decref(body);
    w->start_live = false;
    if (err) {
        notice_error(w, sbx_err_name(err->code), err->msg);
        close_with(w, 1011, "the kernel's sandbox did not come back");
        return;
    }
    start(w);
}
SBX_JSON_DONE(on_resumed, on_resumed_json)

static const struct sbx_sink resume_sink = {.done = on_resumed};

static void start(struct jws *w)
{
    struct sbx_err err;
    json_t *out = NULL;

    if (sbx_coming_back(w->srv->t, w->sbx)) {
        if (sbx_resume(w->srv->t, w->sbx, &resume_sink, w, &w->start_op, &out, &err)) {
            notice_error(w, sbx_err_name(err.code), err.msg);
            close_with(w, 1011, "the kernel's sandbox did not come back");
            return;
        }
        if (!out) {
            w->start_live = true;
            return;
        }
        json_decref(out);
    }
    /* A connector a dropped socket left: its output is read on where that client stopped. */
    for (struct jconn *c = conns; c; c = c->next) {
        if (!c->owner && !strcmp(c->sbx, w->sbx)) {
            w->c = c;
            c->owner = w;
            LOG(LOG_DEBUG, "%s: Jupyter connector %" PRIu32 " reused from offset %" PRIu64, w->sbx,
                c->pid, c->delivered);
            start_output(w);
            return;
        }
    }
    if (sbx_proc_list(w->srv->t, w->sbx, 0, &list_sink, w, &w->start_op, &err)) {
        start_new(w);
        return;
    }
    w->start_live = true;
    w->adopting = true;
}

/* ------------------------------------------------------------ the socket */

static int on_receive(struct jws *w, const void *in, size_t len)
{
    const unsigned char *msg;
    const char *why;
    char *line;
    size_t n, ln;
    int rc;

    rc = ws_rx_add(&w->rx, in, len, lws_is_first_fragment(w->wsi), lws_is_final_fragment(w->wsi),
                   lws_remaining_packet_payload(w->wsi), w->srv->cfg->jup_max_msg, &msg, &n);
    if (rc == -EMSGSIZE) {
        lws_close_reason(w->wsi, 1009,
                         (unsigned char *)"message larger than jupyter_max_message_bytes", 45);
        return -1;
    }
    if (rc < 0)
        return -1;
    if (rc == WS_RX_MORE)
        return 0;
    if (lws_frame_is_binary(w->wsi)) {
        notice_error(w, "bad_request",
                     "binary frames (messages with buffers) are not taken: send JSON text frames");
    } else if (jup_frame_line((const char *)msg, n, &line, &ln, &why)) {
        notice_error(w, "bad_request", why);
    } else {
        in_push(w, line, ln, false);
        free(line);
        in_pump(w);
    }
    if (w->rx.cap > 65536)
        ws_rx_free(&w->rx);
    return 0;
}

static int on_writeable(struct jws *w)
{
    struct jout *o = w->oq;

    if (o) {
        int rc = 0;
        if (!(w->oq = o->next))
            w->oq_tail = NULL;
        w->oq_bytes -= o->len;
        if (lws_write(w->wsi, o->mem + LWS_PRE, o->len, LWS_WRITE_TEXT) < (int)o->len)
            rc = -1;
        else if (o->end && w->c) {
            w->c->delivered = o->end;
            conn_save(w->c);
        }
        free(o);
        if (rc)
            return rc;
    }
    if (w->holding && w->oq_bytes <= w->srv->cfg->jup_send_queue / 2) {
        w->holding = false;
        if (w->kl)
            klink_resume(w->kl);
    }
    if (w->oq) {
        want_write(w);
        return 0;
    }
    if (w->closing) {
        const char *why = w->close_why ? w->close_why : "done";
        lws_close_reason(w->wsi, (enum lws_close_status)(w->close_code ? w->close_code : 1000),
                         (unsigned char *)why, strlen(why));
        return -1;
    }
    return 0;
}

static int on_filter(struct http_server *srv, struct lws *wsi, void **slot)
{
    struct jws *w;
    struct api_err e;

    if (!(w = calloc(1, sizeof(*w))))
        return -1;
    if (check_upgrade(srv, wsi, w->kernel, w->sbx, &e)) {
        LOG(LOG_DEBUG, "Jupyter channels socket refused at bind: %s", e.msg);
        free(w);
        return -1;
    }
    w->srv = srv;
    w->wsi = wsi;
    *slot = w;
    return 0;
}

static void on_closed(struct jws *w)
{
    if (w->start_live)
        sbx_op_cancel(w->srv->t, w->start_op);
    if (w->kl)
        klink_cancel(w->kl);
    if (w->in_live)
        sbx_op_cancel(w->srv->t, w->in_op);
    if (w->c) {
        /* Half a message in its stdin would spoil the next client's first: not reused. */
        bool torn = w->iq && w->iq->off > 0 && w->iq->off < w->iq->len;
        if (torn) {
            w->c->owner = NULL;
            conn_kill(w->c);
        } else {
            w->c->owner = NULL;
        }
    }
    while (w->iq) {
        struct jin *i = w->iq;
        w->iq = i->next;
        free(i);
    }
    while (w->oq) {
        struct jout *o = w->oq;
        w->oq = o->next;
        free(o);
    }
    ws_rx_free(&w->rx);
    LOG(LOG_DEBUG, "%s: Jupyter channels socket closed", w->sbx);
    free(w);
}

int jup_ws_cb(struct lws *wsi, int reason, void **slot, void *in, size_t len)
{
    struct http_server *srv = lws_context_user(lws_get_context(wsi));
    struct jws *w = *slot;

    switch (reason) {
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        return w ? -1 : on_filter(srv, wsi, slot);
    case LWS_CALLBACK_ESTABLISHED:
        if (!w)
            return -1;
        http_conn_upgraded(wsi);
        w->live = true;
        conns_sweep(srv);
        start(w);
        return 0;
    case LWS_CALLBACK_RECEIVE:
        return w && w->live ? on_receive(w, in, len) : -1;
    case LWS_CALLBACK_SERVER_WRITEABLE:
        return w && w->live ? on_writeable(w) : 0;
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
        return http_ws_peer_close(wsi, in, len);
    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_WS_SERVER_DROP_PROTOCOL:
        if (w) {
            *slot = NULL;
            on_closed(w);
        }
        return 0;
    default:
        return 0;
    }
}
