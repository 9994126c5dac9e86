/*
 * rec_tpl.c - a warm pool's template record: what a restart needs to reuse the
 * template snapshot it made (its files, its VM's shape) and to tell whether it
 * still may (the images, kernel command line and warm-up it was made with).
 */
#include "rec_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

char *rec_tpl_encode(const struct rec_tpl *r)
{
    json_t *o =
        json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:o,s:o,s:o,s:I}", "template", r->tmpl, "vm_id",
                  r->vm_id, "dir", r->dir, "snapshot", r->snapshot, "disk", r->disk, "mem_path",
                  r->mem_path, "mem_mb", (json_int_t)r->mem_mb, "vcpus", (json_int_t)r->vcpus,
                  "base", rec_ident_json(&r->base), "kernel", rec_ident_json(&r->kernel), "initrd",
                  rec_ident_json(&r->initrd), "created_ms", (json_int_t)r->created_ms);
    char *s;

    if (o)
        json_object_set_new(o, "net", json_boolean(r->net));
    if (o)
        json_object_set_new(o, "cmdline",
                            json_pack("{s:I,s:s}", "rev", (json_int_t)r->cmdline_rev, "append",
                                      r->cmdline_append ? r->cmdline_append : ""));
    if (o)
        json_object_set_new(o, "warmup", json_string(r->warmup ? r->warmup : ""));
    s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

void rec_tpl_free(struct rec_tpl *r)
{
    json_decref(r->doc);
    r->doc = NULL;
}

int rec_tpl_decode(const char *p, size_t n, struct rec_tpl *r)
{
    json_error_t jerr;
    json_t *o = json_loadb(p, n, 0, &jerr), *cl;
    json_int_t mem, vcpus;

    memset(r, 0, sizeof(*r));
    if (!json_is_object(o)) {
        json_decref(o);
        return -EINVAL;
    }
    r->doc = o;
    r->tmpl = json_string_value(json_object_get(o, "template"));
    r->vm_id = json_string_value(json_object_get(o, "vm_id"));
    r->dir = json_string_value(json_object_get(o, "dir"));
    r->snapshot = json_string_value(json_object_get(o, "snapshot"));
    r->disk = json_string_value(json_object_get(o, "disk"));
    r->mem_path = json_string_value(json_object_get(o, "mem_path"));
    r->mem_mb = json_integer_value(json_object_get(o, "mem_mb"));
    r->vcpus = json_integer_value(json_object_get(o, "vcpus"));
    r->created_ms = json_integer_value(json_object_get(o, "created_ms"));
    r->shape_ok =
        json_unpack(o, "{s:s,s:I,s:I}", "vm_id", &r->vm_id, "mem_mb", &mem, "vcpus", &vcpus) == 0;
    r->base_ok = rec_ident_of_json(json_object_get(o, "base"), &r->base) == 0;
    r->kernel_ok = rec_ident_of_json(json_object_get(o, "kernel"), &r->kernel) == 0;
    r->initrd_ok = rec_ident_of_json(json_object_get(o, "initrd"), &r->initrd) == 0;
    r->net = json_is_true(json_object_get(o, "net"));
    cl = json_object_get(o, "cmdline");
    r->cmdline_ok = json_is_object(cl) && json_object_size(cl) == 2 &&
                    json_is_integer(json_object_get(cl, "rev")) &&
                    json_is_string(json_object_get(cl, "append"));
    r->cmdline_rev = json_integer_value(json_object_get(cl, "rev"));
    r->cmdline_append = json_string_value(json_object_get(cl, "append"));
    r->warmup = json_string_value(json_object_get(o, "warmup"));
    return 0;
}
