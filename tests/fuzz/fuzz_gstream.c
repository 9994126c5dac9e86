/*
 * fuzz_gstream.c - libFuzzer target for the host's handling of SEQUENCES of
 * guest frames: the input is a byte stream as a hostile guest could write
 * it, split and decoded by protocol/proto.c, and every frame is applied the
 * way ops.c and ops_proc.c apply it to six streams (1 and 2: exec, 3: file
 * read, 4: upload, 5: an ATTACH to a process's ring from offset 1000, 6: a
 * process list), through core/gstream.c and core/procs.c, with accepted exec output encoded by
 * server/api.c's NDJSON encoder into buffers of exactly api_ndjson_max()
 * bytes (ASan reports one byte over). Wrong offsets, credit abuse, oversize
 * data, sizes announced late and bogus ids all come from the input.
 *
 * Checked after every frame: accepted data is contiguous per fd and never
 * beyond the credit granted or the size announced; a refused frame changes
 * nothing; upload room never exceeds the window; signals and times are
 * checked as ops.c relies on. All OUT data is also fed to a second encoder
 * at the guest's own offsets (the pre-check path), so the encoder's budget
 * is fuzzed with non-contiguous offsets too. On the ring stream a frame
 * may skip bytes (lost) only to land exactly where it says; every RESULT
 * with a process list goes through procs_list_json, whose refusal must
 * leave nothing behind and whose output must be the documented JSON. Built with GSTREAM_WINDOW
 * 4096 so that credit abuse takes inputs of a few KiB, not MiBs.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "gstream.h"
#include "procs.h"
#include "sbx_json.h"
#include "proto.h"
#include "util.h"

#define NSTREAMS  7 /* index = stream id; 0 unused */
#define RING_FROM 1000

struct host {
    struct gstream g[NSTREAMS];
    uint64_t unacked[NSTREAMS]; /* consumed, credit not yet sent (batched like ops.c) */
    bool head;                  /* stream 3: RESULT seen */
    bool dead[NSTREAMS];        /* a violation ended the stream */
    struct api_utf8_hold hold[3], raw[3];
};

static void encode(struct api_utf8_hold *h, int fd, uint64_t off, const uint8_t *p, size_t n)
{
    size_t max = api_ndjson_max(n);
    char *out = malloc(max);
    size_t l = api_ndjson_chunk(h, fd, off, p, n, out);

    if (l > max)
        abort();
    free(out);
}

static void consume(struct host *h, uint32_t id, uint64_t n)
{
    h->unacked[id] += n;
    if (h->unacked[id] >= GSTREAM_WINDOW / 4) {
        gstream_granted(&h->g[id], h->unacked[id]);
        h->unacked[id] = 0;
    }
}

static void data(struct host *h, uint32_t id, unsigned fd, const struct proto_frame *f)
{
    struct gstream *g = &h->g[id], before = *g;
    uint64_t n = f->v[PK_DATA].s.len;
    char why[160];
    int r = gstream_rx(g, fd, proto_has(f, PK_OFF), f->v[PK_OFF].u, n, why, sizeof(why));

    if (r != 0) {
        if (memcmp(&before, g, sizeof(before)) != 0 || !why[0])
            abort(); /* a refusal counts nothing and says why */
        h->dead[id] = true;
        return;
    }
    if (f->v[PK_OFF].u != before.next_off[fd] || g->next_off[fd] != before.next_off[fd] + n)
        abort();
    if (g->received > g->granted || (g->size != GSTREAM_NO_SIZE && g->next_off[fd] > g->size))
        abort();
    if (id <= 2)
        encode(&h->hold[fd + 1], (int)fd + 1, f->v[PK_OFF].u, (const uint8_t *)f->v[PK_DATA].s.p,
               n);
    consume(h, id, n);
}

static void ring_data(struct host *h, unsigned fd, const struct proto_frame *f)
{
    struct gstream *g = &h->g[5], before = *g;
    uint64_t n = f->v[PK_DATA].s.len, lost = proto_has(f, PK_LOST) ? f->v[PK_LOST].u : 0;
    char why[200];
    int r = gstream_rx_ring(g, fd, proto_has(f, PK_OFF), f->v[PK_OFF].u, lost, n, why, sizeof(why));

    if (r != 0) {
        if (memcmp(&before, g, sizeof(before)) != 0 || !why[0])
            abort();
        h->dead[5] = true;
        return;
    }
    /* Accepted: exactly where the skip said, and the offset moved past the data. */
    if (f->v[PK_OFF].u != gstream_ring_next(&before) + lost ||
        gstream_ring_next(g) != f->v[PK_OFF].u + n || g->received > g->granted)
        abort();
    encode(&h->hold[fd + 1], (int)fd + 1, f->v[PK_OFF].u, (const uint8_t *)f->v[PK_DATA].s.p, n);
    consume(h, 5, n);
}

static void process_list(const struct proto_frame *f)
{
    json_t *o = NULL, *arr, *p;
    struct sbx_proc_rec *v = NULL;
    char why[256];
    size_t i, n = 0;
    int r = procs_list(f->v[PK_PROCS].arr, 64, &v, &n, why, sizeof(why));

    if (r != 0) {
        if (v || (r == -EPROTO && !why[0]))
            abort();
        return;
    }
    o = sbx_json_procs(v, n);
    free(v);
    arr = json_object_get(o, "processes");
    if (!json_is_array(arr) || json_array_size(arr) != f->v[PK_PROCS].arr->size)
        abort();
    json_array_foreach(arr, i, p)
    {
        json_int_t pid = json_integer_value(json_object_get(p, "pid"));
        if (pid < 1 || pid > PROCS_PID_MAX ||
            json_integer_value(json_object_get(p, "output_start")) >
                json_integer_value(json_object_get(p, "output_end")) ||
            !json_is_string(json_object_get(p, "cmd")))
            abort();
    }
    /* What a client would be sent must serialize. */
    char *s = json_dumps(o, JSON_COMPACT);
    if (!s)
        abort();
    free(s);
    json_decref(o);
}

static void frame(struct host *h, const struct proto_frame *f)
{
    uint32_t id = f->id;
    char buf[32];

    /* The pre-check path: any OUT's bytes at the guest's own offsets. */
    if (f->type == PROTO_OUT && proto_has(f, PK_DATA)) {
        int fd = proto_has(f, PK_FD) && f->v[PK_FD].u == 2 ? 2 : 1;
        encode(&h->raw[fd], fd, f->v[PK_OFF].u, (const uint8_t *)f->v[PK_DATA].s.p,
               f->v[PK_DATA].s.len);
    }
    if (proto_has(f, PK_MTIME)) {
        size_t l = util_iso_time(f->v[PK_MTIME].i, -1, buf, sizeof(buf));
        if (l != 20 || strlen(buf) != 20)
            abort();
    }
    if (id == 0 || id >= NSTREAMS || h->dead[id])
        return; /* sbx.c: a violation, or a late frame dropped */
    if (f->type == PROTO_RESULT && proto_has(f, PK_PROCS))
        process_list(f);
    switch (f->type) {
    case PROTO_OUT:
        if (id == 5 && proto_has(f, PK_DATA) && proto_has(f, PK_FD) &&
            (f->v[PK_FD].u == 1 || f->v[PK_FD].u == 2))
            ring_data(h, (unsigned)f->v[PK_FD].u - 1, f);
        if (id <= 2 && proto_has(f, PK_DATA) && proto_has(f, PK_FD) &&
            (f->v[PK_FD].u == 1 || f->v[PK_FD].u == 2))
            data(h, id, (unsigned)f->v[PK_FD].u - 1, f);
        break;
    case PROTO_EXIT:
        if (proto_has(f, PK_SIG) &&
            gstream_sig_ok(f->v[PK_SIG].i) != (f->v[PK_SIG].i >= 1 && f->v[PK_SIG].i <= 64))
            abort();
        break;
    case PROTO_RESULT:
        if (id == 3 && !h->head) {
            h->head = true;
            if (gstream_set_size(&h->g[3], proto_has(f, PK_SIZE) ? f->v[PK_SIZE].u : 0, buf,
                                 sizeof(buf)) != 0)
                h->dead[3] = true;
        }
        break;
    case PROTO_DATA:
        if (id == 3 && h->head && proto_has(f, PK_DATA))
            data(h, 3, 0, f);
        break;
    case PROTO_CREDIT:
        if (id == 4 && proto_has(f, PK_N)) {
            struct gstream *g = &h->g[4];
            uint64_t in_flight = g->tx_sent - g->tx_acked;
            uint64_t took = gstream_tx_credit(g, f->v[PK_N].u);
            if (took > in_flight || took > f->v[PK_N].u || g->tx_acked > g->tx_sent)
                abort();
        }
        break;
    default:
        break;
    }
    /* The host uploads on stream 4 whatever room it has, some of it (from the id). */
    {
        struct gstream *g = &h->g[4];
        uint64_t room = gstream_tx_room(g), send = room / (1 + (id & 3));
        if (room > GSTREAM_WINDOW)
            abort();
        gstream_tx_sent(g, send);
        if (g->tx_sent - g->tx_acked > GSTREAM_WINDOW)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data_in, size_t size)
{
    static struct host h;
    msgpack_zone zone;
    size_t off = 0;

    memset(&h, 0, sizeof(h));
    for (int i = 0; i < NSTREAMS; i++)
        gstream_init(&h.g[i]);
    gstream_init_ring(&h.g[5], RING_FROM);
    if (!msgpack_zone_init(&zone, 1024))
        return 0;
    while (off < size) {
        const uint8_t *pl;
        size_t pl_len, used;
        struct proto_frame f;
        if (proto_frame_split(data_in + off, size - off, &pl, &pl_len, &used) != 0)
            break;
        if (proto_decode(pl, pl_len, &zone, &f) == 0)
            frame(&h, &f);
        msgpack_zone_clear(&zone);
        off += used;
    }
    msgpack_zone_destroy(&zone);
    return 0;
}
