/*
 * Unit test of server/gunzip.c: gzip bodies inflate to the same bytes
 * whatever the split of their input and however small the output room;
 * members one after another are one stream; a body that inflates past the
 * cap stops at it with -EFBIG; corrupt, truncated, zlib-framed and empty
 * bodies are refused.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "gunzip.h"

int failures;
#include "check.h"

/* data gzip-compressed into out (room cap): its length. */
static size_t gz(const unsigned char *data, size_t n, unsigned char *out, size_t cap, int level)
{
    z_stream z;
    size_t len;

    memset(&z, 0, sizeof(z));
    CHECK(deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK);
    z.next_in = (Bytef *)(uintptr_t)data;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END);
    len = cap - z.avail_out;
    deflateEnd(&z);
    return len;
}

/* Inflate in[0..n) fed step bytes at a time with room bytes of output: the feed's result
 * (first error, else gunzip_finish's); the bytes made in out, their count in *olen. */
static int inflate_all(const unsigned char *in, size_t n, size_t step, size_t room, uint64_t max,
                       unsigned char *out, size_t *olen)
{
    struct gunzip g;
    size_t off = 0;
    unsigned char *buf = malloc(room);
    int r = 0;

    CHECK(buf && gunzip_init(&g, max) == 0);
    *olen = 0;
    do {
        size_t piece = n - off < step ? n - off : step, used, made;
        const unsigned char *p = in + off;
        do {
            r = gunzip_feed(&g, p, piece, &used, buf, room, &made);
            CHECK(used <= piece && made <= room);
            memcpy(out + *olen, buf, made);
            *olen += made;
            p += used;
            piece -= used;
            off += used;
            if (r < 0)
                goto out;
        } while (piece || made == room);
    } while (off < n);
    r = gunzip_finish(&g);
out:
    gunzip_free(&g);
    free(buf);
    return r;
}

int main(void)
{
    enum { N = 200000 };
    unsigned char *data = malloc(N), *z1 = malloc(2 * N), *out = malloc(4 * N);
    size_t zn, zn2, olen;
    static const size_t steps[] = {1, 7, 4096, 2 * N}, rooms[] = {1, 13, 65536};

    srand(7);
    for (size_t i = 0; i < N; i++) /* half random, half runs: both paths of deflate */
        data[i] = i < N / 2 ? (unsigned char)rand() : (unsigned char)(i / 1000);
    zn = gz(data, N, z1, 2 * N, 6);

    for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++)
        for (size_t o = 0; o < sizeof(rooms) / sizeof(rooms[0]); o++) {
            if (steps[s] == 1 && rooms[o] == 1)
                continue; /* slow, and covered by its neighbours */
            CHECK(inflate_all(z1, zn, steps[s], rooms[o], N, out, &olen) == 0);
            CHECK(olen == N && !memcmp(out, data, N));
        }

    /* two members are one stream */
    zn2 = gz(data, 1000, z1 + zn, 2 * N - zn, 9);
    CHECK(inflate_all(z1, zn + zn2, 4096, 65536, N + 1000, out, &olen) == 0);
    CHECK(olen == N + 1000 && !memcmp(out + N, data, 1000));

    /* exactly the cap is allowed; one byte more is -EFBIG, stopped at the cap */
    CHECK(inflate_all(z1, zn, 4096, 65536, N, out, &olen) == 0 && olen == N);
    CHECK(inflate_all(z1, zn, 4096, 65536, N - 1, out, &olen) == -EFBIG && olen == N - 1);
    {
        /* a bomb: 4 MB of zeros in a few KB stops at a 64 KiB cap */
        size_t big = 4 << 20, bn;
        unsigned char *zeros = calloc(1, big), *bz = malloc(big);
        bn = gz(zeros, big, bz, big, 9);
        CHECK(bn < 8192);
        CHECK(inflate_all(bz, bn, bn, 4096, 65536, out, &olen) == -EFBIG && olen == 65536);
        free(zeros);
        free(bz);
    }

    /* truncated: every cut short of the end */
    CHECK(inflate_all(z1, zn - 1, 4096, 65536, N, out, &olen) == -EINVAL);
    CHECK(inflate_all(z1, 10, 4096, 65536, N, out, &olen) == -EINVAL);
    /* empty */
    CHECK(inflate_all(z1, 0, 4096, 65536, N, out, &olen) == -EINVAL);
    /* a corrupt byte in the deflate data, or the CRC */
    {
        unsigned char *c = malloc(zn);
        memcpy(c, z1, zn);
        c[zn / 2] ^= 0x55;
        CHECK(inflate_all(c, zn, 4096, 65536, N, out, &olen) == -EINVAL);
        memcpy(c, z1, zn);
        c[zn - 6] ^= 1; /* the CRC32 in the trailer */
        CHECK(inflate_all(c, zn, 4096, 65536, N, out, &olen) == -EINVAL);
        free(c);
    }
    /* garbage after a member, and plain bytes */
    memcpy(z1 + zn, "garbage!", 8);
    CHECK(inflate_all(z1, zn + 8, 4096, 65536, N, out, &olen) == -EINVAL);
    CHECK(inflate_all((const unsigned char *)"not gzip at all", 15, 4, 65536, N, out, &olen) ==
          -EINVAL);
    {
        /* zlib framing (RFC 1950) is not gzip */
        unsigned char zl[64];
        uLongf zlen = sizeof(zl);
        CHECK(compress(zl, &zlen, (const Bytef *)"hello", 5) == Z_OK);
        CHECK(inflate_all(zl, zlen, 4096, 65536, N, out, &olen) == -EINVAL);
    }
    free(data);
    free(z1);
    free(out);
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures != 0;
}
