/*
 * vmm_snap.c - the snapshot file: a 4 KiB header, then QEMU's migration stream.
 *
 * Header (little-endian): magic "WARRENSN", version, header length, stream
 * offset and length, the stream's checksum (CRC-32C from version 3, CRC-32 in
 * version 2: vmm_crc.c), guest RAM (MiB) and vCPUs, flags,
 * the QEMU version that wrote the stream (NUL-padded to 64 bytes), a delta's
 * device-state length, page count and RAM file name, the RAM file's CRC-32C
 * (VMM_SNAP_F_RAM_CRC: written over a file, a template's or a delta's), reserved
 * bytes that must be zero, and a CRC-32 of the header itself in its last 4
 * bytes. Every field is bounded on decode: the file is read back by a later
 * warrend and may have been truncated or damaged since.
 *
 * The stream is written by QEMU through an fd positioned after the header;
 * vmm_snap_finalize then checksums it, writes the header, fsyncs and renames
 * the temporary file into place (and fsyncs the directory), so a snapshot
 * path either holds a complete file or nothing. finalize and verify block on
 * the disk: vmm.c runs them on a worker thread, never on the loop.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmm_int.h"

#define MAGIC "WARRENSN"
/* 3, written: the stream's checksum is a CRC-32C (the CPU's crc32 instruction: ~4x
 * faster than CRC-32's tables, which took 36 ms of a booted sandbox's pause and of its
 * resume). */
#define VERSION 3u
/* 2, still read and restored: the stream's checksum is a CRC-32. Both carry no
 * configuration section (QEMU runs with migration.send-configuration=off, which a
 * device-state-only stream needs); a version-1 stream has one, which such a QEMU
 * cannot read. */
#define VERSION_OLD 2u
#define OFF_CRC     (VMM_SNAP_HDR - 4)
#define OFF_VER_STR 48
#define OFF_DEV_LEN (OFF_VER_STR + 64)
#define OFF_NPAGES  (OFF_DEV_LEN + 8)
#define OFF_BASE    (OFF_NPAGES + 8)
#define OFF_RAM_CRC (OFF_BASE + 64)
#define OFF_RSVD    (OFF_RAM_CRC + 4)
#define MAX_STREAM  (64ull << 30)
#define PAGE        4096ull

static uint64_t align_page(uint64_t v)
{
    return (v + PAGE - 1) & ~(PAGE - 1);
}

uint64_t vmm_delta_layout(uint64_t dev_len, uint64_t npages, uint64_t *idx_off, uint64_t *data_off)
{
    *idx_off = align_page(VMM_SNAP_HDR + dev_len);
    *data_off = align_page(*idx_off + 4 * npages);
    return *data_off + npages * PAGE;
}

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

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p)
{
    return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

void vmm_snap_encode(uint8_t *hdr, const struct vmm_snap_info *in)
{
    memset(hdr, 0, VMM_SNAP_HDR);
    memcpy(hdr, MAGIC, 8);
    le32(hdr + 8, in->version == VERSION_OLD ? VERSION_OLD : VERSION); /* as decoded, or new */
    le32(hdr + 12, VMM_SNAP_HDR);
    le64(hdr + 16, VMM_SNAP_HDR);
    le64(hdr + 24, in->stream_len);
    le32(hdr + 32, in->stream_crc);
    le32(hdr + 36, in->mem_mb);
    le32(hdr + 40, in->vcpus);
    le32(hdr + 44, in->flags);
    memcpy(hdr + OFF_VER_STR, in->qemu_version, strnlen(in->qemu_version, 63));
    if (in->flags & VMM_SNAP_F_DELTA) {
        le64(hdr + OFF_DEV_LEN, in->dev_len);
        le64(hdr + OFF_NPAGES, in->npages);
        memcpy(hdr + OFF_BASE, in->base, strnlen(in->base, 63));
    }
    if (in->flags & VMM_SNAP_F_RAM_CRC)
        le32(hdr + OFF_RAM_CRC, in->ram_crc);
    le32(hdr + OFF_CRC, vmm_crc32(0, hdr, OFF_CRC));
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(why, cap, __VA_ARGS__);                                                           \
        return -EINVAL;                                                                            \
    } while (0)

int vmm_snap_decode(const uint8_t *buf, size_t len, uint64_t file_size, struct vmm_snap_info *out,
                    char *why, size_t cap)
{
    uint64_t off, slen;
    size_t vlen;

    if (len < VMM_SNAP_HDR || file_size < VMM_SNAP_HDR)
        BAD("snapshot truncated: %llu bytes, shorter than its header",
            (unsigned long long)(file_size < len ? file_size : len));
    if (memcmp(buf, MAGIC, 8) != 0)
        BAD("not a Warren snapshot (bad magic)");
    if (rd32(buf + 8) != VERSION && rd32(buf + 8) != VERSION_OLD)
        BAD("snapshot version %u, this warrend reads %u and %u", rd32(buf + 8), VERSION_OLD,
            VERSION);
    if (vmm_crc32(0, buf, OFF_CRC) != rd32(buf + OFF_CRC))
        BAD("snapshot header checksum mismatch (damaged header)");
    off = rd64(buf + 16);
    slen = rd64(buf + 24);
    if (rd32(buf + 12) != VMM_SNAP_HDR || off != VMM_SNAP_HDR)
        BAD("snapshot header length %u / stream offset %llu unsupported", rd32(buf + 12),
            (unsigned long long)off);
    if (slen == 0 || slen > MAX_STREAM)
        BAD("snapshot stream length %llu out of bounds", (unsigned long long)slen);
    if (file_size != off + slen)
        BAD("snapshot %s: file has %llu bytes, header says %llu",
            file_size < off + slen ? "truncated" : "has trailing bytes",
            (unsigned long long)file_size, (unsigned long long)(off + slen));
    vlen = strnlen((const char *)buf + OFF_VER_STR, 64);
    if (vlen == 0 || vlen == 64)
        BAD("snapshot QEMU version missing or unterminated");
    for (size_t i = 0; i < vlen; i++)
        if (buf[OFF_VER_STR + i] < 0x20 || buf[OFF_VER_STR + i] > 0x7e)
            BAD("snapshot QEMU version not printable");
    /* The version field's tail after its NUL is padding like the reserved
     * bytes: zero, so a header has exactly one encoding. */
    for (size_t i = OFF_VER_STR + vlen; i < OFF_VER_STR + 64; i++)
        if (buf[i])
            BAD("snapshot QEMU version field has bytes after its end");
    for (size_t i = OFF_RSVD; i < OFF_CRC; i++)
        if (buf[i])
            BAD("snapshot header reserved bytes not zero");
    memset(out, 0, sizeof(*out));
    out->version = rd32(buf + 8);
    out->stream_len = slen;
    out->stream_crc = rd32(buf + 32);
    out->mem_mb = rd32(buf + 36);
    out->vcpus = rd32(buf + 40);
    out->flags = rd32(buf + 44);
    if (out->mem_mb == 0 || out->mem_mb > (1u << 20) || out->vcpus == 0 || out->vcpus > 1024)
        BAD("snapshot guest size out of bounds (%u MiB, %u vCPUs)", out->mem_mb, out->vcpus);
    if (out->flags & ~(VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA | VMM_SNAP_F_RAM_CRC))
        BAD("snapshot flags 0x%x unknown", out->flags);
    if ((out->flags & VMM_SNAP_F_SHARED_RAM) && (out->flags & VMM_SNAP_F_DELTA))
        BAD("snapshot flags 0x%x contradict each other", out->flags);
    /* A RAM file's checksum needs a RAM file: a full stream holds the RAM itself. */
    if ((out->flags & VMM_SNAP_F_RAM_CRC) &&
        !(out->flags & (VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA)))
        BAD("snapshot flags 0x%x: a RAM file checksum without a RAM file", out->flags);
    if (out->flags & VMM_SNAP_F_RAM_CRC)
        out->ram_crc = rd32(buf + OFF_RAM_CRC);
    else if (rd32(buf + OFF_RAM_CRC))
        BAD("snapshot header RAM file checksum set without its flag");
    memcpy(out->qemu_version, buf + OFF_VER_STR, vlen);
    out->qemu_version[vlen] = 0;
    if (!(out->flags & VMM_SNAP_F_DELTA)) {
        for (size_t i = OFF_DEV_LEN; i < OFF_RAM_CRC; i++)
            if (buf[i])
                BAD("snapshot header delta fields set without the delta flag");
        return 0;
    }
    {
        uint64_t idx, data, end;
        size_t blen = strnlen((const char *)buf + OFF_BASE, 64);

        out->dev_len = rd64(buf + OFF_DEV_LEN);
        out->npages = rd64(buf + OFF_NPAGES);
        if (out->dev_len == 0 || out->dev_len > slen)
            BAD("snapshot device state length %llu out of bounds",
                (unsigned long long)out->dev_len);
        if (out->npages > (uint64_t)out->mem_mb * (1048576 / PAGE))
            BAD("snapshot holds %llu pages, more than a %u MiB guest has",
                (unsigned long long)out->npages, out->mem_mb);
        end = vmm_delta_layout(out->dev_len, out->npages, &idx, &data);
        if (end != off + slen)
            BAD("snapshot delta layout ends at %llu, the stream at %llu", (unsigned long long)end,
                (unsigned long long)(off + slen));
        if (blen == 0 || blen == 64)
            BAD("snapshot RAM file name missing or unterminated");
        for (size_t i = 0; i < blen; i++)
            if (buf[OFF_BASE + i] <= 0x20 || buf[OFF_BASE + i] > 0x7e || buf[OFF_BASE + i] == '/')
                BAD("snapshot RAM file name not a printable file name");
        for (size_t i = OFF_BASE + blen; i < OFF_BASE + 64; i++)
            if (buf[i])
                BAD("snapshot RAM file name field has bytes after its end");
        memcpy(out->base, buf + OFF_BASE, blen);
        out->base[blen] = 0;
    }
    return 0;
}

int vmm_snap_match(const struct vmm_snap_info *s, const char *qemu_version, unsigned mem_mb,
                   unsigned vcpus, bool shared_ram, char *why, size_t cap)
{
    if (strcmp(s->qemu_version, qemu_version) != 0)
        BAD("snapshot written by QEMU %s, this VM runs QEMU %s", s->qemu_version, qemu_version);
    if (s->mem_mb != mem_mb || s->vcpus != vcpus)
        BAD("snapshot of a %u MiB / %u vCPU guest, this VM is %u MiB / %u vCPU", s->mem_mb,
            s->vcpus, mem_mb, vcpus);
    /* A template's state and a delta go over a memory file; a full stream holds it all. */
    if (!!(s->flags & (VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA)) != shared_ram)
        BAD("snapshot %s guest RAM, this VM %s a memory file",
            s->flags & (VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA) ? "does not hold all its"
                                                                  : "holds",
            shared_ram ? "maps" : "has no");
    return 0;
}

#undef BAD

uint32_t vmm_snap_crc(uint32_t version, uint32_t crc, const void *buf, size_t n)
{
    return version >= 3 ? vmm_crc32c(crc, buf, n) : vmm_crc32(crc, buf, n);
}

/* The checksum (vmm_snap_crc) of len bytes from off. 0 or -errno (-EIO on a short
 * file). */
static int crc_range(int fd, uint32_t version, uint64_t off, uint64_t len, uint32_t *crc)
{
    static __thread uint8_t buf[1 << 16];
    uint32_t c = 0;

    *crc = 0; /* set on every path (an errno of 0 would look like success) */
    while (len > 0) {
        ssize_t n = pread(fd, buf, len < sizeof(buf) ? (size_t)len : sizeof(buf), (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        c = vmm_snap_crc(version, c, buf, (size_t)n);
        off += (uint64_t)n;
        len -= (uint64_t)n;
    }
    *crc = c;
    return 0;
}

int vmm_snap_finalize(int fd, const char *tmp, const char *path, bool sync,
                      struct vmm_snap_info *info, char *why, size_t cap)
{
    uint8_t hdr[VMM_SNAP_HDR];
    struct stat st;
    char *dcopy = NULL;
    int dfd = -1, r;

    if (fstat(fd, &st) != 0) {
        r = -errno;
        snprintf(why, cap, "snapshot: fstat: %s", strerror(-r));
        goto out;
    }
    if ((uint64_t)st.st_size <= VMM_SNAP_HDR) {
        r = -EIO;
        snprintf(why, cap, "snapshot: QEMU wrote no migration stream");
        goto out;
    }
    info->stream_len = (uint64_t)st.st_size - VMM_SNAP_HDR;
    if ((info->flags & VMM_SNAP_F_DELTA) &&
        vmm_delta_layout(info->dev_len, info->npages, &(uint64_t){0}, &(uint64_t){0}) !=
            (uint64_t)st.st_size) {
        r = -EIO;
        snprintf(why, cap, "snapshot: the delta's pages do not end the file");
        goto out;
    }
    info->version = VERSION;
    if ((r = crc_range(fd, VERSION, VMM_SNAP_HDR, info->stream_len, &info->stream_crc)) != 0) {
        snprintf(why, cap, "snapshot: reading the stream back: %s", strerror(-r));
        goto out;
    }
    vmm_snap_encode(hdr, info);
    if (pwrite(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) || (sync && fsync(fd) != 0)) {
        r = errno ? -errno : -EIO;
        snprintf(why, cap, "snapshot: writing the header: %s", strerror(-r));
        goto out;
    }
    if (rename(tmp, path) != 0) {
        r = -errno;
        snprintf(why, cap, "snapshot: rename into place: %s", strerror(-r));
        goto out;
    }
    /* The rename itself must survive a crash too. */
    if (sync && (dcopy = strdup(path)) && (dfd = open(dirname(dcopy), O_RDONLY | O_DIRECTORY)) >= 0)
        (void)fsync(dfd);
    r = 0;
out:
    if (dfd >= 0)
        close(dfd);
    free(dcopy);
    return r;
}

int vmm_snap_verify(int fd, struct vmm_snap_info *out, char *why, size_t cap)
{
    uint8_t hdr[VMM_SNAP_HDR];
    struct stat st;
    uint32_t crc;
    ssize_t n;
    int r;

    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, cap, "snapshot: not a regular file");
        return -EINVAL;
    }
    n = pread(fd, hdr, sizeof(hdr), 0);
    if (n < 0) {
        r = -errno;
        snprintf(why, cap, "snapshot: read: %s", strerror(-r));
        return r;
    }
    if ((r = vmm_snap_decode(hdr, (size_t)n, (uint64_t)st.st_size, out, why, cap)) != 0)
        return r;
    if ((r = crc_range(fd, out->version, VMM_SNAP_HDR, out->stream_len, &crc)) != 0) {
        snprintf(why, cap, "snapshot: reading the stream: %s", strerror(-r));
        return r;
    }
    if (crc != out->stream_crc) {
        snprintf(why, cap, "snapshot stream checksum mismatch (damaged file)");
        return -EINVAL;
    }
    return 0;
}

/* ---- a template's RAM, sealed for jailed clones ---- */

#define MEM_SEALS (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL)

int vmm_pio_all(int fd, void *b, size_t n, uint64_t off, bool write)
{
    uint8_t *p = b;

    while (n > 0) {
        ssize_t k = write ? pwrite(fd, p, n, (off_t)off) : pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

static bool page_zero(const uint8_t *p, size_t n)
{
    return n > 0 && p[0] == 0 && memcmp(p, p + 1, n - 1) == 0;
}

/* skip_zero: pages (4 KiB, at 4 KiB offsets) of zeros inside in's data are left
 * holes too, and everything goes through buf. */
static int copy_sparse(int in, int out, off_t end, bool skip_zero)
{
    static __thread uint8_t buf[1 << 16];
    off_t data = 0, hole;
    bool cfr = !skip_zero; /* copy_file_range, until it says it cannot between these two */

    while (data < end) {
        if ((data = lseek(in, data, SEEK_DATA)) < 0)
            return errno == ENXIO ? 0 : -errno; /* ENXIO: only a hole is left */
        if ((hole = lseek(in, data, SEEK_HOLE)) < 0)
            return -errno;
        while (data < hole) {
            size_t want = (size_t)(hole - data);
            ssize_t n;
            int r;

            if (cfr) {
                off_t io = data, oo = data;
                n = copy_file_range(in, &io, out, &oo, want, 0);
                if (n < 0 &&
                    (errno == EXDEV || errno == EINVAL || errno == EOPNOTSUPP || errno == ENOSYS)) {
                    cfr = false;
                    continue;
                }
            } else {
                n = pread(in, buf, want < sizeof(buf) ? want : sizeof(buf), data);
                for (ssize_t at = 0; n > 0 && at < n;) {
                    /* One page at a time to the next page boundary, or all at once. */
                    size_t len = skip_zero ? 4096 - (size_t)((data + at) % 4096) : (size_t)n;
                    if (len > (size_t)(n - at))
                        len = (size_t)(n - at);
                    if (!(skip_zero && page_zero(buf + at, len)) &&
                        (r = vmm_pio_all(out, buf + at, len, (uint64_t)(data + at), true)) != 0)
                        return r;
                    at += (ssize_t)len;
                }
            }
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return n < 0 ? -errno : -EIO;
            data += n;
        }
    }
    return 0;
}

int vmm_copy_sparse(int in, int out, off_t end)
{
    return copy_sparse(in, out, end, false);
}

int vmm_copy_nonzero(int in, int out, off_t end)
{
    return copy_sparse(in, out, end, true);
}

int vmm_mem_seal(const char *path)
{
    int in = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW), fd = -1, r = 0;
    struct stat st;

    if (in < 0)
        return -errno;
    if (fstat(in, &st) != 0 || !S_ISREG(st.st_mode)) {
        r = errno ? -errno : -EINVAL;
        goto out;
    }
    if ((fd = memfd_create(VMM_MEM_MEMFD_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING)) < 0 ||
        ftruncate(fd, st.st_size) != 0) {
        r = -errno;
        goto out;
    }
    /* Only the data: a hole stays a hole (no memory), as in the file. */
    if ((r = vmm_copy_sparse(in, fd, st.st_size)) == 0 && fcntl(fd, F_ADD_SEALS, MEM_SEALS) != 0)
        r = -errno;
out:
    close(in);
    if (r != 0 && fd >= 0)
        close(fd);
    return r != 0 ? r : fd;
}

int vmm_mem_sealed(int fd)
{
    int s = fcntl(fd, F_GET_SEALS);

    return s >= 0 && (s & MEM_SEALS) == MEM_SEALS ? 0 : -EPERM;
}
