/*
 * What both WebSocket doors make of a client's bytes (server/ws_rx.c): a message
 * joined from its pieces, empty pieces included (an empty first fragment once reached
 * memcpy with a NULL buffer), the size cap counted with the bytes still to come, and
 * the close payloads that may be echoed and those answered with 1002 or 1007.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ws_rx.h"

int failures;

#define MAX 16

static int add(struct ws_rx *r, const char *in, size_t len, bool first, bool final, size_t rest,
               const unsigned char **m, size_t *n)
{
    return ws_rx_add(r, in, len, first, final, rest, MAX, m, n);
}

int main(void)
{
    struct ws_rx r = {0};
    const unsigned char *m = NULL;
    size_t n = 99;
    const char *why;

    /* Whole in one piece: handed back without a copy, empty included (in NULL). */
    const char one[] = "abc";
    CHECK(add(&r, one, 3, true, true, 0, &m, &n) == WS_RX_MSG && m == (const void *)one && n == 3);
    CHECK(add(&r, NULL, 0, true, true, 0, &m, &n) == WS_RX_MSG && m && n == 0);
    CHECK(r.buf == NULL);

    /* An empty first fragment, then the rest: nothing is copied from or to NULL. */
    CHECK(add(&r, NULL, 0, true, false, 0, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, "xy", 2, false, false, 0, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, NULL, 0, false, false, 0, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, "z", 1, false, true, 0, &m, &n) == WS_RX_MSG && n == 3 && !memcmp(m, "xyz", 3));
    /* Only empty fragments: an empty message. */
    CHECK(add(&r, NULL, 0, true, false, 0, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, NULL, 0, false, true, 0, &m, &n) == WS_RX_MSG && m && n == 0);
    /* A frame in pieces (rest > 0, not final until its last byte). */
    CHECK(add(&r, "0123", 4, true, false, 4, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, "4567", 4, false, true, 0, &m, &n) == WS_RX_MSG && n == 8 &&
          !memcmp(m, "01234567", 8));
    /* A new message drops a broken one's leftovers. */
    CHECK(add(&r, "ab", 2, true, false, 0, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, "cd", 2, true, true, 0, &m, &n) == WS_RX_MSG && n == 2 && !memcmp(m, "cd", 2));
    ws_rx_free(&r);

    /* The cap: what came, this piece and what is still to come of the frame. */
    CHECK(add(&r, "0123456789", 10, true, false, 7, &m, &n) == -EMSGSIZE);
    CHECK(add(&r, "0123456789", 10, true, false, 6, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, "012345", 6, false, false, 1, &m, &n) == -EMSGSIZE);
    ws_rx_free(&r);
    CHECK(add(&r, "0123456789", 10, true, false, 0, &m, &n) == WS_RX_MORE);
    CHECK(add(&r, "0123456", 7, false, true, 0, &m, &n) == -EMSGSIZE);
    CHECK(add(&r, NULL, 0, false, false, (size_t)-1, &m, &n) == -EMSGSIZE);
    ws_rx_free(&r);
    CHECK(r.buf == NULL && r.len == 0 && r.cap == 0);

    /* Close payloads. */
    CHECK(ws_close_check(NULL, 0, &why) == 0);
    CHECK(ws_close_check((const unsigned char *)"\x03\xe8", 2, &why) == 0); /* 1000 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xe8"
                                                "bye",
                         5, &why) == 0);
    CHECK(ws_close_check((const unsigned char *)"\x03\xf6", 2, &why) == 0); /* 1014 */
    CHECK(ws_close_check((const unsigned char *)"\x0f\xa0", 2, &why) == 0); /* 4000 */
    why = NULL;
    CHECK(ws_close_check((const unsigned char *)"\x03", 1, &why) == 1002 && why);
    CHECK(ws_close_check((const unsigned char *)"\x13\x88", 2, &why) == 1002); /* 5000 */
    CHECK(ws_close_check((const unsigned char *)"\xff\xff", 2, &why) == 1002);
    CHECK(ws_close_check((const unsigned char *)"\x03\xe7", 2, &why) == 1002);     /* 999 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xec", 2, &why) == 1002);     /* 1004 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xed", 2, &why) == 1002);     /* 1005 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xee", 2, &why) == 1002);     /* 1006 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xf7", 2, &why) == 1002);     /* 1015 */
    CHECK(ws_close_check((const unsigned char *)"\x07\xd0", 2, &why) == 1002);     /* 2000 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xe8\xff", 3, &why) == 1007); /* not UTF-8 */
    CHECK(ws_close_check((const unsigned char *)"\x03\xe8\xc3", 3, &why) == 1007); /* cut short */

    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures != 0;
}
