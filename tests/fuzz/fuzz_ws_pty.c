/*
 * Fuzz server/ws_pty_frame.c with a sequence of client frames as one socket
 * could send them: each is a u16 big-endian length and that many bytes. A
 * frame that decodes must re-encode to exactly its bytes (nothing read past
 * or ignored); a refusal must carry a close code 1008/1009 and a reason; a
 * refusal ends the sequence, as it closes the socket. ACKs are applied to a
 * model of the credit the server holds, which must never go negative.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static uint8_t re[1 + WSP_INPUT_MAX];
    uint64_t held = 1 << 20; /* one window of output awaiting ACKs */
    size_t off = 0;

    while (off + 2 <= size) {
        size_t n = (size_t)data[off] << 8 | data[off + 1];
        struct wsp_frame f;
        const char *why = NULL;
        uint8_t *frame;
        int rc;

        off += 2;
        if (n > size - off)
            n = size - off;
        /* A copy of exactly n bytes, so ASan sees any read past the frame. */
        frame = malloc(n ? n : 1);
        if (!frame)
            return 0;
        memcpy(frame, data + off, n);
        off += n;
        rc = wsp_decode(frame, n, &f, &why);
        if (rc) {
            if ((rc != WSP_CLOSE_POLICY && rc != WSP_CLOSE_BIG) || !why || !*why)
                abort();
            free(frame);
            return 0;
        }
        if (encode(&f, re) != n || memcmp(re, frame, n))
            abort();
        if (f.op == WSP_RESIZE &&
            (!f.cols || !f.rows || f.cols > WSP_SIZE_MAX || f.rows > WSP_SIZE_MAX))
            abort();
        if (f.op == WSP_SIGNAL && (f.sig < 1 || f.sig > 64))
            abort();
        if (f.op == WSP_ACK)
            held -= f.ack > held ? held : f.ack;
        free(frame);
    }
    (void)held;
    return 0;
}
