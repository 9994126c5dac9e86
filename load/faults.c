/*
 * faults.c - what a page fault costs on this host: the table behind the memory
 * figures of load/RESULTS.md ("Page faults on these machines").
 *
 *     load/run --faults [-m MIB] [-g SECONDS]
 *
 * Under TCG, QEMU's guest RAM is host memory: a booted VM's restore touches its
 * RAM for the first time, a clone copies each page it writes (copy-on-write over
 * the template's RAM file), a pool VM maps the file's pages as it reads them.
 * Each row times one of those, on MIB MiB (256), in this process:
 * - anonymous memory, first touch of every 4 KiB page (transparent huge pages off
 *   for the range: MADV_NOHUGEPAGE);
 * - anonymous memory with huge pages (MADV_HUGEPAGE, as QEMU asks for guest RAM),
 *   right after the same amount was freed, then after SECONDS (3) with it free: a
 *   host that hands freed memory back to its hypervisor (free page reporting) pays
 *   for it again there;
 * - a private mapping of a RAM file in /dev/shm (a clone's): every page read,
 *   every page written (copied), and the page tables filled ahead
 *   (MADV_POPULATE_READ).
 * Printed, not asserted.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

#define PAGE 4096u

static double now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void row(const char *what, size_t len, double ms)
{
    printf("| %s | %.1f ms | %.2f ms | %.2f us |\n", what, ms, ms / (double)(len >> 20),
           ms * 1e3 / (double)(len / PAGE));
}

/* Map len bytes of anonymous memory, advise it, write one byte per page: the ms taken. */
static double touch_anon(size_t len, int advice)
{
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    double t0, dt;

    if (m == MAP_FAILED) {
        perror("faults: mmap");
        exit(1);
    }
    if (madvise(m, len, advice) != 0)
        fprintf(stderr, "faults: madvise %d: %s\n", advice, strerror(errno));
    t0 = now_ms();
    for (size_t o = 0; o < len; o += PAGE)
        m[o] = 1;
    dt = now_ms() - t0;
    munmap(m, len);
    return dt;
}

/* A private mapping of fd (len bytes); how: 'r' read each page, 'w' write each page,
 * 'p' MADV_POPULATE_READ. The ms taken. */
static double touch_file(int fd, size_t len, char how)
{
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    volatile char sum = 0;
    double t0, dt;

    if (m == MAP_FAILED) {
        perror("faults: mmap of the file");
        exit(1);
    }
    t0 = now_ms();
    if (how == 'p') {
        if (madvise(m, len, MADV_POPULATE_READ) != 0)
            fprintf(stderr, "faults: MADV_POPULATE_READ: %s\n", strerror(errno));
    } else {
        for (size_t o = 0; o < len; o += PAGE) {
            if (how == 'w')
                m[o] = 2;
            else
                sum += m[o];
        }
    }
    dt = now_ms() - t0;
    munmap(m, len);
    return dt;
}

int main(int argc, char **argv)
{
    size_t mib = 256, len;
    unsigned gap = 3;
    char path[64];
    int opt, fd;

    while ((opt = getopt(argc, argv, "m:g:")) != -1) {
        if (opt == 'm' && atoi(optarg) > 0)
            mib = (size_t)atoi(optarg);
        else if (opt == 'g' && atoi(optarg) >= 0)
            gap = (unsigned)atoi(optarg);
        else {
            fprintf(stderr, "usage: faults [-m MIB] [-g SECONDS]\n");
            return 2;
        }
    }
    len = mib << 20;
    printf("| first touch of %zu MiB | total | per MiB | per 4 KiB page |\n|---|---|---|---|\n",
           mib);
    row("anonymous, 4 KiB pages", len, touch_anon(len, MADV_NOHUGEPAGE));
    (void)touch_anon(len, MADV_HUGEPAGE); /* what the next row finds just freed */
    row("anonymous, huge pages, right after as much was freed", len,
        touch_anon(len, MADV_HUGEPAGE));
    sleep(gap);
    {
        char what[96];
        snprintf(what, sizeof(what), "anonymous, huge pages, %u s after as much was freed", gap);
        row(what, len, touch_anon(len, MADV_HUGEPAGE));
    }
    snprintf(path, sizeof(path), "/dev/shm/warren-faults-%d", (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        perror("faults: the /dev/shm file");
        return 1;
    }
    unlink(path);
    {
        /* The file's pages exist (a template's RAM file is written before any clone). */
        char *w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (w == MAP_FAILED) {
            perror("faults: mmap");
            return 1;
        }
        for (size_t o = 0; o < len; o += PAGE)
            w[o] = 1;
        munmap(w, len);
    }
    row("RAM file in /dev/shm, private mapping: read every page", len, touch_file(fd, len, 'r'));
    row("the same: write every page (copy-on-write)", len, touch_file(fd, len, 'w'));
    row("the same: page tables filled ahead (MADV_POPULATE_READ)", len, touch_file(fd, len, 'p'));
    close(fd);
    return 0;
}
