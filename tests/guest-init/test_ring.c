/*
 * Unit tests of the output ring (guest-init/ring.c): writes, wrap-around,
 * reads from any offset, exact lost counts and fd boundaries, checked
 * against a model that keeps every byte ever written.
 */
#include "ring.h"

#include <stdlib.h>
#include <string.h>

int failures;
#include "check.h"

/* The model: every byte written and its fd. */
struct model {
    uint8_t *data, *fd;
    size_t len, cap;
};

static void model_write(struct model *m, int fd, const uint8_t *p, size_t n)
{
    if (m->len + n > m->cap) {
        m->cap = (m->len + n) * 2;
        m->data = realloc(m->data, m->cap);
        m->fd = realloc(m->fd, m->cap);
    }
    memcpy(m->data + m->len, p, n);
    memset(m->fd + m->len, fd, n);
    m->len += n;
}

static uint32_t rnd(uint32_t *x)
{
    *x = *x * 1103515245u + 12345u;
    return *x >> 8;
}

/* Every offset the ring claims to hold reads back as the model says, in fd runs. */
static void check_against(const struct gi_ring *r, const struct model *m, size_t step)
{
    static uint8_t buf[70000];
    uint64_t off = r->start;

    CHECK(r->end == m->len);
    CHECK(r->end - r->start <= r->cap);
    CHECK(r->used <= r->cap && r->alloc <= r->cap);
    while (off < r->end) {
        int fd = 0;
        size_t n = gi_ring_read(r, off, buf, step, &fd);
        if (n == 0) {
            CHECK(!"read returned nothing inside start..end");
            return;
        }
        CHECK(n <= step && off + n <= r->end);
        CHECK(memcmp(buf, m->data + off, n) == 0);
        for (size_t i = 0; i < n; i++)
            if (m->fd[off + i] != fd) {
                CHECK(!"a read crossed an fd boundary or has the wrong fd");
                break;
            }
        /* a read stops only at its limit or at an fd change (or a chunk end) */
        off += n;
    }
}

static void test_basic(void)
{
    struct gi_ring r;
    uint8_t buf[64];
    int fd = 0;

    CHECK(gi_ring_init(&r, 1) == 0 && r.cap == GI_RING_MIN);
    CHECK(gi_ring_read(&r, 0, buf, sizeof(buf), &fd) == 0);
    gi_ring_write(&r, 1, "hello ", 6);
    gi_ring_write(&r, 1, "world", 5);
    gi_ring_write(&r, 2, "ERR", 3);
    gi_ring_write(&r, 1, "!", 1);
    CHECK(r.start == 0 && r.end == 15);
    /* same-fd writes share one chunk: 3 chunks, 3 headers */
    CHECK(r.used == 15 + 3 * GI_RING_HDR);
    CHECK(gi_ring_read(&r, 0, buf, sizeof(buf), &fd) == 11 && fd == 1);
    CHECK(memcmp(buf, "hello world", 11) == 0);
    CHECK(gi_ring_read(&r, 8, buf, 2, &fd) == 2 && fd == 1 && memcmp(buf, "rl", 2) == 0);
    CHECK(gi_ring_read(&r, 12, buf, sizeof(buf), &fd) == 2 && fd == 2 && memcmp(buf, "RR", 2) == 0);
    CHECK(gi_ring_read(&r, 14, buf, sizeof(buf), &fd) == 1 && fd == 1 && buf[0] == '!');
    CHECK(gi_ring_read(&r, 15, buf, sizeof(buf), &fd) == 0);
    gi_ring_free(&r);
    CHECK(gi_ring_init(&r, (uint64_t)1 << 40) == 0 && r.cap == GI_RING_MAX);
    CHECK(r.alloc == GI_RING_FIRST); /* the whole cap is not taken up front */
    gi_ring_free(&r);
}

/* A ring that wrapped: start says exactly which bytes are gone. */
static void test_wrap_lost(void)
{
    struct gi_ring r;
    struct model m = {0};
    uint8_t line[100];

    CHECK(gi_ring_init(&r, 4096) == 0);
    for (int i = 0; i < 1000; i++) {
        memset(line, 'a' + i % 26, sizeof(line));
        gi_ring_write(&r, 1, line, sizeof(line));
        model_write(&m, 1, line, sizeof(line));
    }
    check_against(&r, &m, 777);
    CHECK(r.end == 100000);
    /* one fd: byte-exact eviction keeps all but the two chunk headers' worth */
    CHECK(r.end - r.start >= 4096 - 2 * GI_RING_HDR);
    CHECK(gi_ring_read(&r, r.start - 1, line, 10, &(int){0}) == 0);
    /* a write bigger than the ring keeps only its tail */
    uint8_t *big = malloc(10000);
    for (int i = 0; i < 10000; i++)
        big[i] = (uint8_t)i;
    gi_ring_write(&r, 2, big, 10000);
    model_write(&m, 2, big, 10000);
    CHECK(r.end == 110000 && r.start == 110000 - (4096 - GI_RING_HDR));
    check_against(&r, &m, 5000);
    free(big);
    gi_ring_free(&r);
    free(m.data);
    free(m.fd);
}

/* Random writes of both fds and all sizes, several caps; check after each. */
static void test_random(void)
{
    static uint8_t src[70000];
    uint32_t x = 42;
    const uint64_t caps[] = {4096, 5000, 65536 + 7, 300000};

    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)rnd(&x);
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        struct gi_ring r;
        struct model m = {0};

        CHECK(gi_ring_init(&r, caps[c]) == 0);
        for (int i = 0; i < 600; i++) {
            uint32_t k = rnd(&x);
            size_t n = k % 4 == 0 ? rnd(&x) % 70000 : rnd(&x) % 300;
            size_t at = rnd(&x) % (sizeof(src) - n + 1);
            int fd = 1 + (k >> 4) % 2;
            gi_ring_write(&r, fd, src + at, n);
            model_write(&m, fd, src + at, n);
            if (i % 7 == 0)
                check_against(&r, &m, 1 + rnd(&x) % 70000);
        }
        check_against(&r, &m, 65536);
        gi_ring_free(&r);
        free(m.data);
        free(m.fd);
    }
}

int main(void)
{
    test_basic();
    test_wrap_lost();
    test_random();
    if (failures) {
        fprintf(stderr, "ring: %d checks failed\n", failures);
        return 1;
    }
    printf("ring: all checks passed\n");
    return 0;
}
