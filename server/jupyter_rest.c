/*
 * jupyter_rest.c - the REST half of Jupyter's kernel API (jupyter.h):
 * kernelspecs from jupyter_kernelspecs, kernels as sandboxes tagged with
 * their id in metadata, and interrupt/restart through the guest's kernel
 * bridge (docs/KERNELD.md), reached through klink.h.
 *
 * Async answers follow rest.c's sink discipline: the pss is the sink's user,
 * an answer is made only while the request's op is live (http_phase_op_live),
 * and rest_req_end cancels the op when the client goes away.
 */
#include "cred.h"
#include "http_int.h"
#include "sbx_json.h"
#include "jupyter.h"
#include "klink.h"
#include "util.h"

/* A cold kernel imports numpy, pandas and matplotlib: minutes under TCG. */
#define JUP_WARM_TIMEOUT_S 900
#define JUP_WARM_TRIES     3

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
    const char *sbx = json_string_value(json_object_get(rec, "id"));

    m = jup_model(id ? id : "", spec ? spec : "", json_string_value(t), jup_ws_state(sbx),
                  jup_ws_count(sbx));
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
    if (!jup_id_valid(id))
        return -1;
    if (!(filter = json_pack("{s:s}", JUP_META_ID, id)))
        return -1;
    if (sbx_json_list(srv->t, NULL, filter, &out, &err)) {
        json_decref(filter);
        set_err(e, api_status_of(err.code), sbx_err_name(err.code), err.msg);
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
    if (sbx_json_list(p->srv->t, NULL, NULL, &out, &err)) {
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

static void on_warmed(void *user, const struct sbx_err *err, const struct sbx_result *res);
static const struct sbx_sink warm_sink = {.done = on_warmed};

/* Run the template's warm-up in the new kernel's sandbox (p->held, its record), in the
 * request's live op. 0, or an sbx_errcode with *err. */
static int warm_start(struct pss *p, struct sbx_err *err)
{
    json_t *req = json_pack("{s:s, s:s, s:I}", "cmd", "/etc/warren/warm", "user", "root",
                            "timeout_seconds", (json_int_t)JUP_WARM_TIMEOUT_S);
    int rc = req ? sbx_json_call_exec(p->srv->t, json_string_value(json_object_get(p->held, "id")),
                                      req, false, &warm_sink, p, &p->op, err)
                 : sbx_err_set(err, SBX_E_INTERNAL, "out of memory");

    json_decref(req);
    return rc;
}

static int warm(struct pss *p)
{
    struct sbx_err err;

    return warm_start(p, &err);
}

/* The kernel's sandbox warmed (/etc/warren/warm, docs/KERNELD.md: its kernel bridge is
 * up, libraries imported); p->held is its record. A template warmed already at create
 * answers at once. */
static void on_warmed_json(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;
    json_t *rec = p->held, *gone = NULL;
    const char *sbx = json_string_value(json_object_get(rec, "id"));
    struct sbx_err e2;
    char msg[240];

    if (!http_phase_op_live(p->phase)) {
        json_decref(body);
        return;
    }
    if (!err && json_integer_value(json_object_get(body, "exit_code")) == 0 &&
        json_is_integer(json_object_get(body, "exit_code"))) {
        json_decref(body);
        req_phase(p, HP_ANSWER);
        LOG(LOG_INFO, "%s: Jupyter kernel %s started", sbx,
            json_string_value(json_object_get(json_object_get(rec, "metadata"), JUP_META_ID)));
        resp_json(p, 201, model_of(rec));
        return;
    }
    if (!err && ++p->kctl_stage < JUP_WARM_TRIES && warm(p) == 0) {
        /* A kernel that did not answer in time under a loaded TCG host often does at a
         * second try: the first one paid for reading and compiling its libraries. */
        LOG(LOG_INFO, "%s: warm-up failed (%.120s): trying again", sbx ? sbx : "?",
            json_string_value(json_object_get(body, "stderr"))
                ? json_string_value(json_object_get(body, "stderr"))
                : "");
        json_decref(body);
        return;
    }
    snprintf(msg, sizeof(msg), "the kernel did not start: %.180s",
             err ? err->msg
             : json_string_value(json_object_get(body, "stderr"))
                 ? json_string_value(json_object_get(body, "stderr"))
                 : "its warm-up failed");
    json_decref(body);
    req_phase(p, HP_ANSWER);
    /* A kernel that cannot run is not left behind as a sandbox. */
    if (sbx && sbx_json_delete(p->srv->t, sbx, &gone, &e2) == 0)
        json_decref(gone);
    LOG(LOG_WARN, "%s: %s", sbx ? sbx : "?", msg);
    resp_code(p, 502, "kernel_start_failed", msg);
}
SBX_JSON_DONE(on_warmed, on_warmed_json)

static void on_created_json(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;
    struct sbx_err e2;

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
    json_decref(p->held);
    p->held = body;
    p->kctl_stage = 0;
    if (warm_start(p, &e2)) {
        req_phase(p, HP_ANSWER);
        resp_sbx_err(p, &e2);
    }
}
SBX_JSON_DONE(on_created, on_created_json)

static const struct sbx_sink create_sink = {.done = on_created};

void jup_kernel_create(struct pss *p, json_t *body)
{
    struct jup_spec s[JUP_SPECS_MAX];
    const struct jup_spec *one;
    const char *name;
    json_t *v, *req;
    struct sbx_err err;
    char id[JUP_ID_MAX + 1];
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
    if (jup_id_new(id, p->srv->cfg->host_id)) {
        resp_code(p, 500, "internal", "no random bytes for a kernel id");
        return;
    }
    /* A kernel lives until it is deleted: the longest TTL and no idle limit. Its
     * KERNEL_* env (launch timeout, working dir) is the gateway's, not the kernel's. */
    req = json_pack("{s:s, s:{s:s, s:s}, s:I, s:I}", "template", one->tmpl, "metadata", JUP_META_ID,
                    id, JUP_META_SPEC, one->name, "ttl_seconds", (json_int_t)p->srv->cfg->max_ttl_s,
                    "idle_timeout_seconds", (json_int_t)0);
    if (req && p->srv->cfg->jup_memory_mb)
        json_object_set_new(req, "memory_mb", json_integer(p->srv->cfg->jup_memory_mb));
    if (!req) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    rc = sbx_json_call_create(p->srv->t, req, &create_sink, p, &p->op, &err);
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
    if (sbx_json_get(p->srv->t, sbx, &rec, &err)) {
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
    if (sbx_json_delete(p->srv->t, sbx, &rec, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    json_decref(rec);
    jup_ws_forget(sbx);
    LOG(LOG_INFO, "%s: Jupyter kernel %s deleted", sbx, p->sbx);
    resp_empty(p, 204);
}

/* ------------------------------------------------- interrupt, restart */

/*
 * Two exchanges with the guest's kernel bridge (klink.h), in p->kl: context_list finds
 * the default python context (the kernel the channels talk to), then context_interrupt
 * or context_restart on it. p->held is the action's name, p->sbx the kernel's sandbox
 * (the kernel's id is no longer needed), p->ctx the context once found.
 */

static const char *action_of(const struct pss *p)
{
    return json_is_string(p->held) ? json_string_value(p->held) : "interrupt";
}

static void kctl_line(void *user, const struct klink_line *l)
{
    struct pss *p = user;
    json_t *c;
    size_t i;

    if (l->kind != KLINK_LINE_OK || p->ctx[0])
        return;
    json_array_foreach(json_object_get(l->obj, "contexts"), i, c)
    {
        const char *id = json_string_value(json_object_get(c, "id"));
        const char *lang = json_string_value(json_object_get(c, "language"));
        if (json_is_true(json_object_get(c, "default")) && lang && !strcmp(lang, "python") && id &&
            strlen(id) <= API_ID_MAX)
            snprintf(p->ctx, sizeof(p->ctx), "%s", id);
    }
}

static void kctl_done(void *user, const struct sbx_err *err);

static const struct klink_cb kctl_cb = {
    .line = kctl_line,
    .done = kctl_done,
};

static int kctl_request(struct pss *p, const char *op, struct sbx_err *err)
{
    struct klink_opts o = {.max_line = p->srv->cfg->jup_max_msg, .single = true};
    json_t *req = NULL;
    int rc;

    if ((rc = klink_context_req(op, p->ctx[0] ? p->ctx : NULL, NULL, &req, err)))
        return rc;
    rc = klink_request(p->srv->t, p->srv->loop, p->sbx, req, &o, &kctl_cb, p, &p->kl, err);
    json_decref(req);
    return rc;
}

static void kctl_done(void *user, const struct sbx_err *err)
{
    struct pss *p = user;
    const char *action = action_of(p);
    struct sbx_err e2;
    json_t *rec = NULL;

    p->kl = NULL; /* klink frees it once this returns */
    if (!http_phase_op_live(p->phase))
        return;
    if (!err && !p->ctx[0]) {
        req_phase(p, HP_ANSWER);
        resp_code(p, 502, "kernel_bridge_failed",
                  "the kernel bridge lists no default python context");
        return;
    }
    if (!err && p->kctl_stage == 0) {
        /* The list is in: now the action, within the same live request. */
        p->kctl_stage = 1;
        if (kctl_request(p, !strcmp(action, "restart") ? "context_restart" : "context_interrupt",
                         &e2) == 0)
            return;
        err = &e2;
    }
    req_phase(p, HP_ANSWER);
    if (err) {
        resp_sbx_err(p, err);
        return;
    }
    LOG(LOG_INFO, "%s: Jupyter kernel: %s", p->sbx, action);
    if (strcmp(action, "restart")) {
        resp_empty(p, 204);
        return;
    }
    if (sbx_json_get(p->srv->t, p->sbx, &rec, &e2)) {
        resp_sbx_err(p, &e2);
        return;
    }
    resp_json(p, 200, model_of(rec));
    json_decref(rec);
}

static void kctl_start(struct pss *p, const char *action)
{
    char sbx[API_ID_MAX + 1];
    struct api_err e;
    struct sbx_err err;

    if (jup_kernel_sbx(p->srv, p->sbx, sbx, NULL, &e)) {
        resp_api_err(p, &e);
        return;
    }
    memcpy(p->sbx, sbx, sizeof(p->sbx));
    p->ctx[0] = '\0';
    p->kctl_stage = 0;
    json_decref(p->held);
    if (!(p->held = json_string(action))) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    if (kctl_request(p, "context_list", &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    req_phase(p, HP_OP);
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
