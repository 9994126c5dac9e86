/*
 * multipart.h - a streaming decoder of a multipart/form-data body that
 * carries one file (E2B's POST /files): the part's bytes come out as they
 * arrive, whatever the body's size, with no more memory than its part
 * headers (capped) and nothing for the data.
 *
 * Strict: the body must open with its boundary (no preamble), hold exactly
 * one part, and close with "--boundary--". The bytes that could begin the
 * closing delimiter are held back, never buffered: while they match, they
 * are the delimiter's own prefix, so only a count is kept (a KMP automaton
 * over the delimiter).
 *
 * Pure, no I/O, no allocation; fuzzed (tests/fuzz/fuzz_multipart.c).
 */
#ifndef WARREN_MULTIPART_H
#define WARREN_MULTIPART_H

#include <stdbool.h>
#include <stddef.h>

#define MPART_BOUNDARY_MAX 70   /* RFC 2046 */
#define MPART_HEAD_MAX     4096 /* the opening boundary line and the part's headers */
#define MPART_DELIM_MAX    (4 + MPART_BOUNDARY_MAX)

enum mpart_state {
    MPART_OPEN,  /* the opening boundary and the part's headers */
    MPART_DATA,  /* the part's bytes */
    MPART_CLOSE, /* after the delimiter: "--" must follow */
    MPART_DONE,  /* closed: the rest (epilogue) is ignored */
    MPART_FAILED,
};

struct mpart {
    enum mpart_state st;
    char delim[MPART_DELIM_MAX + 1]; /* "\r\n--" boundary */
    size_t dlen;
    unsigned short fail[MPART_DELIM_MAX]; /* the delimiter's KMP failure function */
    size_t k;                             /* bytes of the delimiter matched so far */
    char head[MPART_HEAD_MAX];            /* MPART_OPEN: what arrived of it */
    size_t hn;
    size_t cn;          /* MPART_CLOSE: bytes of "--" seen */
    char filename[256]; /* the part's filename, when it gives one that fits */
};

enum {
    MPART_MORE = 0, /* all taken, more needed */
    MPART_END = 1,  /* the closing delimiter arrived */
};

/* From a Content-Type header value: 0, or -EINVAL when it is not multipart/form-data
 * with a valid boundary parameter. */
int mpart_init(struct mpart *m, const char *content_type);
/*
 * Feed n bytes at b. The part's bytes among them are written to out (room for n bytes
 * plus MPART_DELIM_MAX: held-back bytes may be released), their count to *olen.
 * MPART_MORE or MPART_END (*used: the bytes taken, all when MORE); -EINVAL for a
 * malformed body, -E2BIG for headers over MPART_HEAD_MAX. Errors are sticky.
 */
int mpart_feed(struct mpart *m, const unsigned char *b, size_t n, size_t *used, unsigned char *out,
               size_t *olen);

#endif
