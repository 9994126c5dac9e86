/*
 * Fuzz kernel/klink_lines.c, the kernel bridge's NDJSON as a hostile guest could
 * write it. The input is a plan and a stream: byte 0 is the line bound (its
 * value + 1), byte 1 how many split lengths follow (each one byte; a length
 * with its high bit set also restarts the splitter there with a resync, as a
 * lost range of the ring does); the rest is the stream. It is fed whole, then
 * as the plan splits it (cycled), then a byte at a time; every line goes
 * through the checker and the JSON-mode gatherer. Without restarts, every
 * split must give the same lines at the same offsets; always, a line is
 * within its bound, offsets only grow, and the gatherer keeps within its own.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "klink.h"

#define LINES_MAX 4096

struct seen {
    size_t n;
    uint64_t last_end;
    size_t max;
    struct klink_gather g;
    uint64_t off[LINES_MAX], end[LINES_MAX];
    enum klink_line_kind kind[LINES_MAX];
};

static int on_line(void *ctx, const struct klink_line *l)
{
    struct seen *s = ctx;
    json_t *o;

    if (l->end <= l->off || l->off < s->last_end)
        abort();
    if (l->kind != KLINK_LINE_TOO_LONG && (l->n > s->max || !l->p || strlen(l->p) > l->n))
        abort();
    if (l->kind == KLINK_LINE_TOO_LONG && l->n <= s->max)
        abort();
    if ((l->kind == KLINK_LINE_OK) != (l->obj != NULL))
        abort();
    s->last_end = l->end;
    o = klink_line_object(l, s->max);
    if (o) {
        const char *type = json_string_value(json_object_get(o, "type"));
        if (!type)
            abort();
        klink_gather_add(&s->g, o, type);
        json_decref(o);
    }
    if (s->g.used > s->g.max)
        abort();
    if (s->n < LINES_MAX) {
        s->off[s->n] = l->off;
        s->end[s->n] = l->end;
        s->kind[s->n] = l->kind;
    }
    s->n++;
    return 0;
}

/* Feed body split as plan says; returns whether a restart happened. */
static bool run(const uint8_t *body, size_t n, const uint8_t *plan, size_t nplan, size_t max,
                struct seen *s)
{
    struct klink_lines lb;
    size_t off = 0, k = 0;
    bool restarted = false;
    json_t *r;

    memset(s, 0, sizeof(*s));
    s->max = max;
    klink_gather_init(&s->g, 512);
    klink_lines_init(&lb, max, 1000, false);
    while (off < n) {
        uint8_t step = nplan ? plan[k++ % nplan] : 0;
        size_t piece = nplan ? (size_t)(step & 0x7f) + 1 : n - off;

        if (piece > n - off)
            piece = n - off;
        if (step & 0x80) {
            /* A lost range: the splitter starts again further on, inside a line. */
            klink_lines_free(&lb);
            klink_lines_init(&lb, max, 1000 + off + 64, true);
            s->last_end = 0;
            restarted = true;
        }
        if (klink_lines_feed(&lb, body + off, piece, on_line, s))
            abort();
        if (lb.len > max || (lb.cap && lb.cap > max + 1))
            abort();
        off += piece;
    }
    klink_lines_free(&lb);
    r = klink_gather_result(&s->g);
    json_decref(r);
    klink_gather_free(&s->g);
    return restarted;
}

static struct seen a, b;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint8_t one[1] = {0};
    size_t max, nplan;
    const uint8_t *plan, *body;
    bool restarted;

    if (size < 2)
        return 0;
    max = (size_t)data[0] + 1;
    nplan = data[1];
    if (2 + nplan > size)
        return 0;
    plan = data + 2;
    body = plan + nplan;
    size -= 2 + nplan;

    run(body, size, NULL, 0, max, &a);
    restarted = run(body, size, plan, nplan, max, &b);
    if (!restarted) {
        if (a.n != b.n)
            abort();
        for (size_t i = 0; i < a.n && i < LINES_MAX; i++)
            if (a.off[i] != b.off[i] || a.end[i] != b.end[i] || a.kind[i] != b.kind[i])
                abort();
    }
    run(body, size, one, 1, max, &b);
    if (a.n != b.n)
        abort();
    return 0;
}
