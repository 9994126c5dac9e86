/*
 * sbx_json_call.c - the core's calls for the doors that speak JSON on both sides
 * (sbx_json.h): the REST codec's request in, the REST JSON out.
 */
#include "sbx_json.h"

#include <stdlib.h>

/* ---- calls for the JSON doors ---- */

int sbx_json_get(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err)
{
    struct sbx_rec rec;
    int rc = sbx_get(t, id, &rec, err);

    if (rc)
        return rc;
    if (!(*out = sbx_json_rec(&rec)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

int sbx_json_list(struct sbx_table *t, const char *state, json_t *metadata, json_t **out,
                  struct sbx_err *err)
{
    struct sbx_rec *recs = NULL;
    struct sbx_kv *filter = NULL;
    size_t n = 0, nrecs = 0;
    json_t *arr = NULL, *wrap = metadata ? json_pack("{s:O}", "metadata", metadata) : NULL;
    int rc = wrap || !metadata ? sbx_json_kv(wrap, "metadata", &filter, &n, err)
                               : sbx_err_set(err, SBX_E_INTERNAL, "out of memory");

    json_decref(wrap);
    if (rc == 0)
        rc = sbx_list(t, state, filter, n, &recs, &nrecs, err);
    if (rc == 0 && !(arr = json_array()))
        rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    for (size_t i = 0; rc == 0 && i < nrecs; i++)
        json_array_append_new(arr, sbx_json_rec(&recs[i]));
    free(recs);
    free(filter);
    if (rc) {
        json_decref(arr);
        return rc;
    }
    if (!(*out = json_pack("{s:o}", "sandboxes", arr)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

int sbx_json_delete(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err)
{
    struct sbx_rec rec;
    int rc = sbx_delete(t, id, &rec, err);

    if (rc)
        return rc;
    if (!(*out = sbx_json_rec(&rec)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

int sbx_json_set_timeout(struct sbx_table *t, const char *id, json_t *body, json_t **out,
                         struct sbx_err *err)
{
    struct sbx_rec rec;
    int64_t ttl;
    int rc = sbx_json_timeout(body, &ttl, err);

    if (rc == 0)
        rc = sbx_set_timeout(t, id, ttl, &rec, err);
    if (rc)
        return rc;
    if (!(*out = sbx_json_rec(&rec)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

int sbx_json_call_create(struct sbx_table *t, json_t *body, const struct sbx_sink *sink, void *user,
                         sbx_op_t *op, struct sbx_err *err)
{
    struct sbx_json_create c;
    int rc = sbx_json_create(body, &c, err);

    if (rc == 0)
        rc = sbx_create(t, &c.req, sink, user, op, err);
    sbx_json_create_free(&c);
    return rc;
}

int sbx_json_call_exec(struct sbx_table *t, const char *id, json_t *body, bool stream,
                       const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct sbx_json_exec x;
    int rc = sbx_json_exec(body, &x, err);

    if (rc == 0)
        rc = sbx_exec(t, id, &x.req, stream, sink, user, op, err);
    sbx_json_exec_free(&x);
    return rc;
}

int sbx_json_call_file(struct sbx_table *t, const char *id, enum sbx_file_kind kind, json_t *args,
                       const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct sbx_file_req f;
    int rc = sbx_json_file(kind, args, &f, err);

    return rc ? rc : sbx_file_op(t, id, &f, sink, user, op, err);
}

/* ---- snapshots, pause, resume and fork for the JSON doors ---- */

int sbx_snapshot(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
                 void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct sbx_json_snap req;
    int rc = sbx_json_snap(body, &req, err);

    if (rc == 0)
        rc = sbx_snap_take(t, id, &req.req, sink, user, op, err);
    sbx_json_snap_free(&req);
    return rc;
}

int sbx_fork(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
             void *user, sbx_op_t *op, struct sbx_err *err)
{
    struct sbx_json_fork req;
    int rc = sbx_json_fork(body, &req, err);

    if (rc == 0)
        rc = sbx_snap_fork(t, id, &req.req, sink, user, op, err);
    sbx_json_fork_free(&req);
    return rc;
}

/* A pause's or resume's answer: an op started (*op), or the record at once (*out). */
static int at_once(int rc, sbx_op_t started, const struct sbx_rec *rec, sbx_op_t *op, json_t **out,
                   struct sbx_err *err)
{
    if (rc)
        return rc;
    if (started) {
        *op = started;
        return 0;
    }
    if (!(*out = sbx_json_rec(rec)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return 0;
}

int sbx_pause(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
              void *user, sbx_op_t *op, json_t **out, struct sbx_err *err)
{
    struct sbx_rec rec;
    sbx_op_t started = 0;
    int rc;

    *out = NULL;
    if ((rc = sbx_json_pause(body, err)))
        return rc;
    rc = sbx_snap_pause(t, id, sink, user, &started, &rec, err);
    return at_once(rc, started, &rec, op, out, err);
}

int sbx_resume(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
               sbx_op_t *op, json_t **out, struct sbx_err *err)
{
    struct sbx_rec rec;
    sbx_op_t started = 0;
    int rc;

    *out = NULL;
    rc = sbx_snap_resume(t, id, sink, user, &started, &rec, err);
    return at_once(rc, started, &rec, op, out, err);
}

int sbx_snap_list(struct sbx_table *t, json_t **out, struct sbx_err *err)
{
    struct sbx_snap_rec *recs = NULL;
    size_t n = 0;
    int rc = sbx_snap_all(t, &recs, &n, err);

    if (rc == 0 && !(*out = sbx_json_snaps(recs, n)))
        rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    free(recs);
    return rc;
}

int sbx_snap_get(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err)
{
    struct sbx_snap_rec rec;
    int rc = sbx_snap_find(t, id, &rec, err);

    if (rc == 0 && !(*out = sbx_json_snap_rec(&rec)))
        rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return rc;
}

int sbx_snap_delete(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err)
{
    struct sbx_snap_rec rec;
    int rc = sbx_snap_drop(t, id, &rec, err);

    if (rc == 0 && !(*out = sbx_json_snap_rec(&rec)))
        rc = sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    return rc;
}
