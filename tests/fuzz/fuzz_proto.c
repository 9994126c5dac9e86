/*
 * fuzz_proto.c - libFuzzer target for the host<->guest frame decoder.
 * Feeds the input as a byte stream (a sequence of frames, v1 and v2, RESYNC): split
 * frames, decode each, and check the invariants both sides rely on (bounded
 * sizes, known type, typed containers).
 */
#include "proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    msgpack_zone zone;
    size_t off = 0;

    if (!msgpack_zone_init(&zone, 1024))
        return 0;
    while (off < size) {
        const uint8_t *pl;
        size_t pl_len, used;
        struct proto_frame f;
        int r = proto_frame_split(data + off, size - off, &pl, &pl_len, &used);
        if (r != 0)
            break;
        if (pl_len > PROTO_MAX_FRAME || used != pl_len + PROTO_HDR)
            abort();
        if (proto_decode(pl, pl_len, &zone, &f) == 0) {
            if (f.type == 0 || f.type >= PROTO_TYPE_MAX)
                abort();
            if (proto_has(&f, PK_DATA) && f.v[PK_DATA].s.len > PROTO_MAX_DATA)
                abort();
            /* RESYNC decodes only whole: time, 1..PROTO_ENTROPY bytes of entropy, a
             * well-formed boot id and a bounded hostname (the guest applies them as is) */
            if (f.type == PROTO_RESYNC) {
                const struct proto_str *e = &f.v[PK_ENTROPY].s, *h = &f.v[PK_HOSTNAME].s;
                if (!proto_has(&f, PK_TIME_NS) || !proto_has(&f, PK_ENTROPY) || e->len == 0 ||
                    e->len > PROTO_ENTROPY)
                    abort();
                if (proto_has(&f, PK_BOOT_ID) &&
                    !proto_boot_id_ok(f.v[PK_BOOT_ID].s.p, f.v[PK_BOOT_ID].s.len))
                    abort();
                if (proto_has(&f, PK_HOSTNAME) &&
                    (h->len == 0 || h->len > PROTO_HOST_MAX || memchr(h->p, '\0', h->len)))
                    abort();
            }
            /* v2: a procs list (PLIST's RESULT) holds only maps */
            if (proto_has(&f, PK_PROCS))
                for (uint32_t i = 0; i < f.v[PK_PROCS].arr->size; i++)
                    if (f.v[PK_PROCS].arr->ptr[i].type != MSGPACK_OBJECT_MAP)
                        abort();
        }
        msgpack_zone_clear(&zone);
        off += used;
    }
    msgpack_zone_destroy(&zone);
    return 0;
}
