/*
 * rest.c - the REST router and its handlers: a request head is routed and
 * checked (auth, method, query, framing) as its row in API_ROUTE_MAP (api.h)
 * says, bodies are collected or fed to an upload, the row's handler calls the
 * sandbox table (sbx.h); its sink callbacks (with the pss as their user
 * pointer) turn results into answers through resp.c.
 * Core errors become HTTP statuses and error bodies here (sbx_err.h).
 */
#include <sys/stat.h>

#include "cred.h"
#include "e2b_api.h"
#include "http_int.h"
#include "fanout.h"
#include "images_src.h"
#include "jupyter.h"
#include "multipart.h"
#include "ports_head.h"
#include "sbx_json.h"
#include "sbx_snap.h"
#include "web.h"

/* ----------------------------------------------------------- sink (sbx) */

/* A route's handler (its row in API_ROUTE_MAP, api.h): args is the parsed JSON body, or
 * the query's args (api_query_args), borrowed; NULL for a socket probe. */
typedef void rest_handler(struct pss *p, json_t *args);

#define HDECL_ROW_(id, pattern, scope, ...)         __VA_ARGS__
#define HDECL_VERB_(method, query, body, flags, fn) static rest_handler fn;
API_ROUTE_MAP(HDECL_ROW_, HDECL_VERB_)
#undef HDECL_ROW_
#undef HDECL_VERB_

/* By route id, then by the index of the verb in its row (api_routes). */
#define HROW_(id, pattern, scope, ...)         [API_R_##id] = {__VA_ARGS__},
#define HVERB_(method, query, body, flags, fn) fn,
static rest_handler *const handlers[API_R_COUNT][API_VERBS_MAX] = {API_ROUTE_MAP(HROW_, HVERB_)};
#undef HROW_
#undef HVERB_

/* The flags of the request's verb (0 before it is routed). */
static unsigned verb_flags(const struct pss *p)
{
    const struct api_verb *v = api_route_verb(p->route, p->method);

    return v ? v->flags : 0;
}

/* The request's handler, with its args. */
static void handle(struct pss *p, json_t *args)
{
    const struct api_verb *v = api_route_verb(p->route, p->method);

    handlers[p->route][v - api_routes[p->route].verbs](p, args);
}

static void upload_pump(struct pss *p);

static void sink_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct pss *p = user;
    json_t *body;
    int status;

    if (!http_phase_op_live(p->phase))
        return;
    if (http_phase_resuming(p->phase)) {
        /* The paused sandbox is back (or could not come back): now the request itself. */
        json_t *held = p->held;
        p->held = NULL;
        req_phase(p, HP_RUN);
        if (err)
            resp_sbx_err(p, err);
        else if (p->envd)
            envd_run(p, held);
        else
            handle(p, held);
        json_decref(held);
        return;
    }
    if (err) {
        status = api_status_of(err->code);
        body = api_error_of(err);
    } else {
        body = sbx_json_result(res);
        /* A create (of a sandbox, or a snapshot), or a background exec (the process was
         * created), or another op. */
        status = (verb_flags(p) & API_VF_CREATED) || p->bg_exec ? 201 : 200;
    }
    req_phase(p, HP_ANSWER);
    switch (p->kind) {
    case RESP_NONE:
        if (p->ndjson && status < 400) {
            resp_ndjson_begin(p);
            resp_ndjson_end(p, status, body);
        } else if ((verb_flags(p) & API_VF_DOWNLOAD) && status < 400) {
            json_decref(body);
            resp_code(p, 500, "internal", "the download ended before it started");
        } else {
            resp_json(p, status, body);
        }
        break;
    case RESP_NDJSON:
        resp_ndjson_end(p, status, body);
        break;
    case RESP_DOWNLOAD:
        if (status >= 400 && !p->hdrs_sent) {
            /* Nothing sent yet: the error can still be a proper answer. */
            resp_q_free(p);
            p->status = 0;
            p->kind = RESP_NONE;
            resp_json(p, status, body);
            break;
        }
        json_decref(body);
        /* After a Content-Length, a short body can only be told by closing. */
        if (status >= 400 || p->dl_queued != p->clen) {
            LOG(LOG_WARN, "download of %s ended after %" PRIu64 " of %" PRIu64 " bytes (%d)",
                p->sbx, p->dl_queued, p->clen, status);
            p->close_after = true;
        }
        req_complete(p);
        break;
    case RESP_JSON:
    case RESP_STATIC:
        json_decref(body);
        break;
    }
    /* An upload answered early leaves its pending bytes unused. */
    free(p->pend);
    p->pend = NULL;
    p->pend_len = p->pend_off = p->pend_cap = 0;
    resp_want_write(p);
}

static void sink_head(void *user, uint64_t size)
{
    struct pss *p = user;

    if (!http_phase_op_live(p->phase) || p->kind != RESP_NONE || !(verb_flags(p) & API_VF_DOWNLOAD))
        return;
    resp_download_begin(p, size);
}

static void sink_data(void *user, int fd, uint64_t off, const void *ptr, size_t n)
{
    struct pss *p = user;
    struct obuf *ob;

    if (!http_phase_op_live(p->phase) || !n)
        return;
    if (p->kind == RESP_DOWNLOAD) {
        size_t take = n;
        if (p->dl_queued + take > p->clen) {
            take = (size_t)(p->clen - p->dl_queued);
            p->close_after = true;
        }
        if (take) {
            if (!(ob = resp_q_room(p, take)))
                goto oom;
            memcpy(OB_PAYLOAD(ob) + ob->len, ptr, take);
            resp_q_grew(p, ob, take, n);
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
            resp_ndjson_begin(p);
        len = api_ndjson_chunk(&p->hold[fd - 1], fd, off, ptr, n, p->srv->scratch);
        if (resp_ndjson_append(p, p->srv->scratch, len, n))
            goto oom;
    } else {
        return;
    }
    resp_stall_arm(p, false);
    resp_want_write(p);
    return;
oom:
    LOG(LOG_ERR, "out of memory queueing output of %s: closing the request", p->sbx);
    p->close_after = true;
    req_phase(p, HP_ANSWER);
    req_complete(p);
    sbx_op_cancel(p->srv->t, p->op);
    resp_want_write(p);
}

static void sink_lost(void *user, uint64_t off, uint64_t n)
{
    struct pss *p = user;

    if (!http_phase_op_live(p->phase) || !p->ndjson ||
        (p->kind != RESP_NONE && p->kind != RESP_NDJSON))
        return;
    if (p->kind == RESP_NONE)
        resp_ndjson_begin(p);
    resp_ndjson_lost(p, off, n);
    resp_want_write(p);
}

static void upload_resume(struct pss *p)
{
    p->rx_paused = false;
    lws_rx_flow_control(p->wsi, 1);
    if (!p->body_done)
        lws_set_timeout(p->wsi, PENDING_TIMEOUT_HTTP_CONTENT, http_timeout_s(p->wsi));
}

static void upload_end(struct pss *p);

static void upload_pump(struct pss *p)
{
    while (p->pend_len && http_phase_op_live(p->phase)) {
        size_t took;

        p->kick = false;
        p->in_write = true;
        took = sbx_op_write(p->srv->t, p->op, p->pend + p->pend_off, p->pend_len);
        p->in_write = false;
        if (!http_phase_op_live(p->phase))
            return; /* done() came from inside the write */
        if (took > p->pend_len)
            took = p->pend_len;
        p->pend_off += took;
        p->pend_len -= took;
        if (!took && !p->kick)
            return; /* wait for sink->writable */
    }
    if (!http_phase_op_live(p->phase))
        return;
    p->pend_off = 0;
    if (envd_gz_held(p)) {
        /* compressed input waited for room: inflate it first, then read on */
        envd_gz_drain(p);
        if (!http_phase_op_live(p->phase) || p->pend_len)
            return;
    }
    if (p->rx_paused && !envd_gz_held(p))
        upload_resume(p);
    if (p->body_done && !p->finish_sent)
        upload_end(p);
}

void rest_upload_writable(void *user)
{
    struct pss *p = user;

    if (!p->upload || !http_phase_op_running(p->phase))
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
    .writable = rest_upload_writable,
    .lost = sink_lost,
};

/* ------------------------------------------------------------ requests */

void rest_req_end(struct pss *p)
{
    if (!p->srv)
        return; /* never started, or ended already */
    ev_timer_stop(p->srv->loop, &p->stall);
    envd_req_end(p);
    free(p->mp);
    p->mp = NULL;
    if (http_phase_op_live(p->phase)) {
        req_phase(p, HP_ANSWER);
        sbx_op_cancel(p->srv->t, p->op);
    }
    code_req_end(p);
    resp_q_free(p);
    fanout_cancel(p->fan);
    p->fan = NULL;
    json_decref(p->fan_local);
    p->fan_local = NULL;
    free(p->location);
    p->location = NULL;
    p->err_code = NULL;
    watch_req_free(p);
    free(p->xnext);
    p->xnext = NULL;
    free(p->xpartial);
    p->xpartial = NULL;
    free(p->body);
    p->body = NULL;
    json_decref(p->held);
    p->held = NULL;
    free(p->pend);
    p->pend = NULL;
    p->pend_len = 0;
    p->srv = NULL;
}

int http_hdr(struct lws *wsi, enum lws_token_indexes t, char *buf, int cap)
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
    if (lws_hdr_total_length(wsi, WSI_TOKEN_PATCH_URI))
        return API_PATCH;
    return API_OTHER;
}

/* Decoded "name=value" query fragments into store; -1 if they do not fit. */
static int query_frags(struct lws *wsi, char *store, size_t cap, const char **frags, size_t *n,
                       bool jup)
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
        /* The access token was judged by http_authorize; it goes no further. */
        if (!strncmp(store + used, HTTP_TOKEN_PARAM, sizeof(HTTP_TOKEN_PARAM) - 1)) {
            explicit_bzero(store + used, (size_t)len);
            continue;
        }
        /* ... as was the kernel API's ?token= (jup_authorize). */
        if (jup && cred_pair_named(store + used, (size_t)len, CRED_KEY_PARAM)) {
            explicit_bzero(store + used, (size_t)len);
            continue;
        }
        if (http_query_frag_spurious(wsi, i, store + used))
            continue;
        frags[(*n)++] = store + used;
        used += (size_t)len + 1;
    }
}

static void start_op(struct pss *p, int rc, const struct sbx_err *err)
{
    if (rc == 0) {
        req_phase(p, HP_OP);
        return;
    }
    resp_sbx_err(p, err);
}

/* The answer of a synchronous call: 200 and out, or its error. */
static void respond_sync(struct pss *p, int rc, json_t *out, const struct sbx_err *err)
{
    if (rc)
        resp_sbx_err(p, err);
    else
        resp_json(p, 200, out);
}

static void file_op(struct pss *p, enum sbx_file_kind kind, json_t *args)
{
    struct sbx_file_req req;
    struct sbx_err err;
    int rc;

    if (!args) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    rc = sbx_json_file(kind, args, &req, &err);
    if (rc == 0)
        rc = sbx_file_op(p->srv->t, p->sbx, &req, &sink, p, &p->op, &err);
    json_decref(args);
    start_op(p, rc, &err);
}

static bool disk_full(struct pss *p);
static bool expects_continue(struct pss *p);

/* POST .../processes/{pid}/stdin|signal|resize with its JSON body. */
static void proc_ctl(struct pss *p, enum api_proc_action a, json_t *body)
{
    struct sbx_proc_ctl c;
    struct sbx_err err;
    unsigned char *raw = NULL;
    struct api_err e;
    int rc;

    if (api_proc_ctl_parse(a, body, &c, &raw, &e) != 0) {
        resp_api_err(p, &e);
        return;
    }
    rc = sbx_proc_ctl(p->srv->t, p->sbx, p->pid, &c, &sink, p, &p->op, &err);
    free(raw);
    start_op(p, rc, &err);
}

/* A request that reaches the guest (API_VF_GUEST) on a paused sandbox, or on one still
 * starting (a resume or a create in progress): start its resume if paused and hold the
 * request until the sandbox is up (sink_done runs it then). true if so (or if the resume
 * was refused: then answered). An upload's body waits, unread. */
bool rest_resume_first(struct pss *p, json_t *args)
{
    struct sbx_err err;
    struct sbx_rec rec;
    sbx_op_t op = 0;
    int rc;

    if (!sbx_coming_back(p->srv->t, p->sbx))
        return false;
    rc = sbx_snap_resume(p->srv->t, p->sbx, &sink, p, &op, &rec, &err);
    if (rc == 0 && !op) /* already back */
        return false;
    if (op)
        p->op = op;
    if (rc) {
        resp_sbx_err(p, &err);
        return true;
    }
    /* RESUMING is itself a phase with a live op (the resume's): not OP, which the
     * request's own operation enters once it runs. */
    p->held = json_incref(args);
    req_phase(p, HP_RESUMING);
    if (p->upload) {
        p->rx_paused = true;
        lws_rx_flow_control(p->wsi, 0);
        resp_want_write(p); /* to clear the body timeout lws arms (resp_writeable) */
    }
    return true;
}

/* A request whose args are all there (its JSON body, or its query): what its row asks
 * before it runs, then its handler, now or once the sandbox is back. */
static void run(struct pss *p, json_t *args)
{
    const struct api_verb *v;

    if (p->e2b) {
        if (p->e2b == E2B_R_CREATE && disk_full(p))
            return;
        e2b_handle(p, args);
        return;
    }
    v = api_route_verb(p->route, p->method);

    if ((v->flags & API_VF_DISK) && disk_full(p))
        return;
    if (v->body == API_BODY_RAW)
        p->upload = true;
    if ((v->flags & API_VF_GUEST) && rest_resume_first(p, args))
        return;
    handle(p, args);
}

/* A route whose JSON body has fully arrived. */
static void dispatch_body(struct pss *p)
{
    struct api_err e;
    json_t *body = NULL;

    req_phase(p, HP_RUN);
    if (p->envd) {
        envd_body(p);
        return;
    }
    if (api_body_parse(p->body ? p->body : "", p->body_len, &body, &e)) {
        resp_api_err(p, &e);
        return;
    }
    free(p->body);
    p->body = NULL;
    run(p, body);
    json_decref(body);
}

/* ------------------------------------------------------------ handlers */

static void h_healthz(struct pss *p, json_t *args)
{
    struct sbx_pool_stats pool;
    struct api_err e;

    (void)args;
    /* Liveness is open to anyone; how many sandboxes run and what the pools hold
     * is the key holder's (an Authorization header decides, as on /v1). */
    if (lws_hdr_total_length(p->wsi, WSI_TOKEN_HTTP_AUTHORIZATION) <= 0) {
        resp_json(p, 200, json_pack("{s:s}", "status", "ok"));
        return;
    }
    if (http_authorize(p, p->wsi, NULL, NULL, &e)) {
        resp_api_err(p, &e);
        return;
    }
    sbx_pool_stats(p->srv->t, &pool);
    {
        json_t *o =
            json_pack("{s:s, s:I, s:o}", "status", "ok", "sandboxes",
                      (json_int_t)sbx_count_live(p->srv->t), "pool", sbx_json_pool_stats(&pool));
        json_t *imgs = images_src_json(p->srv->images);
        if (o && imgs)
            json_object_set_new(o, "images", imgs);
        else
            json_decref(imgs);
        if (!o) {
            resp_code(p, 500, "internal", "out of memory");
            return;
        }
        resp_json(p, 200, o);
    }
}

/* The peers' answers are in (or their deadline passed): their arrays join this host's,
 * and a peer that did not answer makes the list partial, named, never silently short. */
static void fan_done(void *user, const struct fanout_result *r, unsigned n)
{
    struct pss *p = user;
    json_t *out = p->fan_local, *arr = json_object_get(out, p->fan_key), *missing = json_array();

    p->fan = NULL;
    p->fan_local = NULL;
    for (unsigned i = 0; i < n; i++) {
        const char *why = r[i].why;
        if (r[i].ok) {
            json_t *j = json_loadb(r[i].body, r[i].len, 0, NULL);
            json_t *theirs = json_object_get(j, p->fan_key);
            if (json_is_array(theirs) && json_is_array(arr))
                json_array_extend(arr, theirs);
            else
                why = "malformed answer";
            json_decref(j);
        }
        if (why)
            json_array_append_new(missing, json_pack("{s:s, s:s, s:i}", "host", r[i].name, "reason",
                                                     why, "status", r[i].status));
    }
    if (json_array_size(missing)) {
        json_object_set_new(out, "partial", json_true());
        json_object_set_new(out, "unreachable", missing);
    } else {
        json_object_set_new(out, "partial", json_false());
        json_decref(missing);
    }
    req_phase(p, HP_ANSWER);
    resp_json(p, 200, out);
}

/* A list this host answered (out): alone, or with every peer's when this host is one of
 * a fleet and the request is a client's (a peer's own fan-out says X-Warren-Local). */
static void list_answer(struct pss *p, int rc, json_t *out, const struct sbx_err *err,
                        const char *key)
{
    char path[2048], auth[512];
    int n;

    if (rc || !fanout_peers_count(p->srv->peers) ||
        lws_hdr_custom_length(p->wsi, "x-warren-local:", 15) >= 0) {
        respond_sync(p, rc, out, err);
        return;
    }
    n = lws_hdr_copy(p->wsi, path, sizeof(path), WSI_TOKEN_GET_URI);
    if (n > 0 && lws_hdr_total_length(p->wsi, WSI_TOKEN_HTTP_URI_ARGS) > 0) {
        char q[1024];
        int k = 0, len = 0;
        /* lws hands the query over as fragments: put them back together. */
        while (len + 2 < (int)sizeof(q) &&
               lws_hdr_copy_fragment(p->wsi, q + len + 1, (int)sizeof(q) - len - 1,
                                     WSI_TOKEN_HTTP_URI_ARGS, k) > 0) {
            q[len] = k ? '&' : '?';
            len += 1 + (int)strlen(q + len + 1);
            k++;
        }
        if (len && (size_t)n + (size_t)len < sizeof(path))
            memcpy(path + n, q, (size_t)len + 1);
    }
    if (n <= 0 || http_hdr(p->wsi, WSI_TOKEN_HTTP_AUTHORIZATION, auth, sizeof(auth)) < 0) {
        json_decref(out);
        resp_code(p, 400, "bad_request", "request line or Authorization too long to pass on");
        return;
    }
    if (fanout_start(p->srv->loop, p->srv->peers, path, auth[0] ? auth : NULL,
                     p->srv->cfg->peer_timeout_ms, p->srv->cfg->peer_answer_max_bytes, fan_done, p,
                     &p->fan)) {
        json_decref(out);
        resp_code(p, 500, "internal", "cannot ask the peer hosts");
        return;
    }
    p->fan_local = out;
    p->fan_key = key;
    req_phase(p, HP_OP);
}

static void h_sandbox_list(struct pss *p, json_t *args)
{
    struct sbx_err err;
    struct sbx_rec *recs = NULL;
    struct sbx_kv *filter = NULL;
    size_t n = 0, nrecs = 0;
    json_t *arr = NULL;
    int rc = sbx_json_kv(args, "metadata", &filter, &n, &err);

    if (rc == 0)
        rc = sbx_list(p->srv->t, json_string_value(json_object_get(args, "state")), filter, n,
                      &recs, &nrecs, &err);
    if (rc == 0 && (arr = json_array()))
        for (size_t i = 0; i < nrecs; i++)
            json_array_append_new(arr, sbx_json_rec(&recs[i]));
    free(recs);
    free(filter);
    list_answer(p, rc, rc ? NULL : json_pack("{s:o}", "sandboxes", arr), &err, "sandboxes");
}

/* A template named by content, "name@sha256:<hex>": checked against this host's image of
 * that name and replaced in body by the name alone. 0 (body untouched without a '@'), or
 * an answer was given. */
static int template_by_hash(struct pss *p, json_t *body)
{
    const char *v = json_string_value(json_object_get(body, "template")), *at, *hex;
    char name[SBX_TMPL_NAME_MAX + 1], file[SBX_TMPL_NAME_MAX + 8], alias[SBX_TMPL_NAME_MAX + 1];
    char have[IMGSRC_HEX_LEN + 1];

    if (!v || !(at = strchr(v, '@')))
        return 0;
    hex = at + 1 + strlen("sha256:");
    if ((size_t)(at - v) > SBX_TMPL_NAME_MAX || at == v || strncmp(at + 1, "sha256:", 7) != 0 ||
        strlen(hex) != IMGSRC_HEX_LEN || strspn(hex, "0123456789abcdef") != IMGSRC_HEX_LEN) {
        resp_code(p, 400, "invalid_argument",
                  "template must be a name, or name@sha256:<64 lowercase hex digits>");
        return -1;
    }
    memcpy(name, v, (size_t)(at - v));
    name[at - v] = '\0';
    if (strspn(name, "abcdefghijklmnopqrstuvwxyz0123456789-_") != strlen(name)) {
        resp_code(p, 400, "invalid_argument", "template must be a template name");
        return -1;
    }
    /* The image a create of that name would boot: an alias's. */
    snprintf(file, sizeof(file), "%s.ext4",
             cfg_tmap_get(p->srv->cfg->template_aliases, name, alias, sizeof(alias)) ? alias
                                                                                     : name);
    if (!images_src_sha(p->srv->images, file, have)) {
        char path[4096 + 64];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", p->srv->cfg->image_dir, file);
        if (stat(path, &st) == 0) {
            /* Known soon: the hash of a new or changed image is being read. */
            images_src_want_hashes(p->srv->images);
            resp_code(p, 503, "image_hashing",
                      "this host has not yet hashed its image of that template: try again");
            return -1;
        }
        /* No such image: the create below says so as it always does. */
    } else if (strcmp(have, hex) != 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "template %s on this host is sha256:%s, not the one asked for",
                 name, have);
        resp_code(p, 400, "invalid_argument", msg);
        return -1;
    }
    json_object_set_new(body, "template", json_string(name));
    return 0;
}

static void h_sandbox_create(struct pss *p, json_t *body)
{
    struct sbx_json_create c;
    struct sbx_err err;
    int rc;

    if (template_by_hash(p, body))
        return;
    rc = sbx_json_create(body, &c, &err);

    if (rc == 0)
        rc = sbx_create(p->srv->t, &c.req, &sink, p, &p->op, &err);
    sbx_json_create_free(&c);

    /* Behind a proxy, a host with no room says so with 503 before doing anything: the
     * proxy retries the create on another host, and turns a 503 host_full from every
     * host it tried into the client's 429. */
    if (p->srv->cfg->fleet && (rc == SBX_E_TOO_MANY_SANDBOXES || rc == SBX_E_MEMORY_EXHAUSTED)) {
        resp_code(p, 503, "host_full", err.msg);
        return;
    }
    start_op(p, rc, &err);
}

static void h_sandbox_get(struct pss *p, json_t *args)
{
    struct sbx_err err;
    struct sbx_rec rec;
    int rc = sbx_get(p->srv->t, p->sbx, &rec, &err);

    (void)args;
    respond_sync(p, rc, rc ? NULL : sbx_json_rec(&rec), &err);
}

static void h_sandbox_delete(struct pss *p, json_t *args)
{
    struct sbx_err err;
    struct sbx_rec rec;
    int rc = sbx_delete(p->srv->t, p->sbx, &rec, &err);

    (void)args;
    respond_sync(p, rc, rc ? NULL : sbx_json_rec(&rec), &err);
}

static void h_timeout(struct pss *p, json_t *body)
{
    struct sbx_err err;
    struct sbx_rec rec;
    json_t *out = NULL;
    int64_t ttl;
    int rc = sbx_json_timeout(body, &ttl, &err);

    if (rc == 0)
        rc = sbx_set_timeout(p->srv->t, p->sbx, ttl, &rec, &err);
    if (rc == 0)
        out = sbx_json_rec(&rec);

    respond_sync(p, rc, out, &err);
}

static void h_exec(struct pss *p, json_t *body)
{
    struct sbx_json_exec x;
    struct sbx_err err;
    int rc = sbx_json_exec(body, &x, &err);

    p->bg_exec = x.req.background == 1 || x.req.pty;
    if (p->bg_exec)
        p->ndjson = false; /* answered at once with its pid; output is read apart */
    if (rc == 0)
        rc = sbx_exec(p->srv->t, p->sbx, &x.req, p->ndjson, &sink, p, &p->op, &err);
    sbx_json_exec_free(&x);
    start_op(p, rc, &err);
}

static void h_file_read(struct pss *p, json_t *args)
{
    struct sbx_err err;
    int rc = sbx_file_read(p->srv->t, p->sbx, json_string_value(json_object_get(args, "path")),
                           &sink, p, &p->op, &err);

    start_op(p, rc, &err);
}

/* PUT .../files: open the write in the guest and feed it what has arrived. */
static void h_file_write(struct pss *p, json_t *args)
{
    struct sbx_err err;
    int rc = sbx_file_write(p->srv->t, p->sbx, json_string_value(json_object_get(args, "path")),
                            (unsigned)json_integer_value(json_object_get(args, "mode")), &sink, p,
                            &p->op, &err);

    if (rc) {
        start_op(p, rc, &err);
        return;
    }
    rest_upload_started(p, json_is_true(json_object_get(args, "empty")));
}

void rest_upload_started(struct pss *p, bool empty)
{
    req_phase(p, HP_OP);
    if (empty) {
        p->finish_sent = true;
        sbx_op_finish(p->srv->t, p->op);
    } else if (expects_continue(p)) {
        p->need_continue = true;
        resp_want_write(p);
    }
    if (p->pend_len || p->rx_paused || p->body_done)
        upload_pump(p); /* bytes that came while a resume was awaited, and the rest */
}

static void h_file_remove(struct pss *p, json_t *args)
{
    file_op(p, SBX_FILE_REMOVE, json_incref(args));
}

static void h_file_stat(struct pss *p, json_t *args)
{
    file_op(p, SBX_FILE_STAT, json_incref(args));
}

static void h_file_list(struct pss *p, json_t *args)
{
    file_op(p, SBX_FILE_LIST, json_incref(args));
}

static void h_file_mkdir(struct pss *p, json_t *args)
{
    file_op(p, SBX_FILE_MKDIR, json_incref(args));
}

static void h_file_rename(struct pss *p, json_t *body)
{
    struct api_err e;
    json_t *args;

    if (api_rename_args(body, &args, &e))
        resp_api_err(p, &e);
    else
        file_op(p, SBX_FILE_RENAME, args);
}

/* The processes, or one of them (p->pid). */
static void h_proc_list(struct pss *p, json_t *args)
{
    struct sbx_err err;

    (void)args;
    start_op(p, sbx_proc_list(p->srv->t, p->sbx, p->pid, &sink, p, &p->op, &err), &err);
}

static void h_proc_output(struct pss *p, json_t *args)
{
    struct sbx_err err;
    int rc;

    /* Always NDJSON: output until the process ends (follow) or until caught up. */
    p->ndjson = true;
    rc = sbx_proc_output(p->srv->t, p->sbx, p->pid,
                         (uint64_t)json_integer_value(json_object_get(args, "offset")),
                         json_is_true(json_object_get(args, "follow")), &sink, p, &p->op, &err);
    start_op(p, rc, &err);
}

static void h_proc_stdin(struct pss *p, json_t *body)
{
    proc_ctl(p, API_PROC_STDIN, body);
}

static void h_proc_signal(struct pss *p, json_t *body)
{
    proc_ctl(p, API_PROC_SIGNAL, body);
}

static void h_proc_resize(struct pss *p, json_t *body)
{
    proc_ctl(p, API_PROC_RESIZE, body);
}

static void h_watch_start(struct pss *p, json_t *args)
{
    watch_start(p, args);
}

static void h_watch_resume(struct pss *p, json_t *args)
{
    watch_resume(p, args);
}

static void h_watch_delete(struct pss *p, json_t *args)
{
    watch_delete(p, args);
}

static void h_tokens(struct pss *p, json_t *body)
{
    auth_tokens_mint(p, body);
}

static void h_snapshot(struct pss *p, json_t *body)
{
    struct sbx_json_snap req;
    struct sbx_err err;
    int rc = sbx_json_snap(body, &req, &err);

    if (rc == 0)
        rc = sbx_snap_take(p->srv->t, p->sbx, &req.req, &sink, p, &p->op, &err);
    sbx_json_snap_free(&req);
    start_op(p, rc, &err);
}

static void h_fork(struct pss *p, json_t *body)
{
    struct sbx_json_fork req;
    struct sbx_err err;
    int rc = sbx_json_fork(body, &req, &err);

    if (rc == 0)
        rc = sbx_snap_fork(p->srv->t, p->sbx, &req.req, &sink, p, &p->op, &err);
    sbx_json_fork_free(&req);
    start_op(p, rc, &err);
}

/* Pause and resume: already so (no op started), answered at once with the record; else
 * when the VM is saved (or restored). */
static void pause_or_resume(struct pss *p, int rc, sbx_op_t op, const struct sbx_rec *rec,
                            const struct sbx_err *err)
{
    json_t *out;

    if (rc == 0 && !op) {
        if ((out = sbx_json_rec(rec)))
            resp_json(p, 200, out);
        else
            resp_code(p, 500, "internal", "out of memory");
        return;
    }
    if (rc == 0)
        p->op = op;
    start_op(p, rc, err);
}

static void h_pause(struct pss *p, json_t *body)
{
    struct sbx_err err;
    struct sbx_rec rec;
    sbx_op_t op = 0;
    int rc = sbx_json_pause(body, &err);

    if (rc == 0)
        rc = sbx_snap_pause(p->srv->t, p->sbx, &sink, p, &op, &rec, &err);
    pause_or_resume(p, rc, op, &rec, &err);
}

static void h_resume(struct pss *p, json_t *body)
{
    struct sbx_err err;
    struct sbx_rec rec;
    sbx_op_t op = 0;
    int rc;

    (void)body;
    rc = sbx_snap_resume(p->srv->t, p->sbx, &sink, p, &op, &rec, &err);
    pause_or_resume(p, rc, op, &rec, &err);
}

static void h_ctx_list(struct pss *p, json_t *args)
{
    (void)args;
    code_context_op(p, "context_list", NULL);
}

static void h_ctx_create(struct pss *p, json_t *body)
{
    code_context_op(p, "context_create", body);
}

static void h_ctx_get(struct pss *p, json_t *args)
{
    (void)args;
    code_context_op(p, "context_get", NULL);
}

static void h_ctx_delete(struct pss *p, json_t *args)
{
    (void)args;
    code_context_op(p, "context_delete", NULL);
}

static void h_ctx_restart(struct pss *p, json_t *body)
{
    code_context_op(p, "context_restart", body);
}

static void h_ctx_interrupt(struct pss *p, json_t *body)
{
    code_context_op(p, "context_interrupt", body);
}

static void h_run_code(struct pss *p, json_t *body)
{
    code_run(p, body);
}

static void h_run_read(struct pss *p, json_t *args)
{
    code_run_read(p, args);
}

/* Ends the run's connector: kerneld then interrupts the run. */
static void h_run_stop(struct pss *p, json_t *args)
{
    struct sbx_err err;

    (void)args;
    start_op(p, klink_stop(p->srv->t, p->sbx, p->pid, &sink, p, &p->op, &err), &err);
}

static void h_network(struct pss *p, json_t *body)
{
    struct sbx_json_net n = {0};
    struct sbx_err err;
    int rc = json_is_object(body)
                 ? sbx_json_net(body, &n, &err)
                 : sbx_err_set(&err, SBX_E_INVALID_ARGUMENT, "the body must be the network object");

    if (rc == 0)
        rc = sbx_set_network(p->srv->t, p->sbx, &n.req, &sink, p, &p->op, &err);
    sbx_json_net_free(&n);
    start_op(p, rc, &err);
}

static void h_snapshot_list(struct pss *p, json_t *args)
{
    struct sbx_snap_rec *recs = NULL;
    struct sbx_err err;
    json_t *out = NULL;
    size_t n = 0;
    int rc = sbx_snap_all(p->srv->t, &recs, &n, &err);

    (void)args;
    if (rc == 0 && !(out = sbx_json_snaps(recs, n)))
        rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
    free(recs);
    list_answer(p, rc, out, &err, "snapshots");
}

static void h_snapshot_get(struct pss *p, json_t *args)
{
    struct sbx_err err;
    struct sbx_snap_rec rec;
    json_t *out = NULL;
    int rc = sbx_snap_find(p->srv->t, p->sbx, &rec, &err);

    if (rc == 0 && !(out = sbx_json_snap_rec(&rec)))
        rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
    (void)args;
    respond_sync(p, rc, out, &err);
}

static void h_snapshot_delete(struct pss *p, json_t *args)
{
    struct sbx_err err;
    struct sbx_snap_rec rec;
    json_t *out = NULL;
    int rc = sbx_snap_drop(p->srv->t, p->sbx, &rec, &err);

    if (rc == 0 && !(out = sbx_json_snap_rec(&rec)))
        rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
    (void)args;
    respond_sync(p, rc, out, &err);
}

/* json "sha256" of image_dir/file as last hashed, or null (and a hashing asked for). */
static json_t *sha_json(struct pss *p, const char *file, bool *unknown)
{
    char hex[IMGSRC_HEX_LEN + 1];

    if (images_src_sha(p->srv->images, file, hex))
        return json_string(hex);
    *unknown = true;
    return json_null();
}

/* Each template's sha256, and the kernel's and initramfs' beside them: clients and hosts
 * name a template by content. 0, or -1 when out of memory. */
static int add_hashes(struct pss *p, json_t *out)
{
    json_t *a = json_object_get(out, "templates"), *o;
    bool unknown = false;
    size_t i;

    json_array_foreach(a, i, o)
    {
        char file[SBX_TMPL_NAME_MAX + 8];
        snprintf(file, sizeof(file), "%s.ext4", json_string_value(json_object_get(o, "name")));
        if (json_object_set_new(o, "sha256", sha_json(p, file, &unknown)))
            return -1;
    }
    if (json_object_set_new(out, "kernel",
                            json_pack("{s:s,s:o}", "name", "vmlinux", "sha256",
                                      sha_json(p, "vmlinux", &unknown))) ||
        json_object_set_new(out, "initramfs",
                            json_pack("{s:s,s:o}", "name", "initramfs.cpio", "sha256",
                                      sha_json(p, "initramfs.cpio", &unknown))))
        return -1;
    if (unknown)
        images_src_want_hashes(p->srv->images);
    return 0;
}

static void h_templates(struct pss *p, json_t *args)
{
    struct sbx_tmpl_list *l = NULL;
    struct sbx_err err;
    json_t *out = NULL;
    int rc = sbx_templates(p->srv->t, &l, &err);

    if (rc == 0 && !(out = sbx_json_templates(l)))
        rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
    free(l);
    if (rc == 0 && add_hashes(p, out))
        rc = sbx_err_set(&err, SBX_E_INTERNAL, "out of memory");
    (void)args;
    respond_sync(p, rc, out, &err);
}

/* Content-Length: 0 absent, 1 present (*cl set), -1 malformed. */
static int content_length(struct lws *wsi, uint64_t *cl)
{
    char b[32], *end;
    int n = http_hdr(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH, b, sizeof(b));

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
    int n = http_hdr(p->wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING, te, sizeof(te));

    if (n == 0 && !lws_hdr_total_length(p->wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING))
        return 0;
    /* lws would read such a request by its Content-Length (or none), whereas a proxy in
     * front may go by Transfer-Encoding: refuse what two parsers could frame apart. */
    p->close_after = true;
    p->body_done = true; /* nothing more is read: the connection closes after the answer */
    if (has_cl) {
        resp_code(p, 400, "bad_request",
                  "both Transfer-Encoding and Content-Length: the body's framing is ambiguous");
        return 1;
    }
    if (p->http10 || !(p->method & (API_POST | API_PUT | API_PATCH))) {
        resp_code(p, 400, "bad_request",
                  "Transfer-Encoding is accepted on HTTP/1.1 POST, PUT and PATCH requests only");
        return 1;
    }
    if (n < 0 || strcasecmp(te, "chunked")) {
        resp_code(p, 501, "not_implemented",
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
    resp_json(p, 507,
              api_error("insufficient_storage",
                        "the server's disk has %" PRIu64 " MiB free, below its minimum of %u MiB",
                        free_mb, p->srv->cfg->min_free_disk_mb));
    return true;
}

static bool expects_continue(struct pss *p)
{
    char b[32];

    return !p->http10 && http_hdr(p->wsi, WSI_TOKEN_HTTP_EXPECT, b, sizeof(b)) > 0 &&
           strcasecmp(b, "100-continue") == 0;
}

/* Start collecting a JSON body (or dispatch now when there is none to read). */
void rest_want_body(struct pss *p, int has_cl, uint64_t cl)
{
    if (p->te_chunked) {
        req_phase(p, HP_BODY); /* the buffer grows as chunks come (on_body_bytes) */
        if (expects_continue(p)) {
            p->need_continue = true;
            resp_want_write(p);
        }
        return;
    }
    if (!has_cl) {
        /* No length and no chunking: an empty body. lws still expects one, so the
         * connection closes after the answer (resp_json sees !body_done). */
        dispatch_body(p);
        return;
    }
    if (cl > p->srv->cfg->max_body_bytes) {
        resp_json(p, 413,
                  api_error("body_too_large", "JSON body of %" PRIu64 " bytes exceeds %zu", cl,
                            p->srv->cfg->max_body_bytes));
        return;
    }
    req_phase(p, HP_BODY);
    if (cl) {
        p->body_cap = (size_t)cl;
        p->body = malloc(p->body_cap);
        if (!p->body) {
            resp_code(p, 500, "internal", "out of memory");
            return;
        }
    }
    if (cl && expects_continue(p)) {
        p->need_continue = true;
        resp_want_write(p);
    }
}

/* A plain GET of a socket route (no Upgrade). A browser is never told why a WebSocket
 * handshake was refused, so the terminal page asks here: the same checks as the
 * upgrade (key or token, Origin, the sandbox), then 426 when all of them pass. The
 * query is the socket's own and is not judged here. */
static void socket_probe(struct pss *p, const char *protocol)
{
    struct sbx_err err;
    struct sbx_rec rec;
    char msg[160];

    if (!http_origin_allowed(p->srv, p->wsi)) {
        resp_code(p, 403, "origin_not_allowed",
                  "this Origin may not open sockets here (allowed_origins)");
        return;
    }
    if (sbx_get(p->srv->t, p->sbx, &rec, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    if (rec.ended) {
        err.code = SBX_E_GONE;
        snprintf(err.msg, sizeof(err.msg), "sandbox %s has ended", p->sbx);
        resp_sbx_err(p, &err);
        return;
    }
    snprintf(msg, sizeof(msg),
             "this route is a WebSocket (Upgrade: websocket, Sec-WebSocket-Protocol: %s)",
             protocol);
    resp_code(p, 426, "upgrade_required", msg);
}

static void h_pty_probe(struct pss *p, json_t *args)
{
    struct api_err e;

    (void)args;
    /* As the upgrade judges it (ws_pty.c): a new PTY runs a program, so a token needs
     * "exec" as well as "pty" for it. The route's own scope was judged first, and the
     * method: a wrong one is a 405 whatever the token. */
    if (p->pid == 0 && http_authorize(p, p->wsi, p->sbx, "exec", &e)) {
        resp_api_err(p, &e);
        return;
    }
    socket_probe(p, "warren.pty.v1");
}

/* Jupyter's kernel API: jupyter_rest.c. */
static void h_jup_specs(struct pss *p, json_t *args)
{
    jup_specs_list(p, args);
}

static void h_jup_spec(struct pss *p, json_t *args)
{
    jup_spec_get(p, args);
}

static void h_jup_kernels(struct pss *p, json_t *args)
{
    jup_kernels_list(p, args);
}

static void h_jup_create(struct pss *p, json_t *body)
{
    jup_kernel_create(p, body);
}

static void h_jup_kernel(struct pss *p, json_t *args)
{
    jup_kernel_get(p, args);
}

static void h_jup_delete(struct pss *p, json_t *args)
{
    jup_kernel_delete(p, args);
}

static void h_jup_interrupt(struct pss *p, json_t *body)
{
    jup_kernel_interrupt(p, body);
}

static void h_jup_restart(struct pss *p, json_t *body)
{
    jup_kernel_restart(p, body);
}

static void h_jup_probe(struct pss *p, json_t *args)
{
    (void)args;
    resp_code(p, 426, "upgrade_required",
              "the channels of a kernel are a WebSocket: send an Upgrade: websocket request");
}

static void h_session_probe(struct pss *p, json_t *args)
{
    (void)args;
    socket_probe(p, "warren.session.v1");
}

/* Percent-encode s (a decoded query name or value) onto out. */
static void put_enc(char *out, size_t cap, size_t *n, const char *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";

    for (size_t i = 0; i < len && *n + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            strchr("-._~/", c)) {
            out[(*n)++] = (char)c;
        } else {
            out[(*n)++] = '%';
            out[(*n)++] = hex[c >> 4];
            out[(*n)++] = hex[c & 15];
        }
    }
    out[*n] = '\0';
}

/* 307 to the same URL with Connection: close when uri (or the Host) names a sandbox
 * port (ports_head.h). 1 when answered. */
static int port_redirect(struct pss *p, const char *uri)
{
    struct ports_head h;
    struct ports_dest d;
    char host[256], frag[QUERY_STORE], *loc;
    size_t n = 0, cap = 4 * QUERY_STORE + 4 * strlen(uri) + 16;

    memset(&h, 0, sizeof(h));
    h.target = (struct ports_span){uri, strlen(uri)};
    if (http_hdr(p->wsi, WSI_TOKEN_HOST, host, sizeof(host)) > 0)
        h.host = (struct ports_span){host, strlen(host)};
    if (!h.target.n || ports_route(&h, p->srv->cfg->port_domain, &d) == PORTS_NOT)
        return 0;
    p->close_after = true;
    /* The Location must stay a path of this host: "//x" would be host x ('\\' and
     * other bytes are percent-encoded below). lws 4.1.6 already collapses repeated
     * slashes in the URI it hands us; this keeps the rule if it ever does not. */
    if (uri[0] != '/' || uri[1] == '/') {
        resp_code(p, 400, "bad_request", "the path must start with exactly one '/'");
        return 1;
    }
    if (!(loc = malloc(cap))) {
        resp_code(p, 500, "internal", "out of memory");
        return 1;
    }
    put_enc(loc, cap, &n, uri, strlen(uri));
    for (int i = 0; i < QUERY_FRAGS_MAX; i++) {
        int len =
            lws_hdr_copy_fragment(p->wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i);
        char *eq;
        if (len < 0 || n + 8 >= cap)
            break;
        if (http_query_frag_spurious(p->wsi, i, frag))
            continue;
        loc[n++] = i ? '&' : '?';
        eq = strchr(frag, '=');
        put_enc(loc, cap, &n, frag, eq ? (size_t)(eq - frag) : (size_t)len);
        if (eq && n + 1 < cap) {
            loc[n++] = '=';
            put_enc(loc, cap, &n, eq + 1, strlen(eq + 1));
        }
    }
    loc[n] = '\0';
    p->location = loc;
    resp_code(p, 307, "new_connection_needed",
              "a sandbox port is reached only by the first request of a connection: "
              "repeat this request on a new connection");
    return 1;
}

/* E2B's control plane (e2b_api.h): routed, admitted and started here, on the same
 * body collection and query reading as Warren's routes. 1 when uri is one of its
 * paths (answered or started), else 0. */
static int e2b_door(struct pss *p, const char *uri, int has_cl, uint64_t cl)
{
    const char *frags[QUERY_FRAGS_MAX];
    char qstore[QUERY_STORE];
    struct e2b_match m;
    struct api_err e;
    size_t nfrags;
    json_t *args;
    int r = e2b_route_match(uri, p->method, &m);

    if (r == -ENOENT)
        return 0;
    p->e2b = E2B_R_ERROR; /* from here on, every answer is in E2B's shape */
    if (e2b_authorize(p, &e)) {
        resp_api_err(p, &e);
        return 1;
    }
    if (r == -ENOTSUP) {
        resp_code(p, 405, "method_not_allowed", "method not allowed on this route");
        return 1;
    }
    if (r) {
        resp_code(p, 404, "not_found", "sandbox not found");
        return 1;
    }
    p->e2b = m.route;
    memcpy(p->sbx, m.id, sizeof(p->sbx));
    if (m.body) {
        rest_want_body(p, has_cl, cl);
        return 1;
    }
    if (query_frags(p->wsi, qstore, sizeof(qstore), frags, &nfrags, false)) {
        resp_code(p, 400, "bad_request", "query string too long");
        return 1;
    }
    switch (e2b_query_args(frags, nfrags, &args)) {
    case 0:
        break;
    case -EINVAL:
        resp_code(p, 400, "bad_request", "the query string is not UTF-8");
        return 1;
    default:
        resp_code(p, 500, "internal", "out of memory");
        return 1;
    }
    e2b_handle(p, args);
    json_decref(args);
    return 1;
}

void rest_request(struct pss *p, const char *uri)
{
    const char *frags[QUERY_FRAGS_MAX];
    char qstore[QUERY_STORE], ver[16];
    struct api_route r;
    struct api_query q;
    struct api_err e;
    const struct api_verb *v;
    json_t *args;
    uint64_t cl;
    size_t nfrags;
    int rc, has_cl;

    p->method = method_of(p->wsi);
    /* No route takes HEAD or OPTIONS. A HEAD answer must not carry a body; rather
     * than special-case it, any such answer ends the connection. */
    if (p->method == API_OTHER)
        p->close_after = true;
    p->http10 = http_hdr(p->wsi, WSI_TOKEN_HTTP, ver, sizeof(ver)) > 0 && !strcmp(ver, "HTTP/1.0");
    has_cl = content_length(p->wsi, &cl);
    /* A body is coming if a length says so, or (to lws) for any POST/PUT without one. */
    p->body_done = has_cl > 0 ? cl == 0 : !(p->method & (API_POST | API_PUT | API_PATCH));
    if (has_cl < 0) {
        p->close_after = true;
        resp_code(p, 400, "bad_request", "malformed Content-Length");
        return;
    }
    if (transfer_encoding(p, has_cl))
        return;

    /* E2B's in-sandbox API, by its headers or its Host (envd.c). */
    if (envd_request(p, uri, has_cl, cl))
        return;

    /* A sandbox port asked for on a connection lws already serves (a keep-alive one):
     * only the first request of a connection can go to the port proxy (http.c), so the
     * client is sent to the same URL on a new one. */
    if (port_redirect(p, uri))
        return;

    /* The browser terminal's page and files (web.h): no key, a fixed allow-list. */
    {
        const struct web_file *wf;
        int w = web_lookup(uri, &wf);
        if (w == WEB_FILE) {
            web_request(p, wf);
            return;
        }
        if (w == WEB_NOTFOUND) {
            resp_code(p, 404, "not_found", "no such page");
            return;
        }
    }

    if (e2b_door(p, uri, has_cl, cl))
        return;

    rc = api_route_match(uri, &r);
    /* A token of the row's scope opens its sandbox's route; everything else needs the
     * key. */
    if (r.jupyter ? jup_authorize(p->wsi, p->srv->key, &e) != 0
                  : r.auth && http_authorize(p, p->wsi, r.sbx,
                                             rc == 0 ? api_routes[r.id].scope : NULL, &e)) {
        resp_api_err(p, &e);
        return;
    }
    if (rc) {
        resp_code(p, 404, "not_found", "no such route");
        return;
    }
    if (!(v = api_route_verb(r.id, p->method))) {
        resp_code(p, 405, "method_not_allowed", "method not allowed on this route");
        return;
    }
    p->route = r.id;
    p->pid = r.pid;
    memcpy(p->sbx, r.sbx, sizeof(p->sbx));
    memcpy(p->ctx, r.ctx, sizeof(p->ctx));
    if (v->flags & API_VF_SOCKET) {
        handle(p, NULL);
        return;
    }

    /* The typed request: the query the row allows, then its body as the row says. */
    if (query_frags(p->wsi, qstore, sizeof(qstore), frags, &nfrags, r.jupyter)) {
        resp_code(p, 400, "bad_request", "query string too long");
        return;
    }
    if (api_query_parse(frags, nfrags, v->query, &q, &e)) {
        resp_api_err(p, &e);
        return;
    }
    if ((v->query & API_Q_PATH) && api_path_check("path", q.path, &e)) {
        resp_api_err(p, &e);
        goto out;
    }
    if (v->flags & API_VF_NDJSON) {
        char accept[256];
        p->ndjson = http_hdr(p->wsi, WSI_TOKEN_HTTP_ACCEPT, accept, sizeof(accept)) > 0 &&
                    api_wants_ndjson(accept);
    }
    if (v->body == API_BODY_JSON) {
        rest_want_body(p, has_cl, cl);
        goto out;
    }
    if (v->body == API_BODY_RAW && !has_cl && !p->te_chunked) {
        resp_code(p, 411, "length_required",
                  "upload with a Content-Length or Transfer-Encoding: chunked");
        goto out;
    }
    args = api_query_args(&q, v->query);
    /* An upload's args say whether its body is empty: then the write is finished at once. */
    if (args && v->body == API_BODY_RAW &&
        json_object_set_new(args, "empty", json_boolean(has_cl && cl == 0))) {
        json_decref(args);
        args = NULL;
    }
    if (!args) {
        resp_code(p, 500, "internal", "out of memory");
        goto out;
    }
    run(p, args);
    json_decref(args);
out:
    api_query_clear(&q);
}

/* ----------------------------------------------------------------- input */

static int on_body_bytes(struct pss *p, const void *in, size_t len)
{
    if (p->upload) {
        size_t took;

        if (!http_phase_op_live(p->phase) || p->status)
            return 0; /* answered already: the rest is dropped with the connection */
        if (p->pend_len || http_phase_resuming(p->phase)) {
            /* Paused (for credit, or for a resume), yet lws had more: keep it behind what
             * is pending. */
            if (!len)
                return 0;
            if (p->pend_off + p->pend_len + len > p->pend_cap) {
                unsigned char *np;
                if (p->pend_len)
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
        if (took >= len || !http_phase_op_live(p->phase))
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
        resp_want_write(p); /* to clear the body timeout lws arms after this callback */
        if (p->kick)
            upload_pump(p);
        return 0;
    }
    if (!http_phase_collecting(p->phase) || p->status || !len)
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
            resp_code(p, 500, "internal", "out of memory");
            return 0;
        }
        p->body = nb;
        p->body_cap = cap;
    }
    if (len > p->body_cap - p->body_len) {
        resp_json(p, 413,
                  api_error("body_too_large", "JSON body exceeds %zu bytes",
                            p->srv->cfg->max_body_bytes));
        return 0;
    }
    memcpy(p->body + p->body_len, in, len);
    p->body_len += len;
    return 0;
}

/* An upload's body failed to decode: answered, its op cancelled; the rest of the body
 * is read and dropped (finish() lingers). */
void rest_upload_fail(struct pss *p, int status, const char *why)
{
    if (p->status)
        return;
    if (http_phase_op_live(p->phase)) {
        req_phase(p, HP_ANSWER);
        sbx_op_cancel(p->srv->t, p->op);
    }
    free(p->pend);
    p->pend = NULL;
    p->pend_len = p->pend_off = p->pend_cap = 0;
    /* reading waited for the sandbox: the rest of the body is drained now */
    if (p->rx_paused)
        upload_resume(p);
    resp_json(p, status, json_pack("{s:i, s:s}", "code", status, "message", why));
}

static void mp_fail(struct pss *p, const char *why)
{
    rest_upload_fail(p, 400, why);
}

/* Body bytes of the request, through the multipart decoder when it has one. */
int rest_upload_bytes(struct pss *p, const void *in, size_t len)
{
    unsigned char *out;
    size_t used, olen;
    int r;

    if (!p->mp)
        return on_body_bytes(p, in, len);
    if (p->status || p->mp->st == MPART_DONE || p->mp->st == MPART_FAILED || !len)
        return 0; /* after the closing boundary (or a failure): dropped */
    if (!(out = malloc(len + MPART_DELIM_MAX)))
        return -1;
    r = mpart_feed(p->mp, in, len, &used, out, &olen);
    if (olen && on_body_bytes(p, out, olen)) {
        free(out);
        return -1;
    }
    free(out);
    if (r < 0)
        mp_fail(p, r == -E2BIG ? "multipart part headers too long"
                               : "malformed multipart body (one part, opening with its boundary)");
    return 0;
}

/* Body bytes after the chunked framing: inflated first when the body is gzip. */
static int body_bytes(struct pss *p, const void *in, size_t len)
{
    if (p->gz)
        return envd_gz_bytes(p, in, len);
    return rest_upload_bytes(p, in, len);
}

/* Every body byte arrived and was decoded: the gzip and multipart framings must be
 * complete, then the write is finished once nothing is pending. */
static void upload_end(struct pss *p)
{
    if (p->gz && envd_gz_end(p))
        return; /* input still held (the pump ends it), or refused */
    if (p->mp && p->mp->st != MPART_DONE) {
        mp_fail(p, "the multipart body ended before its closing boundary");
        return;
    }
    if (http_phase_op_running(p->phase) && !p->pend_len && !p->finish_sent) {
        p->finish_sent = true;
        sbx_op_finish(p->srv->t, p->op);
    }
}

/* Raw body bytes from lws: as they are, or through the chunked decoder. */
int rest_body(struct pss *p, const void *in, size_t len)
{
    const unsigned char *b = in;

    if (!p->te_chunked)
        return body_bytes(p, in, len);
    if (p->te_bad)
        return 0;
    while (len && !p->te_done) {
        size_t used, off, dlen;
        int r = chunked_decode(&p->te, b, len, &used, &off, &dlen);

        if (r < 0) {
            LOG(LOG_WARN, "%s: malformed chunked request body (%s): closing", p->sbx,
                r == -E2BIG ? "a chunk line or trailer too long" : "bad framing");
            if (p->status || http_phase_lingering(p->phase))
                return -1;
            p->te_bad = true;
            /* Where the body ends is unknown: answer, then close without reading on. */
            p->body_done = true;
            if (http_phase_op_live(p->phase)) {
                req_phase(p, HP_ANSWER);
                sbx_op_cancel(p->srv->t, p->op);
            }
            resp_code(p, 400, "bad_request", "malformed chunked request body");
            return 0;
        }
        if (dlen && body_bytes(p, b + off, dlen))
            return -1;
        b += used;
        len -= used;
        if (r == CHUNKED_DONE) {
            p->te_done = true;
            p->te_untimeout = true;
            resp_want_write(p);
            return rest_body_done(p);
        }
    }
    return 0; /* bytes after the body: the connection closes after the answer */
}

int rest_body_done(struct pss *p)
{
    p->body_done = true;
    /* The body is whole: no timeout of lws's may now cut the answer short, which can
     * take minutes (a cold boot, a kernel's restart). A body lws completes without
     * reading (an explicit Content-Length: 0) left one armed that closed the
     * connection unanswered after 30 s (http.c). */
    lws_set_timeout(p->wsi, NO_PENDING_TIMEOUT, 0);
    if (http_phase_lingering(p->phase))
        return -1; /* the answer went out already; the body is drained: close */
    if (p->upload && p->status) {
        resp_want_write(p); /* answered early: the answer can go out now */
        return 0;
    }
    if (p->upload) {
        upload_end(p);
        return 0;
    }
    if (http_phase_collecting(p->phase) && !p->status)
        dispatch_body(p);
    return 0;
}
