/*
 * connect.h - the Connect protocol's wire (connectrpc.com/docs/protocol) as
 * E2B's envd speaks it: JSON codec over HTTP/1.1, unary calls and server
 * streams. Pure: no I/O, no allocation but the reader's one buffer, capped.
 *
 * A stream's body is a sequence of envelopes: one flags byte, a 4-byte
 * big-endian length, then that many bytes of JSON. Flag 0x01 says the
 * payload is compressed (never negotiated here: refused), 0x02 marks the
 * last envelope of a response (its JSON is {} or {"error":{...}}).
 * Unary errors are an HTTP status with {"code","message"}; stream errors
 * ride in the end envelope under a 200.
 *
 * The reader takes a body in any pieces and yields whole envelopes, so a
 * request split anywhere decodes the same (fuzzed, tests/fuzz/fuzz_connect.c).
 */
#ifndef WARREN_CONNECT_H
#define WARREN_CONNECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CONNECT_HDR             5
#define CONNECT_FLAG_COMPRESSED 0x01u
#define CONNECT_FLAG_END        0x02u

/* Connect's error codes (their wire names are connect_code_name's). */
enum connect_code {
    CONNECT_OK = 0,
    CONNECT_CANCELED,
    CONNECT_UNKNOWN,
    CONNECT_INVALID_ARGUMENT,
    CONNECT_DEADLINE_EXCEEDED,
    CONNECT_NOT_FOUND,
    CONNECT_ALREADY_EXISTS,
    CONNECT_PERMISSION_DENIED,
    CONNECT_RESOURCE_EXHAUSTED,
    CONNECT_FAILED_PRECONDITION,
    CONNECT_ABORTED,
    CONNECT_OUT_OF_RANGE,
    CONNECT_UNIMPLEMENTED,
    CONNECT_INTERNAL,
    CONNECT_UNAVAILABLE,
    CONNECT_DATA_LOSS,
    CONNECT_UNAUTHENTICATED,
    CONNECT__COUNT
};

/* "canceled", "not_found", ...; "unknown" out of range. */
const char *connect_code_name(enum connect_code c);
/* The HTTP status a unary error is answered with (the protocol's table). */
int connect_code_status(enum connect_code c);

/* The 5 bytes in front of an envelope's payload. */
void connect_env_head(unsigned char out[CONNECT_HDR], unsigned flags, uint32_t len);

/* An envelope reader. max caps one payload (bytes). */
struct connect_rd {
    unsigned char head[CONNECT_HDR];
    size_t hn;  /* head bytes so far */
    size_t max; /* payload cap */
    unsigned flags;
    uint32_t len;       /* this payload's length, once the head is whole */
    unsigned char *buf; /* its bytes (malloc'd, reused; NUL after the last byte) */
    size_t cap, got;
    bool failed;
};

enum {
    CONNECT_RD_MORE = 0, /* every byte given was taken: more are needed */
    CONNECT_RD_MSG = 1,  /* an envelope is whole: r->flags, r->buf, r->len */
};

void connect_rd_init(struct connect_rd *r, size_t max);
void connect_rd_free(struct connect_rd *r);
/*
 * Feed n bytes at b. *used says how many were taken. CONNECT_RD_MSG: one envelope
 * is whole (valid until the next call; the bytes after it are not taken yet);
 * CONNECT_RD_MORE: all taken. -E2BIG: a payload longer than max; -EINVAL: an
 * unknown flag bit, or compression; -ENOMEM. After an error every call fails.
 */
int connect_rd_feed(struct connect_rd *r, const unsigned char *b, size_t n, size_t *used);
/* Is the reader between envelopes (a body that ends here ends cleanly)? */
bool connect_rd_idle(const struct connect_rd *r);

/* Connect-Timeout-Ms: 1 to 10 ASCII digits. 0 and *ms, or -EINVAL. */
int connect_timeout_parse(const char *s, size_t n, uint64_t *ms);

#endif
