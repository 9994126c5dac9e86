/*
 * e2b_wire.c - the pure part of E2B's control plane (e2b_api.h): its routes,
 * its query values and its error shape. No I/O, no lws: unit-tested by
 * tests/server/test_e2b.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "e2b_api.h"

struct row {
    const char *pattern; /* literals and one {id} */
    unsigned method;
    enum e2b_route route;
    bool body, disk, created;
};

/* clang-format off */
static const struct row rows[] = {
    {"/sandboxes", API_POST, E2B_R_CREATE, true, true, true},
    {"/v2/sandboxes", API_POST, E2B_R_CREATE, true, true, true},
    {"/sandboxes", API_GET, E2B_R_LIST_V1, false, false, false},
    {"/v2/sandboxes", API_GET, E2B_R_LIST, false, false, false},
    {"/sandboxes/metrics", API_GET, E2B_R_METRICS_MANY, false, false, false},
    {"/sandboxes/{id}", API_GET, E2B_R_INFO, false, false, false},
    {"/sandboxes/{id}", API_DELETE, E2B_R_KILL, false, false, false},
    {"/sandboxes/{id}/timeout", API_POST, E2B_R_TIMEOUT, true, false, false},
    {"/sandboxes/{id}/pause", API_POST, E2B_R_PAUSE, true, true, false},
    {"/sandboxes/{id}/connect", API_POST, E2B_R_CONNECT, true, false, false},
    {"/v2/sandboxes/{id}/connect", API_POST, E2B_R_CONNECT, true, false, false},
    {"/sandboxes/{id}/resume", API_POST, E2B_R_RESUME, true, false, true},
    {"/sandboxes/{id}/fork", API_POST, E2B_R_FORK, true, true, true},
    {"/sandboxes/{id}/snapshots", API_POST, E2B_R_SNAPSHOT, true, true, true},
    {"/snapshots", API_GET, E2B_R_SNAPSHOTS, false, false, false},
    {"/templates/{id}", API_DELETE, E2B_R_TEMPLATE_DEL, false, false, false},
    {"/sandboxes/{id}/network", API_PUT, E2B_R_NETWORK, true, false, false},
    {"/sandboxes/{id}/metrics", API_GET, E2B_R_METRICS, false, false, false},
};
/* clang-format on */

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* Does path match pattern? 1 yes (id filled), 0 no, -1 shaped so but a bad {id}. */
static int match_one(const char *pattern, const char *path, char id[API_ID_MAX + 1])
{
    const char *ph = strstr(pattern, "{id}");
    size_t pre, n = 0;

    id[0] = '\0';
    if (!ph)
        return strcmp(pattern, path) == 0;
    pre = (size_t)(ph - pattern);
    if (strncmp(pattern, path, pre) != 0)
        return 0;
    path += pre;
    while (path[n] && path[n] != '/')
        n++;
    if (strcmp(path + n, ph + 4) != 0)
        return 0;
    if (n == 0 || n > API_ID_MAX)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!id_char(path[i]))
            return -1;
    memcpy(id, path, n);
    id[n] = '\0';
    return 1;
}

int e2b_route_match(const char *path, unsigned method, struct e2b_match *m)
{
    bool shaped = false, bad_id = false;

    memset(m, 0, sizeof(*m));
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        char id[API_ID_MAX + 1];
        int r = match_one(rows[i].pattern, path, id);
        /* "/sandboxes/metrics" is a literal row, before {id}: never an id. */
        if (r == 1 && rows[i].route != E2B_R_METRICS_MANY && !strcmp(id, "metrics") &&
            !strcmp(rows[i].pattern, "/sandboxes/{id}"))
            continue;
        if (r < 0)
            bad_id = true;
        if (r <= 0)
            continue;
        shaped = true;
        if (rows[i].method != method)
            continue;
        m->route = rows[i].route;
        m->body = rows[i].body;
        m->disk = rows[i].disk;
        m->created = rows[i].created;
        memcpy(m->id, id, sizeof(m->id));
        return 0;
    }
    if (shaped)
        return -ENOTSUP;
    return bad_id ? -EINVAL : -ENOENT;
}

int e2b_query_args(const char *const *frags, size_t n, json_t **out)
{
    json_t *o = json_object();
    int r = -ENOMEM;

    *out = NULL;
    if (!o)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(frags[i], '=');
        char name[64];
        size_t nl = eq ? (size_t)(eq - frags[i]) : strlen(frags[i]);
        const char *val = eq ? eq + 1 : "", *a;
        json_t *old, *v;
        char *j;

        if (nl == 0 || nl >= sizeof(name))
            continue; /* no E2B parameter has such a name: ignored, as E2B does */
        memcpy(name, frags[i], nl);
        name[nl] = '\0';
        if (!api_utf8_valid((const unsigned char *)name, nl) ||
            !api_utf8_valid((const unsigned char *)val, strlen(val))) {
            r = -EINVAL;
            goto fail;
        }
        old = json_object_get(o, name);
        if (!old) {
            if (json_object_set_new(o, name, json_string(val)))
                goto fail;
            continue;
        }
        a = json_string_value(old);
        if (!(j = malloc(strlen(a) + 1 + strlen(val) + 1)))
            goto fail;
        sprintf(j, "%s,%s", a, val);
        v = json_string(j);
        free(j);
        if (json_object_set_new(o, name, v))
            goto fail;
    }
    *out = o;
    return 0;
fail:
    json_decref(o);
    return r;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Form-decode s[0..n) into out (n + 1 bytes): '+' is a space (when form). -1 on a bad
 * escape. */
static int pct_decode(const char *s, size_t n, char *out, bool form)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            int h, l;
            if (i + 2 >= n || (h = hexval(s[i + 1])) < 0 || (l = hexval(s[i + 2])) < 0)
                return -1;
            if (h == 0 && l == 0)
                return -1; /* no NUL inside a key or value */
            out[o++] = (char)(h << 4 | l);
            i += 2;
        } else {
            out[o++] = form && s[i] == '+' ? ' ' : s[i];
        }
    }
    out[o] = '\0';
    return 0;
}

#define META_FILTER_MAX 64 /* pairs in one metadata filter */

/* One key or value of the filter. The JS SDK escapes each with encodeURIComponent
 * before form-encoding the pairs, the Python SDK only form-encodes them: decode the
 * form, then once more where that leaves a well-formed escape. */
static int form_decode(const char *s, size_t n, char *out)
{
    char *again;
    size_t len;

    if (pct_decode(s, n, out, true))
        return -1;
    len = strlen(out);
    if (!memchr(out, '%', len) || !(again = malloc(len + 1)))
        return 0;
    if (pct_decode(out, len, again, false) == 0)
        memcpy(out, again, strlen(again) + 1);
    free(again);
    return 0;
}

int e2b_metadata_filter(const char *s, json_t **out)
{
    json_t *o = json_object();
    size_t len = strlen(s), pairs = 0;
    char *k = malloc(len + 1), *v = malloc(len + 1);
    int r = -EINVAL;

    *out = NULL;
    if (!o || !k || !v) {
        r = -ENOMEM;
        goto out;
    }
    for (const char *p = s; *p;) {
        size_t n = strcspn(p, "&");
        const char *eq = memchr(p, '=', n);
        if (n) {
            if (!eq || eq == p || ++pairs > META_FILTER_MAX ||
                form_decode(p, (size_t)(eq - p), k) ||
                form_decode(eq + 1, n - (size_t)(eq - p) - 1, v) ||
                json_object_set_new(o, k, json_string(v)))
                goto out;
        }
        p += n;
        if (*p == '&')
            p++;
    }
    *out = o;
    o = NULL;
    r = 0;
out:
    json_decref(o);
    free(k);
    free(v);
    return r;
}

json_t *e2b_error_body(int status, json_t *warren_err)
{
    json_t *e = json_object_get(warren_err, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    json_t *o = json_pack("{s:i, s:s}", "code", status, "message", msg ? msg : "error");

    json_decref(warren_err);
    return o;
}
