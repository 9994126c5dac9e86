/*
 * connect.c - the Connect protocol's framing, codes and headers (connect.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "connect.h"

static const struct {
    const char *name;
    int status;
} codes[CONNECT__COUNT] = {
    [CONNECT_OK] = {"ok", 200},
    [CONNECT_CANCELED] = {"canceled", 499},
    [CONNECT_UNKNOWN] = {"unknown", 500},
    [CONNECT_INVALID_ARGUMENT] = {"invalid_argument", 400},
    [CONNECT_DEADLINE_EXCEEDED] = {"deadline_exceeded", 504},
    [CONNECT_NOT_FOUND] = {"not_found", 404},
    [CONNECT_ALREADY_EXISTS] = {"already_exists", 409},
    [CONNECT_PERMISSION_DENIED] = {"permission_denied", 403},
    [CONNECT_RESOURCE_EXHAUSTED] = {"resource_exhausted", 429},
    [CONNECT_FAILED_PRECONDITION] = {"failed_precondition", 400},
    [CONNECT_ABORTED] = {"aborted", 409},
    [CONNECT_OUT_OF_RANGE] = {"out_of_range", 400},
    [CONNECT_UNIMPLEMENTED] = {"unimplemented", 501},
    [CONNECT_INTERNAL] = {"internal", 500},
    [CONNECT_UNAVAILABLE] = {"unavailable", 503},
    [CONNECT_DATA_LOSS] = {"data_loss", 500},
    [CONNECT_UNAUTHENTICATED] = {"unauthenticated", 401},
};

const char *connect_code_name(enum connect_code c)
{
    return (unsigned)c < CONNECT__COUNT ? codes[c].name : "unknown";
}

int connect_code_status(enum connect_code c)
{
    return (unsigned)c < CONNECT__COUNT ? codes[c].status : 500;
}

void connect_env_head(unsigned char out[CONNECT_HDR], unsigned flags, uint32_t len)
{
    out[0] = (unsigned char)flags;
    out[1] = (unsigned char)(len >> 24);
    out[2] = (unsigned char)(len >> 16);
    out[3] = (unsigned char)(len >> 8);
    out[4] = (unsigned char)len;
}

void connect_rd_init(struct connect_rd *r, size_t max)
{
    memset(r, 0, sizeof(*r));
    r->max = max;
}

void connect_rd_free(struct connect_rd *r)
{
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
}

bool connect_rd_idle(const struct connect_rd *r)
{
    return !r->failed && r->hn == 0;
}

int connect_rd_feed(struct connect_rd *r, const unsigned char *b, size_t n, size_t *used)
{
    size_t off = 0;

    *used = 0;
    if (r->failed)
        return -EINVAL;
    while (r->hn < CONNECT_HDR) {
        if (off == n) {
            *used = off;
            return CONNECT_RD_MORE;
        }
        r->head[r->hn++] = b[off++];
        if (r->hn < CONNECT_HDR)
            continue;
        r->flags = r->head[0];
        r->len = (uint32_t)r->head[1] << 24 | (uint32_t)r->head[2] << 16 |
                 (uint32_t)r->head[3] << 8 | r->head[4];
        r->got = 0;
        /* Compression is never offered (no Connect-Accept-Encoding), so a compressed
         * envelope is a client that ignored it. */
        if (r->flags & ~CONNECT_FLAG_END || r->flags & CONNECT_FLAG_COMPRESSED) {
            r->failed = true;
            *used = off;
            return -EINVAL;
        }
        if (r->len > r->max) {
            r->failed = true;
            *used = off;
            return -E2BIG;
        }
        if (r->cap < (size_t)r->len + 1) {
            unsigned char *nb = realloc(r->buf, (size_t)r->len + 1);
            if (!nb) {
                r->failed = true;
                *used = off;
                return -ENOMEM;
            }
            r->buf = nb;
            r->cap = (size_t)r->len + 1;
        }
    }
    {
        size_t take = r->len - r->got;
        if (take > n - off)
            take = n - off;
        if (take)
            memcpy(r->buf + r->got, b + off, take);
        r->got += take;
        off += take;
    }
    *used = off;
    if (r->got < r->len)
        return CONNECT_RD_MORE;
    r->buf[r->len] = '\0';
    r->hn = 0; /* the next call starts the next envelope */
    return CONNECT_RD_MSG;
}

int connect_timeout_parse(const char *s, size_t n, uint64_t *ms)
{
    uint64_t v = 0;

    if (!s || n == 0 || n > 10)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *ms = v;
    return 0;
}
