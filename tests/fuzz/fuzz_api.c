/*
 * libFuzzer target for the REST layer's decoders (server/api.c): request
 * bodies, rename bodies, query strings (split at '&' as lws does) and the args
 * they become, routes (against the table's own rows),
 * bearer headers, base64, and the NDJSON encoder, whose output is decoded
 * again and must give back exactly the input bytes, in order, with text
 * lines only when the input was valid UTF-8; and the encoder again at offsets
 * with gaps, as a hostile guest once chose them, against its exact budget.
 *
 * Build: CC=clang cmake -DWARREN_FUZZ=ON ...; make fuzz_api;
 *        ./tests/fuzz/fuzz_api -max_total_time=60 corpus_dir
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "api.h"
#include "cred.h"

#define MAX_IN 65536

static void fuzz_body(const uint8_t *d, size_t n)
{
    struct api_err e;
    json_t *j = NULL, *a = NULL;

    if (api_body_parse((const char *)d, n, &j, &e) == 0) {
        if (!json_is_object(j))
            abort();
        if (api_rename_args(j, &a, &e) == 0 && !json_is_object(a))
            abort();
        json_decref(a);
        json_decref(j);
    } else if (j || e.status < 400 || !e.code) {
        abort();
    }
}

static void fuzz_query_route(const uint8_t *d, size_t n)
{
    const char *frags[64];
    struct api_query q;
    struct api_route r;
    struct api_err e;
    char *s = malloc(n + 1), *p;
    size_t nf = 0;

    memcpy(s, d, n);
    s[n] = '\0';
    /* The route matcher gets the whole string (it stops at NUL). A match is a row of
     * the table whose methods are its verbs'; a miss leaves nothing of a row behind. */
    if (api_route_match(s, &r) == 0) {
        unsigned all = 0;
        if (r.id <= API_R_NONE || r.id >= API_R_COUNT || strlen(r.sbx) > API_ID_MAX ||
            r.pid > API_PID_MAX)
            abort();
        for (unsigned m = API_GET; m <= API_PATCH; m <<= 1)
            if (api_route_verb(r.id, m))
                all |= m;
        if (all != r.methods || (r.sbx[0] && !strstr(api_routes[r.id].pattern, "{id}")))
            abort();
    } else if (r.id || r.methods || r.sbx[0] || r.pid) {
        abort();
    }
    cred_is_key(s, n, "0123456789abcdef0123456789abcdef");
    api_wants_ndjson(s);
    for (p = s; nf < 64;) {
        char *amp = strchr(p, '&');
        frags[nf++] = p;
        if (!amp)
            break;
        *amp = '\0';
        p = amp + 1;
    }
    if (api_query_parse(frags, nf, ~0u, &q, &e) == 0) {
        if (q.metadata && !json_is_object(q.metadata))
            abort();
        json_t *a;
        if (q.path)
            api_path_check("path", q.path, &e);
        /* Without the path check first, a path that is not UTF-8 may fail it (NULL). */
        a = api_query_args(&q, ~0u & ~(unsigned)API_Q_PATH);
        if (!a || !json_is_object(a))
            abort();
        json_decref(a);
        api_query_clear(&q);
    } else if (q.metadata) {
        abort();
    }
    free(s);
}

struct dec {
    size_t len[3];
    int b64_lines;
};

/* Decode NDJSON lines, appending each stream's bytes to bufs[fd]. */
static void decode(struct dec *dc, unsigned char *bufs[3], const char *o, size_t n)
{
    static unsigned char tmp[MAX_IN];

    while (n) {
        const char *nl = memchr(o, '\n', n);
        json_t *j, *v;
        int fd;

        if (!nl)
            abort();
        j = json_loadb(o, (size_t)(nl - o), JSON_ALLOW_NUL, NULL);
        if (!j)
            abort();
        fd = !strcmp(json_string_value(json_object_get(j, "type")), "stdout") ? 1 : 2;
        if ((size_t)json_integer_value(json_object_get(j, "offset")) != dc->len[fd])
            abort();
        if ((v = json_object_get(j, "data"))) {
            memcpy(bufs[fd] + dc->len[fd], json_string_value(v), json_string_length(v));
            dc->len[fd] += json_string_length(v);
        } else {
            const char *b = json_string_value(json_object_get(j, "data_b64"));
            long m = b ? api_b64_decode(b, strlen(b), tmp) : -1;
            if (m <= 0)
                abort();
            memcpy(bufs[fd] + dc->len[fd], tmp, (size_t)m);
            dc->len[fd] += (size_t)m;
            dc->b64_lines++;
        }
        json_decref(j);
        n -= (size_t)(nl - o) + 1;
        o = nl + 1;
    }
}

/* Split the input among fds 1 and 2 in pieces whose sizes come from the input itself. */
static void fuzz_ndjson(const uint8_t *d, size_t n)
{
    struct api_utf8_hold h[3] = {{{0}, 0, 0}};
    unsigned char *want[3], *got[3];
    size_t wlen[3] = {0, 0, 0}, pos = 0, ol;
    struct dec dc = {0};
    char *out;
    unsigned seed = n ? d[0] : 0;

    for (int i = 1; i < 3; i++) {
        want[i] = malloc(n + 1);
        got[i] = malloc(n + 1);
    }
    out = malloc(api_ndjson_max(n) + 2 * api_ndjson_max(0));
    while (pos < n) {
        size_t piece = 1 + (seed = seed * 1103515245u + 12345u) % 7;
        int fd = 1 + (int)((seed >> 16) & 1);
        if (piece > n - pos)
            piece = n - pos;
        ol = api_ndjson_chunk(&h[fd], fd, wlen[fd], d + pos, piece, out);
        if (ol > api_ndjson_max(piece))
            abort();
        decode(&dc, got, out, ol);
        memcpy(want[fd] + wlen[fd], d + pos, piece);
        wlen[fd] += piece;
        pos += piece;
    }
    for (int fd = 1; fd < 3; fd++) {
        ol = api_ndjson_flush(&h[fd], fd, out);
        decode(&dc, got, out, ol);
        if (dc.len[fd] != wlen[fd] || memcmp(got[fd], want[fd], wlen[fd]))
            abort();
    }
    /* Valid UTF-8, however it was cut, must come out as text only. */
    if (dc.b64_lines && api_utf8_valid(want[1], wlen[1]) && api_utf8_valid(want[2], wlen[2]))
        abort();
    free(out);
    for (int i = 1; i < 3; i++) {
        free(want[i]);
        free(got[i]);
    }
}

/* Offsets as a hostile guest picks them (gaps, overlaps, huge): every call's output must fit
 * the budget of exactly api_ndjson_max() bytes (heap-allocated: ASan sees one byte over) and
 * be whole JSON lines. */
static void fuzz_ndjson_gaps(const uint8_t *d, size_t n)
{
    struct api_utf8_hold h[3] = {{{0}, 0, 0}};
    uint64_t off[3] = {0, 0, 0};
    size_t pos = 0;

    while (pos + 2 <= n) {
        uint8_t ctl = d[pos], jump = d[pos + 1];
        size_t piece = 1 + ctl % 9;
        int fd = 1 + ((ctl >> 4) & 1);
        char *out;
        size_t l;

        pos += 2;
        if (piece > n - pos)
            piece = n - pos;
        /* Mostly the next byte; else a gap, a step back, or near the top of the range. */
        if (ctl & 0x20)
            off[fd] += jump;
        else if (ctl & 0x40)
            off[fd] -= off[fd] < jump ? off[fd] : jump;
        else if ((ctl & 0xe0) == 0x80)
            off[fd] = UINT64_MAX - jump * 1000ull;
        out = malloc(api_ndjson_max(piece));
        l = api_ndjson_chunk(&h[fd], fd, off[fd], d + pos, piece, out);
        if (l > api_ndjson_max(piece) || (l && out[l - 1] != '\n'))
            abort();
        for (const char *p = out, *nl; p < out + l; p = nl + 1) {
            json_t *j;
            nl = memchr(p, '\n', (size_t)(out + l - p));
            if (!nl || !(j = json_loadb(p, (size_t)(nl - p),
                                        JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, NULL)))
                abort();
            json_decref(j);
        }
        free(out);
        off[fd] += piece;
        pos += piece;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)
{
    if (n > MAX_IN)
        return 0;
    fuzz_body(d, n);
    fuzz_query_route(d, n);
    fuzz_ndjson(d, n);
    fuzz_ndjson_gaps(d, n);
    return 0;
}
