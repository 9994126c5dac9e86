/*
 * sbx_json.h - the REST door's codec for the core's requests: a JSON body (or
 * query arguments gathered as JSON) into the request structs of sbx.h.
 *
 * Only what belongs to JSON is checked here: the body is an object, its keys
 * are known, each value has the right JSON type. Every rule about the values
 * themselves (ranges, combinations, names) is the core's, checked by the call
 * that takes the request, the same for every door.
 *
 * Ownership: a parsed request borrows the strings of the JSON it was parsed
 * from (keep that alive while the request is used) and owns the arrays it
 * needed (freed by the matching *_free, which is safe on a zeroed or failed
 * request). 0, or an sbx_errcode with *err.
 */
#ifndef WARREN_SBX_JSON_H
#define WARREN_SBX_JSON_H

#include <jansson.h>

#include "sbx.h"
#include "sbx_snap.h"

/* body must be an object whose keys are all in the NULL-ended allowed list. */
int sbx_json_fields(json_t *body, const char *const *allowed, struct sbx_err *err);

/* An object of strings at body[key] (absent or null: empty) as *kv, *n entries. */
int sbx_json_kv(json_t *body, const char *key, struct sbx_kv **kv, size_t *n, struct sbx_err *err);

struct sbx_json_net {
    struct sbx_net_req req;
    const char **lists; /* allow_out's entries, then deny_out's */
};
/* A "network" object (as at create, or PATCH .../network's body). */
int sbx_json_net(json_t *n, struct sbx_json_net *out, struct sbx_err *err);
void sbx_json_net_free(struct sbx_json_net *n);

struct sbx_json_create {
    struct sbx_create_req req;
    struct sbx_json_net net;
    struct sbx_kv *env, *meta;
    int64_t *ports;
};
/* POST /v1/sandboxes. */
int sbx_json_create(json_t *body, struct sbx_json_create *out, struct sbx_err *err);
void sbx_json_create_free(struct sbx_json_create *c);

struct sbx_json_exec {
    struct sbx_exec_req req;
    struct sbx_str *argv;
    struct sbx_kv *env;
};
/* POST .../exec, and the agent socket's exec (its fields as a JSON object). */
int sbx_json_exec(json_t *body, struct sbx_json_exec *out, struct sbx_err *err);
void sbx_json_exec_free(struct sbx_json_exec *x);

/* A file operation's arguments: path, to (rename), depth (list), recursive (remove).
 * Nothing to free. */
int sbx_json_file(enum sbx_file_kind kind, json_t *args, struct sbx_file_req *out,
                  struct sbx_err *err);

/* POST .../timeout: {"ttl_seconds": N} into *ttl_s (SBX_UNSET when absent). */
int sbx_json_timeout(json_t *body, int64_t *ttl_s, struct sbx_err *err);

struct sbx_json_snap {
    struct sbx_snap_req req;
    struct sbx_kv *meta;
};
/* POST .../snapshot: {"metadata"}. */
int sbx_json_snap(json_t *body, struct sbx_json_snap *out, struct sbx_err *err);
void sbx_json_snap_free(struct sbx_json_snap *s);

struct sbx_json_fork {
    struct sbx_fork_req req;
    struct sbx_kv *meta;
};
/* POST .../fork: {"count", "ttl_seconds", "idle_timeout_seconds", "metadata"}. */
int sbx_json_fork(json_t *body, struct sbx_json_fork *out, struct sbx_err *err);
void sbx_json_fork_free(struct sbx_json_fork *f);

/* POST .../pause: takes no fields, {} only. */
int sbx_json_pause(json_t *body, struct sbx_err *err);

/* ---- records (sbx.h) into the JSON clients see: new references, NULL when out of
 * memory ---- */

/* The answer of an operation (NULL for none). */
json_t *sbx_json_result(const struct sbx_result *res);
/* A sandbox. */
json_t *sbx_json_rec(const struct sbx_rec *r);
/* A process; a list of them as {"processes": [...]}. */
json_t *sbx_json_proc(const struct sbx_proc_rec *p);
json_t *sbx_json_procs(const struct sbx_proc_rec *v, size_t n);
/* A file's stat. */
json_t *sbx_json_stat(const struct sbx_stat_rec *r);
/* A command's exit. */
json_t *sbx_json_exit(const struct sbx_exec_rec *x);
/* A snapshot; a list of them as {"snapshots": [...]}. */
json_t *sbx_json_snap_rec(const struct sbx_snap_rec *r);
json_t *sbx_json_snaps(const struct sbx_snap_rec *v, size_t n);
/* The warm pools' figures as /healthz shows them: the default template's pool with
 * "templates": [every pool], or null when the pool is off. */
json_t *sbx_json_pool_stats(const struct sbx_pool_stats *s);
/* GET /v1/templates: {"templates": [{"name", "default", "size_bytes", "pools"}]}. */
json_t *sbx_json_templates(const struct sbx_tmpl_list *l);
/* Bytes as a JSON string, '?' for each non-ASCII byte when they are not UTF-8 (a
 * command line can hold any bytes). */
json_t *sbx_json_text(const char *p, size_t n);

/* A JSON door's sink callback fn(user, err, json_t *body), which takes body, as the
 * done of an sbx_sink named name: the record arrives as the REST JSON. */
#define SBX_JSON_DONE(name, fn)                                                                    \
    static void name(void *user, const struct sbx_err *err, const struct sbx_result *res)          \
    {                                                                                              \
        fn(user, err, err || !res ? NULL : sbx_json_result(res));                                  \
    }

/* ---- calls for the doors that speak JSON on both sides (Jupyter's, E2B's): the body
 * parsed by the codec above, the answer as the REST API's JSON (a new reference in
 * *out). 0, or an sbx_errcode with *err. ---- */
int sbx_json_get(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
/* {"sandboxes": [...]}: state and metadata (an object of strings) may be NULL. */
int sbx_json_list(struct sbx_table *t, const char *state, json_t *metadata, json_t **out,
                  struct sbx_err *err);
int sbx_json_delete(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
/* body {"ttl_seconds": N}. */
int sbx_json_set_timeout(struct sbx_table *t, const char *id, json_t *body, json_t **out,
                         struct sbx_err *err);
/* A create or an exec from its REST body (the answer comes to sink->done as a record:
 * sbx_json_result() makes it the REST JSON). */
int sbx_json_call_create(struct sbx_table *t, json_t *body, const struct sbx_sink *sink, void *user,
                         sbx_op_t *op, struct sbx_err *err);
int sbx_json_call_exec(struct sbx_table *t, const char *id, json_t *body, bool stream,
                       const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);
/* A file operation from its arguments (path, to, depth, recursive). */
int sbx_json_call_file(struct sbx_table *t, const char *id, enum sbx_file_kind kind, json_t *args,
                       const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

/* Snapshots, pause, resume and fork (sbx_snap.h) from their REST bodies, for the JSON
 * doors. A pause or resume that has nothing to do (paused already, running) answers at
 * once: 0 with *out its record and no callback; else *out stays NULL and *op is the op. */
int sbx_snapshot(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
                 void *user, sbx_op_t *op, struct sbx_err *err);
int sbx_fork(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
             void *user, sbx_op_t *op, struct sbx_err *err);
int sbx_pause(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
              void *user, sbx_op_t *op, json_t **out, struct sbx_err *err);
int sbx_resume(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
               sbx_op_t *op, json_t **out, struct sbx_err *err);
/* {"snapshots": [...]}, oldest first. */
int sbx_snap_list(struct sbx_table *t, json_t **out, struct sbx_err *err);
int sbx_snap_get(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
int sbx_snap_delete(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);

#endif
