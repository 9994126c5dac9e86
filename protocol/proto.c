/*
 * proto.c - frame split, decode and encode (see proto.h, README.md).
 *
 * The decoder never trusts the peer: lengths are checked before any
 * allocation, msgpack_unpack must consume the payload exactly, and every
 * known key must carry its declared wire type.
 */
#include "proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum wire { W_UINT, W_INT, W_BOOL, W_STR, W_BIN, W_STRARR, W_STRMAP, W_MAPARR };

static const struct {
    const char *name;
    enum wire wire;
} keys[PK__COUNT] = {
    [PK_T] = {"t", W_UINT},
    [PK_ID] = {"id", W_UINT},
    [PK_V] = {"v", W_UINT},
    [PK_KERNEL] = {"kernel", W_STR},
    [PK_TIME_NS] = {"time_ns", W_UINT},
    [PK_ENTROPY] = {"entropy", W_BIN},
    [PK_HOSTNAME] = {"hostname", W_STR},
    [PK_ARGV] = {"argv", W_STRARR},
    [PK_CMD] = {"cmd", W_STR},
    [PK_ENV] = {"env", W_STRMAP},
    [PK_CWD] = {"cwd", W_STR},
    [PK_USER] = {"user", W_STR},
    [PK_TIMEOUT] = {"timeout_ms", W_UINT},
    [PK_STDIN] = {"stdin", W_BOOL},
    [PK_DATA] = {"data", W_BIN},
    [PK_EOF] = {"eof", W_BOOL},
    [PK_SIG] = {"sig", W_INT},
    [PK_FD] = {"fd", W_UINT},
    [PK_OFF] = {"off", W_UINT},
    [PK_CODE] = {"code", W_INT},
    [PK_TIMED_OUT] = {"timed_out", W_BOOL},
    [PK_N] = {"n", W_UINT},
    [PK_PATH] = {"path", W_STR},
    [PK_TO] = {"to", W_STR},
    [PK_MODE] = {"mode", W_UINT},
    [PK_DEPTH] = {"depth", W_UINT},
    [PK_RECURSIVE] = {"recursive", W_BOOL},
    [PK_SIZE] = {"size", W_UINT},
    [PK_MTIME] = {"mtime", W_INT},
    [PK_TYPE] = {"type", W_STR},
    [PK_NAME] = {"name", W_STR},
    [PK_ENTRIES] = {"entries", W_MAPARR},
    [PK_MSG] = {"msg", W_STR},
    [PK_MEM_MB] = {"mem_mb", W_UINT},
    [PK_BG] = {"bg", W_BOOL},
    [PK_TAG] = {"tag", W_STR},
    [PK_COLS] = {"cols", W_UINT},
    [PK_ROWS] = {"rows", W_UINT},
    [PK_PID] = {"pid", W_UINT},
    [PK_LOST] = {"lost", W_UINT},
    [PK_FOLLOW] = {"follow", W_BOOL},
    [PK_PROCS] = {"procs", W_MAPARR},
    [PK_RING] = {"ring", W_UINT},
    [PK_MAX_PROCS] = {"max_procs", W_UINT},
    [PK_BOOT_ID] = {"boot_id", W_STR},
};

static const char *const type_names[PROTO_TYPE_MAX] = {
    [PROTO_HELLO] = "hello",   [PROTO_INIT] = "init",     [PROTO_EXEC] = "exec",
    [PROTO_STDIN] = "stdin",   [PROTO_SIGNAL] = "signal", [PROTO_OUT] = "out",
    [PROTO_EXIT] = "exit",     [PROTO_CREDIT] = "credit", [PROTO_FWRITE] = "fwrite",
    [PROTO_FREAD] = "fread",   [PROTO_DATA] = "data",     [PROTO_END] = "end",
    [PROTO_STAT] = "stat",     [PROTO_LIST] = "list",     [PROTO_MKDIR] = "mkdir",
    [PROTO_REMOVE] = "remove", [PROTO_RENAME] = "rename", [PROTO_RESULT] = "result",
    [PROTO_ERROR] = "error",   [PROTO_PING] = "ping",     [PROTO_PONG] = "pong",
    [PROTO_ATTACH] = "attach", [PROTO_DETACH] = "detach", [PROTO_PLIST] = "plist",
    [PROTO_PCTL] = "pctl",     [PROTO_RESYNC] = "resync",
};

const char *proto_key_name(enum proto_key k)
{
    return (unsigned)k < PK__COUNT ? keys[k].name : "?";
}

const char *proto_type_name(uint32_t type)
{
    if (type > 0 && type < PROTO_TYPE_MAX)
        return type_names[type];
    return "unknown";
}

const char *proto_strerror(int err)
{
    switch (err) {
    case 0:
        return "ok";
    case PROTO_EAGAIN:
        return "incomplete frame";
    case PROTO_ETOOBIG:
        return "frame larger than the protocol maximum";
    case PROTO_EMSGPACK:
        return "malformed msgpack";
    case PROTO_ESCHEMA:
        return "frame does not match the schema";
    default:
        return err < 0 ? strerror(-err) : "unknown error";
    }
}

int proto_frame_split(const uint8_t *buf, size_t len, const uint8_t **payload, size_t *payload_len,
                      size_t *consumed)
{
    uint32_t n;

    if (len < PROTO_HDR)
        return PROTO_EAGAIN;
    n = (uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 | (uint32_t)buf[2] << 8 | buf[3];
    if (n > PROTO_MAX_FRAME || n == 0)
        return PROTO_ETOOBIG;
    if (len - PROTO_HDR < n)
        return PROTO_EAGAIN;
    *payload = buf + PROTO_HDR;
    *payload_len = n;
    *consumed = PROTO_HDR + n;
    return 0;
}

static bool all_str(const msgpack_object_array *a)
{
    for (uint32_t i = 0; i < a->size; i++)
        if (a->ptr[i].type != MSGPACK_OBJECT_STR)
            return false;
    return true;
}

static bool map_is_str_str(const msgpack_object_map *m)
{
    for (uint32_t i = 0; i < m->size; i++)
        if (m->ptr[i].key.type != MSGPACK_OBJECT_STR || m->ptr[i].val.type != MSGPACK_OBJECT_STR)
            return false;
    return true;
}

static bool all_maps(const msgpack_object_array *a)
{
    for (uint32_t i = 0; i < a->size; i++)
        if (a->ptr[i].type != MSGPACK_OBJECT_MAP)
            return false;
    return true;
}

static int take(const msgpack_object *o, enum wire w, union proto_val *v)
{
    switch (w) {
    case W_UINT:
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
            return PROTO_ESCHEMA;
        v->u = o->via.u64;
        return 0;
    case W_INT:
        if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
            if (o->via.u64 > INT64_MAX)
                return PROTO_ESCHEMA;
            v->i = (int64_t)o->via.u64;
        } else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
            v->i = o->via.i64;
        } else {
            return PROTO_ESCHEMA;
        }
        return 0;
    case W_BOOL:
        if (o->type != MSGPACK_OBJECT_BOOLEAN)
            return PROTO_ESCHEMA;
        v->b = o->via.boolean;
        return 0;
    case W_STR:
        if (o->type != MSGPACK_OBJECT_STR)
            return PROTO_ESCHEMA;
        v->s.p = o->via.str.ptr;
        v->s.len = o->via.str.size;
        return 0;
    case W_BIN:
        if (o->type != MSGPACK_OBJECT_BIN)
            return PROTO_ESCHEMA;
        v->s.p = o->via.bin.ptr;
        v->s.len = o->via.bin.size;
        return 0;
    case W_STRARR:
        if (o->type != MSGPACK_OBJECT_ARRAY || !all_str(&o->via.array))
            return PROTO_ESCHEMA;
        v->arr = &o->via.array;
        return 0;
    case W_MAPARR:
        if (o->type != MSGPACK_OBJECT_ARRAY || !all_maps(&o->via.array))
            return PROTO_ESCHEMA;
        v->arr = &o->via.array;
        return 0;
    case W_STRMAP:
        if (o->type != MSGPACK_OBJECT_MAP || !map_is_str_str(&o->via.map))
            return PROTO_ESCHEMA;
        v->map = &o->via.map;
        return 0;
    }
    return PROTO_ESCHEMA;
}

static int key_index(const char *p, uint32_t len)
{
    for (int k = 0; k < PK__COUNT; k++)
        if (strlen(keys[k].name) == len && memcmp(keys[k].name, p, len) == 0)
            return k;
    return -1;
}

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/*
 * Walk the msgpack encoding without building anything and check that it is
 * exactly one object and that every container's element count fits in the
 * bytes that remain. msgpack_unpack allocates a container's elements from
 * its declared count before reading them, so without this a 30-byte frame
 * claiming a map of 2^31 entries asks for 128 GiB (found by fuzz_proto).
 */
static int msgpack_check(const uint8_t *p, size_t len)
{
    size_t pos = 0;
    uint64_t need = 1; /* objects still to read */

    while (need > 0) {
        uint8_t b;
        uint64_t skip = 0, kids = 0;

        if (pos >= len)
            return PROTO_EMSGPACK;
        b = p[pos++];
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
            /* fixint, nil, bool */
        } else if (b <= 0x8f) {
            kids = 2ull * (b & 0x0f);
        } else if (b <= 0x9f) {
            kids = b & 0x0f;
        } else if (b <= 0xbf) {
            skip = b & 0x1f;
        } else {
            /* For types c4..df: the size of the big-endian length or count that follows the
             * type byte, and the fixed bytes after it (ext's type byte, a number's value). */
            static const struct {
                uint8_t len, fixed;
            } t[] = {
                {1, 0},  {2, 0}, {4, 0},         /* c4-c6 bin 8/16/32 */
                {1, 1},  {2, 1}, {4, 1},         /* c7-c9 ext 8/16/32 */
                {0, 4},  {0, 8},                 /* ca-cb float 32/64 */
                {0, 1},  {0, 2}, {0, 4}, {0, 8}, /* cc-cf uint 8..64 */
                {0, 1},  {0, 2}, {0, 4}, {0, 8}, /* d0-d3 int 8..64 */
                {0, 2},  {0, 3}, {0, 5}, {0, 9}, /* d4-d7 fixext 1..8 */
                {0, 17},                         /* d8 fixext 16 */
                {1, 0},  {2, 0}, {4, 0},         /* d9-db str 8/16/32 */
                {2, 0},  {4, 0},                 /* dc-dd array 16/32 */
                {2, 0},  {4, 0},                 /* de-df map 16/32 */
            };
            unsigned i, n;
            uint64_t v;

            if (b == 0xc1)
                return PROTO_EMSGPACK; /* never used */
            i = b - 0xc4;
            n = t[i].len;
            if (len - pos < n)
                return PROTO_EMSGPACK;
            v = be(p + pos, n);
            pos += n;
            skip = t[i].fixed;
            if (b >= 0xdc && b <= 0xdd)
                kids = v;
            else if (b >= 0xde)
                kids = 2 * v;
            else if (n)
                skip += v; /* bin, ext, str: a length (ext adds its type byte) */
        }
        if (skip > len - pos)
            return PROTO_EMSGPACK;
        pos += skip;
        need = need - 1 + kids;
        /* Every object still owed takes at least one byte. */
        if (need > len - pos)
            return PROTO_EMSGPACK;
    }
    return pos == len ? 0 : PROTO_EMSGPACK;
}

bool proto_boot_id_ok(const char *p, size_t len)
{
    if (len != PROTO_BOOT_ID)
        return false;
    for (size_t i = 0; i < len; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? p[i] != '-' : !((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    }
    return true;
}

/*
 * RESYNC is the one frame whose whole content a guest applies to the machine
 * (clock, RNG, hostname, boot id): it is checked here, once, so the agent
 * never sees a half-valid one. Time and entropy are what it is for: both
 * required. A hostname must be a usable one (1..PROTO_HOST_MAX bytes, no NUL).
 */
static bool resync_ok(const struct proto_frame *f)
{
    const struct proto_str *e = &f->v[PK_ENTROPY].s, *b = &f->v[PK_BOOT_ID].s,
                           *h = &f->v[PK_HOSTNAME].s;

    if (!proto_has(f, PK_TIME_NS) || !proto_has(f, PK_ENTROPY) || e->len == 0 ||
        e->len > PROTO_ENTROPY)
        return false;
    if (proto_has(f, PK_BOOT_ID) && !proto_boot_id_ok(b->p, b->len))
        return false;
    if (proto_has(f, PK_HOSTNAME) &&
        (h->len == 0 || h->len > PROTO_HOST_MAX || memchr(h->p, '\0', h->len)))
        return false;
    return true;
}

int proto_decode(const uint8_t *payload, size_t len, msgpack_zone *zone, struct proto_frame *f)
{
    msgpack_object root;
    size_t off = 0;
    msgpack_unpack_return r;

    memset(f, 0, sizeof(*f));
    if (len > PROTO_MAX_FRAME)
        return PROTO_ETOOBIG;
    if (msgpack_check(payload, len) != 0)
        return PROTO_EMSGPACK;
    r = msgpack_unpack((const char *)payload, len, &off, zone, &root);
    /* Exactly one object per frame: trailing bytes mean a framing bug or an attack. */
    if (r != MSGPACK_UNPACK_SUCCESS || off != len)
        return PROTO_EMSGPACK;
    if (root.type != MSGPACK_OBJECT_MAP)
        return PROTO_ESCHEMA;
    for (uint32_t i = 0; i < root.via.map.size; i++) {
        const msgpack_object_kv *kv = &root.via.map.ptr[i];
        int k;
        if (kv->key.type != MSGPACK_OBJECT_STR)
            return PROTO_ESCHEMA;
        k = key_index(kv->key.via.str.ptr, kv->key.via.str.size);
        if (k < 0)
            continue;
        if (proto_has(f, (enum proto_key)k))
            return PROTO_ESCHEMA; /* duplicate key */
        if (take(&kv->val, keys[k].wire, &f->v[k]) != 0)
            return PROTO_ESCHEMA;
        f->have |= 1ull << k;
    }
    if (!proto_has(f, PK_T) || f->v[PK_T].u == 0 || f->v[PK_T].u >= PROTO_TYPE_MAX)
        return PROTO_ESCHEMA;
    if (proto_has(f, PK_ID) && f->v[PK_ID].u > UINT32_MAX)
        return PROTO_ESCHEMA;
    if (proto_has(f, PK_DATA) && f->v[PK_DATA].s.len > PROTO_MAX_DATA)
        return PROTO_ESCHEMA;
    f->type = (uint32_t)f->v[PK_T].u;
    f->id = (uint32_t)f->v[PK_ID].u;
    if (f->type == PROTO_RESYNC && !resync_ok(f))
        return PROTO_ESCHEMA;
    return 0;
}

int proto_str_copy(const struct proto_str *s, char *dst, size_t cap)
{
    if (s->len >= cap)
        return -ENAMETOOLONG;
    if (memchr(s->p, '\0', s->len))
        return -EINVAL;
    memcpy(dst, s->p, s->len);
    dst[s->len] = '\0';
    return 0;
}

/* ---- buffers ---- */

void proto_buf_init(struct proto_buf *b)
{
    memset(b, 0, sizeof(*b));
}

void proto_buf_free(struct proto_buf *b)
{
    free(b->p);
    proto_buf_init(b);
}

int proto_buf_append(struct proto_buf *b, const void *p, size_t n)
{
    if (b->cap - b->len < n) {
        size_t live = b->len - b->off;
        /* Compact before growing: an output queue is mostly consumed from the front. */
        if (b->off > 0 && b->cap - live >= n) {
            memmove(b->p, b->p + b->off, live);
        } else {
            size_t cap = b->cap ? b->cap : 4096;
            uint8_t *np;
            while (cap - live < n)
                cap *= 2;
            np = malloc(cap);
            if (!np)
                return -ENOMEM;
            if (live)
                memcpy(np, b->p + b->off, live);
            free(b->p);
            b->p = np;
            b->cap = cap;
        }
        b->len = live;
        b->off = 0;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return 0;
}

void proto_buf_consume(struct proto_buf *b, size_t n)
{
    b->off += n;
    if (b->off >= b->len)
        b->off = b->len = 0;
}

/* ---- encoding ---- */

static int enc_write(void *data, const char *p, size_t n)
{
    struct proto_enc *e = data;
    int r;

    if (e->err)
        return -1;
    r = proto_buf_append(e->buf, p, n);
    if (r != 0)
        e->err = r;
    return r ? -1 : 0;
}

int proto_enc_begin(struct proto_enc *e, struct proto_buf *buf, enum proto_type t, uint32_t id,
                    uint32_t nkeys)
{
    static const uint8_t zero[PROTO_HDR];

    e->buf = buf;
    e->start = buf->len - buf->off;
    e->err = 0;
    if (proto_buf_append(buf, zero, sizeof(zero)) != 0)
        return -ENOMEM;
    msgpack_packer_init(&e->pk, e, enc_write);
    msgpack_pack_map(&e->pk, nkeys);
    proto_put_u(e, PK_T, t);
    proto_put_u(e, PK_ID, id);
    return 0;
}

void proto_enc_key(struct proto_enc *e, enum proto_key k)
{
    const char *n = keys[k].name;
    size_t len = strlen(n);
    msgpack_pack_str(&e->pk, len);
    msgpack_pack_str_body(&e->pk, n, len);
}

void proto_put_u(struct proto_enc *e, enum proto_key k, uint64_t v)
{
    proto_enc_key(e, k);
    msgpack_pack_uint64(&e->pk, v);
}

void proto_put_i(struct proto_enc *e, enum proto_key k, int64_t v)
{
    proto_enc_key(e, k);
    msgpack_pack_int64(&e->pk, v);
}

void proto_put_b(struct proto_enc *e, enum proto_key k, bool v)
{
    proto_enc_key(e, k);
    if (v)
        msgpack_pack_true(&e->pk);
    else
        msgpack_pack_false(&e->pk);
}

void proto_put_str(struct proto_enc *e, enum proto_key k, const char *s, size_t n)
{
    proto_enc_key(e, k);
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, s, n);
}

void proto_put_cstr(struct proto_enc *e, enum proto_key k, const char *s)
{
    proto_put_str(e, k, s, strlen(s));
}

void proto_put_bin(struct proto_enc *e, enum proto_key k, const void *p, size_t n)
{
    proto_enc_key(e, k);
    msgpack_pack_bin(&e->pk, n);
    msgpack_pack_bin_body(&e->pk, p, n);
}

int proto_enc_end(struct proto_enc *e)
{
    struct proto_buf *b = e->buf;
    size_t start = b->off + e->start;
    size_t n = b->len - start - PROTO_HDR;
    uint8_t *h;

    if (e->err || n > PROTO_MAX_FRAME) {
        b->len = start; /* drop the broken or oversized frame */
        return e->err ? e->err : PROTO_ETOOBIG;
    }
    h = b->p + start;
    h[0] = (uint8_t)(n >> 24);
    h[1] = (uint8_t)(n >> 16);
    h[2] = (uint8_t)(n >> 8);
    h[3] = (uint8_t)n;
    return 0;
}

int proto_send_credit(struct proto_buf *b, uint32_t id, uint64_t n)
{
    struct proto_enc e;
    if (proto_enc_begin(&e, b, PROTO_CREDIT, id, 3) != 0)
        return -ENOMEM;
    proto_put_u(&e, PK_N, n);
    return proto_enc_end(&e);
}

int proto_send_end(struct proto_buf *b, uint32_t id)
{
    struct proto_enc e;
    if (proto_enc_begin(&e, b, PROTO_END, id, 2) != 0)
        return -ENOMEM;
    return proto_enc_end(&e);
}

int proto_send_error(struct proto_buf *b, uint32_t id, int errnum, const char *msg)
{
    struct proto_enc e;
    if (proto_enc_begin(&e, b, PROTO_ERROR, id, 4) != 0)
        return -ENOMEM;
    proto_put_i(&e, PK_CODE, errnum);
    proto_put_cstr(&e, PK_MSG, msg ? msg : strerror(errnum));
    return proto_enc_end(&e);
}
