/*
 * Unit test of server/chunked.c: bodies decode to the same bytes whatever
 * the split of their framing, and every framing error a smuggler could
 * lean on is refused.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunked.h"

int failures;
#include "check.h"

/* Decode s fed in pieces of `step` bytes. Returns the result; out gets the data, *rest the
 * bytes after the body. */
static int decode(const char *s, size_t n, size_t step, char *out, size_t *olen, size_t *rest)
{
    struct chunked c;
    size_t off = 0;
    int r = CHUNKED_MORE;

    chunked_init(&c);
    *olen = 0;
    *rest = 0;
    while (off < n) {
        size_t piece = n - off < step ? n - off : step, used, doff, dlen;
        const unsigned char *p = (const unsigned char *)s + off;
        while (piece) {
            r = chunked_decode(&c, p, piece, &used, &doff, &dlen);
            if (r < 0)
                return r;
            CHECK(used <= piece && doff + dlen <= used);
            memcpy(out + *olen, p + doff, dlen);
            *olen += dlen;
            p += used;
            piece -= used;
            off += used;
            if (r == CHUNKED_DONE) {
                *rest = n - off;
                CHECK(c.total == *olen);
                return r;
            }
            if (!used)
                return -999; /* no progress: a bug */
        }
    }
    return r;
}

static void ok_body(const char *wire, const char *want, size_t want_rest)
{
    char out[4096];
    size_t olen, rest, n = strlen(wire);

    for (size_t step = 1; step <= n; step++) {
        int r = decode(wire, n, step, out, &olen, &rest);
        if (r != CHUNKED_DONE || olen != strlen(want) || memcmp(out, want, olen) ||
            rest != want_rest) {
            fprintf(stderr, "step %zu: '%s' -> r %d, '%.*s', rest %zu\n", step, wire, r, (int)olen,
                    out, rest);
            failures++;
            return;
        }
    }
}

static void bad_body(const char *wire, int want)
{
    char out[1 << 16];
    size_t olen, rest, n = strlen(wire);

    for (size_t step = 1; step <= n; step++) {
        int r = decode(wire, n, step, out, &olen, &rest);
        if (r != want) {
            fprintf(stderr, "step %zu: '%s' -> %d, want %d\n", step, wire, r, want);
            failures++;
            return;
        }
    }
}

int main(void)
{
    char big[8000];

    ok_body("0\r\n\r\n", "", 0);
    ok_body("5\r\nhello\r\n0\r\n\r\n", "hello", 0);
    ok_body("5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", "hello world", 0);
    ok_body("A\r\n0123456789\r\n0\r\n\r\n", "0123456789", 0);
    ok_body("a;name=value\r\n0123456789\r\n0;x\r\n\r\n", "0123456789", 0);
    ok_body("3 ;ext\r\nabc\r\n0\r\n\r\n", "abc", 0);
    ok_body("003\r\nabc\r\n000\r\n\r\n", "abc", 0);
    ok_body("2\r\nhi\r\n0\r\nX-Trailer: 1\r\nY: 2\r\n\r\n", "hi", 0);
    ok_body("2\r\n\r\n\r\n0\r\n\r\n", "\r\n", 0);
    ok_body("2\r\nhi\r\n0\r\n\r\nGET / HTTP/1.1\r\n", "hi", 16); /* pipelined: not body */

    /* Framing errors: bare LF, missing CRLF after data, junk in the size, signs, spaces
     * before the size, blanks then no extension, an empty size, control bytes. */
    bad_body("5\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("5\r\nhelloX\r\n0\r\n\r\n", -EINVAL);
    bad_body("5\r\nhello\r0\r\n\r\n", -EINVAL);
    bad_body("5x\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("+5\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("-5\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body(" 5\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("5 \r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("0x5\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("5;a\nb\r\nhello\r\n0\r\n\r\n", -EINVAL);
    bad_body("0\r\nX: 1\n\r\n", -EINVAL);
    bad_body("0\r\n\rX", -EINVAL);
    /* Sizes that overflow, and lines or trailers past their caps. */
    bad_body("10000000000000000\r\n", -E2BIG);
    bad_body("ffffffffffffffffff\r\n", -E2BIG);
    memset(big, 'a', sizeof(big));
    memcpy(big, "1;", 2);
    big[sizeof(big) - 1] = '\0';
    bad_body(big, -E2BIG);
    memcpy(big, "0\r\nX:", 5);
    bad_body(big, -E2BIG);
    {
        /* Many short trailer lines: the total is capped too. */
        char t[3 * CHUNKED_TRAILER_MAX];
        size_t n = 0;
        n += (size_t)sprintf(t, "0\r\n");
        while (n + 8 < sizeof(t))
            n += (size_t)sprintf(t + n, "X: 1\r\n");
        bad_body(t, -E2BIG);
    }
    /* After DONE or an error, nothing more is consumed. */
    {
        struct chunked c;
        size_t used, doff, dlen;
        chunked_init(&c);
        CHECK(chunked_decode(&c, (const unsigned char *)"0\r\n\r\nxyz", 8, &used, &doff, &dlen) ==
                  CHUNKED_DONE &&
              used == 5);
        CHECK(chunked_decode(&c, (const unsigned char *)"xyz", 3, &used, &doff, &dlen) ==
                  CHUNKED_DONE &&
              used == 0);
        chunked_init(&c);
        CHECK(chunked_decode(&c, (const unsigned char *)"z", 1, &used, &doff, &dlen) == -EINVAL);
        CHECK(chunked_decode(&c, (const unsigned char *)"0", 1, &used, &doff, &dlen) == -EINVAL &&
              used == 0);
    }
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    else
        printf("chunked: all checks passed\n");
    return failures ? 1 : 0;
}
