/*
 * ring.h - the output ring of a background process: the last `cap` bytes of
 * its output (stdout and stderr interleaved in the order read), each byte
 * with the fd it came from, addressed by absolute offsets counted from the
 * process's first output byte.
 *
 * Storage is one circular byte buffer of at most cap bytes holding chunks:
 * a 3-byte header (fd, length big-endian) then the data. Consecutive writes
 * of the same fd extend the last chunk, so a PTY writing one byte at a time
 * costs 3 bytes per 64 KiB, not per byte. The header bytes count in cap:
 * memory is bounded by cap plus this struct, whatever the writes look like.
 * When room is needed the oldest bytes go, byte by byte (a chunk is cut
 * from its front), so `start` is exact and a reader that fell behind is
 * told exactly how many bytes it lost (start - its position).
 *
 * The buffer starts small and doubles up to cap, so an idle process does
 * not cost a whole ring. Pure: no I/O, no globals; tests/guest-init/test_ring.c.
 *
 * Ownership: the ring owns buf; gi_ring_free() releases it.
 */
#ifndef WARREN_GI_RING_H
#define WARREN_GI_RING_H

#include <stddef.h>
#include <stdint.h>

#define GI_RING_HDR       3
#define GI_RING_CHUNK_MAX 65535u /* data bytes of one chunk (16-bit length) */
#define GI_RING_MIN       4096u  /* cap is clamped to GI_RING_MIN..GI_RING_MAX */
#define GI_RING_MAX       (64u << 20)
#define GI_RING_FIRST     16384u /* first allocation */

struct gi_ring {
    uint8_t *buf;
    size_t cap;     /* most bytes the buffer may take (headers included) */
    size_t alloc;   /* bytes allocated (grows to cap) */
    size_t head;    /* index of the oldest chunk's header */
    size_t used;    /* bytes of chunks stored (headers included) */
    size_t last;    /* index of the newest chunk's header, if used > 0 */
    uint64_t start; /* offset of the oldest byte still stored */
    uint64_t end;   /* offset one past the newest byte: all bytes ever written */
};

/* cap is clamped to GI_RING_MIN..GI_RING_MAX. Returns 0 or -ENOMEM. */
int gi_ring_init(struct gi_ring *r, uint64_t cap);
void gi_ring_free(struct gi_ring *r);

/*
 * Append n bytes from fd (1 or 2). Never fails: the oldest bytes make room
 * (if growing the buffer fails, the ring keeps the size it has). Bytes that
 * do not fit even in an empty ring are counted in end but never stored.
 */
void gi_ring_write(struct gi_ring *r, int fd, const void *p, size_t n);

/*
 * Copy bytes from offset off, all of one fd (the chunk holding off), at
 * most max of them, into dst; *fd gets the fd. Returns the count, 0 when
 * off is outside start..end-1 (the caller checks off < start: lost bytes).
 */
size_t gi_ring_read(const struct gi_ring *r, uint64_t off, void *dst, size_t max, int *fd);

#endif
