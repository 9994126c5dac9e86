/*
 * gstream.h - what a guest may send on one stream, counted by the host.
 *
 * The guest owns its end of the channel and may be hostile (root in a VM
 * can take the agent's channel fd): nothing it says about a stream is
 * trusted. The host counts each stream itself: the offset the next data
 * of each fd must carry, the bytes it granted (GSTREAM_WINDOW plus every
 * CREDIT it sent), the size a file read announced; and, for an upload, the
 * bytes in flight to the guest, so the guest's CREDIT can never open a
 * window wider than PROTO_WINDOW. Also here: the checks of single values a
 * guest reports (an exit signal, an mtime) before they reach JSON.
 *
 * Pure: no I/O, no allocation, no loop. ops.c keeps one struct gstream per
 * op and turns a refusal into a protocol violation (sbx_violation). Tested
 * by tests/core/test_gstream.c and fuzzed with whole frame sequences by
 * tests/fuzz/fuzz_gstream.c. The caller owns the struct.
 */
#ifndef WARREN_GSTREAM_H
#define WARREN_GSTREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto.h"

/* The window granted per stream and direction. Only the fuzzer builds with a smaller one,
 * so that credit abuse is reachable with small inputs. */
#ifndef GSTREAM_WINDOW
#define GSTREAM_WINDOW PROTO_WINDOW
#endif

#define GSTREAM_FDS     2  /* exec: stdout, stderr (index fd - 1); a file read uses 0 */
#define GSTREAM_SIG_MAX 64 /* highest signal number a guest may report (Linux: SIGRTMAX) */
#define GSTREAM_NO_SIZE UINT64_MAX

/* Refusals (negative, apart from errno values). */
#define GSTREAM_EOFF    (-2001) /* off absent or not the next byte of its fd */
#define GSTREAM_EWINDOW (-2002) /* more data than the credit the host granted */
#define GSTREAM_ESIZE   (-2003) /* more data than the size the guest announced */
#define GSTREAM_EFD     (-2004) /* no such fd */

struct gstream {
    /* guest -> host */
    uint64_t next_off[GSTREAM_FDS]; /* the off the next data of each fd must carry */
    uint64_t received;              /* data bytes accepted, all fds together */
    uint64_t granted;               /* GSTREAM_WINDOW + credit the host has sent */
    uint64_t size;                  /* file read: announced size, or GSTREAM_NO_SIZE */
    /* host -> guest (upload) */
    uint64_t tx_sent;  /* data bytes sent */
    uint64_t tx_acked; /* credit the guest returned, never above tx_sent */
};

/* A new stream: nothing received, GSTREAM_WINDOW granted, no size, nothing sent. */
void gstream_init(struct gstream *g);

/*
 * The guest sent n data bytes of fd (0-based index) at offset off (has_off
 * false: the frame had none). 0: accepted and counted. Else a GSTREAM_E*
 * code, nothing counted, and why (cap bytes, may be NULL) says what was
 * wrong with the numbers.
 */
int gstream_rx(struct gstream *g, unsigned fd, bool has_off, uint64_t off, uint64_t n, char *why,
               size_t cap);
/*
 * A stream attached to a background process's ring (ATTACH): stdout and stderr share
 * one offset space that starts where the host asked (off), and a frame may skip bytes
 * the ring no longer holds: it then carries lost = how many, and its off must be
 * exactly the expected offset plus lost. gstream_rx_ring() counts such a frame (fd is
 * only checked to be 0 or 1); credit is counted as for any stream.
 */
void gstream_init_ring(struct gstream *g, uint64_t off);
int gstream_rx_ring(struct gstream *g, unsigned fd, bool has_off, uint64_t off, uint64_t lost,
                    uint64_t n, char *why, size_t cap);
/* The offset the next byte of a ring stream must carry (before any loss). */
static inline uint64_t gstream_ring_next(const struct gstream *g)
{
    return g->next_off[0];
}

/* The host sent the guest a CREDIT of n bytes. */
void gstream_granted(struct gstream *g, uint64_t n);
/* A file read announced its size. Bytes already received count against it: GSTREAM_ESIZE
 * (with why) if they are over it already, else 0. */
int gstream_set_size(struct gstream *g, uint64_t size, char *why, size_t cap);

/* Upload: bytes the host may send now (GSTREAM_WINDOW minus bytes in flight). */
uint64_t gstream_tx_room(const struct gstream *g);
/* Upload: the host sent n bytes (n <= gstream_tx_room()). */
void gstream_tx_sent(struct gstream *g, uint64_t n);
/* Upload: the guest returned n bytes of credit. Credit for bytes never sent is ignored
 * (clamped), so the room never exceeds GSTREAM_WINDOW. Returns the credit taken. */
uint64_t gstream_tx_credit(struct gstream *g, uint64_t n);

/* An exit signal a guest may report: 1..GSTREAM_SIG_MAX. */
bool gstream_sig_ok(int64_t sig);

const char *gstream_strerror(int err);

#endif
