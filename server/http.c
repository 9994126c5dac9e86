/*
 * http.c - the REST API on libwebsockets 4.1 (h1), on the app's libev loop:
 * the lws glue (context, vhost, the protocols list, connections and their
 * caps, the callback), and warrend's own listener, which sends a
 * connection whose first request is for a sandbox port to the port proxy
 * (ports.h) and every other one to lws. The REST router and handlers are
 * in rest.c, the response writer and NDJSON encoder in resp.c (shared:
 * http_int.h).
 *
 * One lws protocol serves every route. lws owns the per-transaction state
 * (struct pss); lws frees and re-zeroes it when a keep-alive transaction
 * completes (HTTP_DROP_PROTOCOL) or the connection closes (CLOSED_HTTP),
 * and rest_req_end() runs on both: it cancels an operation still in flight.
 * The sandbox table calls back with the pss as its sink's user pointer;
 * since a cancelled operation never calls back (sbx.h), no event reaches a
 * pss after rest_req_end, and none reaches freed memory.
 *
 * Output: every byte goes out from HTTP_WRITEABLE, one lws_write per
 * callback, at most WRITE_MAX bytes, from a per-request queue of buffers
 * that carry LWS_PRE headroom. Streamed data is acknowledged to the table
 * (sbx_op_consumed, which returns credit to the guest) only once written,
 * and withheld while the queue is above HIGH_WATER until it drains to
 * LOW_WATER, so memory per request stays bounded whatever the guest does.
 *
 * Input: JSON bodies are collected up to max_json_body_bytes. Uploads are
 * fed to sbx_op_write as lws hands them over; what it does not take waits
 * in one pending buffer while reading is paused (lws_rx_flow_control) until
 * sink->writable, so a 1 GiB upload needs one read buffer of memory.
 *
 * lws 4.1.6 facts this file depends on (read in its source):
 * - it chunk-encodes only when its compression is on (Debian builds it
 *   without), and LWS_ILLEGAL_HTTP_CONTENT_LEN makes it send
 *   "connection: close"; so NDJSON is chunk-encoded here, by hand;
 * - after the headers it arms PENDING_TIMEOUT_HTTP_CONTENT (timeout_secs)
 *   and re-arms it after each body chunk; an answer that takes longer
 *   (a create under TCG, a long exec) must clear it;
 * - a POST/PUT without Content-Length is read as a 100 MiB body, and
 *   chunked request bodies are not decoded: they reach HTTP_BODY raw, chunk
 *   framing included. So chunked bodies are decoded here (chunked.c); lws
 *   still counts down its 100 MiB, so the connection is closed after such a
 *   request (the next request's bytes would be read as body), and a chunked
 *   body longer than 100 MiB on the wire is cut off by closing;
 * - Content-Length wins over Transfer-Encoding in lws: a request with both
 *   is refused here (400, closed), since a proxy in front may frame it the
 *   other way (request smuggling);
 * - it never answers "Expect: 100-continue" itself;
 * - a POST with an explicit "Content-Length: 0" gets HTTP_BODY_COMPLETION at
 *   once, with a pending timeout still armed that closes the connection 30 s
 *   later, answered or not: rest_body_done clears it;
 * - SERVER_NEW_CLIENT_INSTANTIATED and WSI_DESTROY go to protocols[0] with
 *   `user` not a pss: a connection counted at accept (on_accept, warrend's
 *   own listener) rides on the wsi's opaque user data from there (adoption
 *   resets it after WSI_CREATE);
 * - lws_adopt_socket_vhost_readbuf loops forever on a request whose body
 *   came with its head (seen with a POST): the first head is only peeked
 *   (MSG_PEEK) before a connection is handed to lws, never read;
 * - its timeouts (lws_set_timeout, timeout_secs_ah_idle) live on a timer
 *   list that its libev plugin reschedules only after I/O, so one set while
 *   an earlier-armed, later deadline is pending can fire long after its time:
 *   the header deadline and the stall deadline are ev_timers of our own;
 * - lws_close_free_wsi first flushes what lws still buffers for the socket,
 *   for up to 5 s on such a timer: a deliberate drop shuts the socket down
 *   first, so the flush fails at once.
 */
#include "http_int.h"
#include "fanout.h"
#include "peers_dns.h"
#include "jupyter.h"
#include "ports.h"
#include "ports_head.h"
#include "ws_rx.h"
#include "ws_session.h"
#include "ws_pty.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

/* Bytes of a connection's first request read before it is routed: a head that is not
 * complete within this is not a port request and goes to lws (which caps heads lower). */
#define PRE_MAX      8192
#define PEEK_AGAIN_S 0.005
#define PEEK_MAX_S   0.25
/* The longest request line passed to lws: it keeps the line with the header values in
 * one 4 KiB table, and drops a connection that overflows it without an answer. */
#define LINE_MAX_BYTES 3072

/* Open connections from one address (IPv4 as v4-mapped IPv6). */
struct client {
    struct client *next;
    unsigned char addr[16];
    unsigned n;
};

/* One open connection, from accept to WSI_DESTROY (the wsi's opaque user data). */
struct conn {
    struct http_server *srv;
    struct client *cl;
    struct lws *wsi;
    ev_timer deadline; /* the next request's headers must be complete by then */
    /* Before routing (wsi NULL): the first head being read by warrend itself. */
    struct conn *pnext, **pprev; /* srv->pre */
    ev_io rd;
    ev_timer repeek; /* an undecided head is peeked again */
    double peek_s;   /* after this long (doubling: a trickling client costs little) */
    int fd;
    char *buf;
    size_t n;
};

/* ----------------------------------------------------- connection caps */

static size_t client_slot(const unsigned char *a)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (int i = 0; i < 16; i++)
        h = (h ^ a[i]) * 0x100000001b3ull;
    return (size_t)(h % CLIENT_BUCKETS);
}

static void client_addr(const struct sockaddr_storage *ss, unsigned char a[16])
{
    memset(a, 0, 16);
    if (ss->ss_family == AF_INET6) {
        memcpy(a, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
    } else if (ss->ss_family == AF_INET) {
        a[10] = a[11] = 0xff;
        memcpy(a + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    }
}

static void client_put(struct http_server *srv, struct client *c)
{
    struct client **pp;

    if (--c->n)
        return;
    for (pp = &srv->clients[client_slot(c->addr)]; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    free(c);
}

static const char *status_text(int status)
{
    switch (status) {
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 414:
        return "URI Too Long";
    case 429:
        return "Too Many Requests";
    case 500:
        return "Internal Server Error";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    default:
        return status >= 500 ? "Error" : "Bad Request";
    }
}

/* Answer a connection refused by a cap, best effort: the socket is fresh, so a short
 * answer fits its buffer. What the client sent already is read first, so closing does
 * not turn into a reset that could destroy the answer before the client reads it. */
static void refuse(int fd, int status, const char *code, const char *msg)
{
    char body[256], buf[512], junk[4096];
    int bl, n;

    bl = snprintf(body, sizeof(body), "{\"error\":{\"code\":\"%s\",\"message\":\"%s\"}}\n", code,
                  msg);
    n = snprintf(buf, sizeof(buf),
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                 "Connection: close\r\n\r\n%s",
                 status, status_text(status), bl, body);
    for (int i = 0; i < 4 && recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0; i++)
        ;
    if (send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return;
    shutdown(fd, SHUT_WR);
}

static void on_repeek(struct ev_loop *loop, ev_timer *w, int revents);

static bool is_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* The first request line as lws would mishandle it: one too long for its header table,
 * a malformed %-escape (its HTML 403) or a %00 (closed, no answer) in the target. These
 * get the JSON error every other bad request gets. 0: it may go to lws; 1: refused here
 * (answered; the caller frees the connection); -1: the line is not complete yet. */
static int line_check(const char *b, size_t n, int fd)
{
    const char *eol = memchr(b, '\n', n), *t, *end;
    size_t len = eol ? (size_t)(eol - b) : n;

    if (len > LINE_MAX_BYTES) {
        refuse(fd, 414, "uri_too_long", "the request line is longer than 3072 bytes");
        return 1;
    }
    if (!eol)
        return -1;
    if (!(t = memchr(b, ' ', len)))
        return 0; /* not HTTP: lws's to judge */
    t++;
    if (!(end = memchr(t, ' ', (size_t)(eol - t))))
        end = eol;
    for (; t < end; t++) {
        if (*t != '%')
            continue;
        if (end - t < 3 || !is_hex(t[1]) || !is_hex(t[2])) {
            refuse(fd, 400, "bad_request", "malformed percent-encoding in the request target");
            return 1;
        }
        if (t[1] == '0' && t[2] == '0') {
            refuse(fd, 400, "bad_request", "a NUL byte (%00) in the request target");
            return 1;
        }
    }
    return 0;
}

/* Leave the pre-routing list and its watcher (the fd and buffer stay). */
static void pre_unlink(struct conn *cn)
{
    if (!cn->pprev)
        return;
    ev_io_stop(cn->srv->loop, &cn->rd);
    *cn->pprev = cn->pnext;
    if (cn->pnext)
        cn->pnext->pprev = cn->pprev;
    cn->pprev = NULL;
}

static void conn_free(struct conn *cn)
{
    if (cn->pprev) {
        pre_unlink(cn);
        close(cn->fd);
    }
    free(cn->buf);
    ev_timer_stop(cn->srv->loop, &cn->repeek);
    ev_timer_stop(cn->srv->loop, &cn->deadline);
    cn->srv->conns--;
    client_put(cn->srv, cn->cl);
    free(cn);
}

/* A connection sent no complete request head in time (slow-loris, or idle): close it.
 * An ev_timer of ours rather than lws's timeouts, which its libev plugin can fire late
 * (it reschedules its wheel only after I/O: a silent peer outlived a 2 s deadline by
 * 10 s and more). Not inside an lws callback, so closing at once is allowed. */
static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *cn = (struct conn *)((char *)w - offsetof(struct conn, deadline));
    struct lws *wsi = cn->wsi;

    ev_timer_stop(loop, w);
    if (!wsi) { /* still being read by warrend (pre-routing) */
        LOG(LOG_DEBUG, "closing a connection that sent no complete request in time");
        conn_free(cn);
        return;
    }
    LOG(LOG_DEBUG, "closing a connection that sent no complete request in time");
    shutdown(lws_get_socket_fd(wsi), SHUT_RDWR);
    lws_set_timeout(wsi, PENDING_TIMEOUT_HOLDING_AH, LWS_TO_KILL_SYNC);
}

/* A new connection: count it, or refuse it past max_connections or
 * max_connections_per_client. Nonzero refuses (lws closes the fd).
 * Past max_connections an address that holds fewer than CONN_FAIR connections is still
 * let in, up to a reserve of max_connections / 16 + 16 more: a flood spread over many
 * addresses then fills the cap without locking out a client that holds few (seen with
 * load/slow_clients.py: 5000 peers from 50 addresses left a well-behaved client 503 in
 * 5 of 7 probes). */
static int conn_filter(struct http_server *srv, int fd, const struct sockaddr_storage *ss,
                       struct conn **out)
{
    unsigned char a[16];
    struct client *c;
    struct conn *cn;
    size_t s;

    client_addr(ss, a);
    s = client_slot(a);
    for (c = srv->clients[s]; c && memcmp(c->addr, a, 16); c = c->next)
        ;
    if (srv->conns >= srv->fd_conns ||
        (srv->conns >= srv->cfg->max_connections &&
         ((c && c->n >= CONN_FAIR) ||
          srv->conns >= srv->cfg->max_connections + srv->cfg->max_connections / 16 + 16))) {
        refuse(fd, 503, "too_many_connections",
               "the server has too many open connections; retry later");
        return 1;
    }
    if (c && c->n >= srv->cfg->max_conn_per_client) {
        refuse(fd, 429, "too_many_connections",
               "too many open connections from this address; close some and retry");
        return 1;
    }
    if (!(cn = calloc(1, sizeof(*cn))))
        return 1;
    if (!c) {
        if (!(c = calloc(1, sizeof(*c)))) {
            free(cn);
            return 1;
        }
        memcpy(c->addr, a, 16);
        c->next = srv->clients[s];
        srv->clients[s] = c;
    }
    c->n++;
    srv->conns++;
    cn->srv = srv;
    cn->cl = c;
    cn->fd = fd;
    ev_init(&cn->deadline, on_deadline);
    ev_init(&cn->repeek, on_repeek);
    *out = cn;
    return 0;
}

/* Hand a connection to lws, which reads its first head itself (only peeked so far). */
static void pre_to_lws(struct conn *cn)
{
    struct http_server *srv = cn->srv;
    int fd = cn->fd;

    pre_unlink(cn);
    ev_timer_stop(srv->loop, &cn->repeek);
    free(cn->buf);
    cn->buf = NULL;
    if (srv->accepted) {
        /* The last one handed over never became a wsi (lws failed to adopt it). */
        conn_free(srv->accepted);
        srv->accepted = NULL;
    }
    srv->accepted = cn;
    /* On failure lws closes the fd itself. */
    lws_adopt_socket_vhost(srv->vh, fd);
    if (srv->accepted == cn) { /* not instantiated */
        srv->accepted = NULL;
        cn->fd = -1;
        conn_free(cn);
    }
}

/* Peek again later: the head is neither complete nor decided yet. */
static void peek_later(struct conn *cn)
{
    ev_io_stop(cn->srv->loop, &cn->rd);
    cn->peek_s = cn->peek_s ? cn->peek_s * 2 : PEEK_AGAIN_S;
    if (cn->peek_s > PEEK_MAX_S)
        cn->peek_s = PEEK_MAX_S;
    ev_timer_set(&cn->repeek, cn->peek_s, 0);
    ev_timer_start(cn->srv->loop, &cn->repeek);
}

/* A head for lws, once its request line passed line_check. */
static void to_lws(struct conn *cn)
{
    int r = line_check(cn->buf, cn->n, cn->fd);

    if (r > 0)
        conn_free(cn);
    else if (r < 0)
        peek_later(cn);
    else
        pre_to_lws(cn);
}

/*
 * Look at the first head without taking it (MSG_PEEK): a connection that is not for
 * a sandbox port goes to lws untouched, which reads it as it always has (lws 4.1.6's
 * readbuf adoption loops on a request whose body came with the head). Level-triggered
 * readiness cannot wait for "more than what is there", so a head that is neither
 * complete nor decided yet is peeked again after PEEK_AGAIN_S, doubling up to
 * PEEK_MAX_S (a head that arrives in pieces is usually whole within a few ms; a
 * client trickling on purpose costs 4 peeks a second); the header deadline bounds it.
 */
static void pre_check(struct conn *cn)
{
    struct http_server *srv = cn->srv;
    struct ports_head h;
    struct ports_dest d;
    ssize_t r;
    int hl, route;

    r = recv(cn->fd, cn->buf, PRE_MAX, MSG_PEEK);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (r <= 0) {
        conn_free(cn);
        return;
    }
    cn->n = (size_t)r;
    hl = ports_head_parse(cn->buf, cn->n, PRE_MAX, &h);
    if (hl == 0) {
        if (!ports_head_maybe(cn->buf, cn->n, srv->cfg->port_domain))
            to_lws(cn);
        else
            peek_later(cn);
        return;
    }
    route = hl > 0 ? ports_route(&h, srv->cfg->port_domain, &d) : PORTS_NOT;
    /* E2B's envd and code interpreter ports by Host are warrend's own door (envd.c),
     * served by lws like the API, never proxied into the guest. */
    if (route == PORTS_HOST && (d.port == ENVD_PORT || d.port == ENVD_CI_PORT))
        route = PORTS_NOT;
    if (route == PORTS_NOT) {
        to_lws(cn);
        return;
    }
    /* A port request: take what was peeked (it is still there), then the proxy owns
     * the fd and the buffer; the connection stays counted until http_conn_release. */
    if (recv(cn->fd, cn->buf, cn->n, 0) != r) {
        conn_free(cn);
        return;
    }
    pre_unlink(cn);
    ev_timer_stop(srv->loop, &cn->deadline);
    ev_timer_stop(srv->loop, &cn->repeek);
    {
        int fd = cn->fd;
        char *buf = cn->buf;
        size_t n = cn->n;
        cn->buf = NULL;
        cn->fd = -1;
        ports_take(srv->ports, fd, buf, n, PRE_MAX, &h, route, &d, cn);
    }
}

static void on_pre_read(struct ev_loop *loop, ev_io *w, int revents)
{
    (void)loop;
    (void)revents;
    pre_check((struct conn *)((char *)w - offsetof(struct conn, rd)));
}

static void on_repeek(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *cn = (struct conn *)((char *)w - offsetof(struct conn, repeek));

    (void)revents;
    ev_io_start(loop, &cn->rd); /* fires at once: bytes are waiting */
}

void http_conn_release(void *ud)
{
    conn_free(ud);
}

/* New connections on warrend's listener: counted and capped, then read until
 * their first head says where they go. */
static void on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    struct http_server *srv = (struct http_server *)((char *)w - offsetof(struct http_server, lw));

    (void)revents;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        struct conn *cn = NULL;
        int fd = accept4(srv->lfd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE)
                LOG(LOG_WARN, "accept: %s", strerror(errno));
            return;
        }
        /* lws sets this on the sockets it accepts, not on the ones we hand it. Without it
         * a response written in two parts (head, then body; or two WebSocket frames)
         * waits for the client's delayed ACK of the first: 40 ms a request on a
         * keep-alive connection (measured, load/RESULTS.md). */
        if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)
            (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
        if (conn_filter(srv, fd, &ss, &cn) != 0) {
            close(fd);
            continue;
        }
        if (!(cn->buf = malloc(PRE_MAX))) {
            cn->fd = -1;
            close(fd);
            conn_free(cn);
            continue;
        }
        cn->pnext = srv->pre;
        if (srv->pre)
            srv->pre->pprev = &cn->pnext;
        srv->pre = cn;
        cn->pprev = &srv->pre;
        ev_io_init(&cn->rd, on_pre_read, fd, EV_READ);
        ev_io_start(loop, &cn->rd);
        cn->deadline.repeat = srv->cfg->header_timeout_s;
        ev_timer_again(loop, &cn->deadline);
    }
}

/* Arm (or stop, s == 0) the connection's header deadline. */
static void conn_deadline(struct lws *wsi, unsigned s)
{
    struct conn *cn = lws_get_opaque_user_data(wsi);

    if (!cn)
        return;
    if (!s) {
        ev_timer_stop(cn->srv->loop, &cn->deadline);
        return;
    }
    cn->deadline.repeat = s;
    ev_timer_again(cn->srv->loop, &cn->deadline);
}

void http_conn_upgraded(struct lws *wsi)
{
    conn_deadline(wsi, 0);
}

static int http_cb(struct lws *wsi, enum lws_callback_reasons reason, void *user, void *in,
                   size_t len)
{
    struct pss *p = user;
    /* The one server of this context (http_start sets it as the context's user). */
    struct http_server *srv = wsi ? lws_context_user(lws_get_context(wsi)) : NULL;

    if (!srv)
        return 0; /* not one of ours (lws calls some reasons without a wsi) */
    switch (reason) {
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        /* The filter's fd, adopted (lws_adopt_descriptor_vhost2). Not at WSI_CREATE:
         * adoption sets the opaque user data to NULL after that. */
        if (srv->accepted) {
            srv->accepted->wsi = wsi;
            lws_set_opaque_user_data(wsi, srv->accepted);
            srv->accepted = NULL;
            /* Its header deadline has run since accept: it is not restarted. */
        }
        return 0;
    case LWS_CALLBACK_WSI_DESTROY: {
        struct conn *cn = lws_get_opaque_user_data(wsi);
        if (cn) {
            lws_set_opaque_user_data(wsi, NULL);
            conn_free(cn);
        }
        return 0;
    }
    case LWS_CALLBACK_HTTP:
        conn_deadline(wsi, 0); /* the head is complete */
        rest_req_end(p);
        memset(p, 0, sizeof(*p));
        ev_init(&p->stall, resp_on_stall);
        p->wsi = wsi;
        p->srv = srv;
        rest_request(p, in);
        /* Answers can take a while (a boot under TCG, a long exec): lws must not
         * time the request out. While a body we want is read, lws keeps its own
         * per-chunk timeout. */
        if (p->status ||
            !((p->upload && http_phase_op_live(p->phase)) || http_phase_collecting(p->phase)))
            lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
        return 0;
    case LWS_CALLBACK_HTTP_BODY:
        return p && p->srv ? rest_body(p, in, len) : 0;
    case LWS_CALLBACK_HTTP_BODY_COMPLETION:
        if (p && p->srv && p->te_chunked) {
            if (p->te_done)
                return 0;
            /* lws read its 100 MiB without the body ending: it would parse what follows
             * as a new request. Nothing sane can be answered: close. */
            LOG(LOG_WARN,
                "%s: chunked request body longer than 100 MiB: closing (send a "
                "Content-Length for bigger uploads)",
                p->sbx);
            return -1;
        }
        return p && p->srv ? rest_body_done(p) : 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return p && p->srv ? resp_writeable(p) : 0;
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        /* Answered, kept alive: the next request may idle for the keep-alive time, then
         * its head must be complete within the header deadline. */
        conn_deadline(wsi, KEEPALIVE_S + srv->cfg->header_timeout_s);
        if (p)
            rest_req_end(p);
        return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
        if (p)
            rest_req_end(p);
        return 0;
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE: {
        /* The head is complete: the header deadline must not close the socket later.
         * WebSocket routes are checked (auth, limits) before the upgrade. */
        int rc;
        conn_deadline(wsi, 0);
        if (ws_pty_route(wsi))
            rc = ws_pty_confirm(srv, wsi);
        else if (jup_ws_route(wsi))
            rc = jup_ws_confirm(srv, wsi);
        else if ((rc = ws_session_confirm(wsi)) == WS_NOT_MINE)
            return -1; /* no other WebSocket or h2c here: hang up rather than half-serve */
        if (rc == 1)   /* refused with an answer: whatever lws does next is on a deadline */
            conn_deadline(wsi, KEEPALIVE_S + srv->cfg->header_timeout_s);
        return rc;
    }
    /* Jupyter's channels socket offers no subprotocol, so lws binds it to this
     * protocol: its WebSocket reasons go to jupyter_ws.c, its state in p->jws. */
    case LWS_CALLBACK_FILTER_PROTOCOL_CONNECTION:
        return p && jup_ws_route(wsi) ? jup_ws_cb(wsi, (int)reason, &p->jws, in, len) : -1;
    case LWS_CALLBACK_ADD_HEADERS:
        return p && p->jws ? http_ws_add_headers(wsi, in) : 0;
    case LWS_CALLBACK_ESTABLISHED:
    case LWS_CALLBACK_RECEIVE:
        return p && p->jws ? jup_ws_cb(wsi, (int)reason, &p->jws, in, len) : -1;
    case LWS_CALLBACK_SERVER_WRITEABLE:
    case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
    case LWS_CALLBACK_CLOSED:
    case LWS_CALLBACK_WS_SERVER_DROP_PROTOCOL:
        return p && p->jws ? jup_ws_cb(wsi, (int)reason, &p->jws, in, len) : 0;
    default:
        return 0;
    }
}

/* ----------------------------------------------- the WebSocket doors */

int http_ws_add_headers(struct lws *wsi, void *in)
{
    const struct http_server *srv = lws_context_user(lws_get_context(wsi));
    struct lws_process_html_args *a = in;
    const char *h = srv ? srv->cfg->host_id : NULL;

    /* lws reads back only a->p, moved past what was written. */
    if (!h || !a)
        return 0;
    return lws_add_http_header_by_name(
               wsi, (const unsigned char *)"x-warren-host:", (const unsigned char *)h,
               (int)strlen(h), (unsigned char **)&a->p, (unsigned char *)a->p + a->max_len)
               ? -1
               : 0;
}

/* Written raw: at CONFIRM_UPGRADE lws has not recorded the request's version yet, so
 * its header helpers write "HTTP/1.0", which WebSocket clients (Python's websockets)
 * refuse to read. */
int http_ws_refuse(struct lws *wsi, const struct api_err *e)
{
    json_t *j = api_error(e->code, "%s", e->msg);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    unsigned char *buf = NULL;
    size_t cap;
    int n, rc = -1;

    json_decref(j);
    LOG(LOG_DEBUG, "WebSocket upgrade refused: %d %s: %s", e->status, e->code, e->msg);
    if (!body)
        return -1;
    cap = strlen(body) + 256;
    if (!(buf = malloc(LWS_PRE + cap)))
        goto out;
    n = snprintf((char *)buf + LWS_PRE, cap,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n%s\n",
                 e->status, status_text(e->status), strlen(body) + 1, body);
    if (n > 0 && (size_t)n < cap &&
        lws_write(wsi, buf + LWS_PRE, (size_t)n, LWS_WRITE_HTTP_FINAL) == n)
        rc = 1;
out:
    free(buf);
    free(body);
    return rc;
}

int http_ws_sandbox_open(struct http_server *srv, const char *sbx, struct api_err *e)
{
    struct sbx_err err;
    struct sbx_rec rec;

    if (sbx_get(srv->t, sbx, &rec, &err)) {
        *e = (struct api_err){.status = api_status_of(err.code), .code = sbx_err_name(err.code)};
        snprintf(e->msg, sizeof(e->msg), "%.200s", err.msg);
        return -1;
    }
    if (rec.ended) {
        *e =
            (struct api_err){.status = api_status_of(SBX_E_GONE), .code = sbx_err_name(SBX_E_GONE)};
        snprintf(e->msg, sizeof(e->msg), "sandbox %s has ended", sbx);
        return -1;
    }
    return 0;
}

/* lws 4.1.6 echoes a client's close payload, rewriting only some invalid codes to 1002
 * (not 5000 and up), and never checks the reason's UTF-8. A close of ours set here is
 * sent by lws as the socket closes. */
int http_ws_peer_close(struct lws *wsi, const void *in, size_t len)
{
    const char *why = NULL;
    int code = ws_close_check(in, len, &why);

    if (!code)
        return 0;
    LOG(LOG_DEBUG, "WebSocket client closed with an invalid close frame: %s", why);
    lws_close_reason(wsi, (enum lws_close_status)code, (unsigned char *)why, strlen(why));
    return -1;
}

/* Every protocol of the vhost, in one place. protocols[0] also gets the connection-level
 * callbacks (filter, adoption, WSI_DESTROY), so the HTTP one stays first; WebSocket
 * protocols (PTY, agent socket) are added after it, each with its own callback and
 * per-session struct, and find their server with lws_context_user() like http_cb.
 * Each WebSocket protocol is exported by its own file; an extern struct cannot be an
 * initializer in C, so http_start copies them in after the HTTP one. */
static const struct lws_protocols *const ws_protocols[] = {
    &ws_pty_protocol,
    &ws_session_protocol,
};
#define N_WS (sizeof(ws_protocols) / sizeof(ws_protocols[0]))
static struct lws_protocols protocols[1 + N_WS + 1] = {
    {.name = "warren-http", .callback = http_cb, .per_session_data_size = sizeof(struct pss)},
};

/* ------------------------------------------------------------ lifecycle */

static void lws_log_line(int level, const char *line)
{
    size_t n = strlen(line);

    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    LOG(level & LLL_ERR ? LOG_ERR : LOG_WARN, "lws: %.*s", (int)n, line);
}

/* Every fd warrend may hold, minus what the sandboxes themselves use, goes to
 * connections: conn_filter refuses past it. Not lws's fd_limit_per_thread: given
 * that, lws 4.1 finds the wsi of every fd event by a linear scan of its whole table
 * (wsi_from_fd, 20% of the loop with 8,000 idle sockets, load/wsbench.py) instead of
 * indexing it by fd; left alone, it sizes the table from ulimit -n (20,000 pointers)
 * and indexes it. */
static unsigned fd_limit(const struct srv_config *cfg)
{
    struct rlimit rl;
    unsigned long lim = 1024, reserve = 32 + (unsigned long)FDS_PER_SBX * cfg->max_sandboxes;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        lim = rl.rlim_cur == RLIM_INFINITY ? 65536 : rl.rlim_cur;
    return lim > reserve + 64 ? (unsigned)(lim - reserve) : 64;
}

/* warrend's listening socket on listen_addr:listen_port, watched by on_accept. 0 or -errno. */
static int listen_on(struct http_server *h, bool v6)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int one = 1, r;

    memset(&ss, 0, sizeof(ss));
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)h->cfg->listen_port);
        inet_pton(AF_INET6, h->cfg->listen_addr, &a->sin6_addr);
        sl = sizeof(*a);
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_port = htons((uint16_t)h->cfg->listen_port);
        if (inet_pton(AF_INET, h->cfg->listen_addr, &a->sin_addr) != 1)
            return -EINVAL;
        sl = sizeof(*a);
    }
    h->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (h->lfd < 0)
        return -errno;
    setsockopt(h->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(h->lfd, (struct sockaddr *)&ss, sl) != 0 || listen(h->lfd, SOMAXCONN) != 0) {
        r = -errno;
        close(h->lfd);
        h->lfd = -1;
        return r;
    }
    sl = sizeof(ss);
    if (getsockname(h->lfd, (struct sockaddr *)&ss, &sl) == 0)
        h->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                 : ((struct sockaddr_in *)&ss)->sin_port);
    ev_io_init(&h->lw, on_accept, h->lfd, EV_READ);
    ev_io_start(h->loop, &h->lw);
    return 0;
}

int http_start(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table *t,
               const char *api_key, struct http_server **out)
{
    struct lws_context_creation_info info;
    void *foreign[1] = {loop};
    struct http_server *h;
    unsigned char a6[16];
    bool v6 = inet_pton(AF_INET6, cfg->listen_addr, a6) == 1;
    int r;

    if (!cfg->http_timeout_s) {
        LOG(LOG_ERR, "http: a timeout of 0 would disable lws's timeouts");
        return -EINVAL;
    }
    h = calloc(1, sizeof(*h));
    if (!h || !(h->key = strdup(api_key))) {
        free(h);
        return -ENOMEM;
    }
    h->loop = loop;
    h->cfg = cfg;
    h->t = t;
    h->lfd = -1;
    {
        char why[256];
        if (fanout_peers_parse(cfg->peers, cfg->host_id ? cfg->host_id : "", &h->peers, why,
                               sizeof(why))) {
            LOG(LOG_ERR, "%s", why);
            free(h->key);
            free(h);
            return -EINVAL;
        }
        if (cfg->peers_dns && cfg->peers_dns[0] &&
            (r = peers_dns_start(loop, cfg->peers_dns, cfg->peers_dns_period_s, &h->peers,
                                 &h->peers_dns, why, sizeof(why)))) {
            LOG(LOG_ERR, "%s", why);
            fanout_peers_free(h->peers);
            free(h->key);
            free(h);
            return r;
        }
        if (fanout_peers_count(h->peers))
            LOG(LOG_INFO, "fleet: lists include %u peer host(s)", fanout_peers_count(h->peers));
    }

    /* The libev plugin logs every I/O event at NOTICE: errors and warnings only. */
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log_line);

    memset(&info, 0, sizeof(info));
    info.options = LWS_SERVER_OPTION_LIBEV | LWS_SERVER_OPTION_EXPLICIT_VHOSTS |
                   LWS_SERVER_OPTION_FAIL_UPON_UNABLE_TO_BIND |
                   (v6 ? 0 : LWS_SERVER_OPTION_DISABLE_IPV6);
    info.foreign_loops = foreign;
    info.count_threads = 1;
    info.pt_serv_buf_size = RX_BUF;
    info.timeout_secs = (unsigned)cfg->http_timeout_s;
    info.server_string = "warrend";
    info.user = h; /* lws_context_user(): how callbacks find their server */
    h->ctx = lws_create_context(&info);
    if (!h->ctx) {
        LOG(LOG_ERR, "cannot start libwebsockets on the libev loop: its libev event-lib "
                     "plugin is probably missing (Debian: apt-get install "
                     "libwebsockets-evlib-ev)");
        http_stop(h);
        return -ENOENT;
    }

    /* No listener of lws's: warrend accepts (on_accept) and hands lws the connections
     * that are not for a sandbox port, with the bytes it read. */
    info.port = CONTEXT_PORT_NO_LISTEN_SERVER;
    for (size_t i = 0; i < N_WS; i++)
        protocols[1 + i] = *ws_protocols[i];
    info.protocols = protocols;
    info.vhost_name = "warren";
    info.keepalive_timeout = KEEPALIVE_S;
    /* The header deadline: a connection that has not sent a whole request head this long
     * after it opened (or after its last answer) is closed, however it trickles. */
    info.timeout_secs_ah_idle = cfg->header_timeout_s;
    h->vh = lws_create_vhost(h->ctx, &info);
    if (!h->vh) {
        LOG(LOG_ERR, "cannot create the libwebsockets vhost");
        http_stop(h);
        return -ENOMEM;
    }
    if ((r = listen_on(h, v6)) != 0) {
        LOG(LOG_ERR, "cannot listen on %s%s%s:%u (in use, or not an address of this host)",
            v6 ? "[" : "", cfg->listen_addr, v6 ? "]" : "", cfg->listen_port);
        http_stop(h);
        return -EADDRNOTAVAIL;
    }
    if ((r = ports_new(h, &h->ports)) != 0) {
        http_stop(h);
        return r;
    }
    h->fd_conns = fd_limit(cfg);
    LOG(LOG_DEBUG, "%u fds for connections", h->fd_conns);
    *out = h;
    return 0;
}

int http_timeout_s(struct lws *wsi)
{
    const struct http_server *srv = lws_context_user(lws_get_context(wsi));

    return (int)srv->cfg->http_timeout_s;
}

unsigned http_port(const struct http_server *h)
{
    return h->port;
}

void http_stop(struct http_server *h)
{
    if (!h)
        return;
    if (h->lfd >= 0) {
        ev_io_stop(h->loop, &h->lw);
        close(h->lfd);
    }
    while (h->pre)
        conn_free(h->pre);
    ports_free(h->ports); /* its connections are released (counted in clients) */
    /* Closing every connection runs rest_req_end, which cancels what is in flight. */
    if (h->ctx)
        lws_context_destroy(h->ctx);
    peers_dns_stop(h->peers_dns);
    fanout_peers_free(h->peers);
    envd_watchers_free(h);
    if (h->accepted)
        conn_free(h->accepted);
    for (size_t i = 0; i < CLIENT_BUCKETS; i++) {
        while (h->clients[i]) {
            struct client *c = h->clients[i];
            h->clients[i] = c->next;
            free(c);
        }
    }
    free(h->scratch);
    free(h->key);
    explicit_bzero(h->token_key, sizeof(h->token_key));
    free(h);
}

void http_set_images(struct http_server *h, struct images_src *s)
{
    h->images = s;
}

void http_set_token_secret(struct http_server *h, const unsigned char *secret, size_t len)
{
    if (len != sizeof(h->token_key))
        return;
    memcpy(h->token_key, secret, len);
    h->token_key_set = true;
}
