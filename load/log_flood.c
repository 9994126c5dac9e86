/*
 * log_flood.c - how long the loop spends in vmm_log_write under a console flood.
 *
 *   log_flood [-m MiB] [-c cap] [-p] [-d dir]
 *
 * Pushes MiB (200) of console-like lines through one bounded log of `cap`
 * bytes (1 MiB, warrend's console_log_bytes) in 16 KiB pieces, as vmm.c's
 * on_console does, and prints the time of each call: max, p99, p99.9, mean.
 * -p paces the writes like a loop with other work: 16 pieces (one wake-up's
 * worth) then 1 ms of sleep. Built against vmm_int.h only, so the same file
 * measures the driver before the log writer thread (where each call wrote and
 * compacted the file itself) and after (where the call only queues). The
 * same loop around a plain memcpy of each piece gives the machine's noise
 * floor (preemption, page faults) for comparison.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "vmm_int.h"

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    size_t mib = 200, cap = 1 << 20, piece = 16384, calls, line_len = 0;
    const char *dir = ".";
    bool paced = false;
    char path[4096], *buf, line[96];
    double *t, t0, total = 0, wall;
    struct vmm_log l;
    struct rusage ru;
    int opt, r;

    while ((opt = getopt(argc, argv, "m:c:pd:")) != -1) {
        switch (opt) {
        case 'm':
            mib = strtoul(optarg, NULL, 10);
            break;
        case 'c':
            cap = strtoul(optarg, NULL, 10);
            break;
        case 'p':
            paced = true;
            break;
        case 'd':
            dir = optarg;
            break;
        default:
            fprintf(stderr, "usage: %s [-m MiB] [-c cap] [-p] [-d dir]\n", argv[0]);
            return 2;
        }
    }
    calls = (mib << 20) / piece;
    buf = malloc(piece);
    t = calloc(calls, sizeof(*t));
    if (!buf || !t)
        return 1;
    /* A guest's kernel log: lines of text. */
    for (size_t off = 0; off < piece; off += line_len) {
        line_len = (size_t)snprintf(line, sizeof(line),
                                    "[ 1234.567890] flood: line %zu of a chatty guest\n", off);
        memcpy(buf + off, line, off + line_len <= piece ? line_len : piece - off);
    }
    snprintf(path, sizeof(path), "%s/log_flood.%d.log", dir, (int)getpid());
    if ((r = vmm_log_open(&l, path, cap, false)) != 0) {
        fprintf(stderr, "open %s: %s\n", path, strerror(-r));
        return 1;
    }
    wall = now_us();
    for (size_t i = 0; i < calls; i++) {
        t0 = now_us();
        vmm_log_write(&l, buf, piece);
        t[i] = now_us() - t0;
        total += t[i];
        if (paced && i % 16 == 15)
            nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    wall = now_us() - wall;
    {
        char *copy = malloc(piece);
        double floor_max = 0;
        for (size_t i = 0; copy && i < calls; i++) {
            t0 = now_us();
            memcpy(copy, buf, piece);
            __asm__ volatile("" : : "r"(copy) : "memory");
            t0 = now_us() - t0;
            floor_max = t0 > floor_max ? t0 : floor_max;
            if (paced && i % 16 == 15)
                nanosleep(&(struct timespec){0, 1000000}, NULL);
        }
        printf("noise floor: max %.0f us for a %zu-byte memcpy in the same loop\n", floor_max,
               piece);
        free(copy);
    }
#ifdef VMM_LOG_QUEUE_MIN
    {
        struct vmm_log_stats st;
        vmm_log_sync(&l, &st);
        printf("file %llu bytes, compacted away %llu, dropped from the queue %llu (%.1f%%)\n",
               (unsigned long long)st.size, (unsigned long long)st.dropped,
               (unsigned long long)st.lost, 100.0 * (double)st.lost / (double)(calls * piece));
    }
#endif
    vmm_log_close(&l);
#ifdef VMM_LOG_QUEUE_MIN
    vmm_log_shutdown();
#endif
    unlink(path);
    qsort(t, calls, sizeof(*t), cmp_double);
    getrusage(RUSAGE_SELF, &ru);
    printf("%zu MiB in %zu calls of %zu bytes, cap %zu%s: per call max %.0f us, p99.9 %.0f us, "
           "p99 %.1f us, mean %.1f us; loop time in calls %.0f ms of %.0f ms; max RSS %ld KiB\n",
           mib, calls, piece, cap, paced ? ", paced" : "", t[calls - 1], t[calls * 999 / 1000],
           t[calls * 99 / 100], total / (double)calls, total / 1e3, wall / 1e3, ru.ru_maxrss);
    free(t);
    free(buf);
    return 0;
}
