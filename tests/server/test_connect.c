/*
 * Unit test of server/connect.c and server/multipart.c: envelopes and
 * multipart bodies decode the same under every split of their bytes; bad
 * flags, oversized payloads, malformed boundaries and truncated or extra
 * parts are refused.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"
#include "multipart.h"

int failures;
#include "check.h"

/* Feed b[0..n) in pieces cut at a and c (a <= c); collect every payload, "|"-joined,
 * into out. The last result. */
static int rd_split(const unsigned char *b, size_t n, size_t a, size_t c, size_t max, char *out,
                    unsigned *flags_seen)
{
    struct connect_rd r;
    size_t cuts[3] = {a, c, n}, off = 0;
    int rc = CONNECT_RD_MORE;

    connect_rd_init(&r, max);
    out[0] = '\0';
    *flags_seen = 0;
    for (int i = 0; i < 3 && rc >= 0; i++) {
        while (off < cuts[i]) {
            size_t used;
            rc = connect_rd_feed(&r, b + off, cuts[i] - off, &used);
            off += used;
            if (rc < 0)
                break;
            if (rc == CONNECT_RD_MSG) {
                strcat(out, (char *)r.buf);
                strcat(out, "|");
                *flags_seen |= r.flags;
            }
        }
    }
    if (rc >= 0 && !connect_rd_idle(&r))
        rc = 99; /* ended mid-envelope */
    connect_rd_free(&r);
    return rc;
}

static size_t env(unsigned char *o, unsigned flags, const char *s)
{
    connect_env_head(o, flags, (uint32_t)strlen(s));
    memcpy(o + CONNECT_HDR, s, strlen(s));
    return CONNECT_HDR + strlen(s);
}

static void test_envelopes(void)
{
    unsigned char b[256];
    size_t n = 0;
    char out[512];
    unsigned fl;

    n += env(b + n, 0, "{\"a\":1}");
    n += env(b + n, 0, "");
    n += env(b + n, CONNECT_FLAG_END, "{}");
    for (size_t a = 0; a <= n; a++) {
        for (size_t c = a; c <= n; c++) {
            int rc = rd_split(b, n, a, c, 64, out, &fl);
            CHECK(rc == CONNECT_RD_MSG || rc == CONNECT_RD_MORE);
            CHECK(strcmp(out, "{\"a\":1}||{}|") == 0);
            CHECK(fl == CONNECT_FLAG_END);
        }
    }
    /* cut short: the reader says it is mid-envelope */
    for (size_t cut = 1; cut < CONNECT_HDR + 7; cut++)
        CHECK(rd_split(b, cut, 0, cut, 64, out, &fl) == 99);
    /* too long for max */
    CHECK(rd_split(b, n, 0, 0, 6, out, &fl) == -E2BIG);
    /* compressed, or an unknown flag */
    n = env(b, CONNECT_FLAG_COMPRESSED, "x");
    CHECK(rd_split(b, n, 0, 0, 64, out, &fl) == -EINVAL);
    n = env(b, 0x80, "x");
    CHECK(rd_split(b, n, 0, 0, 64, out, &fl) == -EINVAL);
    /* a 4 GiB length is refused from its head alone */
    memcpy(b, "\0\xff\xff\xff\xff", 5);
    CHECK(rd_split(b, 5, 0, 0, 1 << 20, out, &fl) == -E2BIG);
    /* errors stick */
    {
        struct connect_rd r;
        size_t used;
        connect_rd_init(&r, 8);
        CHECK(connect_rd_feed(&r, (const unsigned char *)"\x01\0\0\0\0", 5, &used) == -EINVAL);
        CHECK(connect_rd_feed(&r, (const unsigned char *)"\0\0\0\0\0", 5, &used) == -EINVAL);
        connect_rd_free(&r);
    }
    connect_env_head(b, 2, 0x01020304);
    CHECK(memcmp(b, "\x02\x01\x02\x03\x04", 5) == 0);
}

static void test_codes(void)
{
    uint64_t ms = 0;

    CHECK(strcmp(connect_code_name(CONNECT_DEADLINE_EXCEEDED), "deadline_exceeded") == 0);
    CHECK(connect_code_status(CONNECT_NOT_FOUND) == 404);
    CHECK(connect_code_status(CONNECT_UNAUTHENTICATED) == 401);
    CHECK(connect_code_status(CONNECT_UNIMPLEMENTED) == 501);
    CHECK(connect_code_status(CONNECT_DEADLINE_EXCEEDED) == 504);
    CHECK(connect_code_status(CONNECT_RESOURCE_EXHAUSTED) == 429);
    CHECK(strcmp(connect_code_name((enum connect_code)999), "unknown") == 0);
    for (int c = 0; c < CONNECT__COUNT; c++)
        CHECK(connect_code_name((enum connect_code)c) && connect_code_status((enum connect_code)c));
    CHECK(connect_timeout_parse("60000", 5, &ms) == 0 && ms == 60000);
    CHECK(connect_timeout_parse("0", 1, &ms) == 0 && ms == 0);
    CHECK(connect_timeout_parse("9999999999", 10, &ms) == 0 && ms == 9999999999ull);
    CHECK(connect_timeout_parse("10000000000", 11, &ms) == -EINVAL);
    CHECK(connect_timeout_parse("", 0, &ms) == -EINVAL);
    CHECK(connect_timeout_parse("-1", 2, &ms) == -EINVAL);
    CHECK(connect_timeout_parse("1 ", 2, &ms) == -EINVAL);
}

/* Decode body under cuts at a and c; the part's bytes in out (*on). The last result. */
static int mp_split(const char *ct, const char *body, size_t n, size_t a, size_t c,
                    unsigned char *out, size_t *on)
{
    struct mpart m;
    size_t cuts[3] = {a, c, n}, off = 0;
    unsigned char tmp[512 + MPART_DELIM_MAX];
    int rc = MPART_MORE;

    *on = 0;
    if (mpart_init(&m, ct))
        return -100;
    for (int i = 0; i < 3 && rc == MPART_MORE; i++) {
        while (off < cuts[i] && rc == MPART_MORE) {
            size_t used, ol;
            rc = mpart_feed(&m, (const unsigned char *)body + off, cuts[i] - off, &used, tmp, &ol);
            memcpy(out + *on, tmp, ol);
            *on += ol;
            off += used;
        }
    }
    return rc;
}

static void test_multipart(void)
{
    static const char ct[] = "multipart/form-data; boundary=----x\r";
    const char *ctq = "multipart/form-data; charset=utf-8; boundary=\"ab cd\"";
    /* data that holds near-delimiters: "\r\n------", "\r\n--" and "\r\r\n------y" */
    static const char data[] = "line\r\n\r\n------y\r\n--\r\r\n------ end";
    char body[512];
    unsigned char out[600];
    size_t on, n;
    struct mpart m;

    CHECK(mpart_init(&m, "multipart/form-data; boundary=----x") == 0);
    CHECK(strcmp(m.delim, "\r\n------x") == 0);
    CHECK(mpart_init(&m, ctq) == 0 && strcmp(m.delim, "\r\n--ab cd") == 0);
    CHECK(mpart_init(&m, "application/octet-stream") == -EINVAL);
    CHECK(mpart_init(&m, "multipart/form-data") == -EINVAL);
    CHECK(mpart_init(&m, "multipart/form-data; boundary=") == -EINVAL);
    CHECK(mpart_init(&m, "multipart/form-data; boundary=a\x01") == -EINVAL);
    CHECK(mpart_init(&m, "multipart/form-data; boundary=\"abc") == -EINVAL);
    CHECK(mpart_init(&m, NULL) == -EINVAL);
    {
        char longb[200] = "multipart/form-data; boundary=";
        memset(longb + strlen(longb), 'b', 71);
        CHECK(mpart_init(&m, longb) == -EINVAL);
    }
    (void)ct;

    n = (size_t)snprintf(body, sizeof(body),
                         "------x\r\nContent-Disposition: form-data; name=\"file\"; "
                         "filename=\"/tmp/a.txt\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                         "%s\r\n------x--\r\n",
                         data);
    for (size_t a = 0; a <= n; a++) {
        for (size_t c = a; c <= n; c += 3) {
            int rc = mp_split("multipart/form-data; boundary=----x", body, n, a, c, out, &on);
            CHECK(rc == MPART_END);
            CHECK(on == strlen(data) && memcmp(out, data, on) == 0);
        }
    }
    mpart_init(&m, "multipart/form-data; boundary=----x");
    {
        size_t used, ol;
        CHECK(mpart_feed(&m, (const unsigned char *)body, n, &used, out, &ol) == MPART_END);
        CHECK(strcmp(m.filename, "/tmp/a.txt") == 0);
    }
    /* data with NUL bytes, arriving with the headers */
    {
        static const char nul[] = "--ab cd\r\n\r\na\0b\r\n--ab cd--";
        CHECK(mp_split(ctq, nul, sizeof(nul) - 1, sizeof(nul) - 1, sizeof(nul) - 1, out, &on) ==
                  MPART_END &&
              on == 3 && memcmp(out, "a\0b", 3) == 0);
    }
    /* an empty part */
    n = (size_t)snprintf(body, sizeof(body), "--ab cd\r\nX: y\r\n\r\n\r\n--ab cd--");
    CHECK(mp_split(ctq, body, n, 3, 20, out, &on) == MPART_END && on == 0);
    /* not closed: more wanted */
    n = (size_t)snprintf(body, sizeof(body), "--ab cd\r\n\r\nabc\r\n--ab c");
    CHECK(mp_split(ctq, body, n, 1, 2, out, &on) == MPART_MORE && on == 3);
    /* a second part */
    n = (size_t)snprintf(body, sizeof(body), "--ab cd\r\n\r\nabc\r\n--ab cd\r\n\r\nx");
    CHECK(mp_split(ctq, body, n, 0, 0, out, &on) == -EINVAL);
    /* a preamble, or another boundary */
    n = (size_t)snprintf(body, sizeof(body), "hello\r\n--ab cd\r\n\r\nabc\r\n--ab cd--");
    CHECK(mp_split(ctq, body, n, 0, 0, out, &on) == -EINVAL);
    n = (size_t)snprintf(body, sizeof(body), "--zz\r\n\r\nabc\r\n--zz--");
    CHECK(mp_split(ctq, body, n, 0, 0, out, &on) == -EINVAL);
    /* a header line without a colon */
    n = (size_t)snprintf(body, sizeof(body), "--ab cd\r\nbogus\r\n\r\nabc\r\n--ab cd--");
    CHECK(mp_split(ctq, body, n, 0, 0, out, &on) == -EINVAL);
    /* headers that never end */
    {
        static char big[MPART_HEAD_MAX + 64];
        memset(big, 'h', sizeof(big));
        memcpy(big, "--ab cd\r\nA: ", 12);
        CHECK(mp_split(ctq, big, sizeof(big), 100, 200, out, &on) == -E2BIG);
    }
}

int main(void)
{
    test_envelopes();
    test_codes();
    test_multipart();
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
