/*
 * connect.c - `warren-init --connect SOCK`: a byte pipe between a process's
 * stdio and a Unix stream socket inside the guest.
 *
 * warrend speaks to daemons of the guest (the kernel bridge, docs/KERNELD.md)
 * only through sandbox processes, so every byte keeps the bounds, credits and
 * durability of process output. This builtin is that process: it copies stdin
 * to the socket and the socket to stdout until the socket ends. Reached as
 * /proc/1/exe (the initramfs is gone after switch_root), so it needs nothing
 * from the image.
 *
 * One poll loop, one buffer per direction: a buffer is refilled only once it
 * drained, so a slow reader on either side stops the other side's reads
 * (memory stays at two buffers) and neither direction can block the other.
 * stdin's end half-closes the socket (the peer sees EOF and may still answer);
 * the socket's end, after its last bytes reached stdout, ends the process.
 */
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define CONNECT_BUF (64 * 1024)

static volatile sig_atomic_t stop_sig;

static void on_stop(int sig)
{
    stop_sig = sig;
}

/* One direction: bytes read from `from`, not yet all written to `to`. */
struct leg {
    int from, to;
    char buf[CONNECT_BUF];
    size_t len, off;
    bool eof; /* `from` ended: nothing more will be read */
};

/* Read what is there into an empty buffer: 0, or -errno. */
static int leg_fill(struct leg *l)
{
    ssize_t n = read(l->from, l->buf, sizeof(l->buf));

    if (n > 0) {
        l->len = (size_t)n;
        l->off = 0;
    } else if (n == 0) {
        l->eof = true;
    } else if (errno == ECONNRESET) {
        l->eof = true; /* the peer went: as good as its close */
    } else if (errno != EAGAIN && errno != EINTR) {
        return -errno;
    }
    return 0;
}

/* Write what the buffer holds, as much as `to` takes: 0, or -errno. */
static int leg_drain(struct leg *l)
{
    while (l->off < l->len) {
        ssize_t n = write(l->to, l->buf + l->off, l->len - l->off);
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : -errno;
        l->off += (size_t)n;
    }
    l->len = l->off = 0;
    return 0;
}

static int nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static int fail(const char *path, const char *what, int err)
{
    fprintf(stderr, "warren-init --connect %s: %s: %s\n", path, what, strerror(err));
    return 1;
}

int gi_connect_run(const char *path)
{
    static struct leg up, down; /* 128 KiB: off the stack */
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct sigaction sa_stop = {.sa_handler = on_stop}; /* no SA_RESTART: poll returns */
    int fd, r = 0;
    bool up_shut = false;

    if (strlen(path) >= sizeof(sa.sun_path))
        return fail(path, "socket path", ENAMETOOLONG);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    signal(SIGPIPE, SIG_IGN); /* a closed stdout or socket is an error return, not a kill */
    sigemptyset(&sa_stop.sa_mask);
    sigaction(SIGTERM, &sa_stop, NULL);
    sigaction(SIGHUP, &sa_stop, NULL);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fail(path, "socket", errno);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        r = errno;
        close(fd);
        return fail(path, "connect", r);
    }
    if ((r = nonblock(fd)) || (r = nonblock(0)) || (r = nonblock(1))) {
        close(fd);
        return fail(path, "O_NONBLOCK", -r);
    }
    up = (struct leg){.from = 0, .to = fd};
    down = (struct leg){.from = fd, .to = 1};

    /* Until the socket ended and everything it sent reached stdout. */
    while (!(down.eof && down.len == 0) && !stop_sig) {
        struct pollfd p[3] = {{.fd = -1}, {.fd = -1}, {.fd = -1}};

        if (up.len == 0 && up.eof && !up_shut) {
            shutdown(fd, SHUT_WR);
            up_shut = true;
        }
        /* p[0] stdin, p[1] the socket, p[2] stdout */
        if (up.len == 0 && !up.eof)
            p[0] = (struct pollfd){.fd = 0, .events = POLLIN};
        if (down.len == 0 && !down.eof)
            p[1] = (struct pollfd){.fd = fd, .events = POLLIN};
        if (up.len > 0 && !up_shut) {
            p[1].fd = fd;
            p[1].events |= POLLOUT;
        }
        if (down.len > 0)
            p[2] = (struct pollfd){.fd = 1, .events = POLLOUT};
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            r = fail(path, "poll", errno);
            break;
        }
        /* An error or hang-up is read as such by the read or write it wakes. */
        if (p[0].revents && (r = leg_fill(&up)) != 0) {
            r = fail(path, "stdin", -r);
            break;
        }
        if ((p[1].revents & (POLLIN | POLLHUP | POLLERR)) && down.len == 0 && !down.eof &&
            (r = leg_fill(&down)) != 0) {
            r = fail(path, "read", -r);
            break;
        }
        if ((p[1].revents & (POLLOUT | POLLERR)) && up.len > 0 && (r = leg_drain(&up)) != 0) {
            if (r == -EPIPE || r == -ECONNRESET) {
                /* The peer stopped reading: drop what it refused, keep its answer. */
                up.len = up.off = 0;
                up.eof = up_shut = true;
                r = 0;
                continue;
            }
            r = fail(path, "write", -r);
            break;
        }
        if (p[2].revents && (r = leg_drain(&down)) != 0) {
            r = fail(path, "stdout", -r);
            break;
        }
    }
    close(fd);
    if (stop_sig)
        return 128 + stop_sig;
    return r;
}
