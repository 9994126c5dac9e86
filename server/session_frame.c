/*
 * session_frame.c - msgpack frames of the agent socket: a structural check, the
 * request decoder and the answer encoders (session_frame.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <msgpack.h>

#include "session_frame.h"

static const char *const op_names[SF_OP__COUNT] = {
    [SF_OP_EXEC] = "exec",
    [SF_OP_STDIN] = "stdin",
    [SF_OP_SIGNAL] = "signal",
    [SF_OP_RESIZE] = "resize",
    [SF_OP_ATTACH] = "attach",
    [SF_OP_DETACH] = "detach",
    [SF_OP_PROCESSES] = "processes",
    [SF_OP_READ_FILE] = "read_file",
    [SF_OP_WRITE_FILE] = "write_file",
    [SF_OP_STAT] = "stat",
    [SF_OP_LIST] = "list",
    [SF_OP_MKDIR] = "mkdir",
    [SF_OP_REMOVE] = "remove",
    [SF_OP_RENAME] = "rename",
    [SF_OP_WATCH] = "watch",
};

const char *sf_op_name(enum sf_op op)
{
    return (unsigned)op < SF_OP__COUNT ? op_names[op] : "?";
}

/* ------------------------------------------------------------------ check */

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;

    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* The end of the value at p, or NULL. Every element of a container takes at least one
 * byte, so a count larger than the bytes left is refused before anything is allocated. */
static const uint8_t *walk(const uint8_t *p, const uint8_t *end, int depth)
{
    uint64_t n = 0, skip = 0;
    int lb = 0, items = 0; /* items: 1 array, 2 map */
    uint8_t b;

    if (p >= end || depth > SF_DEPTH_MAX)
        return NULL;
    b = *p++;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return p;
    if (b >= 0x80 && b <= 0x8f) {
        n = b & 0x0f;
        items = 2;
    } else if (b >= 0x90 && b <= 0x9f) {
        n = b & 0x0f;
        items = 1;
    } else if (b >= 0xa0 && b <= 0xbf) {
        skip = b & 0x1f;
    } else {
        switch (b) {
        case 0xc4:
        case 0xd9:
            lb = 1;
            break; /* bin8, str8 */
        case 0xc5:
        case 0xda:
            lb = 2;
            break;
        case 0xc6:
        case 0xdb:
            lb = 4;
            break;
        case 0xc7:
            lb = 1;
            skip = 1;
            break; /* ext: length, then a type byte */
        case 0xc8:
            lb = 2;
            skip = 1;
            break;
        case 0xc9:
            lb = 4;
            skip = 1;
            break;
        case 0xca:
            skip = 4;
            break;
        case 0xcb:
            skip = 8;
            break;
        case 0xcc:
        case 0xd0:
            skip = 1;
            break;
        case 0xcd:
        case 0xd1:
            skip = 2;
            break;
        case 0xce:
        case 0xd2:
            skip = 4;
            break;
        case 0xcf:
        case 0xd3:
            skip = 8;
            break;
        case 0xd4:
            skip = 2;
            break;
        case 0xd5:
            skip = 3;
            break;
        case 0xd6:
            skip = 5;
            break;
        case 0xd7:
            skip = 9;
            break;
        case 0xd8:
            skip = 17;
            break;
        case 0xdc:
            lb = 2;
            items = 1;
            break;
        case 0xdd:
            lb = 4;
            items = 1;
            break;
        case 0xde:
            lb = 2;
            items = 2;
            break;
        case 0xdf:
            lb = 4;
            items = 2;
            break;
        default:
            return NULL; /* 0xc1: never used */
        }
        if (lb) {
            if ((size_t)(end - p) < (size_t)lb)
                return NULL;
            n = be(p, lb);
            p += lb;
            if (!items)
                skip += n, n = 0;
        }
    }
    if ((uint64_t)(end - p) < skip)
        return NULL;
    p += skip;
    if (items) {
        n *= (uint64_t)items;
        if (n > (uint64_t)(end - p))
            return NULL;
        while (n--)
            if (!(p = walk(p, end, depth + 1)))
                return NULL;
    }
    return p;
}

int sf_check(const void *buf, size_t len)
{
    const uint8_t *end = (const uint8_t *)buf + len;

    return walk(buf, end, 0) == end ? 0 : -EINVAL;
}

/* ----------------------------------------------------------------- decode */

static json_t *to_json(const msgpack_object *o)
{
    json_t *j;

    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
        return json_null();
    case MSGPACK_OBJECT_BOOLEAN:
        return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return o->via.u64 > INT64_MAX ? NULL : json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR:
        /* NULL for invalid UTF-8 or an embedded NUL */
        if (memchr(o->via.str.ptr, 0, o->via.str.size))
            return NULL;
        return json_stringn(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_ARRAY:
        if (!(j = json_array()))
            return NULL;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            json_t *v = to_json(&o->via.array.ptr[i]);
            if (!v || json_array_append_new(j, v)) {
                json_decref(j);
                return NULL;
            }
        }
        return j;
    case MSGPACK_OBJECT_MAP: {
        char key[256];
        if (!(j = json_object()))
            return NULL;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            json_t *v;
            if (kv->key.type != MSGPACK_OBJECT_STR || kv->key.via.str.size >= sizeof(key) ||
                memchr(kv->key.via.str.ptr, 0, kv->key.via.str.size)) {
                json_decref(j);
                return NULL;
            }
            memcpy(key, kv->key.via.str.ptr, kv->key.via.str.size);
            key[kv->key.via.str.size] = 0;
            v = to_json(&kv->val);
            if (!v || json_object_set_new(j, key, v)) {
                json_decref(j);
                return NULL;
            }
        }
        return j;
    }
    default: /* bin and ext only where a field says so */
        return NULL;
    }
}

static bool key_is(const msgpack_object *k, const char *s)
{
    size_t n = strlen(s);

    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && !memcmp(k->via.str.ptr, s, n);
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, whycap, __VA_ARGS__);                                                        \
        goto out;                                                                                  \
    } while (0)

int sf_decode(const void *buf, size_t len, struct sf_req *out, char *why, size_t whycap)
{
    msgpack_unpacked u;
    size_t off = 0;
    bool have_id = false, have_op = false;
    int rc = -EINVAL;
    const msgpack_object *m;

    memset(out, 0, sizeof(*out));
    msgpack_unpacked_init(&u);
    if (sf_check(buf, len))
        FAIL("not one msgpack value");
    if (msgpack_unpack_next(&u, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        FAIL("not one msgpack value");
    m = &u.data;
    if (m->type != MSGPACK_OBJECT_MAP)
        FAIL("a request must be a msgpack map");
    if (!(out->args = json_object()))
        FAIL("out of memory");
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        if (key_is(k, "id")) {
            if (have_id || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > UINT32_MAX)
                FAIL("'id' must be one unsigned 32-bit integer");
            out->id = (uint32_t)v->via.u64;
            have_id = true;
        } else if (key_is(k, "op")) {
            int o;
            if (have_op || v->type != MSGPACK_OBJECT_STR)
                FAIL("'op' must be one string");
            for (o = 0; o < SF_OP__COUNT; o++)
                if (key_is(v, op_names[o]))
                    break;
            if (o == SF_OP__COUNT)
                FAIL("unknown op '%.*s'", (int)(v->via.str.size > 32 ? 32 : v->via.str.size),
                     v->via.str.ptr);
            out->op = (enum sf_op)o;
            have_op = true;
        } else if (key_is(k, "data")) {
            if (out->data || (v->type != MSGPACK_OBJECT_BIN && v->type != MSGPACK_OBJECT_STR))
                FAIL("'data' must be one bin or str");
            /* msgpack-c points bin and str into the input: no copy. */
            out->data =
                (const uint8_t *)(v->type == MSGPACK_OBJECT_BIN ? v->via.bin.ptr : v->via.str.ptr);
            out->data_len = v->type == MSGPACK_OBJECT_BIN ? v->via.bin.size : v->via.str.size;
            if (!out->data)
                out->data = (const uint8_t *)buf; /* empty: still present */
        } else {
            json_t *j;
            char key[256];
            if (k->type != MSGPACK_OBJECT_STR || k->via.str.size >= sizeof(key) ||
                memchr(k->via.str.ptr, 0, k->via.str.size))
                FAIL("map keys must be short strings");
            memcpy(key, k->via.str.ptr, k->via.str.size);
            key[k->via.str.size] = 0;
            if (json_object_get(out->args, key))
                FAIL("field '%s' given twice", key);
            if (!(j = to_json(v)))
                FAIL("field '%s': bin, ext, non-string keys, invalid UTF-8 or integers above "
                     "2^63 are not allowed here",
                     key);
            json_object_set_new(out->args, key, j);
        }
    }
    if (!have_id)
        FAIL("missing 'id'");
    if (!have_op)
        FAIL("missing 'op'");
    rc = 0;
out:
    msgpack_unpacked_destroy(&u);
    if (rc) {
        json_decref(out->args);
        memset(out, 0, sizeof(*out));
    }
    return rc;
}

void sf_req_clear(struct sf_req *r)
{
    json_decref(r->args);
    memset(r, 0, sizeof(*r));
}

/* ----------------------------------------------------------------- encode */

void sf_buf_init(struct sf_buf *b, size_t head)
{
    memset(b, 0, sizeof(*b));
    b->head = head;
}

void sf_buf_free(struct sf_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

static int buf_write(void *data, const char *p, size_t n)
{
    struct sf_buf *b = data;

    if (b->oom)
        return -1;
    if (!b->p || b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        unsigned char *np;
        while (cap < b->len + n + b->head)
            cap *= 2;
        if (!(np = realloc(b->p, cap))) {
            b->oom = true;
            return -1;
        }
        b->p = np;
        b->cap = cap;
        if (!b->len)
            b->len = b->head;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);

    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pk_json(msgpack_packer *pk, json_t *j)
{
    const char *k;
    json_t *v;
    size_t i;

    switch (json_typeof(j)) {
    case JSON_OBJECT:
        msgpack_pack_map(pk, json_object_size(j));
        json_object_foreach(j, k, v)
        {
            pk_str(pk, k);
            pk_json(pk, v);
        }
        break;
    case JSON_ARRAY:
        msgpack_pack_array(pk, json_array_size(j));
        json_array_foreach(j, i, v) pk_json(pk, v);
        break;
    case JSON_STRING:
        msgpack_pack_str(pk, json_string_length(j));
        msgpack_pack_str_body(pk, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        msgpack_pack_int64(pk, json_integer_value(j));
        break;
    case JSON_REAL:
        msgpack_pack_double(pk, json_real_value(j));
        break;
    case JSON_TRUE:
        msgpack_pack_true(pk);
        break;
    case JSON_FALSE:
        msgpack_pack_false(pk);
        break;
    default:
        msgpack_pack_nil(pk);
        break;
    }
}

static int finish(struct sf_buf *b)
{
    if (b->oom) {
        sf_buf_free(b);
        return -ENOMEM;
    }
    return 0;
}

int sf_enc_data(struct sf_buf *b, uint32_t id, const char *type, uint64_t offset, const void *p,
                size_t n)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, b, buf_write);
    msgpack_pack_map(&pk, 4);
    pk_str(&pk, "id");
    msgpack_pack_uint32(&pk, id);
    pk_str(&pk, "type");
    pk_str(&pk, type);
    pk_str(&pk, "offset");
    msgpack_pack_uint64(&pk, offset);
    pk_str(&pk, "data");
    msgpack_pack_bin(&pk, n);
    msgpack_pack_bin_body(&pk, p, n);
    return finish(b);
}

int sf_enc_json(struct sf_buf *b, uint32_t id, const char *type, json_t *obj)
{
    msgpack_packer pk;
    const char *k;
    json_t *v;
    size_t n = 1 + (type != NULL);

    json_object_foreach(obj, k, v) if (strcmp(k, "id") && !(type && !strcmp(k, "type"))) n++;
    msgpack_packer_init(&pk, b, buf_write);
    msgpack_pack_map(&pk, n);
    pk_str(&pk, "id");
    msgpack_pack_uint32(&pk, id);
    if (type) {
        pk_str(&pk, "type");
        pk_str(&pk, type);
    }
    json_object_foreach(obj, k, v)
    {
        if (!strcmp(k, "id") || (type && !strcmp(k, "type")))
            continue;
        pk_str(&pk, k);
        pk_json(&pk, v);
    }
    return finish(b);
}

int sf_enc_error(struct sf_buf *b, uint32_t id, const char *code, const char *msg)
{
    msgpack_packer pk;

    msgpack_packer_init(&pk, b, buf_write);
    msgpack_pack_map(&pk, 4);
    pk_str(&pk, "id");
    msgpack_pack_uint32(&pk, id);
    pk_str(&pk, "type");
    pk_str(&pk, "error");
    pk_str(&pk, "code");
    pk_str(&pk, code);
    pk_str(&pk, "message");
    pk_str(&pk, msg);
    return finish(b);
}
