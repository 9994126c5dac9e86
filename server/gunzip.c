/*
 * gunzip.c - see gunzip.h.
 */
#include "gunzip.h"

#include <errno.h>
#include <string.h>

#define GZ_WBITS (16 + MAX_WBITS) /* gzip framing only, the largest window */

int gunzip_init(struct gunzip *g, uint64_t max)
{
    memset(g, 0, sizeof(*g));
    g->max = max;
    if (inflateInit2(&g->z, GZ_WBITS) != Z_OK)
        return -ENOMEM;
    g->live = true;
    return 0;
}

int gunzip_feed(struct gunzip *g, const unsigned char *in, size_t n, size_t *used,
                unsigned char *out, size_t cap, size_t *olen)
{
    *used = *olen = 0;
    if (g->err)
        return g->err;
    if (!g->live)
        return g->err = -EINVAL;
    /* zlib counts in uInt: take at most that much at a time */
    if (n > UINT32_MAX)
        n = UINT32_MAX;
    if (cap > UINT32_MAX)
        cap = UINT32_MAX;
    /* never let it make more than the cap allows, plus one byte to tell "over" */
    if ((uint64_t)cap > g->max - g->out)
        cap = (size_t)(g->max - g->out) + 1;
    while (*olen < cap && (*used < n || !g->ended)) {
        int r;
        size_t took, made;

        if (g->ended) {
            /* another member follows the one that ended */
            if (inflateReset(&g->z) != Z_OK)
                return g->err = -EINVAL;
            g->ended = false;
        }
        g->z.next_in = (Bytef *)(uintptr_t)(in + *used);
        g->z.avail_in = (uInt)(n - *used);
        g->z.next_out = out + *olen;
        g->z.avail_out = (uInt)(cap - *olen);
        r = inflate(&g->z, Z_NO_FLUSH);
        took = (n - *used) - g->z.avail_in;
        made = (cap - *olen) - g->z.avail_out;
        *used += took;
        *olen += made;
        g->out += made;
        if (g->out > g->max) {
            *olen -= (size_t)(g->out - g->max);
            g->out = g->max;
            return g->err = -EFBIG;
        }
        if (r == Z_STREAM_END) {
            g->ended = true;
            continue;
        }
        if (r == Z_BUF_ERROR || (r == Z_OK && !took && !made))
            break; /* needs more input (or more room) */
        if (r != Z_OK)
            return g->err = -EINVAL; /* Z_DATA_ERROR, Z_NEED_DICT, Z_MEM_ERROR */
    }
    return 0;
}

int gunzip_finish(const struct gunzip *g)
{
    if (g->err)
        return g->err;
    return g->ended ? 0 : -EINVAL;
}

void gunzip_free(struct gunzip *g)
{
    if (g->live)
        inflateEnd(&g->z);
    g->live = false;
}
