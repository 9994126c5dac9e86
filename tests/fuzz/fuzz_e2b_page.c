/*
 * fuzz_e2b_page.c - E2B's paged list over a fleet (server/e2b_page.c): a client's
 * nextToken, then a sequence of peers' answers merged into one page. The input's first
 * line is the token; the rest, split at NUL bytes, are the peers' JSON answers in turn,
 * the first byte of the input choosing the limit. A token that decodes encodes back to
 * the same position; a page holds at most limit items, in strictly increasing order,
 * each after the token.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "e2b_page.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char tok[E2B_TOKEN_MAX * 2 + 2], again[E2B_TOKEN_MAX + 1];
    const char *why = NULL, *end = memchr(data, '\n', size);
    size_t tl = end ? (size_t)(end - (const char *)data) : size, limit, off;
    struct e2b_pos after, back, prev;
    bool has_after, full, more = false;
    json_t *items;

    if (tl >= sizeof(tok))
        tl = sizeof(tok) - 1;
    memcpy(tok, data, tl);
    tok[tl] = '\0';
    limit = size ? (size_t)data[0] % 8 + 1 : 1;
    has_after = e2b_token_decode(tok, &after, &why) == 0;
    if (!has_after && !why)
        abort(); /* a refusal always says why */
    if (has_after) {
        size_t n = e2b_token_encode(&after, again, sizeof(again));
        if (!n || e2b_token_decode(again, &back, &why) != 0 || e2b_pos_cmp(&after, &back) != 0)
            abort();
    }
    if (!(items = json_array()))
        return 0;
    for (off = end ? tl + 1 : size; off < size;) {
        const char *p = (const char *)data + off, *z = memchr(p, '\0', size - off);
        size_t n = z ? (size_t)(z - p) : size - off;
        json_t *theirs = json_loadb(p, n, 0, NULL);
        size_t before = json_array_size(items);
        long got = e2b_page_merge(items, theirs, "running,paused", has_after ? &after : NULL, limit,
                                  &full);
        if (got > (long)limit || (got >= 0 && json_array_size(items) != before + (size_t)got))
            abort();
        json_decref(theirs);
        off += n + 1;
    }
    if (e2b_page_finish(items, limit, &more) == 0) {
        if (json_array_size(items) > limit)
            abort();
        for (size_t i = 0; i < json_array_size(items); i++) {
            struct e2b_pos pos;
            if (e2b_item_pos(json_array_get(items, i), &pos) != 0 ||
                (has_after && e2b_pos_cmp(&pos, &after) <= 0) ||
                (i && e2b_pos_cmp(&prev, &pos) >= 0))
                abort();
            prev = pos;
        }
    }
    json_decref(items);
    return 0;
}
