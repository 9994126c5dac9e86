/*
 * test_connect.c - `warren-init --connect` (guest-init/connect.c) on the host:
 * a real Unix socket served by a forked peer, the connector in a child with
 * its stdio on pipes, driven like the agent drives a process.
 */
#include "agent.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

int failures;

static char dir[] = "/tmp/gi-connect-XXXXXX";
static char sock_path[64];

/* What the peer does with its one connection. */
enum peer {
    PEER_AFTER_EOF, /* read to EOF, then send it all back and close (a request, an answer) */
    PEER_ECHO,      /* send back each piece as it comes, close at EOF */
    PEER_HELLO_WAIT /* say "hi\n", then wait for the connector to go */
};

struct run {
    char *out, *err;
    size_t nout, nerr;
    int status;
};

static void peer_serve(int lfd, enum peer how)
{
    static char buf[65536];
    char *all = NULL;
    size_t nall = 0;
    int c = accept(lfd, NULL, NULL);
    ssize_t n;

    if (c < 0)
        _exit(2);
    if (how == PEER_HELLO_WAIT) {
        if (write(c, "hi\n", 3) != 3)
            _exit(2);
        while (read(c, buf, sizeof(buf)) > 0)
            ;
        _exit(0);
    }
    while ((n = read(c, buf, sizeof(buf))) > 0) {
        if (how == PEER_ECHO) {
            for (ssize_t o = 0; o < n;) {
                ssize_t w = write(c, buf + o, (size_t)(n - o));
                if (w <= 0)
                    _exit(2);
                o += w;
            }
            continue;
        }
        all = realloc(all, nall + (size_t)n);
        if (!all)
            _exit(2);
        memcpy(all + nall, buf, (size_t)n);
        nall += (size_t)n;
    }
    for (size_t o = 0; o < nall;) {
        ssize_t w = write(c, all + o, nall - o);
        if (w <= 0)
            _exit(2);
        o += (size_t)w;
    }
    _exit(0);
}

static void append(char **b, size_t *n, const char *p, size_t len)
{
    *b = realloc(*b, *n + len + 1);
    if (!*b)
        abort();
    memcpy(*b + *n, p, len);
    *n += len;
    (*b)[*n] = 0;
}

/*
 * Serve one connection at sock_path as `how` (listen = false: nothing listens),
 * run the connector on `in`, gather its stdout and stderr, and its wait status.
 * term_after_hello: send SIGTERM once "hi\n" came out.
 */
static void run_connector(bool listen_, enum peer how, const char *in, size_t nin,
                          bool term_after_hello, struct run *r)
{
    int pin[2], pout[2], perr[2], lfd = -1;
    pid_t peer = -1, conn;
    size_t off = 0;
    bool in_open = true, out_open = true, err_open = true, termed = false;

    memset(r, 0, sizeof(*r));
    unlink(sock_path);
    if (listen_) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock_path);
        lfd = socket(AF_UNIX, SOCK_STREAM, 0);
        CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
              listen(lfd, 1) == 0);
        peer = fork();
        if (peer == 0)
            peer_serve(lfd, how);
        close(lfd);
    }
    CHECK(pipe(pin) == 0 && pipe(pout) == 0 && pipe(perr) == 0);
    conn = fork();
    if (conn == 0) {
        dup2(pin[0], 0);
        dup2(pout[1], 1);
        dup2(perr[1], 2);
        for (int fd = 3; fd < 64; fd++)
            close(fd);
        _exit(gi_connect_run(sock_path));
    }
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    fcntl(pin[1], F_SETFL, O_NONBLOCK);
    if (nin == 0) {
        close(pin[1]);
        in_open = false;
    }
    while (out_open || err_open) {
        struct pollfd p[3] = {{.fd = in_open ? pin[1] : -1, .events = POLLOUT},
                              {.fd = out_open ? pout[0] : -1, .events = POLLIN},
                              {.fd = err_open ? perr[0] : -1, .events = POLLIN}};
        char buf[65536];
        ssize_t n;

        if (poll(p, 3, 20000) <= 0) {
            CHECK(!"the connector went silent");
            kill(conn, SIGKILL);
            break;
        }
        if (in_open && p[0].revents) {
            n = write(pin[1], in + off, nin - off);
            if (n > 0)
                off += (size_t)n;
            if (n < 0 || off == nin) {
                close(pin[1]);
                in_open = false;
            }
        }
        if (out_open && p[1].revents) {
            n = read(pout[0], buf, sizeof(buf));
            if (n > 0)
                append(&r->out, &r->nout, buf, (size_t)n);
            else
                out_open = false;
            if (term_after_hello && !termed && r->nout >= 3) {
                kill(conn, SIGTERM);
                termed = true;
            }
        }
        if (err_open && p[2].revents) {
            n = read(perr[0], buf, sizeof(buf));
            if (n > 0)
                append(&r->err, &r->nerr, buf, (size_t)n);
            else
                err_open = false;
        }
    }
    if (in_open)
        close(pin[1]);
    close(pout[0]);
    close(perr[0]);
    CHECK(waitpid(conn, &r->status, 0) == conn);
    if (peer > 0) {
        int st;
        CHECK(waitpid(peer, &st, 0) == peer && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
}

static void run_free(struct run *r)
{
    free(r->out);
    free(r->err);
}

static char *pattern(size_t n)
{
    char *b = malloc(n);
    for (size_t i = 0; i < n; i++)
        b[i] = (char)('a' + (i * 7 + i / 4096) % 26);
    return b;
}

int main(void)
{
    struct run r;
    size_t big = 3 * 1024 * 1024 + 17; /* many times the connector's buffers and a pipe */
    char *data = pattern(big);

    signal(SIGPIPE, SIG_IGN);
    CHECK(mkdtemp(dir) != NULL);
    snprintf(sock_path, sizeof(sock_path), "%s/s", dir);

    /* A request, then the answer after the half-close: the connector must shut its
     * write side at stdin's EOF and keep reading. */
    run_connector(true, PEER_AFTER_EOF, "{\"op\":\"status\"}\n", 16, false, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    CHECK(r.nout == 16 && memcmp(r.out, "{\"op\":\"status\"}\n", 16) == 0);
    CHECK(r.nerr == 0);
    run_free(&r);

    /* Megabytes after EOF: every byte, in order. */
    run_connector(true, PEER_AFTER_EOF, data, big, false, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    CHECK(r.nout == big && r.out && memcmp(r.out, data, big) == 0);
    run_free(&r);

    /* Both ways at once (the peer answers while the request still flows): no deadlock. */
    run_connector(true, PEER_ECHO, data, big, false, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0);
    CHECK(r.nout == big && r.out && memcmp(r.out, data, big) == 0);
    run_free(&r);

    /* Empty stdin: the half-close comes first, the answer still arrives (empty here). */
    run_connector(true, PEER_AFTER_EOF, "", 0, false, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0 && r.nout == 0);
    run_free(&r);

    /* Nothing listens: a non-zero status and a message naming the socket. */
    run_connector(false, PEER_ECHO, "x\n", 2, false, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0);
    CHECK(r.nout == 0);
    CHECK(r.err && strstr(r.err, sock_path) && strstr(r.err, "connect"));
    run_free(&r);

    /* SIGTERM while connected with stdin open: it closes and exits (128 + 15), and the
     * peer sees the close (its wait for EOF ends, checked in run_connector). */
    run_connector(true, PEER_HELLO_WAIT, data, big, true, &r);
    CHECK(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 128 + SIGTERM);
    CHECK(r.nout >= 3 && memcmp(r.out, "hi\n", 3) == 0);
    run_free(&r);

    unlink(sock_path);
    rmdir(dir);
    free(data);
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
