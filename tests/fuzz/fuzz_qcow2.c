/*
 * Fuzz the qcow2 backing-header probe (vmm-driver/vmm_qcow2.c): the first
 * bytes of a template's frozen overlay, a file a guest wrote through QEMU,
 * read before a clone's overlay is put over it. vmm_qcow2_create reads 512
 * bytes and trusts only what vmm_qcow2_probe accepted.
 *
 * Checked: the verdict depends only on what create reads (the first 512
 * bytes); "raw" exactly when the magic is absent; an accepted qcow2 has every
 * field the probe documents within its bounds (version, cluster bits, size,
 * no encryption, an L1 table that maps the whole size and is bounded, known
 * feature bits only, header length); and the overlay create would write over
 * it (vmm_qcow2_encode, both backing formats) is itself accepted with the
 * same size and a layout inside the file, so a clone's overlay can in turn
 * back a clone.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vmm_int.h"

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) << 32 | rd32(p + 4);
}

/* The bounds vmm_qcow2_probe documents, checked from the raw bytes. */
static void check_bounds(const uint8_t *h, size_t len, uint64_t vsize)
{
    uint32_t ver = rd32(h + 4), cbits = rd32(h + 20), l1 = rd32(h + 36);

    if (len < 72 || (ver != 2 && ver != 3) || cbits < 9 || cbits > 21)
        abort();
    if (vsize != rd64(h + 24) || vsize == 0 || vsize % 512 || vsize > (1ull << 46))
        abort();
    if (rd32(h + 32) != 0)
        abort();
    if (l1 > (32u << 20) / 8 || (uint64_t)l1 * ((1ull << cbits) / 8) * (1ull << cbits) < vsize)
        abort();
    if (ver == 3) {
        uint64_t incompat = rd64(h + 72);
        uint32_t hlen = rd32(h + 100);
        if (len < 104 || (incompat & 6) || (incompat >> 5) || hlen < 104 || hlen > (1u << cbits) ||
            rd32(h + 96) > 6)
            abort();
    }
}

static void check_overlay(uint64_t vsize, bool qcow2_backing)
{
    static const char name[] = "/var/lib/warren/templates/t/overlay.qcow2";
    uint8_t out[104 + 16 + 8 + sizeof(name)];
    struct vmm_qcow2_layout lay;
    bool q = false;
    uint64_t v = 0;

    if (vmm_qcow2_encode(out, sizeof(out), vsize, qcow2_backing, name, &lay) != 0)
        abort();
    if (lay.hdr_len > sizeof(out) || lay.hdr_len > 65536 || lay.nclusters > VMM_QCOW2_REFS_MAX ||
        lay.file_len != 3 * 65536 + lay.l1_bytes || lay.l1_bytes * (65536 / 8) * 65536 < vsize)
        abort();
    if (vmm_qcow2_probe(out, lay.hdr_len, &q, &v) != 0 || !q || v != vsize)
        abort();
    check_bounds(out, lay.hdr_len, v);
    if (rd64(out + 8) + rd32(out + 16) != lay.hdr_len ||
        memcmp(out + rd64(out + 8), name, sizeof(name) - 1) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bool q = false, q512 = false;
    uint64_t v = 0, v512 = 0;
    int r, r512;

    r = vmm_qcow2_probe(data, size, &q, &v);
    if (q != (size >= 4 && memcmp(data, "QFI\xfb", 4) == 0))
        abort();
    if (r != 0 && (r != -EINVAL || !q))
        abort();
    /* What vmm_qcow2_create hands it: at most the first 512 bytes. */
    r512 = vmm_qcow2_probe(data, size < 512 ? size : 512, &q512, &v512);
    if (r512 != r || q512 != q || (r == 0 && q && v512 != v))
        abort();
    if (r == 0 && q) {
        check_bounds(data, size, v);
        check_overlay(v, true);
        check_overlay(v, false);
    }
    /* The backing name: bounded by what was read and by cluster 0, never a NUL. */
    {
        char name[1024];
        int rb = vmm_qcow2_backing_name(data, size, name, sizeof(name));
        if (rb == 0 && (r != 0 || !q || strlen(name) >= sizeof(name) ||
                        (name[0] && (rd64(data + 8) + strlen(name) > size ||
                                     memcmp(data + rd64(data + 8), name, strlen(name)) != 0))))
            abort();
        if (rb != 0 && rb != -EINVAL)
            abort();
    }
    /* Any size the input suggests: the encoder refuses, or writes what the probe takes. */
    if (size >= 8) {
        struct vmm_qcow2_layout lay;
        uint8_t out[104 + 16 + 8 + 2];
        uint64_t s = rd64(data + size - 8);
        int e = vmm_qcow2_encode(out, sizeof(out), s, s & 1024, "/b", &lay);
        if (e == 0) {
            if (vmm_qcow2_probe(out, lay.hdr_len, &q, &v) != 0 || !q || v != s)
                abort();
        } else if (e != -EINVAL || (s != 0 && s % 512 == 0 && s <= (1ull << 46))) {
            abort();
        }
    }
    return 0;
}
