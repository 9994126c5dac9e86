/*
 * Unit tests of server/session_frame.c: the agent socket's request decoder and
 * answer encoders, malformed messages included.
 */
#include <errno.h>
#include <string.h>
#include <msgpack.h>

#include "check.h"
#include "session_frame.h"

int failures;

/* A request packed with msgpack-c itself. */
static size_t pack_req(char *out, size_t cap, uint32_t id, const char *op, bool with_data)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    size_t n;

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, with_data ? 5 : 4);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_uint32(&pk, id);
    msgpack_pack_str_with_body(&pk, "op", 2);
    msgpack_pack_str_with_body(&pk, op, strlen(op));
    msgpack_pack_str_with_body(&pk, "argv", 4);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_str_with_body(&pk, "echo", 4);
    msgpack_pack_str_with_body(&pk, "hi", 2);
    msgpack_pack_str_with_body(&pk, "pty", 3);
    msgpack_pack_map(&pk, 2);
    msgpack_pack_str_with_body(&pk, "cols", 4);
    msgpack_pack_int(&pk, 80);
    msgpack_pack_str_with_body(&pk, "rows", 4);
    msgpack_pack_int(&pk, -3);
    if (with_data) {
        msgpack_pack_str_with_body(&pk, "data", 4);
        msgpack_pack_bin_with_body(&pk, "\0\1\2", 3);
    }
    n = sb.size < cap ? sb.size : cap;
    memcpy(out, sb.data, n);
    msgpack_sbuffer_destroy(&sb);
    return n;
}

static int dec(const void *p, size_t n)
{
    struct sf_req r;
    char why[128];
    int rc = sf_decode(p, n, &r, why, sizeof(why));

    if (!rc)
        sf_req_clear(&r);
    else
        CHECK(why[0]);
    return rc;
}

static void test_decode(void)
{
    char buf[256], why[128];
    struct sf_req r;
    size_t n = pack_req(buf, sizeof(buf), 4000000000u, "exec", true);

    CHECK(sf_decode(buf, n, &r, why, sizeof(why)) == 0);
    CHECK(r.id == 4000000000u);
    CHECK(r.op == SF_OP_EXEC);
    CHECK(r.data_len == 3 && r.data && !memcmp(r.data, "\0\1\2", 3));
    CHECK(r.data >= (const uint8_t *)buf && r.data < (const uint8_t *)buf + n); /* no copy */
    CHECK(json_object_size(r.args) == 2);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(r.args, "argv"), 1)), "hi"));
    CHECK(json_integer_value(json_object_get(json_object_get(r.args, "pty"), "rows")) == -3);
    sf_req_clear(&r);

    /* Every strict prefix is refused (truncated msgpack). */
    for (size_t k = 0; k < n; k++)
        CHECK(dec(buf, k) == -EINVAL);
    /* Trailing bytes too. */
    buf[n] = 0;
    CHECK(dec(buf, n + 1) == -EINVAL);

    n = pack_req(buf, sizeof(buf), 1, "fly", false);
    CHECK(dec(buf, n) == -EINVAL);
    n = pack_req(buf, sizeof(buf), 1, "read_file", false);
    CHECK(dec(buf, n) == 0);
}

static void test_malformed(void)
{
    static const struct {
        const char *what;
        const char *bytes;
        size_t n;
    } bad[] = {
        {"not a map", "\x93\x01\x02\x03", 4},
        {"missing id",
         "\x81\xa2op\xa4"
         "exec",
         9},
        {"missing op", "\x81\xa2id\x01", 5},
        {"id negative", "\x82\xa2id\xff\xa2op\xa4stat", 14},
        {"id > u32", "\x82\xa2id\xcf\x00\x00\x00\x01\x00\x00\x00\x00\xa2op\xa4stat", 22},
        {"id twice", "\x83\xa2id\x01\xa2id\x02\xa2op\xa4stat", 17},
        {"huge array count", "\xdd\xff\xff\xff\xff", 5},
        {"huge map count", "\xdf\x7f\xff\xff\xff\x00", 6},
        {"huge str", "\xdb\xff\xff\xff\xff", 5},
        {"0xc1", "\xc1", 1},
        {"empty", "", 0},
        {"bin in args", "\x83\xa2id\x01\xa2op\xa4stat\xa1x\xc4\x01z", 19},
        {"int key", "\x83\xa2id\x01\xa2op\xa4stat\x01\x01", 16},
        {"op not str", "\x82\xa2id\x01\xa2op\x01", 9},
        {"ext", "\x83\xa2id\x01\xa2op\xa4stat\xa1x\xd4\x01\x01", 19},
    };
    unsigned char deep[64];
    size_t i;

    for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (dec(bad[i].bytes, bad[i].n) != -EINVAL) {
            fprintf(stderr, "accepted: %s\n", bad[i].what);
            failures++;
        }
    }
    /* Nesting deeper than SF_DEPTH_MAX: arrays of one array ... */
    for (i = 0; i < sizeof(deep) - 1; i++)
        deep[i] = 0x91;
    deep[i] = 0x01;
    CHECK(sf_check(deep, sizeof(deep)) == -EINVAL);
    CHECK(sf_check(deep + sizeof(deep) - 5, 5) == 0);
}

static void test_encode(void)
{
    struct sf_buf b;
    msgpack_unpacked u;
    size_t off = 0;
    json_t *j = json_pack("{s:s, s:i, s:b, s:n, s:[i,f], s:s}", "type", "exit", "exit_code", 3,
                          "timed_out", 0, "signal", "a", 1, 0.5, "id", "ignored");
    char why[64];
    struct sf_req r;

    sf_buf_init(&b, 16);
    CHECK(sf_enc_data(&b, 7, "stdout", 1ull << 40, "abc", 3) == 0);
    CHECK(b.len == b.head + sf_buf_msg_len(&b) && sf_buf_msg_len(&b) > 3);
    CHECK(sf_check(sf_buf_msg(&b), sf_buf_msg_len(&b)) == 0);
    msgpack_unpacked_init(&u);
    CHECK(msgpack_unpack_next(&u, (char *)sf_buf_msg(&b), sf_buf_msg_len(&b), &off) ==
          MSGPACK_UNPACK_SUCCESS);
    CHECK(u.data.type == MSGPACK_OBJECT_MAP && u.data.via.map.size == 4);
    CHECK(u.data.via.map.ptr[2].val.via.u64 == 1ull << 40);
    CHECK(u.data.via.map.ptr[3].val.type == MSGPACK_OBJECT_BIN);
    msgpack_unpacked_destroy(&u);
    sf_buf_free(&b);

    /* An answer with an "op" added decodes back as a request with the same fields. */
    json_object_set_new(j, "op", json_string("stat"));
    sf_buf_init(&b, 0);
    CHECK(sf_enc_json(&b, 9, NULL, j) == 0);
    CHECK(sf_decode(sf_buf_msg(&b), sf_buf_msg_len(&b), &r, why, sizeof(why)) == 0);
    CHECK(r.id == 9 && r.op == SF_OP_STAT);
    json_object_del(j, "op");
    json_object_del(j, "id");
    CHECK(json_equal(r.args, j));
    sf_req_clear(&r);
    sf_buf_free(&b);

    sf_buf_init(&b, 4);
    CHECK(sf_enc_error(&b, 1, "process_not_found", "no such process") == 0);
    CHECK(sf_check(sf_buf_msg(&b), sf_buf_msg_len(&b)) == 0);
    sf_buf_free(&b);
    json_decref(j);
}

int main(void)
{
    test_decode();
    test_malformed();
    test_encode();
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures != 0;
}
