/* Unit tests of the frame codec: round trips, splitting, and rejection of bad input. */
#include "proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int failures;
#include "check.h"

static int decode_one(struct proto_buf *b, msgpack_zone *z, struct proto_frame *f, size_t *used)
{
    const uint8_t *pl;
    size_t pl_len;
    int r = proto_frame_split(b->p + b->off, proto_buf_pending(b), &pl, &pl_len, used);
    if (r != 0)
        return r;
    return proto_decode(pl, pl_len, z, f);
}

static void test_roundtrip(void)
{
    struct proto_buf b;
    struct proto_enc e;
    struct proto_frame f;
    msgpack_zone z;
    size_t used;
    static const uint8_t data[5] = {0, 1, 2, 0xff, 0};

    proto_buf_init(&b);
    msgpack_zone_init(&z, 1024);
    CHECK(proto_enc_begin(&e, &b, PROTO_EXEC, 77, 6) == 0);
    proto_enc_key(&e, PK_ARGV);
    msgpack_pack_array(&e.pk, 2);
    msgpack_pack_str_with_body(&e.pk, "echo", 4);
    msgpack_pack_str_with_body(&e.pk, "hi", 2);
    proto_put_cstr(&e, PK_CWD, "/tmp");
    proto_put_u(&e, PK_TIMEOUT, 1500);
    proto_put_bin(&e, PK_DATA, data, sizeof(data));
    CHECK(proto_enc_end(&e) == 0);
    CHECK(proto_send_credit(&b, 77, 4096) == 0);

    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_EXEC && f.id == 77);
    CHECK(proto_has(&f, PK_ARGV) && f.v[PK_ARGV].arr->size == 2);
    CHECK(memcmp(f.v[PK_ARGV].arr->ptr[1].via.str.ptr, "hi", 2) == 0);
    CHECK(f.v[PK_TIMEOUT].u == 1500);
    CHECK(f.v[PK_DATA].s.len == 5 && memcmp(f.v[PK_DATA].s.p, data, 5) == 0);
    CHECK(!proto_has(&f, PK_ENV));
    char cwd[8];
    CHECK(proto_str_copy(&f.v[PK_CWD].s, cwd, sizeof(cwd)) == 0 && strcmp(cwd, "/tmp") == 0);
    CHECK(proto_str_copy(&f.v[PK_CWD].s, cwd, 4) == -ENAMETOOLONG);
    proto_buf_consume(&b, used);

    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_CREDIT && f.id == 77 && f.v[PK_N].u == 4096);
    proto_buf_consume(&b, used);
    CHECK(proto_buf_pending(&b) == 0);
    msgpack_zone_destroy(&z);
    proto_buf_free(&b);
}

/* Every strict prefix of a frame is "need more", never an error or a frame. */
static void test_split_prefixes(void)
{
    struct proto_buf b;
    const uint8_t *pl;
    size_t pl_len, used;

    proto_buf_init(&b);
    CHECK(proto_send_error(&b, 3, ENOENT, "no such file") == 0);
    for (size_t i = 0; i < b.len; i++)
        CHECK(proto_frame_split(b.p, i, &pl, &pl_len, &used) == PROTO_EAGAIN);
    CHECK(proto_frame_split(b.p, b.len, &pl, &pl_len, &used) == 0 && used == b.len);
    proto_buf_free(&b);
}

static void test_rejects(void)
{
    msgpack_zone z;
    struct proto_frame f;
    const uint8_t *pl;
    size_t pl_len, used;
    msgpack_zone_init(&z, 1024);

    /* announced length over the cap, and zero length */
    uint8_t big[4] = {0x7f, 0xff, 0xff, 0xff}, zero[4] = {0, 0, 0, 0};
    CHECK(proto_frame_split(big, 4, &pl, &pl_len, &used) == PROTO_ETOOBIG);
    CHECK(proto_frame_split(zero, 4, &pl, &pl_len, &used) == PROTO_ETOOBIG);

    /* not a map: the integer 1 */
    uint8_t one[1] = {0x01};
    CHECK(proto_decode(one, 1, &z, &f) == PROTO_ESCHEMA);
    /* truncated msgpack: map of 1 with nothing in it */
    uint8_t trunc[1] = {0x81};
    CHECK(proto_decode(trunc, 1, &z, &f) == PROTO_EMSGPACK);
    /* trailing garbage after a valid object: {"t":1} then 0xc0 */
    uint8_t trail[] = {0x81, 0xa1, 't', 0x01, 0xc0};
    CHECK(proto_decode(trail, sizeof(trail), &z, &f) == PROTO_EMSGPACK);
    CHECK(proto_decode(trail, sizeof(trail) - 1, &z, &f) == 0 && f.type == PROTO_HELLO);
    /* t with the wrong wire type (a string) */
    uint8_t badt[] = {0x81, 0xa1, 't', 0xa1, 'x'};
    CHECK(proto_decode(badt, sizeof(badt), &z, &f) == PROTO_ESCHEMA);
    /* unknown type number */
    uint8_t unk[] = {0x81, 0xa1, 't', 0x7f};
    CHECK(proto_decode(unk, sizeof(unk), &z, &f) == PROTO_ESCHEMA);
    /* duplicate key */
    uint8_t dup[] = {0x82, 0xa1, 't', 0x01, 0xa1, 't', 0x01};
    CHECK(proto_decode(dup, sizeof(dup), &z, &f) == PROTO_ESCHEMA);
    /* a map claiming 2^31 entries in a few bytes: rejected before msgpack allocates for them */
    uint8_t huge[] = {0xdf, 0x80, 0x00, 0x00, 0x00, 0xa1, 't', 0x01};
    CHECK(proto_decode(huge, sizeof(huge), &z, &f) == PROTO_EMSGPACK);
    uint8_t hugearr[] = {0x82, 0xa1, 't',  0x03, 0xa4, 'a',  'r',
                         'g',  'v',  0xdd, 0x7f, 0xff, 0xff, 0xff};
    CHECK(proto_decode(hugearr, sizeof(hugearr), &z, &f) == PROTO_EMSGPACK);
    /* a str whose length runs past the end */
    uint8_t longstr[] = {0x81, 0xa1, 't', 0xdb, 0x00, 0x01, 0x00, 0x00, 'x'};
    CHECK(proto_decode(longstr, sizeof(longstr), &z, &f) == PROTO_EMSGPACK);
    /* unknown keys are ignored */
    uint8_t extra[] = {0x82, 0xa1, 't', 0x01, 0xa3, 'z', 'z', 'z', 0x05};
    CHECK(proto_decode(extra, sizeof(extra), &z, &f) == 0);
    /* argv must hold strings only */
    uint8_t argv[] = {0x82, 0xa1, 't', 0x03, 0xa4, 'a', 'r', 'g', 'v', 0x91, 0x05};
    CHECK(proto_decode(argv, sizeof(argv), &z, &f) == PROTO_ESCHEMA);
    msgpack_zone_destroy(&z);
}

/* An output queue that is consumed while frames are appended keeps every frame intact. */
static void test_queue_compaction(void)
{
    struct proto_buf b;
    msgpack_zone z;
    struct proto_frame f;
    size_t used;
    uint64_t sent = 0, got = 0;
    static uint8_t blob[PROTO_MAX_DATA];

    proto_buf_init(&b);
    msgpack_zone_init(&z, 4096);
    for (int round = 0; round < 200; round++) {
        struct proto_enc e;
        CHECK(proto_enc_begin(&e, &b, PROTO_OUT, 1, 5) == 0);
        proto_put_u(&e, PK_FD, 1);
        proto_put_u(&e, PK_OFF, sent);
        proto_put_bin(&e, PK_DATA, blob, (size_t)(round * 331) % sizeof(blob));
        CHECK(proto_enc_end(&e) == 0);
        sent += (size_t)(round * 331) % sizeof(blob);
        if (round % 3 == 2) {
            while (decode_one(&b, &z, &f, &used) == 0) {
                CHECK(f.v[PK_OFF].u == got);
                got += f.v[PK_DATA].s.len;
                proto_buf_consume(&b, used);
            }
        }
    }
    while (decode_one(&b, &z, &f, &used) == 0) {
        CHECK(f.v[PK_OFF].u == got);
        got += f.v[PK_DATA].s.len;
        proto_buf_consume(&b, used);
    }
    CHECK(got == sent);
    msgpack_zone_destroy(&z);
    proto_buf_free(&b);
}

static void test_oversized_frame_dropped(void)
{
    struct proto_buf b;
    struct proto_enc e;
    static uint8_t blob[PROTO_MAX_FRAME];

    proto_buf_init(&b);
    CHECK(proto_send_end(&b, 9) == 0);
    size_t before = b.len;
    CHECK(proto_enc_begin(&e, &b, PROTO_DATA, 9, 3) == 0);
    proto_put_bin(&e, PK_DATA, blob, sizeof(blob));
    CHECK(proto_enc_end(&e) == PROTO_ETOOBIG);
    CHECK(b.len == before);
    proto_buf_free(&b);
}

/* v2: the new frame types come after PONG and the new keys carry their wire types. */
static void test_v2_frames(void)
{
    struct proto_buf b;
    struct proto_enc e;
    struct proto_frame f;
    msgpack_zone z;
    size_t used;

    CHECK(PROTO_VERSION == 2);
    CHECK(PROTO_PONG == 21 && PROTO_ATTACH == 22 && PROTO_DETACH == 23 && PROTO_PLIST == 24 &&
          PROTO_PCTL == 25 && PROTO_RESYNC == 26 && PROTO_TYPE_MAX == 27);
    CHECK(PK_MEM_MB == 33 && PK_BG == 34 && PK_MAX_PROCS == 43 && PK_BOOT_ID == 44);
    CHECK(strcmp(proto_type_name(PROTO_PCTL), "pctl") == 0);
    CHECK(strcmp(proto_key_name(PK_MAX_PROCS), "max_procs") == 0);
    CHECK(strcmp(proto_key_name(PK_LOST), "lost") == 0);

    proto_buf_init(&b);
    msgpack_zone_init(&z, 1024);
    CHECK(proto_enc_begin(&e, &b, PROTO_EXEC, 5, 7) == 0);
    proto_put_cstr(&e, PK_CMD, "top");
    proto_put_b(&e, PK_BG, true);
    proto_put_cstr(&e, PK_TAG, "t1");
    proto_put_u(&e, PK_COLS, 80);
    proto_put_u(&e, PK_ROWS, 24);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(proto_enc_begin(&e, &b, PROTO_ATTACH, 6, 5) == 0);
    proto_put_u(&e, PK_PID, 123);
    proto_put_u(&e, PK_OFF, 1u << 20);
    proto_put_b(&e, PK_FOLLOW, false);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(proto_enc_begin(&e, &b, PROTO_OUT, 6, 6) == 0);
    proto_put_u(&e, PK_FD, 2);
    proto_put_u(&e, PK_OFF, 100);
    proto_put_u(&e, PK_LOST, 40);
    proto_put_bin(&e, PK_DATA, "x", 1);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(proto_enc_begin(&e, &b, PROTO_RESULT, 7, 3) == 0);
    proto_enc_key(&e, PK_PROCS);
    msgpack_pack_array(&e.pk, 1);
    msgpack_pack_map(&e.pk, 1);
    msgpack_pack_str_with_body(&e.pk, "pid", 3);
    msgpack_pack_uint64(&e.pk, 9);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(proto_enc_begin(&e, &b, PROTO_INIT, 8, 4) == 0);
    proto_put_u(&e, PK_RING, 4096);
    proto_put_u(&e, PK_MAX_PROCS, 3);
    CHECK(proto_enc_end(&e) == 0);

    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_EXEC && f.v[PK_BG].b && f.v[PK_COLS].u == 80 && f.v[PK_ROWS].u == 24);
    CHECK(f.v[PK_TAG].s.len == 2 && memcmp(f.v[PK_TAG].s.p, "t1", 2) == 0);
    proto_buf_consume(&b, used);
    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_ATTACH && f.v[PK_PID].u == 123 && f.v[PK_OFF].u == 1u << 20);
    CHECK(proto_has(&f, PK_FOLLOW) && !f.v[PK_FOLLOW].b);
    proto_buf_consume(&b, used);
    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_OUT && f.v[PK_LOST].u == 40 && f.v[PK_OFF].u == 100);
    proto_buf_consume(&b, used);
    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_RESULT && f.v[PK_PROCS].arr->size == 1);
    proto_buf_consume(&b, used);
    CHECK(decode_one(&b, &z, &f, &used) == 0);
    CHECK(f.type == PROTO_INIT && f.v[PK_RING].u == 4096 && f.v[PK_MAX_PROCS].u == 3);
    proto_buf_consume(&b, used);

    /* wrong wire types of the new keys are rejected */
    CHECK(proto_enc_begin(&e, &b, PROTO_EXEC, 9, 3) == 0);
    proto_put_u(&e, PK_BG, 1);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(decode_one(&b, &z, &f, &used) == PROTO_ESCHEMA);
    proto_buf_consume(&b, used);
    CHECK(proto_enc_begin(&e, &b, PROTO_PCTL, 9, 3) == 0);
    proto_put_i(&e, PK_PID, -1);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(decode_one(&b, &z, &f, &used) == PROTO_ESCHEMA);
    proto_buf_consume(&b, used);
    CHECK(proto_enc_begin(&e, &b, PROTO_RESULT, 9, 3) == 0);
    proto_enc_key(&e, PK_PROCS);
    msgpack_pack_array(&e.pk, 1);
    msgpack_pack_uint64(&e.pk, 1);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(decode_one(&b, &z, &f, &used) == PROTO_ESCHEMA);
    proto_buf_consume(&b, used);
    /* one past the last type is unknown */
    CHECK(proto_enc_begin(&e, &b, (enum proto_type)PROTO_TYPE_MAX, 9, 2) == 0);
    CHECK(proto_enc_end(&e) == 0);
    CHECK(decode_one(&b, &z, &f, &used) == PROTO_ESCHEMA);
    msgpack_zone_destroy(&z);
    proto_buf_free(&b);
}

/* Encode a RESYNC with these parts (NULL/0: absent) and decode it. */
static int resync(uint64_t have_time, size_t nent, const char *boot_id, size_t boot_len,
                  const char *host, size_t host_len, struct proto_frame *f)
{
    static uint8_t ent[PROTO_ENTROPY + 1];
    struct proto_buf b;
    struct proto_enc e;
    msgpack_zone z;
    size_t used;
    int r;

    proto_buf_init(&b);
    msgpack_zone_init(&z, 1024);
    proto_enc_begin(&e, &b, PROTO_RESYNC, 3, 2 + !!have_time + !!nent + !!boot_id + !!host);
    if (have_time)
        proto_put_u(&e, PK_TIME_NS, have_time);
    if (nent)
        proto_put_bin(&e, PK_ENTROPY, ent, nent);
    if (boot_id)
        proto_put_str(&e, PK_BOOT_ID, boot_id, boot_len);
    if (host)
        proto_put_str(&e, PK_HOSTNAME, host, host_len);
    CHECK(proto_enc_end(&e) == 0);
    r = decode_one(&b, &z, f, &used);
    msgpack_zone_destroy(&z);
    proto_buf_free(&b);
    return r;
}

/* RESYNC decodes only whole: its bounds are the decoder's, not the agent's. */
static void test_resync(void)
{
    static const char id[] = "0123abcd-4567-89ef-0123-456789abcdef";
    char host[PROTO_HOST_MAX + 1];
    struct proto_frame f;

    memset(host, 'h', sizeof(host));
    CHECK(strcmp(proto_type_name(PROTO_RESYNC), "resync") == 0);
    CHECK(strcmp(proto_key_name(PK_BOOT_ID), "boot_id") == 0);
    CHECK(resync(1, PROTO_ENTROPY, id, 36, "sandbox", 7, &f) == 0);
    CHECK(f.type == PROTO_RESYNC && f.id == 3 && f.v[PK_TIME_NS].u == 1);
    CHECK(f.v[PK_ENTROPY].s.len == PROTO_ENTROPY && f.v[PK_BOOT_ID].s.len == 36);
    CHECK(resync(1, 1, NULL, 0, NULL, 0, &f) == 0);
    CHECK(resync(1, 1, NULL, 0, host, PROTO_HOST_MAX, &f) == 0);
    /* required: time and 1..PROTO_ENTROPY bytes of entropy */
    CHECK(resync(0, 8, NULL, 0, NULL, 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 0, NULL, 0, NULL, 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, PROTO_ENTROPY + 1, NULL, 0, NULL, 0, &f) == PROTO_ESCHEMA);
    /* a boot id is a lowercase UUID, exactly */
    CHECK(resync(1, 8, id, 35, NULL, 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 8, "0123ABCD-4567-89ef-0123-456789abcdef", 36, NULL, 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 8, "0123abcd04567-89ef-0123-456789abcdef", 36, NULL, 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 8, "0123abcd-4567-89ef-0123-456789abcde\0", 36, NULL, 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 8, "", 0, NULL, 0, &f) == PROTO_ESCHEMA);
    /* a hostname is 1..PROTO_HOST_MAX bytes without NUL */
    CHECK(resync(1, 8, NULL, 0, host, PROTO_HOST_MAX + 1, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 8, NULL, 0, "", 0, &f) == PROTO_ESCHEMA);
    CHECK(resync(1, 8, NULL, 0, "a\0b", 3, &f) == PROTO_ESCHEMA);
    CHECK(proto_boot_id_ok(id, 36) && !proto_boot_id_ok(id, 37));
}

int main(void)
{
    test_v2_frames();
    test_resync();
    test_roundtrip();
    test_split_prefixes();
    test_rejects();
    test_queue_compaction();
    test_oversized_frame_dropped();
    if (failures) {
        fprintf(stderr, "proto: %d checks failed\n", failures);
        return 1;
    }
    printf("proto: all checks passed\n");
    return 0;
}
