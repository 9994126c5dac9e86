/*
 * Fuzz the PTY socket's door with a sequence of client messages as one socket could
 * send them: frames, fragments and pieces, empty ones included, joined by
 * server/ws_rx.c (ws_pieces.h says the input's shape), then decoded by
 * server/ws_pty_frame.c. A frame that decodes must re-encode to exactly its bytes (nothing read
 * past or ignored); a refusal must carry a close code 1008/1009 and a reason; a refusal ends the
 * sequence, as it closes the socket. ACKs are applied to a model of the output the server has sent
 * and not seen ACKed: an ACK past it closes the socket (ends the sequence), so the model never goes
 * negative.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ws_pieces.h"
#include "ws_pty_frame.h"

static size_t encode(const struct wsp_frame *f, uint8_t *out)
{
    out[0] = (uint8_t)f->op;
    switch (f->op) {
    case WSP_INPUT:
        memcpy(out + 1, f->data, f->len);
        return 1 + f->len;
    case WSP_RESIZE:
        out[1] = (uint8_t)(f->cols >> 8);
        out[2] = (uint8_t)f->cols;
        out[3] = (uint8_t)(f->rows >> 8);
        out[4] = (uint8_t)f->rows;
        return 5;
    case WSP_ACK:
        for (int i = 0; i < 4; i++)
            out[1 + i] = (uint8_t)(f->ack >> (24 - 8 * i));
        return 5;
    case WSP_SIGNAL:
        out[1] = (uint8_t)f->sig;
        return 2;
    }
    abort();
}

struct ctx {
    uint64_t unacked; /* output sent and not yet ACKed */
    bool closed;
};

static void on_msg(const uint8_t *p, size_t n, void *c)
{
    static uint8_t re[1 + WSP_INPUT_MAX];
    struct ctx *x = c;
    struct wsp_frame f;
    const char *why = NULL;
    uint8_t *frame;
    int rc;

    if (x->closed)
        return;
    /* A copy of exactly n bytes, so ASan sees any read past the frame. */
    frame = malloc(n ? n : 1);
    if (!frame)
        return;
    if (n)
        memcpy(frame, p, n);
    rc = wsp_decode(frame, n, &f, &why);
    if (rc) {
        if ((rc != WSP_CLOSE_POLICY && rc != WSP_CLOSE_BIG) || !why || !*why)
            abort();
        x->closed = true;
        free(frame);
        return;
    }
    if (encode(&f, re) != n || memcmp(re, frame, n))
        abort();
    if (f.op == WSP_RESIZE &&
        (!f.cols || !f.rows || f.cols > WSP_SIZE_MAX || f.rows > WSP_SIZE_MAX))
        abort();
    if (f.op == WSP_SIGNAL && (f.sig < 1 || f.sig > 64))
        abort();
    if (f.op == WSP_ACK) {
        if (f.ack > x->unacked)
            x->closed = true;
        else
            x->unacked -= f.ack;
    }
    free(frame);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ctx x = {.unacked = 1 << 20}; /* one window of output sent */

    /* pty_socket_max_frame_bytes' default */
    ws_pieces(data, size, 1 + WSP_INPUT_MAX, on_msg, &x);
    return 0;
}
