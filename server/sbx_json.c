/*
 * sbx_json.c - the REST door's codec for the core's requests (sbx_json.h).
 *
 * A value of the wrong JSON type is not refused here when the core has a
 * rule for that field: it is passed on in a form the core's own check
 * refuses (sbx.h: SBX_NOT_INT, an empty string, SIZE_MAX entries), so that
 * each message is written once, in the core, whatever the door.
 */
#include "sbx_json.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int sbx_json_fields(json_t *body, const char *const *allowed, struct sbx_err *err)
{
    const char *k;
    json_t *v;

    if (!json_is_object(body)) {
        return sbx_err_set(err, SBX_E_BAD_REQUEST, "the body must be a JSON object");
    }
    json_object_foreach(body, k, v)
    {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, k) == 0;
        if (!ok) {
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "unknown field '%s'", k);
        }
    }
    return 0;
}

static bool given(json_t *v)
{
    return v && !json_is_null(v);
}

/* An integer field: SBX_UNSET when absent or null, SBX_NOT_INT when not an integer. */
static int64_t get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);

    if (!given(v))
        return SBX_UNSET;
    if (!json_is_integer(v) || json_integer_value(v) <= SBX_NOT_INT)
        return SBX_NOT_INT;
    return json_integer_value(v);
}

int sbx_json_kv(json_t *body, const char *key, struct sbx_kv **kv, size_t *n, struct sbx_err *err)
{
    json_t *o = json_object_get(body, key), *v;
    const char *k;

    *kv = NULL;
    *n = 0;
    if (!given(o))
        return 0;
    if (!json_is_object(o))
        goto bad;
    json_object_foreach(o, k, v)
    {
        if (!json_is_string(v))
            goto bad;
    }
    if (json_object_size(o) && !(*kv = calloc(json_object_size(o), sizeof(**kv))))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    json_object_foreach(o, k, v)
    {
        (*kv)[*n].key = k;
        (*kv)[*n].val.p = json_string_value(v);
        (*kv)[*n].val.n = json_string_length(v);
        (*n)++;
    }
    return 0;
bad:
    return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "%s must be an object of strings", key);
}

/* One of network's lists into out (entries that are not strings: NULL); not an array:
 * SIZE_MAX entries, refused by the core. */
static void net_list(json_t *a, const char **out, const char *const **list, size_t *n)
{
    json_t *v;
    size_t i;

    *list = out;
    *n = 0;
    if (!given(a))
        return;
    if (!json_is_array(a)) {
        *n = SIZE_MAX;
        return;
    }
    json_array_foreach(a, i, v) out[(*n)++] = json_string_value(v);
}

int sbx_json_net(json_t *n, struct sbx_json_net *out, struct sbx_err *err)
{
    static const char *const fields[] = {"internet",  "allow_out",       "deny_out",
                                         "rate_mbit", "max_connections", NULL};
    json_t *v, *allow, *deny;
    size_t na, nd;
    int status;

    memset(out, 0, sizeof(*out));
    out->req.internet = -1;
    out->req.rate_mbit = out->req.max_connections = SBX_UNSET;
    if (!given(n))
        return 0;
    if (!json_is_object(n))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "network must be an object");
    if ((status = sbx_json_fields(n, fields, err)))
        return status;
    v = json_object_get(n, "internet");
    if (v && !json_is_boolean(v) && !json_is_null(v))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "network.internet must be true or false");
    if (json_is_boolean(v))
        out->req.internet = json_is_true(v);
    allow = json_object_get(n, "allow_out");
    deny = json_object_get(n, "deny_out");
    na = json_is_array(allow) ? json_array_size(allow) : 0;
    nd = json_is_array(deny) ? json_array_size(deny) : 0;
    if (!(out->lists = calloc(na + nd + 1, sizeof(*out->lists))))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    net_list(allow, out->lists, &out->req.allow_out, &out->req.nallow_out);
    net_list(deny, out->lists + na, &out->req.deny_out, &out->req.ndeny_out);
    out->req.rate_mbit = get_int(n, "rate_mbit");
    out->req.max_connections = get_int(n, "max_connections");
    return 0;
}

void sbx_json_net_free(struct sbx_json_net *n)
{
    free(n->lists);
    n->lists = NULL;
}

int sbx_json_create(json_t *body, struct sbx_json_create *out, struct sbx_err *err)
{
    static const char *const fields[] = {
        "template",   "ttl_seconds",  "idle_timeout_seconds", "memory_mb", "vcpus",
        "env",        "metadata",     "keep_running",         "network",   "snapshot_id",
        "persistent", "public_ports", "auto_pause",           NULL};
    struct sbx_create_req *r = &out->req;
    json_t *v;
    int status;

    memset(out, 0, sizeof(*out));
    if ((status = sbx_json_fields(body, fields, err)))
        return status;
    if ((v = json_object_get(body, "snapshot_id")) && !(r->snapshot_id = json_string_value(v)))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "snapshot_id must be a snapshot's id");
    /* Not a string: NULL, which the core refuses as no template name. */
    r->tmpl_given = json_object_get(body, "template") != NULL;
    r->tmpl = json_string_value(json_object_get(body, "template"));
    r->ttl_s = get_int(body, "ttl_seconds");
    r->idle_s = get_int(body, "idle_timeout_seconds");
    r->memory_mb = get_int(body, "memory_mb");
    r->vcpus = get_int(body, "vcpus");
    if (json_object_get(body, "network")) {
        if ((status = sbx_json_net(json_object_get(body, "network"), &out->net, err)))
            return status;
        r->network = &out->net.req;
    }
    if ((v = json_object_get(body, "persistent")) && !json_is_boolean(v))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "persistent must be true or false");
    r->persistent = json_is_true(v);
    if ((v = json_object_get(body, "auto_pause")) && !json_is_boolean(v))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "auto_pause must be true or false");
    r->auto_pause = json_is_true(v);
    v = json_object_get(body, "keep_running");
    if (v && !json_is_boolean(v) && !json_is_null(v))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "keep_running must be true or false");
    r->keep_running = json_is_true(v);
    if (given(v = json_object_get(body, "public_ports"))) {
        json_t *e;
        size_t i;
        if (!json_is_array(v) || json_array_size(v) > SBX_PUBLIC_PORTS_MAX)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "public_ports must be an array of at most %d ports",
                               SBX_PUBLIC_PORTS_MAX);
        if (json_array_size(v) && !(out->ports = calloc(json_array_size(v), sizeof(*out->ports))))
            return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
        json_array_foreach(v, i, e) out->ports[i] =
            json_is_integer(e) && json_integer_value(e) > SBX_NOT_INT ? json_integer_value(e)
                                                                      : SBX_NOT_INT;
        r->public_ports = out->ports;
        r->npublic = json_array_size(v);
    }
    if ((status = sbx_json_kv(body, "env", &out->env, &r->nenv, err)) ||
        (status = sbx_json_kv(body, "metadata", &out->meta, &r->nmetadata, err)))
        return status;
    r->env = out->env;
    r->metadata = out->meta;
    return 0;
}

void sbx_json_create_free(struct sbx_json_create *c)
{
    sbx_json_net_free(&c->net);
    free(c->env);
    free(c->meta);
    free(c->ports);
    c->env = c->meta = NULL;
    c->ports = NULL;
}

int sbx_json_exec(json_t *body, struct sbx_json_exec *out, struct sbx_err *err)
{
    static const char *const fields[] = {
        "cmd",        "argv", "cwd", "env", "user", "stdin", "timeout_seconds",
        "background", "tag",  "pty", NULL};
    static const struct sbx_str not_array; /* argv that is not an array: no entries */
    struct sbx_exec_req *r = &out->req;
    json_t *v;
    int status;

    memset(out, 0, sizeof(*out));
    r->background = -1;
    if ((status = sbx_json_fields(body, fields, err)))
        return status;
    v = json_object_get(body, "background");
    if (v && !json_is_boolean(v) && !json_is_null(v))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "background must be true or false");
    if (json_is_boolean(v))
        r->background = json_is_true(v);
    if (given(v = json_object_get(body, "tag"))) {
        if (!json_is_string(v))
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "tag must be a string of at most %d bytes", SBX_TAG_MAX);
        r->tag.p = json_string_value(v);
        r->tag.n = json_string_length(v);
    }
    if (given(v = json_object_get(body, "pty"))) {
        static const char *const pfields[] = {"cols", "rows", NULL};
        if (!json_is_object(v))
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "pty must be an object {\"cols\": C, \"rows\": R}");
        if ((status = sbx_json_fields(v, pfields, err)))
            return status;
        r->pty = true;
        r->cols = get_int(v, "cols");
        r->rows = get_int(v, "rows");
        /* Absent: refused by the core's range as well. */
        if (r->cols == SBX_UNSET)
            r->cols = SBX_NOT_INT;
        if (r->rows == SBX_UNSET)
            r->rows = SBX_NOT_INT;
    }
    if ((v = json_object_get(body, "cmd"))) {
        /* Not a string: empty, which the core refuses. */
        r->cmd.p = json_is_string(v) ? json_string_value(v) : "";
        r->cmd.n = json_is_string(v) ? json_string_length(v) : 0;
    }
    if ((v = json_object_get(body, "argv"))) {
        json_t *a;
        size_t i;
        r->argv = &not_array;
        if (json_is_array(v) && json_array_size(v)) {
            if (!(out->argv = calloc(json_array_size(v), sizeof(*out->argv))))
                return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
            json_array_foreach(v, i, a)
            {
                out->argv[i].p = json_string_value(a);
                out->argv[i].n = json_is_string(a) ? json_string_length(a) : 0;
            }
            r->argv = out->argv;
            r->argc = json_array_size(v);
        }
    }
    if (given(v = json_object_get(body, "cwd")))
        r->cwd = json_is_string(v) ? json_string_value(v) : "";
    if (given(v = json_object_get(body, "user")))
        r->user = json_is_string(v) ? json_string_value(v) : "";
    if (given(v = json_object_get(body, "stdin"))) {
        r->stdin_data.p = json_is_string(v) ? json_string_value(v) : "";
        r->stdin_data.n = json_is_string(v) ? json_string_length(v) : SIZE_MAX;
    }
    if (given(v = json_object_get(body, "timeout_seconds"))) {
        r->has_timeout = true;
        r->timeout_s = json_is_number(v) ? json_number_value(v) : -1;
    }
    if ((status = sbx_json_kv(body, "env", &out->env, &r->nenv, err)))
        return status;
    r->env = out->env;
    return 0;
}

void sbx_json_exec_free(struct sbx_json_exec *x)
{
    free(x->argv);
    free(x->env);
    x->argv = NULL;
    x->env = NULL;
}

int sbx_json_file(enum sbx_file_kind kind, json_t *args, struct sbx_file_req *out,
                  struct sbx_err *err)
{
    (void)err;
    memset(out, 0, sizeof(*out));
    out->kind = kind;
    out->path = json_string_value(json_object_get(args, "path"));
    out->to = json_string_value(json_object_get(args, "to"));
    out->depth = get_int(args, "depth");
    out->recursive = json_is_true(json_object_get(args, "recursive"));
    return 0;
}

int sbx_json_timeout(json_t *body, int64_t *ttl_s, struct sbx_err *err)
{
    static const char *const fields[] = {"ttl_seconds", NULL};
    int status;

    *ttl_s = SBX_UNSET;
    if ((status = sbx_json_fields(body, fields, err)))
        return status;
    *ttl_s = get_int(body, "ttl_seconds");
    return 0;
}

int sbx_json_snap(json_t *body, struct sbx_json_snap *out, struct sbx_err *err)
{
    static const char *const fields[] = {"metadata", NULL};
    int status;

    memset(out, 0, sizeof(*out));
    if ((status = sbx_json_fields(body, fields, err)) ||
        (status = sbx_json_kv(body, "metadata", &out->meta, &out->req.nmetadata, err)))
        return status;
    out->req.metadata = out->meta;
    return 0;
}

void sbx_json_snap_free(struct sbx_json_snap *s)
{
    free(s->meta);
    s->meta = NULL;
}

/* A fork's number: SBX_NOT_INT when it is not an integer (null included). */
static int64_t fork_int(json_t *v)
{
    return json_is_integer(v) && json_integer_value(v) > SBX_NOT_INT ? json_integer_value(v)
                                                                     : SBX_NOT_INT;
}

int sbx_json_fork(json_t *body, struct sbx_json_fork *out, struct sbx_err *err)
{
    static const char *const fields[] = {"count", "ttl_seconds", "idle_timeout_seconds", "metadata",
                                         NULL};
    struct sbx_fork_req *r = &out->req;
    json_t *v;
    int status;

    memset(out, 0, sizeof(*out));
    r->count = r->ttl_s = r->idle_s = SBX_UNSET;
    if ((status = sbx_json_fields(body, fields, err)))
        return status;
    if ((v = json_object_get(body, "count")))
        r->count = fork_int(v);
    /* A null TTL is the configured default's; an absent one, the parent's time left. */
    if ((v = json_object_get(body, "ttl_seconds"))) {
        r->ttl_given = true;
        r->ttl_s = json_is_null(v) ? SBX_UNSET : fork_int(v);
    }
    if ((v = json_object_get(body, "idle_timeout_seconds"))) {
        r->idle_given = true;
        r->idle_s = fork_int(v);
    }
    /* Given, even null (no metadata), it replaces the parent's. */
    r->metadata_given = json_object_get(body, "metadata") != NULL;
    if ((status = sbx_json_kv(body, "metadata", &out->meta, &r->nmetadata, err)))
        return status;
    r->metadata = out->meta;
    return 0;
}

void sbx_json_fork_free(struct sbx_json_fork *f)
{
    free(f->meta);
    f->meta = NULL;
}

int sbx_json_pause(json_t *body, struct sbx_err *err)
{
    static const char *const fields[] = {NULL};

    return sbx_json_fields(body, fields, err);
}

/* ---- records into JSON: the shapes docs/API.md gives ---- */

/* A time in ms as ISO-8601 with milliseconds; null while unset (0). */
static json_t *iso_ms(int64_t ms)
{
    char buf[UTIL_ISO_MAX];

    if (ms <= 0 || !util_iso_time_ms(ms, buf, sizeof(buf)))
        return json_null();
    return json_string(buf);
}

/* A ", "-separated list's entries appended to the array a. */
static void list_into(json_t *a, const char *list)
{
    for (const char *c = list ? list : ""; *c;) {
        size_t len = strcspn(c, ",");
        json_array_append_new(a, json_stringn(c, len));
        c += len;
        c += strspn(c, ", ");
    }
}

static json_t *net_json(const struct sbx_net_rec *p)
{
    json_t *n = json_pack("{s:b,s:[],s:[],s:I,s:I}", "internet", p->internet, "allow_out",
                          "deny_out", "rate_mbit", (json_int_t)p->rate_mbit, "max_connections",
                          (json_int_t)p->max_connections);

    if (n) {
        list_into(json_object_get(n, "allow_out"), p->allow_out);
        list_into(json_object_get(n, "allow_out"), p->allow_names);
        list_into(json_object_get(n, "deny_out"), p->deny_out);
        list_into(json_object_get(n, "deny_out"), p->deny_names);
    }
    return n;
}

static json_t *kv_json(const struct sbx_kv *kv, size_t n)
{
    json_t *o = json_object();

    for (size_t i = 0; o && i < n; i++)
        json_object_set_new(o, kv[i].key, json_stringn(kv[i].val.p, kv[i].val.n));
    return o;
}

json_t *sbx_json_rec(const struct sbx_rec *r)
{
    json_t *o =
        json_pack("{s:s,s:s,s:s,s:o,s:o,s:I,s:I,s:o}", "id", r->id, "template", r->tmpl, "state",
                  r->state, "created_at", iso_ms(r->created_ms), "expires_at",
                  iso_ms(r->expires_ms), "idle_timeout_seconds", (json_int_t)r->idle_s, "memory_mb",
                  (json_int_t)r->mem_mb, "metadata", kv_json(r->metadata, r->nmetadata));
    json_t *ports = json_array();

    if (!o) {
        json_decref(ports);
        return NULL;
    }
    json_object_set_new(o, "vcpus", json_integer(r->vcpus));
    if (r->vm_id)
        json_object_set_new(o, "vm_id", json_string(r->vm_id));
    json_object_set_new(o, "frozen", json_boolean(r->frozen));
    json_object_set_new(o, "paged_out", json_boolean(r->paged_out));
    json_object_set_new(o, "keep_running", json_boolean(r->keep_running));
    if (r->has_network) {
        json_t *n = net_json(&r->network);
        if (n)
            json_object_set_new(o, "network", n);
    }
    json_object_set_new(o, "persistent", json_boolean(r->persistent));
    json_object_set_new(o, "auto_pause", json_boolean(r->auto_pause));
    for (size_t i = 0; ports && i < r->npublic; i++)
        json_array_append_new(ports, json_integer(r->public_ports[i]));
    json_object_set_new(o, "public_ports", ports);
    if (r->paused)
        json_object_set_new(o, "paused_at", iso_ms(r->paused_ms));
    json_object_set_new(o, "source", json_string(r->source));
    if (r->snapshot_id)
        json_object_set_new(o, "snapshot_id", json_string(r->snapshot_id));
    if (r->ended) {
        json_object_set_new(o, "ended_at", iso_ms(r->ended_ms));
        json_object_set_new(o, "end_reason", json_string(r->end_reason));
    }
    return o;
}

json_t *sbx_json_text(const char *p, size_t n)
{
    json_t *s = json_stringn(p, n); /* NULL when not valid UTF-8 */
    char *c;

    if (s)
        return s;
    if (!(c = malloc(n ? n : 1)))
        return NULL;
    for (size_t i = 0; i < n; i++)
        c[i] = (unsigned char)p[i] < 0x80 ? p[i] : '?';
    s = json_stringn(c, n);
    free(c);
    return s;
}

json_t *sbx_json_proc(const struct sbx_proc_rec *e)
{
    json_t *o = json_object();
    char buf[UTIL_ISO_MAX];

    if (!o)
        return NULL;
    json_object_set_new(o, "pid", json_integer((json_int_t)e->pid));
    json_object_set_new(o, "tag", e->tag.p ? sbx_json_text(e->tag.p, e->tag.n) : json_null());
    json_object_set_new(o, "cmd", e->cmd.p ? sbx_json_text(e->cmd.p, e->cmd.n) : json_string(""));
    json_object_set_new(o, "pty", json_boolean(e->pty));
    if (e->pty) {
        json_object_set_new(o, "cols", json_integer((json_int_t)e->cols));
        json_object_set_new(o, "rows", json_integer((json_int_t)e->rows));
    }
    json_object_set_new(o, "running", json_boolean(e->running));
    json_object_set_new(o, "stdin_open", json_boolean(e->stdin_open));
    json_object_set_new(o, "output_start", json_integer((json_int_t)e->output_start));
    json_object_set_new(o, "output_end", json_integer((json_int_t)e->output_end));
    /* Years clamped to 4 digits: a guest's largest number still prints a time. */
    json_object_set_new(
        o, "started_at",
        e->started_ms &&
                util_iso_time_ms(e->started_ms > INT64_MAX ? INT64_MAX : (int64_t)e->started_ms,
                                 buf, sizeof(buf))
            ? json_string(buf)
            : json_null());
    if (!e->running) {
        json_object_set_new(o, "exit_code", json_integer((json_int_t)e->exit_code));
        json_object_set_new(o, "signal",
                            e->signal ? json_integer((json_int_t)e->signal) : json_null());
    }
    return o;
}

json_t *sbx_json_procs(const struct sbx_proc_rec *v, size_t n)
{
    json_t *a = json_array(), *o;

    for (size_t i = 0; a && i < n; i++) {
        if (!(o = sbx_json_proc(&v[i])) || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a ? json_pack("{s:o}", "processes", a) : NULL;
}

json_t *sbx_json_stat(const struct sbx_stat_rec *r)
{
    json_t *o = json_object();
    char buf[32];

    /* A guest string that is not UTF-8 is left out (json_stringn refuses it). */
    if (r->name.p)
        json_object_set_new(o, "name", json_stringn(r->name.p, r->name.n));
    if (r->path.p)
        json_object_set_new(o, "path", json_stringn(r->path.p, r->path.n));
    if (r->type.p)
        json_object_set_new(o, "type", json_stringn(r->type.p, r->type.n));
    if (r->has_size)
        json_object_set_new(o, "size", json_integer((json_int_t)r->size));
    if (r->has_mode) {
        snprintf(buf, sizeof(buf), "%04o", (unsigned)(r->mode & 07777));
        json_object_set_new(o, "mode", json_string(buf));
    }
    if (r->has_mtime) {
        /* The guest's mtime: util_iso_time clamps INT64_MAX and always terminates. */
        util_iso_time(r->mtime, -1, buf, sizeof(buf));
        json_object_set_new(o, "mtime", json_string(buf));
    }
    return o;
}

/* Text when the bytes are UTF-8; else base64 under key_b64. */
static void set_bytes(json_t *o, const char *key, const char *key_b64, struct sbx_str b)
{
    json_t *s = json_stringn(b.n ? b.p : "", b.n); /* NULL when not valid UTF-8 */
    char *enc;

    if (s) {
        json_object_set_new(o, key, s);
        return;
    }
    if ((enc = malloc(util_b64_len(UTIL_B64_STD, b.n) + 1))) {
        size_t len = util_b64_encode(UTIL_B64_STD, (const unsigned char *)b.p, b.n, enc);
        json_object_set_new(o, key_b64, json_stringn(enc, len));
    }
    free(enc);
}

json_t *sbx_json_exit(const struct sbx_exec_rec *x)
{
    json_t *o = json_object();

    if (!o)
        return NULL;
    if (x->streamed)
        json_object_set_new(o, "type", json_string("exit"));
    json_object_set_new(o, "exit_code", json_integer((json_int_t)x->exit_code));
    json_object_set_new(o, "signal", x->signal ? json_integer((json_int_t)x->signal) : json_null());
    json_object_set_new(o, "timed_out", json_boolean(x->timed_out));
    if (x->has_duration)
        json_object_set_new(o, "duration_ms", json_integer((json_int_t)x->duration_ms));
    if (x->buffered) {
        set_bytes(o, "stdout", "stdout_b64", x->out[0]);
        set_bytes(o, "stderr", "stderr_b64", x->out[1]);
        if (x->truncated)
            json_object_set_new(o, "truncated", json_true());
    }
    return o;
}

json_t *sbx_json_snap_rec(const struct sbx_snap_rec *r)
{
    json_t *o =
        json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:o,s:o}", "id", r->id, "parent", r->parent,
                  "template", r->tmpl, "type", r->type, "memory_mb", (json_int_t)r->mem_mb, "vcpus",
                  (json_int_t)r->vcpus, "size_bytes", (json_int_t)r->size, "created_at",
                  iso_ms(r->created_ms), "metadata", kv_json(r->metadata, r->nmetadata));
    json_t *n;

    if (!o)
        return NULL;
    json_object_set_new(o, "snapshot_id", json_string(r->id));
    json_object_set_new(o, "parent_snapshot",
                        r->parent_snap ? json_string(r->parent_snap) : json_null());
    if (r->has_network && (n = net_json(&r->network)))
        json_object_set_new(o, "network", n);
    return o;
}

json_t *sbx_json_snaps(const struct sbx_snap_rec *v, size_t n)
{
    json_t *a = json_array(), *o;

    for (size_t i = 0; a && i < n; i++) {
        if (!(o = sbx_json_snap_rec(&v[i])) || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a ? json_pack("{s:o}", "snapshots", a) : NULL;
}

static json_t *pool_json(const struct sbx_pool_rec *p)
{
    return json_pack("{s:s,s:I,s:I,s:s,s:I,s:I,s:b,s:I,s:I,s:b,s:I,s:I,s:I}", "template", p->tmpl,
                     "memory_mb", (json_int_t)p->mem_mb, "vcpus", (json_int_t)p->vcpus, "state",
                     p->state, "size", (json_int_t)p->size, "ready", (json_int_t)p->ready,
                     "filling", p->filling, "handed_out", (json_int_t)p->handed_out, "rebuilds",
                     (json_int_t)p->rebuilds, "spare", p->spare, "spares", (json_int_t)p->spares,
                     "spares_ready", (json_int_t)p->spares_ready, "spares_prefaulted",
                     (json_int_t)p->spares_prefaulted);
}

/* The pools' figures as an array; NULL when out of memory. */
static json_t *pools_json(const struct sbx_pool_rec *v, size_t n)
{
    json_t *a = json_array(), *o;

    for (size_t i = 0; a && i < n; i++) {
        if (!(o = pool_json(&v[i])) || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

json_t *sbx_json_pool_stats(const struct sbx_pool_stats *s)
{
    json_t *o, *a;

    if (!s->on)
        return json_null();
    o = s->has_default ? pool_json(&s->dflt)
                       : json_pack("{s:s,s:s}", "template", s->default_tmpl, "state", "off");
    if (!o || !(a = pools_json(s->pools, s->npools)) || json_object_set_new(o, "templates", a)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *sbx_json_templates(const struct sbx_tmpl_list *l)
{
    json_t *a = json_array(), *o, *pools;

    for (size_t i = 0; a && i < l->n; i++) {
        const struct sbx_tmpl_rec *r = &l->v[i];
        if (!(pools = pools_json(r->pools, r->npools)) ||
            !(o = json_pack("{s:s,s:b,s:I,s:o}", "name", r->name, "default", r->is_default,
                            "size_bytes", (json_int_t)r->size_bytes, "pools", pools)) ||
            json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a ? json_pack("{s:o}", "templates", a) : NULL;
}

/* A fork's answer: {"sandboxes": [...], "snapshot_id"}. */
static json_t *fork_json(const struct sbx_result *res)
{
    json_t *a = json_array(), *o;

    for (size_t i = 0; a && i < res->u.fork.n; i++) {
        if (!(o = sbx_json_rec(&res->u.fork.v[i])) || json_array_append_new(a, o)) {
            json_decref(a);
            return NULL;
        }
    }
    return a ? json_pack("{s:o,s:s}", "sandboxes", a, "snapshot_id", res->u.fork.snapshot_id)
             : NULL;
}

json_t *sbx_json_result(const struct sbx_result *res)
{
    json_t *o, *a;

    if (!res)
        return NULL;
    switch (res->kind) {
    case SBX_RES_SANDBOX:
        return sbx_json_rec(res->u.sandbox);
    case SBX_RES_EXEC:
        return sbx_json_exit(res->u.exec);
    case SBX_RES_STARTED:
        return json_pack("{s:I,s:o}", "pid", (json_int_t)res->u.started.pid, "tag",
                         res->u.started.tag ? json_string(res->u.started.tag) : json_null());
    case SBX_RES_PROCS:
        return sbx_json_procs(res->u.procs.v, res->u.procs.n);
    case SBX_RES_PROC:
        return sbx_json_proc(res->u.procs.v);
    case SBX_RES_CAUGHT_UP:
        return json_pack("{s:s,s:I}", "type", "end", "offset", (json_int_t)res->u.offset);
    case SBX_RES_STAT:
        return sbx_json_stat(res->u.stat);
    case SBX_RES_LISTING:
        if (!(a = json_array()))
            return NULL;
        for (size_t i = 0; i < res->u.listing.n; i++)
            json_array_append_new(a, sbx_json_stat(&res->u.listing.entries[i]));
        o = json_pack("{s:s,s:o}", "path", res->u.listing.path, "entries", a);
        if (o && res->u.listing.truncated)
            json_object_set_new(o, "truncated", json_true());
        return o;
    case SBX_RES_PATH:
        return json_pack("{s:s}", "path", res->u.file.path);
    case SBX_RES_WRITTEN:
        return json_pack("{s:s,s:I}", "path", res->u.file.path, "size",
                         (json_int_t)res->u.file.size);
    case SBX_RES_DONE:
        return json_object();
    case SBX_RES_SNAPSHOT:
        return sbx_json_snap_rec(res->u.snap);
    case SBX_RES_FORK:
        return fork_json(res);
    }
    return NULL;
}
