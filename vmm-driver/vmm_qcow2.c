/*
 * vmm_qcow2.c - write an empty qcow2 v3 overlay over a raw backing image.
 *
 * Layout (64 KiB clusters, 16-bit refcounts, as docs/interop/qcow2.txt):
 *   cluster 0  header (104 bytes), backing-format extension "raw", end
 *              marker, then the backing file name
 *   cluster 1  refcount table: one entry -> cluster 2
 *   cluster 2  refcount block: clusters 0 .. 2 + L1 clusters have refcount 1
 *   cluster 3+ L1 table, all zero (nothing allocated: every read goes to the
 *              backing file until the guest writes)
 * The file ends right after the L1 table, as qemu-img's own files do.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmm.h"

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

int vmm_qcow2_create(const char *path, const char *backing, uint64_t size)
{
    uint8_t hdr[HEADER_LEN + 16 + 8 + 1024] = {0};
    uint8_t rt[8] = {0}, rb[2 * 64];
    size_t blen = backing ? strlen(backing) : 0, off;
    uint64_t l1_size, l1_bytes, l1_clusters, nclusters;
    struct stat st;
    int fd = -1, r;

    if (!path || !backing || blen == 0 || blen > 1023)
        return -EINVAL;
    if (size == 0) {
        if (stat(backing, &st) != 0)
            return -errno;
        size = (uint64_t)st.st_size;
    }
    /* QEMU sizes disks in 512-byte sectors; a partial last sector would hide data. */
    if (size == 0 || size % 512 || size > MAX_SIZE)
        return -EINVAL;

    l1_size = (size + L2_COVERS - 1) / L2_COVERS;
    l1_bytes = l1_size * 8;
    l1_clusters = (l1_bytes + CLUSTER - 1) / CLUSTER;
    nclusters = 3 + l1_clusters;
    if (nclusters > sizeof(rb) / 2)
        return -EINVAL;

    /* Header (all big-endian). Unset fields stay zero: no encryption, no
     * snapshots, no feature bits. */
    memcpy(hdr, "QFI\xfb", 4);
    be32(hdr + 4, 3);                  /* version */
    be32(hdr + 20, CLUSTER_BITS);      /* cluster_bits */
    be64(hdr + 24, size);              /* virtual size */
    be32(hdr + 36, (uint32_t)l1_size); /* l1_size */
    be64(hdr + 40, 3ull * CLUSTER);    /* l1_table_offset */
    be64(hdr + 48, 1ull * CLUSTER);    /* refcount_table_offset */
    be32(hdr + 56, 1);                 /* refcount_table_clusters */
    be32(hdr + 96, 4);                 /* refcount_order: 16 bits */
    be32(hdr + 100, HEADER_LEN);       /* header_length */
    off = HEADER_LEN;
    be32(hdr + off, EXT_BACKING); /* backing format: "raw" */
    be32(hdr + off + 4, 3);
    memcpy(hdr + off + 8, "raw", 3);
    off += 8 + 8;
    off += 8;                       /* end-of-extensions marker (zeros) */
    be64(hdr + 8, off);             /* backing_file_offset */
    be32(hdr + 16, (uint32_t)blen); /* backing_file_size */
    memcpy(hdr + off, backing, blen);
    off += blen;

    be64(rt, 2ull * CLUSTER); /* refcount table[0] -> refcount block at cluster 2 */
    for (uint64_t i = 0; i < nclusters; i++) {
        rb[2 * i] = 0;
        rb[2 * i + 1] = 1;
    }

    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if ((r = pwrite_all(fd, hdr, off, 0)) || (r = pwrite_all(fd, rt, sizeof(rt), CLUSTER)) ||
        (r = pwrite_all(fd, rb, 2 * nclusters, 2 * CLUSTER)))
        goto fail;
    /* The L1 table is all zeros: extending the file makes it so without writing. */
    if (ftruncate(fd, (off_t)(3ull * CLUSTER + l1_bytes)) != 0) {
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
