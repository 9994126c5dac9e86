/*
 * vmm_pageout.c - push a stopped VM's memory out to swap (blocking: the worker
 * thread's part of vmm_pageout).
 *
 * process_madvise(MADV_PAGEOUT) over each of QEMU's mappings, one at a time:
 * the kernel reclaims the pages the process alone maps (its copies of guest
 * pages written since the restore, TCG's translated code, its heap and
 * stacks) and leaves those it shares with other processes (the template's
 * RAM file other clones map, shared libraries). Anonymous pages go to swap,
 * so without swap on the host this frees next to nothing. The VM faults them
 * back in as it touches them once it runs again.
 *
 * The pid is named by /proc only after a check through the pidfd that the
 * process is still the VM's: a reused pid is never advised.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "vmm_int.h"

/* Above this (x86-64's [vsyscall]) process_madvise answers EFAULT. */
#define USER_TOP 0x800000000000ull

/* kB of the two lines of /proc/pid/status, or -errno. */
static int status_kb(pid_t pid, uint64_t *rss, uint64_t *swap)
{
    char path[48], line[128];
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (!(f = fopen(path, "re")))
        return -errno;
    *rss = *swap = 0;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "VmRSS:", 6))
            *rss = strtoull(line + 6, NULL, 10);
        else if (!strncmp(line, "VmSwap:", 7))
            *swap = strtoull(line + 7, NULL, 10);
    }
    fclose(f);
    return 0;
}

int vmm_pageout_run(pid_t pid, int pidfd, const int *cancel, struct vmm_pageout_stats *st,
                    char *why, size_t cap)
{
    char path[48], *line = NULL;
    size_t lcap = 0;
    struct timespec t0, t1;
    FILE *f;
    int r = 0;

    memset(st, 0, sizeof(*st));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    if (!(f = fopen(path, "re"))) {
        r = -errno;
        snprintf(why, cap, "cannot open %s: %s", path, strerror(-r));
        return r;
    }
    /* Opened while the pidfd says the process lives: the file is that process's. */
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) != 0) {
        r = -errno;
        snprintf(why, cap, "the VM's process is gone: %s", strerror(-r));
        fclose(f);
        return r;
    }
    status_kb(pid, &st->rss_before_kb, &st->swap_before_kb);
    while (getline(&line, &lcap, f) > 0) {
        unsigned long long a, b;
        struct iovec iov;

        if (__atomic_load_n(cancel, __ATOMIC_ACQUIRE)) {
            r = -ECANCELED;
            snprintf(why, cap, "cancelled: the VM runs again");
            break;
        }
        if (sscanf(line, "%llx-%llx", &a, &b) != 2 || b <= a || b > USER_TOP)
            continue;
        iov.iov_base = (void *)(uintptr_t)a;
        iov.iov_len = (size_t)(b - a);
        /* EINVAL: a mapping the kernel does not page out (locked, PFN-mapped); ENOMEM:
         * unmapped meanwhile. Either way the next mapping is still worth it. */
        if (syscall(SYS_process_madvise, pidfd, &iov, 1ul, MADV_PAGEOUT, 0u) < 0) {
            if (errno == ESRCH) {
                r = -ESRCH;
                snprintf(why, cap, "the VM's process is gone");
                break;
            }
            if (errno != EINVAL && errno != ENOMEM) {
                r = -errno;
                snprintf(why, cap, "process_madvise: %s", strerror(errno));
                break;
            }
        }
        st->mappings++;
    }
    free(line);
    fclose(f);
    status_kb(pid, &st->rss_after_kb, &st->swap_after_kb);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    st->us = (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000;
    if (r == 0)
        snprintf(why, cap,
                 "paged out: resident %.1f -> %.1f MiB, swapped %.1f -> %.1f MiB, %u mappings "
                 "in %.1f ms",
                 (double)st->rss_before_kb / 1024, (double)st->rss_after_kb / 1024,
                 (double)st->swap_before_kb / 1024, (double)st->swap_after_kb / 1024, st->mappings,
                 (double)st->us / 1000);
    return r;
}
