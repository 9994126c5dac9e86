/*
 * rec_kv.c - owned string maps and their JSON form. A map is made through a
 * JSON object so that what the index will hold (UTF-8 text, a key's last
 * value winning in its first place) is decided here once, by the same rules
 * the bytes are later written with.
 */
#include "rec_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void rec_kv_free(struct rec_kv *m)
{
    for (size_t i = 0; i < m->n; i++) {
        free((char *)m->v[i].key);
        free((char *)m->v[i].val.p);
    }
    free(m->v);
    *m = (struct rec_kv){0};
}

int rec_kv_of_json(struct rec_kv *m, json_t *o)
{
    struct rec_kv out = {0};
    const char *k;
    json_t *v;

    if (!json_is_object(o))
        return -EINVAL;
    if (json_object_size(o) && !(out.v = calloc(json_object_size(o), sizeof(*out.v))))
        return -ENOMEM;
    json_object_foreach(o, k, v)
    {
        size_t len = json_string_length(v);
        char *val;
        if (!json_is_string(v))
            continue;
        out.v[out.n].key = strdup(k);
        out.v[out.n].val.p = val = malloc(len + 1);
        if (!out.v[out.n].key || !val) {
            free((char *)out.v[out.n].key);
            free(val);
            rec_kv_free(&out);
            return -ENOMEM;
        }
        memcpy(val, json_string_value(v), len);
        val[len] = '\0';
        out.v[out.n].val.n = len;
        out.n++;
    }
    out.stored_bytes = json_dumpb(o, NULL, 0, JSON_COMPACT);
    rec_kv_free(m);
    *m = out;
    return 0;
}

int rec_kv_set(struct rec_kv *m, const struct sbx_kv *in, size_t n)
{
    json_t *o = json_object();
    int r;

    if (!o)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        /* json_object_set_new takes v even when it fails: v is made only with a key */
        json_t *v = in[i].key && in[i].val.p ? json_stringn(in[i].val.p, in[i].val.n) : NULL;
        if (!v || json_object_set_new(o, in[i].key, v)) {
            json_decref(o);
            return -EINVAL;
        }
    }
    r = rec_kv_of_json(m, o);
    json_decref(o);
    return r;
}

json_t *rec_kv_json(const struct rec_kv *m)
{
    json_t *o = json_object();

    for (size_t i = 0; o && i < m->n; i++) {
        if (json_object_set_new(o, m->v[i].key, json_stringn(m->v[i].val.p, m->v[i].val.n))) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

const struct sbx_str *rec_kv_get(const struct rec_kv *m, const char *key)
{
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->v[i].key, key) == 0)
            return &m->v[i].val;
    return NULL;
}

int rec_text_member(const char *json, const char *key, char *out, size_t cap)
{
    json_t *o = json ? json_loads(json, 0, NULL) : NULL;
    json_t *v = json_object_get(o, key);
    size_t len = json_string_length(v);
    int r = -EINVAL;

    if (json_is_string(v) && len < cap && strlen(json_string_value(v)) == len) {
        memcpy(out, json_string_value(v), len + 1);
        r = 0;
    }
    json_decref(o);
    return r;
}
