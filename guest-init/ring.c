/*
 * ring.c - a background process's output ring (see ring.h).
 */
#include "ring.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static size_t wrap(const struct gi_ring *r, size_t i)
{
    return i >= r->alloc ? i - r->alloc : i;
}

static void hdr_get(const struct gi_ring *r, size_t at, int *fd, size_t *len)
{
    *fd = r->buf[at];
    *len = (size_t)r->buf[wrap(r, at + 1)] << 8 | r->buf[wrap(r, at + 2)];
}

static void hdr_put(struct gi_ring *r, size_t at, int fd, size_t len)
{
    r->buf[at] = (uint8_t)fd;
    r->buf[wrap(r, at + 1)] = (uint8_t)(len >> 8);
    r->buf[wrap(r, at + 2)] = (uint8_t)len;
}

/* Copy n bytes in or out at circular index at. */
static void copy_in(struct gi_ring *r, size_t at, const uint8_t *p, size_t n)
{
    size_t first = r->alloc - at < n ? r->alloc - at : n;

    memcpy(r->buf + at, p, first);
    memcpy(r->buf, p + first, n - first);
}

static void copy_out(const struct gi_ring *r, size_t at, uint8_t *p, size_t n)
{
    size_t first = r->alloc - at < n ? r->alloc - at : n;

    memcpy(p, r->buf + at, first);
    memcpy(p + first, r->buf, n - first);
}

int gi_ring_init(struct gi_ring *r, uint64_t cap)
{
    memset(r, 0, sizeof(*r));
    if (cap < GI_RING_MIN)
        cap = GI_RING_MIN;
    if (cap > GI_RING_MAX)
        cap = GI_RING_MAX;
    r->cap = (size_t)cap;
    r->alloc = r->cap < GI_RING_FIRST ? r->cap : GI_RING_FIRST;
    r->buf = malloc(r->alloc);
    return r->buf ? 0 : -ENOMEM;
}

void gi_ring_free(struct gi_ring *r)
{
    free(r->buf);
    r->buf = NULL;
    r->alloc = r->used = 0;
}

/* Grow the buffer towards cap so it has room for need more bytes; false if it cannot. */
static bool grow(struct gi_ring *r, size_t need)
{
    size_t n = r->alloc;
    uint8_t *nb;

    while (n < r->cap && n - r->used < need)
        n = n * 2 > r->cap ? r->cap : n * 2;
    if (n == r->alloc)
        return false;
    nb = malloc(n);
    if (!nb) {
        r->cap = r->alloc; /* keep what we have: the ring just stays smaller */
        return false;
    }
    copy_out(r, r->head, nb, r->used);
    r->last = r->last >= r->head ? r->last - r->head : r->last + r->alloc - r->head;
    free(r->buf);
    r->buf = nb;
    r->alloc = n;
    r->head = 0;
    return true;
}

/* Drop up to k of the oldest stored bytes: a whole chunk, or the front of its data. */
static void evict(struct gi_ring *r, size_t k)
{
    size_t len;
    int fd;

    hdr_get(r, r->head, &fd, &len);
    if (k >= len) {
        r->head = wrap(r, r->head + GI_RING_HDR + len);
        r->used -= GI_RING_HDR + len;
        r->start += len;
        return;
    }
    /* The header moves over the dropped bytes. */
    if (r->last == r->head)
        r->last = wrap(r, r->head + k);
    r->head = wrap(r, r->head + k);
    r->used -= k;
    r->start += k;
    hdr_put(r, r->head, fd, len - k);
}

void gi_ring_write(struct gi_ring *r, int fd, const void *p, size_t n)
{
    const uint8_t *src = p;
    size_t room = r->cap - GI_RING_HDR;

    if (n > room) {
        /* Only the tail can survive: everything stored and the skipped head go. */
        size_t skip = n - room;
        r->head = r->used = 0;
        r->end += skip;
        r->start = r->end;
        src += skip;
        n = room;
    }
    while (n > 0) {
        bool merge;
        size_t lastlen = 0, take, need;
        int lastfd = 0;

        for (;;) {
            if (r->used > 0)
                hdr_get(r, r->last, &lastfd, &lastlen);
            merge = r->used > 0 && lastfd == fd && lastlen < GI_RING_CHUNK_MAX;
            take = merge ? GI_RING_CHUNK_MAX - lastlen : GI_RING_CHUNK_MAX;
            take = take < n ? take : n;
            room = r->cap - GI_RING_HDR; /* cap shrinks if growing failed */
            take = take < room ? take : room;
            need = take + (merge ? 0 : GI_RING_HDR);
            if (r->alloc - r->used >= need)
                break;
            if (!grow(r, need))
                evict(r, need - (r->alloc - r->used));
            if (r->used == 0)
                r->head = 0;
        }
        if (merge) {
            copy_in(r, wrap(r, r->last + GI_RING_HDR + lastlen), src, take);
            hdr_put(r, r->last, fd, lastlen + take);
        } else {
            r->last = wrap(r, r->head + r->used);
            hdr_put(r, r->last, fd, take);
            copy_in(r, wrap(r, r->last + GI_RING_HDR), src, take);
        }
        r->used += need;
        r->end += take;
        src += take;
        n -= take;
    }
}

size_t gi_ring_read(const struct gi_ring *r, uint64_t off, void *dst, size_t max, int *fd)
{
    size_t at = r->head, left = r->used;
    uint64_t o = r->start;

    if (off < r->start || off >= r->end)
        return 0;
    while (left > 0) {
        size_t len;
        int f;

        hdr_get(r, at, &f, &len);
        if (off < o + len) {
            size_t skip = (size_t)(off - o), n = len - skip;
            n = n < max ? n : max;
            copy_out(r, wrap(r, at + GI_RING_HDR + skip), dst, n);
            *fd = f;
            return n;
        }
        o += len;
        at = wrap(r, at + GI_RING_HDR + len);
        left -= GI_RING_HDR + len;
    }
    return 0;
}
