/*
 * ws_pty_frame.h - the frames of the PTY WebSocket ("warren.pty.v1"): the
 * decoder of what a client sends and the encoder of OUTPUT heads. Pure (no
 * I/O, no allocation) so it is unit-tested and fuzzed on its own; the
 * socket itself is ws_pty.c. The format is documented in docs/API.md.
 *
 * Ownership: a decoded frame points into the caller's buffer (borrowed).
 */
#ifndef WARREN_WS_PTY_FRAME_H
#define WARREN_WS_PTY_FRAME_H

#include <stddef.h>
#include <stdint.h>

/* client -> server */
#define WSP_INPUT  0x00 /* bytes: keystrokes */
#define WSP_RESIZE 0x01 /* u16 cols, u16 rows (big-endian) */
#define WSP_ACK    0x02 /* u32 n (big-endian): n more output bytes displayed */
#define WSP_SIGNAL 0x03 /* u8 signal number */
/* server -> client */
#define WSP_OUTPUT  0x10 /* u64 offset (big-endian) + bytes */
#define WSP_CONTROL 0x11 /* one JSON object */

#define WSP_INPUT_MAX    (64 * 1024) /* keystroke bytes in one INPUT frame */
#define WSP_OUTPUT_HEAD  9           /* opcode + offset */
#define WSP_SIZE_MAX     10000       /* most columns or rows (as API_PTY_SIZE_MAX) */
#define WSP_CLOSE_POLICY 1008        /* malformed frame */
#define WSP_CLOSE_BIG    1009        /* frame too big */

struct wsp_frame {
    unsigned op;         /* WSP_INPUT .. WSP_SIGNAL */
    const uint8_t *data; /* INPUT: the keystrokes (points into the frame) */
    size_t len;
    unsigned cols, rows; /* RESIZE: 1..WSP_SIZE_MAX each */
    uint32_t ack;        /* ACK */
    int sig;             /* SIGNAL: 1..64 */
};

/* Decode one whole client frame of n bytes. 0 and *f; or the WebSocket close code to
 * answer with (WSP_CLOSE_POLICY or WSP_CLOSE_BIG) and *why, a static reason. */
int wsp_decode(const void *frame, size_t n, struct wsp_frame *f, const char **why);

/* Write the OUTPUT head (opcode and offset) into dst[WSP_OUTPUT_HEAD]. */
void wsp_output_head(uint8_t *dst, uint64_t off);

#endif
