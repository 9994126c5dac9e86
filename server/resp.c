/*
 * resp.c - the REST server's response writer: the per-request output queue,
 * JSON answers, the NDJSON stream encoder (over api.c's pure line encoders),
 * and the HTTP_WRITEABLE side that writes it all, acknowledging streamed
 * bytes to the sandbox table only once written (see http.c's header for the
 * water marks and the lws facts this depends on).
 */
#include "e2b_api.h"
#include "http_int.h"

#include <assert.h>

/* --------------------------------------------------------- output queue */

void req_phase(struct pss *p, enum http_phase to)
{
    if (http_phase_check(p->phase, to)) {
        LOG(LOG_ERR, "%s: request phase %s -> %s refused", p->sbx, http_phase_name(p->phase),
            http_phase_name(to));
        assert(!"request phase transition outside the table");
        return;
    }
    p->phase = to;
}

void req_complete(struct pss *p)
{
    if (!http_phase_complete(p->phase))
        req_phase(p, HP_COMPLETE);
}

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
struct obuf *resp_q_room(struct pss *p, size_t n)
{
    struct obuf *ob = p->qt;

    if (ob && !ob->wire && ob->cap - ob->len >= n)
        return ob;
    ob = obuf_new(n > OBUF_MIN ? n : OBUF_MIN);
    if (ob)
        q_push(p, ob);
    return ob;
}

void resp_q_grew(struct pss *p, struct obuf *ob, size_t n, size_t credit)
{
    ob->len += n;
    ob->credit += credit;
    p->q_bytes += n;
}

void resp_q_free(struct pss *p)
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

void resp_want_write(struct pss *p)
{
    lws_callback_on_writable(p->wsi);
}

/* The client of a streamed answer took nothing for stall_timeout_s: drop it. The
 * operation is cancelled now (a running exec is killed). lws would first try to flush
 * what it holds for the socket, for up to 5 s on a timer its libev plugin may not
 * schedule: shutting the socket down makes that fail at once. */
void resp_on_stall(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct pss *p = (struct pss *)((char *)w - offsetof(struct pss, stall));
    struct lws *wsi = p->wsi;

    LOG(LOG_WARN,
        "%s: client took nothing of a streamed answer for %u s: dropping it and "
        "cancelling the operation",
        p->sbx, p->srv->cfg->stall_timeout_s);
    rest_req_end(p);
    shutdown(lws_get_socket_fd(wsi), SHUT_RDWR);
    lws_set_timeout(wsi, STALL_REASON, LWS_TO_KILL_SYNC);
}

/* A streamed answer has bytes waiting: the client must take some within
 * stream_stall_timeout_seconds. Re-armed by every write (write_body), stopped while
 * nothing waits. An ev_timer of our own, not lws_set_timeout: lws's libev plugin only
 * reschedules its timer wheel after I/O, so a timeout set from a sandbox event may not
 * fire (seen: a stalled NDJSON client kept for 20 s against a 2 s timeout). */
void resp_stall_arm(struct pss *p, bool rearm)
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
void resp_json(struct pss *p, int status, json_t *body)
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
    if (p->e2b && status >= 400) {
        /* E2B's SDKs read {"code": status, "message"}; ended means not found there. */
        if (status == 410)
            status = 404;
        body = e2b_error_body(status, body);
    }
    if (status == 204) {
        /* No content: headers only (Content-Length: 0). */
        json_decref(body);
        p->status = status;
        p->kind = RESP_JSON;
        p->clen = 0;
        p->chunked = false;
        req_complete(p);
        if (!p->body_done)
            p->close_after = true;
        resp_want_write(p);
        return;
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
        req_complete(p);
        p->hdrs_sent = true;
        resp_want_write(p);
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
    req_complete(p);
    /* Answered before the body was read: do not make lws read and discard it. */
    if (!p->body_done)
        p->close_after = true;
    /* An upload paused for credit must flow again so its rest is drained (see finish()):
     * lws sends the answer only once the body is complete. */
    if (p->upload && !p->body_done && p->rx_paused) {
        p->rx_paused = false;
        lws_rx_flow_control(p->wsi, 1);
        lws_set_timeout(p->wsi, PENDING_TIMEOUT_HTTP_CONTENT, http_timeout_s(p->wsi));
    }
    resp_want_write(p);
}

void resp_empty(struct pss *p, int status)
{
    if (p->status)
        return;
    p->status = status;
    p->kind = RESP_JSON;
    p->clen = 0;
    p->chunked = false;
    req_complete(p);
    if (!p->body_done)
        p->close_after = true;
    resp_want_write(p);
}

void resp_api_err(struct pss *p, const struct api_err *e)
{
    if (!p->status)
        p->err_code = e->code;
    resp_json(p, e->status, api_error(e->code, "%s", e->msg));
}

/* A sandbox-core error: its HTTP status and error body (sbx_err.c's table). */
void resp_sbx_err(struct pss *p, const struct sbx_err *e)
{
    if (!p->status)
        p->err_code = sbx_err_name(e->code);
    resp_json(p, api_status_of(e->code), api_error_of(e));
}

void resp_code(struct pss *p, int status, const char *code, const char *msg)
{
    if (!p->status)
        p->err_code = code;
    resp_json(p, status, api_error(code, "%s", msg));
}

void resp_ndjson_begin(struct pss *p)
{
    /* From sink_done (ANSWER) the whole stream is its last line: nothing streams. */
    if (p->phase == HP_OP)
        req_phase(p, HP_STREAM);
    p->status = 200;
    p->kind = RESP_NDJSON;
    /* HTTP/1.0 has no chunked coding: the end of the body is the end of the connection. */
    p->chunked = !p->http10;
    if (p->http10)
        p->close_after = true;
}

/* Append a preformatted NDJSON line (or any bytes) to the stream. */
int resp_ndjson_append(struct pss *p, const char *s, size_t n, size_t credit)
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
    ob = resp_q_room(p, n);
    if (!ob)
        return -ENOMEM;
    memcpy(OB_PAYLOAD(ob) + ob->len, s, n);
    resp_q_grew(p, ob, n, credit);
    return 0;
}

static void ndjson_flush_holds(struct pss *p)
{
    for (int i = 0; i < 2; i++) {
        struct api_utf8_hold *h = &p->hold[i];
        struct obuf *ob;

        if (!h->n)
            continue;
        ob = resp_q_room(p, api_ndjson_max(0));
        if (!ob) {
            p->close_after = true;
            return;
        }
        resp_q_grew(p, ob, api_ndjson_flush(h, i + 1, (char *)OB_PAYLOAD(ob) + ob->len), 0);
    }
}

/* The stream's last line (exit record or error) and, when chunked, the empty chunk. */
void resp_ndjson_lost(struct pss *p, uint64_t off, uint64_t n)
{
    char line[96];
    int len;

    /* Bytes held back from before the gap go first, so offsets stay in order. */
    ndjson_flush_holds(p);
    len = snprintf(line, sizeof(line),
                   "{\"type\":\"lost\",\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64 "}\n", off, n);
    if (resp_ndjson_append(p, line, (size_t)len, 0))
        p->close_after = true;
}

void resp_ndjson_end(struct pss *p, int status, json_t *body)
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
    if (!s || resp_ndjson_append(p, s, strlen(s), 0) || resp_ndjson_append(p, "\n", 1, 0))
        p->close_after = true;
    free(s);
    resp_ndjson_close(p);
}

void resp_ndjson_close(struct pss *p)
{
    if (p->chunked) {
        struct obuf *ob = obuf_new(0); /* seals to "0\r\n\r\n" */
        if (ob)
            q_push(p, ob);
        else
            p->close_after = true;
    }
    req_complete(p);
}

void resp_stream_close(struct pss *p)
{
    ndjson_flush_holds(p);
    if (p->chunked) {
        struct obuf *ob = obuf_new(0); /* seals to "0\r\n\r\n" */
        if (ob)
            q_push(p, ob);
        else
            p->close_after = true;
    }
    req_complete(p);
}

/* ---------------------------------------------------------------- output */

static int finish(struct pss *p)
{
    /* An upload answered before its body ended (disk full, sandbox gone): read and drop
     * the rest before closing. Closing with unread bytes sends a reset, and a client that
     * reads the answer only after sending everything would see "connection reset" instead
     * of the error. lws's per-chunk body timeout still ends a stalled client. */
    if (p->upload && !p->body_done) {
        if (!http_phase_lingering(p->phase))
            req_phase(p, HP_LINGER);
        if (p->rx_paused) {
            p->rx_paused = false;
            lws_rx_flow_control(p->wsi, 1);
        }
        lws_set_timeout(p->wsi, PENDING_TIMEOUT_HTTP_CONTENT, http_timeout_s(p->wsi));
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
        r = lws_add_http_common_headers(
            wsi, (unsigned)p->status, p->ctype ? p->ctype : "application/json", p->clen, &pp, end);
        break;
    case RESP_DOWNLOAD:
        r = lws_add_http_common_headers(wsi, 200, "application/octet-stream", p->clen, &pp, end);
        break;
    case RESP_STATIC:
        /* no-cache: a new setup.sh or warrend must not leave a stale page in a tab.
         * no-referrer: the page's URL may carry an access token. */
        r = lws_add_http_common_headers(wsi, (unsigned)p->status, p->ctype, p->clen, &pp, end) ||
            lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
                                         (const unsigned char *)"no-cache", 8, &pp, end) ||
            lws_add_http_header_by_name(wsi, (const unsigned char *)"x-content-type-options:",
                                        (const unsigned char *)"nosniff", 7, &pp, end) ||
            lws_add_http_header_by_name(wsi, (const unsigned char *)"referrer-policy:",
                                        (const unsigned char *)"no-referrer", 11, &pp, end);
        break;
    case RESP_NDJSON:
        r = lws_add_http_header_status(wsi, 200, &pp, end) ||
            lws_add_http_header_by_token(
                wsi, WSI_TOKEN_HTTP_CONTENT_TYPE,
                (const unsigned char *)(p->ctype ? p->ctype : "application/x-ndjson"),
                (int)strlen(p->ctype ? p->ctype : "application/x-ndjson"), &pp, end) ||
            lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_CACHE_CONTROL,
                                         (const unsigned char *)"no-cache", 8, &pp, end);
        if (!r && p->chunked)
            r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING,
                                             (const unsigned char *)"chunked", 7, &pp, end);
        break;
    case RESP_NONE:
        return 0;
    }
    /* Which host answered (several behind one proxy), and an error's code where a proxy
     * can act on it without reading the body (HAProxy retries a create on host_full). */
    if (!r && p->srv && p->srv->cfg->host_id)
        r = lws_add_http_header_by_name(wsi, (const unsigned char *)"x-warren-host:",
                                        (const unsigned char *)p->srv->cfg->host_id,
                                        (int)strlen(p->srv->cfg->host_id), &pp, end);
    if (!r && p->err_code && p->status >= 400)
        r = lws_add_http_header_by_name(
            wsi, (const unsigned char *)"x-warren-error:", (const unsigned char *)p->err_code,
            (int)strlen(p->err_code), &pp, end);
    if (!r && p->watch_id) {
        char id[16];
        int n = snprintf(id, sizeof(id), "%" PRIu32, p->watch_id);
        r = lws_add_http_header_by_name(
            wsi, (const unsigned char *)"x-warren-watch:", (const unsigned char *)id, n, &pp, end);
    }
    if (!r && p->location)
        r = lws_add_http_header_by_token(wsi, WSI_TOKEN_HTTP_LOCATION,
                                         (const unsigned char *)p->location,
                                         (int)strlen(p->location), &pp, end);
    if (!r && p->run_id) {
        char run[16];
        int n = snprintf(run, sizeof(run), "%" PRIu32, p->run_id);
        r = lws_add_http_header_by_name(
            wsi, (const unsigned char *)"x-warren-run:", (const unsigned char *)run, n, &pp, end);
    }
    if (!r && p->xnext)
        r = lws_add_http_header_by_name(
            wsi, (const unsigned char *)"x-next-token:", (const unsigned char *)p->xnext,
            (int)strlen(p->xnext), &pp, end);
    if (!r && p->xpartial)
        r = lws_add_http_header_by_name(
            wsi, (const unsigned char *)"x-warren-partial:", (const unsigned char *)p->xpartial,
            (int)strlen(p->xpartial), &pp, end);
    if (!r && p->close_after)
        r = lws_add_http_header_by_token(wsi, WSI_TOKEN_CONNECTION, (const unsigned char *)"close",
                                         5, &pp, end);
    if (r || lws_finalize_write_http_header(wsi, start, &pp, end))
        return -1;
    p->hdrs_sent = true;
    resp_want_write(p);
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
        last = ob->off + n == ob->wire_len && !ob->next && http_phase_complete(p->phase);
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
        if (p->kind == RESP_NDJSON || p->kind == RESP_DOWNLOAD || p->kind == RESP_STATIC) {
            if (p->qh && !last)
                resp_stall_arm(p, true);
            else
                stall_clear(p);
        }
        if (last)
            return finish(p);
    } else if (http_phase_complete(p->phase)) {
        return finish(p);
    }
    if (p->q_bytes > HIGH_WATER)
        p->throttled = true;
    else if (p->q_bytes <= LOW_WATER)
        p->throttled = false;
    if (p->qh)
        resp_want_write(p);
    if (!p->throttled && p->kl)
        code_drained(p);
    if (!p->throttled && p->credit_pending && http_phase_op_live(p->phase)) {
        /* May call sink_data for this request right away: nothing is held across it. */
        credit = p->credit_pending;
        p->credit_pending = 0;
        sbx_op_consumed(p->srv->t, p->op, credit);
    }
    return 0;
}

int resp_writeable(struct pss *p)
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

void resp_download_begin(struct pss *p, uint64_t size)
{
    if (p->phase == HP_OP)
        req_phase(p, HP_STREAM);
    p->status = 200;
    p->kind = RESP_DOWNLOAD;
    p->clen = size;
    p->chunked = false;
    resp_stall_arm(p, false);
    resp_want_write(p);
}
