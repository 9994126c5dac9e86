/*
 * Fuzz target: the pure part of E2B's code interpreter door
 * (server/e2b_code_wire.c), fed what a hostile client controls: the path and
 * the /execute and /contexts bodies. A routed context id is always well formed
 * and bounded; a body is either refused with a status and a bounded message or
 * turned into a request whose fields are the kernel bridge's.
 */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "e2b_code.h"

static void check_ctx(const char *ctx)
{
    size_t n = strlen(ctx);

    if (n > API_ID_MAX)
        abort();
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)ctx[i]) && ctx[i] != '-' && ctx[i] != '_')
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const unsigned methods[] = {API_GET, API_POST, API_PUT, API_DELETE, API_PATCH};
    char *s = malloc(size + 1), ctx[API_ID_MAX + 1], msg[256];
    json_t *body, *out = NULL;
    int st;
    enum e2b_code_route r;

    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';

    r = e2b_code_route_of(s, methods[size % 5], ctx, &st);
    if ((r == E2B_CODE_DELETE || r == E2B_CODE_RESTART) && (st || !ctx[0]))
        abort();
    if (!st)
        check_ctx(ctx);

    body = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    st = e2b_code_exec_body(body, &out, msg, sizeof(msg));
    if (st ? (out != NULL || strlen(msg) >= sizeof(msg))
           : !json_is_string(json_object_get(out, "code")))
        abort();
    if (!st && json_object_get(out, "context_id") && json_object_get(out, "language"))
        abort();
    json_decref(out);
    out = NULL;
    st = e2b_code_create_body(body, &out, msg, sizeof(msg));
    if (st ? out != NULL : !json_is_string(json_object_get(out, "language")))
        abort();
    json_decref(out);
    json_decref(body);
    free(s);
    return 0;
}
