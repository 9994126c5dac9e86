/*
 * test_vmm_log.c - the bounded logs and their writer thread (vmm_log.c), no VM.
 *
 * Compaction keeps head + marker + tail; the queue is bounded (held writer:
 * the memory stays at the bound, the rest is counted and marked in the file
 * where it was dropped); close hands the queue over and the caller's struct
 * may be freed at once; reopening a file waits for its previous writer;
 * many logs at once stay whole and in order next to a flooded one; the
 * in-memory tail (QEMU's exit reason) needs no file. Meant for ASan and TSan
 * runs too.
 */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vmm_int.h"

int failures;

#include "check.h"

static char dir[64];

static uint64_t file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static char *slurp(const char *p, size_t *len)
{
    FILE *f = fopen(p, "r");
    size_t cap = 8 << 20;
    char *b = malloc(cap);

    *len = f ? fread(b, 1, cap - 1, f) : 0;
    b[*len] = 0;
    if (f)
        fclose(f);
    return b;
}

static int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

/* Compaction, as before the writer thread: head + marker + newest output, and
 * every byte either in the file or counted. Synced often enough that the
 * queue never fills (the batches are far below its 64 KiB). */
static void test_compaction(void)
{
    char path[128], line[64];
    struct vmm_log l;
    struct vmm_log_stats st;
    uint64_t total = 0;
    const unsigned cap = 8192;
    size_t len;
    char *b;
    int last = 0;

    snprintf(path, sizeof(path), "%s/console.log", dir);
    CHECK(vmm_log_open(&l, path, cap, false) == 0);
    /* Below the cap: the file is the plain output. */
    vmm_log_write(&l, "hello\n", 6);
    CHECK(vmm_log_sync(&l, &st) == 0 && st.size == 6 && file_size(path) == 6);
    for (int i = 0; i < 20000; i++) {
        int n = snprintf(line, sizeof(line), "line %06d of a chatty guest\n", i);
        vmm_log_write(&l, line, (size_t)n);
        total += (uint64_t)n;
        last = i;
        if (i % 100 == 99) {
            vmm_log_sync(&l, NULL);
            CHECK(file_size(path) <= cap);
        }
    }
    total += 6;
    CHECK(vmm_log_sync(&l, &st) == 0);
    CHECK(st.truncated && st.lost == 0);
    /* Every byte is either in the file (minus the marker) or counted as dropped. */
    CHECK(st.size - VMM_LOG_MARK_LEN + st.dropped == total);
    vmm_log_close(&l);
    CHECK(vmm_log_sync(&l, &st) == -EBADF);

    b = slurp(path, &len);
    CHECK(len <= cap);
    CHECK(strncmp(b, "hello\nline 000000", 17) == 0);
    CHECK(strstr(b, "[warren: console truncated,") != NULL);
    snprintf(line, sizeof(line), "line %06d of a chatty guest\n", last);
    CHECK(len > strlen(line) && strcmp(b + len - strlen(line), line) == 0);
    free(b);

    /* An adopting warrend picks the state up from the file. */
    CHECK(vmm_log_open(&l, path, cap, true) == 0);
    CHECK(vmm_log_sync(&l, &st) == 0);
    CHECK(st.truncated && st.size - VMM_LOG_MARK_LEN + st.dropped == total);
    for (int i = 0; i < 1000; i++) {
        int n = snprintf(line, sizeof(line), "after adopt %06d\n", i);
        vmm_log_write(&l, line, (size_t)n);
        total += (uint64_t)n;
        if (i % 100 == 99)
            vmm_log_sync(&l, NULL);
    }
    CHECK(vmm_log_sync(&l, &st) == 0 && file_size(path) <= cap);
    CHECK(st.size - VMM_LOG_MARK_LEN + st.dropped == total && st.lost == 0);
    vmm_log_close(&l);
    /* Reading after close: the writer may still be on it; reopening waits. */
    CHECK(vmm_log_open(&l, path, cap, true) == 0);
    b = slurp(path, &len);
    CHECK(strstr(b, "after adopt 000999\n") != NULL && strncmp(b, "hello\n", 6) == 0);
    free(b);
    vmm_log_close(&l);

    /* A log written with a larger cap is cut down on adopt. */
    CHECK(vmm_log_open(&l, path, 4096, true) == 0);
    CHECK(file_size(path) <= 4096);
    vmm_log_write(&l, "x\n", 2);
    vmm_log_sync(&l, NULL);
    CHECK(file_size(path) <= 4096);
    vmm_log_close(&l);
}

/* The qemu.log marker names its file; adoption finds it again. */
static void test_named(void)
{
    char path[128], buf[256];
    struct vmm_log l;
    struct vmm_log_stats st;
    size_t len;
    char *b;

    snprintf(path, sizeof(path), "%s/qemu.log", dir);
    CHECK(vmm_log_open_named(&l, "qemu", path, 4096, false) == 0);
    memset(buf, 'q', sizeof(buf));
    for (int i = 0; i < 100; i++)
        vmm_log_write(&l, buf, sizeof(buf));
    CHECK(vmm_log_sync(&l, &st) == 0);
    CHECK(file_size(path) <= 4096 && st.truncated && st.lost == 0);
    vmm_log_close(&l);
    CHECK(vmm_log_open_named(&l, "qemu", path, 4096, true) == 0);
    b = slurp(path, &len);
    CHECK(strstr(b, "[warren: qemu truncated,") != NULL);
    free(b);
    CHECK(vmm_log_sync(&l, &st) == 0 && st.truncated);
    vmm_log_close(&l);
    /* A symlink planted in the run dir is never followed. */
    snprintf(buf, sizeof(buf), "%s/link.log", dir);
    CHECK(symlink(path, buf) == 0);
    CHECK(vmm_log_open_named(&l, "qemu", buf, 4096, false) == -ELOOP);
}

/* bytes of numbered lines: position i is recognisable in the file. */
static char *pattern(size_t n, char tag)
{
    char *g = malloc(n + 32);
    size_t off = 0;

    while (off < n)
        off += (size_t)sprintf(g + off, "%c%09zu\n", tag, off);
    return g;
}

static bool ends_with(const char *b, size_t len, const char *s, size_t n)
{
    return len >= n && memcmp(b + len - n, s, n) == 0;
}

/* A full queue: the loop never holds more than the bound, counts what it
 * drops, and the file says where and how much. */
static void test_drop(void)
{
    char path[128], want[256], tail[VMM_LOG_TAIL + 1];
    struct vmm_log l;
    struct vmm_log_stats st;
    const size_t cap = 1 << 20, bound = cap, extra = 5000, flood = 4 << 20;
    char *g = pattern(bound + extra, 'a'), *z = pattern(flood, 'z'), *b;
    uint64_t lost;
    size_t len, n;

    snprintf(path, sizeof(path), "%s/drop.log", dir);
    CHECK(vmm_log_open(&l, path, cap, false) == 0);
    vmm_log_hold(true);
    for (size_t off = 0; off < bound + extra; off += 4096) {
        n = bound + extra - off < 4096 ? bound + extra - off : 4096;
        vmm_log_write(&l, g + off, n);
    }
    CHECK(vmm_log_queued(&l) == bound);
    /* Four times the bound more: memory stays where it is. */
    for (size_t off = 0; off < flood; off += 16384)
        vmm_log_write(&l, z + off, 16384);
    CHECK(vmm_log_queued(&l) == bound);
    CHECK(file_size(path) == 0); /* nothing written while held */
    lost = extra + flood;
    vmm_log_hold(false);
    /* Drained first: written into a still-full queue, "after" would be dropped too. */
    vmm_log_sync(&l, NULL);
    vmm_log_write(&l, "after\n", 6);
    CHECK(vmm_log_sync(&l, &st) == 0);
    CHECK(st.lost == lost);
    CHECK(vmm_log_queued(&l) == 0);
    b = slurp(path, &len);
    CHECK(len <= cap && strncmp(b, g, 1000) == 0); /* the head: the first output */
    /* The last queued bytes, the marker where the drop was, then the output after it. */
    n = (size_t)snprintf(want, sizeof(want),
                         "%.*s\n[warren: %llu bytes of console output dropped]\nafter\n", 100,
                         g + bound - 100, (unsigned long long)lost);
    CHECK(ends_with(b, len, want, n));
    free(b);

    /* A drop with nothing written after it is still marked once the queue drains. */
    vmm_log_hold(true);
    for (size_t off = 0; off < bound + 100; off += 16384) {
        n = bound + 100 - off < 16384 ? bound + 100 - off : 16384;
        vmm_log_write(&l, z + off, n);
    }
    vmm_log_hold(false);
    CHECK(vmm_log_sync(&l, &st) == 0 && st.lost == lost + 100);
    b = slurp(path, &len);
    n = (size_t)snprintf(want, sizeof(want),
                         "%.*s\n[warren: 100 bytes of console output dropped]\n", 100,
                         z + bound - 100);
    CHECK(ends_with(b, len, want, n));
    CHECK(len <= cap && strstr(b, "[warren: console truncated,") != NULL);
    free(b);
    /* The in-memory tail has the last bytes given, dropped ones included. */
    CHECK(vmm_log_tail(&l, tail, sizeof(tail)) == VMM_LOG_TAIL);
    CHECK(memcmp(tail, z + bound + 100 - VMM_LOG_TAIL, VMM_LOG_TAIL) == 0);
    vmm_log_close(&l);
    free(g);
    free(z);
}

/* Close hands the queue to the writer: every byte reaches the file, and the
 * caller's struct is never touched again (freed here at once: ASan would see). */
static void test_close_flushes(void)
{
    char path[128];
    struct vmm_log *l = malloc(sizeof(*l));
    const size_t total = 300 << 10;
    char *g = pattern(total, 'c'), *b;
    size_t len;
    int fds;

    snprintf(path, sizeof(path), "%s/close.log", dir);
    vmm_log_shutdown(); /* earlier tests' closed logs: gone before counting fds */
    fds = open_fds();
    CHECK(vmm_log_open(l, path, 1 << 20, false) == 0);
    vmm_log_hold(true);
    for (size_t off = 0; off < total; off += 1000)
        vmm_log_write(l, g + off, total - off < 1000 ? total - off : 1000);
    vmm_log_close(l);
    memset(l, 0x5a, sizeof(*l));
    free(l);
    CHECK(file_size(path) == 0);
    vmm_log_hold(false);
    vmm_log_shutdown(); /* writes every queue, closed ones included, then stops */
    b = slurp(path, &len);
    CHECK(len == total && memcmp(b, g, total) == 0);
    free(b);
    CHECK(open_fds() == fds); /* the writer closed the file */
    free(g);
}

static void *release_later(void *arg)
{
    nanosleep(&(struct timespec){0, 300000000}, NULL);
    vmm_log_hold(false);
    return NULL;
}

/* Opening a file whose previous log is still being written waits for it:
 * the adopted size is the whole file, and nothing lands out of order. */
static void test_reopen_waits(void)
{
    char path[128];
    struct vmm_log l;
    struct vmm_log_stats st;
    const size_t total = 512 << 10;
    char *g = pattern(total, 'r'), *b;
    pthread_t t;
    size_t len;

    snprintf(path, sizeof(path), "%s/reopen.log", dir);
    CHECK(vmm_log_open(&l, path, 4 << 20, false) == 0);
    vmm_log_hold(true);
    for (size_t off = 0; off < total; off += 16384)
        vmm_log_write(&l, g + off, 16384);
    vmm_log_close(&l);
    /* Still held: the reopen below can only return once this releases it. */
    CHECK(pthread_create(&t, NULL, release_later, NULL) == 0);
    CHECK(vmm_log_open(&l, path, 4 << 20, true) == 0);
    pthread_join(t, NULL);
    vmm_log_write(&l, "next\n", 5);
    CHECK(vmm_log_sync(&l, &st) == 0 && st.size == total + 5 && st.lost == 0);
    vmm_log_close(&l);
    vmm_log_shutdown();
    b = slurp(path, &len);
    CHECK(len == total + 5 && memcmp(b, g, total) == 0 && memcmp(b + total, "next\n", 5) == 0);
    free(b);
    free(g);
}

/* Many logs through the one writer, some closed and reopened midway, next to
 * a flooded one: each file holds exactly its own lines in order, and the
 * flood's drops are its own. */
static void test_many(void)
{
    enum { N = 64, LINES = 300 };
    struct vmm_log *logs = calloc(N, sizeof(*logs)), flood;
    struct vmm_log_stats st;
    char path[128], line[64];
    char *z = pattern(16384, 'f');
    int fds;

    vmm_log_shutdown();
    fds = open_fds();

    for (int i = 0; i < N; i++) {
        snprintf(path, sizeof(path), "%s/many-%02d.log", dir, i);
        CHECK(vmm_log_open(&logs[i], path, 1 << 20, false) == 0);
    }
    snprintf(path, sizeof(path), "%s/flood.log", dir);
    CHECK(vmm_log_open(&flood, path, 8192, false) == 0);
    for (int k = 0; k < LINES; k++) {
        for (int i = 0; i < N; i++) {
            int n = snprintf(line, sizeof(line), "log %02d line %04d\n", i, k);
            vmm_log_write(&logs[i], line, (size_t)n);
            if (k == LINES / 2 && i % 2 == 0) {
                snprintf(path, sizeof(path), "%s/many-%02d.log", dir, i);
                vmm_log_close(&logs[i]);
                CHECK(vmm_log_open(&logs[i], path, 1 << 20, true) == 0);
            }
        }
        for (int j = 0; j < 64; j++)
            vmm_log_write(&flood, z, 16384);
    }
    for (int i = 0; i < N; i++) {
        CHECK(vmm_log_sync(&logs[i], &st) == 0 && st.lost == 0);
        vmm_log_close(&logs[i]);
    }
    CHECK(vmm_log_sync(&flood, &st) == 0 && st.size <= 8192);
    printf("flooded log: %llu of %llu bytes dropped from its queue\n", (unsigned long long)st.lost,
           (unsigned long long)LINES * 64 * 16384);
    vmm_log_close(&flood);
    vmm_log_shutdown();
    for (int i = 0; i < N; i++) {
        size_t len, off = 0;
        char *b;
        bool ok = true;
        snprintf(path, sizeof(path), "%s/many-%02d.log", dir, i);
        b = slurp(path, &len);
        for (int k = 0; k < LINES && ok; k++) {
            int n = snprintf(line, sizeof(line), "log %02d line %04d\n", i, k);
            ok = off + (size_t)n <= len && memcmp(b + off, line, (size_t)n) == 0;
            off += (size_t)n;
        }
        CHECK(ok && off == len);
        free(b);
    }
    CHECK(open_fds() == fds);
    free(logs);
    free(z);
}

/* QEMU's exit reason comes from the in-memory tail: no file, no wait. */
static void test_tail(void)
{
    char path[128], buf[VMM_LOG_TAIL + 1], big[2000];
    struct vmm_log l;

    snprintf(path, sizeof(path), "%s/tail.log", dir);
    CHECK(vmm_log_open_named(&l, "qemu", path, 4096, false) == 0);
    CHECK(vmm_log_tail(&l, buf, sizeof(buf)) == 0 && buf[0] == 0);
    vmm_log_write(&l, "first\n", 6);
    vmm_log_write(&l, "qemu: -drive x: Could not open\n", 31);
    CHECK(vmm_log_tail(&l, buf, sizeof(buf)) == 37);
    CHECK(strcmp(buf, "first\nqemu: -drive x: Could not open\n") == 0);
    CHECK(vmm_log_tail(&l, buf, 8) == 7 && strcmp(buf, "t open\n") == 0);
    memset(big, 'b', sizeof(big));
    memcpy(big + sizeof(big) - 4, "end\n", 4);
    vmm_log_write(&l, big, sizeof(big));
    vmm_log_write(&l, "x", 1);
    CHECK(vmm_log_tail(&l, buf, sizeof(buf)) == VMM_LOG_TAIL);
    CHECK(strcmp(buf + VMM_LOG_TAIL - 5, "end\nx") == 0 && buf[0] == 'b');
    vmm_log_close(&l);
    /* Still there after close (finish_exit reads it before teardown anyway). */
    CHECK(vmm_log_tail(&l, buf, sizeof(buf)) == VMM_LOG_TAIL);
    /* Adopting seeds it from the file's end. */
    CHECK(vmm_log_open_named(&l, "qemu", path, 4096, true) == 0);
    CHECK(vmm_log_tail(&l, buf, sizeof(buf)) == VMM_LOG_TAIL);
    CHECK(strcmp(buf + VMM_LOG_TAIL - 5, "end\nx") == 0);
    vmm_log_close(&l);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/wvmm-log-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_compaction();
    test_named();
    test_drop();
    test_close_flushes();
    test_reopen_waits();
    test_many();
    test_tail();
    vmm_log_shutdown();
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("vmm log: all checks passed\n");
    return 0;
}
