/*
 * vmm_log.c - the bounded console log: boot messages + marker + recent tail.
 *
 * Invariant: size <= cap. Before the first overflow the file is the plain
 * output. At the first overflow it becomes
 *     [0, head)                 the first head bytes of output
 *     [head, head + MARK)       "[warren: console truncated, N bytes dropped]"
 *     [head + MARK, size)       the newest output
 * and each later overflow keeps the newer half of the tail region. The
 * marker has a fixed width so it is rewritten in place; a reader (or an
 * adopting warrend) finds it at offset head.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmm_int.h"

static void put_marker(struct vmm_log *l)
{
    char m[VMM_LOG_MARK_LEN + 1];
    int n = snprintf(m, sizeof(m), "\n[warren: %s truncated, %20" PRIu64 " bytes dropped]", l->what,
                     l->dropped);

    /* Pad to the fixed width and end the line. */
    if (n < 0)
        return;
    memset(m + n, ' ', VMM_LOG_MARK_LEN - (size_t)n);
    m[VMM_LOG_MARK_LEN - 1] = '\n';
    (void)!pwrite(l->fd, m, VMM_LOG_MARK_LEN, (off_t)l->head);
}

static int copy_down(int fd, uint64_t from, uint64_t to, uint64_t n)
{
    char buf[16384];

    while (n > 0) {
        size_t chunk = n < sizeof(buf) ? (size_t)n : sizeof(buf);
        ssize_t got = pread(fd, buf, chunk, (off_t)from);
        if (got <= 0)
            return -1;
        if (pwrite(fd, buf, (size_t)got, (off_t)to) != got)
            return -1;
        from += (uint64_t)got;
        to += (uint64_t)got;
        n -= (uint64_t)got;
    }
    return 0;
}

/* The file is full (size == cap): keep the newer half of the tail region. */
static void compact(struct vmm_log *l)
{
    uint64_t tail0 = l->head + VMM_LOG_MARK_LEN;
    uint64_t region, keep;

    if (!l->truncated) {
        /* First overflow: bytes [head, head + MARK) become the marker, so the
         * tail region starts where the marker ends. */
        l->truncated = true;
        l->dropped += VMM_LOG_MARK_LEN;
    }
    region = l->size - tail0;
    keep = region / 2;
    if (copy_down(l->fd, l->size - keep, tail0, keep) != 0)
        keep = 0; /* an I/O error: drop the whole tail rather than keep garbage */
    l->dropped += region - keep;
    l->size = tail0 + keep;
    (void)!ftruncate(l->fd, (off_t)l->size);
    put_marker(l);
}

void vmm_log_write(struct vmm_log *l, const void *buf, size_t n)
{
    const char *p = buf;

    if (l->fd < 0) {
        l->dropped += n;
        return;
    }
    while (n > 0) {
        uint64_t room = l->cap - l->size;
        size_t chunk = n < room ? n : (size_t)room;
        ssize_t w;

        if (chunk == 0) {
            compact(l);
            continue;
        }
        w = pwrite(l->fd, p, chunk, (off_t)l->size);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            l->dropped += n; /* ENOSPC, EIO...: never retry on the loop */
            return;
        }
        l->size += (uint64_t)w;
        p += w;
        n -= (size_t)w;
    }
}

/* Adopting an existing log: find the marker at offset head, if any. */
static void recover(struct vmm_log *l)
{
    char m[VMM_LOG_MARK_LEN + 1], prefix[48];
    unsigned long long dropped;

    if (l->size > l->cap) {
        /* cap shrank since the file was written: restart the tail. */
        l->dropped = l->size - l->head - VMM_LOG_MARK_LEN;
        l->size = l->head + VMM_LOG_MARK_LEN;
        l->truncated = true;
        (void)!ftruncate(l->fd, (off_t)l->size);
        put_marker(l);
        return;
    }
    if (l->size < l->head + VMM_LOG_MARK_LEN)
        return;
    if (pread(l->fd, m, VMM_LOG_MARK_LEN, (off_t)l->head) != VMM_LOG_MARK_LEN)
        return;
    m[VMM_LOG_MARK_LEN] = 0;
    snprintf(prefix, sizeof(prefix), "\n[warren: %s truncated, ", l->what);
    if (strncmp(m, prefix, strlen(prefix)) != 0)
        return;
    if (sscanf(m + strlen(prefix), "%llu", &dropped) == 1) {
        l->dropped = dropped;
        l->truncated = true;
    }
}

int vmm_log_open(struct vmm_log *l, const char *path, size_t cap, bool append)
{
    return vmm_log_open_named(l, "console", path, cap, append);
}

int vmm_log_open_named(struct vmm_log *l, const char *what, const char *path, size_t cap,
                       bool append)
{
    struct stat st;

    memset(l, 0, sizeof(*l));
    snprintf(l->what, sizeof(l->what), "%s", what);
    l->fd = -1;
    if (cap == 0)
        cap = VMM_CONSOLE_DEFAULT;
    if (cap < VMM_CONSOLE_MIN)
        cap = VMM_CONSOLE_MIN;
    l->cap = cap;
    l->head = cap / 2;
    /* O_NOFOLLOW, and a regular file only: a jailed QEMU owns the run dir and
     * could leave a symlink or a FIFO here for warrend (root) to open. */
    l->fd =
        open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (append ? 0 : O_TRUNC),
             0600);
    if (l->fd < 0)
        return -errno;
    if (fstat(l->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(l->fd);
        l->fd = -1;
        return -EINVAL;
    }
    if (append && fstat(l->fd, &st) == 0) {
        l->size = (uint64_t)st.st_size;
        recover(l);
    }
    return 0;
}

void vmm_log_close(struct vmm_log *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}
