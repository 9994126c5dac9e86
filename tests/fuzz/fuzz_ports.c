/*
 * Fuzz server/ports_head.c, the port proxy's view of a hostile client's first
 * request head. The first input byte picks options (bit 0: host routing on, bit 1:
 * strip Authorization, bits 2-7: where to cut the rest, to exercise incomplete
 * heads); the rest is the head. Checked: the parser never reads past what it is
 * given; a forwarded head parses again, keeps the method, carries no X-Warren-Token,
 * no warren_token cookie or query parameter, no Authorization when stripped, and
 * exactly one Connection header; the redirect URL carries no warren_token parameter.
 * And the head as a sequence of growing prefixes, as warrend peeks at it (peeks()).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cred.h"
#include "ports_head.h"

static char out[20000], url[20000];

/* Does the query of target t[0..n) (after its first '?', '&'-separated) hold a
 * warren_token= pair? */
static int query_has_token(const char *t, size_t n)
{
    const char *q = memchr(t, '?', n);
    const size_t nl = sizeof(PORTS_TOKEN_Q);
    size_t i;

    if (!q)
        return 0;
    for (i = (size_t)(q - t) + 1; i < n; i++) {
        if ((i == (size_t)(q - t) + 1 || t[i - 1] == '&') && n - i >= nl &&
            memcmp(t + i, PORTS_TOKEN_Q "=", nl) == 0)
            return 1;
    }
    return 0;
}

/* warrend peeks at a head as it arrives, a growing prefix at a time (http.c): every
 * prefix of a head that parses whole, of length len, must read as incomplete (never
 * malformed: a valid head that came in pieces would be refused), and while it could
 * be a port request (port: the whole one routes to a sandbox port) no prefix
 * may say it cannot (it would go to lws half-read). 16 prefixes, growing. */
static void peeks(const char *buf, size_t len, const char *domain, bool port)
{
    struct ports_head h;

    for (size_t i = 0; i < 16; i++) {
        size_t k = len * i / 16;
        if (ports_head_parse(buf, k, 8192, &h) != 0)
            abort();
        if (port && !ports_head_maybe(buf, k, domain))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ports_head h, h2;
    struct ports_dest d;
    char tok[256], *copy;
    size_t n, cut;
    long len;
    int r;

    if (size < 1)
        return 0;
    n = size - 1;
    /* An exact-size heap copy: ASan sees any read past the end. */
    copy = malloc(n ? n : 1);
    if (!copy)
        return 0;
    memcpy(copy, data + 1, n);
    cut = n ? (size_t)(data[0] >> 2) * n / 63 : 0;
    ports_head_maybe(copy, cut, data[0] & 1 ? "box.example" : "");
    ports_head_parse(copy, cut, 8192, &h);
    r = ports_head_parse(copy, n, 8192, &h);
    if (r > 0) {
        if ((size_t)r != h.len || h.len > n)
            abort();
        r = ports_route(&h, data[0] & 1 ? "box.example" : "", &d);
        peeks(copy, h.len, data[0] & 1 ? "box.example" : "", r > 0);
        if (r > 0) {
            ports_query_token(&d, tok, sizeof(tok));
            ports_cookie_token(&h, tok, sizeof(tok));
            len = ports_url_without_token(&h, url, sizeof(url));
            if (len >= 0 && query_has_token(url, (size_t)len))
                abort();
            /* a redirect's Location is a path of this host, never "//host" or "/\\host" */
            if (len >= 0 && (len < 1 || url[0] != '/' || (len > 1 && url[1] == '/') ||
                             memchr(url, '\\', (size_t)len)))
                abort();
            len = ports_head_rewrite(&h, &d, (data[0] & 2) ? "K" : NULL, out, sizeof(out));
            if (len >= 0) {
                unsigned conn = 0;
                if (ports_head_parse(out, (size_t)len, sizeof(out), &h2) != len)
                    abort();
                if (h2.method.n != h.method.n || memcmp(h2.method.p, h.method.p, h.method.n))
                    abort();
                if (h2.xtoken.p || ports_cookie_token(&h2, tok, sizeof(tok)) != 0 ||
                    query_has_token(h2.target.p, h2.target.n) ||
                    ((data[0] & 2) && h2.authorization.p &&
                     cred_is_key(h2.authorization.p, h2.authorization.n, "K")))
                    abort();
                for (unsigned i = 0; i < h2.nhdr; i++)
                    conn += h2.name[i].n == 10 && strncasecmp(h2.name[i].p, "connection", 10) == 0;
                if (conn != 1)
                    abort();
            }
        }
    }
    free(copy);
    return 0;
}
