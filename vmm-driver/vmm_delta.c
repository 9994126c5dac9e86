/*
 * vmm_delta.c - a delta snapshot's pages: what a clone owns over its template's RAM.
 *
 * A clone maps the template's RAM file privately: a page it never wrote is the
 * file's, and a page it wrote is its own anonymous copy. /proc/PID/pagemap tells
 * them apart (bit 63 present, bit 61 file-page or shared, bit 62 swapped), so the
 * clone's memory is the file plus exactly the pages it owns. A delta snapshot holds
 * QEMU's device state (xen-save-devices-state: no RAM section) and those pages; a
 * restore writes them into a QEMU started over the same file, before its device
 * state is loaded. The cost follows what the guest dirtied, not its size.
 *
 * Pages move with process_vm_readv/writev (root, as warrend is; a jailed QEMU has
 * another uid and no way to stop it). Every count and offset is bounded by what the
 * host knows: the mapping's length from mem_mb, the page numbers from the header,
 * checked below before any write.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "vmm_int.h"

#define PAGE      4096u
#define RUN_PAGES 256u /* pages per read or write of a run: 1 MiB buffers */

#define FAIL(r_, ...)                                                                              \
    do {                                                                                           \
        snprintf(why, cap, __VA_ARGS__);                                                           \
        r = (r_);                                                                                  \
        goto out;                                                                                  \
    } while (0)

/* The first of pid's mappings at offset 0, len bytes long, of inode ino (ino not 0), or
 * else of the file path (also once removed) or of a memfd vmm_mem_seal made: its start
 * and inode; 0 and 0 if none. */
static uintptr_t map_find(pid_t pid, uint64_t len, ino_t ino, const char *path, ino_t *node_out)
{
    char maps[64], line[4096 + 128];
    static const char memfd[] = "/memfd:" VMM_MEM_MEMFD_NAME " ";
    size_t plen = path ? strlen(path) : 0;
    uintptr_t found = 0;
    FILE *f;

    *node_out = 0;
    snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)pid);
    if (!(f = fopen(maps, "re")))
        return 0;
    while (!found && fgets(line, sizeof(line), f)) {
        unsigned long long lo, hi, off, node;
        unsigned maj, mnr;
        int name = 0;
        const char *n;

        line[strcspn(line, "\n")] = 0;
        if (sscanf(line, "%llx-%llx %*4s %llx %x:%x %llu %n", &lo, &hi, &off, &maj, &mnr, &node,
                   &name) != 6 ||
            off != 0 || hi - lo != len || !node)
            continue;
        n = line + name;
        if (ino ? node == (unsigned long long)ino
                : name &&
                      ((!strncmp(n, path, plen) && (!n[plen] || !strcmp(n + plen, " (deleted)"))) ||
                       !strncmp(n, memfd, sizeof(memfd) - 1))) {
            found = (uintptr_t)lo;
            *node_out = (ino_t)node;
        }
    }
    fclose(f);
    return found;
}

/* The start of pid's mapping of inode ino at offset 0, len bytes long; 0 if none. */
static uintptr_t find_mapping(pid_t pid, ino_t ino, uint64_t len)
{
    ino_t node;

    return ino ? map_find(pid, len, ino, NULL, &node) : 0;
}

ino_t vmm_delta_map_ino(pid_t pid, const char *path, unsigned mem_mb)
{
    ino_t node;

    map_find(pid, (uint64_t)mem_mb << 20, 0, path, &node);
    return node;
}

/* How many pages from idx[i] on are consecutive in the guest, up to RUN_PAGES. */
static uint32_t run_at(const uint32_t *idx, uint64_t n, uint64_t i)
{
    uint32_t k = 1;

    while (i + k < n && k < RUN_PAGES && idx[i + k] == idx[i] + k)
        k++;
    return k;
}

/* Move n pages (consecutive in the guest from page `first`) between the buffer and
 * pid's mapping at base: out of it (read) or into it. 0 or -errno. */
static int move_run(pid_t pid, uintptr_t base, uint32_t first, uint32_t n, uint8_t *buf, bool read)
{
    size_t want = (size_t)n * PAGE, done = 0;

    while (done < want) {
        struct iovec l = {buf + done, want - done};
        struct iovec rem = {(void *)(base + (uintptr_t)first * PAGE + done), want - done};
        ssize_t k = read ? process_vm_readv(pid, &l, 1, &rem, 1, 0)
                         : process_vm_writev(pid, &l, 1, &rem, 1, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? -errno : -EIO;
        done += (size_t)k;
    }
    return 0;
}

/* QEMU wrote its device state into fd after the header: end that stream with an empty
 * vmdescription section (which the loader looks for) and set info->dev_len. */
static int dev_end(int fd, struct vmm_snap_info *info, char *why, size_t cap)
{
    uint8_t vmdesc[5] = {0x06, 0, 0, 0, 0}; /* QEMU_VM_VMDESCRIPTION, 0 bytes */
    struct stat st;
    int r = 0;

    if (fstat(fd, &st) != 0)
        FAIL(-errno, "delta: fstat: %s", strerror(errno));
    if ((uint64_t)st.st_size <= VMM_SNAP_HDR)
        FAIL(-EIO, "delta: QEMU wrote no device state");
    if ((r = vmm_pio_all(fd, vmdesc, sizeof(vmdesc), (uint64_t)st.st_size, true)) != 0)
        FAIL(r, "delta: ending the device state: %s", strerror(-r));
    info->dev_len = (uint64_t)st.st_size + sizeof(vmdesc) - VMM_SNAP_HDR;
out:
    return r;
}

/* The pages of the mapping at base (total pages long) that pid owns (present and not a
 * file's, or swapped out), ascending, into idx (total entries): *n of them. */
static int owned_scan(pid_t pid, uintptr_t base, uint64_t total, uint32_t *idx, uint64_t *n,
                      char *why, size_t cap)
{
    uint64_t *pm = malloc(total * sizeof(*pm));
    char path[64];
    int pmfd = -1, r = 0;

    *n = 0;
    if (!pm)
        FAIL(-ENOMEM, "delta: out of memory");
    snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
    if ((pmfd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        FAIL(-errno, "delta: %s: %s", path, strerror(errno));
    if ((r = vmm_pio_all(pmfd, pm, total * sizeof(*pm), (uint64_t)(base / PAGE) * sizeof(*pm),
                         false)))
        FAIL(r, "delta: reading QEMU's pagemap: %s", strerror(-r));
    for (uint64_t i = 0; i < total; i++) {
        bool present = pm[i] >> 63 & 1, swapped = pm[i] >> 62 & 1, file = pm[i] >> 61 & 1;
        if ((present && !file) || swapped)
            idx[(*n)++] = (uint32_t)i;
    }
out:
    if (pmfd >= 0)
        close(pmfd);
    free(pm);
    return r;
}

int vmm_delta_write(int fd, pid_t pid, ino_t ino, unsigned mem_mb, struct vmm_snap_info *info,
                    char *why, size_t cap)
{
    uint64_t len = (uint64_t)mem_mb << 20, total = len / PAGE, idx_off, data_off, end;
    uint32_t *idx = NULL;
    uint8_t *buf = NULL, *le = NULL;
    uintptr_t base;
    uint64_t n = 0;
    int r = 0;

    if ((r = dev_end(fd, info, why, cap)) != 0)
        goto out;
    if (!(base = find_mapping(pid, ino, len)))
        FAIL(-ENOENT, "delta: QEMU (pid %d) maps no %u MiB RAM file", (int)pid, mem_mb);
    idx = malloc(total * sizeof(*idx));
    le = malloc(total * sizeof(*idx));
    buf = malloc((size_t)RUN_PAGES * PAGE);
    if (!idx || !le || !buf)
        FAIL(-ENOMEM, "delta: out of memory");
    if ((r = owned_scan(pid, base, total, idx, &n, why, cap)) != 0)
        goto out;
    end = vmm_delta_layout(info->dev_len, n, &idx_off, &data_off);
    for (uint64_t i = 0; i < n; i++) /* little-endian on every host */
        for (int b = 0; b < 4; b++)
            le[4 * i + (uint64_t)b] = (uint8_t)(idx[i] >> (8 * b));
    if (n && (r = vmm_pio_all(fd, le, 4 * n, idx_off, true)) != 0)
        FAIL(r, "delta: writing the page list: %s", strerror(-r));
    for (uint64_t i = 0; i < n;) {
        uint32_t k = run_at(idx, n, i);
        if ((r = move_run(pid, base, idx[i], k, buf, true)) != 0)
            FAIL(r, "delta: reading QEMU's RAM: %s", strerror(-r));
        if ((r = vmm_pio_all(fd, buf, (size_t)k * PAGE, data_off + i * PAGE, true)) != 0)
            FAIL(r, "delta: writing the pages: %s", strerror(-r));
        i += k;
    }
    if (ftruncate(fd, (off_t)end) != 0) /* the pads up to the page list and the pages */
        FAIL(-errno, "delta: sizing the file: %s", strerror(errno));
    info->npages = n;
    info->flags |= VMM_SNAP_F_DELTA;
out:
    free(idx);
    free(le);
    free(buf);
    return r;
}

int vmm_ram_crc(int fd, uint64_t len, uint32_t *crc)
{
    static __thread uint8_t buf[1 << 16];
    uint64_t pos = 0;
    uint32_t c = 0;
    struct stat st;

    *crc = 0;
    if (fstat(fd, &st) != 0)
        return -errno;
    if ((uint64_t)st.st_size != len) /* a short file is not its zero-padded self */
        return -EIO;
    while (pos < len) {
        off_t data = lseek(fd, (off_t)pos, SEEK_DATA), hole;
        if (data < 0 && errno != ENXIO)
            return -errno;
        if (data < 0 || (uint64_t)data > len)
            data = (off_t)len; /* holes to the end */
        c = vmm_crc32c_zeros(c, (uint64_t)data - pos);
        pos = (uint64_t)data;
        if (pos == len)
            break;
        if ((hole = lseek(fd, (off_t)pos, SEEK_HOLE)) < 0)
            return -errno;
        if ((uint64_t)hole > len || (uint64_t)hole <= pos)
            hole = (off_t)len;
        while (pos < (uint64_t)hole) {
            size_t want =
                (uint64_t)hole - pos < sizeof(buf) ? (size_t)((uint64_t)hole - pos) : sizeof(buf);
            ssize_t n = pread(fd, buf, want, (off_t)pos);
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return n < 0 ? -errno : -EIO;
            c = vmm_crc32c(c, buf, (size_t)n);
            pos += (uint64_t)n;
        }
    }
    *crc = c;
    return 0;
}

/* RAM files do not change once made (a template's after its save, the others renamed
 * into place; jailed copies are sealed): the checksums already computed in this process,
 * by file identity and change times, so a file that is written again is read again.
 * This keeps a pool sandbox's resume and the forks of one parent from reading the same
 * ~70 MiB each time. */
#define CRC_CACHE 32
static struct crc_seen {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
    uint32_t crc;
} crc_seen[CRC_CACHE];
static unsigned crc_seen_next;
static pthread_mutex_t crc_seen_mu = PTHREAD_MUTEX_INITIALIZER;

static bool same_file(const struct crc_seen *c, const struct stat *st)
{
    return c->ino && c->dev == st->st_dev && c->ino == st->st_ino && c->size == st->st_size &&
           c->mtime.tv_sec == st->st_mtim.tv_sec && c->mtime.tv_nsec == st->st_mtim.tv_nsec &&
           c->ctime.tv_sec == st->st_ctim.tv_sec && c->ctime.tv_nsec == st->st_ctim.tv_nsec;
}

static void crc_remember(const struct stat *st, uint32_t crc)
{
    pthread_mutex_lock(&crc_seen_mu);
    crc_seen[crc_seen_next] =
        (struct crc_seen){st->st_dev, st->st_ino, st->st_size, st->st_mtim, st->st_ctim, crc};
    crc_seen_next = (crc_seen_next + 1) % CRC_CACHE;
    pthread_mutex_unlock(&crc_seen_mu);
}

int vmm_ram_crc_once(int fd, uint64_t len, uint32_t *crc, bool *cached)
{
    struct stat st, after;
    int r;

    *cached = false;
    if (fstat(fd, &st) != 0)
        return -errno;
    pthread_mutex_lock(&crc_seen_mu);
    for (unsigned i = 0; i < CRC_CACHE; i++)
        if (same_file(&crc_seen[i], &st)) {
            *crc = crc_seen[i].crc;
            *cached = true;
        }
    pthread_mutex_unlock(&crc_seen_mu);
    if (*cached && (uint64_t)st.st_size == len)
        return 0;
    *cached = false;
    if ((r = vmm_ram_crc(fd, len, crc)) != 0)
        return r;
    /* Written while it was read: not remembered. */
    if (fstat(fd, &after) != 0 || after.st_mtim.tv_sec != st.st_mtim.tv_sec ||
        after.st_mtim.tv_nsec != st.st_mtim.tv_nsec || after.st_ctim.tv_sec != st.st_ctim.tv_sec ||
        after.st_ctim.tv_nsec != st.st_ctim.tv_nsec)
        return 0;
    crc_remember(&st, *crc);
    return 0;
}

int vmm_ram_crc_mapped(pid_t pid, ino_t ino, unsigned mem_mb, uint32_t *crc)
{
    uint64_t len = (uint64_t)mem_mb << 20;
    uintptr_t base = find_mapping(pid, ino, len);
    char path[96];
    int fd, r;

    *crc = 0;
    if (!base)
        return -ENOENT;
    snprintf(path, sizeof(path), "/proc/%d/map_files/%lx-%lx", (int)pid, (unsigned long)base,
             (unsigned long)(base + len));
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    r = vmm_ram_crc(fd, len, crc);
    close(fd);
    return r;
}

uintptr_t vmm_ram_anon_find(pid_t pid, unsigned mem_mb)
{
    uint64_t len = (uint64_t)mem_mb << 20;
    unsigned long long lo, hi, off, node, prev_hi = 0;
    uintptr_t found = 0, cand = 0;
    unsigned maj, mnr, count = 0;
    char maps[64], line[4096 + 128], perm[8];
    FILE *f;

    snprintf(maps, sizeof(maps), "/proc/%d/maps", (int)pid);
    if (!(f = fopen(maps, "re")))
        return 0;
    /* QEMU's anonymous guest RAM (qemu_ram_mmap): one private read-write mapping of
     * exactly the guest's size, then its PROT_NONE guard page (which the kernel may
     * have merged with a PROT_NONE neighbour). Two that look so (a glibc arena grown
     * to that size happens to, its unused part PROT_NONE) and it is not guessed. */
    while (fgets(line, sizeof(line), f)) {
        int name = 0;
        if (sscanf(line, "%llx-%llx %4s %llx %x:%x %llu %n", &lo, &hi, perm, &off, &maj, &mnr,
                   &node, &name) != 7)
            continue;
        bool anon = node == 0 && (!name || line[name] == '\n' || !line[name]);
        if (cand && prev_hi == lo && anon && !strcmp(perm, "---p")) {
            found = cand;
            count++;
        }
        cand = anon && !strcmp(perm, "rw-p") && hi - lo == len ? (uintptr_t)lo : 0;
        prev_hi = hi;
    }
    fclose(f);
    return count == 1 ? found : 0;
}

int vmm_ram_write(int fd, pid_t pid, unsigned mem_mb, const char *ram_path, bool sync,
                  struct vmm_snap_info *info, char *why, size_t cap)
{
    static const uint8_t zero[PAGE];
    uint64_t len = (uint64_t)mem_mb << 20, total = len / PAGE, idx_off, data_off, end;
    const char *slash = strrchr(ram_path, '/');
    char tmp[4096 + 8], dir[4096];
    uint32_t *idx = NULL;
    uint8_t *buf = NULL;
    uintptr_t base;
    uint64_t n = 0, pos = 0;
    uint32_t crc = 0;
    int rfd = -1, r = 0;

    tmp[0] = 0;
    if (strlen(slash ? slash + 1 : ram_path) >= sizeof(info->base) ||
        strlen(ram_path) >= sizeof(dir))
        FAIL(-ENAMETOOLONG, "ram file: name too long: %s", ram_path);
    if ((r = dev_end(fd, info, why, cap)) != 0)
        goto out;
    if (!(base = vmm_ram_anon_find(pid, mem_mb)))
        FAIL(-ENOTSUP, "ram file: QEMU (pid %d) has no %u MiB anonymous guest RAM to tell apart",
             (int)pid, mem_mb);
    idx = malloc(total * sizeof(*idx));
    buf = malloc((size_t)RUN_PAGES * PAGE);
    if (!idx || !buf)
        FAIL(-ENOMEM, "ram file: out of memory");
    if ((r = owned_scan(pid, base, total, idx, &n, why, cap)) != 0)
        goto out;
    snprintf(tmp, sizeof(tmp), "%s.tmp", ram_path);
    if ((rfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0 ||
        ftruncate(rfd, (off_t)len) != 0)
        FAIL(-errno, "ram file: %s: %s", tmp, strerror(errno));
    /* Each page the guest touched at its place; holes for the rest and for pages of
     * zeros (a third of a booted guest's): a restore reads those as zeros too. */
    for (uint64_t i = 0; i < n;) {
        uint32_t k = run_at(idx, n, i);
        if ((r = move_run(pid, base, idx[i], k, buf, true)) != 0)
            FAIL(r, "ram file: reading QEMU's RAM: %s", strerror(-r));
        /* The file's checksum as it will read back: holes as zeros. */
        crc = vmm_crc32c_zeros(crc, (uint64_t)idx[i] * PAGE - pos);
        crc = vmm_crc32c(crc, buf, (size_t)k * PAGE);
        pos = ((uint64_t)idx[i] + k) * PAGE;
        for (uint32_t p = 0; p < k;) {
            uint32_t q = p;
            while (q < k && memcmp(buf + (size_t)q * PAGE, zero, PAGE) != 0)
                q++;
            if (q > p && (r = vmm_pio_all(rfd, buf + (size_t)p * PAGE, (size_t)(q - p) * PAGE,
                                          ((uint64_t)idx[i] + p) * PAGE, true)) != 0)
                FAIL(r, "ram file: writing: %s", strerror(-r));
            p = q + 1;
        }
        i += k;
    }
    if (sync && fsync(rfd) != 0)
        FAIL(-errno, "ram file: fsync: %s", strerror(errno));
    if (close(rfd) != 0) {
        rfd = -1;
        FAIL(-errno, "ram file: close: %s", strerror(errno));
    }
    rfd = -1;
    if (rename(tmp, ram_path) != 0)
        FAIL(-errno, "ram file: rename to %s: %s", ram_path, strerror(errno));
    tmp[0] = 0;
    /* Its checksum is known: the first restore over it need not read it back. */
    crc = vmm_crc32c_zeros(crc, len - pos);
    {
        struct stat st;
        if (stat(ram_path, &st) == 0)
            crc_remember(&st, crc);
    }
    if (sync) {
        snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - ram_path) : 1,
                 slash ? ram_path : ".");
        if ((rfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
            fsync(rfd);
            close(rfd);
            rfd = -1;
        }
    }
    /* The snapshot: the device state, as a delta with no pages over that file. */
    end = vmm_delta_layout(info->dev_len, 0, &idx_off, &data_off);
    if (ftruncate(fd, (off_t)end) != 0)
        FAIL(-errno, "ram file: sizing the snapshot: %s", strerror(errno));
    info->npages = 0;
    info->flags |= VMM_SNAP_F_DELTA | VMM_SNAP_F_RAM_CRC;
    info->ram_crc = crc;
    snprintf(info->base, sizeof(info->base), "%s", slash ? slash + 1 : ram_path);
out:
    if (rfd >= 0)
        close(rfd);
    if (tmp[0])
        unlink(tmp);
    free(idx);
    free(buf);
    return r;
}

int vmm_delta_pages(const uint8_t *raw, uint64_t n, uint64_t total, uint32_t *out, char *why,
                    size_t cap)
{
    for (uint64_t i = 0; i < n; i++) {
        const uint8_t *p = raw + 4 * i;
        uint32_t v =
            (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        if (v >= total || (i > 0 && v <= out[i - 1])) {
            snprintf(why, cap, "delta: page list entry %" PRIu64 " (%u) out of order or bounds", i,
                     v);
            return -EINVAL;
        }
        out[i] = v; /* raw may be out itself: entry i is read before it is written */
    }
    return 0;
}

int vmm_delta_load(int fd, const struct vmm_snap_info *info, pid_t pid, ino_t ino, bool *touched,
                   char *why, size_t cap)
{
    uint64_t len = (uint64_t)info->mem_mb << 20, total = len / PAGE, idx_off, data_off;
    uint64_t n = info->npages;
    uint32_t *idx = NULL;
    uint8_t *buf = NULL;
    uintptr_t base;
    int r = 0;

    *touched = false;
    vmm_delta_layout(info->dev_len, n, &idx_off, &data_off);
    if (!(base = find_mapping(pid, ino, len)))
        FAIL(-ENOENT, "delta: QEMU (pid %d) maps no %u MiB RAM file", (int)pid, info->mem_mb);
    if (!(idx = malloc((n ? n : 1) * sizeof(*idx))) || !(buf = malloc((size_t)RUN_PAGES * PAGE)))
        FAIL(-ENOMEM, "delta: out of memory");
    if (n && (r = vmm_pio_all(fd, idx, 4 * n, idx_off, false)) != 0)
        FAIL(r, "delta: reading the page list: %s", strerror(-r));
    /* The whole list checked before the first write. */
    if ((r = vmm_delta_pages((const uint8_t *)idx, n, total, idx, why, cap)) != 0)
        goto out;
    for (uint64_t i = 0; i < n;) {
        uint32_t k = run_at(idx, n, i);
        if ((r = vmm_pio_all(fd, buf, (size_t)k * PAGE, data_off + i * PAGE, false)) != 0)
            FAIL(r, "delta: reading the pages: %s", strerror(-r));
        *touched = true;
        if ((r = move_run(pid, base, idx[i], k, buf, false)) != 0)
            FAIL(r, "delta: writing QEMU's RAM: %s", strerror(-r));
        i += k;
    }
out:
    free(idx);
    free(buf);
    return r;
}
