/*
 * test_gstream.c - unit tests of the host's accounting of guest streams
 * (core/gstream.c): offsets must be contiguous per fd, data beyond the
 * granted window or the announced size is refused, a guest's upload credit
 * is clamped to the bytes in flight, and the exit signal a guest reports is
 * checked before it reaches JSON (its mtime's clamping: tests/util/).
 */
#include "gstream.h"
#include "proto.h"
#include "check.h"

#include <stdint.h>
#include <string.h>

int failures;

static void test_offsets(void)
{
    struct gstream g;
    char why[128];

    gstream_init(&g);
    CHECK(gstream_rx(&g, 0, true, 0, 10, why, sizeof(why)) == 0);
    CHECK(gstream_rx(&g, 1, true, 0, 3, why, sizeof(why)) == 0); /* stderr counts apart */
    CHECK(gstream_rx(&g, 0, true, 10, 5, why, sizeof(why)) == 0);
    /* A gap, an overlap, a replay, no offset at all: refused, nothing counted. */
    CHECK(gstream_rx(&g, 0, true, 16, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(strstr(why, "offset 16, expected 15") != NULL);
    CHECK(gstream_rx(&g, 0, true, 14, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(gstream_rx(&g, 0, true, 0, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(gstream_rx(&g, 0, false, 0, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(gstream_rx(&g, 0, true, UINT64_MAX, 1, NULL, 0) == GSTREAM_EOFF);
    CHECK(gstream_rx(&g, 2, true, 0, 1, why, sizeof(why)) == GSTREAM_EFD);
    CHECK(g.next_off[0] == 15 && g.next_off[1] == 3 && g.received == 18);
    /* Empty data at the right offset is fine. */
    CHECK(gstream_rx(&g, 1, true, 3, 0, why, sizeof(why)) == 0);
}

static void test_window(void)
{
    struct gstream g;
    char why[128];
    uint64_t off = 0;

    gstream_init(&g);
    /* Both fds share one window of PROTO_WINDOW bytes. */
    for (int i = 0; i < 8; i++, off += PROTO_MAX_DATA)
        CHECK(gstream_rx(&g, 0, true, off, PROTO_MAX_DATA, why, sizeof(why)) == 0);
    for (uint64_t o = 0; o < 8 * PROTO_MAX_DATA; o += PROTO_MAX_DATA)
        CHECK(gstream_rx(&g, 1, true, o, PROTO_MAX_DATA, why, sizeof(why)) == 0);
    CHECK(g.received == PROTO_WINDOW);
    CHECK(gstream_rx(&g, 0, true, off, 1, why, sizeof(why)) == GSTREAM_EWINDOW);
    CHECK(strstr(why, "0 bytes of credit left") != NULL);
    /* Credit sent opens exactly that much. */
    gstream_granted(&g, 100);
    CHECK(gstream_rx(&g, 0, true, off, 101, why, sizeof(why)) == GSTREAM_EWINDOW);
    CHECK(gstream_rx(&g, 0, true, off, 100, why, sizeof(why)) == 0);
    CHECK(gstream_rx(&g, 0, true, off + 100, 1, why, sizeof(why)) == GSTREAM_EWINDOW);
    gstream_granted(&g, UINT64_MAX); /* saturates, never wraps */
    CHECK(g.granted == UINT64_MAX);
    CHECK(gstream_rx(&g, 0, true, off + 100, 1, why, sizeof(why)) == 0);
}

static void test_size(void)
{
    struct gstream g;
    char why[128];

    gstream_init(&g);
    CHECK(gstream_set_size(&g, 10, why, sizeof(why)) == 0);
    CHECK(gstream_rx(&g, 0, true, 0, 6, why, sizeof(why)) == 0);
    CHECK(gstream_rx(&g, 0, true, 6, 5, why, sizeof(why)) == GSTREAM_ESIZE);
    CHECK(strstr(why, "announced as 10 bytes") != NULL);
    CHECK(gstream_rx(&g, 0, true, 6, 4, why, sizeof(why)) == 0);
    CHECK(gstream_rx(&g, 0, true, 10, 1, why, sizeof(why)) == GSTREAM_ESIZE);
    CHECK(gstream_rx(&g, 0, true, 10, 0, why, sizeof(why)) == 0);
    /* A size announced below what already came is refused too. */
    gstream_init(&g);
    CHECK(gstream_rx(&g, 0, true, 0, 5, why, sizeof(why)) == 0);
    CHECK(gstream_set_size(&g, 4, why, sizeof(why)) == GSTREAM_ESIZE);
    /* A huge announced size is only an upper bound: the window still applies. */
    gstream_init(&g);
    CHECK(gstream_set_size(&g, UINT64_MAX - 1, why, sizeof(why)) == 0);
    CHECK(gstream_rx(&g, 0, true, 0, PROTO_WINDOW + 1, why, sizeof(why)) == GSTREAM_EWINDOW);
}

static void test_upload_credit(void)
{
    struct gstream g;

    gstream_init(&g);
    CHECK(gstream_tx_room(&g) == PROTO_WINDOW);
    /* Credit before anything was sent is ignored: it cannot widen the window. */
    CHECK(gstream_tx_credit(&g, UINT64_MAX) == 0);
    CHECK(gstream_tx_room(&g) == PROTO_WINDOW);
    gstream_tx_sent(&g, PROTO_WINDOW);
    CHECK(gstream_tx_room(&g) == 0);
    CHECK(gstream_tx_credit(&g, 1000) == 1000);
    CHECK(gstream_tx_room(&g) == 1000);
    /* More credit than bytes in flight is clamped to them. */
    CHECK(gstream_tx_credit(&g, 1ull << 40) == PROTO_WINDOW - 1000);
    CHECK(gstream_tx_room(&g) == PROTO_WINDOW);
    CHECK(gstream_tx_credit(&g, 5) == 0);
    CHECK(gstream_tx_room(&g) == PROTO_WINDOW);
}

/* An attach stream: one offset space for both fds, from where the host asked, and a skip
 * only when announced and exact. */
static void test_ring(void)
{
    struct gstream g;
    char why[160];

    gstream_init_ring(&g, 1000);
    CHECK(gstream_ring_next(&g) == 1000);
    CHECK(gstream_rx_ring(&g, 0, true, 1000, 0, 10, why, sizeof(why)) == 0);
    CHECK(gstream_rx_ring(&g, 1, true, 1010, 0, 5, why, sizeof(why)) == 0); /* stderr shares */
    CHECK(gstream_ring_next(&g) == 1015);
    /* A silent gap, a skip that lands elsewhere, a replay: refused, nothing counted. */
    CHECK(gstream_rx_ring(&g, 0, true, 1020, 0, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(strstr(why, "offset 1020 with 0 lost, expected 1015") != NULL);
    CHECK(gstream_rx_ring(&g, 0, true, 1020, 4, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(gstream_rx_ring(&g, 0, true, 1000, 0, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(gstream_rx_ring(&g, 0, false, 0, 0, 1, why, sizeof(why)) == GSTREAM_EOFF);
    CHECK(gstream_rx_ring(&g, 0, true, 0, UINT64_MAX, 1, NULL, 0) == GSTREAM_EOFF);
    CHECK(gstream_rx_ring(&g, 2, true, 1015, 0, 1, why, sizeof(why)) == GSTREAM_EFD);
    CHECK(g.received == 15);
    /* An announced, exact skip is accepted and moves the offset past it. */
    CHECK(gstream_rx_ring(&g, 0, true, 1020, 5, 2, why, sizeof(why)) == 0);
    CHECK(gstream_ring_next(&g) == 1022 && g.received == 17);
    /* Offsets never wrap. */
    CHECK(gstream_rx_ring(&g, 0, true, UINT64_MAX - 1, UINT64_MAX - 1 - 1022, 2, why,
                          sizeof(why)) == GSTREAM_EOFF);
    /* Credit is counted as for any stream. */
    CHECK(gstream_rx_ring(&g, 0, true, 1022, 0, GSTREAM_WINDOW, why, sizeof(why)) ==
          GSTREAM_EWINDOW);
    CHECK(gstream_rx_ring(&g, 0, true, 1022, 0, GSTREAM_WINDOW - 17, why, sizeof(why)) == 0);
    CHECK(gstream_rx_ring(&g, 0, true, 1022 + GSTREAM_WINDOW - 17, 0, 1, why, sizeof(why)) ==
          GSTREAM_EWINDOW);
}

/* The ISO time these values are shown with is tested in tests/util/test_util.c. */
static void test_values(void)
{
    CHECK(!gstream_sig_ok(0) && gstream_sig_ok(1) && gstream_sig_ok(9) && gstream_sig_ok(64));
    CHECK(!gstream_sig_ok(65) && !gstream_sig_ok(-1) && !gstream_sig_ok(1ll << 40));
    CHECK(!gstream_sig_ok(INT64_MAX) && !gstream_sig_ok(INT64_MIN));
}

int main(void)
{
    test_offsets();
    test_window();
    test_size();
    test_upload_credit();
    test_ring();
    test_values();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("gstream: all checks passed\n");
    return 0;
}
