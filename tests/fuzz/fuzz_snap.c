/*
 * Fuzz the snapshot file decoder (vmm-driver/vmm_snap.c): vmm_snap_decode on
 * the header and vmm_snap_verify on the whole file, as a later warrend reads
 * back a file that may have been truncated or damaged since it was written.
 *
 * Input: one flags byte, then the file. With F_SHAPE the next two bytes say
 * how many of the following bytes form the header's start (zero-padded to
 * the 4 KiB header) and the rest is the stream, so short inputs reach every
 * field. A CRC-32 or an exact length is out of a fuzzer's reach, so the flags
 * can also fix the stream length, the stream's CRC and the header's CRC, and
 * (F_FIX_DELTA) size the file to the end of the layout a delta header gives
 * (vmm_delta_layout of its device-state length and page count, both bounded).
 *
 * Checked: a refusal is -EINVAL with a sentence; an accepted header has every
 * field within its documented bounds and re-encodes to exactly the bytes read
 * (one encoding per header), a delta's layout ending the file; vmm_snap_verify
 * agrees with the decoder (every field, the delta's included) and with a CRC of
 * the stream computed here; vmm_snap_match accepts the VM the header describes
 * (over a memory file for a template or a delta) and refuses another QEMU
 * version and the other kind of RAM.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vmm_int.h"

#define F_FIX_HCRC  1u
#define F_FIX_SCRC  2u
#define F_FIX_LEN   4u
#define F_SHAPE     8u
#define F_FIX_DELTA 16u
/* F_FIX_DELTA sizes the file only for layouts this small (the CRCs read it all). */
#define FIX_MAX_DEV   (64u << 10)
#define FIX_MAX_PAGES 64u

static void le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void le64(uint8_t *p, uint64_t v)
{
    le32(p, (uint32_t)v);
    le32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void check_why(const char *why, size_t cap)
{
    if (!memchr(why, 0, cap) || why[0] == 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int mfd = -1;
    struct vmm_snap_info a, b;
    uint8_t again[VMM_SNAP_HDR];
    char why[240];
    uint8_t *file;
    size_t flen, hlen;
    unsigned flags;
    int r1, r2;

    if (size < 1)
        return 0;
    flags = data[0];
    data++;
    size--;
    if (flags & F_SHAPE) {
        size_t hn;
        if (size < 2)
            return 0;
        hn = ((size_t)data[0] | (size_t)data[1] << 8) % (VMM_SNAP_HDR + 1);
        data += 2;
        size -= 2;
        if (hn > size)
            hn = size;
        flen = VMM_SNAP_HDR + (size - hn);
        if (!(file = calloc(1, flen)))
            return 0;
        memcpy(file, data, hn);
        memcpy(file + VMM_SNAP_HDR, data + hn, size - hn);
    } else {
        flen = size;
        if (!(file = malloc(flen ? flen : 1)))
            return 0;
        memcpy(file, data, flen);
    }
    if ((flags & F_FIX_DELTA) && flen >= VMM_SNAP_HDR && (file[44] & VMM_SNAP_F_DELTA)) {
        uint64_t dev = rd64(file + 112), np = rd64(file + 120), idx, dat, end;
        if (dev <= FIX_MAX_DEV && np <= FIX_MAX_PAGES) {
            uint8_t *f2;
            end = vmm_delta_layout(dev, np, &idx, &dat);
            if (!(f2 = realloc(file, (size_t)end))) {
                free(file);
                return 0;
            }
            file = f2;
            if (end > flen)
                memset(file + flen, 0, (size_t)(end - flen));
            flen = (size_t)end;
        }
    }
    if (flen >= VMM_SNAP_HDR) {
        if (flags & F_FIX_LEN)
            le64(file + 24, flen - VMM_SNAP_HDR);
        if (flags & F_FIX_SCRC)
            le32(file + 32, vmm_snap_crc((uint32_t)rd64(file + 8), 0, file + VMM_SNAP_HDR,
                                         flen - VMM_SNAP_HDR));
        if (flags & F_FIX_HCRC)
            le32(file + VMM_SNAP_HDR - 4, vmm_crc32(0, file, VMM_SNAP_HDR - 4));
    }

    /* What vmm_snap_verify hands the decoder: one pread of the header. */
    hlen = flen < VMM_SNAP_HDR ? flen : VMM_SNAP_HDR;
    memset(why, 0x55, sizeof(why));
    memset(&a, 0x55, sizeof(a));
    r1 = vmm_snap_decode(file, hlen, flen, &a, why, sizeof(why));
    if (r1 != 0) {
        if (r1 != -EINVAL)
            abort();
        check_why(why, sizeof(why));
    } else {
        size_t vlen = strnlen(a.qemu_version, sizeof(a.qemu_version));
        size_t blen = strnlen(a.base, sizeof(a.base));
        bool over_file = (a.flags & (VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA)) != 0;
        char other[sizeof(a.qemu_version)];
        if (flen != VMM_SNAP_HDR + a.stream_len || a.stream_len == 0 ||
            a.stream_len > (64ull << 30))
            abort();
        if (a.mem_mb == 0 || a.mem_mb > (1u << 20) || a.vcpus == 0 || a.vcpus > 1024 ||
            (a.flags & ~(VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA | VMM_SNAP_F_RAM_CRC)) ||
            (a.flags & VMM_SNAP_F_SHARED_RAM && a.flags & VMM_SNAP_F_DELTA) ||
            ((a.flags & VMM_SNAP_F_RAM_CRC) && !over_file) ||
            (!(a.flags & VMM_SNAP_F_RAM_CRC) && a.ram_crc != 0))
            abort();
        if (a.flags & VMM_SNAP_F_DELTA) {
            uint64_t idx, dat;
            /* The device state, the page index and the pages end the file exactly. */
            if (a.dev_len == 0 || a.dev_len > a.stream_len || a.npages > (uint64_t)a.mem_mb * 256 ||
                vmm_delta_layout(a.dev_len, a.npages, &idx, &dat) != flen || idx % 4096 ||
                dat % 4096 || idx < VMM_SNAP_HDR + a.dev_len || dat < idx + 4 * a.npages)
                abort();
            if (blen == 0 || blen >= sizeof(a.base))
                abort();
            for (size_t i = 0; i < blen; i++)
                if (a.base[i] <= 0x20 || a.base[i] > 0x7e || a.base[i] == '/')
                    abort();
            /* Its page list, as a restore reads it before writing any page: accepted
             * only strictly ascending and inside the guest. */
            if (a.npages <= 65536 && idx + 4 * a.npages <= flen) {
                uint32_t *pg = malloc((a.npages ? a.npages : 1) * sizeof(*pg));
                uint64_t total = (uint64_t)a.mem_mb * 256;
                if (!pg)
                    abort();
                if (vmm_delta_pages(file + idx, a.npages, total, pg, why, sizeof(why)) == 0)
                    for (uint64_t i = 0; i < a.npages; i++)
                        if (pg[i] >= total || (i && pg[i] <= pg[i - 1]))
                            abort();
                free(pg);
            }
        } else if (a.dev_len != 0 || a.npages != 0 || blen != 0) {
            abort();
        }
        if (vlen == 0 || vlen >= sizeof(a.qemu_version))
            abort();
        for (size_t i = 0; i < vlen; i++)
            if (a.qemu_version[i] < 0x20 || a.qemu_version[i] > 0x7e)
                abort();
        /* One encoding per header: what was accepted is what we would write. */
        vmm_snap_encode(again, &a);
        if (memcmp(again, file, VMM_SNAP_HDR) != 0)
            abort();
        if (vmm_snap_match(&a, a.qemu_version, a.mem_mb, a.vcpus, over_file, why, sizeof(why)) != 0)
            abort();
        /* A template's or a delta's RAM is not in the file: only over a memory file;
         * a full stream never over one. */
        memset(why, 0x55, sizeof(why));
        if (vmm_snap_match(&a, a.qemu_version, a.mem_mb, a.vcpus, !over_file, why, sizeof(why)) !=
            -EINVAL)
            abort();
        check_why(why, sizeof(why));
        /* Another QEMU: the version one character longer or shorter. */
        memcpy(other, a.qemu_version, sizeof(other));
        if (vlen < sizeof(other) - 1) {
            other[vlen] = 'x';
            other[vlen + 1] = 0;
        } else {
            other[vlen - 1] = 0;
        }
        memset(why, 0x55, sizeof(why));
        if (vmm_snap_match(&a, other, a.mem_mb, a.vcpus, over_file, why, sizeof(why)) != -EINVAL)
            abort();
        check_why(why, sizeof(why));
    }

    /* The file API over the same bytes (a memfd: a regular file, no disk). */
    if (mfd < 0 && (mfd = memfd_create("fuzz_snap", MFD_CLOEXEC)) < 0)
        abort();
    if (ftruncate(mfd, 0) != 0 || (flen && pwrite(mfd, file, flen, 0) != (ssize_t)flen))
        abort();
    memset(why, 0x55, sizeof(why));
    r2 = vmm_snap_verify(mfd, &b, why, sizeof(why));
    if (r1 != 0) {
        if (r2 != r1)
            abort();
        check_why(why, sizeof(why));
    } else {
        bool crc_ok =
            vmm_snap_crc(a.version, 0, file + VMM_SNAP_HDR, flen - VMM_SNAP_HDR) == a.stream_crc;
        if ((r2 == 0) != crc_ok)
            abort();
        if (r2 != 0) {
            if (r2 != -EINVAL)
                abort();
            check_why(why, sizeof(why));
        } else if (b.stream_len != a.stream_len || b.stream_crc != a.stream_crc ||
                   b.mem_mb != a.mem_mb || b.vcpus != a.vcpus || b.flags != a.flags ||
                   strcmp(b.qemu_version, a.qemu_version) != 0 || b.dev_len != a.dev_len ||
                   b.npages != a.npages || strcmp(b.base, a.base) != 0 || b.version != a.version) {
            abort();
        }
    }
    free(file);
    return 0;
}
