/*
 * chunked.h - a pure decoder of HTTP/1.1 chunked request bodies (RFC 9112
 * section 7.1), fed the raw bytes as they arrive, in any split.
 *
 * lws 4.1.6 does not decode chunked request bodies: it hands a POST/PUT
 * without Content-Length to the HTTP_BODY callback as up to 100 MiB of raw
 * bytes, framing included (see http.c). This decoder turns them back into
 * the body. It is strict where leniency lets a proxy and warrend disagree
 * on where a body ends: CRLF only (no bare LF), hex sizes without sign or
 * spaces, lines and trailers capped. No I/O, no allocation: fuzzed by
 * tests/fuzz/fuzz_chunked.c.
 */
#ifndef WARREN_CHUNKED_H
#define WARREN_CHUNKED_H

#include <stddef.h>
#include <stdint.h>

#define CHUNKED_LINE_MAX    4096 /* a size line with its extensions, or one trailer line */
#define CHUNKED_TRAILER_MAX 8192 /* all trailer lines together */

struct chunked {
    int state;
    uint64_t left;   /* data bytes of the current chunk still to come */
    unsigned digits; /* hex digits of the size read so far */
    size_t line;     /* bytes of the current size or trailer line */
    size_t trailer;  /* bytes of trailer lines */
    uint64_t total;  /* data bytes decoded */
};

enum {
    CHUNKED_MORE = 0, /* every byte given was consumed; more are needed */
    CHUNKED_DONE = 1, /* the body ended; bytes after *used are not part of it */
};

void chunked_init(struct chunked *c);

/*
 * Decode from in[0..n). Consumes framing up to and including at most one run
 * of data, which it reports as in[*data_off .. *data_off + *data_len) (len 0
 * if none). *used is the bytes consumed; the caller calls again with the rest
 * until they are all used or the body is done.
 * Returns CHUNKED_MORE, CHUNKED_DONE, or -EINVAL (bad framing) / -E2BIG (a
 * line, a chunk size or the trailer too large): the body cannot be read and
 * the connection must be closed. After DONE or an error, calls return the
 * same and consume nothing.
 */
int chunked_decode(struct chunked *c, const unsigned char *in, size_t n, size_t *used,
                   size_t *data_off, size_t *data_len);

#endif
