/*
 * ws_rx.c - message reassembly and the close-frame check of both WebSocket doors
 * (ws_rx.h). Pure: no lws, no I/O.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "ws_rx.h"

int ws_rx_add(struct ws_rx *r, const void *in, size_t len, bool first, bool final, size_t rest,
              size_t max, const unsigned char **msg, size_t *n)
{
    /* A new message drops whatever a broken sequence left (lws refuses one anyway). */
    if (first)
        r->len = 0;
    if (len > max || rest > max - len || r->len > max - len - rest)
        return -EMSGSIZE;
    if (!r->len && final) {
        /* Whole in one piece: no copy. An empty message may come with in NULL. */
        *msg = len ? in : (const unsigned char *)"";
        *n = len;
        return WS_RX_MSG;
    }
    if (r->len + len > r->cap) {
        /* Room for the rest of this frame too: one allocation per frame. */
        size_t cap = r->len + len + rest;
        unsigned char *nb = realloc(r->buf, cap);
        if (!nb)
            return -ENOMEM;
        r->buf = nb;
        r->cap = cap;
    }
    /* A piece may be empty (an empty first fragment): in may be NULL then. */
    if (len)
        memcpy(r->buf + r->len, in, len);
    r->len += len;
    if (!final)
        return WS_RX_MORE;
    *msg = r->buf ? r->buf : (const unsigned char *)"";
    *n = r->len;
    r->len = 0;
    return WS_RX_MSG;
}

void ws_rx_free(struct ws_rx *r)
{
    free(r->buf);
    memset(r, 0, sizeof(*r));
}

int ws_close_check(const unsigned char *p, size_t n, const char **why)
{
    unsigned code;

    if (n == 0)
        return 0;
    if (n == 1) {
        *why = "a close payload of one byte";
        return 1002;
    }
    code = (unsigned)p[0] << 8 | p[1];
    /* Codes a peer may send: the registered ones but 1004-1006 and 1015 (never on the
     * wire), and the ranges for libraries and applications. */
    if (!((code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) ||
          (code >= 3000 && code <= 4999))) {
        *why = "invalid close code";
        return 1002;
    }
    if (!api_utf8_valid(p + 2, n - 2)) {
        *why = "close reason is not UTF-8";
        return 1007;
    }
    return 0;
}
