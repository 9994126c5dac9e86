/*
 * vmm_qcow2.c - write an empty qcow2 v3 overlay over a raw or qcow2 backing image.
 *
 * A qcow2 backing (a template's frozen overlay, which a guest wrote through
 * QEMU) has its header read and every field used or trusted bounded; its
 * virtual size becomes the overlay's. Which format the backing is comes from
 * its first 4 bytes: a raw backing is a template image, never guest-written.
 *
 * Layout (64 KiB clusters, 16-bit refcounts, as docs/interop/qcow2.txt):
 *   cluster 0  header (104 bytes), backing-format extension, end
 *              marker, then the backing file name
 *   cluster 1  refcount table: one entry -> cluster 2
 *   cluster 2  refcount block: clusters 0 .. 2 + L1 clusters have refcount 1
 *   cluster 3+ L1 table, all zero (nothing allocated: every read goes to the
 *              backing file until the guest writes)
 * The file ends right after the L1 table, as qemu-img's own files do.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmm_int.h"

#define CLUSTER_BITS 16
#define CLUSTER      (1u << CLUSTER_BITS)
#define L2_COVERS    ((uint64_t)(CLUSTER / 8) * CLUSTER) /* guest bytes per L1 entry */
#define HEADER_LEN   104
#define EXT_BACKING  0xe2792acau
#define MAX_SIZE     (1ull << 46) /* 64 TiB: an L1 table of 1 MiB */

static void be32(uint8_t *p, uint32_t v)
{
    p[0] = v >> 24;
    p[1] = v >> 16;
    p[2] = v >> 8;
    p[3] = v;
}

static void be64(uint8_t *p, uint64_t v)
{
    be32(p, v >> 32);
    be32(p + 4, (uint32_t)v);
}

static int pwrite_all(int fd, const void *buf, size_t n, off_t off)
{
    const uint8_t *p = buf;

    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
        off += w;
    }
    return 0;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) << 32 | rd32(p + 4);
}

int vmm_qcow2_probe(const uint8_t *h, size_t len, bool *is_qcow2, uint64_t *vsize)
{
    uint32_t ver, cbits, hlen;
    uint64_t size, incompat, l1;

    *is_qcow2 = len >= 4 && memcmp(h, "QFI\xfb", 4) == 0;
    if (!*is_qcow2)
        return 0;
    if (len < 72)
        return -EINVAL;
    ver = rd32(h + 4);
    cbits = rd32(h + 20);
    size = rd64(h + 24);
    l1 = rd32(h + 36);
    if (ver != 2 && ver != 3)
        return -EINVAL;
    if (cbits < 9 || cbits > 21)
        return -EINVAL;
    if (size == 0 || size % 512 || size > MAX_SIZE)
        return -EINVAL;
    if (rd32(h + 32) != 0) /* crypt_method: an encrypted backing is not ours */
        return -EINVAL;
    /* Enough L1 entries to map the whole size, and a bounded table. */
    if (l1 > (32u << 20) / 8 || l1 * (((uint64_t)1 << cbits) / 8) * ((uint64_t)1 << cbits) < size)
        return -EINVAL;
    if (ver == 3) {
        if (len < 104)
            return -EINVAL;
        incompat = rd64(h + 72);
        hlen = rd32(h + 100);
        /* Known bits only; not corrupt (1), no external data file (2). */
        if (incompat & ~(uint64_t)0x19 || hlen < 104 || hlen > (1u << cbits))
            return -EINVAL;
        if (rd32(h + 96) > 6) /* refcount_order */
            return -EINVAL;
    }
    *vsize = size;
    return 0;
}

int vmm_qcow2_encode(uint8_t *out, size_t cap, uint64_t size, bool qcow2_backing,
                     const char *backing, struct vmm_qcow2_layout *lay)
{
    const char *bfmt = qcow2_backing ? "qcow2" : "raw";
    size_t blen = backing ? strlen(backing) : 0, off;
    uint64_t l1_size, l1_bytes, l1_clusters;

    if (blen == 0 || blen > VMM_QCOW2_NAME_MAX)
        return -EINVAL;
    /* QEMU sizes disks in 512-byte sectors; a partial last sector would hide data. */
    if (size == 0 || size % 512 || size > MAX_SIZE)
        return -EINVAL;
    l1_size = (size + L2_COVERS - 1) / L2_COVERS;
    l1_bytes = l1_size * 8;
    l1_clusters = (l1_bytes + CLUSTER - 1) / CLUSTER;
    if (3 + l1_clusters > VMM_QCOW2_REFS_MAX)
        return -EINVAL;
    if (cap < HEADER_LEN + 16 + 8 + blen)
        return -ENOSPC;

    /* Header (all big-endian). Unset fields stay zero: no encryption, no
     * snapshots, no feature bits. */
    memset(out, 0, HEADER_LEN + 16 + 8 + blen);
    memcpy(out, "QFI\xfb", 4);
    be32(out + 4, 3);                  /* version */
    be32(out + 20, CLUSTER_BITS);      /* cluster_bits */
    be64(out + 24, size);              /* virtual size */
    be32(out + 36, (uint32_t)l1_size); /* l1_size */
    be64(out + 40, 3ull * CLUSTER);    /* l1_table_offset */
    be64(out + 48, 1ull * CLUSTER);    /* refcount_table_offset */
    be32(out + 56, 1);                 /* refcount_table_clusters */
    be32(out + 96, 4);                 /* refcount_order: 16 bits */
    be32(out + 100, HEADER_LEN);       /* header_length */
    off = HEADER_LEN;
    be32(out + off, EXT_BACKING); /* backing format: "raw" or "qcow2" */
    be32(out + off + 4, (uint32_t)strlen(bfmt));
    memcpy(out + off + 8, bfmt, strlen(bfmt));
    off += 8 + 8;                   /* extension data padded to 8 bytes: both names fit */
    off += 8;                       /* end-of-extensions marker (zeros) */
    be64(out + 8, off);             /* backing_file_offset */
    be32(out + 16, (uint32_t)blen); /* backing_file_size */
    memcpy(out + off, backing, blen);
    lay->hdr_len = off + blen;
    lay->l1_bytes = l1_bytes;
    lay->nclusters = 3 + l1_clusters;
    lay->file_len = 3ull * CLUSTER + l1_bytes;
    return 0;
}

int vmm_qcow2_create(const char *path, const char *backing, uint64_t size)
{
    uint8_t probe[512];
    bool is_qcow2 = false;
    uint64_t vsize = 0;
    ssize_t pn;
    uint8_t hdr[HEADER_LEN + 16 + 8 + VMM_QCOW2_NAME_MAX];
    uint8_t rt[8] = {0}, rb[2 * VMM_QCOW2_REFS_MAX];
    struct vmm_qcow2_layout lay;
    struct stat st;
    int fd = -1, r;

    if (!path || !backing || !*backing || strlen(backing) > VMM_QCOW2_NAME_MAX)
        return -EINVAL;
    fd = open(backing, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    pn = pread(fd, probe, sizeof(probe), 0);
    r = pn < 0 ? -errno : vmm_qcow2_probe(probe, (size_t)pn, &is_qcow2, &vsize);
    close(fd);
    fd = -1;
    if (r != 0)
        return r;
    if (is_qcow2) {
        /* A bigger overlay would be legal qcow2, but a clone sees its template's disk. */
        if (size != 0 && size != vsize)
            return -EINVAL;
        size = vsize;
    }
    if (size == 0) {
        if (stat(backing, &st) != 0)
            return -errno;
        size = (uint64_t)st.st_size;
    }
    if ((r = vmm_qcow2_encode(hdr, sizeof(hdr), size, is_qcow2, backing, &lay)) != 0)
        return r == -ENOSPC ? -EINVAL : r;

    be64(rt, 2ull * CLUSTER); /* refcount table[0] -> refcount block at cluster 2 */
    for (uint64_t i = 0; i < lay.nclusters; i++) {
        rb[2 * i] = 0;
        rb[2 * i + 1] = 1;
    }

    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if ((r = pwrite_all(fd, hdr, lay.hdr_len, 0)) ||
        (r = pwrite_all(fd, rt, sizeof(rt), CLUSTER)) ||
        (r = pwrite_all(fd, rb, 2 * lay.nclusters, 2 * CLUSTER)))
        goto fail;
    /* The L1 table is all zeros: extending the file makes it so without writing. */
    if (ftruncate(fd, (off_t)lay.file_len) != 0) {
        r = -errno;
        goto fail;
    }
    if (close(fd) != 0) {
        fd = -1;
        r = -errno;
        goto fail;
    }
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    unlink(path);
    return r;
}

int vmm_qcow2_backing_name(const uint8_t *h, size_t len, char *out, size_t cap)
{
    bool is_qcow2;
    uint64_t vsize, off;
    uint32_t n, cluster;
    int r;

    if (cap == 0)
        return -EINVAL;
    out[0] = 0;
    if ((r = vmm_qcow2_probe(h, len, &is_qcow2, &vsize)) != 0 || !is_qcow2)
        return -EINVAL;
    off = rd64(h + 8);
    n = rd32(h + 16);
    cluster = 1u << rd32(h + 20);
    if (off == 0 && n == 0)
        return 0; /* no backing file */
    /* The name lives in cluster 0, after the fixed header, within what we read. */
    if (n == 0 || n > VMM_QCOW2_NAME_MAX || n >= cap || off < 72 || off > cluster ||
        n > cluster - off || off > len || n > len - off || memchr(h + off, 0, n))
        return -EINVAL;
    memcpy(out, h + off, n);
    out[n] = 0;
    return 0;
}

/* Cluster 0 of path (at most 64 KiB, enough for every name we accept): bytes read. */
static ssize_t read_head(int fd, uint8_t *buf, size_t cap)
{
    ssize_t n;

    do
        n = pread(fd, buf, cap, 0);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

#define HEAD_MAX CLUSTER

int vmm_qcow2_backing(const char *path, char *out, size_t cap)
{
    uint8_t *buf = malloc(HEAD_MAX);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;
    int r;

    if (!buf || fd < 0) {
        r = !buf ? -ENOMEM : -errno;
        goto out;
    }
    n = read_head(fd, buf, HEAD_MAX);
    r = n < 0 ? (int)n : vmm_qcow2_backing_name(buf, (size_t)n, out, cap);
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return r;
}

int vmm_qcow2_rebase(const char *path, const char *backing)
{
    uint8_t *buf = malloc(HEAD_MAX);
    char old[VMM_QCOW2_NAME_MAX + 1];
    size_t blen = backing ? strlen(backing) : 0;
    uint8_t num[4];
    int fd = open(path, O_RDWR | O_CLOEXEC);
    uint64_t off;
    uint32_t oldn;
    ssize_t n;
    int r;

    if (!buf || fd < 0) {
        r = !buf ? -ENOMEM : -errno;
        goto out;
    }
    if (blen == 0 || blen > VMM_QCOW2_NAME_MAX) {
        r = -EINVAL;
        goto out;
    }
    n = read_head(fd, buf, HEAD_MAX);
    if (n < 0 || (r = vmm_qcow2_backing_name(buf, (size_t)n, old, sizeof(old))) != 0 || !old[0]) {
        r = n < 0 ? (int)n : -EINVAL;
        goto out;
    }
    off = rd64(buf + 8);
    oldn = rd32(buf + 16);
    /* The new name in the old one's place: it must stay inside cluster 0. */
    if (blen > (1ull << rd32(buf + 20)) - off) { /* off is inside cluster 0 (checked) */
        r = -ENAMETOOLONG;
        goto out;
    }
    memset(buf + off, 0, oldn);
    if ((r = pwrite_all(fd, buf + off, oldn, (off_t)off)) || /* no tail of the old name */
        (r = pwrite_all(fd, backing, blen, (off_t)off)))
        goto out;
    be32(num, (uint32_t)blen);
    if ((r = pwrite_all(fd, num, 4, 16)))
        goto out;
    r = fsync(fd) == 0 ? 0 : -errno;
out:
    if (fd >= 0)
        close(fd);
    free(buf);
    return r;
}
