/*
 * rec_sbx.c - a sandbox's record as the index keeps it: one compact JSON
 * object, its members in the order warrend has always written them (optional
 * ones only when set), so that a state dir written before reads and is
 * rewritten byte for byte.
 */
#include "rec_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

char *rec_sandbox_encode(const struct rec_sandbox *r)
{
    json_t *env = rec_kv_json(&r->env), *meta = rec_kv_json(&r->metadata);
    json_t *o = NULL;
    char *s;

    if (env && meta)
        o = json_pack("{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:O,s:O,s:s}", "id", r->id,
                      "template", r->tmpl, "state", r->state, "reason", r->reason, "created_ms",
                      (json_int_t)r->created_ms, "expires_ms", (json_int_t)r->expires_ms,
                      "ended_ms", (json_int_t)r->ended_ms, "last_active_ms",
                      (json_int_t)r->last_active_ms, "idle_s", (json_int_t)r->idle_s, "mem_mb",
                      (json_int_t)r->mem_mb, "vcpus", (json_int_t)r->vcpus, "env", env, "metadata",
                      meta, "vm_id", r->vm_id);
    json_decref(env);
    json_decref(meta);
    if (o && r->keep_running)
        json_object_set_new(o, "keep_running", json_true());
    if (o && r->npublic) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < r->npublic; i++)
            json_array_append_new(a, json_integer(r->public_ports[i]));
        json_object_set_new(o, "public_ports", a);
    }
    if (o && r->snapshot_id && r->snapshot_id[0])
        json_object_set_new(o, "snapshot_id", json_string(r->snapshot_id));
    if (o && r->persistent)
        json_object_set_new(o, "persistent", json_true());
    if (o && r->auto_pause) {
        json_object_set_new(o, "auto_pause", json_true());
        json_object_set_new(o, "ttl_s", json_integer(r->ttl_s));
    }
    if (o && r->paused_ms)
        json_object_set_new(o, "paused_ms", json_integer(r->paused_ms));
    s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

void rec_sandbox_free(struct rec_sandbox *r)
{
    rec_kv_free(&r->env);
    rec_kv_free(&r->metadata);
    json_decref(r->doc);
    r->doc = NULL;
}

int rec_sandbox_decode(const char *p, size_t n, struct rec_sandbox *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(p, n, 0, &jerr), *env, *meta, *a, *v;
    json_int_t created, expires, ended, active, idle, mem, vcpus, pid = 0;
    size_t i;
    int rc;

    memset(r, 0, sizeof(*r));
    r->vm_id = "";
    if (!o ||
        json_unpack(o, "{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:o,s:o,s?s,s?I,s?s,s?s}",
                    "id", &r->id, "template", &r->tmpl, "state", &r->state, "reason", &r->reason,
                    "created_ms", &created, "expires_ms", &expires, "ended_ms", &ended,
                    "last_active_ms", &active, "idle_s", &idle, "mem_mb", &mem, "vcpus", &vcpus,
                    "env", &env, "metadata", &meta, "vm_id", &r->vm_id, "pid", &pid, "run_dir",
                    &r->run_dir, "disk", &r->disk) != 0) {
        json_decref(o);
        memset(r, 0, sizeof(*r));
        return -EINVAL;
    }
    r->doc = o;
    r->created_ms = created;
    r->expires_ms = expires;
    r->ended_ms = ended;
    r->last_active_ms = active;
    r->idle_s = idle;
    r->mem_mb = mem;
    r->vcpus = vcpus;
    r->pid = pid;
    /* Not an object: read as none, as warrend always did. */
    if ((json_is_object(env) && (rc = rec_kv_of_json(&r->env, env))) ||
        (json_is_object(meta) && (rc = rec_kv_of_json(&r->metadata, meta)))) {
        rec_sandbox_free(r);
        return rc;
    }
    r->keep_running = json_is_true(json_object_get(o, "keep_running")); /* absent: false */
    a = json_object_get(o, "public_ports");
    json_array_foreach(a, i, v)
    {
        json_int_t port = json_integer_value(v);
        if (r->npublic < SBX_PUBLIC_PORTS_MAX && port >= 1 && port <= 65535)
            r->public_ports[r->npublic++] = (uint16_t)port;
    }
    r->snapshot_id = json_string_value(json_object_get(o, "snapshot_id"));
    r->persistent = json_is_true(json_object_get(o, "persistent"));
    r->auto_pause = json_is_true(json_object_get(o, "auto_pause"));
    r->ttl_s = json_integer_value(json_object_get(o, "ttl_s"));
    r->paused_ms = json_integer_value(json_object_get(o, "paused_ms")); /* absent: 0 */
    return 0;
}
