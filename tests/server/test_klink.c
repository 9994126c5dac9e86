/*
 * Unit test of kernel/klink_lines.c: the kernel bridge's NDJSON split into
 * checked lines under every split of the input, with their offsets; bad and
 * over-long lines reported, never kept; a resync from inside a line; and a
 * run's lines gathered into one JSON answer within its bound.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "klink.h"

int failures;
#include "check.h"

#define MAXL 64

struct seen {
    int n;
    enum klink_line_kind kind[32];
    char type[32][32];
    uint64_t off[32], end[32];
    size_t len[32];
};

static int record(void *ctx, const struct klink_line *l)
{
    struct seen *s = ctx;

    if (s->n == 32)
        return 1;
    s->kind[s->n] = l->kind;
    snprintf(s->type[s->n], sizeof(s->type[0]), "%s", l->type ? l->type : "");
    s->off[s->n] = l->off;
    s->end[s->n] = l->end;
    s->len[s->n] = l->n;
    if (l->kind == KLINK_LINE_OK)
        CHECK(l->obj && json_is_object(l->obj) && l->p && strlen(l->p) == l->n);
    else
        CHECK(!l->obj);
    s->n++;
    return 0;
}

/* Feed in pieces of step bytes from offset base, resync as said. */
static void feed(const char *in, size_t step, uint64_t base, bool resync, struct seen *s)
{
    struct klink_lines lb;
    size_t n = strlen(in);

    memset(s, 0, sizeof(*s));
    klink_lines_init(&lb, MAXL, base, resync);
    for (size_t off = 0; off < n; off += step)
        CHECK(klink_lines_feed(&lb, in + off, n - off < step ? n - off : step, record, s) == 0);
    CHECK(lb.len <= MAXL && lb.cap <= MAXL + 1);
    klink_lines_free(&lb);
}

static void test_split(void)
{
    static const char in[] =
        "{\"type\":\"stdout\",\"text\":\"a\\n\"}\n"
        "not json\n"
        "{\"type\":\"result\",\"text\":\"" /* 80 x's: too long */
        "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
        "\"}\n"
        "[1,2]\n"
        "{\"id\":\"c1\"}\n"
        "{\"type\":\"end_of_execution\"}\n"
        "{\"type\":\"partial";
    struct seen s, one;

    feed(in, sizeof(in), 100, false, &one);
    CHECK(one.n == 6);
    CHECK(one.kind[0] == KLINK_LINE_OK && !strcmp(one.type[0], "stdout") && one.off[0] == 100);
    CHECK(one.end[0] == 100 + 31 && one.off[1] == one.end[0]);
    CHECK(one.kind[1] == KLINK_LINE_BAD);
    CHECK(one.kind[2] == KLINK_LINE_TOO_LONG && one.len[2] == 25 + 80 + 2);
    CHECK(one.kind[3] == KLINK_LINE_BAD); /* an array is not an object */
    CHECK(one.kind[4] == KLINK_LINE_OK && one.type[4][0] == '\0');
    CHECK(one.kind[5] == KLINK_LINE_OK && !strcmp(one.type[5], "end_of_execution"));
    for (int i = 1; i < one.n; i++)
        CHECK(one.off[i] == one.end[i - 1]);
    /* Every split gives the same lines. */
    for (size_t step = 1; step < sizeof(in); step++) {
        feed(in, step, 100, false, &s);
        CHECK(s.n == one.n);
        for (int i = 0; i < s.n && i < one.n; i++) {
            CHECK(s.kind[i] == one.kind[i] && !strcmp(s.type[i], one.type[i]));
            CHECK(s.off[i] == one.off[i] && s.end[i] == one.end[i] && s.len[i] == one.len[i]);
        }
    }
}

static void test_resync(void)
{
    struct seen s;

    /* Started inside a line: its rest is dropped silently. */
    feed("e\":\"x\"}\n{\"type\":\"a\"}\n", 3, 10, true, &s);
    CHECK(s.n == 1 && !strcmp(s.type[0], "a") && s.off[0] == 18);
    /* Started on the '\n' before a line: that line is kept whole. */
    feed("\n{\"type\":\"b\"}\n", 1, 41, true, &s);
    CHECK(s.n == 1 && !strcmp(s.type[0], "b") && s.off[0] == 42);
}

static void test_stop_and_dupes(void)
{
    struct seen s;

    /* Duplicate keys are refused: a reader must not have to pick one. */
    feed("{\"type\":\"a\",\"type\":\"b\"}\n", 5, 0, false, &s);
    CHECK(s.n == 1 && s.kind[0] == KLINK_LINE_BAD);
    /* Two objects on one line are not one object. */
    feed("{\"type\":\"a\"}{\"type\":\"b\"}\n", 5, 0, false, &s);
    CHECK(s.n == 1 && s.kind[0] == KLINK_LINE_BAD);
}

static int stop_after_one(void *ctx, const struct klink_line *l)
{
    (void)l;
    ++*(int *)ctx;
    return 7;
}

static void test_stop(void)
{
    struct klink_lines lb;
    int n = 0;
    static const char in[] = "{\"type\":\"a\"}\n{\"type\":\"b\"}\n";

    klink_lines_init(&lb, MAXL, 0, false);
    CHECK(klink_lines_feed(&lb, in, strlen(in), stop_after_one, &n) == 7);
    CHECK(n == 1);
    klink_lines_free(&lb);
}

static void test_line_object(void)
{
    struct klink_line l = {.kind = KLINK_LINE_TOO_LONG, .n = 99};
    json_t *o = klink_line_object(&l, 64);

    CHECK(o && !strcmp(json_string_value(json_object_get(o, "type")), "error"));
    CHECK(!strcmp(json_string_value(json_object_get(o, "name")), "OutputTooLarge"));
    CHECK(json_is_string(json_object_get(o, "traceback")));
    json_decref(o);
    l.kind = KLINK_LINE_LOST;
    o = klink_line_object(&l, 64);
    CHECK(o && !strcmp(json_string_value(json_object_get(o, "name")), "OutputLost"));
    json_decref(o);
}

static void add(struct klink_gather *g, const char *line)
{
    json_t *o;
    const char *type;

    CHECK(klink_line_check(line, strlen(line), &o, &type) == 0);
    if (o)
        CHECK(klink_gather_add(g, o, type) == 0);
    json_decref(o);
}

static void test_gather(void)
{
    struct klink_gather g;
    json_t *r, *res;

    klink_gather_init(&g, 1000);
    add(&g, "{\"type\":\"number_of_executions\",\"execution_count\":3}");
    add(&g, "{\"type\":\"stdout\",\"text\":\"a\\n\",\"timestamp\":\"t\"}");
    add(&g, "{\"type\":\"stderr\",\"text\":\"w\",\"timestamp\":\"t\"}");
    add(&g, "{\"type\":\"stdout\",\"text\":\"b\",\"timestamp\":\"t\"}");
    add(&g, "{\"type\":\"result\",\"is_main_result\":true,\"text\":\"2\",\"png\":\"iVBO\"}");
    add(&g, "{\"type\":\"error\",\"name\":\"ValueError\",\"value\":\"x\",\"traceback\":\"tb\"}");
    add(&g, "{\"type\":\"error\",\"name\":\"Second\",\"value\":\"y\",\"traceback\":\"\"}");
    add(&g, "{\"type\":\"end_of_execution\"}");
    CHECK(g.ended);
    r = klink_gather_result(&g);
    CHECK(r != NULL);
    CHECK(!strcmp(json_string_value(json_object_get(r, "stdout")), "a\nb"));
    CHECK(!strcmp(json_string_value(json_object_get(r, "stderr")), "w"));
    CHECK(json_integer_value(json_object_get(r, "execution_count")) == 3);
    res = json_object_get(r, "results");
    CHECK(json_array_size(res) == 1);
    CHECK(!json_object_get(json_array_get(res, 0), "type"));
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(res, 0), "png")), "iVBO"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(r, "error"), "name")),
                  "ValueError"));
    CHECK(json_is_false(json_object_get(r, "truncated")));
    json_decref(r);
    klink_gather_free(&g);

    /* Past its bound it keeps what fit and says so. */
    klink_gather_init(&g, 10);
    add(&g, "{\"type\":\"stdout\",\"text\":\"12345678\"}");
    add(&g, "{\"type\":\"stdout\",\"text\":\"abc\"}");
    add(&g, "{\"type\":\"result\",\"text\":\"big\"}");
    r = klink_gather_result(&g);
    CHECK(r && !strcmp(json_string_value(json_object_get(r, "stdout")), "12345678"));
    CHECK(json_array_size(json_object_get(r, "results")) == 0);
    CHECK(json_is_true(json_object_get(r, "truncated")));
    CHECK(json_is_null(json_object_get(r, "error")));
    CHECK(json_is_null(json_object_get(r, "execution_count")));
    json_decref(r);
    klink_gather_free(&g);
}

/* body (JSON text) as a run request: its error code, 0 for success (then *out). */
static int run_req(const char *body, json_t **out)
{
    json_t *b = json_loads(body, 0, NULL), *r = NULL;
    struct sbx_err e;
    int rc;

    CHECK(b != NULL);
    rc = klink_run_req(b, 1000, &r, &e);
    json_decref(b);
    if (out)
        *out = r;
    else
        json_decref(r);
    return rc;
}

static void test_requests(void)
{
    json_t *r, *b;
    struct sbx_err e;

    CHECK(run_req("{\"code\":\"1+1\",\"timeout_seconds\":1.5,\"env\":{\"A\":\"b\"}}", &r) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(r, "op")), "run"));
    CHECK(json_integer_value(json_object_get(r, "timeout_ms")) == 1500);
    CHECK(json_integer_value(json_object_get(r, "max_line")) == 1000);
    CHECK(!json_object_get(r, "timeout_seconds") && json_object_get(r, "env"));
    json_decref(r);
    CHECK(run_req("{\"code\":\"x\",\"context_id\":\"c\",\"language\":\"python\"}", NULL) ==
          SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{\"code\":\"x\",\"context_id\":\"c\",\"language\":null}", NULL) == 0);
    CHECK(run_req("{\"code\":1}", NULL) == SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{}", NULL) == SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{\"code\":\"x\",\"bogus\":1}", NULL) == SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{\"code\":\"x\",\"env\":{\"A\":1}}", NULL) == SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{\"code\":\"x\",\"env\":{\"A=B\":\"c\"}}", NULL) == SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{\"code\":\"x\",\"timeout_seconds\":0}", NULL) == SBX_E_INVALID_ARGUMENT);
    CHECK(run_req("{\"code\":\"x\",\"timeout_seconds\":\"5\"}", NULL) == SBX_E_INVALID_ARGUMENT);

    CHECK(klink_context_req("context_create", NULL, NULL, &r, &e) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(r, "language")), "python"));
    json_decref(r);
    b = json_pack("{s:s, s:s}", "language", "bash", "cwd", "/tmp");
    CHECK(klink_context_req("context_create", NULL, b, &r, &e) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(r, "cwd")), "/tmp"));
    json_decref(r);
    json_object_set_new(b, "cwd", json_string("rel"));
    CHECK(klink_context_req("context_create", NULL, b, &r, &e) == SBX_E_INVALID_ARGUMENT && !r);
    json_object_set_new(b, "cwd", json_string("/"));
    json_object_set_new(b, "language", json_string("cobol"));
    CHECK(klink_context_req("context_create", NULL, b, &r, &e) == SBX_E_INVALID_ARGUMENT);
    json_decref(b);
    CHECK(klink_context_req("context_get", "abc", NULL, &r, &e) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(r, "id")), "abc"));
    json_decref(r);
    b = json_pack("{s:i}", "x", 1);
    CHECK(klink_context_req("context_restart", "abc", b, &r, &e) == SBX_E_INVALID_ARGUMENT);
    json_decref(b);
}

int main(void)
{
    test_requests();
    test_split();
    test_resync();
    test_stop_and_dupes();
    test_stop();
    test_line_object();
    test_gather();
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures ? 1 : 0;
}
