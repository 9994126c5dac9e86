/*
 * e2b_page.h - the pure part of E2B's paged sandbox list over a fleet
 * (GET /v2/sandboxes?limit=N&nextToken=T): the order, the token, the merge.
 *
 * Every host orders sandboxes the same way: by creation time (startedAt, in
 * ms), then by id. A page's token is the position of its last item in that
 * order, encoded opaquely (base64url of "1:<ms>:<id>"), so a token one host
 * gave is valid on any other, and sandboxes made while a client pages come
 * after its position instead of slipping in before it. The host a page lands
 * on asks each peer for at most `limit` items after the token (same filters),
 * and keeps the first `limit` of all of them. A peer's answer is hostile: it
 * is cut to `limit`, and an item without a well-formed sandboxID and
 * startedAt, in a state not asked for, or not after the token is dropped.
 *
 * Jansson only, no I/O: tests/server/test_e2b_page.c tests it whole.
 */
#ifndef WARREN_E2B_PAGE_H
#define WARREN_E2B_PAGE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "api.h"

/* Longest nextToken accepted: the encoding of the longest position, with room. */
#define E2B_TOKEN_MAX 128

/* A place in the fleet's order. */
struct e2b_pos {
    int64_t ms; /* startedAt in ms since the epoch; 0 for a sandbox without one */
    char id[API_ID_MAX + 1];
};

/* -1, 0 or 1 as a comes before, with, or after b. */
int e2b_pos_cmp(const struct e2b_pos *a, const struct e2b_pos *b);

/* The token of pos in out (cap at least E2B_TOKEN_MAX + 1): its length, or 0 when
 * pos cannot be written (a bad id or time). */
size_t e2b_token_encode(const struct e2b_pos *pos, char *out, size_t cap);

/* A client's (or a peer's) token as a position: 0, or -1 with *why a message for a 400
 * (a token from before positions, a bare sandbox id, gets its own). */
int e2b_token_decode(const char *tok, struct e2b_pos *pos, const char **why);

/* An E2B list item's position: 0, or -1 when it has no well-formed sandboxID
 * (1..API_ID_MAX of [A-Za-z0-9_-]) and startedAt ("YYYY-MM-DDTHH:MM:SS.mmmZ", or null). */
int e2b_item_pos(json_t *item, struct e2b_pos *pos);

/* Whether state is one of filter's ("running,paused"); NULL or "" takes every one. */
bool e2b_state_wanted(const char *filter, const char *state);

/* Append to into the items of theirs (an array; else -1) that are E2B items in a state
 * filter wants and after *after (NULL: from the start), looking at its first limit
 * only. *full is set when theirs held limit items or more (the source may have more
 * after them). The number appended, or -1. */
long e2b_page_merge(json_t *into, json_t *theirs, const char *filter, const struct e2b_pos *after,
                    size_t limit, bool *full);

/* Sort items into the fleet's order, drop repeated positions (an item two sources
 * gave), and keep the first limit; *more is set when any was cut. 0, or -1 (out of
 * memory, items unchanged). */
int e2b_page_finish(json_t *items, size_t limit, bool *more);

#endif
