/*
 * ws_pty_frame.c - decoder of PTY WebSocket client frames (ws_pty_frame.h).
 * Every length is checked exactly: a short or long RESIZE/ACK/SIGNAL is a
 * malformed frame, not something to guess at, so a client bug surfaces as
 * a close with a reason instead of a terminal of the wrong size.
 */
#include "ws_pty_frame.h"

static unsigned be16(const uint8_t *p)
{
    return (unsigned)p[0] << 8 | p[1];
}

int wsp_decode(const void *frame, size_t n, struct wsp_frame *f, const char **why)
{
    const uint8_t *p = frame;

    *f = (struct wsp_frame){0};
    if (n == 0) {
        *why = "empty frame";
        return WSP_CLOSE_POLICY;
    }
    f->op = p[0];
    switch (p[0]) {
    case WSP_INPUT:
        if (n - 1 > WSP_INPUT_MAX) {
            *why = "INPUT frame over 64 KiB";
            return WSP_CLOSE_BIG;
        }
        f->data = p + 1;
        f->len = n - 1;
        return 0;
    case WSP_RESIZE:
        if (n != 5) {
            *why = "RESIZE frame must be 5 bytes";
            return WSP_CLOSE_POLICY;
        }
        f->cols = be16(p + 1);
        f->rows = be16(p + 3);
        if (!f->cols || !f->rows || f->cols > WSP_SIZE_MAX || f->rows > WSP_SIZE_MAX) {
            *why = "RESIZE cols and rows must be 1..10000";
            return WSP_CLOSE_POLICY;
        }
        return 0;
    case WSP_ACK:
        if (n != 5) {
            *why = "ACK frame must be 5 bytes";
            return WSP_CLOSE_POLICY;
        }
        f->ack = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
        return 0;
    case WSP_SIGNAL:
        if (n != 2) {
            *why = "SIGNAL frame must be 2 bytes";
            return WSP_CLOSE_POLICY;
        }
        if (p[1] < 1 || p[1] > 64) {
            *why = "SIGNAL number must be 1..64";
            return WSP_CLOSE_POLICY;
        }
        f->sig = p[1];
        return 0;
    default:
        *why = "unknown opcode";
        return WSP_CLOSE_POLICY;
    }
}

void wsp_output_head(uint8_t *dst, uint64_t off)
{
    dst[0] = WSP_OUTPUT;
    for (int i = 0; i < 8; i++)
        dst[1 + i] = (uint8_t)(off >> (56 - 8 * i));
}
