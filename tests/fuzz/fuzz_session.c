/*
 * Fuzz the agent socket's door with SEQUENCES of messages as one socket receives them:
 * frames, fragments and pieces, empty ones included, joined by server/ws_rx.c
 * (ws_pieces.h says the input's shape), then decoded by server/session_frame.c. Each
 * message is decoded; a request in flight is modelled (ids, as
 * ws_session.c keeps them) and every decoded request is re-encoded as an answer with
 * its op added back, decoded again, and must give the same id, op and fields. Its
 * data (pointing into the message) is echoed through sf_enc_data, which must
 * pass sf_check. sf_check and msgpack-c must agree on every message.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>

#include "session_frame.h"
#include "ws_pieces.h"

#define INFLIGHT 64

static void one(const uint8_t *p, size_t n, uint32_t *ids, size_t *nids)
{
    struct sf_req r, r2;
    struct sf_buf b;
    char why[128];
    size_t i;

    if (sf_check(p, n) == 0) {
        /* The check is structural: msgpack-c must then parse exactly those bytes (it
         * may still refuse what it cannot hold: a too-deep value). */
        msgpack_unpacked u;
        size_t off = 0;
        msgpack_unpacked_init(&u);
        if (msgpack_unpack_next(&u, (const char *)p, n, &off) == MSGPACK_UNPACK_SUCCESS && off != n)
            abort();
        msgpack_unpacked_destroy(&u);
    }
    if (sf_decode(p, n, &r, why, sizeof(why))) {
        if (!why[0])
            abort();
        return;
    }
    if (r.data && (r.data < p || r.data + r.data_len > p + n))
        abort();
    /* the socket's table of requests in flight: a repeated id is refused, a full one
     * retires its oldest */
    for (i = 0; i < *nids && ids[i] != r.id; i++)
        ;
    if (i == *nids) {
        if (*nids == INFLIGHT) {
            memmove(ids, ids + 1, (INFLIGHT - 1) * sizeof(*ids));
            (*nids)--;
        }
        ids[(*nids)++] = r.id;
    }

    json_object_set_new(r.args, "op", json_string(sf_op_name(r.op)));
    sf_buf_init(&b, 16);
    if (sf_enc_json(&b, r.id, NULL, r.args) == 0) {
        if (sf_decode(sf_buf_msg(&b), sf_buf_msg_len(&b), &r2, why, sizeof(why)))
            abort();
        json_object_del(r.args, "op");
        if (r2.id != r.id || r2.op != r.op || !json_equal(r2.args, r.args))
            abort();
        sf_req_clear(&r2);
    }
    sf_buf_free(&b);
    if (r.data) {
        sf_buf_init(&b, 16);
        if (sf_enc_data(&b, r.id, "stdout", r.data_len, r.data, r.data_len) == 0 &&
            sf_check(sf_buf_msg(&b), sf_buf_msg_len(&b)))
            abort();
        sf_buf_free(&b);
    }
    sf_req_clear(&r);
}

struct ctx {
    uint32_t ids[INFLIGHT];
    size_t nids;
};

static void on_msg(const uint8_t *p, size_t n, void *c)
{
    struct ctx *x = c;
    /* a copy of exactly n bytes, so ASan sees any read past the message */
    uint8_t *m = malloc(n ? n : 1);

    if (!m)
        return;
    if (n)
        memcpy(m, p, n);
    one(m, n, x->ids, &x->nids);
    free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ctx x = {.nids = 0};

    ws_pieces(data, size, 65536, on_msg, &x);
    return 0;
}
