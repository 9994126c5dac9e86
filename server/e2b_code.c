/*
 * e2b_code.c - E2B's code interpreter (port 49999) on the envd door, so that
 * the unmodified @e2b/code-interpreter SDK runs code in a Warren sandbox:
 * POST /execute (a run, answered with E2B's NDJSON lines), POST and GET
 * /contexts, POST /contexts/{id}/restart, DELETE /contexts/{id}, GET /health
 * (../shared/clients/E2B-WIRE.md, section 2).
 *
 * A codec over the kernel bridge (klink.h), never a second kernel client:
 * kerneld already speaks E2B's lines, so a run's lines pass through as they
 * come, with a keepalive line after run_code_keepalive_ms of silence, and
 * end_of_execution always last. Contexts are kerneld's, reshaped to E2B's
 * {id, language, cwd}.
 *
 * Unlike Warren's own REST door, a client that goes away before the end
 * interrupts its run, as upstream does: the SDK aborts on its timeoutMs and
 * expects the context to be free for the next run, not still busy with a
 * cell nobody reads.
 *
 * Errors are plain text, as upstream's server answers them; the SDK turns
 * 404 into NotFoundError, 502 into TimeoutError, anything else into
 * SandboxError with the status.
 *
 * State: the route (e2b_code_route) lives in envd.c's per-request struct;
 * the exchange is p->kl and the run's id p->run_id, as for rest_code.c, so
 * that rest_req_end (code_req_end) and the writer (code_drained) treat it
 * the same way.
 */
#include "http_int.h"
#include "e2b_code.h"

/* ------------------------------------------------------------ answers */

/* A plain-text answer (upstream's PlainTextResponse). */
static void text(struct pss *p, int status, const char *msg)
{
    size_t n = strlen(msg);
    struct obuf *ob;

    if (p->status)
        return;
    if (!(ob = resp_q_room(p, n + 1))) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    memcpy(OB_PAYLOAD(ob) + ob->len, msg, n);
    resp_q_grew(p, ob, n, 0);
    p->status = status;
    p->kind = RESP_STATIC;
    p->ctype = "text/plain; charset=utf-8";
    p->clen = n;
    p->chunked = false;
    req_complete(p);
    if (!p->body_done)
        p->close_after = true;
    resp_want_write(p);
}

static void textf(struct pss *p, int status, const char *fmt, const char *arg)
{
    char buf[512];

    snprintf(buf, sizeof(buf), fmt, arg);
    text(p, status, buf);
}

/* A core or kerneld error in E2B's terms. */
static void sbx_error(struct pss *p, const struct sbx_err *err)
{
    switch (err->code) {
    case SBX_E_CONTEXT_NOT_FOUND:
        if (p->ctx[0])
            textf(p, 404, "Context %s not found", p->ctx);
        else
            text(p, 404, err->msg);
        return;
    case SBX_E_INVALID_ARGUMENT:
        text(p, 400, err->msg);
        return;
    case SBX_E_NO_KERNEL:
    case SBX_E_KERNEL_UNAVAILABLE:
        /* upstream's proxy answers 502 when nothing listens on 49999 */
        text(p, 502, err->msg);
        return;
    default:
        text(p, api_status_of(err->code), err->msg);
    }
}

/* ------------------------------------------------------------ runs */

static void to_answer(struct pss *p)
{
    p->kl = NULL; /* klink frees it once done() returns */
    if (http_phase_op_live(p->phase))
        req_phase(p, HP_ANSWER);
}

static void stop_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    (void)user;
    (void)res;
    if (err)
        LOG(LOG_INFO, "interrupting an abandoned code run: %s", err->msg);
}

static const struct sbx_sink stop_sink = {.done = stop_done};

/* A run whose reader goes away before end_of_execution: end its connector, so that
 * kerneld interrupts the cell and the context is free for the next run. */
static void interrupt(struct pss *p)
{
    struct sbx_err err;
    sbx_op_t op;

    if (p->kl && p->run_id && p->srv &&
        klink_stop(p->srv->t, p->sbx, p->run_id, &stop_sink, NULL, &op, &err))
        LOG(LOG_INFO, "cannot interrupt an abandoned code run of %s: %s", p->sbx, err.msg);
}

/* The run of a stream the server dropped is interrupted, as one whose client left. */
static void abandon(struct pss *p)
{
    interrupt(p);
}

/* A run's lines are rest_code.c's stream (the bridge's lines are E2B's already); an
 * error before the first line is answered in plain text, as upstream does. */
static const struct code_door door = {.fail = sbx_error, .abandon = abandon};

/* ------------------------------------------------------------ contexts */

static void ctx_line(void *user, const struct klink_line *l)
{
    struct pss *p = user;

    if (l->kind != KLINK_LINE_OK || p->held)
        return;
    p->held = json_incref(l->obj); /* the answer, kept until done() */
}

/* kerneld's context object as E2B's {id, language, cwd}. NULL when it is not one. */
static json_t *e2b_ctx(json_t *c)
{
    json_t *id = json_object_get(c, "id"), *lang = json_object_get(c, "language");
    json_t *cwd = json_object_get(c, "cwd");

    if (!json_is_string(id) || !json_is_string(lang))
        return NULL;
    return json_pack("{s:O, s:O, s:O}", "id", id, "language", lang, "cwd",
                     json_is_string(cwd) ? cwd : json_null());
}

enum shape { SHAPE_LIST, SHAPE_ONE, SHAPE_EMPTY };

static void ctx_answer(struct pss *p, const struct sbx_err *err, enum shape sh)
{
    json_t *got = p->held, *body = NULL;

    p->held = NULL;
    to_answer(p);
    if (err) {
        json_decref(got);
        sbx_error(p, err);
        return;
    }
    if (sh == SHAPE_LIST) {
        json_t *list = json_object_get(got, "contexts"), *c;
        size_t i;
        if (json_is_array(list) && (body = json_array()))
            json_array_foreach(list, i, c)
            {
                json_t *o = e2b_ctx(c);
                if (o)
                    json_array_append_new(body, o);
            }
    } else if (sh == SHAPE_ONE) {
        body = e2b_ctx(got);
    } else if (got) {
        body = json_object(); /* restart and delete: upstream's body is ignored */
    }
    json_decref(got);
    if (!body) {
        text(p, 502, "the kernel bridge gave no answer of the expected shape");
        return;
    }
    resp_json(p, 200, body);
}

static void list_done(void *user, const struct sbx_err *err)
{
    ctx_answer(user, err, SHAPE_LIST);
}

static void one_done(void *user, const struct sbx_err *err)
{
    ctx_answer(user, err, SHAPE_ONE);
}

static void empty_done(void *user, const struct sbx_err *err)
{
    ctx_answer(user, err, SHAPE_EMPTY);
}

static const struct klink_cb list_cb = {.line = ctx_line, .done = list_done};
static const struct klink_cb one_cb = {.line = ctx_line, .done = one_done};
static const struct klink_cb empty_cb = {.line = ctx_line, .done = empty_done};

/* ------------------------------------------------------------ requests */

static void start(struct pss *p, json_t *req, const struct klink_cb *cb)
{
    bool run = cb == &code_stream_cb;
    struct klink_opts o = {
        .max_line = p->srv->cfg->run_max_line,
        .keepalive_ms = run ? p->srv->cfg->run_keepalive_ms : 0,
        .single = !run,
    };
    struct sbx_err err;
    int rc;

    rc = klink_request(p->srv->t, p->srv->loop, p->sbx, req, &o, cb, p, &p->kl, &err);
    json_decref(req);
    if (rc) {
        sbx_error(p, &err);
        return;
    }
    req_phase(p, HP_OP);
}

static void execute(struct pss *p, json_t *body)
{
    char msg[256];
    json_t *run, *req;
    struct sbx_err err;
    int st = e2b_code_exec_body(body, &run, msg, sizeof(msg));

    if (st) {
        text(p, st, msg);
        return;
    }
    if (json_is_string(json_object_get(run, "context_id")))
        snprintf(p->ctx, sizeof(p->ctx), "%s",
                 json_string_value(json_object_get(run, "context_id")));
    if (klink_run_req(run, p->srv->cfg->run_max_line, &req, &err)) {
        json_decref(run);
        sbx_error(p, &err);
        return;
    }
    json_decref(run);
    p->code_door = &door;
    start(p, req, &code_stream_cb);
}

static void create(struct pss *p, json_t *body)
{
    char msg[256];
    struct sbx_err err;
    json_t *args, *req;
    int st = e2b_code_create_body(body, &args, msg, sizeof(msg));

    if (st) {
        text(p, st, msg);
        return;
    }
    if (klink_context_req("context_create", NULL, args, &req, &err)) {
        json_decref(args);
        sbx_error(p, &err);
        return;
    }
    json_decref(args);
    start(p, req, &one_cb);
}

static void ctx_op(struct pss *p, const char *op, const struct klink_cb *cb)
{
    struct sbx_err err;
    json_t *req;

    if (klink_context_req(op, p->ctx[0] ? p->ctx : NULL, NULL, &req, &err)) {
        sbx_error(p, &err);
        return;
    }
    start(p, req, cb);
}

int e2b_code_request(struct pss *p, const char *uri, int has_cl, uint64_t cl,
                     enum e2b_code_route *route)
{
    int status;
    enum e2b_code_route r = e2b_code_route_of(uri, p->method, p->ctx, &status);

    *route = r;
    if (status) {
        p->close_after = true;
        if (r == E2B_CODE_BAD_ID)
            text(p, 404, "Context not found: no context has such an id");
        else
            text(p, status, status == 405 ? "Method Not Allowed" : "Not Found");
        return -1;
    }
    if (r == E2B_CODE_HEALTH) {
        text(p, 200, "OK");
        return -1;
    }
    if (r == E2B_CODE_EXECUTE) {
        /* A run executes code as the sandbox's user: it takes envd's own token too, as
         * upstream's SDK sends it on /execute. */
        char got[TOKEN_E2B_LEN + 2];
        int n = lws_hdr_custom_length(p->wsi, "x-access-token:", 15);
        if (n > 0 && n < (int)sizeof(got))
            n = lws_hdr_custom_copy(p->wsi, got, sizeof(got), "x-access-token:", 15);
        else
            n = n > 0 ? -1 : 0;
        if (!token_e2b_check(p->srv->token_key, "envd", p->sbx, got, n > 0 ? (size_t)n : 0)) {
            p->close_after = true;
            text(p, 401, "X-Access-Token must be this sandbox's envdAccessToken");
            return -1;
        }
    }
    rest_want_body(p, has_cl, cl);
    return 0;
}

void e2b_code_body(struct pss *p)
{
    json_t *msg;
    json_error_t je;

    msg =
        p->body_len ? json_loadb(p->body, p->body_len, JSON_REJECT_DUPLICATES, &je) : json_object();
    if (!json_is_object(msg)) {
        char m[256];
        json_decref(msg);
        snprintf(m, sizeof(m), "the body must be one JSON object%s%s", msg ? "" : ": ",
                 msg ? "" : je.text);
        text(p, 400, m);
        return;
    }
    free(p->body);
    p->body = NULL;
    envd_run(p, msg);
    json_decref(msg);
}

void e2b_code_run(struct pss *p, enum e2b_code_route r, json_t *body)
{
    switch (r) {
    case E2B_CODE_EXECUTE:
        execute(p, body);
        return;
    case E2B_CODE_CREATE:
        create(p, body);
        return;
    case E2B_CODE_LIST:
        ctx_op(p, "context_list", &list_cb);
        return;
    case E2B_CODE_RESTART:
        ctx_op(p, "context_restart", &empty_cb);
        return;
    case E2B_CODE_DELETE:
        ctx_op(p, "context_delete", &empty_cb);
        return;
    default:
        text(p, 404, "Not Found");
    }
}

void e2b_code_end(struct pss *p)
{
    interrupt(p);
}
