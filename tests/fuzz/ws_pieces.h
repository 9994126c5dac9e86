/*
 * ws_pieces.h - the fuzzers of the socket doors (fuzz_session.c, fuzz_ws_pty.c) feed
 * their messages through server/ws_rx.c as lws hands a socket's bytes over: frames,
 * fragments of a message, and pieces of a frame, any of them empty.
 *
 * The input is a list of frames, each a flags byte, a u16 big-endian length and that
 * many bytes. Flags bit 0: the frame ends its message (FIN); bits 1-2: the frame comes
 * in 1 to 4 pieces (the last ones may be empty). Every piece is an exact-size copy (NULL
 * when empty), so ASan sees any read past it and UBSan any NULL misuse. Each message
 * ws_rx_add hands back must be exactly the bytes of its frames; a message over max
 * ends the sequence, as it closes the socket.
 */
#ifndef WARREN_FUZZ_WS_PIECES_H
#define WARREN_FUZZ_WS_PIECES_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ws_rx.h"

/* Feed data as frames; on_msg gets each whole message (borrowed). */
static void ws_pieces(const uint8_t *data, size_t size, size_t max,
                      void (*on_msg)(const uint8_t *p, size_t n, void *ctx), void *ctx)
{
    static uint8_t model[1 << 17]; /* the message so far, as the frames carried it */
    struct ws_rx rx = {0};
    size_t mlen = 0;
    bool first = true;

    while (size >= 3) {
        unsigned flags = data[0];
        size_t n = (size_t)data[1] << 8 | data[2];
        size_t pieces = 1 + (flags >> 1 & 3), done = 0;
        bool fin = flags & 1;

        data += 3;
        size -= 3;
        if (n > size)
            n = size;
        for (size_t i = 0; i < pieces; i++) {
            size_t k = i + 1 == pieces ? n - done : (n - done) / 2;
            size_t rest = n - done - k;
            const unsigned char *msg = NULL;
            size_t mn = 0;
            uint8_t *piece = k ? malloc(k) : NULL;
            int rc;

            if (k && !piece)
                goto out;
            if (k)
                memcpy(piece, data + done, k);
            rc = ws_rx_add(&rx, piece, k, first, fin && rest == 0, rest, max, &msg, &mn);
            first = false;
            if (rc == -EMSGSIZE) {
                /* Only when the message would really pass max. */
                if (mlen + k + rest <= max)
                    abort();
                free(piece);
                goto out;
            }
            if (rc < 0) {
                free(piece);
                goto out;
            }
            if (mlen + k > sizeof(model))
                abort(); /* max keeps a message below the model's size */
            if (k)
                memcpy(model + mlen, piece, k);
            mlen += k;
            if (rc == WS_RX_MSG) {
                if (!(fin && rest == 0) || mn != mlen || !msg || (mn && memcmp(msg, model, mn)))
                    abort();
                on_msg(msg, mn, ctx);
                mlen = 0;
                first = true;
            } else if (fin && rest == 0) {
                abort(); /* the last piece of a FIN frame ends the message */
            }
            free(piece);
            done += k;
        }
        data += n;
        size -= n;
    }
out:
    ws_rx_free(&rx);
}

#endif
