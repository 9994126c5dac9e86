/*
 * Fuzz server/connect.c's envelope reader and server/multipart.c's decoder.
 * The input is a split plan and a body: its first byte says how many split
 * lengths follow (each one byte); the rest is the body. The body is read
 * whole, under the planned splits (cycled) and one byte at a time, by both
 * decoders: the envelopes (flags and payloads), the part's bytes, the
 * result and the bytes taken must agree whatever the splits, and nothing
 * may be read or written out of bounds.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"
#include "multipart.h"

#define MAX_PAYLOAD 4096

struct out {
    int r;
    size_t taken;
    unsigned char *b; /* envelopes: flags byte, length, payload; multipart: the part */
    size_t n;
};

static void put(struct out *o, const void *p, size_t n)
{
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void run_env(const uint8_t *body, size_t n, const uint8_t *plan, size_t nplan, struct out *o)
{
    struct connect_rd r;
    size_t off = 0, k = 0;

    connect_rd_init(&r, MAX_PAYLOAD);
    o->r = CONNECT_RD_MORE;
    o->n = 0;
    while (off < n && o->r >= 0) {
        size_t piece = nplan ? (size_t)plan[k++ % nplan] + 1 : n - off;
        if (piece > n - off)
            piece = n - off;
        while (piece && o->r >= 0) {
            size_t used;
            o->r = connect_rd_feed(&r, body + off, piece, &used);
            if (used > piece || (o->r == CONNECT_RD_MORE && used != piece))
                abort();
            if (o->r == CONNECT_RD_MSG) {
                uint32_t len = r.len;
                if (len > MAX_PAYLOAD || r.buf[len] != '\0')
                    abort();
                put(o, &r.flags, 1);
                put(o, &len, sizeof(len));
                put(o, r.buf, len);
            }
            off += used;
            piece -= used;
        }
    }
    if (o->r != CONNECT_RD_MORE && o->r != CONNECT_RD_MSG && o->r != -EINVAL && o->r != -E2BIG)
        abort();
    o->taken = off;
    if (o->r >= 0 && connect_rd_idle(&r) != (r.hn == 0))
        abort();
    connect_rd_free(&r);
}

static void run_mp(const uint8_t *body, size_t n, const uint8_t *plan, size_t nplan, struct out *o)
{
    static unsigned char tmp[256 + MPART_DELIM_MAX];
    struct mpart m;
    size_t off = 0, k = 0;

    if (mpart_init(&m, "multipart/form-data; boundary=\"b-1 x\""))
        abort();
    o->r = MPART_MORE;
    o->n = 0;
    while (off < n && o->r == MPART_MORE) {
        size_t piece = nplan ? (size_t)plan[k++ % nplan] + 1 : n - off;
        if (piece > n - off)
            piece = n - off;
        while (piece && o->r == MPART_MORE) {
            size_t used, olen, step = piece > 256 ? 256 : piece;
            o->r = mpart_feed(&m, body + off, step, &used, tmp, &olen);
            if (used > step || olen > step + MPART_DELIM_MAX ||
                (o->r == MPART_MORE && used != step))
                abort();
            put(o, tmp, olen);
            off += used;
            piece -= used;
        }
    }
    if (o->r != MPART_MORE && o->r != MPART_END && o->r != -EINVAL && o->r != -E2BIG)
        abort();
    o->taken = off;
}

static void same(const struct out *a, const struct out *b, bool taken)
{
    if (a->r != b->r || a->n != b->n || memcmp(a->b, b->b, a->n) || (taken && a->taken != b->taken))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t one[1] = {0};
    struct out w, s, o;
    size_t np;

    if (size < 1)
        return 0;
    np = data[0] % 16;
    if (size < 1 + np)
        return 0;
    const uint8_t *plan = data + 1, *body = data + 1 + np;
    size_t n = size - 1 - np, cap = 2 * n + 16 * (n / CONNECT_HDR + 1) + 64;

    w.b = malloc(cap);
    s.b = malloc(cap);
    o.b = malloc(cap);
    if (!w.b || !s.b || !o.b)
        abort();
    run_env(body, n, NULL, 0, &w);
    run_env(body, n, plan, np, &s);
    run_env(body, n, one, 1, &o);
    /* an error may be met at a different byte only as the reader fails where it is */
    same(&w, &s, w.r >= 0);
    same(&w, &o, w.r >= 0);
    run_mp(body, n, NULL, 0, &w);
    run_mp(body, n, plan, np, &s);
    run_mp(body, n, one, 1, &o);
    same(&w, &s, w.r >= 0);
    same(&w, &o, w.r >= 0);
    free(w.b);
    free(s.b);
    free(o.b);
    return 0;
}
