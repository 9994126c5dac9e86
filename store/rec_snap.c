/*
 * rec_snap.c - a snapshot's record as the index keeps it, with the two parts
 * other records share: a file's identity (a template's base image) and an
 * egress policy. Member order and presence are what warrend has always
 * written, so old records are rewritten byte for byte.
 */
#include "rec_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

json_t *rec_ident_json(const struct sbx_ident *id)
{
    return json_pack("{s:s,s:I,s:I,s:I}", "path", id->path, "size", (json_int_t)id->size,
                     "mtime_ns", (json_int_t)id->mtime_ns, "ino", (json_int_t)id->ino);
}

int rec_ident_of_json(json_t *o, struct sbx_ident *id)
{
    const char *path;
    json_int_t size, mtime, ino;

    if (!o ||
        json_unpack(o, "{s:s,s:I,s:I,s:I}", "path", &path, "size", &size, "mtime_ns", &mtime, "ino",
                    &ino) != 0 ||
        strlen(path) >= sizeof(id->path))
        return -EINVAL;
    memcpy(id->path, path, strlen(path) + 1);
    id->size = size;
    id->mtime_ns = mtime;
    id->ino = ino;
    return 0;
}

static void list_json(json_t *a, const char *list)
{
    for (const char *c = list ? list : ""; *c;) {
        size_t len = strcspn(c, ",");
        json_array_append_new(a, json_stringn(c, len));
        c += len;
        c += strspn(c, ", ");
    }
}

json_t *rec_net_json(const struct sbx_net_rec *p)
{
    json_t *n = json_pack("{s:b,s:[],s:[],s:I,s:I}", "internet", p->internet, "allow_out",
                          "deny_out", "rate_mbit", (json_int_t)p->rate_mbit, "max_connections",
                          (json_int_t)p->max_connections);

    if (n) {
        list_json(json_object_get(n, "allow_out"), p->allow_out);
        list_json(json_object_get(n, "allow_out"), p->allow_names);
        list_json(json_object_get(n, "deny_out"), p->deny_out);
        list_json(json_object_get(n, "deny_out"), p->deny_names);
    }
    return n;
}

/* A stored list as a C array (entries NULL where not strings); NULL when out of memory. */
static const char **stored_list(json_t *a, size_t *n)
{
    const char **v = calloc(json_array_size(a) + 1, sizeof(*v));
    json_t *e;
    size_t i;

    *n = 0;
    if (!v)
        return NULL;
    json_array_foreach(a, i, e) v[(*n)++] = json_string_value(e);
    return v;
}

void rec_net_free(struct rec_net *n)
{
    free((void *)n->req.allow_out);
    free((void *)n->req.deny_out);
    memset(n, 0, sizeof(*n));
}

int rec_net_of_json(json_t *o, struct rec_net *n)
{
    struct sbx_net_req *r = &n->req;
    json_t *v;

    memset(n, 0, sizeof(*n));
    if (!o)
        return 0;
    if (!json_is_object(o)) {
        n->kind = REC_NET_BAD;
        return 0;
    }
    n->kind = REC_NET_OK;
    r->internet = -1;
    r->rate_mbit = r->max_connections = SBX_UNSET;
    if (json_is_boolean(json_object_get(o, "internet")))
        r->internet = json_is_true(json_object_get(o, "internet"));
    if ((v = json_object_get(o, "rate_mbit")))
        r->rate_mbit = json_is_integer(v) ? json_integer_value(v) : SBX_NOT_INT;
    if ((v = json_object_get(o, "max_connections")))
        r->max_connections = json_is_integer(v) ? json_integer_value(v) : SBX_NOT_INT;
    r->allow_out = stored_list(json_object_get(o, "allow_out"), &r->nallow_out);
    r->deny_out = stored_list(json_object_get(o, "deny_out"), &r->ndeny_out);
    if (!r->allow_out || !r->deny_out) {
        rec_net_free(n);
        return -ENOMEM;
    }
    return 0;
}

char *rec_snap_encode(const struct rec_snap *r)
{
    json_t *base = r->base_ok ? rec_ident_json(&r->base) : json_object();
    json_t *meta = rec_kv_json(&r->metadata), *o = NULL;
    char *s;

    if (base && meta)
        o = json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:s,s:O,s:O}", "id", r->id, "parent",
                      r->parent, "parent_snapshot", r->parent_snapshot, "template", r->tmpl,
                      "mem_mb", (json_int_t)r->mem_mb, "vcpus", (json_int_t)r->vcpus, "size",
                      (json_int_t)r->size, "created_ms", (json_int_t)r->created_ms, "dir", r->dir,
                      "base", base, "metadata", meta);
    json_decref(base);
    json_decref(meta);
    if (o)
        json_object_set_new(o, "type", json_string(r->type));
    if (o && r->disk_backing && r->disk_backing[0])
        json_object_set_new(o, "disk_backing", json_string(r->disk_backing));
    if (o && r->mem && r->mem[0])
        json_object_set_new(o, "mem", json_string(r->mem));
    if (o && r->has_network)
        json_object_set_new(o, "network", rec_net_json(&r->network));
    s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

void rec_snap_free(struct rec_snap *r)
{
    rec_kv_free(&r->metadata);
    rec_net_free(&r->net);
    json_decref(r->doc);
    r->doc = NULL;
}

int rec_snap_decode(const char *p, size_t n, struct rec_snap *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(p, n, 0, &jerr), *base, *meta;
    json_int_t mem, vcpus, size, created;
    int rc;

    memset(r, 0, sizeof(*r));
    if (!o || json_unpack(o, "{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:s,s:o,s:o}", "id", &r->id,
                          "parent", &r->parent, "parent_snapshot", &r->parent_snapshot, "template",
                          &r->tmpl, "mem_mb", &mem, "vcpus", &vcpus, "size", &size, "created_ms",
                          &created, "dir", &r->dir, "base", &base, "metadata", &meta) != 0) {
        json_decref(o);
        memset(r, 0, sizeof(*r));
        return -EINVAL;
    }
    r->doc = o;
    r->mem_mb = mem;
    r->vcpus = vcpus;
    r->size = size;
    r->created_ms = created;
    r->base_ok = rec_ident_of_json(base, &r->base) == 0;
    if ((json_is_object(meta) && (rc = rec_kv_of_json(&r->metadata, meta))) ||
        (rc = rec_net_of_json(json_object_get(o, "network"), &r->net))) {
        rec_snap_free(r);
        return rc;
    }
    r->type = json_string_value(json_object_get(o, "type"));
    r->disk_backing = json_string_value(json_object_get(o, "disk_backing"));
    r->mem = json_string_value(json_object_get(o, "mem"));
    return 0;
}
