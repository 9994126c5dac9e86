/*
 * hostile.c - a hostile guest for tests/integration/test_hostile.py.
 *
 * Run inside a sandbox as root (uploaded through the files API, started
 * with a streamed exec). It does what any root process in a guest can: it
 * takes PID 1's channel descriptor with pidfd_getfd(pidfd_open(1)), stops
 * PID 1 with ptrace so the agent neither reads nor answers, and then speaks
 * to warrend itself, writing hand-encoded frames chosen by argv[1]:
 *
 *   offsets   OUT on its own exec stream: a partial UTF-8 byte, then data at
 *             a non-contiguous offset (overflowed warrend's NDJSON buffer)
 *   window    OUT far past the credit window while the client reads nothing
 *   exit_sig  EXIT with sig 2^40
 *   bogus_id  OUT for a stream id the host never opened
 *   hello     3 million HELLO{id:0} without reading
 *   fread     answers the next FREAD with size 10, then 64 KiB of DATA
 *   list      answers the next LIST with 4 frames of 200,000 empty entries
 *   mtime     answers the next STAT with mtime INT64_MAX
 *   upload    answers the next FWRITE with CREDIT 2^40, reads nothing for 5 s,
 *             then ends it with ERROR EIO
 *
 * Its own stream id comes from WARREN_EXEC_ID, which the agent sets in every exec.
 * It first sends OUT "READY\n" on that stream (a valid frame), so the test
 * knows the agent is stopped. When done it detaches (PID 1 resumes) and
 * exits. Messages go to stderr, which nobody reads while the agent is stopped.
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "proto.h" /* frame type numbers only */

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

static int ch = -1;

static void die(const char *what)
{
    fprintf(stderr, "hostile: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* ---- msgpack by hand ---- */

struct buf {
    uint8_t *p;
    size_t len, cap;
};

static void put(struct buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        b->cap = (b->len + n) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            die("realloc");
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

static void put8(struct buf *b, uint8_t v)
{
    put(b, &v, 1);
}

static void put_be(struct buf *b, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--)
        put8(b, (uint8_t)(v >> (8 * i)));
}

static void key(struct buf *b, const char *k)
{
    put8(b, (uint8_t)(0xa0 | strlen(k)));
    put(b, k, strlen(k));
}

static void uint_(struct buf *b, const char *k, uint64_t v)
{
    key(b, k);
    put8(b, 0xcf);
    put_be(b, v, 8);
}

static void str_(struct buf *b, const char *k, const char *s)
{
    key(b, k);
    put8(b, 0xdb);
    put_be(b, strlen(s), 4);
    put(b, s, strlen(s));
}

static void bin_(struct buf *b, const char *k, const void *p, size_t n)
{
    key(b, k);
    put8(b, 0xc6);
    put_be(b, n, 4);
    put(b, p, n);
}

/* Start a frame: length placeholder, map of n keys, t and id. */
static size_t frame_begin(struct buf *b, unsigned n, unsigned t, uint32_t id)
{
    size_t at = b->len;

    put_be(b, 0, 4);
    put8(b, 0xdf);
    put_be(b, n, 4);
    uint_(b, "t", t);
    uint_(b, "id", id);
    return at;
}

static void frame_end(struct buf *b, size_t at)
{
    uint32_t n = (uint32_t)(b->len - at - 4);

    b->p[at] = (uint8_t)(n >> 24);
    b->p[at + 1] = (uint8_t)(n >> 16);
    b->p[at + 2] = (uint8_t)(n >> 8);
    b->p[at + 3] = (uint8_t)n;
}

/* ---- the channel ---- */

/* Write all of b (the fd is non-blocking: it is the agent's file). 0, or -1 when the host
 * stopped taking bytes for 10 s or the channel broke. */
static int send_all(struct buf *b)
{
    size_t off = 0;

    while (off < b->len) {
        ssize_t n = write(ch, b->p + off, b->len - off);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        struct pollfd pfd = {.fd = ch, .events = POLLOUT};
        if (poll(&pfd, 1, 10000) <= 0 || (pfd.revents & (POLLHUP | POLLERR)))
            return -1;
    }
    b->len = 0;
    return 0;
}

static uint64_t rd_uint(const uint8_t *p, size_t n, size_t *i)
{
    uint8_t c;
    uint64_t v = 0;
    int bytes = 0;

    if (*i >= n)
        return UINT64_MAX;
    c = p[(*i)++];
    if (c < 0x80)
        return c;
    bytes = c == 0xcc ? 1 : c == 0xcd ? 2 : c == 0xce ? 4 : c == 0xcf ? 8 : 0;
    if (!bytes || *i + (size_t)bytes > n)
        return UINT64_MAX;
    while (bytes--)
        v = v << 8 | p[(*i)++];
    return v;
}

/* Read host frames until one of type want arrives; its id. The host writes t and id first.
 * want 0: drop whole frames until none came for timeout_ms and no partial one is left, so
 * the agent, when it resumes, reads from a frame boundary. */
static uint32_t wait_for(unsigned want, int timeout_ms)
{
    static uint8_t rx[1 << 20];
    static size_t have;
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        while (have >= 4) {
            size_t len = (size_t)rx[0] << 24 | rx[1] << 16 | rx[2] << 8 | rx[3];
            if (len > sizeof(rx) - 4) {
                fprintf(stderr, "hostile: host frame of %zu bytes\n", len);
                exit(2);
            }
            if (have < 4 + len)
                break;
            const uint8_t *p = rx + 4;
            size_t i = 1; /* after the map header (a fixmap from the host) */
            uint64_t type = 0, id = 0;
            if (len > 3 && p[i] == 0xa1 && p[i + 1] == 't') {
                i += 2;
                type = rd_uint(p, len, &i);
                if (i + 3 <= len && p[i] == 0xa2 && p[i + 1] == 'i' && p[i + 2] == 'd') {
                    i += 3;
                    id = rd_uint(p, len, &i);
                }
            }
            memmove(rx, rx + 4 + len, have - 4 - len);
            have -= 4 + len;
            if (type == want)
                return (uint32_t)id;
        }
        struct pollfd pfd = {.fd = ch, .events = POLLIN};
        clock_gettime(CLOCK_MONOTONIC, &t);
        int left =
            timeout_ms - (int)((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (want == 0) {
            if (poll(&pfd, 1, timeout_ms) <= 0) {
                if (have == 0)
                    return 0;
                continue;
            }
        } else if (left <= 0 || poll(&pfd, 1, left) <= 0) {
            fprintf(stderr, "hostile: no frame of type %u came\n", want);
            exit(3);
        }
        ssize_t n = read(ch, rx + have, sizeof(rx) - have);
        if (n <= 0 && errno != EAGAIN && errno != EINTR)
            die("read channel");
        if (n > 0)
            have += (size_t)n;
    }
}

/* ---- taking over ---- */

static uint32_t own_stream(void)
{
    const char *v = getenv("WARREN_EXEC_ID");
    char *end;
    unsigned long id = v ? strtoul(v, &end, 10) : 0;

    if (!v || !*v || *end || id == 0 || id > UINT32_MAX) {
        fprintf(stderr, "hostile: no WARREN_EXEC_ID\n");
        exit(2);
    }
    return (uint32_t)id;
}

static int agent_fd(void)
{
    DIR *d = opendir("/proc/1/fd");
    struct dirent *e;
    char path[300], target[PATH_MAX];
    int fd = -1;

    if (!d)
        die("/proc/1/fd");
    while ((e = readdir(d))) {
        ssize_t n;
        snprintf(path, sizeof(path), "/proc/1/fd/%s", e->d_name);
        n = readlink(path, target, sizeof(target) - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (!strncmp(target, "/dev/vport", 10))
            fd = atoi(e->d_name);
    }
    closedir(d);
    if (fd < 0) {
        fprintf(stderr, "hostile: PID 1 has no /dev/vport* open\n");
        exit(2);
    }
    return fd;
}

static void take_over(void)
{
    int target = agent_fd(), pidfd, st;

    pidfd = (int)syscall(SYS_pidfd_open, 1, 0);
    if (pidfd < 0)
        die("pidfd_open");
    ch = (int)syscall(SYS_pidfd_getfd, pidfd, target, 0);
    if (ch < 0)
        die("pidfd_getfd");
    if (ptrace(PTRACE_SEIZE, 1, 0, 0) != 0)
        die("PTRACE_SEIZE");
    if (ptrace(PTRACE_INTERRUPT, 1, 0, 0) != 0)
        die("PTRACE_INTERRUPT");
    if (waitpid(1, &st, __WALL) != 1)
        die("waitpid 1");
}

static void out(struct buf *b, uint32_t id, uint64_t fd, uint64_t off, const void *p, size_t n)
{
    size_t at = frame_begin(b, 5, PROTO_OUT, id);

    uint_(b, "fd", fd);
    uint_(b, "off", off);
    bin_(b, "data", p, n);
    frame_end(b, at);
}

int main(int argc, char **argv)
{
    static uint8_t chunk[65536];
    const char *c = argc > 1 ? argv[1] : "";
    struct buf b = {0};
    uint32_t me = own_stream(), id;
    size_t at;

    take_over();
    out(&b, me, 1, 0, "READY\n", 6);
    if (send_all(&b))
        die("send READY");

    if (!strcmp(c, "offsets")) {
        /* A lead byte held back by the encoder, then a gap: two lines in one budget. */
        memset(chunk, 0x01, 4000);
        out(&b, me, 1, 6, "\xe2", 1);
        out(&b, me, 1, 20, chunk, 4000);
    } else if (!strcmp(c, "window")) {
        /* 64 MiB of output against a 1 MiB window, to a client that reads nothing. */
        memset(chunk, 'A', sizeof(chunk));
        for (uint64_t k = 0; k < 1024; k++) {
            out(&b, me, 1, 6 + k * sizeof(chunk), chunk, sizeof(chunk));
            if (send_all(&b))
                break; /* the host closed the channel */
        }
    } else if (!strcmp(c, "exit_sig")) {
        at = frame_begin(&b, 4, PROTO_EXIT, me);
        uint_(&b, "code", 0);
        uint_(&b, "sig", 1ull << 40);
        frame_end(&b, at);
    } else if (!strcmp(c, "bogus_id")) {
        out(&b, 0xfffffff0u, 1, 0, "boo", 3);
    } else if (!strcmp(c, "hello")) {
        /* 12 bytes each, as compact as the agent's own: {t:1, id:0}. */
        static const uint8_t hello[12] = {0,   0,           0,    8,   0x82, 0xa1,
                                          't', PROTO_HELLO, 0xa2, 'i', 'd',  0};
        for (int k = 0; k < 3000000; k++) {
            put(&b, hello, sizeof(hello));
            if (b.len >= (1 << 20) && send_all(&b))
                break;
        }
    } else if (!strcmp(c, "fread")) {
        id = wait_for(PROTO_FREAD, 60000);
        at = frame_begin(&b, 5, PROTO_RESULT, id);
        uint_(&b, "size", 10);
        uint_(&b, "mode", 0644);
        uint_(&b, "mtime", 0);
        frame_end(&b, at);
        memset(chunk, 'B', sizeof(chunk));
        at = frame_begin(&b, 4, PROTO_DATA, id);
        uint_(&b, "off", 0);
        bin_(&b, "data", chunk, sizeof(chunk));
        frame_end(&b, at);
    } else if (!strcmp(c, "list")) {
        /* An empty map is one byte on the wire and a JSON object in warrend. */
        id = wait_for(PROTO_LIST, 60000);
        for (int k = 0; k < 4; k++) {
            at = frame_begin(&b, 4, PROTO_RESULT, id);
            key(&b, "entries");
            put8(&b, 0xdd);
            put_be(&b, 200000, 4);
            for (int j = 0; j < 200000; j++)
                put8(&b, 0x80);
            key(&b, "eof");
            put8(&b, k == 3 ? 0xc3 : 0xc2);
            frame_end(&b, at);
            if (send_all(&b))
                break;
        }
    } else if (!strcmp(c, "upload")) {
        /* Credit for a terabyte the host never sent, then read nothing for a while: the
         * host must keep at most a window in flight, whatever the guest grants. */
        id = wait_for(PROTO_FWRITE, 60000);
        at = frame_begin(&b, 3, PROTO_CREDIT, id);
        uint_(&b, "n", 1ull << 40);
        frame_end(&b, at);
        if (send_all(&b))
            die("send CREDIT");
        sleep(5);
        at = frame_begin(&b, 4, PROTO_ERROR, id);
        uint_(&b, "code", EIO);
        str_(&b, "msg", "hostile: upload refused");
        frame_end(&b, at);
        if (send_all(&b))
            die("send ERROR");
        /* The DATA the host sent meanwhile: the agent must not resume inside a frame. */
        wait_for(0, 1000);
    } else if (!strcmp(c, "mtime")) {
        id = wait_for(PROTO_STAT, 60000);
        at = frame_begin(&b, 8, PROTO_RESULT, id);
        str_(&b, "name", "x");
        str_(&b, "path", "/x");
        str_(&b, "type", "file");
        uint_(&b, "size", 1);
        uint_(&b, "mode", 0644);
        uint_(&b, "mtime", INT64_MAX);
        frame_end(&b, at);
    } else {
        fprintf(stderr, "hostile: unknown case '%s'\n", c);
    }
    if (b.len)
        send_all(&b);
    /* Let PID 1 go on: the host's next INIT (after its backoff) reaches the agent. */
    ptrace(PTRACE_DETACH, 1, 0, 0);
    return 0;
}
