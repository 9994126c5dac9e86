/*
 * fuzz_ring.c - libFuzzer target for the output ring of warren-init
 * (guest-init/ring.c): the input is a program of writes (fd, length) and
 * reads (offset, max) on a ring of a fuzzed size, checked against a model
 * that keeps every byte written: reads inside start..end return exactly the
 * model's bytes, all of one fd; the ring never holds more than its cap.
 */
#include "ring.h"

#include <stdlib.h>
#include <string.h>

#define MODEL_MAX (8u << 20)

static uint8_t model[MODEL_MAX], model_fd[MODEL_MAX], src[GI_RING_CHUNK_MAX + 1024],
    out[GI_RING_CHUNK_MAX + 1024];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct gi_ring r;
    size_t pos = 2, len = 0;

    if (size < 2 || gi_ring_init(&r, 4096 + (uint64_t)(data[0] << 8 | data[1]) * 7) != 0)
        return 0;
    while (pos + 3 <= size) {
        uint8_t op = data[pos];
        size_t arg = (size_t)data[pos + 1] << 8 | data[pos + 2];
        pos += 3;
        if (op & 1) {
            /* write: fd from bit 1, length arg scaled by bits 2..3 */
            size_t n = arg << ((op >> 2) & 3) % 3;
            int fd = 1 + ((op >> 1) & 1);
            if (n > sizeof(src))
                n = sizeof(src);
            if (len + n > MODEL_MAX)
                break;
            for (size_t i = 0; i < n; i++)
                src[i] = (uint8_t)(len + i + op);
            gi_ring_write(&r, fd, src, n);
            memcpy(model + len, src, n);
            memset(model_fd + len, fd, n);
            len += n;
        } else {
            /* read at start + arg * (1 << bits 1..3), max from the high bits */
            uint64_t off = r.start + ((uint64_t)arg << ((op >> 1) & 7));
            size_t max = 1 + (size_t)(op >> 4) * 4500;
            int fd = 0;
            size_t n = gi_ring_read(&r, off, out, max, &fd);
            if (off >= r.end) {
                if (n != 0)
                    abort();
                continue;
            }
            if (n == 0 || n > max || off + n > r.end || memcmp(out, model + off, n) != 0)
                abort();
            for (size_t i = 0; i < n; i++)
                if (model_fd[off + i] != fd)
                    abort();
        }
        if (r.end != len || r.start > r.end || r.end - r.start > r.cap || r.used > r.cap ||
            r.alloc > r.cap)
            abort();
    }
    gi_ring_free(&r);
    return 0;
}
