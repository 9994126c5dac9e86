/*
 * rest_code.c - the REST door of code contexts and runs: requests become one
 * exchange with the sandbox's kernel bridge (klink.h), its lines the answer.
 *
 * A run streams (Accept: application/x-ndjson) the bridge's lines as they
 * come, unchanged, with a keepalive line after run_code_keepalive_ms of
 * silence; or it is gathered into one JSON object (klink_gather). Its id is
 * the connector's pid (X-Warren-Run), and GET .../runs/{pid}?offset=N reads
 * the same lines again: the run and its output live in the guest, so a client
 * that goes away cancels only its reading, never the run.
 *
 * The request's exchange is p->kl (p->op stays 0): rest_req_end cancels it
 * through code_req_end. Errors known before the first line are HTTP statuses;
 * after it (the stream has begun) they are error lines.
 */
#include "http_int.h"

static struct klink_opts opts(const struct pss *p, bool single, bool keepalive)
{
    struct klink_opts o = {
        .max_line = p->srv->cfg->run_max_line,
        .keepalive_ms = keepalive ? p->srv->cfg->run_keepalive_ms : 0,
        .single = single,
    };
    return o;
}

/* The exchange is over: from OP or STREAM to ANSWER. */
static void to_answer(struct pss *p)
{
    p->kl = NULL; /* klink frees it once done() returns */
    if (http_phase_op_live(p->phase))
        req_phase(p, HP_ANSWER);
}

/* Out of memory while queueing: drop the connection (the run goes on, unless the
 * door abandons it). */
static void stream_oom(struct pss *p)
{
    struct klink *k = p->kl;

    LOG(LOG_ERR, "out of memory queueing run output of %s: closing the request", p->sbx);
    if (p->code_door && p->code_door->abandon)
        p->code_door->abandon(p);
    p->kl = NULL;
    p->close_after = true;
    if (http_phase_op_live(p->phase))
        req_phase(p, HP_ANSWER);
    req_complete(p);
    klink_cancel(k);
    resp_want_write(p);
}

/* One line (s, n bytes, no '\n') onto the NDJSON stream. 0 or -ENOMEM. */
static int stream_put(struct pss *p, const char *s, size_t n)
{
    if (p->kind == RESP_NONE)
        resp_ndjson_begin(p);
    if (resp_ndjson_append(p, s, n, 0) || resp_ndjson_append(p, "\n", 1, 0))
        return -ENOMEM;
    /* A slow client: the guest holds the rest (klink_resume from code_drained). */
    if (p->q_bytes > HIGH_WATER && p->kl)
        klink_pause(p->kl);
    resp_stall_arm(p, false);
    resp_want_write(p);
    return 0;
}

static int stream_obj(struct pss *p, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    int rc = s ? stream_put(p, s, strlen(s)) : -ENOMEM;

    free(s);
    return rc;
}

/* ------------------------------------------------------- streamed runs */

static void run_started(void *user, uint32_t pid)
{
    struct pss *p = user;

    p->run_id = pid;
}

static void stream_line(void *user, const struct klink_line *l)
{
    struct pss *p = user;
    int rc;

    if (p->status && p->kind != RESP_NDJSON)
        return; /* answered otherwise already */
    p->kl_lines++;
    if (l->kind == KLINK_LINE_OK && l->type) {
        rc = stream_put(p, l->p, l->n); /* the bridge's own bytes, checked */
    } else {
        json_t *o = klink_line_object(l, p->srv->cfg->run_max_line);
        rc = stream_obj(p, o);
        json_decref(o);
    }
    if (rc)
        stream_oom(p);
}

static void stream_keepalive(void *user)
{
    struct pss *p = user;
    static const char ka[] = "{\"type\":\"keepalive\"}";

    if (stream_put(p, ka, sizeof(ka) - 1))
        stream_oom(p);
}

static void stream_done(void *user, const struct sbx_err *err)
{
    struct pss *p = user;

    to_answer(p);
    if (err && p->kind == RESP_NONE) {
        if (p->code_door)
            p->code_door->fail(p, err);
        else
            resp_sbx_err(p, err);
        return;
    }
    if (err) {
        /* Mid-stream: the client learns it in the stream's own terms. */
        json_t *o = klink_error_object("KernelUnavailable", err->msg);
        int rc = stream_obj(p, o);

        json_decref(o);
        if (rc || stream_put(p, "{\"type\":\"end_of_execution\"}", 27))
            p->close_after = true;
    } else if (p->kind == RESP_NONE) {
        resp_ndjson_begin(p);
    }
    resp_ndjson_close(p);
    resp_want_write(p);
}

const struct klink_cb code_stream_cb = {
    .started = run_started,
    .line = stream_line,
    .keepalive = stream_keepalive,
    .done = stream_done,
};

/* ------------------------------------------------------- gathered runs */

static void gather_line(void *user, const struct klink_line *l)
{
    struct pss *p = user;
    json_t *o = klink_line_object(l, p->srv->cfg->run_max_line);

    p->kl_lines++;
    if (!o || klink_gather_add(p->gather, o, json_string_value(json_object_get(o, "type"))))
        p->gather->truncated = true; /* out of memory: what could not be kept is dropped */
    json_decref(o);
}

static void gather_done(void *user, const struct sbx_err *err)
{
    struct pss *p = user;
    json_t *body;

    to_answer(p);
    if (err && !p->kl_lines) {
        resp_sbx_err(p, err);
        return;
    }
    if (err) {
        json_t *o = klink_error_object("KernelUnavailable", err->msg);
        if (o)
            klink_gather_add(p->gather, o, "error");
        json_decref(o);
    }
    body = klink_gather_result(p->gather);
    if (body && p->run_id)
        json_object_set_new(body, "run_id", json_integer(p->run_id));
    if (!body) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    resp_json(p, 200, body);
}

static const struct klink_cb gather_cb = {
    .started = run_started,
    .line = gather_line,
    .done = gather_done,
};

/* ------------------------------------------------------------ contexts */

static void ctx_line(void *user, const struct klink_line *l)
{
    struct pss *p = user;

    if (l->kind != KLINK_LINE_OK || p->held)
        return;
    p->held = json_copy(l->obj); /* the answer, kept until done() */
    if (p->held)
        json_object_del(p->held, "type");
}

static void ctx_done(void *user, const struct sbx_err *err)
{
    struct pss *p = user;
    json_t *body = p->held;

    p->held = NULL;
    to_answer(p);
    if (err) {
        json_decref(body);
        resp_sbx_err(p, err);
        return;
    }
    if (!body) {
        resp_code(p, 502, "kernel_unavailable",
                  "the kernel bridge answered nothing that is a JSON object");
        return;
    }
    resp_json(p, p->route == API_R_CONTEXTS && p->method == API_POST ? 201 : 200, body);
}

static const struct klink_cb ctx_cb = {
    .line = ctx_line,
    .done = ctx_done,
};

/* Start the exchange for req; answers the error when it cannot start. */
static void start(struct pss *p, json_t *req, const struct klink_opts *o, const struct klink_cb *cb)
{
    struct sbx_err err;
    int rc;

    if (!req) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    rc = klink_request(p->srv->t, p->srv->loop, p->sbx, req, o, cb, p, &p->kl, &err);
    json_decref(req);
    if (rc) {
        resp_sbx_err(p, &err);
        return;
    }
    req_phase(p, HP_OP);
}

void code_context_op(struct pss *p, const char *op, json_t *body)
{
    struct klink_opts o = opts(p, true, false);
    struct sbx_err err;
    json_t *req;

    if (klink_context_req(op, p->ctx[0] ? p->ctx : NULL, body, &req, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    start(p, req, &o, &ctx_cb);
}

void code_run(struct pss *p, json_t *body)
{
    struct klink_opts o = opts(p, false, p->ndjson);
    struct sbx_err err;
    json_t *req;

    if (klink_run_req(body, p->srv->cfg->run_max_line, &req, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    if (!p->ndjson) {
        if (!(p->gather = malloc(sizeof(*p->gather)))) {
            json_decref(req);
            resp_code(p, 500, "internal", "out of memory");
            return;
        }
        klink_gather_init(p->gather, p->srv->cfg->run_max_gather);
    }
    start(p, req, &o, p->ndjson ? &code_stream_cb : &gather_cb);
}

void code_run_read(struct pss *p, json_t *args)
{
    struct klink_opts o = opts(p, false, true);
    uint64_t off = (uint64_t)json_integer_value(json_object_get(args, "offset"));
    struct sbx_err err;

    p->ndjson = true;
    p->run_id = p->pid;
    if (klink_read(p->srv->t, p->srv->loop, p->sbx, p->pid, off, &o, &code_stream_cb, p, &p->kl,
                   &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    req_phase(p, HP_OP);
}

void code_req_end(struct pss *p)
{
    struct klink *k = p->kl;

    p->kl = NULL;
    klink_cancel(k);
    if (p->gather) {
        klink_gather_free(p->gather);
        free(p->gather);
        p->gather = NULL;
    }
    p->kl_lines = 0;
    p->run_id = 0;
    p->code_door = NULL;
}

void code_drained(struct pss *p)
{
    klink_resume(p->kl);
}
