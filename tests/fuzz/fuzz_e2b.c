/*
 * Fuzz target: the pure part of E2B's control plane (server/e2b_wire.c), fed
 * what a hostile client controls: the path, query fragments and the metadata
 * filter. A routed {id} is always well formed; a metadata filter decodes to at
 * most its own length and never holds a NUL.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "e2b_api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned methods[] = {API_GET, API_POST, API_PUT, API_DELETE, API_PATCH};
    char *s = malloc(size + 1);
    struct e2b_match m;
    const char *frags[8];
    size_t nf = 0;
    json_t *o = NULL;
    int r;

    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';

    r = e2b_route_match(s, methods[size % 5], &m);
    if (r == 0) {
        size_t n = strlen(m.id);
        if (n > API_ID_MAX || m.route == E2B_R_NONE)
            abort();
        for (size_t i = 0; i < n; i++)
            if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_",
                        m.id[i]))
                abort();
    } else if (r != -ENOENT && r != -ENOTSUP && r != -EINVAL) {
        abort();
    }

    if (e2b_metadata_filter(s, &o) == 0) {
        const char *k;
        json_t *v;
        if (!o)
            abort();
        json_object_foreach(o, k, v)
        {
            if (strlen(k) > size || json_string_length(v) > size ||
                strlen(json_string_value(v)) != json_string_length(v))
                abort();
        }
    } else if (o) {
        abort();
    }
    json_decref(o);

    /* the same bytes as query fragments, split at '&' */
    for (char *p = s; nf < 8;) {
        frags[nf++] = p;
        p = strchr(p, '&');
        if (!p)
            break;
        *p++ = '\0';
    }
    r = e2b_query_args(frags, nf, &o);
    if ((r == 0) != (o != NULL) || (r && r != -EINVAL && r != -ENOMEM) || json_object_size(o) > nf)
        abort();
    json_decref(o);
    free(s);
    return 0;
}
