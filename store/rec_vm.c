/*
 * rec_vm.c - a VM's record as the index keeps it: what a restart needs to
 * re-adopt its QEMU (pid, run dir, disk) and to rebuild its network (slot and
 * policy). Optional members only when set, as warrend has always written them.
 */
#include "rec_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static void set_text(json_t *o, const char *key, const char *v)
{
    if (v && v[0])
        json_object_set_new(o, key, json_string(v));
}

char *rec_vm_encode(const struct rec_vm *r)
{
    json_t *o =
        json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:s}", "id", r->id, "template", r->tmpl,
                  "boot", r->boot, "run_dir", r->run_dir, "disk", r->disk, "mem_mb",
                  (json_int_t)r->mem_mb, "vcpus", (json_int_t)r->vcpus, "created_ms",
                  (json_int_t)r->created_ms, "pid", (json_int_t)r->pid, "sandbox", r->sandbox);
    char *s;

    if (!o)
        return NULL;
    /* Optional keys: a record without them is a VM without a network. */
    if (r->has_net_slot)
        json_object_set_new(o, "net_slot", json_integer(r->net_slot));
    set_text(o, "backing", r->backing);
    set_text(o, "mem_path", r->mem_path);
    if (r->has_network) {
        json_object_set_new(o, "internet", json_boolean(r->network.internet));
        set_text(o, "allow_out", r->network.allow_out);
        set_text(o, "deny_out", r->network.deny_out);
        set_text(o, "allow_names", r->network.allow_names);
        set_text(o, "deny_names", r->network.deny_names);
        json_object_set_new(o, "rate_mbit", json_integer(r->network.rate_mbit));
        json_object_set_new(o, "max_connections", json_integer(r->network.max_connections));
    }
    s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

void rec_vm_free(struct rec_vm *r)
{
    json_decref(r->doc);
    r->doc = NULL;
}

int rec_vm_decode(const char *p, size_t n, struct rec_vm *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(p, n, 0, &jerr), *slot;
    json_int_t mem, vcpus, created, pid;

    memset(r, 0, sizeof(*r));
    if (!o || json_unpack(o, "{s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:s}", "id", &r->id, "template",
                          &r->tmpl, "boot", &r->boot, "run_dir", &r->run_dir, "disk", &r->disk,
                          "mem_mb", &mem, "vcpus", &vcpus, "created_ms", &created, "pid", &pid,
                          "sandbox", &r->sandbox) != 0) {
        json_decref(o);
        memset(r, 0, sizeof(*r));
        return -EINVAL;
    }
    r->doc = o;
    r->mem_mb = mem;
    r->vcpus = vcpus;
    r->created_ms = created;
    r->pid = pid;
    slot = json_object_get(o, "net_slot");
    r->has_net_slot = json_is_integer(slot);
    r->net_slot = json_integer_value(slot);
    r->backing = json_string_value(json_object_get(o, "backing"));
    r->mem_path = json_string_value(json_object_get(o, "mem_path"));
    r->has_network = json_object_get(o, "internet") != NULL;
    r->network.internet = json_is_true(json_object_get(o, "internet"));
    r->network.allow_out = json_string_value(json_object_get(o, "allow_out"));
    r->network.deny_out = json_string_value(json_object_get(o, "deny_out"));
    r->network.allow_names = json_string_value(json_object_get(o, "allow_names"));
    r->network.deny_names = json_string_value(json_object_get(o, "deny_names"));
    r->network.rate_mbit = (unsigned)json_integer_value(json_object_get(o, "rate_mbit"));
    r->network.max_connections =
        (unsigned)json_integer_value(json_object_get(o, "max_connections"));
    return 0;
}
