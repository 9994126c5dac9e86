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
/* Bytes as a JSON string, '?' for each non-ASCII byte when they are not UTF-8 (a
 * command line can hold any bytes). */
json_t *sbx_json_text(const char *p, size_t n);

#endif
