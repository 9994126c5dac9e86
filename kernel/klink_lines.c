/*
 * klink_lines.c - the pure half of klink.h: the kernel bridge's NDJSON split
 * into lines, each checked, and a run's lines gathered into one JSON answer.
 * The guest writes these bytes: every buffer is bounded (a line by max_line,
 * a gathered answer by its max) and every bad line is reported, never kept.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "klink.h"

void klink_lines_init(struct klink_lines *lb, size_t max, uint64_t off, bool resync)
{
    memset(lb, 0, sizeof(*lb));
    lb->max = max;
    lb->off = off;
    lb->line_off = off;
    lb->skip = resync;
}

void klink_lines_free(struct klink_lines *lb)
{
    free(lb->buf);
    lb->buf = NULL;
    lb->len = lb->cap = 0;
}

int klink_line_check(const char *p, size_t n, json_t **obj, const char **type)
{
    json_error_t je;
    json_t *o, *t;

    *obj = NULL;
    *type = NULL;
    o = json_loadb(p, n, JSON_REJECT_DUPLICATES, &je);
    if (!o)
        return -EINVAL;
    if (!json_is_object(o)) {
        json_decref(o);
        return -EINVAL;
    }
    t = json_object_get(o, "type");
    *obj = o;
    *type = json_is_string(t) && json_string_length(t) ? json_string_value(t) : NULL;
    return 0;
}

json_t *klink_error_object(const char *name, const char *value)
{
    return json_pack("{s:s, s:s, s:s, s:s}", "type", "error", "name", name, "value", value,
                     "traceback", "");
}

json_t *klink_line_object(const struct klink_line *l, size_t max)
{
    char msg[160];

    switch (l->kind) {
    case KLINK_LINE_OK:
        if (l->type)
            return json_incref(l->obj);
        return klink_error_object("BadKernelOutput",
                                  "the kernel bridge sent a line without a \"type\"");
    case KLINK_LINE_TOO_LONG:
        snprintf(msg, sizeof(msg),
                 "an output line of %zu bytes exceeded run_code_max_line_bytes (%zu) and was "
                 "dropped",
                 l->n, max);
        return klink_error_object("OutputTooLarge", msg);
    case KLINK_LINE_LOST:
        snprintf(msg, sizeof(msg),
                 "%zu bytes of this run's output are gone from the sandbox's ring (read too "
                 "late or too slowly)",
                 l->n);
        return klink_error_object("OutputLost", msg);
    case KLINK_LINE_BAD:
    default:
        return klink_error_object("BadKernelOutput",
                                  "the kernel bridge sent a line that is not one JSON object");
    }
}

/* The line in lb->buf (len bytes, its '\n' at stream offset nl) is complete. */
static int emit(struct klink_lines *lb, uint64_t nl, klink_line_fn *fn, void *ctx)
{
    struct klink_line l = {.off = lb->line_off, .end = nl + 1};
    int rc;

    if (lb->over) {
        l.kind = KLINK_LINE_TOO_LONG;
        l.n = (size_t)(nl - lb->line_off);
    } else {
        /* buf always has room for the NUL: cap > len whenever len <= max. */
        lb->buf[lb->len] = '\0';
        l.p = lb->buf;
        l.n = lb->len;
        l.kind =
            klink_line_check(lb->buf, lb->len, &l.obj, &l.type) ? KLINK_LINE_BAD : KLINK_LINE_OK;
    }
    rc = fn(ctx, &l);
    json_decref(l.obj);
    lb->len = 0;
    lb->over = false;
    lb->line_off = nl + 1;
    return rc;
}

/* Append n bytes to the line; past max the line is marked over and its bytes dropped. */
static int append(struct klink_lines *lb, const char *p, size_t n)
{
    if (lb->over)
        return 0;
    if (lb->len + n > lb->max) {
        lb->over = true;
        /* Give back what a long line took: the next one starts small again. */
        free(lb->buf);
        lb->buf = NULL;
        lb->len = lb->cap = 0;
        return 0;
    }
    if (lb->len + n + 1 > lb->cap) {
        size_t cap = lb->cap ? lb->cap : 256;
        char *b;

        while (cap < lb->len + n + 1)
            cap *= 2;
        if (cap > lb->max + 1)
            cap = lb->max + 1;
        if (!(b = realloc(lb->buf, cap)))
            return -ENOMEM;
        lb->buf = b;
        lb->cap = cap;
    }
    memcpy(lb->buf + lb->len, p, n);
    lb->len += n;
    return 0;
}

int klink_lines_feed(struct klink_lines *lb, const void *data, size_t n, klink_line_fn *fn,
                     void *ctx)
{
    const char *p = data, *end = p + n;

    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t take = nl ? (size_t)(nl - p) : (size_t)(end - p);
        uint64_t at = lb->off;
        int rc;

        lb->off += take + (nl ? 1 : 0);
        if (lb->skip) {
            if (nl) {
                lb->skip = false;
                lb->len = 0;
                lb->over = false;
                lb->line_off = lb->off;
            }
        } else {
            if ((rc = append(lb, p, take)))
                return rc;
            if (nl && (rc = emit(lb, at + take, fn, ctx)))
                return rc;
        }
        p += take + (nl ? 1 : 0);
    }
    return 0;
}

/* ----------------------------------------------------------- requests */

#define PATH_MAX_ 4096

/* Every key of body is in the NULL-ended list. */
static int fields_ok(json_t *body, const char *const *allowed, struct sbx_err *err)
{
    const char *k;
    json_t *v;

    json_object_foreach(body, k, v)
    {
        size_t i = 0;

        while (allowed[i] && strcmp(allowed[i], k))
            i++;
        if (!allowed[i])
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "unknown field \"%.64s\"", k);
    }
    return 0;
}

/* env: absent, null, or an object of strings with non-empty names. */
static bool env_ok(json_t *env)
{
    const char *k;
    json_t *v;

    if (!env || json_is_null(env))
        return true;
    if (!json_is_object(env))
        return false;
    json_object_foreach(env, k, v)
    {
        if (!json_is_string(v) || !*k || strchr(k, '='))
            return false;
    }
    return true;
}

static bool opt_string(json_t *body, const char *key)
{
    json_t *v = json_object_get(body, key);

    return !v || json_is_null(v) || json_is_string(v);
}

static bool given(json_t *body, const char *key)
{
    json_t *v = json_object_get(body, key);

    return v && !json_is_null(v);
}

/* Copy body's key, when given, into req. */
static int copy(json_t *req, json_t *body, const char *key)
{
    return given(body, key) ? json_object_set(req, key, json_object_get(body, key)) : 0;
}

int klink_run_req(json_t *body, size_t max_line, json_t **req, struct sbx_err *err)
{
    static const char *const fields[] = {"code", "context_id",      "language",
                                         "env",  "timeout_seconds", NULL};
    json_t *code = json_object_get(body, "code"), *tmo = json_object_get(body, "timeout_seconds");
    json_t *r;
    int rc;

    *req = NULL;
    if (!json_is_object(body))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "the body must be a JSON object");
    if ((rc = fields_ok(body, fields, err)))
        return rc;
    if (!json_is_string(code))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "code must be a string");
    if (!opt_string(body, "context_id") || !opt_string(body, "language"))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "context_id and language must be strings");
    if (given(body, "context_id") && given(body, "language"))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "give context_id or language, not both (a context has its language)");
    if (!env_ok(json_object_get(body, "env")))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "env must be an object of strings");
    if (given(body, "timeout_seconds") &&
        (!json_is_number(tmo) || json_number_value(tmo) <= 0 || json_number_value(tmo) > 86400))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "timeout_seconds must be a number in (0, 86400]");
    r = json_pack("{s:s, s:O, s:I}", "op", "run", "code", code, "max_line", (json_int_t)max_line);
    if (!r || copy(r, body, "context_id") || copy(r, body, "language") || copy(r, body, "env") ||
        (given(body, "timeout_seconds") &&
         json_object_set_new(r, "timeout_ms",
                             json_integer((json_int_t)(json_number_value(tmo) * 1000))))) {
        json_decref(r);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    *req = r;
    return 0;
}

int klink_context_req(const char *op, const char *ctx, json_t *body, json_t **req,
                      struct sbx_err *err)
{
    static const char *const create_fields[] = {"language", "cwd", "env", NULL};
    static const char *const none[] = {NULL};
    bool create = !strcmp(op, "context_create");
    json_t *lang = json_object_get(body, "language"), *cwd = json_object_get(body, "cwd");
    json_t *r;
    int rc;

    *req = NULL;
    if (body && (rc = fields_ok(body, create ? create_fields : none, err)))
        return rc;
    if (create && given(body, "language") &&
        (!json_is_string(lang) ||
         (strcmp(json_string_value(lang), "python") && strcmp(json_string_value(lang), "bash"))))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "language must be \"python\" or \"bash\"");
    if (create && given(body, "cwd") &&
        (!json_is_string(cwd) || json_string_value(cwd)[0] != '/' ||
         json_string_length(cwd) > PATH_MAX_ ||
         strlen(json_string_value(cwd)) != json_string_length(cwd)))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "cwd must be an absolute path");
    if (create && !env_ok(json_object_get(body, "env")))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "env must be an object of strings");
    r = json_pack("{s:s}", "op", op);
    if (!r ||
        (create && (json_object_set_new(
                        r, "language",
                        json_string(json_is_string(lang) ? json_string_value(lang) : "python")) ||
                    copy(r, body, "cwd") || copy(r, body, "env"))) ||
        (ctx && json_object_set_new(r, "id", json_string(ctx)))) {
        json_decref(r);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    *req = r;
    return 0;
}

/* ------------------------------------------------------------- gather */

void klink_gather_init(struct klink_gather *g, size_t max)
{
    memset(g, 0, sizeof(*g));
    g->max = max;
    g->count = -1;
}

void klink_gather_free(struct klink_gather *g)
{
    free(g->out);
    free(g->err);
    json_decref(g->results);
    json_decref(g->error);
    memset(g, 0, sizeof(*g));
}

/* Room for n more bytes of the answer; false (and truncated) when over max. */
static bool room(struct klink_gather *g, size_t n)
{
    if (n > g->max - g->used) {
        g->truncated = true;
        return false;
    }
    g->used += n;
    return true;
}

static int text_add(struct klink_gather *g, char **buf, size_t *len, size_t *cap, const char *s,
                    size_t n)
{
    if (!room(g, n))
        return 0;
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        char *b;

        while (c < *len + n + 1)
            c *= 2;
        if (!(b = realloc(*buf, c)))
            return -ENOMEM;
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

/* A copy of obj without its "type": NULL when out of memory. */
static json_t *untyped(json_t *obj)
{
    json_t *c = json_copy(obj);

    if (c)
        json_object_del(c, "type");
    return c;
}

int klink_gather_add(struct klink_gather *g, json_t *obj, const char *type)
{
    if (!strcmp(type, "stdout") || !strcmp(type, "stderr")) {
        json_t *t = json_object_get(obj, "text");
        bool out = type[3] == 'o';

        if (!json_is_string(t))
            return 0;
        return text_add(g, out ? &g->out : &g->err, out ? &g->out_len : &g->err_len,
                        out ? &g->out_cap : &g->err_cap, json_string_value(t),
                        json_string_length(t));
    }
    if (!strcmp(type, "result")) {
        json_t *c;
        char *s = json_dumps(obj, JSON_COMPACT);
        size_t n = s ? strlen(s) : 0;

        free(s);
        if (!s)
            return -ENOMEM;
        if (!room(g, n))
            return 0;
        if (!g->results && !(g->results = json_array()))
            return -ENOMEM;
        if (!(c = untyped(obj)) || json_array_append_new(g->results, c))
            return -ENOMEM;
        return 0;
    }
    if (!strcmp(type, "error")) {
        if (g->error) /* the first error is the run's */
            return 0;
        return (g->error = untyped(obj)) ? 0 : -ENOMEM;
    }
    if (!strcmp(type, "number_of_executions")) {
        json_t *c = json_object_get(obj, "execution_count");

        if (json_is_integer(c))
            g->count = json_integer_value(c);
        return 0;
    }
    if (!strcmp(type, "end_of_execution"))
        g->ended = true;
    return 0;
}

json_t *klink_gather_result(const struct klink_gather *g)
{
    json_t *r = json_object();

    if (!r)
        return NULL;
    if (json_object_set_new(r, "stdout", json_stringn(g->out ? g->out : "", g->out_len)) ||
        json_object_set_new(r, "stderr", json_stringn(g->err ? g->err : "", g->err_len)) ||
        json_object_set_new(r, "results", g->results ? json_incref(g->results) : json_array()) ||
        json_object_set_new(r, "error", g->error ? json_incref(g->error) : json_null()) ||
        json_object_set_new(r, "execution_count",
                            g->count >= 0 ? json_integer(g->count) : json_null()) ||
        json_object_set_new(r, "truncated", json_boolean(g->truncated)))
        goto fail;
    return r;
fail:
    json_decref(r);
    return NULL;
}
