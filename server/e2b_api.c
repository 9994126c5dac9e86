/*
 * e2b_api.c - E2B's control plane over the sandbox core (e2b_api.h).
 *
 * Every call to the core goes through the few functions under "core calls",
 * so a change of the core's API touches them only. They speak the REST door's
 * JSON (sbx_json.c decodes it into the core's requests and encodes its
 * records), so the E2B mapping below is JSON to JSON and shares every rule
 * about values with /v1. Answers are built from the
 * core's records by the functions under "records"; a request that needs two
 * core calls (connect: resume, then the timeout) keeps its step in the pss
 * (p->e2b_timeout) and runs the second from the sink's done.
 * strptime and timegm come with the build's _GNU_SOURCE.
 */
#include "e2b_api.h"
#include <ctype.h>
#include "cred.h"
#include "e2b_page.h"
#include "fanout.h"
#include "http_int.h"
#include "sbx_json.h"
#include "sbx_snap.h"

/* ------------------------------------------------------------ answers */

/* Answer status with body (E2B's error shape is made by resp_json). */
static void answer(struct pss *p, int status, json_t *body)
{
    if (http_phase_op_live(p->phase))
        req_phase(p, HP_ANSWER);
    resp_json(p, status, body);
}

static void fail(struct pss *p, int status, const char *msg)
{
    answer(p, status, api_error("e2b", "%s", msg));
}

/* A core error as E2B sees it: an ended or dead sandbox is one that is not found. */
static void fail_sbx(struct pss *p, const struct sbx_err *err)
{
    int status = api_status_of(err->code);

    /* A sandbox that died while it was being made (a boot that failed) is the server's
     * failure, not a sandbox the client named wrongly. */
    if ((p->e2b == E2B_R_CREATE || p->e2b == E2B_R_FORK) &&
        (err->code == SBX_E_GONE || err->code == SBX_E_DEAD))
        status = 500;
    else if (err->code == SBX_E_GONE || err->code == SBX_E_DEAD || err->code == SBX_E_NOT_FOUND ||
             err->code == SBX_E_SNAPSHOT_NOT_FOUND)
        status = 404;
    answer(p, status, api_error_of(err));
}

/* ------------------------------------------------------------ core calls */

static void e2b_done_json(struct pss *p, const struct sbx_err *err, json_t *body);

/* The core's answer, as the REST JSON of its record (sbx_json.c), which the rest of
 * this file maps to E2B's shapes. */
static void e2b_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct sbx_err oom;
    json_t *body = NULL;

    if (!err && res && !(body = sbx_json_result(res))) {
        sbx_err_set(&oom, SBX_E_INTERNAL, "out of memory");
        err = &oom;
    }
    e2b_done_json(user, err, body);
}

static const struct sbx_sink e2b_sink = {.done = e2b_done};

/* The op started: wait for e2b_done; or it failed at once: answered. */
static void started(struct pss *p, int rc, const struct sbx_err *err)
{
    if (rc == 0)
        req_phase(p, HP_OP);
    else
        fail_sbx(p, err);
}

/* Every call into the sandbox core is one of these: the door's whole contract with it.
 * p->sbx names the sandbox; the asynchronous ones report to e2b_done with p. */
static int core_create(struct pss *p, json_t *body, struct sbx_err *err)
{
    struct sbx_json_create c;
    int rc = sbx_json_create(body, &c, err);

    if (rc == 0)
        rc = sbx_create(p->srv->t, &c.req, &e2b_sink, p, &p->op, err);
    sbx_json_create_free(&c);
    return rc;
}

static int core_delete(struct pss *p, struct sbx_err *err)
{
    struct sbx_rec r;

    return sbx_delete(p->srv->t, p->sbx, &r, err);
}

/* *out set (no callback) when it was paused already. */
static int core_pause(struct pss *p, json_t *body, json_t **out, struct sbx_err *err)
{
    return sbx_pause(p->srv->t, p->sbx, body, &e2b_sink, p, &p->op, out, err);
}

/* *out set (no callback) when it runs already. */
static int core_resume(struct pss *p, json_t **out, struct sbx_err *err)
{
    return sbx_resume(p->srv->t, p->sbx, &e2b_sink, p, &p->op, out, err);
}

static int core_fork(struct pss *p, json_t *body, struct sbx_err *err)
{
    return sbx_fork(p->srv->t, p->sbx, body, &e2b_sink, p, &p->op, err);
}

static int core_snapshot(struct pss *p, json_t *body, struct sbx_err *err)
{
    return sbx_snapshot(p->srv->t, p->sbx, body, &e2b_sink, p, &p->op, err);
}

static int core_set_network(struct pss *p, json_t *body, struct sbx_err *err)
{
    struct sbx_json_net n;
    int rc = sbx_json_net(body, &n, err);

    if (rc == 0)
        rc = sbx_set_network(p->srv->t, p->sbx, &n.req, &e2b_sink, p, &p->op, err);
    sbx_json_net_free(&n);
    return rc;
}

static int core_snap_get(struct pss *p, const char *id, json_t **out, struct sbx_err *err)
{
    return sbx_snap_get(p->srv->t, id, out, err);
}

static int core_snap_list(struct pss *p, json_t **out, struct sbx_err *err)
{
    return sbx_snap_list(p->srv->t, out, err);
}

/* The snapshot p->sbx (DELETE /templates/{id} names a snapshot there). */
static int core_snap_delete(struct pss *p, json_t **out, struct sbx_err *err)
{
    return sbx_snap_delete(p->srv->t, p->sbx, out, err);
}

/* The sandbox's record as the REST JSON (sbx_json_rec) in *out. */
static int core_get(struct pss *p, const char *id, json_t **out, struct sbx_err *err)
{
    struct sbx_rec r;
    int rc = sbx_get(p->srv->t, id, &r, err);

    if (rc)
        return rc;
    if (!(*out = sbx_json_rec(&r)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

/* Every sandbox whose metadata holds meta's entries (meta NULL: all), as
 * {"sandboxes": [REST JSON records]}. */
static int core_list(struct pss *p, json_t *meta, json_t **out, struct sbx_err *err)
{
    json_t *wrap = json_pack("{s:O?}", "m", meta), *arr = json_array();
    struct sbx_kv *kv = NULL;
    struct sbx_rec *recs = NULL;
    size_t nkv = 0, n = 0;
    int rc;

    *out = NULL;
    if (!wrap || !arr) {
        rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
        goto out;
    }
    if ((rc = sbx_json_kv(wrap, "m", &kv, &nkv, err)) ||
        (rc = sbx_list(p->srv->t, NULL, kv, nkv, &recs, &n, err)))
        goto out;
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(arr, sbx_json_rec(&recs[i]))) {
            rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
            goto out;
        }
    *out = json_pack("{s:O}", "sandboxes", arr);
    if (!*out)
        rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
out:
    free(recs);
    free(kv);
    json_decref(arr);
    json_decref(wrap);
    return rc;
}

static int core_set_timeout(struct pss *p, long long seconds, struct sbx_err *err)
{
    struct sbx_rec r;

    return sbx_set_timeout(p->srv->t, p->sbx, (int64_t)seconds, &r, err);
}

/* ------------------------------------------------------------ records */

/* A state E2B knows, or NULL for one it never shows (ended, dead). */
static const char *e2b_state(const char *warren)
{
    if (!warren)
        return NULL;
    if (!strcmp(warren, "paused"))
        return "paused";
    if (!strcmp(warren, "running") || !strcmp(warren, "starting") || !strcmp(warren, "frozen"))
        return "running";
    return NULL;
}

/* E2B's name of a Warren template: the alias e2b_templates maps to it, else its own. */
static json_t *template_name(struct pss *p, const char *tmpl, bool alias)
{
    const char *m = p->srv->cfg->e2b_templates;
    size_t tl = tmpl ? strlen(tmpl) : 0;

    for (const char *s = m; alias && s && *s;) {
        size_t n = strcspn(s, " \t");
        const char *eq = memchr(s, '=', n);
        if (eq && (size_t)(s + n - eq - 1) == tl && !strncmp(eq + 1, tmpl, tl))
            return json_stringn(s, (size_t)(eq - s));
        s += n;
        while (*s == ' ' || *s == '\t')
            s++;
    }
    return json_string(tmpl ? tmpl : "");
}

/* Warren's template for an E2B name (e2b_templates), or NULL when not aliased. */
static char *template_of(struct pss *p, const char *name)
{
    const char *m = p->srv->cfg->e2b_templates;
    size_t nl = strlen(name);

    for (const char *s = m; s && *s;) {
        size_t n = strcspn(s, " \t");
        const char *eq = memchr(s, '=', n);
        if (eq && (size_t)(eq - s) == nl && !strncmp(s, name, nl))
            return strndup(eq + 1, (size_t)(s + n - eq - 1));
        s += n;
        while (*s == ' ' || *s == '\t')
            s++;
    }
    return NULL;
}

/* The per-sandbox tokens and the domain, added to o. */
static void add_access(struct pss *p, json_t *o, const char *id)
{
    char tok[TOKEN_E2B_LEN + 1];
    const char *dom = p->srv->cfg->port_domain;

    if (p->srv->token_key_set && token_e2b(p->srv->token_key, "envd", id, tok) == 0)
        json_object_set_new(o, "envdAccessToken", json_string(tok));
    if (p->srv->token_key_set && token_e2b(p->srv->token_key, "traffic", id, tok) == 0)
        json_object_set_new(o, "trafficAccessToken", json_string(tok));
    explicit_bzero(tok, sizeof(tok));
    json_object_set_new(o, "domain", dom && *dom ? json_string(dom) : json_null());
}

/* What create and connect answer: how to reach the sandbox's data plane. */
static json_t *rec_sandbox(struct pss *p, json_t *rec)
{
    const char *id = json_string_value(json_object_get(rec, "id"));
    const char *tmpl = json_string_value(json_object_get(rec, "template"));
    json_t *o;

    if (!id)
        return NULL;
    o = json_pack("{s:s, s:o, s:o, s:s, s:s}", "sandboxID", id, "templateID",
                  template_name(p, tmpl, false), "alias", template_name(p, tmpl, true), "clientID",
                  "warren", "envdVersion", E2B_ENVD_VERSION);
    if (o)
        add_access(p, o, id);
    return o;
}

/* GET /sandboxes/{id} and the lists' items. */
static json_t *rec_info(struct pss *p, json_t *rec, bool detail)
{
    const char *id = json_string_value(json_object_get(rec, "id"));
    const char *tmpl = json_string_value(json_object_get(rec, "template"));
    const char *st = e2b_state(json_string_value(json_object_get(rec, "state")));
    json_t *started = json_object_get(rec, "created_at"), *end = json_object_get(rec, "expires_at");
    json_t *meta = json_object_get(rec, "metadata"), *o;

    if (!id || !st)
        return NULL;
    if (!json_is_string(end))
        end = started; /* paused: its TTL stands still; E2B has no "none" */
    o = json_pack("{s:s, s:o, s:o, s:s, s:O, s:O, s:s, s:I, s:I, s:I, s:o, s:s}", "sandboxID", id,
                  "templateID", template_name(p, tmpl, false), "alias",
                  template_name(p, tmpl, true), "clientID", "warren", "startedAt", started, "endAt",
                  end, "state", st, "cpuCount", json_integer_value(json_object_get(rec, "vcpus")),
                  "memoryMB", json_integer_value(json_object_get(rec, "memory_mb")), "diskSizeMB",
                  (json_int_t)0, "metadata",
                  json_is_object(meta) ? json_incref(meta) : json_object(), "envdVersion",
                  E2B_ENVD_VERSION);
    if (o && detail)
        add_access(p, o, id);
    return o;
}

/* ------------------------------------------------------------ requests */

/* An E2B seconds field: absent (*v untouched), or an integer 0..10 years. */
static int seconds_field(struct pss *p, json_t *body, const char *name, long long *v)
{
    json_t *x = json_object_get(body, name);

    if (!x || json_is_null(x))
        return 0;
    if (!json_is_integer(x) || json_integer_value(x) < 0 ||
        json_integer_value(x) > 10LL * 366 * 86400) {
        char m[96];
        snprintf(m, sizeof(m), "'%s' must be a whole number of seconds", name);
        fail(p, 400, m);
        return -1;
    }
    *v = json_integer_value(x);
    return 0;
}

/* An object of strings (metadata, envVars), or absent: else answered 400. */
static int strings_field(struct pss *p, json_t *body, const char *name, json_t **out)
{
    json_t *x = json_object_get(body, name), *v;
    const char *k;

    *out = NULL;
    if (!x || json_is_null(x))
        return 0;
    if (!json_is_object(x))
        goto bad;
    json_object_foreach(x, k, v) if (!json_is_string(v)) goto bad;
    *out = x;
    return 0;
bad:;
    char m[96];
    snprintf(m, sizeof(m), "'%s' must be an object of strings", name);
    fail(p, 400, m);
    return -1;
}

/* E2B's network fields as Warren's network object in *out (NULL: the defaults). */
static int network_of(struct pss *p, json_t *body, json_t *net, json_t **out)
{
    json_t *inet = json_object_get(body, "allow_internet_access");
    json_t *allow = json_object_get(net, "allowOut"), *deny = json_object_get(net, "denyOut");
    static const char *const unsupported[] = {"rules", "egressProxy", NULL};

    *out = NULL;
    if (net && !json_is_null(net) && !json_is_object(net)) {
        fail(p, 400, "'network' must be an object");
        return -1;
    }
    for (int i = 0; unsupported[i]; i++) {
        json_t *x = json_object_get(net, unsupported[i]);
        if (x && !json_is_null(x) && !(json_is_array(x) && !json_array_size(x)) &&
            !(json_is_object(x) && !json_object_size(x))) {
            char m[128];
            snprintf(m, sizeof(m), "network.%s is not supported by Warren", unsupported[i]);
            fail(p, 400, m);
            return -1;
        }
    }
    if (inet && !json_is_boolean(inet)) {
        fail(p, 400, "'allow_internet_access' must be a boolean");
        return -1;
    }
    /* Only a policy other than the default is passed on: a create that asks for
     * nothing special must work where networking is off. */
    if (!json_is_false(inet) && !json_array_size(allow) && !json_array_size(deny))
        return 0;
    *out = json_object();
    if (!*out) {
        fail(p, 500, "out of memory");
        return -1;
    }
    if (inet)
        json_object_set(*out, "internet", inet);
    if (json_array_size(allow))
        json_object_set(*out, "allow_out", allow);
    if (json_array_size(deny))
        json_object_set(*out, "deny_out", deny);
    return 0;
}

static void do_create(struct pss *p, json_t *body)
{
    static const char *const known[] = {"templateID",   "timeout",   "metadata",
                                        "envVars",      "autoPause", "autoPauseMemory",
                                        "autoResume",   "secure",    "allow_internet_access",
                                        "network",      "mcp",       "iam",
                                        "volumeMounts", NULL};
    json_t *tmpl = json_object_get(body, "templateID"), *meta, *env, *net = NULL, *w = NULL, *x;
    long long timeout = -1;
    char *warren_tmpl = NULL;
    struct sbx_err err;
    const char *k;
    json_t *v, *snap = NULL;

    json_object_foreach(body, k, v)
    {
        bool ok = false;
        for (int i = 0; known[i] && !ok; i++)
            ok = !strcmp(k, known[i]);
        if (!ok) {
            char m[128];
            snprintf(m, sizeof(m), "unknown field '%.64s'", k);
            fail(p, 400, m);
            return;
        }
    }
    if (tmpl && !json_is_string(tmpl)) {
        fail(p, 400, "'templateID' must be a string");
        return;
    }
    if (seconds_field(p, body, "timeout", &timeout) || strings_field(p, body, "metadata", &meta) ||
        strings_field(p, body, "envVars", &env))
        return;
    x = json_object_get(body, "autoPause");
    if (x && !json_is_null(x) && !json_is_boolean(x)) {
        fail(p, 400, "'autoPause' must be true or false");
        return;
    }
    x = json_object_get(body, "mcp");
    if (x && !json_is_null(x)) {
        fail(p, 400, "mcp is not supported by Warren");
        return;
    }
    x = json_object_get(body, "volumeMounts");
    if (json_array_size(x) || (x && !json_is_null(x) && !json_is_array(x))) {
        fail(p, 400, "volumeMounts are not supported by Warren");
        return;
    }
    if (network_of(p, body, json_object_get(body, "network"), &net))
        return;
    if (!(w = json_object()))
        goto oom;
    /* E2B has no idle limit: only its timeout ends a sandbox. */
    json_object_set_new(w, "idle_timeout_seconds", json_integer(0));
    /* autoPause: the timeout pauses it (connect brings it back) instead of killing it */
    if (json_is_true(json_object_get(body, "autoPause")))
        json_object_set_new(w, "auto_pause", json_true());
    if (timeout > 0)
        json_object_set_new(w, "ttl_seconds", json_integer(timeout));
    if (meta)
        json_object_set(w, "metadata", meta);
    if (env)
        json_object_set(w, "env", env);
    if (net)
        json_object_set_new(w, "network", net);
    k = tmpl ? json_string_value(tmpl) : "base";
    if ((warren_tmpl = template_of(p, k))) {
        json_object_set_new(w, "template", json_string(warren_tmpl));
    } else if (core_snap_get(p, k, &snap, &err) == 0) {
        /* A snapshot's id names it as a template, as E2B's snapshots do. */
        json_object_set_new(w, "snapshot_id", json_string(k));
    } else {
        json_object_set_new(w, "template", json_string(k));
    }
    json_decref(snap);
    free(warren_tmpl);
    started(p, core_create(p, w, &err), &err);
    json_decref(w);
    return;
oom:
    json_decref(net);
    fail(p, 500, "out of memory");
}

/* Page items (sorted by their key, snapshotID) after next, at most limit; sets
 * x-next-token. Sandboxes page by position instead (e2b_page.h). */
static void page(struct pss *p, json_t *items, json_t *args, const char *key)
{
    const char *lim = json_string_value(json_object_get(args, "limit"));
    const char *next = json_string_value(json_object_get(args, "nextToken"));
    json_t *out = json_array();
    long limit = E2B_PAGE_DEFAULT;
    size_t i, n = json_array_size(items), taken = 0;
    char *end;

    if (lim) {
        limit = strtol(lim, &end, 10);
        if (!*lim || *end || limit < 1 || limit > E2B_PAGE_MAX) {
            json_decref(out);
            json_decref(items);
            fail(p, 400, "'limit' must be 1..1000");
            return;
        }
    }
    if (next && strlen(next) > API_ID_MAX) {
        json_decref(out);
        json_decref(items);
        fail(p, 400, "malformed nextToken");
        return;
    }
    /* Items come sorted by id: the token is the last id given, so a page starts after
     * it even if sandboxes came or went meanwhile. */
    for (i = 0; i < n && taken < (size_t)limit; i++) {
        json_t *it = json_array_get(items, i);
        if (next && *next && strcmp(json_string_value(json_object_get(it, key)), next) <= 0)
            continue;
        json_array_append(out, it);
        taken++;
    }
    for (; i < n; i++) {
        json_t *it = json_array_get(items, i);
        if (!next || !*next || strcmp(json_string_value(json_object_get(it, key)), next) > 0)
            break;
    }
    if (i < n && taken) {
        free(p->xnext);
        p->xnext = strdup(
            json_string_value(json_object_get(json_array_get(out, json_array_size(out) - 1), key)));
    }
    json_decref(items);
    answer(p, 200, out);
}

static int by_key(const void *a, const void *b, const char *key)
{
    return strcmp(json_string_value(json_object_get(*(json_t *const *)a, key)),
                  json_string_value(json_object_get(*(json_t *const *)b, key)));
}

static int by_snapshot(const void *a, const void *b)
{
    return by_key(a, b, "snapshotID");
}

/* Sort a JSON array of objects in place. */
static int sort_items(json_t *arr, int (*cmp)(const void *, const void *))
{
    size_t n = json_array_size(arr);
    json_t **v = malloc((n ? n : 1) * sizeof(*v));

    if (!v)
        return -1;
    for (size_t i = 0; i < n; i++)
        v[i] = json_incref(json_array_get(arr, i));
    qsort(v, n, sizeof(*v), cmp);
    json_array_clear(arr);
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, v[i]);
    free(v);
    return 0;
}

/* E2B's items of REST records (an array) in a state filter wants (NULL: any), or NULL. */
static json_t *list_items(struct pss *p, json_t *sandboxes, const char *filter)
{
    json_t *items = json_array(), *rec;
    size_t i;

    if (!items)
        return NULL;
    json_array_foreach(sandboxes, i, rec)
    {
        json_t *o = rec_info(p, rec, false);
        if (o && e2b_state_wanted(filter, json_string_value(json_object_get(o, "state"))) &&
            json_array_append(items, o)) {
            json_decref(o);
            json_decref(items);
            return NULL;
        }
        json_decref(o);
    }
    return items;
}

/* Answer one page (items, in the fleet's order), with the next one's token when more
 * may follow: the position of its last item. */
static void page_answer(struct pss *p, json_t *items, bool more)
{
    size_t n = json_array_size(items);

    if (more && n) {
        struct e2b_pos last;
        char tok[E2B_TOKEN_MAX + 1];

        free(p->xnext);
        p->xnext = NULL;
        if (e2b_item_pos(json_array_get(items, n - 1), &last) ||
            !e2b_token_encode(&last, tok, sizeof(tok)) || !(p->xnext = strdup(tok))) {
            json_decref(items);
            fail(p, 500, "cannot make the next page's token");
            return;
        }
    }
    answer(p, 200, items);
}

/* GET /sandboxes (no pages): every running sandbox of the REST records, in the order
 * the pages use. */
static void list_all_finish(struct pss *p, json_t *sandboxes)
{
    json_t *items = list_items(p, sandboxes, "running");
    bool more = false;

    if (!items || e2b_page_finish(items, SIZE_MAX, &more)) {
        json_decref(items);
        fail(p, 500, "out of memory");
        return;
    }
    answer(p, 200, items);
}

/* The peers' REST lists are in: they join this host's. A peer that did not answer is
 * named in X-Warren-Partial (E2B's list is a bare array: the header is the one place to
 * say it), never left out in silence. */
static void list_fan_done(void *user, const struct fanout_result *r, unsigned n)
{
    struct pss *p = user;
    json_t *held = p->fan_local, *arr = json_object_get(held, "sandboxes");
    char missing[FANOUT_PEERS_MAX * (FANOUT_NAME_MAX + 1) + 1] = "";
    size_t mlen = 0;

    p->fan = NULL;
    p->fan_local = NULL;
    for (unsigned i = 0; i < n; i++) {
        bool ok = r[i].ok;
        if (ok) {
            json_t *j = json_loadb(r[i].body, r[i].len, 0, NULL);
            json_t *theirs = json_object_get(j, "sandboxes");
            if ((ok = json_is_array(theirs)))
                json_array_extend(arr, theirs);
            json_decref(j);
        }
        if (!ok)
            mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%s",
                                     mlen ? "," : "", r[i].name);
    }
    if (mlen && !(p->xpartial = strdup(missing))) {
        json_decref(held);
        fail(p, 500, "out of memory");
        return;
    }
    list_all_finish(p, arr);
    json_decref(held);
}

/* Whether a peer's answer head carries an x-next-token: it has more after its page. */
static bool head_has_next(const char *head)
{
    for (const char *l = head ? strstr(head, "\r\n") : NULL; l; l = strstr(l + 2, "\r\n"))
        if (!strncasecmp(l + 2, "x-next-token:", 13))
            return true;
    return false;
}

/* The peers' pages are in. Each adds at most limit of its items after the token to this
 * host's (its answer is cut and checked, e2b_page_merge), and the first limit of them
 * all are the page; a peer that gave limit items and says it has more (its own
 * x-next-token) gives the page a token even when none of its items was cut. A peer
 * that did not answer with a list is named in X-Warren-Partial. */
static void page_fan_done(void *user, const struct fanout_result *r, unsigned n)
{
    struct pss *p = user;
    json_t *held = p->fan_local, *items = json_incref(json_object_get(held, "items"));
    const char *filter = json_string_value(json_object_get(held, "state"));
    const char *tok = json_string_value(json_object_get(held, "after")), *why;
    size_t limit = (size_t)json_integer_value(json_object_get(held, "limit"));
    bool more = json_is_true(json_object_get(held, "more"));
    char missing[FANOUT_PEERS_MAX * (FANOUT_NAME_MAX + 1) + 1] = "";
    size_t mlen = 0;
    struct e2b_pos after;
    bool has_after = tok && !e2b_token_decode(tok, &after, &why);

    p->fan = NULL;
    p->fan_local = NULL;
    for (unsigned i = 0; i < n; i++) {
        bool ok = r[i].ok;
        if (ok) {
            json_t *j = json_loadb(r[i].body, r[i].len, 0, NULL);
            bool full = false;
            ok = e2b_page_merge(items, j, filter, has_after ? &after : NULL, limit, &full) >= 0;
            if (ok && full && head_has_next(r[i].head))
                more = true;
            json_decref(j);
        }
        if (!ok)
            mlen += (size_t)snprintf(missing + mlen, sizeof(missing) - mlen, "%s%s",
                                     mlen ? "," : "", r[i].name);
    }
    json_decref(held);
    if ((mlen && !(p->xpartial = strdup(missing))) || e2b_page_finish(items, limit, &more)) {
        json_decref(items);
        fail(p, 500, "out of memory");
        return;
    }
    page_answer(p, items, more);
}

/* A v2 list's limit and nextToken: 0, or answered 400. *has_after: a token was given. */
static int page_args(struct pss *p, json_t *args, size_t *limit, struct e2b_pos *after,
                     bool *has_after)
{
    const char *lim = json_string_value(json_object_get(args, "limit"));
    const char *next = json_string_value(json_object_get(args, "nextToken")), *why;
    long l = E2B_PAGE_DEFAULT;
    char *end;

    if (lim) {
        l = strtol(lim, &end, 10);
        if (!*lim || *end || l < 1 || l > E2B_PAGE_MAX) {
            fail(p, 400, "'limit' must be 1..1000");
            return -1;
        }
    }
    *limit = (size_t)l;
    *has_after = false;
    if (next && *next) {
        if (e2b_token_decode(next, after, &why)) {
            fail(p, 400, why);
            return -1;
        }
        *has_after = true;
    }
    return 0;
}

/* Append s percent-encoded (all but RFC 3986's unreserved characters) at q[*len]. */
static int pct_put(char *q, size_t cap, size_t *len, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";

    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        bool plain = isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
        if (*len + (plain ? 1 : 3) >= cap)
            return -1;
        if (plain) {
            q[(*len)++] = (char)c;
        } else {
            q[(*len)++] = '%';
            q[(*len)++] = hex[c >> 4];
            q[(*len)++] = hex[c & 15];
        }
    }
    q[*len] = 0;
    return 0;
}

/* Ask every peer for path (p->fan_local holds this host's part): done merges. 0, or -1
 * (p->fan_local released). */
static int fan_start(struct pss *p, const char *path, fanout_done_fn done)
{
    char auth[600];

    if ((size_t)snprintf(auth, sizeof(auth), "Bearer %s", p->srv->key) >= sizeof(auth) ||
        fanout_start(p->srv->loop, p->srv->peers, path, auth, p->srv->cfg->peer_timeout_ms,
                     p->srv->cfg->peer_answer_max_bytes, done, p, &p->fan)) {
        json_decref(p->fan_local);
        p->fan_local = NULL;
        return -1;
    }
    req_phase(p, HP_OP);
    return 0;
}

/* Ask every peer for its own sandboxes whose metadata holds meta (REST's
 * metadata.K=V filter), with the fleet's key: 0 (list_fan_done answers), or -1. */
static int list_fan_start(struct pss *p, json_t *meta, json_t *local)
{
    char path[4096];
    size_t len = strlen("/v1/sandboxes");
    const char *k;
    json_t *v;

    memcpy(path, "/v1/sandboxes", len + 1);
    json_object_foreach(meta, k, v)
    {
        if (len + 11 >= sizeof(path))
            return -1;
        memcpy(path + len, len == 13 ? "?metadata." : "&metadata.", 11);
        len += 10;
        if (pct_put(path, sizeof(path), &len, k) || len + 2 >= sizeof(path))
            return -1;
        path[len++] = '=';
        if (pct_put(path, sizeof(path), &len, json_string_value(v)))
            return -1;
    }
    if (!(p->fan_local = json_pack("{s:O}", "sandboxes", local)))
        return -1;
    return fan_start(p, path, list_fan_done);
}

/* Append "&name=" and value percent-encoded (value NULL: nothing). 0, or -1 (too long). */
static int query_put(char *q, size_t cap, size_t *len, const char *name, const char *value)
{
    size_t nl = strlen(name);

    if (!value)
        return 0;
    if (*len + nl + 2 >= cap)
        return -1;
    q[(*len)++] = '&';
    memcpy(q + *len, name, nl);
    *len += nl;
    q[(*len)++] = '=';
    q[*len] = 0;
    return pct_put(q, cap, len, value);
}

/* Ask every peer for its own page: at most limit of its sandboxes after tok (NULL: from
 * the start), with the client's state and metadata filters, through its own E2B list
 * (X-Warren-Local), so each applies the same filters and order as this host. items and
 * more are this host's page. 0 (page_fan_done answers), or -1. */
static int page_fan_start(struct pss *p, const char *mq, const char *sq, size_t limit,
                          const char *tok, json_t *items, bool more)
{
    char path[4096];
    size_t len = (size_t)snprintf(path, sizeof(path), "/v2/sandboxes?limit=%zu", limit);

    if (query_put(path, sizeof(path), &len, "state", sq) ||
        query_put(path, sizeof(path), &len, "metadata", mq) ||
        query_put(path, sizeof(path), &len, "nextToken", tok))
        return -1;
    if (!(p->fan_local = json_pack("{s:O, s:b, s:I, s:s?, s:s?}", "items", items, "more", more,
                                   "limit", (json_int_t)limit, "state", sq, "after", tok)))
        return -1;
    return fan_start(p, path, page_fan_done);
}

static void do_list(struct pss *p, json_t *args, bool v2)
{
    const char *mq = json_string_value(json_object_get(args, "metadata"));
    const char *sq = json_string_value(json_object_get(args, "state"));
    json_t *meta = NULL, *all = NULL, *local, *items;
    struct sbx_err err;
    struct e2b_pos after;
    bool has_after = false, more = false, fleet;
    size_t limit = 0;
    char tok[E2B_TOKEN_MAX + 1];
    int rc;

    if (mq && e2b_metadata_filter(mq, &meta)) {
        fail(p, 400, "malformed metadata filter: k=v pairs joined by '&', form-encoded");
        return;
    }
    if (sq) {
        for (const char *s = sq; *s;) {
            size_t n = strcspn(s, ",");
            if (!((n == 7 && !strncmp(s, "running", 7)) || (n == 6 && !strncmp(s, "paused", 6)))) {
                json_decref(meta);
                fail(p, 400, "'state' takes running and paused");
                return;
            }
            s += n;
            if (*s == ',')
                s++;
        }
    }
    if (v2 && page_args(p, args, &limit, &after, &has_after)) {
        json_decref(meta);
        return;
    }
    if (core_list(p, meta && json_object_size(meta) ? meta : NULL, &all, &err)) {
        json_decref(meta);
        fail_sbx(p, &err);
        return;
    }
    /* One of a fleet, asked by a client (a peer's own fan-out says X-Warren-Local): the
     * list holds every host's sandboxes. */
    fleet = fanout_peers_count(p->srv->peers) &&
            lws_hdr_custom_length(p->wsi, "x-warren-local:", 15) < 0;
    if (!v2) {
        rc = fleet ? list_fan_start(p, meta, json_object_get(all, "sandboxes")) : 0;
        if (!fleet)
            list_all_finish(p, json_object_get(all, "sandboxes"));
        json_decref(meta);
        json_decref(all);
        if (rc)
            fail(p, 500, "cannot ask the peer hosts");
        return;
    }
    json_decref(meta);
    /* This host's page: its sandboxes after the token, the first limit of them. */
    local = list_items(p, json_object_get(all, "sandboxes"), sq);
    json_decref(all);
    items = json_array();
    if (!local || !items ||
        e2b_page_merge(items, local, sq, has_after ? &after : NULL, json_array_size(local) + 1,
                       &more) < 0 ||
        e2b_page_finish(items, limit, &more)) {
        json_decref(local);
        json_decref(items);
        fail(p, 500, "out of memory");
        return;
    }
    json_decref(local);
    if (!fleet) {
        page_answer(p, items, more);
        return;
    }
    rc = page_fan_start(p, mq && *mq ? mq : NULL, sq, limit,
                        has_after && e2b_token_encode(&after, tok, sizeof(tok)) ? tok : NULL, items,
                        more);
    json_decref(items);
    if (rc)
        fail(p, 500, "cannot ask the peer hosts");
}

/* The sandbox of p->sbx as E2B shows it, or answered 404. *state its E2B state. */
static json_t *live_record(struct pss *p, const char **state)
{
    struct sbx_err err;
    json_t *rec = NULL;

    if (core_get(p, p->sbx, &rec, &err)) {
        fail_sbx(p, &err);
        return NULL;
    }
    *state = e2b_state(json_string_value(json_object_get(rec, "state")));
    if (!*state) {
        json_decref(rec);
        fail(p, 404, "sandbox not found");
        return NULL;
    }
    return rec;
}

static void do_info(struct pss *p)
{
    const char *st;
    json_t *rec = live_record(p, &st);

    if (!rec)
        return;
    answer(p, 200, rec_info(p, rec, true));
    json_decref(rec);
}

static void do_kill(struct pss *p)
{
    const char *st;
    json_t *rec = live_record(p, &st);
    struct sbx_err err;

    if (!rec)
        return;
    json_decref(rec);
    if (core_delete(p, &err)) {
        fail_sbx(p, &err);
        return;
    }
    answer(p, 204, NULL);
}

static void do_timeout(struct pss *p, json_t *body)
{
    const char *st;
    long long t = -1;
    struct sbx_err err;
    json_t *rec;

    if (seconds_field(p, body, "timeout", &t))
        return;
    if (t < 0) {
        fail(p, 400, "'timeout' (seconds) is required");
        return;
    }
    if (!(rec = live_record(p, &st)))
        return;
    json_decref(rec);
    if (core_set_timeout(p, t, &err))
        fail_sbx(p, &err);
    else
        answer(p, 204, NULL);
}

static void do_pause(struct pss *p)
{
    const char *st;
    json_t *rec = live_record(p, &st), *out = NULL, *b;
    struct sbx_err err;
    int rc;

    if (!rec)
        return;
    json_decref(rec);
    if (!strcmp(st, "paused")) {
        fail(p, 409, "sandbox is already paused");
        return;
    }
    b = json_object();
    rc = core_pause(p, b, &out, &err);
    json_decref(b);
    if (rc == 0 && out) {
        json_decref(out);
        fail(p, 409, "sandbox is already paused");
        return;
    }
    started(p, rc, &err);
}

/* Seconds until the record's expires_at (0 when past), or -1 when it has none. */
static long long remaining_s(json_t *rec)
{
    const char *s = json_string_value(json_object_get(rec, "expires_at"));
    struct tm tm;
    const char *end;
    time_t t, now = time(NULL);

    memset(&tm, 0, sizeof(tm));
    if (!s || !(end = strptime(s, "%Y-%m-%dT%H:%M:%S", &tm)))
        return -1;
    t = timegm(&tm);
    return t > now ? (long long)(t - now) : 0;
}

/* Connect's timeout: E2B only ever extends the TTL there. 0, or a core error. */
static int extend_timeout(struct pss *p, json_t *rec, struct sbx_err *err)
{
    long long left = remaining_s(rec);

    if (p->e2b_timeout <= 0 || (left >= 0 && left >= p->e2b_timeout))
        return 0;
    return core_set_timeout(p, p->e2b_timeout, err);
}

/* connect (and the older resume): bring a paused sandbox back, then its timeout. */
static void do_connect(struct pss *p, json_t *body, bool resume)
{
    const char *st;
    json_t *rec, *out = NULL;
    struct sbx_err err;
    int rc;

    /* An omitted timeout is E2B's default of 300 s. */
    p->e2b_timeout = 300;
    if (seconds_field(p, body, "timeout", &p->e2b_timeout) || !(rec = live_record(p, &st)))
        return;
    if (strcmp(st, "paused") != 0) {
        if (resume) {
            json_decref(rec);
            fail(p, 409, "sandbox is already running");
            return;
        }
        rc = extend_timeout(p, rec, &err);
        json_decref(rec);
        if (rc || core_get(p, p->sbx, &rec, &err)) {
            fail_sbx(p, &err);
            return;
        }
        answer(p, 200, rec_sandbox(p, rec));
        json_decref(rec);
        return;
    }
    json_decref(rec);
    rc = core_resume(p, &out, &err);
    if (rc == 0 && out) {
        /* Back already (a resume raced this one). */
        if (extend_timeout(p, out, &err))
            fail_sbx(p, &err);
        else
            answer(p, 200, rec_sandbox(p, out));
        json_decref(out);
        return;
    }
    started(p, rc, &err);
}

static void do_fork(struct pss *p, json_t *body)
{
    long long t = -1;
    json_t *count = json_object_get(body, "count"), *w;
    struct sbx_err err;

    const char *st;
    json_t *rec;

    if (seconds_field(p, body, "timeout", &t))
        return;
    if (count && !json_is_integer(count)) {
        fail(p, 400, "'count' must be an integer");
        return;
    }
    /* An unknown or ended parent is a 404 here; a fork that dies later is a 500. */
    if (!(rec = live_record(p, &st)))
        return;
    json_decref(rec);
    w = json_object();
    if (count)
        json_object_set(w, "count", count);
    if (t > 0)
        json_object_set_new(w, "ttl_seconds", json_integer(t));
    started(p, core_fork(p, w, &err), &err);
    json_decref(w);
}

#define SNAP_NAME_KEY "e2b_name" /* a snapshot's E2B name, kept in its metadata */

static void do_snapshot(struct pss *p, json_t *body)
{
    json_t *name = json_object_get(body, "name"), *w;
    struct sbx_err err;

    if (name && !json_is_null(name) &&
        (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 128)) {
        fail(p, 400, "'name' must be a string of 1..128 bytes");
        return;
    }
    w = json_is_string(name) ? json_pack("{s:{s:O}}", "metadata", SNAP_NAME_KEY, name)
                             : json_object();
    started(p, core_snapshot(p, w, &err), &err);
    json_decref(w);
}

static json_t *rec_snapshot(json_t *rec)
{
    const char *name =
        json_string_value(json_object_get(json_object_get(rec, "metadata"), SNAP_NAME_KEY));
    const char *id = json_string_value(json_object_get(rec, "id"));

    if (!id)
        return NULL;
    return json_pack("{s:s, s:[s*]}", "snapshotID", id, "names", name);
}

static void do_snapshots(struct pss *p, json_t *args)
{
    const char *sid = json_string_value(json_object_get(args, "sandboxID"));
    const char *name = json_string_value(json_object_get(args, "name"));
    json_t *all = NULL, *items = json_array(), *rec;
    struct sbx_err err;
    size_t i;

    if (core_snap_list(p, &all, &err)) {
        json_decref(items);
        fail_sbx(p, &err);
        return;
    }
    json_array_foreach(json_object_get(all, "snapshots"), i, rec)
    {
        const char *type = json_string_value(json_object_get(rec, "type"));
        const char *nm =
            json_string_value(json_object_get(json_object_get(rec, "metadata"), SNAP_NAME_KEY));
        /* A pause's and a fork's snapshots are Warren's own, not the user's. */
        if (!type || strcmp(type, "sandbox") != 0)
            continue;
        if (sid && strcmp(sid, json_string_value(json_object_get(rec, "parent")) ?: ""))
            continue;
        if (name && (!nm || strcmp(name, nm)))
            continue;
        json_array_append_new(items, rec_snapshot(rec));
    }
    json_decref(all);
    if (sort_items(items, by_snapshot)) {
        json_decref(items);
        fail(p, 500, "out of memory");
        return;
    }
    page(p, items, args, "snapshotID");
}

static void do_template_delete(struct pss *p)
{
    json_t *out = NULL;
    struct sbx_err err;

    if (core_snap_delete(p, &out, &err)) {
        if (err.code == SBX_E_SNAPSHOT_NOT_FOUND) {
            fail(p, 404,
                 "template or snapshot not found (Warren's templates are "
                 "not managed here)");
            return;
        }
        fail_sbx(p, &err);
        return;
    }
    json_decref(out);
    answer(p, 204, NULL);
}

static void do_network(struct pss *p, json_t *body)
{
    static const char *const fields[] = {"allowOut", "denyOut", "rules", "egressProxy", NULL};
    json_t *net = json_object(), *w = NULL, *rec;
    struct sbx_err err;
    const char *st;

    /* The body is the network object itself, plus allow_internet_access. */
    for (int i = 0; fields[i]; i++)
        if (json_object_get(body, fields[i]))
            json_object_set(net, fields[i], json_object_get(body, fields[i]));
    if (network_of(p, body, net, &w)) {
        json_decref(net);
        return;
    }
    json_decref(net);
    if (!(rec = live_record(p, &st))) {
        json_decref(w);
        return;
    }
    json_decref(rec);
    if (!w)
        w = json_pack("{s:b}", "internet", 1); /* PUT replaces: back to the default */
    started(p, core_set_network(p, w, &err), &err);
    json_decref(w);
}

static void do_metrics(struct pss *p)
{
    const char *st;
    json_t *rec = live_record(p, &st);

    if (!rec)
        return;
    json_decref(rec);
    /* Warren samples no guest metrics yet: an honest empty series. */
    answer(p, 200, json_array());
}

void e2b_handle(struct pss *p, json_t *args)
{
    switch ((enum e2b_route)p->e2b) {
    case E2B_R_CREATE:
        do_create(p, args);
        break;
    case E2B_R_LIST_V1:
        do_list(p, args, false);
        break;
    case E2B_R_LIST:
        do_list(p, args, true);
        break;
    case E2B_R_INFO:
        do_info(p);
        break;
    case E2B_R_KILL:
        do_kill(p);
        break;
    case E2B_R_TIMEOUT:
        do_timeout(p, args);
        break;
    case E2B_R_PAUSE:
        do_pause(p);
        break;
    case E2B_R_CONNECT:
        do_connect(p, args, false);
        break;
    case E2B_R_RESUME:
        do_connect(p, args, true);
        break;
    case E2B_R_FORK:
        do_fork(p, args);
        break;
    case E2B_R_SNAPSHOT:
        do_snapshot(p, args);
        break;
    case E2B_R_SNAPSHOTS:
        do_snapshots(p, args);
        break;
    case E2B_R_TEMPLATE_DEL:
        do_template_delete(p);
        break;
    case E2B_R_NETWORK:
        do_network(p, args);
        break;
    case E2B_R_METRICS:
        do_metrics(p);
        break;
    case E2B_R_METRICS_MANY:
        answer(p, 200, json_pack("{s:{}}", "sandboxes"));
        break;
    case E2B_R_NONE:
    case E2B_R_ERROR:
        fail(p, 404, "no such route");
        break;
    }
}

/* The core finished an asynchronous step (body: its REST JSON, taken). */
static void e2b_done_json(struct pss *p, const struct sbx_err *err, json_t *body)
{
    struct sbx_err e2;
    json_t *arr, *rec, *o;
    size_t i;

    if (!http_phase_op_live(p->phase)) {
        json_decref(body);
        return;
    }
    if (err) {
        json_decref(body);
        fail_sbx(p, err);
        resp_want_write(p);
        return;
    }
    switch ((enum e2b_route)p->e2b) {
    case E2B_R_CREATE:
        answer(p, 201, rec_sandbox(p, body));
        break;
    case E2B_R_CONNECT:
    case E2B_R_RESUME:
        if (extend_timeout(p, body, &e2)) {
            fail_sbx(p, &e2);
            break;
        }
        answer(p, 201, rec_sandbox(p, body));
        break;
    case E2B_R_FORK:
        arr = json_array();
        json_array_foreach(json_object_get(body, "sandboxes"), i, rec)
        {
            o = rec_sandbox(p, rec);
            json_array_append_new(arr, json_pack("{s:o?}", "sandbox", o));
        }
        answer(p, 201, arr);
        break;
    case E2B_R_SNAPSHOT:
        answer(p, 201, rec_snapshot(body));
        break;
    default: /* pause, network */
        answer(p, 204, NULL);
        break;
    }
    json_decref(body);
    resp_want_write(p);
}

int e2b_authorize(struct pss *p, struct api_err *e)
{
    char v[512];
    int n = lws_hdr_custom_length(p->wsi, "x-api-key:", 10);

    if (n > 0) {
        if (n < (int)sizeof(v) &&
            lws_hdr_custom_copy(p->wsi, v, sizeof(v), "x-api-key:", 10) >= 0 &&
            cred_is_e2b_key(v, strlen(v), p->srv->key)) {
            explicit_bzero(v, sizeof(v));
            return 0;
        }
        explicit_bzero(v, sizeof(v));
    } else if (lws_hdr_total_length(p->wsi, WSI_TOKEN_HTTP_AUTHORIZATION) > 0 &&
               http_authorize(p, p->wsi, NULL, NULL, e) == 0) {
        return 0;
    }
    e->status = 401;
    e->code = "unauthorized";
    snprintf(e->msg, sizeof(e->msg), "%s",
             "missing or wrong X-API-KEY: Warren's API key, or e2b_ and its hex "
             "(state_dir/e2b_api_key)");
    return -EACCES;
}
