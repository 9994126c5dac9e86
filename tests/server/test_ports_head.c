/* Unit tests of server/ports_head.c: the port proxy's head parser, router and rewriter. */
#include "ports_head.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int failures;
#include "check.h"

static int parse(const char *s, struct ports_head *h)
{
    return ports_head_parse(s, strlen(s), 8192, h);
}

/* Parse, route and rewrite s; the forwarded head into out. The route, or what failed. */
static int rewrite(const char *s, const char *domain, const char *key, char *out, size_t cap)
{
    struct ports_head h;
    struct ports_dest d;
    int r;
    long n;

    if ((r = parse(s, &h)) <= 0)
        return r - 1000;
    if ((r = ports_route(&h, domain, &d)) <= 0)
        return r;
    n = ports_head_rewrite(&h, &d, key, out, cap);
    if (n < 0)
        return -2000;
    out[n] = '\0';
    return r;
}

static void test_parse(void)
{
    struct ports_head h;
    const char *ok = "GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\n\r\nbody";

    CHECK(parse(ok, &h) == (int)strlen(ok) - 4);
    CHECK(h.has_length && h.length == 12 && !h.chunked && !h.upgrade);
    CHECK(h.host.n == 1 && h.host.p[0] == 'x');
    /* incomplete, then too long */
    CHECK(parse("GET /a HTTP/1.1\r\nHost: x\r\n", &h) == 0);
    {
        char big[300];
        memset(big, 'a', sizeof(big));
        memcpy(big, "GET /", 5);
        CHECK(ports_head_parse(big, sizeof(big), 256, &h) == -E2BIG);
    }
    /* smuggling shapes are refused */
    CHECK(parse("GET /a HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", &h) ==
          -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", &h) ==
          -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nHost : x\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nA: b\r\n c\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\nHost: x\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nA: b\rXC: d\r\n\r\n", &h) == -EINVAL); /* bare CR */
    CHECK(parse("GET /a HTTP/2.0\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET a HTTP/1.1\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", &h) == -EINVAL);
    /* E2B's traffic token: read, and once only */
    CHECK(parse("GET /a HTTP/1.1\r\nE2B-Traffic-Access-Token: t1\r\n\r\n", &h) > 0 &&
          h.e2btoken.n == 2 && memcmp(h.e2btoken.p, "t1", 2) == 0);
    CHECK(parse("GET /a HTTP/1.1\r\ne2b-traffic-access-token: a\r\n"
                "E2B-Traffic-Access-Token: b\r\n\r\n",
                &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nContent-Length: -1\r\n\r\n", &h) == -EINVAL);
    CHECK(parse("GET /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &h) > 0 && h.chunked);
    /* upgrade needs both headers */
    CHECK(parse("GET /a HTTP/1.1\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
                &h) > 0 &&
          h.upgrade);
    CHECK(parse("GET /a HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", &h) > 0 && !h.upgrade);
}

static void test_route(void)
{
    struct ports_head h;
    struct ports_dest d;

    parse("GET /v1/sandboxes/abc-1/ports/8080/x/y?a=1 HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == PORTS_PATH);
    CHECK(strcmp(d.sbx, "abc-1") == 0 && d.port == 8080);
    CHECK(d.rest.n == 4 && memcmp(d.rest.p, "/x/y", 4) == 0);
    CHECK(d.query.n == 3 && memcmp(d.query.p, "a=1", 3) == 0);
    parse("GET /v1/sandboxes/abc/ports/80 HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, NULL, &d) == PORTS_PATH && d.port == 80 && d.rest.n == 0);
    /* other routes of a sandbox are the API's */
    parse("GET /v1/sandboxes/abc/files?path=/ports/1 HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == PORTS_NOT);
    parse("GET /v1/sandboxes/abc HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == PORTS_NOT);
    parse("GET /healthz HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == PORTS_NOT);
    /* bad ports, bad ids */
    parse("GET /v1/sandboxes/abc/ports/0/ HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == -EINVAL);
    parse("GET /v1/sandboxes/abc/ports/65536 HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == -EINVAL);
    parse("GET /v1/sandboxes/abc/ports/08 HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == -EINVAL);
    parse("GET /v1/sandboxes/abc/ports/x HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == -EINVAL);
    parse("GET /v1/sandboxes/a.b/ports/8 HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == -ENOENT);
    /* host routing, only when a domain is set */
    parse("GET /p?q HTTP/1.1\r\nHost: 3000-sb_1.Box.Example:8443\r\n\r\n", &h);
    CHECK(ports_route(&h, "", &d) == PORTS_NOT);
    CHECK(ports_route(&h, "box.example", &d) == PORTS_HOST);
    CHECK(strcmp(d.sbx, "sb_1") == 0 && d.port == 3000);
    CHECK(d.rest.n == 2 && d.query.n == 1);
    parse("GET / HTTP/1.1\r\nHost: box.example\r\n\r\n", &h);
    CHECK(ports_route(&h, "box.example", &d) == PORTS_NOT);
    parse("GET / HTTP/1.1\r\nHost: xbox.example\r\n\r\n", &h);
    CHECK(ports_route(&h, "box.example", &d) == PORTS_NOT);
    parse("GET / HTTP/1.1\r\nHost: 99999-a.box.example\r\n\r\n", &h);
    CHECK(ports_route(&h, "box.example", &d) == -EINVAL);
    parse("GET / HTTP/1.1\r\nHost: a.box.example\r\n\r\n", &h);
    CHECK(ports_route(&h, "box.example", &d) == -EINVAL);
}

static void test_rewrite(void)
{
    char out[4096];

    CHECK(rewrite("GET /v1/sandboxes/s/ports/8/a/b?x=1&warren_token=T&y=2 HTTP/1.1\r\n"
                  "Host: h\r\nAuthorization: Bearer K\r\nX-Warren-Token: T\r\n"
                  "Cookie: a=1; warren_token=T; b=2\r\nConnection: keep-alive\r\n"
                  "Keep-Alive: 5\r\n\r\n",
                  "", "K", out, sizeof(out)) == PORTS_PATH);
    CHECK(strcmp(out, "GET /a/b?x=1&y=2 HTTP/1.1\r\nHost: h\r\nCookie: a=1; b=2\r\n"
                      "Connection: close\r\n\r\n") == 0);
    /* an Authorization that is not ours stays; an empty rest is "/"; the query goes
     * when only the token was in it; a cookie of only ours goes */
    CHECK(rewrite("POST /v1/sandboxes/s/ports/8?warren_token=T HTTP/1.1\r\n"
                  "Authorization: Basic abc\r\nCookie: warren_token=T\r\n\r\n",
                  "", "K", out, sizeof(out)) == PORTS_PATH);
    CHECK(strcmp(out, "POST / HTTP/1.1\r\nAuthorization: Basic abc\r\nConnection: close\r\n\r\n") ==
          0);
    /* an upgrade keeps Connection: Upgrade; host mode keeps the path */
    CHECK(rewrite("GET /ws?warren_token=T HTTP/1.1\r\nHost: 9-s.d\r\nConnection: Upgrade\r\n"
                  "Upgrade: websocket\r\n\r\n",
                  "d", NULL, out, sizeof(out)) == PORTS_HOST);
    CHECK(strcmp(out, "GET /ws HTTP/1.1\r\nHost: 9-s.d\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\n\r\n") == 0);
    /* the key in every spelling the API takes is stripped (once "Bearer  K" went
     * through); a wrong key and another scheme stay, the guest's own */
    {
        static const char *const ours[] = {"Bearer  K", "bearer K", "BEARER     K", "Bearer K\t",
                                           "\t Bearer K"};
        char in[256];
        for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
            snprintf(in, sizeof(in),
                     "GET /v1/sandboxes/s/ports/8/ HTTP/1.1\r\naUtHoRiZaTiOn: %s\r\n\r\n", ours[i]);
            CHECK(rewrite(in, "", "K", out, sizeof(out)) == PORTS_PATH);
            CHECK(strcmp(out, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n") == 0);
        }
        CHECK(rewrite("GET /v1/sandboxes/s/ports/8/ HTTP/1.1\r\nAuthorization: Bearer  KK\r\n\r\n",
                      "", "K", out, sizeof(out)) == PORTS_PATH);
        CHECK(strstr(out, "Authorization: Bearer  KK\r\n") != NULL);
        /* E2B's X-API-KEY holding the key, either spelling ("K" is 0x4b): stripped;
         * another value is the guest's own */
        CHECK(rewrite("GET /v1/sandboxes/s/ports/8/ HTTP/1.1\r\nX-API-KEY: K\r\n"
                      "x-api-key: e2b_4b\r\n\r\n",
                      "", "K", out, sizeof(out)) == PORTS_PATH);
        CHECK(strcmp(out, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n") == 0);
        CHECK(rewrite("GET /v1/sandboxes/s/ports/8/ HTTP/1.1\r\nX-API-KEY: e2b_4c\r\n\r\n", "", "K",
                      out, sizeof(out)) == PORTS_PATH);
        CHECK(strstr(out, "X-API-KEY: e2b_4c\r\n") != NULL);
        /* a bare warren_token or an empty one is ours too: never forwarded */
        CHECK(rewrite("GET /v1/sandboxes/s/ports/8/?warren_token&a=1 HTTP/1.1\r\n"
                      "Cookie: warren_token=; c=3\r\n\r\n",
                      "", "K", out, sizeof(out)) == PORTS_PATH);
        CHECK(strcmp(out, "GET /?a=1 HTTP/1.1\r\nCookie: c=3\r\nConnection: close\r\n\r\n") == 0);
    }
    /* E2B's traffic token is consumed by the proxy, never forwarded */
    CHECK(rewrite("GET / HTTP/1.1\r\nHost: 9-s.d\r\nE2B-Traffic-Access-Token: T\r\n\r\n", "d", NULL,
                  out, sizeof(out)) == PORTS_HOST);
    CHECK(strcmp(out, "GET / HTTP/1.1\r\nHost: 9-s.d\r\nConnection: close\r\n\r\n") == 0);
    /* path mode asks the guest for no interim answer; Host mode passes Expect on */
    CHECK(rewrite("POST /v1/sandboxes/s/ports/8/ HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", "",
                  NULL, out, sizeof(out)) == PORTS_PATH);
    CHECK(strcmp(out, "POST / HTTP/1.1\r\nConnection: close\r\n\r\n") == 0);
    CHECK(rewrite("POST / HTTP/1.1\r\nHost: 9-s.d\r\nExpect: 100-continue\r\n\r\n", "d", NULL, out,
                  sizeof(out)) == PORTS_HOST);
    CHECK(strstr(out, "Expect: 100-continue\r\n") != NULL);
    /* too small a buffer */
    CHECK(rewrite("GET /v1/sandboxes/s/ports/8/abc HTTP/1.1\r\n\r\n", "", NULL, out, 10) == -2000);
}

static void test_tokens(void)
{
    struct ports_head h;
    struct ports_dest d;
    char tok[64], url[256];

    parse("GET /v1/sandboxes/s/ports/8/?a=1&warren_token=abc HTTP/1.1\r\n"
          "Cookie: x=1; warren_token=def\r\n\r\n",
          &h);
    ports_route(&h, "", &d);
    CHECK(ports_query_token(&d, tok, sizeof(tok)) == 1 && strcmp(tok, "abc") == 0);
    CHECK(ports_cookie_token(&h, tok, sizeof(tok)) == 1 && strcmp(tok, "def") == 0);
    CHECK(ports_query_token(&d, tok, 3) == -1);
    CHECK(ports_url_without_token(&h, url, sizeof(url)) == 28);
    CHECK(memcmp(url, "/v1/sandboxes/s/ports/8/?a=1", 28) == 0);
    parse("GET /?warren_token=a&warren_token=b HTTP/1.1\r\n\r\n", &h);
    ports_route(&h, "", &d);
    d.query.p = strchr(h.target.p, '?') + 1;
    d.query.n = h.target.n - 2;
    CHECK(ports_query_token(&d, tok, sizeof(tok)) == -1);
    parse("GET /x HTTP/1.1\r\n\r\n", &h);
    CHECK(ports_cookie_token(&h, tok, sizeof(tok)) == 0);
}

/* The cookie redirect's Location stays a path of the host (once "//evil.example/..."). */
static void test_redirect_target(void)
{
    static const char *const bad[] = {
        "//evil.example/landing", "///evil.example/", "/\\evil.example/", "/a\\b", "/%09/x\\y",
        "/caf\xc3\xa9",
    };
    struct ports_head h;
    char in[256], url[256];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(in, sizeof(in), "GET %s?warren_token=T HTTP/1.1\r\nHost: 9-s.d\r\n\r\n", bad[i]);
        CHECK(parse(in, &h) > 0);
        CHECK(ports_url_without_token(&h, url, sizeof(url)) == -EINVAL);
    }
    /* encoded slashes are a path's own bytes: a browser does not read them as a host */
    CHECK(parse("GET /%2F%2Fevil/%5Cx?a=1&warren_token=T HTTP/1.1\r\nHost: 9-s.d\r\n\r\n", &h) > 0);
    CHECK(ports_url_without_token(&h, url, sizeof(url)) == 20);
    CHECK(memcmp(url, "/%2F%2Fevil/%5Cx?a=1", 20) == 0);
    CHECK(parse("GET /?warren_token=T HTTP/1.1\r\nHost: 9-s.d\r\n\r\n", &h) > 0);
    CHECK(ports_url_without_token(&h, url, sizeof(url)) == 1 && url[0] == '/');
}

static void test_maybe(void)
{
    CHECK(ports_head_maybe("GE", 2, ""));
    CHECK(ports_head_maybe("GET /v1/sand", 12, ""));
    CHECK(ports_head_maybe("GET /v1/sandboxes/abc/po", 24, NULL));
    CHECK(ports_head_maybe("GET /v1/sandboxes/abc/ports/80 HT", 33, ""));
    CHECK(!ports_head_maybe("GET /healthz", 12, ""));
    CHECK(!ports_head_maybe("GET /v1/sandboxes/abc/files", 27, ""));
    CHECK(!ports_head_maybe("GET /v1/sandboxes HTTP/1.1\r\n", 28, ""));
    CHECK(!ports_head_maybe("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 40, ""));
    CHECK(ports_head_maybe("GET /healthz", 12, "box.example"));
}

/* Routed the same whether the head comes whole or in pieces (http.c peeks at it as
 * it grows): a method longer than the parser takes is refused whole and given up on
 * in pieces; and what is forwarded has no more header lines than warrend accepts. */
static void test_limits(void)
{
    char head[8192], out[16384], m[40];
    struct ports_head h, h2;
    struct ports_dest d;
    size_t n;
    long len;

    memset(m, 'M', 33);
    m[33] = 0;
    snprintf(head, sizeof(head), "%s /v1/sandboxes/abc/ports/80/ HTTP/1.1\r\nHost: x\r\n\r\n", m);
    CHECK(parse(head, &h) == -EINVAL);
    CHECK(!ports_head_maybe(head, 40, ""));
    CHECK(parse(head + 1, &h) > 0); /* 32 bytes: taken */
    CHECK(ports_head_maybe(head + 1, 40, ""));
    for (int nh = 62; nh <= 65; nh++) {
        n = (size_t)snprintf(head, sizeof(head), "GET /v1/sandboxes/abc/ports/80/ HTTP/1.1\r\n");
        for (int i = 0; i < nh; i++)
            n += (size_t)snprintf(head + n, sizeof(head) - n, "X-H%d: v\r\n", i);
        n += (size_t)snprintf(head + n, sizeof(head) - n, "\r\n");
        if (nh > PORTS_HDRS_MAX) {
            CHECK(parse(head, &h) == -EINVAL);
            continue;
        }
        CHECK(parse(head, &h) == (int)n);
        CHECK(ports_route(&h, "", &d) == PORTS_PATH);
        len = ports_head_rewrite(&h, &d, "K", out, sizeof(out));
        if (nh == PORTS_HDRS_MAX) {
            CHECK(len == -E2BIG); /* its Connection line would make one more */
            continue;
        }
        CHECK(len > 0 && ports_head_parse(out, (size_t)len, sizeof(out), &h2) == len);
    }
}

int main(void)
{
    test_maybe();
    test_limits();
    test_parse();
    test_route();
    test_rewrite();
    test_tokens();
    test_redirect_target();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("ok\n");
    return 0;
}
