/*
 * http.c - the REST API on libwebsockets 4.1 (h1), on the app's libev loop.
 *
 * One lws protocol serves every route. lws owns the per-transaction state
 * (struct pss); lws frees and re-zeroes it when a keep-alive transaction
 * completes (HTTP_DROP_PROTOCOL) or the connection closes (CLOSED_HTTP),
 * and req_end() runs on both: it cancels an operation still in flight.
 * The sandbox table calls back with the pss as its sink's user pointer;
 * since a cancelled operation never calls back (sbx.h), no event reaches a
 * pss after req_end, and none reaches freed memory.
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
 * - FILTER_NETWORK_CONNECTION, SERVER_NEW_CLIENT_INSTANTIATED and WSI_DESTROY
 *   go to protocols[0] with `user` not a pss (the filter's is its args):
 *   connections are counted there, each one's struct conn riding on the wsi's
 *   opaque user data (which adoption resets after WSI_CREATE);
 * - its timeouts (lws_set_timeout, timeout_secs_ah_idle) live on a timer
 *   list that its libev plugin reschedules only after I/O, so one set while
 *   an earlier-armed, later deadline is pending can fire long after its time:
 *   the header deadline and the stall deadline are ev_timers of our own;
 * - lws_close_free_wsi first flushes what lws still buffers for the socket,
 *   for up to 5 s on such a timer: a deliberate drop shuts the socket down
 *   first, so the flush fails at once.
 */
#include "http.h"

#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <time.h>
#include <arpa/inet.h>
#include <libwebsockets.h>

#include "api.h"
#include "chunked.h"
#include "config.h"
#include "log.h"
#include "sbx.h"

#define WRITE_MAX  (64 * 1024)   /* bytes per lws_write */
#define OBUF_MIN   (64 * 1024)   /* payload room of a fresh output buffer */
#define HIGH_WATER (1024 * 1024) /* queued bytes above which credit is withheld */
#define LOW_WATER  (256 * 1024)  /* ... until the queue is back down to this */
#define RX_BUF     (64 * 1024)   /* lws read size (pt_serv_buf_size) */
#define CHUNK_HDR  10            /* "%x\r\n" for a chunk below 4 GiB */
#define CHUNK_TRL  2             /* "\r\n" after each chunk */
#define HDR_ROOM   1024          /* response header block */
#ifndef HTTP_TIMEOUT_S
#define HTTP_TIMEOUT_S 30 /* lws body, header and idle-read timeouts (tests build it with 2) */
#endif
#define KEEPALIVE_S     30   /* idle keep-alive connections */
#define FDS_PER_SBX     8    /* fds a sandbox costs warrend (QMP, channel, console...) */
#define QUERY_STORE     8192 /* decoded query fragments (lws caps headers at 4 KiB) */
#define QUERY_FRAGS_MAX 64
#define CLIENT_BUCKETS  1024 /* client address -> open connections */
#define CONN_FAIR       4    /* past max_connections, an address holding fewer may still connect */
#define STALL_REASON    (PENDING_TIMEOUT_USER_REASON_BASE + 1)

enum resp {
    RESP_NONE = 0,
    RESP_JSON,     /* Content-Length JSON */
    RESP_NDJSON,   /* streamed exec output: chunked (or close-delimited for HTTP/1.0) */
    RESP_DOWNLOAD, /* file bytes with Content-Length */
};

/* One run of output bytes. Payload starts after LWS_PRE + CHUNK_HDR so a chunk
 * header fits in front when it is sealed. */
struct obuf {
    struct obuf *next;
    size_t cap;          /* payload room */
    size_t len;          /* payload bytes */
    size_t credit;       /* stream bytes to acknowledge once written */
    unsigned char *wire; /* set when sealed: first byte on the wire */
    size_t wire_len;
    size_t off; /* wire bytes already written */
    unsigned char mem[];
};

#define OB_PAYLOAD(ob) ((ob)->mem + LWS_PRE + CHUNK_HDR)

struct pss {
    struct lws *wsi;
    struct http_server *srv; /* set from LWS_CALLBACK_HTTP until req_end: the transaction is live */
    sbx_op_t op;
    bool op_live; /* started, and no done() yet */
    enum api_route_id route;
    unsigned method;
    char sbx[API_ID_MAX + 1];
    bool http10;
    bool ndjson; /* exec: client streams */

    /* chunked request body (Transfer-Encoding: chunked) */
    bool te_chunked;   /* the body is chunk-framed: decode before use */
    bool te_done;      /* its last chunk and trailer arrived */
    bool te_untimeout; /* clear the body timeout lws armed after that last chunk */
    bool te_bad;       /* its framing was malformed: the rest is ignored until closing */
    struct chunked te;

    /* streamed answer: the client must keep taking bytes */
    ev_timer stall;

    /* request body */
    bool want_body;  /* JSON body to collect */
    bool body_done;  /* every body byte has arrived (or none is coming) */
    bool dispatched; /* the body route has been started */
    char *body;
    size_t body_len, body_cap;

    /* upload */
    bool upload;
    bool rx_paused;
    bool finish_sent;
    bool in_write; /* inside sbx_op_write: no re-entry from sink->writable */
    bool kick;     /* sink->writable arrived during sbx_op_write */
    unsigned char *pend;
    size_t pend_off, pend_len, pend_cap;

    /* response */
    int status;
    enum resp kind;
    bool need_continue, continue_sent;
    bool hdrs_sent;
    bool complete;    /* the last byte is queued */
    bool close_after; /* close instead of keep-alive */
    bool linger;      /* answered: draining the rest of an upload body before closing */
    bool chunked;
    bool throttled;
    uint64_t clen;      /* Content-Length of JSON and downloads */
    uint64_t dl_queued; /* download bytes queued so far */
    struct obuf *qh, *qt;
    size_t q_bytes;        /* payload bytes queued */
    size_t credit_pending; /* written but not yet acknowledged */
    struct api_utf8_hold hold[2];
};

struct http_server {
    struct ev_loop *loop;
    const struct srv_config *cfg;
    struct sbx_table *t;
    char *key;
    struct lws_context *ctx;
    struct lws_vhost *vh;
    unsigned port;
    char *scratch; /* one NDJSON line being encoded */
    size_t scratch_cap;
    /* open connections, in total and per client address */
    unsigned conns;
    struct client *clients[CLIENT_BUCKETS];
    struct conn *accepted; /* counted by the filter, not yet bound to its wsi */
};

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
                 status, status == 429 ? "Too Many Requests" : "Service Unavailable", bl, body);
    for (int i = 0; i < 4 && recv(fd, junk, sizeof(junk), MSG_DONTWAIT) > 0; i++)
        ;
    if (send(fd, buf, (size_t)n, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        return;
    shutdown(fd, SHUT_WR);
}

static void conn_free(struct conn *cn)
{
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
static int conn_filter(struct http_server *srv, const struct lws_filter_network_conn_args *f)
{
    unsigned char a[16];
    struct client *c;
    struct conn *cn;
    size_t s;

    if (srv->accepted) {
        /* The last one accepted never became a wsi (lws failed to adopt it). */
        conn_free(srv->accepted);
        srv->accepted = NULL;
    }
    client_addr(&f->cli_addr, a);
    s = client_slot(a);
    for (c = srv->clients[s]; c && memcmp(c->addr, a, 16); c = c->next)
        ;
    if (srv->conns >= srv->cfg->max_connections &&
        ((c && c->n >= CONN_FAIR) ||
         srv->conns >= srv->cfg->max_connections + srv->cfg->max_connections / 16 + 16)) {
        refuse(f->accept_fd, 503, "too_many_connections",
               "the server has too many open connections; retry later");
        return 1;
    }
    if (c && c->n >= srv->cfg->max_conn_per_client) {
        refuse(f->accept_fd, 429, "too_many_connections",
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
    ev_init(&cn->deadline, on_deadline);
    srv->accepted = cn;
    return 0;
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

/* --------------------------------------------------------- output queue */

static struct obuf *obuf_new(size_t cap)
{
    struct obuf *ob = malloc(sizeof(*ob) + LWS_PRE + CHUNK_HDR + cap + CHUNK_TRL);

    if (!ob)
        return NULL;
    ob->next = NULL;
    ob->cap = cap;
    ob->len = 0;
    ob->credit = 0;
    ob->wire = NULL;
    ob->wire_len = 0;
    ob->off = 0;
    return ob;
}

static void q_push(struct pss *p, struct obuf *ob)
{
    if (p->qt)
        p->qt->next = ob;
    else
        p->qh = ob;
    p->qt = ob;
    p->q_bytes += ob->len;
}

/* Room for n more payload bytes at the queue's tail (a buffer not yet being
 * written), or a new buffer. NULL on allocation failure. */
static struct obuf *q_room(struct pss *p, size_t n)
{
    struct obuf *ob = p->qt;

    if (ob && !ob->wire && ob->cap - ob->len >= n)
        return ob;
    ob = obuf_new(n > OBUF_MIN ? n : OBUF_MIN);
    if (ob)
        q_push(p, ob);
    return ob;
}

static void q_grew(struct pss *p, struct obuf *ob, size_t n, size_t credit)
{
    ob->len += n;
    ob->credit += credit;
    p->q_bytes += n;
}

static void q_free(struct pss *p)
{
    while (p->qh) {
        struct obuf *n = p->qh->next;
        free(p->qh);
        p->qh = n;
    }
    p->qt = NULL;
    p->q_bytes = 0;
}

/* Freeze a buffer into its wire form (chunk framing when chunked). */
static void obuf_seal(struct pss *p, struct obuf *ob)
{
    unsigned char *pl = OB_PAYLOAD(ob);

    if (p->chunked) {
        char h[CHUNK_HDR + 1];
        int hl = snprintf(h, sizeof(h), "%zx\r\n", ob->len);
        ob->wire = pl - hl;
        memcpy(ob->wire, h, (size_t)hl);
        pl[ob->len] = '\r';
        pl[ob->len + 1] = '\n';
        ob->wire_len = (size_t)hl + ob->len + CHUNK_TRL;
    } else {
        ob->wire = pl;
        ob->wire_len = ob->len;
    }
}

/* ------------------------------------------------------------ responses */

static void want_write(struct pss *p)
{
    lws_callback_on_writable(p->wsi);
}

static void req_end(struct pss *p);

/* The client of a streamed answer took nothing for stall_timeout_s: drop it. The
 * operation is cancelled now (a running exec is killed). lws would first try to flush
 * what it holds for the socket, for up to 5 s on a timer its libev plugin may not
 * schedule: shutting the socket down makes that fail at once. */
static void on_stall(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct pss *p = (struct pss *)((char *)w - offsetof(struct pss, stall));
    struct lws *wsi = p->wsi;

    LOG(LOG_WARN,
        "%s: client took nothing of a streamed answer for %u s: dropping it and "
        "cancelling the operation",
        p->sbx, p->srv->cfg->stall_timeout_s);
    req_end(p);
    shutdown(lws_get_socket_fd(wsi), SHUT_RDWR);
    lws_set_timeout(wsi, STALL_REASON, LWS_TO_KILL_SYNC);
}

/* A streamed answer has bytes waiting: the client must take some within
 * stream_stall_timeout_seconds. Re-armed by every write (write_body), stopped while
 * nothing waits. An ev_timer of our own, not lws_set_timeout: lws's libev plugin only
 * reschedules its timer wheel after I/O, so a timeout set from a sandbox event may not
 * fire (seen: a stalled NDJSON client kept for 20 s against a 2 s timeout). */
static void stall_arm(struct pss *p, bool rearm)
{
    if (ev_is_active(&p->stall) && !rearm)
        return;
    p->stall.repeat = p->srv->cfg->stall_timeout_s;
    ev_timer_again(p->srv->loop, &p->stall);
}

static void stall_clear(struct pss *p)
{
    ev_timer_stop(p->srv->loop, &p->stall);
}

/* A JSON answer. Steals body. Ignored if an answer is already under way. */
static void respond(struct pss *p, int status, json_t *body)
{
    struct obuf *ob;
    size_t n;

    if (p->status) {
        json_decref(body);
        return;
    }
    if (status < 100 || status > 599) {
        LOG(LOG_ERR, "%s: the sandbox table answered status %d: sending 500", p->sbx, status);
        status = 500;
    }
    if (!body)
        body = json_object();
    n = body ? json_dumpb(body, NULL, 0, JSON_COMPACT) : 0;
    if (n == 0) {
        json_decref(body);
        body = NULL;
        status = 500;
        n = 0;
    }
    ob = obuf_new(n + 64);
    if (!ob) {
        json_decref(body);
        /* Nothing sensible to send: drop the connection from WRITEABLE. */
        p->status = 500;
        p->kind = RESP_JSON;
        p->close_after = true;
        p->complete = true;
        p->hdrs_sent = true;
        want_write(p);
        return;
    }
    if (body)
        json_dumpb(body, (char *)OB_PAYLOAD(ob), n, JSON_COMPACT);
    else
        n = (size_t)sprintf((char *)OB_PAYLOAD(ob),
                            "{\"error\":{\"code\":\"internal\",\"message\":\"out of memory\"}}");
    OB_PAYLOAD(ob)[n++] = '\n';
    ob->len = n;
    json_decref(body);

    p->status = status;
    p->kind = RESP_JSON;
    p->clen = n;
    p->chunked = false;
    q_push(p, ob);
    p->complete = true;
    /* Answered before the body was read: do not make lws read and discard it. */
    if (!p->body_done)
        p->close_after = true;
    /* An upload paused for credit must flow again so its rest is drained (see finish()):
     * lws sends the answer only once the body is complete. */
    if (p->upload && !p->body_done && p->rx_paused) {
        p->rx_paused = false;
        lws_rx_flow_control(p->wsi, 1);
        lws_set_timeout(p->wsi, PENDING_TIMEOUT_HTTP_CONTENT, HTTP_TIMEOUT_S);
    }
    want_write(p);
}

static void respond_err(struct pss *p, const struct api_err *e)
{
    respond(p, e->status, api_error(e->code, "%s", e->msg));
}

/* A sandbox-core error: its HTTP status and error body (sbx_err.c's table). */
static void respond_sbx_err(struct pss *p, const struct sbx_err *e)
{
    respond(p, sbx_err_http_status(e->code), api_error_of(e));
}

static void respond_code(struct pss *p, int status, const char *code, const char *msg)
{
    respond(p, status, api_error(code, "%s", msg));
}

static void ndjson_begin(struct pss *p)
{
    p->status = 200;
    p->kind = RESP_NDJSON;
    /* HTTP/1.0 has no chunked coding: the end of the body is the end of the connection. */
    p->chunked = !p->http10;
    if (p->http10)
        p->close_after = true;
}

/* Append a preformatted NDJSON line (or any bytes) to the stream. */
static int ndjson_append(struct pss *p, const char *s, size_t n, size_t credit)
{
    struct obuf *ob;

    if (!n) {
        /* Nothing to send yet (bytes held back), but the credit is owed: it rides on the
         * last buffer, or goes back with the next write. Never queue an empty buffer:
         * sealed, it would be the chunked body's last chunk. */
        if (p->qt)
            p->qt->credit += credit;
        else
            p->credit_pending += credit;
        return 0;
    }
    ob = q_room(p, n);
    if (!ob)
        return -ENOMEM;
    memcpy(OB_PAYLOAD(ob) + ob->len, s, n);
    q_grew(p, ob, n, credit);
    return 0;
}

static void ndjson_flush_holds(struct pss *p)
{
    for (int i = 0; i < 2; i++) {
        struct api_utf8_hold *h = &p->hold[i];
        struct obuf *ob;

        if (!h->n)
            continue;
        ob = q_room(p, api_ndjson_max(0));
        if (!ob) {
            p->close_after = true;
            return;
        }
        q_grew(p, ob, api_ndjson_flush(h, i + 1, (char *)OB_PAYLOAD(ob) + ob->len), 0);
    }
}

/* The stream's last line (exit record or error) and, when chunked, the empty chunk. */
static void ndjson_end(struct pss *p, int status, json_t *body)
{
    char *s = NULL;

    ndjson_flush_holds(p);
    if (status < 400) {
        s = body ? json_dumps(body, JSON_COMPACT) : strdup("{\"type\":\"exit\"}");
    } else {
        json_t *err = json_object_get(body, "error");
        json_t *line =
            json_pack("{s:s, s:i, s:O?}", "type", "error", "status", status, "error", err);
        if (line) {
            s = json_dumps(line, JSON_COMPACT);
            json_decref(line);
        }
    }
    json_decref(body);
    if (!s || ndjson_append(p, s, strlen(s), 0) || ndjson_append(p, "\n", 1, 0))
        p->close_after = true;
    free(s);
    if (p->chunked) {
        struct obuf *ob = obuf_new(0); /* seals to "0\r\n\r\n" */
        if (ob)
            q_push(p, ob);
        else
            p->close_after = true;
    }
    p->complete = true;
}

/* ----------------------------------------------------------- sink (sbx) */

static void sink_done(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;
    int status;

    if (!p->op_live) {
        json_decref(body);
        return;
    }
    if (err) {
        json_decref(body);
        status = sbx_err_http_status(err->code);
        body = api_error_of(err);
    } else {
        status = p->route == API_R_SANDBOXES ? 201 : 200; /* a create, or another op */
    }
    p->op_live = false;
    switch (p->kind) {
    case RESP_NONE:
        if (p->ndjson && status < 400) {
            ndjson_begin(p);
            ndjson_end(p, status, body);
        } else if (p->route == API_R_FILES && p->method == API_GET && status < 400) {
            json_decref(body);
            respond_code(p, 500, "internal", "the download ended before it started");
        } else {
            respond(p, status, body);
        }
        break;
    case RESP_NDJSON:
        ndjson_end(p, status, body);
        break;
    case RESP_DOWNLOAD:
        if (status >= 400 && !p->hdrs_sent) {
            /* Nothing sent yet: the error can still be a proper answer. */
            q_free(p);
            p->status = 0;
            p->kind = RESP_NONE;
            respond(p, status, body);
            break;
        }
        json_decref(body);
        /* After a Content-Length, a short body can only be told by closing. */
        if (status >= 400 || p->dl_queued != p->clen) {
            LOG(LOG_WARN, "download of %s ended after %" PRIu64 " of %" PRIu64 " bytes (%d)",
                p->sbx, p->dl_queued, p->clen, status);
            p->close_after = true;
        }
        p->complete = true;
        break;
    case RESP_JSON:
        json_decref(body);
        break;
    }
    /* An upload answered early leaves its pending bytes unused. */
    free(p->pend);
    p->pend = NULL;
    p->pend_len = p->pend_off = p->pend_cap = 0;
    want_write(p);
}

static void sink_head(void *user, uint64_t size)
{
    struct pss *p = user;

    if (!p->op_live || p->kind != RESP_NONE || p->route != API_R_FILES)
        return;
    p->status = 200;
    p->kind = RESP_DOWNLOAD;
    p->clen = size;
    p->chunked = false;
    stall_arm(p, false);
    want_write(p);
}

static void sink_data(void *user, int fd, uint64_t off, const void *ptr, size_t n)
{
    struct pss *p = user;
    struct obuf *ob;

    if (!p->op_live || !n)
        return;
    if (p->kind == RESP_DOWNLOAD) {
        size_t take = n;
        if (p->dl_queued + take > p->clen) {
            take = (size_t)(p->clen - p->dl_queued);
            p->close_after = true;
        }
        if (take) {
            if (!(ob = q_room(p, take)))
                goto oom;
            memcpy(OB_PAYLOAD(ob) + ob->len, ptr, take);
            q_grew(p, ob, take, n);
            p->dl_queued += take;
        }
    } else if (p->ndjson && (fd == 1 || fd == 2) &&
               (p->kind == RESP_NONE || p->kind == RESP_NDJSON)) {
        size_t need = api_ndjson_max(n), len;
        /* Encode into scratch first: a buffer sized for the worst case (6x) would
         * make the queue's memory six times its byte count. */
        if (p->srv->scratch_cap < need) {
            char *s = realloc(p->srv->scratch, need);
            if (!s)
                goto oom;
            p->srv->scratch = s;
            p->srv->scratch_cap = need;
        }
        if (p->kind == RESP_NONE)
            ndjson_begin(p);
        len = api_ndjson_chunk(&p->hold[fd - 1], fd, off, ptr, n, p->srv->scratch);
        if (ndjson_append(p, p->srv->scratch, len, n))
            goto oom;
    } else {
        return;
    }
    stall_arm(p, false);
    want_write(p);
    return;
oom:
    LOG(LOG_ERR, "out of memory queueing output of %s: closing the request", p->sbx);
    p->close_after = true;
    p->complete = true;
    p->op_live = false;
    sbx_op_cancel(p->srv->t, p->op);
    want_write(p);
}

static void upload_resume(struct pss *p)
{
    p->rx_paused = false;
    lws_rx_flow_control(p->wsi, 1);
    if (!p->body_done)
        lws_set_timeout(p->wsi, PENDING_TIMEOUT_HTTP_CONTENT, HTTP_TIMEOUT_S);
}

static void upload_pump(struct pss *p)
{
    while (p->pend_len && p->op_live) {
        size_t took;

        p->kick = false;
        p->in_write = true;
        took = sbx_op_write(p->srv->t, p->op, p->pend + p->pend_off, p->pend_len);
        p->in_write = false;
        if (!p->op_live)
            return; /* done() came from inside the write */
        if (took > p->pend_len)
            took = p->pend_len;
        p->pend_off += took;
        p->pend_len -= took;
        if (!took && !p->kick)
            return; /* wait for sink->writable */
    }
    if (!p->op_live)
        return;
    p->pend_off = 0;
    if (p->rx_paused)
        upload_resume(p);
    if (p->body_done && !p->finish_sent) {
        p->finish_sent = true;
        sbx_op_finish(p->srv->t, p->op);
    }
}

static void sink_writable(void *user)
{
    struct pss *p = user;

    if (!p->upload || !p->op_live)
        return;
    if (p->in_write) {
        p->kick = true;
        return;
    }
    upload_pump(p);
}

static const struct sbx_sink sink = {
    .done = sink_done,
    .head = sink_head,
    .data = sink_data,
    .writable = sink_writable,
};

/* ------------------------------------------------------------ requests */

static void req_end(struct pss *p)
{
    if (!p->srv)
        return; /* never started, or ended already */
    ev_timer_stop(p->srv->loop, &p->stall);
    if (p->op_live) {
        p->op_live = false;
        sbx_op_cancel(p->srv->t, p->op);
    }
    q_free(p);
    free(p->body);
    p->body = NULL;
    free(p->pend);
    p->pend = NULL;
    p->pend_len = 0;
    p->srv = NULL;
}

/* Copy a header; 0 if absent, its length, or -1 if longer than cap - 1. */
static int hdr(struct lws *wsi, enum lws_token_indexes t, char *buf, int cap)
{
    int n = lws_hdr_total_length(wsi, t);

    buf[0] = '\0';
    if (n <= 0)
        return 0;
    if (n >= cap || lws_hdr_copy(wsi, buf, cap, t) < 0)
        return -1;
    return n;
}

static unsigned method_of(struct lws *wsi)
{
    if (lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI))
        return API_GET;
    if (lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI))
        return API_POST;
    if (lws_hdr_total_length(wsi, WSI_TOKEN_PUT_URI))
        return API_PUT;
    if (lws_hdr_total_length(wsi, WSI_TOKEN_DELETE_URI))
        return API_DELETE;
    return API_OTHER;
}

/* Decoded "name=value" query fragments into store; -1 if they do not fit. */
static int query_frags(struct lws *wsi, char *store, size_t cap, const char **frags, size_t *n)
{
    size_t used = 0;

    *n = 0;
    for (int i = 0;; i++) {
        int len = lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i);
        if (len <= 0) {
            /* An empty fragment ("a&&b") has length 0 but may have successors. */
            if (lws_hdr_copy_fragment(wsi, store + used, (int)(cap - used), WSI_TOKEN_HTTP_URI_ARGS,
                                      i) < 0)
                return 0;
            continue;
        }
        if (*n == QUERY_FRAGS_MAX || used + (size_t)len + 1 > cap)
            return -1;
        if (lws_hdr_copy_fragment(wsi, store + used, (int)(cap - used), WSI_TOKEN_HTTP_URI_ARGS,
                                  i) < 0)
            return -1;
        frags[(*n)++] = store + used;
        used += (size_t)len + 1;
    }
}

static void start_op(struct pss *p, int rc, const struct sbx_err *err)
{
    if (rc == 0) {
        p->op_live = true;
        return;
    }
    respond_sbx_err(p, err);
}

/* The answer of a synchronous call: 200 and out, or its error. */
static void respond_sync(struct pss *p, int rc, json_t *out, const struct sbx_err *err)
{
    if (rc)
        respond_sbx_err(p, err);
    else
        respond(p, 200, out);
}

static void file_op(struct pss *p, const char *kind, json_t *args)
{
    struct sbx_err err;
    int rc;

    if (!args) {
        respond_code(p, 500, "internal", "out of memory");
        return;
    }
    rc = sbx_file_op(p->srv->t, p->sbx, kind, args, &sink, p, &p->op, &err);
    json_decref(args);
    start_op(p, rc, &err);
}

static bool disk_full(struct pss *p);

/* A route whose JSON body has fully arrived. */
static void dispatch_body(struct pss *p)
{
    struct api_err e;
    struct sbx_err err;
    json_t *body = NULL, *out = NULL, *args;
    int rc;

    p->dispatched = true;
    if (api_body_parse(p->body ? p->body : "", p->body_len, &body, &e)) {
        respond_err(p, &e);
        return;
    }
    free(p->body);
    p->body = NULL;
    switch (p->route) {
    case API_R_SANDBOXES:
        if (disk_full(p))
            break;
        rc = sbx_create(p->srv->t, body, &sink, p, &p->op, &err);
        start_op(p, rc, &err);
        break;
    case API_R_TIMEOUT:
        rc = sbx_set_timeout(p->srv->t, p->sbx, body, &out, &err);
        respond_sync(p, rc, out, &err);
        break;
    case API_R_EXEC:
        rc = sbx_exec(p->srv->t, p->sbx, body, p->ndjson, &sink, p, &p->op, &err);
        start_op(p, rc, &err);
        break;
    case API_R_FILES_RENAME:
        if (api_rename_args(body, &args, &e))
            respond_err(p, &e);
        else
            file_op(p, "rename", args);
        break;
    default:
        respond_code(p, 500, "internal", "no body route");
        break;
    }
    json_decref(body);
}

/* Content-Length: 0 absent, 1 present (*cl set), -1 malformed. */
static int content_length(struct lws *wsi, uint64_t *cl)
{
    char b[32], *end;
    int n = hdr(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, b, sizeof(b));

    *cl = 0;
    if (n == 0)
        return 0;
    if (n < 0 || b[0] < '0' || b[0] > '9')
        return -1;
    errno = 0;
    *cl = strtoull(b, &end, 10);
    return errno || *end ? -1 : 1;
}

/* Transfer-Encoding: none, or chunked alone on a POST/PUT of HTTP/1.1 with no
 * Content-Length, which is then decoded here. Anything else is answered (and closed):
 * 1; else 0. */
static int transfer_encoding(struct pss *p, int has_cl)
{
    char te[64];
    int n = hdr(p->wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING, te, sizeof(te));

    if (n == 0 && !lws_hdr_total_length(p->wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING))
        return 0;
    /* lws would read such a request by its Content-Length (or none), whereas a proxy in
     * front may go by Transfer-Encoding: refuse what two parsers could frame apart. */
    p->close_after = true;
    p->body_done = true; /* nothing more is read: the connection closes after the answer */
    if (has_cl) {
        respond_code(p, 400, "bad_request",
                     "both Transfer-Encoding and Content-Length: the body's framing is ambiguous");
        return 1;
    }
    if (p->http10 || !(p->method & (API_POST | API_PUT))) {
        respond_code(p, 400, "bad_request",
                     "Transfer-Encoding is accepted on HTTP/1.1 POST and PUT requests only");
        return 1;
    }
    if (n < 0 || strcasecmp(te, "chunked")) {
        respond_code(p, 501, "not_implemented",
                     "only 'Transfer-Encoding: chunked' is accepted for request bodies");
        return 1;
    }
    p->te_chunked = true;
    p->body_done = false;
    chunked_init(&p->te);
    return 0;
}

/* Free space in state_dir below min_free_disk_mb: answered 507, and true. */
static bool disk_full(struct pss *p)
{
    struct statvfs v;
    uint64_t free_mb;

    if (!p->srv->cfg->min_free_disk_mb || statvfs(p->srv->cfg->state_dir, &v) != 0)
        return false;
    free_mb = (uint64_t)v.f_bavail * v.f_frsize >> 20;
    if (free_mb >= p->srv->cfg->min_free_disk_mb)
        return false;
    respond(p, 507,
            api_error("insufficient_storage",
                      "the server's disk has %" PRIu64 " MiB free, below its minimum of %u MiB",
                      free_mb, p->srv->cfg->min_free_disk_mb));
    return true;
}

static bool expects_continue(struct pss *p)
{
    char b[32];

    return !p->http10 && hdr(p->wsi, WSI_TOKEN_HTTP_EXPECT, b, sizeof(b)) > 0 &&
           strcasecmp(b, "100-continue") == 0;
}

/* Start collecting a JSON body (or dispatch now when there is none to read). */
static void want_json_body(struct pss *p, int has_cl, uint64_t cl)
{
    if (p->te_chunked) {
        p->want_body = true; /* the buffer grows as chunks come (on_body_bytes) */
        if (expects_continue(p)) {
            p->need_continue = true;
            want_write(p);
        }
        return;
    }
    if (!has_cl) {
        /* No length and no chunking: an empty body. lws still expects one, so the
         * connection closes after the answer (respond sees !body_done). */
        dispatch_body(p);
        return;
    }
    if (cl > p->srv->cfg->max_body_bytes) {
        respond(p, 413,
                api_error("body_too_large", "JSON body of %" PRIu64 " bytes exceeds %zu", cl,
                          p->srv->cfg->max_body_bytes));
        return;
    }
    p->want_body = true;
    if (cl) {
        p->body_cap = (size_t)cl;
        p->body = malloc(p->body_cap);
        if (!p->body) {
            respond_code(p, 500, "internal", "out of memory");
            return;
        }
    }
    if (cl && expects_continue(p)) {
        p->need_continue = true;
        want_write(p);
    }
}

static void start_upload(struct pss *p, const struct api_query *q, int has_cl, uint64_t cl)
{
    struct api_err e;
    struct sbx_err err;
    int rc;

    if (api_path_check("path", q->path, &e)) {
        respond_err(p, &e);
        return;
    }
    if (!has_cl && !p->te_chunked) {
        respond_code(p, 411, "length_required",
                     "upload with a Content-Length or Transfer-Encoding: chunked");
        return;
    }
    if (disk_full(p))
        return;
    rc = sbx_file_write(p->srv->t, p->sbx, q->path, q->mode, &sink, p, &p->op, &err);
    if (rc) {
        start_op(p, rc, &err);
        return;
    }
    p->op_live = true;
    p->upload = true;
    if (has_cl && cl == 0) {
        p->finish_sent = true;
        sbx_op_finish(p->srv->t, p->op);
    } else if (expects_continue(p)) {
        p->need_continue = true;
        want_write(p);
    }
}

static void handle_request(struct pss *p, const char *uri)
{
    static const unsigned qallow[] = {
        [API_R_SANDBOXES] = API_Q_STATE | API_Q_METADATA,
        [API_R_FILES] = API_Q_PATH | API_Q_MODE | API_Q_RECURSIVE,
        [API_R_FILES_STAT] = API_Q_PATH,
        [API_R_FILES_LIST] = API_Q_PATH | API_Q_DEPTH,
        [API_R_FILES_MKDIR] = API_Q_PATH,
    };
    const char *frags[QUERY_FRAGS_MAX];
    char qstore[QUERY_STORE], authz[512], ver[16];
    struct api_route r;
    struct api_query q;
    struct api_err e;
    struct sbx_err err;
    json_t *out = NULL;
    uint64_t cl;
    size_t nfrags;
    int rc, has_cl;

    p->method = method_of(p->wsi);
    /* No route takes HEAD, OPTIONS or PATCH. A HEAD answer must not carry a body; rather
     * than special-case it, any such answer ends the connection. */
    if (p->method == API_OTHER)
        p->close_after = true;
    p->http10 = hdr(p->wsi, WSI_TOKEN_HTTP, ver, sizeof(ver)) > 0 && !strcmp(ver, "HTTP/1.0");
    has_cl = content_length(p->wsi, &cl);
    /* A body is coming if a length says so, or (to lws) for any POST/PUT without one. */
    p->body_done = has_cl > 0 ? cl == 0 : !(p->method & (API_POST | API_PUT));
    if (has_cl < 0) {
        p->close_after = true;
        respond_code(p, 400, "bad_request", "malformed Content-Length");
        return;
    }
    if (transfer_encoding(p, has_cl))
        return;

    rc = api_route_match(uri, &r);
    if (r.auth && !(hdr(p->wsi, WSI_TOKEN_HTTP_AUTHORIZATION, authz, sizeof(authz)) > 0 &&
                    api_bearer_ok(authz, p->srv->key))) {
        respond_code(p, 401, "unauthorized", "missing or wrong 'Authorization: Bearer <key>'");
        return;
    }
    if (rc) {
        respond_code(p, 404, "not_found", "no such route");
        return;
    }
    if (!(r.methods & p->method)) {
        respond_code(p, 405, "method_not_allowed", "method not allowed on this route");
        return;
    }
    p->route = r.id;
    memcpy(p->sbx, r.sbx, sizeof(p->sbx));

    if (query_frags(p->wsi, qstore, sizeof(qstore), frags, &nfrags)) {
        respond_code(p, 400, "bad_request", "query string too long");
        return;
    }
    /* Only GET /v1/sandboxes and the files routes take a query; for files the
     * allowed set also depends on the method. */
    {
        unsigned allow = (size_t)r.id < sizeof(qallow) / sizeof(qallow[0]) ? qallow[r.id] : 0;
        if (r.id == API_R_SANDBOXES && p->method != API_GET)
            allow = 0;
        if (r.id == API_R_FILES)
            allow = API_Q_PATH | (p->method == API_PUT      ? API_Q_MODE
                                  : p->method == API_DELETE ? API_Q_RECURSIVE
                                                            : 0);
        if (api_query_parse(frags, nfrags, allow, &q, &e)) {
            respond_err(p, &e);
            return;
        }
    }

    switch (r.id) {
    case API_R_HEALTHZ:
        respond(p, 200,
                json_pack("{s:s, s:I}", "status", "ok", "sandboxes",
                          (json_int_t)sbx_count_live(p->srv->t)));
        break;
    case API_R_SANDBOXES:
        if (p->method == API_GET) {
            rc = sbx_list(p->srv->t, q.state, q.metadata, &out, &err);
            respond_sync(p, rc, out, &err);
        } else {
            want_json_body(p, has_cl, cl);
        }
        break;
    case API_R_SANDBOX:
        rc = p->method == API_GET ? sbx_get(p->srv->t, p->sbx, &out, &err)
                                  : sbx_delete(p->srv->t, p->sbx, &out, &err);
        respond_sync(p, rc, out, &err);
        break;
    case API_R_EXEC: {
        char accept[256];
        p->ndjson = hdr(p->wsi, WSI_TOKEN_HTTP_ACCEPT, accept, sizeof(accept)) > 0 &&
                    api_wants_ndjson(accept);
        want_json_body(p, has_cl, cl);
        break;
    }
    case API_R_TIMEOUT:
    case API_R_FILES_RENAME:
        want_json_body(p, has_cl, cl);
        break;
    case API_R_FILES:
        if (p->method == API_PUT) {
            start_upload(p, &q, has_cl, cl);
            break;
        }
        if (api_path_check("path", q.path, &e)) {
            respond_err(p, &e);
            break;
        }
        if (p->method == API_GET) {
            rc = sbx_file_read(p->srv->t, p->sbx, q.path, &sink, p, &p->op, &err);
            start_op(p, rc, &err);
        } else {
            file_op(p, "remove", json_pack("{s:s, s:b}", "path", q.path, "recursive", q.recursive));
        }
        break;
    case API_R_FILES_STAT:
    case API_R_FILES_LIST:
    case API_R_FILES_MKDIR:
        if (api_path_check("path", q.path, &e)) {
            respond_err(p, &e);
            break;
        }
        if (r.id == API_R_FILES_STAT)
            file_op(p, "stat", json_pack("{s:s}", "path", q.path));
        else if (r.id == API_R_FILES_LIST)
            file_op(p, "list", json_pack("{s:s, s:i}", "path", q.path, "depth", (int)q.depth));
        else
            file_op(p, "mkdir", json_pack("{s:s}", "path", q.path));
        break;
    default:
        respond_code(p, 404, "not_found", "no such route");
        break;
    }
    api_query_clear(&q);
}

/* ---------------------------------------------------------------- output */

static int finish(struct pss *p)
{
    /* An upload answered before its body ended (disk full, sandbox gone): read and drop
     * the rest before closing. Closing with unread bytes sends a reset, and a client that
     * reads the answer only after sending everything would see "connection reset" instead
     * of the error. lws's per-chunk body timeout still ends a stalled client. */
    if (p->upload && !p->body_done) {
        p->linger = true;
        if (p->rx_paused) {
            p->rx_paused = false;
            lws_rx_flow_control(p->wsi, 1);
        }
        lws_set_timeout(p->wsi, PENDING_TIMEOUT_HTTP_CONTENT, HTTP_TIMEOUT_S);
        return 0;
    }
    /* lws_http_transaction_completed frees p (HTTP_DROP_PROTOCOL): do not touch it after. */
    if (p->close_after)
        return -1;
    return lws_http_transaction_completed(p->wsi) ? -1 : 0;
}

static int write_headers(struct pss *p)
{
    unsigned char buf[LWS_PRE + HDR_ROOM], *start = buf + LWS_PRE, *pp = start,
                                           *end = start + HDR_ROOM;
    struct lws *wsi = p->wsi;
    int r = 0;

    switch (p->kind) {
    case RESP_JSON:
        r = lws_add_http_common_headers(wsi, (unsigned)p->status, "application/json", p->clen, &pp,
                                        end);
        break;
    case RESP_DOWNLOAD:
        r = lws_add_http_common_headers(wsi, 200, "application/octet-stream", p->clen, &pp, end);
        break;
    case RESP_NDJSON:
        r = lws_add_http_header_status(wsi, 200, &pp, end) ||
            lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CONTENT_TYPE,
                                         (const unsigned char *)"application/x-ndjson", 20, &pp,
                                         end) ||
            lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
                                         (const unsigned char *)"no-cache", 8, &pp, end);
        if (!r && p->chunked)
            r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING,
                                             (const unsigned char *)"chunked", 7, &pp, end);
        break;
    case RESP_NONE:
        return 0;
    }
    if (!r && p->close_after)
        r = lws_add_http_header_by_token(wsi, WSI_TOKEN_CONNECTION, (const unsigned char *)"close",
                                         5, &pp, end);
    if (r || lws_finalize_write_http_header(wsi, start, &pp, end))
        return -1;
    p->hdrs_sent = true;
    want_write(p);
    return 0;
}

static int write_body(struct pss *p)
{
    struct obuf *ob = p->qh;
    size_t n, credit;
    bool last;

    if (ob) {
        if (!ob->wire)
            obuf_seal(p, ob);
        n = ob->wire_len - ob->off;
        if (n > WRITE_MAX)
            n = WRITE_MAX;
        last = ob->off + n == ob->wire_len && !ob->next && p->complete;
        /* Only the chunked terminator is an empty payload, and it seals to 5 bytes. */
        if (lws_write(p->wsi, ob->wire + ob->off, n, last ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP) <
            (int)n)
            return -1;
        ob->off += n;
        if (ob->off == ob->wire_len) {
            p->qh = ob->next;
            if (!p->qh)
                p->qt = NULL;
            p->q_bytes -= ob->len;
            p->credit_pending += ob->credit;
            free(ob);
        }
        /* The client took the last write (lws calls WRITEABLE only once its partial went
         * out): it has stall_timeout_s again for the next. */
        if (p->kind == RESP_NDJSON || p->kind == RESP_DOWNLOAD) {
            if (p->qh && !last)
                stall_arm(p, true);
            else
                stall_clear(p);
        }
        if (last)
            return finish(p);
    } else if (p->complete) {
        return finish(p);
    }
    if (p->q_bytes > HIGH_WATER)
        p->throttled = true;
    else if (p->q_bytes <= LOW_WATER)
        p->throttled = false;
    if (p->qh)
        want_write(p);
    if (!p->throttled && p->credit_pending && p->op_live) {
        /* May call sink_data for this request right away: nothing is held across it. */
        credit = p->credit_pending;
        p->credit_pending = 0;
        sbx_op_consumed(p->srv->t, p->op, credit);
    }
    return 0;
}

static int on_writeable(struct pss *p)
{
    if (p->rx_paused)
        /* lws re-armed its body timeout after the chunk that made us pause. */
        lws_set_timeout(p->wsi, NO_PENDING_TIMEOUT, 0);
    if (p->te_untimeout) {
        /* ... and after the last chunk of a chunked body, as it waits for 100 MiB. */
        p->te_untimeout = false;
        lws_set_timeout(p->wsi, NO_PENDING_TIMEOUT, 0);
    }
    if (!p->status) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        unsigned char buf[LWS_PRE + sizeof(cont)];

        if (p->need_continue && !p->continue_sent) {
            p->continue_sent = true;
            memcpy(buf + LWS_PRE, cont, sizeof(cont) - 1);
            if (lws_write(p->wsi, buf + LWS_PRE, sizeof(cont) - 1, LWS_WRITE_HTTP) <
                (int)sizeof(cont) - 1)
                return -1;
        }
        return 0;
    }
    if (!p->hdrs_sent)
        return write_headers(p);
    return write_body(p);
}

/* ----------------------------------------------------------------- input */

static int on_body_bytes(struct pss *p, const void *in, size_t len)
{
    if (p->upload) {
        size_t took;

        if (!p->op_live || p->status)
            return 0; /* answered already: the rest is dropped with the connection */
        if (p->pend_len) {
            /* Paused, yet lws had more: keep it behind what is pending. */
            if (p->pend_off + p->pend_len + len > p->pend_cap) {
                unsigned char *np;
                memmove(p->pend, p->pend + p->pend_off, p->pend_len);
                p->pend_off = 0;
                if (p->pend_len + len > p->pend_cap) {
                    np = realloc(p->pend, p->pend_len + len);
                    if (!np)
                        return -1;
                    p->pend = np;
                    p->pend_cap = p->pend_len + len;
                }
            }
            memcpy(p->pend + p->pend_off + p->pend_len, in, len);
            p->pend_len += len;
            return 0;
        }
        if (!len)
            return 0;
        p->kick = false;
        p->in_write = true;
        took = sbx_op_write(p->srv->t, p->op, in, len);
        p->in_write = false;
        if (took >= len || !p->op_live)
            return 0;
        if (!p->pend || p->pend_cap < len - took) {
            size_t cap = len - took > RX_BUF ? len - took : RX_BUF;
            free(p->pend);
            p->pend = malloc(cap);
            if (!p->pend)
                return -1;
            p->pend_cap = cap;
        }
        memcpy(p->pend, (const unsigned char *)in + took, len - took);
        p->pend_off = 0;
        p->pend_len = len - took;
        p->rx_paused = true;
        lws_rx_flow_control(p->wsi, 0);
        want_write(p); /* to clear the body timeout lws arms after this callback */
        if (p->kick)
            upload_pump(p);
        return 0;
    }
    if (!p->want_body || p->status || p->dispatched || !len)
        return 0;
    if (p->te_chunked && len > p->body_cap - p->body_len &&
        p->body_len + len <= p->srv->cfg->max_body_bytes) {
        /* A chunked body has no announced length: grow up to max_json_body_bytes. */
        size_t cap = p->body_cap ? p->body_cap : 4096;
        char *nb;
        while (cap < p->body_len + len)
            cap *= 2;
        if (cap > p->srv->cfg->max_body_bytes)
            cap = p->srv->cfg->max_body_bytes;
        if (!(nb = realloc(p->body, cap))) {
            respond_code(p, 500, "internal", "out of memory");
            return 0;
        }
        p->body = nb;
        p->body_cap = cap;
    }
    if (len > p->body_cap - p->body_len) {
        respond(p, 413,
                api_error("body_too_large", "JSON body exceeds %zu bytes",
                          p->srv->cfg->max_body_bytes));
        return 0;
    }
    memcpy(p->body + p->body_len, in, len);
    p->body_len += len;
    return 0;
}

static int on_body_done(struct pss *p);

/* Raw body bytes from lws: as they are, or through the chunked decoder. */
static int on_body(struct pss *p, const void *in, size_t len)
{
    const unsigned char *b = in;

    if (!p->te_chunked)
        return on_body_bytes(p, in, len);
    if (p->te_bad)
        return 0;
    while (len && !p->te_done) {
        size_t used, off, dlen;
        int r = chunked_decode(&p->te, b, len, &used, &off, &dlen);

        if (r < 0) {
            LOG(LOG_WARN, "%s: malformed chunked request body (%s): closing", p->sbx,
                r == -E2BIG ? "a chunk line or trailer too long" : "bad framing");
            if (p->status || p->linger)
                return -1;
            p->te_bad = true;
            /* Where the body ends is unknown: answer, then close without reading on. */
            p->body_done = true;
            if (p->op_live) {
                p->op_live = false;
                sbx_op_cancel(p->srv->t, p->op);
            }
            respond_code(p, 400, "bad_request", "malformed chunked request body");
            return 0;
        }
        if (dlen && on_body_bytes(p, b + off, dlen))
            return -1;
        b += used;
        len -= used;
        if (r == CHUNKED_DONE) {
            p->te_done = true;
            p->te_untimeout = true;
            want_write(p);
            return on_body_done(p);
        }
    }
    return 0; /* bytes after the body: the connection closes after the answer */
}

static int on_body_done(struct pss *p)
{
    p->body_done = true;
    if (p->linger)
        return -1; /* the answer went out already; the body is drained: close */
    if (p->upload && p->status) {
        want_write(p); /* answered early: the answer can go out now */
        return 0;
    }
    if (p->upload) {
        if (p->op_live && !p->pend_len && !p->finish_sent) {
            p->finish_sent = true;
            sbx_op_finish(p->srv->t, p->op);
        }
        return 0;
    }
    if (p->want_body && !p->status && !p->dispatched)
        dispatch_body(p);
    return 0;
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
    case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
        return conn_filter(srv, user);
    case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
        /* The filter's fd, adopted (lws_adopt_descriptor_vhost2). Not at WSI_CREATE:
         * adoption sets the opaque user data to NULL after that. */
        if (srv->accepted) {
            srv->accepted->wsi = wsi;
            lws_set_opaque_user_data(wsi, srv->accepted);
            srv->accepted = NULL;
            conn_deadline(wsi, srv->cfg->header_timeout_s);
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
        req_end(p);
        memset(p, 0, sizeof(*p));
        ev_init(&p->stall, on_stall);
        p->wsi = wsi;
        p->srv = srv;
        handle_request(p, in);
        /* Answers can take a while (a boot under TCG, a long exec): lws must not
         * time the request out. While a body we want is read, lws keeps its own
         * per-chunk timeout. */
        if (p->status || !((p->upload && p->op_live) || (p->want_body && !p->dispatched)))
            lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0);
        return 0;
    case LWS_CALLBACK_HTTP_BODY:
        return p && p->srv ? on_body(p, in, len) : 0;
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
        return p && p->srv ? on_body_done(p) : 0;
    case LWS_CALLBACK_HTTP_WRITEABLE:
        return p && p->srv ? on_writeable(p) : 0;
    case LWS_CALLBACK_HTTP_DROP_PROTOCOL:
        /* Answered, kept alive: the next request may idle for the keep-alive time, then
         * its head must be complete within the header deadline. */
        conn_deadline(wsi, KEEPALIVE_S + srv->cfg->header_timeout_s);
        if (p)
            req_end(p);
        return 0;
    case LWS_CALLBACK_CLOSED_HTTP:
        if (p)
            req_end(p);
        return 0;
    case LWS_CALLBACK_HTTP_CONFIRM_UPGRADE:
        /* No WebSocket or h2c here (yet): hang up rather than half-serve. */
        return -1;
    default:
        return 0;
    }
}

static const struct lws_protocols protocols[] = {
    {.name = "warren-http", .callback = http_cb, .per_session_data_size = sizeof(struct pss)},
    {.name = NULL},
};

/* ------------------------------------------------------------ lifecycle */

static void lws_log_line(int level, const char *line)
{
    size_t n = strlen(line);

    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        n--;
    LOG(level & LLL_ERR ? LOG_ERR : LOG_WARN, "lws: %.*s", (int)n, line);
}

/* lws sizes its fd tables from this: every fd warrend may hold, minus what the
 * sandboxes themselves use, goes to connections. */
static unsigned fd_limit(const struct srv_config *cfg)
{
    struct rlimit rl;
    unsigned long lim = 1024, reserve = 32 + (unsigned long)FDS_PER_SBX * cfg->max_sandboxes;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        lim = rl.rlim_cur == RLIM_INFINITY ? 65536 : rl.rlim_cur;
    return lim > reserve + 64 ? (unsigned)(lim - reserve) : 64;
}

int http_start(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table *t,
               const char *api_key, struct http_server **out)
{
    struct lws_context_creation_info info;
    void *foreign[1] = {loop};
    struct http_server *h;
    unsigned char a6[16];
    bool v6 = inet_pton(AF_INET6, cfg->listen_addr, a6) == 1;

    h = calloc(1, sizeof(*h));
    if (!h || !(h->key = strdup(api_key))) {
        free(h);
        return -ENOMEM;
    }
    h->loop = loop;
    h->cfg = cfg;
    h->t = t;

    /* The libev plugin logs every I/O event at NOTICE: errors and warnings only. */
    lws_set_log_level(LLL_ERR | LLL_WARN, lws_log_line);

    memset(&info, 0, sizeof(info));
    info.options = LWS_SERVER_OPTION_LIBEV | LWS_SERVER_OPTION_EXPLICIT_VHOSTS |
                   LWS_SERVER_OPTION_FAIL_UPON_UNABLE_TO_BIND |
                   (v6 ? 0 : LWS_SERVER_OPTION_DISABLE_IPV6);
    info.foreign_loops = foreign;
    info.count_threads = 1;
    info.fd_limit_per_thread = fd_limit(cfg);
    info.pt_serv_buf_size = RX_BUF;
    info.timeout_secs = HTTP_TIMEOUT_S;
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

    /* Vhost options: an IPv4 address on lws's IPv6 socket path is mis-bound in 4.1. */
    info.port = (int)cfg->listen_port;
    info.iface = cfg->listen_addr;
    info.protocols = protocols;
    info.vhost_name = "warren";
    info.keepalive_timeout = KEEPALIVE_S;
    /* The header deadline: a connection that has not sent a whole request head this long
     * after it opened (or after its last answer) is closed, however it trickles. */
    info.timeout_secs_ah_idle = cfg->header_timeout_s;
    h->vh = lws_create_vhost(h->ctx, &info);
    if (!h->vh) {
        LOG(LOG_ERR, "cannot listen on %s%s%s:%u (in use, or not an address of this host)",
            v6 ? "[" : "", cfg->listen_addr, v6 ? "]" : "", cfg->listen_port);
        http_stop(h);
        return -EADDRNOTAVAIL;
    }
    h->port = (unsigned)lws_get_vhost_listen_port(h->vh);
    LOG(LOG_DEBUG, "lws: %u fds for connections", info.fd_limit_per_thread);
    *out = h;
    return 0;
}

unsigned http_port(const struct http_server *h)
{
    return h->port;
}

void http_stop(struct http_server *h)
{
    if (!h)
        return;
    /* Closing every connection runs req_end, which cancels what is in flight. */
    if (h->ctx)
        lws_context_destroy(h->ctx);
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
    free(h);
}
