/*
 * clockshift.c - LD_PRELOAD shim for integration tests: shifts what
 * clock_gettime(CLOCK_REALTIME) returns in one process (warrend) by the
 * number of seconds written in $WARREN_TEST_CLOCK_SHIFT_FILE, so a test can
 * step the wall clock of warrend alone, never the machine's.
 *
 * The file is re-read at most every 100 ms of monotonic time. Other clocks
 * pass through untouched.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int (*clock_fn)(clockid_t, struct timespec *);

static long shift_s(clock_fn real)
{
    static long cached;
    static struct timespec next;
    struct timespec now;
    const char *path = getenv("WARREN_TEST_CLOCK_SHIFT_FILE");
    FILE *f;

    if (!path || real(CLOCK_MONOTONIC, &now) != 0)
        return 0;
    if (now.tv_sec < next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec < next.tv_nsec))
        return cached;
    next = now;
    next.tv_nsec += 100 * 1000 * 1000;
    if (next.tv_nsec >= 1000 * 1000 * 1000) {
        next.tv_sec++;
        next.tv_nsec -= 1000 * 1000 * 1000;
    }
    f = fopen(path, "r");
    if (f) {
        long v;
        if (fscanf(f, "%ld", &v) == 1)
            cached = v;
        fclose(f);
    }
    return cached;
}

int clock_gettime(clockid_t id, struct timespec *ts)
{
    static clock_fn real;
    int r;

    if (!real)
        real = (clock_fn)dlsym(RTLD_NEXT, "clock_gettime");
    r = real(id, ts);
    if (r == 0 && id == CLOCK_REALTIME)
        ts->tv_sec += shift_s(real);
    return r;
}
