/*
 * gunzip.h - a streaming gzip inflater (RFC 1952, over zlib) whose output is
 * bounded: the bytes it has made may never pass a cap, so a small body that
 * would inflate without end (a "gzip bomb") fails as soon as it crosses it,
 * with no more memory than zlib's own state and the caller's output room.
 *
 * Members written one after another are one stream (RFC 1952 2.2); anything
 * that is not a gzip member (a zlib or raw deflate stream, garbage after a
 * member) is corrupt. Pure, no I/O; errors are sticky.
 */
#ifndef WARREN_GUNZIP_H
#define WARREN_GUNZIP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zlib.h>

struct gunzip {
    z_stream z;
    bool live;    /* z is initialised */
    bool ended;   /* the last member read so far is complete */
    int err;      /* sticky: 0, -EINVAL, -EFBIG */
    uint64_t out; /* bytes made so far */
    uint64_t max; /* the cap on them */
};

/* 0, or -ENOMEM. max: the bytes it may make, in all. */
int gunzip_init(struct gunzip *g, uint64_t max);
/*
 * Inflate from in[0..n) into out (cap bytes): *used input bytes taken, *olen made.
 * 0 when it made progress or needs more input: call again with the rest while
 * *used < n, or while *olen == cap (zlib may hold more output). -EINVAL for a body
 * that is not gzip, -EFBIG when the output would pass max (what was made up to the
 * cap is in out).
 */
int gunzip_feed(struct gunzip *g, const unsigned char *in, size_t n, size_t *used,
                unsigned char *out, size_t cap, size_t *olen);
/* The body is over: 0 when it ended on a complete member, -EINVAL when truncated
 * (or empty), or the sticky error. */
int gunzip_finish(const struct gunzip *g);
void gunzip_free(struct gunzip *g);

#endif
