/*
 * test_watch_ev.c - the checker of a watch's guest lines (server/watch_ev.c):
 * the builtin's own shapes pass with their end offsets, anything else is
 * dropped; lines split anywhere come out the same; gaps and overlong lines
 * drop exactly the line they touch.
 */
#include "watch_ev.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"

int failures;

struct got {
    char lines[64][512];
    int n;
    int stop_at; /* return nonzero from this event on (0: never) */
};

static int emit(void *user, json_t *ev)
{
    struct got *g = user;
    char *s = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);

    if (g->n < 64 && s)
        snprintf(g->lines[g->n++], sizeof(g->lines[0]), "%s", s);
    free(s);
    return g->stop_at && g->n >= g->stop_at;
}

static const char stream[] =
    "{\"type\":\"ready\",\"path\":\"/w\",\"recursive\":true,\"watches\":3}\n"
    "{\"type\":\"create\",\"name\":\"a\",\"path\":\"/w/a\"}\n"
    "{\"type\":\"rename\",\"name\":\"b\",\"path\":\"/w/b\",\"dir\":true,\"from\":\"a\"}\n"
    "{\"type\":\"lost\",\"reason\":\"overflow\"}\n"
    "{\"type\":\"unwatched\",\"name\":\"d\",\"path\":\"/w/d\",\"reason\":\"limit\"}\n";

static void test_shapes(void)
{
    struct watch_ev w;
    struct got g = {0};

    CHECK(watch_ev_init(&w, 4096, 0) == 0);
    CHECK(watch_ev_feed(&w, 0, stream, strlen(stream), emit, &g) == 0);
    CHECK(g.n == 5);
    CHECK(!strcmp(g.lines[0],
                  "{\"offset\":58,\"path\":\"/w\",\"recursive\":true,\"type\":\"ready\","
                  "\"watches\":3}"));
    CHECK(!strcmp(g.lines[1],
                  "{\"name\":\"a\",\"offset\":101,\"path\":\"/w/a\",\"type\":\"create\"}"));
    CHECK(strstr(g.lines[2], "\"from\":\"a\"") && strstr(g.lines[2], "\"dir\":true"));
    CHECK(w.next == strlen(stream));
    CHECK(w.dropped == 0);
    watch_ev_free(&w);
}

/* Every split of the stream into two pieces, and byte by byte: the same events. */
static void test_splits(void)
{
    struct got whole = {0};
    struct watch_ev w;
    size_t n = strlen(stream);

    watch_ev_init(&w, 4096, 0);
    watch_ev_feed(&w, 0, stream, n, emit, &whole);
    watch_ev_free(&w);
    for (size_t cut = 0; cut <= n; cut++) {
        struct got g = {0};
        watch_ev_init(&w, 4096, 0);
        CHECK(watch_ev_feed(&w, 0, stream, cut, emit, &g) == 0);
        CHECK(watch_ev_feed(&w, cut, stream + cut, n - cut, emit, &g) == 0);
        CHECK(g.n == whole.n);
        for (int i = 0; i < g.n && i < whole.n; i++)
            CHECK(!strcmp(g.lines[i], whole.lines[i]));
        watch_ev_free(&w);
    }
    {
        struct got g = {0};
        watch_ev_init(&w, 4096, 0);
        for (size_t i = 0; i < n; i++)
            watch_ev_feed(&w, i, stream + i, 1, emit, &g);
        CHECK(g.n == whole.n);
        /* A repeat of bytes already seen is ignored. */
        CHECK(watch_ev_feed(&w, 0, stream, n, emit, &g) == 0);
        CHECK(g.n == whole.n);
        watch_ev_free(&w);
    }
}

static void test_refused(void)
{
    static const char *bad[] = {
        "not json",
        "[1,2]",
        "{}",
        "{\"type\":\"explode\",\"name\":\"a\"}",
        "{\"type\":\"create\"}",                                /* no name */
        "{\"type\":\"create\",\"name\":1,\"path\":\"/a\"}",     /* name not a string */
        "{\"type\":\"create\",\"name\":\"a\",\"extra\":\"x\"}", /* unknown key */
        "{\"type\":\"create\",\"name\":\"a\",\"dir\":\"yes\"}", /* dir not a boolean */
        "{\"type\":\"ready\",\"path\":\"/\",\"watches\":-1}",   /* negative count */
        "{\"type\":\"create\",\"name\":\"a\",\"name\":\"b\"}",  /* duplicate key */
        "{\"type\":\"create\",\"name\":\"a\"} trailing",
        "{\"type\":\"create\",\"name\":\"\xff\"}", /* not UTF-8 */
        "{\"type\":\"lost\",\"offset\":5}",        /* offsets are warrend's to give */
        "",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        json_t *ev = watch_ev_line(bad[i], strlen(bad[i]), 10);
        CHECK(ev == NULL);
        if (ev)
            fprintf(stderr, "accepted: %s\n", bad[i]);
        json_decref(ev);
    }
}

static void test_gap_and_overlong(void)
{
    struct watch_ev w;
    struct got g = {0};
    const char *l1 = "{\"type\":\"create\",\"name\":\"a\",\"path\":\"/w/a\"}\n"; /* 43 bytes */
    char big[200];

    /* A gap in the middle of a line: that line is dropped, the next one is whole. */
    watch_ev_init(&w, 4096, 0);
    watch_ev_feed(&w, 0, l1, 10, emit, &g);
    watch_ev_gap(&w, 100);
    CHECK(w.next == 100);
    watch_ev_feed(&w, 100, "e\"}\n", 4, emit, &g);
    watch_ev_feed(&w, 104, l1, strlen(l1), emit, &g);
    CHECK(g.n == 1);
    CHECK(strstr(g.lines[0], "\"offset\":147") != NULL);
    /* Data that starts past what was expected is a gap too. */
    watch_ev_feed(&w, 300, l1 + 5, strlen(l1) - 5, emit, &g);
    watch_ev_feed(&w, 300 + strlen(l1) - 5, l1, strlen(l1), emit, &g);
    CHECK(g.n == 2);
    watch_ev_free(&w);

    /* A line over the cap is dropped and counted, whatever its pieces. */
    memset(big, 'x', sizeof(big));
    g.n = 0;
    watch_ev_init(&w, 64, 0);
    watch_ev_feed(&w, 0, big, 50, emit, &g);
    watch_ev_feed(&w, 50, big, 50, emit, &g);
    watch_ev_feed(&w, 100, "\n", 1, emit, &g);
    watch_ev_feed(&w, 101, l1, strlen(l1), emit, &g);
    CHECK(g.n == 1);
    CHECK(w.dropped == 1);
    CHECK(w.buf == NULL || w.len == 0);
    watch_ev_free(&w);

    /* A callback that says stop: the bytes after its line wait. */
    g.n = 0;
    g.stop_at = 1;
    watch_ev_init(&w, 4096, 0);
    CHECK(watch_ev_feed(&w, 0, stream, strlen(stream), emit, &g) == 1);
    CHECK(g.n == 1);
    CHECK(w.next == 58);
    watch_ev_free(&w);
}

int main(void)
{
    test_shapes();
    test_splits();
    test_refused();
    test_gap_and_overlong();
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures != 0;
}
