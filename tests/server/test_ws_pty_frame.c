/*
 * The PTY WebSocket frame decoder (server/ws_pty_frame.c): every opcode,
 * exact lengths, value ranges, and the close code each malformed frame
 * earns (1008 policy, 1009 too big).
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ws_pty_frame.h"

int failures;

static int dec(const void *p, size_t n, struct wsp_frame *f)
{
    const char *why = NULL;
    int rc = wsp_decode(p, n, f, &why);

    CHECK(rc == 0 || (why && *why)); /* every refusal has a reason */
    return rc;
}

int main(void)
{
    struct wsp_frame f;
    static uint8_t big[1 + WSP_INPUT_MAX + 1];
    uint8_t h[WSP_OUTPUT_HEAD];

    /* INPUT: any bytes up to 64 KiB, empty included */
    /* (f.data points into the frame: the frame must outlive f's use) */
    static const uint8_t keys[] = {0x00, 'l', 's', '\r'};
    CHECK(dec(keys, sizeof(keys), &f) == 0);
    CHECK(f.op == WSP_INPUT && f.len == 3 && f.data == keys + 1 && !memcmp(f.data, "ls\r", 3));
    CHECK(dec((uint8_t[]){0x00}, 1, &f) == 0 && f.len == 0);
    memset(big, 'x', sizeof(big));
    big[0] = WSP_INPUT;
    CHECK(dec(big, 1 + WSP_INPUT_MAX, &f) == 0 && f.len == WSP_INPUT_MAX);
    CHECK(dec(big, sizeof(big), &f) == WSP_CLOSE_BIG);

    /* RESIZE: exactly u16 cols, u16 rows, big-endian, 1..10000 */
    CHECK(dec((uint8_t[]){0x01, 0x00, 0x78, 0x00, 0x28}, 5, &f) == 0);
    CHECK(f.op == WSP_RESIZE && f.cols == 120 && f.rows == 40);
    CHECK(dec((uint8_t[]){0x01, 0x27, 0x10, 0x27, 0x10}, 5, &f) == 0 && f.cols == 10000);
    CHECK(dec((uint8_t[]){0x01, 0x27, 0x11, 0x00, 0x10}, 5, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x01, 0x00, 0x00, 0x00, 0x10}, 5, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x01, 0x00, 0x10, 0x00, 0x00}, 5, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x01, 0x00, 0x78, 0x00}, 4, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x01, 0x00, 0x78, 0x00, 0x28, 0x00}, 6, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x01}, 1, &f) == WSP_CLOSE_POLICY);

    /* ACK: exactly a u32, big-endian, any value */
    CHECK(dec((uint8_t[]){0x02, 0x00, 0x10, 0x00, 0x01}, 5, &f) == 0);
    CHECK(f.op == WSP_ACK && f.ack == 0x100001);
    CHECK(dec((uint8_t[]){0x02, 0xff, 0xff, 0xff, 0xff}, 5, &f) == 0 && f.ack == 0xffffffffu);
    CHECK(dec((uint8_t[]){0x02, 0x00, 0x10}, 3, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x02, 0, 0, 0, 1, 0}, 6, &f) == WSP_CLOSE_POLICY);

    /* SIGNAL: exactly one byte, 1..64 */
    CHECK(dec((uint8_t[]){0x03, 2}, 2, &f) == 0 && f.op == WSP_SIGNAL && f.sig == 2);
    CHECK(dec((uint8_t[]){0x03, 64}, 2, &f) == 0 && f.sig == 64);
    CHECK(dec((uint8_t[]){0x03, 0}, 2, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x03, 65}, 2, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x03}, 1, &f) == WSP_CLOSE_POLICY);
    CHECK(dec((uint8_t[]){0x03, 9, 9}, 3, &f) == WSP_CLOSE_POLICY);

    /* Empty frames and every other opcode (server ones included) are malformed */
    CHECK(dec("", 0, &f) == WSP_CLOSE_POLICY);
    for (unsigned op = 4; op < 256; op++) {
        uint8_t b[5] = {(uint8_t)op, 0, 1, 0, 1};
        CHECK(dec(b, sizeof(b), &f) == WSP_CLOSE_POLICY);
    }

    /* OUTPUT head: opcode and u64 big-endian offset */
    wsp_output_head(h, 0x0102030405060708ull);
    CHECK(!memcmp(h, (uint8_t[]){0x10, 1, 2, 3, 4, 5, 6, 7, 8}, 9));

    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
