/*
 * e2b_code_wire.c - the pure part of E2B's code interpreter door (e2b_code.c):
 * its routes, and its request bodies checked and turned into what the kernel
 * bridge's requests take (klink.h). No I/O: unit-tested and fuzzed.
 */
#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "e2b_code.h"

#define LANG_MAX 32 /* a language name echoed in an error */

static bool id_ok(const char *s, size_t n)
{
    if (!n || n > API_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_')
            return false;
    return true;
}

enum e2b_code_route e2b_code_route_of(const char *uri, unsigned method, char ctx[API_ID_MAX + 1],
                                      int *status)
{
    const char *rest, *slash;
    size_t n;

    *status = 0;
    ctx[0] = '\0';
    if (!strcmp(uri, "/health"))
        return method == API_GET ? E2B_CODE_HEALTH : (*status = 405, E2B_CODE_NONE);
    if (!strcmp(uri, "/execute"))
        return method == API_POST ? E2B_CODE_EXECUTE : (*status = 405, E2B_CODE_NONE);
    if (!strcmp(uri, "/contexts") || !strcmp(uri, "/contexts/")) {
        if (method == API_GET)
            return E2B_CODE_LIST;
        if (method == API_POST)
            return E2B_CODE_CREATE;
        *status = 405;
        return E2B_CODE_NONE;
    }
    if (strncmp(uri, "/contexts/", 10)) {
        *status = 404;
        return E2B_CODE_NONE;
    }
    rest = uri + 10;
    slash = strchr(rest, '/');
    n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (slash && strcmp(slash, "/restart")) {
        *status = 404;
        return E2B_CODE_NONE;
    }
    if (!id_ok(rest, n)) {
        /* no context of ours has such an id: kerneld makes UUIDs */
        *status = 404;
        return E2B_CODE_BAD_ID;
    }
    memcpy(ctx, rest, n);
    ctx[n] = '\0';
    if (slash)
        return method == API_POST ? E2B_CODE_RESTART : (*status = 405, E2B_CODE_NONE);
    return method == API_DELETE ? E2B_CODE_DELETE : (*status = 405, E2B_CODE_NONE);
}

/* A language as upstream normalises it: NULL (none) is python. *out: the kerneld
 * language, or NULL when this sandbox has no such kernel. */
static void lang_of(const char *l, const char **out)
{
    char low[LANG_MAX + 1];
    size_t i;

    *out = NULL;
    if (!l) {
        *out = "python";
        return;
    }
    for (i = 0; l[i] && i < LANG_MAX; i++)
        low[i] = (char)tolower((unsigned char)l[i]);
    low[i] = '\0';
    if (l[i])
        return;
    if (!strcmp(low, "python"))
        *out = "python";
    else if (!strcmp(low, "bash"))
        *out = "bash";
}

/* A language for a message: at most LANG_MAX printable bytes. */
static void shown_lang(const char *l, char out[LANG_MAX + 1])
{
    snprintf(out, LANG_MAX + 1, "%s", l ? l : "");
    for (char *c = out; *c; c++)
        if (!isprint((unsigned char)*c))
            *c = '?';
}

/* Upstream answers a language with no kernel as a failed context creation (500). */
#define NO_KERNEL_FMT                                                                              \
    "Failed to create context: no \"%s\" kernel in this sandbox (it has python and bash)"

/* The kernel language for lang in *klang: 0, or 500 with upstream's message in msg. */
static int kernel_of(const char *lang, const char **klang, char *msg, size_t cap)
{
    char shown[LANG_MAX + 1];

    lang_of(lang, klang);
    if (*klang)
        return 0;
    shown_lang(lang, shown);
    snprintf(msg, cap, NO_KERNEL_FMT, shown);
    return 500;
}

/* An optional string field: absent and null are none. 0, or -1 when of another type. */
static int opt_str(json_t *body, const char *k, const char **out)
{
    json_t *v = json_object_get(body, k);

    *out = NULL;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v))
        return -1;
    *out = json_string_value(v);
    return 0;
}

/* POST /execute's body {code, context_id?, language?, env_vars?} as the run body
 * klink_run_req takes. 0 and *run, or the status with msg (filled). */
int e2b_code_exec_body(json_t *body, json_t **run, char *msg, size_t cap)
{
    const char *cid, *lang, *klang;
    json_t *code = json_object_get(body, "code"), *env = json_object_get(body, "env_vars"), *r;

    *run = NULL;
    if (!json_is_object(body)) {
        snprintf(msg, cap, "the body must be a JSON object");
        return 400;
    }
    if (!json_is_string(code)) {
        snprintf(msg, cap, "code must be a string");
        return 400;
    }
    if (opt_str(body, "context_id", &cid) || opt_str(body, "language", &lang)) {
        snprintf(msg, cap, "context_id and language must be strings");
        return 400;
    }
    if (cid && lang) {
        snprintf(msg, cap, "Only one of context_id or language can be provided");
        return 400;
    }
    if (env && !json_is_null(env) && !json_is_object(env)) {
        snprintf(msg, cap, "env_vars must be an object of strings");
        return 400;
    }
    if (cid && !id_ok(cid, strlen(cid))) {
        snprintf(msg, cap, "Context not found: no context has such an id");
        return 404;
    }
    if (!cid && kernel_of(lang, &klang, msg, cap))
        return 500;
    r = json_pack("{s:O}", "code", code);
    if (!r || (cid && json_object_set_new(r, "context_id", json_string(cid))) ||
        (!cid && lang && json_object_set_new(r, "language", json_string(klang))) ||
        (json_is_object(env) && json_object_set(r, "env", env))) {
        json_decref(r);
        snprintf(msg, cap, "out of memory");
        return 500;
    }
    *run = r;
    return 0;
}

int e2b_code_create_body(json_t *body, json_t **args, char *msg, size_t cap)
{
    const char *lang, *cwd, *klang;
    json_t *r;

    *args = NULL;
    if (!json_is_object(body)) {
        snprintf(msg, cap, "the body must be a JSON object");
        return 400;
    }
    if (opt_str(body, "language", &lang) || opt_str(body, "cwd", &cwd)) {
        snprintf(msg, cap, "language and cwd must be strings");
        return 400;
    }
    if (kernel_of(lang, &klang, msg, cap))
        return 500;
    r = json_pack("{s:s}", "language", klang);
    if (!r || (cwd && json_object_set_new(r, "cwd", json_string(cwd)))) {
        json_decref(r);
        snprintf(msg, cap, "out of memory");
        return 500;
    }
    *args = r;
    return 0;
}
