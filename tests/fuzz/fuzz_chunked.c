/*
 * Fuzz server/chunked.c. The input is a split plan and a body: its first
 * byte says how many split lengths follow (each one byte); the rest is the
 * raw body. The body is decoded whole, then under the planned splits
 * (cycled), then one byte at a time: the data, the result, the bytes
 * consumed and the decoded total must agree, and every span must lie within
 * what was consumed.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunked.h"

struct run {
    int r;
    size_t consumed;
    uint64_t total;
    unsigned char *out;
    size_t olen;
};

static void run(const uint8_t *body, size_t n, const uint8_t *plan, size_t nplan, struct run *o)
{
    struct chunked c;
    size_t off = 0, k = 0;

    chunked_init(&c);
    o->r = CHUNKED_MORE;
    o->olen = 0;
    while (off < n && o->r == CHUNKED_MORE) {
        size_t piece = nplan ? (size_t)plan[k++ % nplan] + 1 : n - off;
        if (piece > n - off)
            piece = n - off;
        while (piece) {
            size_t used, doff, dlen;
            o->r = chunked_decode(&c, body + off, piece, &used, &doff, &dlen);
            if (used > piece || doff + dlen > used || (o->r == CHUNKED_MORE && !used))
                abort();
            memcpy(o->out + o->olen, body + off + doff, dlen);
            o->olen += dlen;
            off += used;
            piece -= used;
            if (o->r != CHUNKED_MORE)
                break;
        }
    }
    if (o->r != CHUNKED_MORE && o->r != CHUNKED_DONE && o->r != -EINVAL && o->r != -E2BIG)
        abort();
    /* Errors may be found at different bytes only if nothing after them matters. */
    o->consumed = off;
    o->total = c.total;
    if (o->total != o->olen)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t one[1] = {0};
    struct run a, b, c;
    size_t nplan;

    if (size < 1)
        return 0;
    nplan = data[0] % 32;
    if (nplan + 1 > size)
        return 0;
    const uint8_t *plan = data + 1, *body = data + 1 + nplan;
    size_t n = size - 1 - nplan;

    a.out = malloc(n + 1);
    b.out = malloc(n + 1);
    c.out = malloc(n + 1);
    run(body, n, NULL, 0, &a);
    run(body, n, plan, nplan, &b);
    run(body, n, one, 1, &c);
    if (a.r != b.r || a.r != c.r)
        abort();
    if (a.r != -EINVAL && a.r != -E2BIG) {
        if (a.consumed != b.consumed || a.consumed != c.consumed)
            abort();
    }
    if (a.r == CHUNKED_DONE || a.r == CHUNKED_MORE) {
        if (a.olen != b.olen || a.olen != c.olen || memcmp(a.out, b.out, a.olen) ||
            memcmp(a.out, c.out, a.olen))
            abort();
    }
    free(a.out);
    free(b.out);
    free(c.out);
    return 0;
}
