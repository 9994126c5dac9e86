/*
 * e2b_page.c - E2B's paged list: order, token, merge (e2b_page.h).
 * timegm comes with the build's _GNU_SOURCE.
 */
#include "e2b_page.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util.h"

/* The decoded token's version: a token of another version is refused, never guessed. */
#define TOKEN_TAG "1:"
/* "1:" + at most 16 digits of ms + ':' + the id: what a token may decode to. */
#define TOKEN_RAW_MAX (2 + 16 + 1 + API_ID_MAX)
#define MS_MAX        9999999999999999LL

int e2b_pos_cmp(const struct e2b_pos *a, const struct e2b_pos *b)
{
    int c;

    if (a->ms != b->ms)
        return a->ms < b->ms ? -1 : 1;
    c = strcmp(a->id, b->id);
    return (c > 0) - (c < 0);
}

static bool valid_id(const char *s, size_t n)
{
    if (n < 1 || n > API_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return true;
}

size_t e2b_token_encode(const struct e2b_pos *pos, char *out, size_t cap)
{
    char raw[TOKEN_RAW_MAX + 1];
    int n;

    if (pos->ms < 0 || pos->ms > MS_MAX || !valid_id(pos->id, strnlen(pos->id, API_ID_MAX + 1)))
        return 0;
    n = snprintf(raw, sizeof(raw), TOKEN_TAG "%lld:%s", (long long)pos->ms, pos->id);
    if (n < 0 || (size_t)n >= sizeof(raw) || util_b64_len(UTIL_B64_URL, (size_t)n) >= cap)
        return 0;
    n = (int)util_b64_encode(UTIL_B64_URL, (const unsigned char *)raw, (size_t)n, out);
    out[n] = '\0';
    return (size_t)n;
}

int e2b_token_decode(const char *tok, struct e2b_pos *pos, const char **why)
{
    unsigned char raw[TOKEN_RAW_MAX + 1];
    size_t tl = strnlen(tok, E2B_TOKEN_MAX + 1);
    long n;
    const char *s, *colon;
    long long ms = 0;

    *why = "malformed nextToken: pass the x-next-token of the page before, unchanged";
    if (tl > E2B_TOKEN_MAX)
        return -1;
    /* Tokens were a bare sandbox id before the order became (startedAt, id): such a
     * position means nothing in the new order, so the walk has to start again. */
    if (!strncmp(tok, "sb-", 3) || !strncmp(tok, "sb_", 3)) {
        *why = "nextToken is a sandbox id, from before pages were ordered by startedAt: "
               "list again from the first page";
        return -1;
    }
    n = util_b64_decode(UTIL_B64_URL, tok, tl, raw, TOKEN_RAW_MAX);
    if (n < (long)strlen(TOKEN_TAG) + 3 || memcmp(raw, TOKEN_TAG, strlen(TOKEN_TAG)))
        return -1;
    raw[n] = '\0';
    if (memchr(raw, '\0', (size_t)n))
        return -1;
    s = (const char *)raw + strlen(TOKEN_TAG);
    colon = strchr(s, ':');
    if (!colon || colon == s || colon - s > 16 || (colon - s > 1 && s[0] == '0'))
        return -1;
    for (const char *d = s; d < colon; d++) {
        if (*d < '0' || *d > '9')
            return -1;
        ms = ms * 10 + (*d - '0');
    }
    if (!valid_id(colon + 1, strlen(colon + 1)))
        return -1;
    pos->ms = ms;
    memcpy(pos->id, colon + 1, strlen(colon + 1) + 1);
    return 0;
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ" as ms, exactly as util_iso_time_ms writes it: 0, or -1. */
static int iso_ms_parse(const char *s, int64_t *ms)
{
    struct tm tm = {0};
    int y, mo, d, h, mi, sec, frac, used = 0;
    char back[UTIL_ISO_MAX];
    time_t t;

    if (strlen(s) != UTIL_ISO_MAX - 1 ||
        sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &y, &mo, &d, &h, &mi, &sec, &frac, &used) !=
            7 ||
        used != UTIL_ISO_MAX - 1)
        return -1;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    t = timegm(&tm);
    if (t < 0 || (int64_t)t > MS_MAX / 1000 - 1)
        return -1;
    *ms = (int64_t)t * 1000 + frac;
    /* One spelling per time (no "2026-13-40", no signs or spaces sscanf let by). */
    if (!util_iso_time_ms(*ms, back, sizeof(back)) || strcmp(back, s))
        return -1;
    return 0;
}

int e2b_item_pos(json_t *item, struct e2b_pos *pos)
{
    const char *id = json_string_value(json_object_get(item, "sandboxID"));
    json_t *at = json_object_get(item, "startedAt");

    if (!json_is_object(item) || !id || !valid_id(id, strlen(id)))
        return -1;
    if (json_is_null(at))
        pos->ms = 0;
    else if (!json_is_string(at) || iso_ms_parse(json_string_value(at), &pos->ms))
        return -1;
    memcpy(pos->id, id, strlen(id) + 1);
    return 0;
}

bool e2b_state_wanted(const char *filter, const char *state)
{
    size_t sl;

    if (!state)
        return false;
    if (!filter || !*filter)
        return true;
    sl = strlen(state);
    for (const char *s = filter; *s;) {
        size_t n = strcspn(s, ",");
        if (n == sl && !strncmp(s, state, n))
            return true;
        s += n;
        if (*s == ',')
            s++;
    }
    return false;
}

long e2b_page_merge(json_t *into, json_t *theirs, const char *filter, const struct e2b_pos *after,
                    size_t limit, bool *full)
{
    size_t i, n = json_array_size(theirs);
    long added = 0;

    if (!json_is_array(theirs) || !json_is_array(into))
        return -1;
    if (n >= limit) {
        *full = true;
        n = limit;
    }
    for (i = 0; i < n; i++) {
        json_t *it = json_array_get(theirs, i);
        struct e2b_pos pos;

        if (e2b_item_pos(it, &pos) ||
            !e2b_state_wanted(filter, json_string_value(json_object_get(it, "state"))) ||
            (after && e2b_pos_cmp(&pos, after) <= 0))
            continue;
        if (json_array_append(into, it))
            return -1;
        added++;
    }
    return added;
}

struct keyed {
    struct e2b_pos pos;
    json_t *item;
};

static int by_pos(const void *a, const void *b)
{
    return e2b_pos_cmp(&((const struct keyed *)a)->pos, &((const struct keyed *)b)->pos);
}

int e2b_page_finish(json_t *items, size_t limit, bool *more)
{
    size_t n = json_array_size(items), kept = 0, i;
    struct keyed *v = malloc((n ? n : 1) * sizeof(*v));

    if (!v)
        return -1;
    for (i = 0; i < n; i++) {
        json_t *it = json_array_get(items, i);
        if (e2b_item_pos(it, &v[kept].pos))
            continue; /* merged items were checked; this keeps the sort's keys whole */
        v[kept++].item = json_incref(it);
    }
    qsort(v, kept, sizeof(*v), by_pos);
    json_array_clear(items);
    for (i = 0; i < kept; i++) {
        if (i && !e2b_pos_cmp(&v[i].pos, &v[i - 1].pos)) {
            json_decref(v[i].item);
            continue;
        }
        if (json_array_size(items) == limit) {
            *more = true;
            json_decref(v[i].item);
            continue;
        }
        json_array_append_new(items, v[i].item);
    }
    free(v);
    return 0;
}
