/*
 * jupyter_rest.c - the REST half of Jupyter's kernel API (jupyter.h):
 * kernelspecs from jupyter_kernelspecs, kernels as sandboxes tagged with
 * their id in metadata, and interrupt/restart through the guest's kernel
 * bridge (docs/KERNELD.md), reached by a foreground exec of its connector.
 *
 * Async answers follow rest.c's sink discipline: the pss is the sink's user,
 * an answer is made only while the request's op is live (http_phase_op_live),
 * and rest_req_end cancels the op when the client goes away.
 */
#include "cred.h"
#include "http_int.h"
#include "jupyter.h"
#include "util.h"

#define CONNECT_ARGV   "/proc/1/exe", "--connect", "/run/warren/kernel.sock"
#define KCTL_TIMEOUT_S 60

static void set_err(struct api_err *e, int status, const char *code, const char *msg)
{
    e->status = status;
    e->code = code;
    snprintf(e->msg, sizeof(e->msg), "%.200s", msg);
}

int jup_authorize(struct lws *wsi, const char *key, struct api_err *e)
{
    char authz[512], frag[512];
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_AUTHORIZATION);
    bool given = false;

    if (n > 0) {
        if (n < (int)sizeof(authz) &&
            lws_hdr_copy(wsi, authz, sizeof(authz), WSI_TOKEN_HTTP_AUTHORIZATION) >= 0 &&
            cred_is_key(authz, strlen(authz), key)) {
            explicit_bzero(authz, sizeof(authz));
            return 0;
        }
        explicit_bzero(authz, sizeof(authz));
        set_err(e, 403, "forbidden",
                "wrong 'Authorization: token <key>' (or 'Bearer <key>') for this server");
        return -1;
    }
    for (int i = 0; i < QUERY_FRAGS_MAX; i++) {
        int len = lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i);
        if (len <= 0) {
            if (lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i) < 0)
                break;
            continue;
        }
        if (len >= (int)sizeof(frag) ||
            lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i) < 0)
            continue;
        if (!cred_pair_named(frag, strlen(frag), CRED_KEY_PARAM))
            continue;
        given = true;
        if (cred_query_key(frag, strlen(frag), key)) {
            explicit_bzero(frag, sizeof(frag));
            return 0;
        }
    }
    explicit_bzero(frag, sizeof(frag));
    if (given)
        set_err(e, 403, "forbidden", "wrong ?token=<key> for this server");
    else
        set_err(e, 401, "unauthorized",
                "missing 'Authorization: token <key>' (or 'Bearer <key>', or ?token=<key>)");
    return -1;
}

/* The configured kernelspecs: their count, or 0 after answering 500. */
static int specs(struct pss *p, struct jup_spec *s)
{
    int n = jup_specs_parse(p->srv->cfg->jup_kernelspecs, s, JUP_SPECS_MAX);

    if (n <= 0) {
        resp_code(p, 500, "internal", "jupyter_kernelspecs is malformed (see conf/warren.conf)");
        return 0;
    }
    return n;
}

static const struct jup_spec *spec_named(const struct jup_spec *s, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].name, name))
            return &s[i];
    return NULL;
}

void jup_specs_list(struct pss *p, json_t *args)
{
    struct jup_spec s[JUP_SPECS_MAX];
    int n = specs(p, s);
    json_t *all;

    (void)args;
    if (!n)
        return;
    all = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(all, s[i].name, jup_spec_json(&s[i]));
    /* Jupyter's clients expect "python3" as the default when it exists. */
    resp_json(p, 200,
              json_pack("{s:s, s:o}", "default",
                        spec_named(s, n, "python3") ? "python3" : s[0].name, "kernelspecs", all));
}

void jup_spec_get(struct pss *p, json_t *args)
{
    struct jup_spec s[JUP_SPECS_MAX];
    const struct jup_spec *one;
    int n = specs(p, s);

    (void)args;
    if (!n)
        return;
    if (!(one = spec_named(s, n, p->sbx))) {
        resp_json(p, 404, api_error("kernelspec_not_found", "no kernelspec named '%.64s'", p->sbx));
        return;
    }
    resp_json(p, 200, jup_spec_json(one));
}

static bool rec_live(json_t *rec)
{
    const char *st = json_string_value(json_object_get(rec, "state"));

    return !st || (strcmp(st, "ended") && strcmp(st, "dead"));
}

static json_t *now_iso(void)
{
    char buf[UTIL_ISO_MAX];
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    if (!util_iso_time_ms((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000, buf, sizeof(buf)))
        return json_string("1970-01-01T00:00:00.000Z");
    return json_string(buf);
}

/* The model of the kernel whose sandbox record is rec. */
static json_t *model_of(json_t *rec)
{
    json_t *meta = json_object_get(rec, "metadata"), *m, *t = now_iso();
    const char *id = json_string_value(json_object_get(meta, JUP_META_ID));
    const char *spec = json_string_value(json_object_get(meta, JUP_META_SPEC));

    m = jup_model(id ? id : "", spec ? spec : "", json_string_value(t),
                  jup_ws_count(json_string_value(json_object_get(rec, "id"))));
    json_decref(t);
    return m;
}

int jup_kernel_sbx(struct http_server *srv, const char *id, char *sbx, char *spec,
                   struct api_err *e)
{
    struct sbx_err err;
    json_t *filter, *out = NULL, *rec;
    size_t i;
    int rc = -1;

    set_err(e, 404, "kernel_not_found", "no such kernel");
    if (!jup_uuid_valid(id))
        return -1;
    if (!(filter = json_pack("{s:s}", JUP_META_ID, id)))
        return -1;
    if (sbx_list(srv->t, NULL, filter, &out, &err)) {
        json_decref(filter);
        set_err(e, sbx_err_http_status(err.code), sbx_err_name(err.code), err.msg);
        return -1;
    }
    json_decref(filter);
    json_array_foreach(json_object_get(out, "sandboxes"), i, rec)
    {
        const char *s = json_string_value(json_object_get(rec, "id"));
        const char *sp =
            json_string_value(json_object_get(json_object_get(rec, "metadata"), JUP_META_SPEC));
        if (!s || !rec_live(rec) || strlen(s) > API_ID_MAX)
            continue;
        memcpy(sbx, s, strlen(s) + 1);
        if (spec)
            snprintf(spec, JUP_NAME_MAX + 1, "%s", sp ? sp : "");
        rc = 0;
        break;
    }
    json_decref(out);
    return rc;
}

void jup_kernels_list(struct pss *p, json_t *args)
{
    struct sbx_err err;
    json_t *out = NULL, *rec, *list;
    size_t i;

    (void)args;
    if (sbx_list(p->srv->t, NULL, NULL, &out, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    list = json_array();
    json_array_foreach(json_object_get(out, "sandboxes"), i, rec)
    {
        if (rec_live(rec) && json_object_get(json_object_get(rec, "metadata"), JUP_META_ID))
            json_array_append_new(list, model_of(rec));
    }
    json_decref(out);
    resp_json(p, 200, list);
}

/* ------------------------------------------------------------- create */

static void on_created(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;

    if (!http_phase_op_live(p->phase)) {
        json_decref(body);
        return;
    }
    req_phase(p, HP_ANSWER);
    if (err) {
        json_decref(body);
        resp_sbx_err(p, err);
        return;
    }
    LOG(LOG_INFO, "%s: Jupyter kernel %s started", json_string_value(json_object_get(body, "id")),
        json_string_value(json_object_get(json_object_get(body, "metadata"), JUP_META_ID)));
    resp_json(p, 201, model_of(body));
    json_decref(body);
}

static const struct sbx_sink create_sink = {.done = on_created};

void jup_kernel_create(struct pss *p, json_t *body)
{
    struct jup_spec s[JUP_SPECS_MAX];
    const struct jup_spec *one;
    const char *name;
    json_t *v, *req;
    struct sbx_err err;
    char id[JUP_UUID_LEN + 1];
    int n = specs(p, s), rc;

    if (!n)
        return;
    v = json_object_get(body, "name");
    if (v && !json_is_null(v) && !json_is_string(v)) {
        resp_code(p, 400, "invalid_argument", "name must be a kernelspec's name");
        return;
    }
    name = json_is_string(v) ? json_string_value(v) : NULL;
    if (!name || !*name)
        name = spec_named(s, n, "python3") ? "python3" : s[0].name;
    if (!(one = spec_named(s, n, name))) {
        resp_json(p, 404, api_error("kernelspec_not_found", "no kernelspec named '%.64s'", name));
        return;
    }
    v = json_object_get(body, "env");
    if (v && !json_is_null(v) && !json_is_object(v)) {
        resp_code(p, 400, "invalid_argument", "env must be an object");
        return;
    }
    if (jup_uuid_new(id)) {
        resp_code(p, 500, "internal", "no random bytes for a kernel id");
        return;
    }
    /* A kernel lives until it is deleted: the longest TTL and no idle limit. Its
     * KERNEL_* env (launch timeout, working dir) is the gateway's, not the kernel's. */
    req = json_pack("{s:s, s:{s:s, s:s}, s:I, s:I}", "template", one->tmpl, "metadata", JUP_META_ID,
                    id, JUP_META_SPEC, one->name, "ttl_seconds", (json_int_t)p->srv->cfg->max_ttl_s,
                    "idle_timeout_seconds", (json_int_t)0);
    if (!req) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    rc = sbx_create(p->srv->t, req, &create_sink, p, &p->op, &err);
    json_decref(req);
    if (rc) {
        resp_sbx_err(p, &err);
        return;
    }
    req_phase(p, HP_OP);
}

void jup_kernel_get(struct pss *p, json_t *args)
{
    char sbx[API_ID_MAX + 1];
    struct api_err e;
    struct sbx_err err;
    json_t *rec = NULL;

    (void)args;
    if (jup_kernel_sbx(p->srv, p->sbx, sbx, NULL, &e)) {
        resp_api_err(p, &e);
        return;
    }
    if (sbx_get(p->srv->t, sbx, &rec, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    resp_json(p, 200, model_of(rec));
    json_decref(rec);
}

void jup_kernel_delete(struct pss *p, json_t *args)
{
    char sbx[API_ID_MAX + 1];
    struct api_err e;
    struct sbx_err err;
    json_t *rec = NULL;

    (void)args;
    if (jup_kernel_sbx(p->srv, p->sbx, sbx, NULL, &e)) {
        resp_api_err(p, &e);
        return;
    }
    if (sbx_delete(p->srv->t, sbx, &rec, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    json_decref(rec);
    jup_ws_forget(sbx);
    LOG(LOG_INFO, "%s: Jupyter kernel %s deleted", sbx, p->sbx);
    resp_empty(p, 204);
}

/* ------------------------------------------------- interrupt, restart */

/* p->held while one runs: {"kernel": id, "sbx": sandbox, "action": "interrupt"|"restart",
 * "stage": "list"|"act"}. */

static int kctl_exec(struct pss *p, const char *sbx, json_t *req, struct sbx_err *err);

static const char *str_or(json_t *v, const char *dflt)
{
    return json_is_string(v) ? json_string_value(v) : dflt;
}

/* The first line the bridge answered, parsed; NULL with msg when it failed. */
static json_t *kctl_answer(json_t *body, char *msg, size_t cap)
{
    const char *out = json_string_value(json_object_get(body, "stdout"));
    json_t *a;

    if (!out || !*out) {
        snprintf(msg, cap,
                 "the kernel bridge gave no answer (exit %lld): is this a kernel template?",
                 (long long)json_integer_value(json_object_get(body, "exit_code")));
        return NULL;
    }
    a = json_loadb(out, strcspn(out, "\n"), 0, NULL);
    if (!json_is_object(a)) {
        json_decref(a);
        snprintf(msg, cap, "the kernel bridge's answer is not a JSON object");
        return NULL;
    }
    if (!strcmp(str_or(json_object_get(a, "type"), ""), "fail")) {
        snprintf(msg, cap, "the kernel bridge refused: %.150s",
                 str_or(json_object_get(a, "message"), "no reason given"));
        json_decref(a);
        return NULL;
    }
    return a;
}

/* The next request of a list stage's answer a: the action on the default python
 * context (the kernel the channels talk to), or NULL with msg. */
static json_t *kctl_next(json_t *a, const char *action, char *msg, size_t cap)
{
    const char *ctx = NULL;
    json_t *c;
    size_t i;

    json_array_foreach(json_object_get(a, "contexts"), i, c)
    {
        if (json_is_true(json_object_get(c, "default")) &&
            !strcmp(str_or(json_object_get(c, "language"), ""), "python"))
            ctx = json_string_value(json_object_get(c, "id"));
    }
    if (!ctx) {
        snprintf(msg, cap, "the kernel bridge lists no default python context");
        return NULL;
    }
    return json_pack("{s:s, s:s}", "op",
                     !strcmp(action, "restart") ? "context_restart" : "context_interrupt", "id",
                     ctx);
}

static void on_kctl(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;
    json_t *st = p->held, *a, *req = NULL, *rec = NULL;
    const char *stage = str_or(json_object_get(st, "stage"), "");
    const char *action = str_or(json_object_get(st, "action"), "");
    const char *sbx = str_or(json_object_get(st, "sbx"), "");
    struct sbx_err e2;
    char msg[200];

    if (!http_phase_op_live(p->phase)) {
        json_decref(body);
        return;
    }
    if (err) {
        json_decref(body);
        req_phase(p, HP_ANSWER);
        resp_sbx_err(p, err);
        return;
    }
    a = kctl_answer(body, msg, sizeof(msg));
    json_decref(body);
    if (a && !strcmp(stage, "list")) {
        req = kctl_next(a, action, msg, sizeof(msg));
        json_decref(a);
        if (!req)
            a = NULL;
        else if (json_object_set_new(st, "stage", json_string("act")) == 0 &&
                 kctl_exec(p, sbx, req, &e2) == 0) {
            json_decref(req);
            return; /* the op goes on with the action */
        } else {
            json_decref(req);
            req_phase(p, HP_ANSWER);
            resp_code(p, 500, "internal", "cannot start the kernel bridge's connector");
            return;
        }
    }
    req_phase(p, HP_ANSWER);
    if (!a) {
        resp_code(p, 502, "kernel_bridge_failed", msg);
        return;
    }
    json_decref(a);
    LOG(LOG_INFO, "%s: Jupyter kernel %s: %s", sbx, p->sbx, action);
    if (strcmp(action, "restart")) {
        resp_empty(p, 204);
        return;
    }
    if (sbx_get(p->srv->t, sbx, &rec, &e2)) {
        resp_sbx_err(p, &e2);
        return;
    }
    resp_json(p, 200, model_of(rec));
    json_decref(rec);
}

static const struct sbx_sink kctl_sink = {.done = on_kctl};

/* One request to the guest's kernel bridge, by a foreground exec of its connector. */
static int kctl_exec(struct pss *p, const char *sbx, json_t *req, struct sbx_err *err)
{
    char *line = json_dumps(req, JSON_COMPACT);
    json_t *body;
    int rc;

    if (!line)
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    body = json_pack("{s:[s,s,s], s:s, s:s++, s:I}", "argv", CONNECT_ARGV, "user", "root", "stdin",
                     line, "\n", "timeout_seconds", (json_int_t)KCTL_TIMEOUT_S);
    free(line);
    if (!body)
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    rc = sbx_exec(p->srv->t, sbx, body, false, &kctl_sink, p, &p->op, err);
    json_decref(body);
    /* A second request (the action after the list) runs within the same live op. */
    if (rc == 0 && !http_phase_op_live(p->phase))
        req_phase(p, HP_OP);
    return rc;
}

static void kctl_start(struct pss *p, const char *action)
{
    char sbx[API_ID_MAX + 1];
    struct api_err e;
    struct sbx_err err;
    json_t *req;

    if (jup_kernel_sbx(p->srv, p->sbx, sbx, NULL, &e)) {
        resp_api_err(p, &e);
        return;
    }
    json_decref(p->held);
    p->held = json_pack("{s:s, s:s, s:s}", "sbx", sbx, "action", action, "stage", "list");
    req = json_pack("{s:s}", "op", "context_list");
    if (!p->held || !req) {
        json_decref(req);
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    if (kctl_exec(p, sbx, req, &err))
        resp_sbx_err(p, &err);
    json_decref(req);
}

void jup_kernel_interrupt(struct pss *p, json_t *body)
{
    (void)body;
    kctl_start(p, "interrupt");
}

void jup_kernel_restart(struct pss *p, json_t *body)
{
    (void)body;
    kctl_start(p, "restart");
}
