/*
 * ws_rx.h - what both WebSocket doors (ws_pty.c, ws_session.c) make of the bytes a
 * client sends before a decoder sees them, as pure functions over bytes (no lws, no
 * I/O) so they can be fuzzed whole (tests/fuzz/fuzz_session.c, fuzz_ws_pty.c):
 * joining the pieces of one message, and judging the payload of a close frame.
 *
 * Ownership: a struct ws_rx belongs to its socket; ws_rx_free releases its buffer
 * (an idle socket holds none). A message handed back by ws_rx_add is borrowed: it
 * points into the piece given or into the struct's buffer, valid until the next call.
 */
#ifndef WARREN_WS_RX_H
#define WARREN_WS_RX_H

#include <stdbool.h>
#include <stddef.h>

/* A message arriving in pieces. Zeroed is empty. */
struct ws_rx {
    unsigned char *buf;
    size_t len, cap;
};

#define WS_RX_MORE 0 /* the message goes on: wait for its next piece */
#define WS_RX_MSG  1 /* *msg, *n is the whole message */

/*
 * One piece as lws hands it over: in, len (len may be 0, and in then NULL); first: it
 * starts a message (lws_is_first_fragment); final: it ends it (lws_is_final_fragment,
 * which is false while the frame has bytes to come); rest: bytes of the current frame
 * still to come (lws_remaining_packet_payload); max: the message size cap, checked
 * against what has come plus rest, so an oversized frame is refused at its first piece.
 * Returns WS_RX_MORE, WS_RX_MSG, -EMSGSIZE past max, or -ENOMEM; after a negative
 * return the socket is to be closed.
 */
int ws_rx_add(struct ws_rx *r, const void *in, size_t len, bool first, bool final, size_t rest,
              size_t max, const unsigned char **msg, size_t *n);
/* Drop a message in progress and the buffer. */
void ws_rx_free(struct ws_rx *r);

/*
 * The payload of a client's close frame (RFC 6455 5.5.1, 7.4): 0 when it may be echoed
 * (empty, or a code a peer may send and a UTF-8 reason), else the code to close with
 * instead, 1002 (a payload of one byte, a code reserved or out of range) or 1007 (a
 * reason that is not UTF-8), and *why says which.
 */
int ws_close_check(const unsigned char *p, size_t n, const char **why);

#endif
