/*
 * watch_ev.c - a watch's guest lines into checked events (watch_ev.h).
 */
#include "watch_ev.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum kind { K_STR, K_BOOL, K_UINT };

struct field {
    const char *key;
    enum kind kind;
};

/* What each type may carry, as guest-init/watch.h prints it. */
static const struct field ev_fields[] = {
    {"name", K_STR}, {"path", K_STR}, {"dir", K_BOOL}, {"from", K_STR}, {NULL, K_STR}};
static const struct field unwatched_fields[] = {
    {"name", K_STR}, {"path", K_STR}, {"reason", K_STR}, {NULL, K_STR}};
static const struct field ready_fields[] = {
    {"path", K_STR}, {"recursive", K_BOOL}, {"watches", K_UINT}, {NULL, K_STR}};
static const struct field error_fields[] = {{"code", K_STR}, {"message", K_STR}, {NULL, K_STR}};
static const struct field lost_fields[] = {{"reason", K_STR}, {NULL, K_STR}};

static const struct {
    const char *type;
    const struct field *fields;
    const char *required; /* a key the type cannot be without, or NULL */
} types[] = {
    {"create", ev_fields, "name"},   {"write", ev_fields, "name"},
    {"remove", ev_fields, "name"},   {"rename", ev_fields, "name"},
    {"chmod", ev_fields, "name"},    {"unwatched", unwatched_fields, "name"},
    {"ready", ready_fields, "path"}, {"error", error_fields, "code"},
    {"lost", lost_fields, NULL},
};

int watch_ev_init(struct watch_ev *w, size_t max_line, uint64_t next)
{
    memset(w, 0, sizeof(*w));
    w->max = max_line;
    w->next = next;
    /* Grown as lines need, up to max: most lines are short. */
    return 0;
}

void watch_ev_free(struct watch_ev *w)
{
    free(w->buf);
    w->buf = NULL;
    w->len = 0;
}

void watch_ev_gap(struct watch_ev *w, uint64_t next)
{
    if (next <= w->next)
        return;
    w->next = next;
    w->len = 0;
    w->skip = true;
}

static bool field_ok(const struct field *f, json_t *v)
{
    switch (f->kind) {
    case K_STR:
        return json_is_string(v);
    case K_BOOL:
        return json_is_boolean(v);
    case K_UINT:
        return json_is_integer(v) && json_integer_value(v) >= 0;
    }
    return false;
}

json_t *watch_ev_line(const char *line, size_t n, uint64_t end)
{
    json_t *in, *out = NULL, *type, *v;
    const struct field *fields = NULL;
    const char *required = NULL, *key;
    size_t i;

    in = json_loadb(line, n, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(in))
        goto out;
    type = json_object_get(in, "type");
    if (!json_is_string(type))
        goto out;
    for (i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (!strcmp(types[i].type, json_string_value(type))) {
            fields = types[i].fields;
            required = types[i].required;
            break;
        }
    if (!fields || (required && !json_object_get(in, required)))
        goto out;
    if (!(out = json_pack("{s:s}", "type", types[i].type)))
        goto out;
    json_object_foreach(in, key, v)
    {
        const struct field *f;

        if (!strcmp(key, "type"))
            continue;
        for (f = fields; f->key && strcmp(f->key, key); f++)
            ;
        if (!f->key || !field_ok(f, v) || json_object_set(out, f->key, v)) {
            json_decref(out);
            out = NULL;
            goto out;
        }
    }
    if (json_object_set_new(out, "offset", json_integer((json_int_t)end))) {
        json_decref(out);
        out = NULL;
    }
out:
    json_decref(in);
    return out;
}

/* A whole line has arrived (buf[0..len)), its '\n' at offset nl. */
static int line_done(struct watch_ev *w, const char *line, size_t len, uint64_t nl,
                     watch_ev_emit *emit, void *user)
{
    json_t *ev;
    int rc;

    if (w->skip) {
        w->skip = false;
        return 0;
    }
    if (!(ev = watch_ev_line(line, len, nl + 1))) {
        w->dropped++;
        return 0;
    }
    rc = emit(user, ev);
    json_decref(ev);
    return rc;
}

int watch_ev_feed(struct watch_ev *w, uint64_t off, const void *p, size_t n, watch_ev_emit *emit,
                  void *user)
{
    const char *s = p, *e = s + n;

    if (off > w->next)
        watch_ev_gap(w, off);
    if (off + n <= w->next)
        return 0;
    s += w->next - off;
    while (s < e) {
        const char *nl = memchr(s, '\n', (size_t)(e - s));
        size_t take = nl ? (size_t)(nl - s) : (size_t)(e - s);
        int rc = 0;

        if (!w->skip) {
            if (w->len + take > w->max) {
                /* Longer than any line the builtin prints: refused whole. */
                w->dropped++;
                w->len = 0;
                w->skip = true;
            } else if (!nl || w->len) {
                if (w->len + take > 0) {
                    size_t cap = w->len + take;
                    char *b = realloc(w->buf, cap ? cap : 1);
                    if (!b)
                        return -ENOMEM;
                    w->buf = b;
                    memcpy(w->buf + w->len, s, take);
                    w->len += take;
                }
            }
        }
        w->next += take;
        s += take;
        if (!nl)
            break;
        /* The line is in buf when it came in pieces, else still in place. */
        if (w->len) {
            rc = line_done(w, w->buf, w->len, w->next, emit, user);
            w->len = 0;
        } else {
            rc = line_done(w, nl - take, take, w->next, emit, user);
        }
        w->next++;
        s++;
        if (rc)
            return rc;
    }
    return 0;
}
