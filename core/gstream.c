/* gstream.c - host-side accounting of a guest's streams (see gstream.h). */
#include "gstream.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void say(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (!why || !cap)
        return;
    va_start(ap, fmt);
    vsnprintf(why, cap, fmt, ap);
    va_end(ap);
}

void gstream_init(struct gstream *g)
{
    memset(g, 0, sizeof(*g));
    g->granted = GSTREAM_WINDOW;
    g->size = GSTREAM_NO_SIZE;
}

int gstream_rx(struct gstream *g, unsigned fd, bool has_off, uint64_t off, uint64_t n, char *why,
               size_t cap)
{
    if (fd >= GSTREAM_FDS) {
        say(why, cap, "data for fd index %u", fd);
        return GSTREAM_EFD;
    }
    /* The host counts the stream itself: a gap or an overlap would let the guest choose
     * what the client sees at which offset (and once overflowed an encoder's budget). */
    if (!has_off || off != g->next_off[fd]) {
        if (has_off)
            say(why, cap, "data at offset %" PRIu64 ", expected %" PRIu64, off, g->next_off[fd]);
        else
            say(why, cap, "data without an offset, expected %" PRIu64, g->next_off[fd]);
        return GSTREAM_EOFF;
    }
    /* received <= granted always holds, so the subtraction cannot wrap. */
    if (n > g->granted - g->received) {
        say(why, cap, "%" PRIu64 " bytes with %" PRIu64 " bytes of credit left", n,
            g->granted - g->received);
        return GSTREAM_EWINDOW;
    }
    if (g->size != GSTREAM_NO_SIZE && n > g->size - g->next_off[fd]) {
        say(why, cap, "data up to byte %" PRIu64 " of a file announced as %" PRIu64 " bytes",
            g->next_off[fd] + n, g->size);
        return GSTREAM_ESIZE;
    }
    g->next_off[fd] += n;
    g->received += n;
    return 0;
}

void gstream_init_ring(struct gstream *g, uint64_t off)
{
    gstream_init(g);
    g->next_off[0] = off;
}

int gstream_rx_ring(struct gstream *g, unsigned fd, bool has_off, uint64_t off, uint64_t lost,
                    uint64_t n, char *why, size_t cap)
{
    uint64_t want = g->next_off[0];

    if (fd >= GSTREAM_FDS) {
        say(why, cap, "data for fd index %u", fd);
        return GSTREAM_EFD;
    }
    /* Skipping is the ring's right, but only in the open: a frame that claims to skip
     * must land exactly there, and offsets never wrap. */
    if (lost > UINT64_MAX - want || !has_off || off != want + lost || n > UINT64_MAX - off) {
        if (has_off)
            say(why, cap,
                "ring data at offset %" PRIu64 " with %" PRIu64 " lost, expected %" PRIu64, off,
                lost, want);
        else
            say(why, cap, "ring data without an offset, expected %" PRIu64, want);
        return GSTREAM_EOFF;
    }
    if (n > g->granted - g->received) {
        say(why, cap, "%" PRIu64 " bytes with %" PRIu64 " bytes of credit left", n,
            g->granted - g->received);
        return GSTREAM_EWINDOW;
    }
    g->next_off[0] = off + n;
    g->received += n;
    return 0;
}

void gstream_granted(struct gstream *g, uint64_t n)
{
    g->granted = n > UINT64_MAX - g->granted ? UINT64_MAX : g->granted + n;
}

int gstream_set_size(struct gstream *g, uint64_t size, char *why, size_t cap)
{
    if (g->next_off[0] > size) {
        say(why, cap, "size %" PRIu64 " announced after %" PRIu64 " bytes", size, g->next_off[0]);
        return GSTREAM_ESIZE;
    }
    g->size = size;
    return 0;
}

uint64_t gstream_tx_room(const struct gstream *g)
{
    uint64_t in_flight = g->tx_sent - g->tx_acked;

    return in_flight >= GSTREAM_WINDOW ? 0 : GSTREAM_WINDOW - in_flight;
}

void gstream_tx_sent(struct gstream *g, uint64_t n)
{
    g->tx_sent += n;
}

uint64_t gstream_tx_credit(struct gstream *g, uint64_t n)
{
    uint64_t in_flight = g->tx_sent - g->tx_acked;
    uint64_t take = n < in_flight ? n : in_flight;

    g->tx_acked += take;
    return take;
}

bool gstream_sig_ok(int64_t sig)
{
    return sig >= 1 && sig <= GSTREAM_SIG_MAX;
}

const char *gstream_strerror(int err)
{
    switch (err) {
    case GSTREAM_EOFF:
        return "data not at the next offset of its stream";
    case GSTREAM_EWINDOW:
        return "data beyond the credit window";
    case GSTREAM_ESIZE:
        return "data beyond the announced size";
    case GSTREAM_EFD:
        return "data for an unknown fd";
    default:
        return "unknown error";
    }
}
