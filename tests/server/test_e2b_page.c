/*
 * test_e2b_page.c - E2B's paged list over a fleet (e2b_page.c): the token
 * round-trips and refuses hostile spellings, items are ordered by (startedAt,
 * id), and a merge of several hosts' pages keeps exactly the first limit after
 * the token, whatever a hostile peer answered.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "e2b_page.h"
#include "util.h"

int failures;

static json_t *item(const char *id, const char *at, const char *state)
{
    return json_pack("{s:s, s:s, s:s}", "sandboxID", id, "startedAt", at, "state", state);
}

static void test_token(void)
{
    struct e2b_pos a = {.ms = 1796000000123LL, .id = "sb-h2-0123456789abcdef"}, b;
    char tok[E2B_TOKEN_MAX + 1], raw[256], big[4096];
    const char *why = NULL;
    size_t n;

    n = e2b_token_encode(&a, tok, sizeof(tok));
    CHECK(n > 0 && n <= E2B_TOKEN_MAX && strlen(tok) == n);
    CHECK(e2b_token_decode(tok, &b, &why) == 0);
    CHECK(b.ms == a.ms && !strcmp(b.id, a.id));
    /* The longest id and time still fit. */
    memset(a.id, 'x', API_ID_MAX);
    a.id[API_ID_MAX] = '\0';
    a.ms = 9999999999999999LL;
    n = e2b_token_encode(&a, tok, sizeof(tok));
    CHECK(n > 0 && e2b_token_decode(tok, &b, &why) == 0 && b.ms == a.ms && !strcmp(b.id, a.id));
    /* Positions that cannot be written. */
    a.ms = -1;
    CHECK(e2b_token_encode(&a, tok, sizeof(tok)) == 0);
    a.ms = 5;
    strcpy(a.id, "a/b");
    CHECK(e2b_token_encode(&a, tok, sizeof(tok)) == 0);
    strcpy(a.id, "ok");
    CHECK(e2b_token_encode(&a, tok, 4) == 0);

    /* Hostile tokens: each refused with a message. */
    why = NULL;
    CHECK(e2b_token_decode("!!!!", &b, &why) == -1 && why && *why);
    CHECK(e2b_token_decode("MTo", &b, &why) == -1);      /* "1:" alone */
    CHECK(e2b_token_decode("MTox", &b, &why) == -1);     /* stray bits / short */
    CHECK(e2b_token_decode("MToxMjM=", &b, &why) == -1); /* padding is not base64url */
    memset(big, 'A', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK(e2b_token_decode(big, &b, &why) == -1); /* huge */
#define ENC(s)                                                                                     \
    (n = util_b64_encode(UTIL_B64_URL, (const unsigned char *)(s), strlen(s), raw), raw[n] = 0, raw)
    CHECK(e2b_token_decode(ENC("1:123:sb-x"), &b, &why) == 0 && b.ms == 123 &&
          !strcmp(b.id, "sb-x"));
    CHECK(e2b_token_decode(ENC("2:123:sb-x"), &b, &why) == -1);  /* another version */
    CHECK(e2b_token_decode(ENC("1:-5:sb-x"), &b, &why) == -1);   /* a sign */
    CHECK(e2b_token_decode(ENC("1:0123:sb-x"), &b, &why) == -1); /* a second spelling */
    CHECK(e2b_token_decode(ENC("1::sb-x"), &b, &why) == -1);
    CHECK(e2b_token_decode(ENC("1:12345678901234567:sb-x"), &b, &why) == -1); /* 17 digits */
    CHECK(e2b_token_decode(ENC("1:123:"), &b, &why) == -1);
    CHECK(e2b_token_decode(ENC("1:123:sb x"), &b, &why) == -1);
    CHECK(e2b_token_decode(ENC("1:123:sb-x:y"), &b, &why) == -1);
    CHECK(e2b_token_decode(ENC("1:123"), &b, &why) == -1);
    {
        /* A NUL inside. */
        const unsigned char z[] = "1:1:a\0b";
        n = util_b64_encode(UTIL_B64_URL, z, sizeof(z) - 1, raw);
        raw[n] = 0;
        CHECK(e2b_token_decode(raw, &b, &why) == -1);
    }
    /* An old token (the last sandbox id shown) gets its own clear message. */
    CHECK(e2b_token_decode("sb-h1-00112233445566aa", &b, &why) == -1 && strstr(why, "again"));
}

static void test_item_pos(void)
{
    struct e2b_pos p;
    json_t *it;

    it = item("sb-h0-aa", "2026-12-06T16:34:16.123Z", "running");
    CHECK(e2b_item_pos(it, &p) == 0 && !strcmp(p.id, "sb-h0-aa"));
    {
        char back[UTIL_ISO_MAX];
        util_iso_time_ms(p.ms, back, sizeof(back));
        CHECK(!strcmp(back, "2026-12-06T16:34:16.123Z"));
    }
    json_decref(it);
    it = json_pack("{s:s, s:n}", "sandboxID", "sb-1", "startedAt");
    CHECK(e2b_item_pos(it, &p) == 0 && p.ms == 0);
    json_decref(it);
    /* Not items: no id, a bad id, a bad or missing time, not an object. */
    it = json_pack("{s:s}", "startedAt", "2026-12-06T16:34:16.123Z");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = item("sb/../x", "2026-12-06T16:34:16.123Z", "running");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = item("sb-1", "2026-13-06T16:34:16.123Z", "running");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = item("sb-1", "2026-12-06T16:34:16Z", "running");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = item("sb-1", "+026-12-06T16:34:16.123Z", "running");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = json_pack("{s:s, s:i}", "sandboxID", "sb-1", "startedAt", 5);
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = json_pack("{s:s}", "sandboxID", "sb-1");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
    it = json_string("sb-1");
    CHECK(e2b_item_pos(it, &p) == -1);
    json_decref(it);
}

static const char *id_at(json_t *a, size_t i)
{
    return json_string_value(json_object_get(json_array_get(a, i), "sandboxID"));
}

/* Three hosts' items paged by 2 through the merge: every one once, in order. */
static void test_merge_walk(void)
{
    static const char *at[] = {"2026-12-06T10:00:00.000Z", "2026-12-06T10:00:00.000Z",
                               "2026-12-06T10:00:01.000Z", "2026-12-06T10:00:02.500Z"};
    json_t *host[3];
    char id[32], tok[E2B_TOKEN_MAX + 1] = "";
    int seen[3][4] = {{0}}, pages = 0;
    struct e2b_pos last = {0}, prev = {.ms = -1};

    for (int h = 0; h < 3; h++) {
        host[h] = json_array();
        for (int i = 3; i >= 0; i--) { /* any order in */
            snprintf(id, sizeof(id), "sb-h%d-%02d", h, i);
            json_array_append_new(host[h], item(id, at[i], i == 2 ? "paused" : "running"));
        }
    }
    for (;;) {
        struct e2b_pos after;
        const char *why;
        bool has_after = *tok && e2b_token_decode(tok, &after, &why) == 0, more = false;
        json_t *page = json_array();

        /* Each host answers its own page (its items after the token, first 2). */
        for (int h = 0; h < 3; h++) {
            json_t *own = json_array();
            bool m = false;
            CHECK(e2b_page_merge(own, host[h], NULL, has_after ? &after : NULL, 100, &m) >= 0);
            CHECK(e2b_page_finish(own, 2, &m) == 0 && json_array_size(own) <= 2);
            CHECK(e2b_page_merge(page, own, NULL, has_after ? &after : NULL, 2, &more) >= 0);
            json_decref(own);
        }
        CHECK(e2b_page_finish(page, 2, &more) == 0);
        CHECK(json_array_size(page) <= 2);
        for (size_t i = 0; i < json_array_size(page); i++) {
            int h, k;
            CHECK(e2b_item_pos(json_array_get(page, i), &last) == 0);
            CHECK(e2b_pos_cmp(&prev, &last) < 0);
            prev = last;
            CHECK(sscanf(id_at(page, i), "sb-h%d-%d", &h, &k) == 2);
            if (h >= 0 && h < 3 && k >= 0 && k < 4)
                seen[h][k]++;
        }
        pages++;
        if (!more || !json_array_size(page) || pages > 20) {
            json_decref(page);
            break;
        }
        CHECK(e2b_token_encode(&last, tok, sizeof(tok)) > 0);
        json_decref(page);
    }
    for (int h = 0; h < 3; h++)
        for (int i = 0; i < 4; i++)
            CHECK(seen[h][i] == 1);
    CHECK(pages >= 6 && pages <= 7);
    for (int h = 0; h < 3; h++)
        json_decref(host[h]);
}

/* A hostile peer: too many items, bad items, duplicates, items before the token, items in
 * a state not asked for, not an array. */
static void test_merge_hostile(void)
{
    struct e2b_pos after = {.ms = 0, .id = ""};
    json_t *into = json_array(), *theirs = json_array(), *o;
    bool full = false, more = false;
    char id[32];
    long n;

    for (int i = 0; i < 50; i++) {
        snprintf(id, sizeof(id), "sb-h9-%02d", i);
        json_array_append_new(theirs, item(id, "2026-12-06T10:00:00.000Z", "running"));
    }
    n = e2b_page_merge(into, theirs, "running", NULL, 3, &full);
    CHECK(n == 3 && full && json_array_size(into) == 3); /* cut to the limit */
    json_array_clear(into);
    json_array_clear(theirs);
    full = false;

    after.ms = 1796551200000LL; /* 2026-12-06T10:00:00.000Z */
    strcpy(after.id, "sb-h9-05");
    json_array_append_new(theirs, item("sb-h9-04", "2026-12-06T10:00:00.000Z", "running"));
    json_array_append_new(theirs, item("sb-h9-05", "2026-12-06T10:00:00.000Z", "running"));
    json_array_append_new(theirs, item("sb-h9-06", "2026-12-06T10:00:00.000Z", "paused"));
    json_array_append_new(theirs, item("sb-h9-07", "2026-12-06T10:00:00.000Z", "running"));
    json_array_append_new(theirs, item("sb-h9-07", "2026-12-06T10:00:00.000Z", "running"));
    json_array_append_new(theirs, item("sb-h9-08", "not a time", "running"));
    json_array_append_new(theirs, json_pack("{s:i}", "sandboxID", 7));
    json_array_append_new(theirs, json_string("x"));
    json_array_append_new(theirs, item("sb-h9-09", "2026-12-06T09:59:59.999Z", "running"));
    json_array_append_new(theirs, item("sb-h9-10", "2026-12-06T10:00:00.001Z", "ended"));
    n = e2b_page_merge(into, theirs, "running", &after, 100, &full);
    CHECK(n == 2 && !full); /* sb-h9-07 twice; everything else dropped */
    CHECK(e2b_page_finish(into, 100, &more) == 0 && !more);
    CHECK(json_array_size(into) == 1 && !strcmp(id_at(into, 0), "sb-h9-07"));
    /* Not a list at all. */
    o = json_pack("{s:[]}", "sandboxes");
    CHECK(e2b_page_merge(into, o, NULL, NULL, 5, &full) == -1);
    CHECK(e2b_page_merge(into, NULL, NULL, NULL, 5, &full) == -1);
    json_decref(o);
    json_decref(into);
    json_decref(theirs);
}

static void test_finish_order(void)
{
    json_t *a = json_array();
    bool more = false;

    json_array_append_new(a, item("sb-b", "2026-12-06T10:00:01.000Z", "running"));
    json_array_append_new(a, item("sb-z", "2026-12-06T10:00:00.000Z", "running"));
    json_array_append_new(a, item("sb-a", "2026-12-06T10:00:01.000Z", "running"));
    json_array_append_new(a, json_pack("{s:s, s:n}", "sandboxID", "sb-0", "startedAt"));
    CHECK(e2b_page_finish(a, 3, &more) == 0 && more && json_array_size(a) == 3);
    CHECK(!strcmp(id_at(a, 0), "sb-0") && !strcmp(id_at(a, 1), "sb-z") &&
          !strcmp(id_at(a, 2), "sb-a"));
    CHECK(e2b_state_wanted(NULL, "paused") && e2b_state_wanted("running,paused", "paused") &&
          !e2b_state_wanted("running", "paused") && !e2b_state_wanted("running", "run") &&
          !e2b_state_wanted(NULL, NULL));
    json_decref(a);
}

int main(void)
{
    test_token();
    test_item_pos();
    test_merge_walk();
    test_merge_hostile();
    test_finish_order();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
