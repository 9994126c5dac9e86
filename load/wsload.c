/*
 * wsload.c - load generator for warrend's two WebSocket protocols
 * (warren.pty.v1 and warren.session.v1, docs/API.md), driven by load/wsbench.py.
 *
 *   wsload idle   -p PORT -k KEY -s SID,SID.. -n N [-j WORKERS]
 *   wsload echo   -p PORT -k KEY -s SID,SID.. -n IDLE -r ROUNDS [-y SID -Y CMD -t SECS -R BPS]
 *                 [-w SECS: from the PTYs' hello to the first key, default 2]
 *                 [-i MS: a typist's pace: each PTY's next key 0.5-1.5 x MS after its last
 *                  (and after that key's echo); pingers one per 10 ms. 0: back to back]
 *   wsload tput   -p PORT -k KEY -s SID,SID.. -b BYTES [-x]
 *   wsload exec   -p PORT -k KEY -s SID -r N
 *
 * One thread and one epoll loop per process; the WebSocket client (RFC 6455,
 * client side only: handshake, masked frames out, unmasked frames in, ping
 * answered by pong) is written here so that a socket costs the generator
 * only its fd and a small struct. `idle` forks WORKERS processes because the
 * open-file limit (20,000 here) is per process and warrend needs its own.
 * idle: N agent sockets over the sandboxes, held until stdin closes. echo: IDLE
 * idle agent sockets, one `cat` PTY per sandbox typed at (a key in flight per PTY,
 * every echoed byte checked), and one agent socket per sandbox alternating a
 * WebSocket ping and a request warrend answers itself; -y makes sandbox SID's
 * PTY a producer instead (`yes`, or -Y CMD URL-encoded) read at BPS bytes/s
 * (0: as fast as it comes) for SECS. tput: `head -c BYTES /dev/zero` in each
 * sandbox at once, through a PTY or (-x) a plain exec on the agent socket.
 * exec: `true` over the agent socket and over REST, N each, interleaved.
 * Results are lines "RESULT name value..." on stdout for the script; the
 * figures are the script's business, this file only measures and checks.
 *
 * The Sec-WebSocket-Accept answer is not verified (no SHA-1 here): this is a
 * load generator against our own server, not a client for the wild.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SIDS 64

enum kind { K_SESS, K_PTY };
enum state { S_CONNECTING, S_HANDSHAKE, S_OPEN, S_CLOSED };

struct conn {
    int fd;
    enum kind kind;
    enum state st;
    int sbx;           /* index into the sandbox list */
    unsigned char *in; /* bytes read, not yet parsed (handshake or frames) */
    size_t inlen, incap;
    unsigned char *out; /* bytes not yet written */
    size_t outlen, outcap;
    unsigned char *msg; /* a fragmented message being joined */
    size_t msglen, msgcap;
    int msgop;
    /* role-specific */
    int role;         /* R_* below */
    uint64_t got;     /* PTY output payload bytes received */
    uint64_t unacked; /* ... not yet acknowledged */
    double t_open, t_first, t_end, t_sent, t_next;
    bool exited, pending, failed;
    bool untimed;          /* echo: the key in flight is a newline (not timed) */
    unsigned char *expect; /* echo: bytes the PTY must still show, in order */
    size_t explen, expcap;
    char line[64]; /* echo: the letters typed since the last newline */
    size_t linelen;
    unsigned keys;
    uint32_t next_id;
    long rate; /* slow reader: bytes per second it reads, 0 = all */
    double read_budget, t_budget;
};

enum role { R_IDLE, R_ECHO, R_PING, R_YES, R_TPUT, R_EXEC };

static int ep;
static int port;
static const char *key;
static char *sids[MAX_SIDS];
static int nsids;
static volatile sig_atomic_t stop_flag;
static long errors;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    fprintf(stderr, "wsload: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

static void grow(unsigned char **b, size_t *cap, size_t need)
{
    if (need <= *cap)
        return;
    size_t n = *cap ? *cap : 256;
    while (n < need)
        n *= 2;
    if (!(*b = realloc(*b, n)))
        die("out of memory");
    *cap = n;
}

static void ep_mod(struct conn *c)
{
    struct epoll_event ev = {
        .events = EPOLLIN | (c->outlen || c->st == S_CONNECTING ? EPOLLOUT : 0), .data.ptr = c};

    if (c->rate && c->st == S_OPEN && c->read_budget <= 0)
        ev.events &= ~EPOLLIN;
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void conn_close(struct conn *c)
{
    if (c->st == S_CLOSED)
        return;
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->st = S_CLOSED;
    free(c->in);
    free(c->msg);
    c->in = c->msg = NULL;
    c->inlen = c->incap = c->msglen = c->msgcap = 0;
}

static void flush(struct conn *c)
{
    while (c->outlen) {
        ssize_t n = send(c->fd, c->out, c->outlen, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN)
                break;
            c->failed = true;
            conn_close(c);
            return;
        }
        memmove(c->out, c->out + n, c->outlen - (size_t)n);
        c->outlen -= (size_t)n;
    }
    if (!c->outlen && c->outcap > 4096) {
        free(c->out);
        c->out = NULL;
        c->outcap = 0;
    }
    ep_mod(c);
}

static void queue(struct conn *c, const void *p, size_t n)
{
    grow(&c->out, &c->outcap, c->outlen + n);
    memcpy(c->out + c->outlen, p, n);
    c->outlen += n;
}

/* One masked frame (clients must mask; the key's value does not matter here). */
static void ws_send(struct conn *c, int op, const void *p, size_t n)
{
    unsigned char h[14] = {(unsigned char)(0x80 | op)}, m[4] = {0x12, 0x34, 0x56, 0x78};
    size_t hl;

    if (c->st != S_OPEN)
        return;
    if (n < 126) {
        h[1] = 0x80 | (unsigned char)n;
        hl = 2;
    } else if (n < 65536) {
        h[1] = 0x80 | 126;
        h[2] = (unsigned char)(n >> 8);
        h[3] = (unsigned char)n;
        hl = 4;
    } else {
        h[1] = 0x80 | 127;
        for (int i = 0; i < 8; i++)
            h[2 + i] = (unsigned char)((uint64_t)n >> (56 - 8 * i));
        hl = 10;
    }
    memcpy(h + hl, m, 4);
    queue(c, h, hl + 4);
    grow(&c->out, &c->outcap, c->outlen + n);
    for (size_t i = 0; i < n; i++)
        c->out[c->outlen + i] = ((const unsigned char *)p)[i] ^ m[i & 3];
    c->outlen += n;
    flush(c);
}

static int tcp_connect(bool nonblock)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblock ? SOCK_NONBLOCK : 0), 0),
        one = 1;

    if (fd < 0)
        die("socket: %s", strerror(errno));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) && errno != EINPROGRESS)
        die("connect: %s", strerror(errno));
    return fd;
}

/* Start a WebSocket: the handshake is queued until the TCP connect completes. */
static struct conn *ws_open(enum kind kind, int sbx, const char *query, int role)
{
    struct conn *c = calloc(1, sizeof(*c));
    struct epoll_event ev = {.events = EPOLLOUT | EPOLLIN};
    char req[1024];
    int n;

    if (!c)
        die("out of memory");
    c->kind = kind;
    c->sbx = sbx;
    c->role = role;
    c->fd = tcp_connect(true);
    c->t_open = now();
    n = snprintf(req, sizeof(req),
                 "GET /v1/sandboxes/%s/%s%s%s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                 "Sec-WebSocket-Key: d2FycmVuLWxvYWQtZ2VuIQ==\r\nSec-WebSocket-Version: 13\r\n"
                 "Sec-WebSocket-Protocol: %s\r\nAuthorization: Bearer %s\r\n\r\n",
                 sids[sbx], kind == K_PTY ? "pty" : "session", query ? "?" : "", query ? query : "",
                 kind == K_PTY ? "warren.pty.v1" : "warren.session.v1", key);
    queue(c, req, (size_t)n);
    ev.data.ptr = c;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev))
        die("epoll_ctl: %s", strerror(errno));
    return c;
}

/* ---- session (msgpack) requests ---- */

static void sess_send(struct conn *c, uint32_t id, const char *op, const char *k1, const char *v1,
                      const char *k2, long v2)
{
    msgpack_sbuffer sb;
    msgpack_packer pk;
    int n = 2 + (k1 != NULL) + (k2 != NULL);

    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    msgpack_pack_str_with_body(&pk, "id", 2);
    msgpack_pack_uint32(&pk, id);
    msgpack_pack_str_with_body(&pk, "op", 2);
    msgpack_pack_str_with_body(&pk, op, strlen(op));
    if (k1) {
        msgpack_pack_str_with_body(&pk, k1, strlen(k1));
        msgpack_pack_str_with_body(&pk, v1, strlen(v1));
    }
    if (k2) {
        msgpack_pack_str_with_body(&pk, k2, strlen(k2));
        msgpack_pack_int64(&pk, v2);
    }
    ws_send(c, 2, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
}

struct answer {
    uint32_t id;
    char type[16];
    size_t datalen;
    long exit_code;
    bool has_exit;
};

static bool sess_decode(const unsigned char *p, size_t n, struct answer *a)
{
    msgpack_unpacked u;
    bool ok = false;

    memset(a, 0, sizeof(*a));
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, (const char *)p, n, NULL) == MSGPACK_UNPACK_SUCCESS &&
        u.data.type == MSGPACK_OBJECT_MAP) {
        msgpack_object_map *m = &u.data.via.map;
        for (uint32_t i = 0; i < m->size; i++) {
            msgpack_object *k = &m->ptr[i].key, *v = &m->ptr[i].val;
            if (k->type != MSGPACK_OBJECT_STR)
                continue;
            if (k->via.str.size == 2 && !memcmp(k->via.str.ptr, "id", 2) &&
                v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
                a->id = (uint32_t)v->via.u64;
            else if (k->via.str.size == 4 && !memcmp(k->via.str.ptr, "type", 4) &&
                     v->type == MSGPACK_OBJECT_STR)
                snprintf(a->type, sizeof(a->type), "%.*s", (int)v->via.str.size, v->via.str.ptr);
            else if (k->via.str.size == 4 && !memcmp(k->via.str.ptr, "data", 4))
                a->datalen = v->type == MSGPACK_OBJECT_BIN ? v->via.bin.size : v->via.str.size;
            else if (k->via.str.size == 9 && !memcmp(k->via.str.ptr, "exit_code", 9)) {
                a->has_exit = true;
                a->exit_code = v->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (long)v->via.u64 : -1;
            }
        }
        ok = true;
    }
    msgpack_unpacked_destroy(&u);
    return ok;
}

/* ---- samples ---- */

struct samples {
    double *v;
    size_t n, cap;
};

static void sample(struct samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        if (!(s->v = realloc(s->v, s->cap * sizeof(double))))
            die("out of memory");
    }
    s->v[s->n++] = x;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(struct samples *s, double p)
{
    size_t i;

    if (!s->n)
        return -1;
    qsort(s->v, s->n, sizeof(double), cmp_d);
    i = (size_t)(p / 100.0 * (double)(s->n - 1) + 0.5);
    return s->v[i < s->n ? i : s->n - 1];
}

static void report(const char *name, struct samples *s)
{
    printf("RESULT %s n=%zu p50_us=%.1f p99_us=%.1f max_us=%.1f\n", name, s->n, pct(s, 50) * 1e6,
           pct(s, 99) * 1e6, s->n ? s->v[s->n - 1] * 1e6 : -1);
    fflush(stdout);
}

static struct samples s_echo, s_ping, s_err, s_exec_ws, s_exec_rest;

/* ---- per-message handling ---- */

static void echo_key(struct conn *c);

static void on_pty_output(struct conn *c, const unsigned char *p, size_t n)
{
    unsigned char ack[5] = {0x02};

    if (!c->t_first)
        c->t_first = now();
    c->got += n;
    c->unacked += n;
    if (c->role == R_ECHO) {
        for (size_t i = 0; i < n; i++) {
            if (!c->explen || c->expect[0] != p[i]) {
                errors++;
                fprintf(stderr, "wsload: echo mismatch on sandbox %d: got 0x%02x\n", c->sbx, p[i]);
                continue;
            }
            memmove(c->expect, c->expect + 1, --c->explen);
        }
        if (c->pending && !c->explen) {
            c->pending = false;
            if (!c->untimed)
                sample(&s_echo, now() - c->t_sent);
        }
    }
    /* Acknowledge what was "shown": at once, except the slow reader, whose rate is
     * set by how fast it reads the socket. */
    if (c->unacked >= (c->role == R_ECHO ? 1 : 16384) || c->role == R_YES) {
        ack[1] = (unsigned char)(c->unacked >> 24);
        ack[2] = (unsigned char)(c->unacked >> 16);
        ack[3] = (unsigned char)(c->unacked >> 8);
        ack[4] = (unsigned char)c->unacked;
        c->unacked = 0;
        ws_send(c, 2, ack, 5);
    }
}

static void on_message(struct conn *c, int op, const unsigned char *p, size_t n)
{
    struct answer a;

    if (op == 0xA) { /* pong */
        if (c->role == R_PING && c->pending) {
            sample(&s_ping, now() - c->t_sent);
            c->pending = false;
        }
        return;
    }
    if (c->kind == K_PTY) {
        if (n >= 9 && p[0] == 0x10) {
            on_pty_output(c, p + 9, n - 9);
        } else if (n >= 1 && p[0] == 0x11) {
            if (memmem(p + 1, n - 1, "\"exit\"", 6)) {
                c->exited = true;
                c->t_end = now();
            } else if (memmem(p + 1, n - 1, "\"error\"", 7) ||
                       memmem(p + 1, n - 1, "\"lost\"", 6)) {
                fprintf(stderr, "wsload: pty control: %.*s\n", (int)n - 1, p + 1);
                if (memmem(p + 1, n - 1, "\"error\"", 7))
                    c->failed = true;
            }
        }
        return;
    }
    if (!sess_decode(p, n, &a)) {
        errors++;
        return;
    }
    if (c->role == R_PING && c->pending && !strcmp(a.type, "error")) {
        sample(&s_err, now() - c->t_sent);
        c->pending = false;
    } else if (c->role == R_TPUT || c->role == R_EXEC) {
        if (!strcmp(a.type, "stdout") || !strcmp(a.type, "stderr")) {
            if (!c->t_first)
                c->t_first = now();
            c->got += a.datalen;
        } else if (!strcmp(a.type, "exit")) {
            c->exited = true;
            c->t_end = now();
            if (!a.has_exit || a.exit_code != 0)
                errors++;
        } else if (!strcmp(a.type, "error")) {
            fprintf(stderr, "wsload: session error answer\n");
            c->exited = c->failed = true;
            c->t_end = now();
        }
    }
}

/* Parse whatever frames are complete in c->in. */
static void parse(struct conn *c)
{
    size_t off = 0;

    if (c->st == S_HANDSHAKE) {
        unsigned char *e = memmem(c->in, c->inlen, "\r\n\r\n", 4);
        if (!e)
            return;
        if (c->inlen < 12 || memcmp(c->in, "HTTP/1.1 101", 12)) {
            fprintf(stderr, "wsload: upgrade refused: %.*s\n",
                    (int)(c->inlen < 300 ? c->inlen : 300), c->in);
            c->failed = true;
            conn_close(c);
            return;
        }
        c->st = S_OPEN;
        off = (size_t)(e + 4 - c->in);
    }
    while (c->st == S_OPEN && c->inlen - off >= 2) {
        unsigned char *h = c->in + off;
        size_t avail = c->inlen - off, hl = 2;
        uint64_t len = h[1] & 0x7f;
        int op = h[0] & 0x0f;
        bool fin = h[0] & 0x80;

        if (len == 126) {
            if (avail < 4)
                break;
            len = (uint64_t)h[2] << 8 | h[3];
            hl = 4;
        } else if (len == 127) {
            if (avail < 10)
                break;
            len = 0;
            for (int i = 0; i < 8; i++)
                len = len << 8 | h[2 + i];
            hl = 10;
        }
        if (avail < hl + len)
            break;
        off += hl + len;
        if (op == 0x9) { /* ping: answer at once */
            ws_send(c, 0xA, h + hl, (size_t)len);
        } else if (op == 0x8) {
            c->t_end = c->t_end ? c->t_end : now();
            if (c->role != R_TPUT || !c->exited)
                c->failed = !c->exited;
            conn_close(c);
            return;
        } else if (op == 0xA) {
            on_message(c, op, h + hl, (size_t)len);
        } else if (fin && op != 0 && !c->msglen) {
            on_message(c, op, h + hl, (size_t)len);
        } else {
            if (op)
                c->msgop = op;
            grow(&c->msg, &c->msgcap, c->msglen + len);
            memcpy(c->msg + c->msglen, h + hl, len);
            c->msglen += len;
            if (fin) {
                on_message(c, c->msgop, c->msg, c->msglen);
                c->msglen = 0;
            }
        }
    }
    if (c->st == S_CLOSED)
        return;
    memmove(c->in, c->in + off, c->inlen - off);
    c->inlen -= off;
    if (!c->inlen && c->incap > 65536) {
        free(c->in);
        c->in = NULL;
        c->incap = 0;
    }
}

static void on_event(struct conn *c, uint32_t ev)
{
    if (c->st == S_CLOSED)
        return;
    if (c->st == S_CONNECTING && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t l = sizeof(err);
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &l);
        if (err) {
            fprintf(stderr, "wsload: connect: %s\n", strerror(err));
            c->failed = true;
            conn_close(c);
            return;
        }
        c->st = S_HANDSHAKE;
    }
    if (ev & EPOLLOUT)
        flush(c);
    if (c->st == S_CLOSED || !(ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    for (;;) {
        size_t want = 65536;
        ssize_t n;

        if (c->rate && c->st == S_OPEN) {
            if (c->read_budget <= 0) {
                ep_mod(c);
                return;
            }
            want = c->read_budget < 4096 ? 4096 : (size_t)c->read_budget;
        }
        grow(&c->in, &c->incap, c->inlen + want);
        n = recv(c->fd, c->in + c->inlen, want, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            if (!c->exited)
                c->failed = true;
            c->t_end = c->t_end ? c->t_end : now();
            conn_close(c);
            return;
        }
        if (n < 0)
            break;
        c->inlen += (size_t)n;
        if (c->rate)
            c->read_budget -= (double)n;
        parse(c);
        if (c->st == S_CLOSED)
            return;
    }
    if (!c->inlen && c->incap) {
        free(c->in);
        c->in = NULL;
        c->incap = 0;
    }
}

static void poll_once(int ms)
{
    struct epoll_event evs[256];
    int n = epoll_wait(ep, evs, 256, ms);

    for (int i = 0; i < n; i++)
        on_event(evs[i].data.ptr, evs[i].events);
}

/* ---- idle: open many session sockets and hold them ---- */

static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void idle_worker(int first, int count, int wfd)
{
    struct conn **cs = calloc((size_t)count, sizeof(*cs));
    int opened = 0, failed = 0, next = 0, inflight = 0;
    char line[128];

    ep = epoll_create1(EPOLL_CLOEXEC);
    while (!stop_flag && opened + failed < count) {
        /* 32 handshakes in flight per worker: with 128 (512 over 4 workers), 517 of
         * 19,000 were closed unanswered before their upgrade on a loaded machine. */
        while (next < count && inflight < 32) {
            cs[next] = ws_open(K_SESS, (first + next) % nsids, NULL, R_IDLE);
            next++;
            inflight++;
        }
        poll_once(100);
        opened = failed = inflight = 0;
        for (int i = 0; i < next; i++) {
            if (cs[i]->st == S_OPEN)
                opened++;
            else if (cs[i]->st == S_CLOSED)
                failed++;
            else
                inflight++;
        }
    }
    snprintf(line, sizeof(line), "open %d %d\n", opened, failed);
    if (write(wfd, line, strlen(line)) < 0)
        exit(1);
    while (!stop_flag)
        poll_once(500);
    opened = 0;
    for (int i = 0; i < next; i++)
        opened += cs[i]->st == S_OPEN;
    snprintf(line, sizeof(line), "held %d\n", opened);
    if (write(wfd, line, strlen(line)) < 0)
        exit(1);
    exit(0);
}

/* Prints "RESULT idle_open opened=N failed=M secs=S" once all are open, then holds them
 * until stdin closes; then "RESULT idle_held held=N" (sockets still open at the end). */
static int run_idle(int n, int workers)
{
    int pfd[2], per = (n + workers - 1) / workers, opened = 0, failed = 0, held = 0;
    pid_t *pids = calloc((size_t)workers, sizeof(pid_t));
    double t0 = now();
    FILE *f;
    char line[128], buf[16];

    if (pipe(pfd))
        die("pipe");
    signal(SIGTERM, on_term);
    for (int w = 0; w < workers; w++) {
        int first = w * per, count = n - first < per ? n - first : per;
        if (count <= 0)
            break;
        if (!(pids[w] = fork())) {
            close(pfd[0]);
            idle_worker(first, count, pfd[1]);
        }
    }
    close(pfd[1]);
    f = fdopen(pfd[0], "r");
    for (int w = 0; w < workers && pids[w]; w++) {
        int o, fl;
        if (!fgets(line, sizeof(line), f) || sscanf(line, "open %d %d", &o, &fl) != 2)
            die("a worker died");
        opened += o;
        failed += fl;
    }
    printf("RESULT idle_open opened=%d failed=%d secs=%.1f\n", opened, failed, now() - t0);
    fflush(stdout);
    while (read(0, buf, sizeof(buf)) > 0)
        ;
    for (int w = 0; w < workers && pids[w]; w++)
        kill(pids[w], SIGTERM);
    for (int w = 0; w < workers && pids[w]; w++) {
        int h;
        if (fgets(line, sizeof(line), f) && sscanf(line, "held %d", &h) == 1)
            held += h;
        waitpid(pids[w], NULL, 0);
    }
    printf("RESULT idle_held held=%d\n", held);
    return failed ? 1 : 0;
}

/* ---- echo: keystrokes through cat's PTY among many idle sockets ---- */

static void expect_add(struct conn *c, const void *p, size_t n)
{
    grow(&c->expect, &c->expcap, c->explen + n);
    memcpy(c->expect + c->explen, p, n);
    c->explen += n;
}

/* Type one key: a letter (the tty echoes it: one byte back), or every 32nd key a newline
 * (echo "\r\n", then cat writes the line back, "\r\n" after it: onlcr). Only letters are
 * timed; every byte that comes back is checked against what must come. */
static void echo_key(struct conn *c)
{
    unsigned char in[2] = {0x00};

    if (c->linelen == 31) {
        in[1] = '\n';
        expect_add(c, "\r\n", 2);
        expect_add(c, c->line, c->linelen);
        expect_add(c, "\r\n", 2);
        c->linelen = 0;
        c->pending = c->untimed = true;
        ws_send(c, 2, in, 2);
        return;
    }
    c->untimed = false;
    in[1] = (unsigned char)('a' + c->keys++ % 26);
    c->line[c->linelen++] = (char)in[1];
    expect_add(c, in + 1, 1);
    c->pending = true;
    c->t_sent = now();
    ws_send(c, 2, in, 2);
}

static double first_wait = 2; /* -w: seconds from the PTYs' hello to the first key */
static double key_every;      /* -i (in seconds): a typist's mean pace; 0: back to back */

static int run_echo(int nidle, int rounds, int yes_sbx, double secs, long rate, const char *ycmd)
{
    struct conn **idle = calloc((size_t)nidle + 1, sizeof(*idle)), *pty[MAX_SIDS], *ping[MAX_SIDS];
    struct conn *yes = NULL;
    int opened = 0;
    double t0 = now(), tend, last_tick = now();
    uint32_t detach_id = 1;
    long done_rounds = 0, lost = 0;
    bool all;

    ep = epoll_create1(EPOLL_CLOEXEC);
    for (int i = 0; i < nsids; i++) {
        if (i == yes_sbx)
            continue;
        pty[i] = ws_open(K_PTY, i, "cmd=cat", R_ECHO);
        ping[i] = ws_open(K_SESS, i, NULL, R_PING);
    }
    if (yes_sbx >= 0) {
        char q[600];
        snprintf(q, sizeof(q), "cmd=%s", ycmd);
        yes = ws_open(K_PTY, yes_sbx, q, R_YES);
        yes->rate = rate;
        yes->read_budget = (double)rate / 10;
        yes->t_budget = now();
    }
    for (int i = 0; i < nidle; i++) {
        idle[i] = ws_open(K_SESS, i % nsids, NULL, R_IDLE);
        if (i % 64 == 63)
            poll_once(0);
    }
    /* Wait for all to open (and for the PTYs' hello). */
    do {
        poll_once(100);
        opened = 0;
        all = true;
        for (int i = 0; i < nidle; i++) {
            opened += idle[i]->st == S_OPEN;
            all &= idle[i]->st != S_CONNECTING && idle[i]->st != S_HANDSHAKE;
        }
        for (int i = 0; i < nsids; i++)
            if (i != yes_sbx)
                all &= pty[i]->st != S_CONNECTING && pty[i]->st != S_HANDSHAKE &&
                       ping[i]->st != S_CONNECTING && ping[i]->st != S_HANDSHAKE;
    } while (!all && now() - t0 < 120);
    printf("RESULT echo_open idle_opened=%d of=%d secs=%.1f\n", opened, nidle, now() - t0);
    fflush(stdout);
    /* Let cat start before the first key (on a loaded machine a key typed at once
     * was seen to get no echo at all). */
    for (double t1 = now(); now() - t1 < first_wait;)
        poll_once(50);
    for (int i = 0; i < nsids && key_every > 0; i++)
        if (i != yes_sbx)
            pty[i]->t_next = now() + key_every * rand() / RAND_MAX;

    /* Each PTY and each pinger keeps one request in flight; the pingers alternate a
     * WebSocket ping (answered by lws) and a `detach` of an unknown id (answered by
     * warrend's dispatcher with an error frame): neither enters the guest. */
    t0 = now();
    tend = secs > 0 ? t0 + secs : t0 + 3600;
    while (now() < tend) {
        bool busy = false, typing = false;
        for (int i = 0; i < nsids; i++)
            typing |= i != yes_sbx && pty[i]->st == S_OPEN && (long)pty[i]->keys < rounds;
        for (int i = 0; i < nsids; i++) {
            if (i == yes_sbx)
                continue;
            if (pty[i]->pending && now() - pty[i]->t_sent > 10) {
                /* No echo in 10 s: count it lost and go on with the next key. */
                fprintf(stderr, "wsload: pty %d: no echo in 10 s (%zu bytes missing)\n", i,
                        pty[i]->explen);
                lost++;
                pty[i]->explen = 0;
                pty[i]->pending = false;
            }
            if (pty[i]->st == S_OPEN && (secs > 0 || (long)pty[i]->keys < rounds)) {
                busy = true;
                if (!pty[i]->pending && now() >= pty[i]->t_next) {
                    echo_key(pty[i]);
                    /* Each typist on its own random phase: no lockstep bursts. */
                    if (key_every > 0)
                        pty[i]->t_next = now() + key_every * (0.5 + (double)rand() / RAND_MAX);
                }
            }
            /* Timed (beside a producer): one round trip per 10 ms per pinger, a probe
             * rather than a load of its own (back to back they made ~3,700 a second). */
            if (ping[i]->st == S_OPEN && !ping[i]->pending &&
                (secs > 0 || key_every > 0
                     ? now() - ping[i]->t_sent >= 0.01 && (secs > 0 || typing)
                     : (long)(s_ping.n + s_err.n) < 2L * rounds * (nsids - (yes ? 1 : 0)))) {
                busy = true;
                ping[i]->pending = true;
                ping[i]->t_sent = now();
                if (detach_id++ & 1)
                    ws_send(ping[i], 0x9, "p", 1);
                else
                    sess_send(ping[i], detach_id, "detach", NULL, NULL, "target", 999999999);
            } else if (ping[i]->pending) {
                busy = true;
            }
        }
        if (!busy && secs <= 0)
            break;
        poll_once(yes || key_every > 0 ? (key_every > 0 ? 1 : 10) : 50);
        if (yes && now() - last_tick >= 0.1) {
            /* The slow reader: a tenth of its per-second rate each 100 ms. */
            last_tick = now();
            if (yes->st == S_OPEN) {
                yes->read_budget = (double)rate / 10;
                ep_mod(yes);
            }
        }
        done_rounds++;
    }
    (void)done_rounds;
    /* Let the keys and pings still in flight come back (they are not cut off by the clock). */
    for (double t1 = now(); now() - t1 < 10;) {
        bool pend = false;
        for (int i = 0; i < nsids; i++)
            if (i != yes_sbx)
                pend |= (pty[i]->st == S_OPEN && pty[i]->pending) ||
                        (ping[i]->st == S_OPEN && ping[i]->pending);
        if (!pend)
            break;
        poll_once(10);
    }
    for (int i = 0; i < nsids; i++)
        if (i != yes_sbx && (pty[i]->st != S_OPEN || pty[i]->failed || pty[i]->explen))
            errors++, fprintf(stderr, "wsload: pty %d: open=%d failed=%d %zu bytes unechoed\n", i,
                              pty[i]->st == S_OPEN, pty[i]->failed, pty[i]->explen);
    opened = 0;
    for (int i = 0; i < nidle; i++)
        opened += idle[i]->st == S_OPEN;
    report("echo_pty", &s_echo);
    report("ws_ping", &s_ping);
    report("session_error", &s_err);
    if (yes)
        printf("RESULT yes open=%d got=%llu secs=%.1f\n", yes->st == S_OPEN,
               (unsigned long long)yes->got, now() - t0);
    printf("RESULT echo_end idle_still_open=%d errors=%ld lost=%ld\n", opened, errors, lost);
    return errors || lost || opened != nidle || (yes && yes->st != S_OPEN) ? 1 : 0;
}

/* ---- tput: one producer per sandbox, all at once; PTY or plain exec ---- */

static int run_tput(long bytes, bool exec)
{
    struct conn *c[MAX_SIDS];
    char q[256];
    double t0 = now(), first = 1e18, last = 0;
    uint64_t total = 0;
    bool all;

    ep = epoll_create1(EPOLL_CLOEXEC);
    snprintf(q, sizeof(q), "head -c %ld /dev/zero", bytes);
    for (int i = 0; i < nsids; i++) {
        if (exec) {
            c[i] = ws_open(K_SESS, i, NULL, R_TPUT);
        } else {
            char uq[300];
            snprintf(uq, sizeof(uq), "cmd=head%%20-c%%20%ld%%20/dev/zero", bytes);
            c[i] = ws_open(K_PTY, i, uq, R_TPUT);
        }
    }
    do {
        poll_once(100);
        all = true;
        for (int i = 0; i < nsids; i++) {
            if (exec && c[i]->st == S_OPEN && !c[i]->next_id) {
                c[i]->next_id = 1;
                c[i]->t_open = now();
                sess_send(c[i], 1, "exec", "cmd", q, NULL, 0);
            }
            all &= c[i]->exited || c[i]->st == S_CLOSED;
        }
    } while (!all && now() - t0 < 1800);
    for (int i = 0; i < nsids; i++) {
        double secs = c[i]->t_end - c[i]->t_open;
        if (!c[i]->exited || c[i]->got != (uint64_t)bytes)
            errors++, fprintf(stderr, "wsload: producer %d: exited=%d got %llu of %ld\n", i,
                              c[i]->exited, (unsigned long long)c[i]->got, bytes);
        printf("RESULT tput_one sbx=%d bytes=%llu secs=%.3f mbps=%.2f\n", i,
               (unsigned long long)c[i]->got, secs, (double)c[i]->got / 1e6 / secs);
        total += c[i]->got;
        first = c[i]->t_open < first ? c[i]->t_open : first;
        last = c[i]->t_end > last ? c[i]->t_end : last;
    }
    printf("RESULT tput_all n=%d bytes=%llu secs=%.3f mbps=%.2f errors=%ld\n", nsids,
           (unsigned long long)total, last - first, (double)total / 1e6 / (last - first), errors);
    return errors ? 1 : 0;
}

/* ---- exec `true`: agent socket vs REST, interleaved ---- */

static int rest_fd = -1;

static bool rest_exec_true(void)
{
    char req[512], buf[8192];
    const char *body = "{\"argv\":[\"true\"]}";
    size_t got = 0;
    long clen = -1;
    char *e = NULL;
    int n;

    if (rest_fd < 0)
        rest_fd = tcp_connect(false);
    n = snprintf(req, sizeof(req),
                 "POST /v1/sandboxes/%s/exec HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 "Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                 "Content-Length: %zu\r\n\r\n%s",
                 sids[0], key, strlen(body), body);
    if (send(rest_fd, req, (size_t)n, MSG_NOSIGNAL) != n)
        return false;
    for (;;) {
        ssize_t r = recv(rest_fd, buf + got, sizeof(buf) - 1 - got, 0);
        if (r <= 0)
            return false;
        got += (size_t)r;
        buf[got] = 0;
        if (!e && (e = strstr(buf, "\r\n\r\n"))) {
            char *cl = strcasestr(buf, "content-length:");
            clen = cl ? strtol(cl + 15, NULL, 10) : 0;
        }
        if (e && got >= (size_t)(e + 4 - buf) + (size_t)clen)
            break;
    }
    return !strncmp(buf, "HTTP/1.1 200", 12) && strstr(buf, "\"exit_code\":0");
}

static int run_exec(int n)
{
    struct conn *c;
    double t0 = now();

    ep = epoll_create1(EPOLL_CLOEXEC);
    c = ws_open(K_SESS, 0, NULL, R_EXEC);
    while (c->st != S_OPEN && c->st != S_CLOSED && now() - t0 < 30)
        poll_once(100);
    if (c->st != S_OPEN)
        die("the agent socket did not open");
    for (int i = 0; i < n; i++) {
        double t = now();
        c->exited = false;
        c->next_id++;
        sess_send(c, c->next_id, "exec", "cmd", "true", NULL, 0);
        while (!c->exited && c->st == S_OPEN)
            poll_once(1000);
        if (!c->exited)
            die("the agent socket closed");
        sample(&s_exec_ws, now() - t);
        t = now();
        if (!rest_exec_true()) {
            errors++;
            close(rest_fd);
            rest_fd = -1;
            fprintf(stderr, "wsload: REST exec failed\n");
        }
        sample(&s_exec_rest, now() - t);
    }
    report("exec_session", &s_exec_ws);
    report("exec_rest", &s_exec_rest);
    printf("RESULT exec_end errors=%ld\n", errors);
    return errors ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    int opt, n = 0, rounds = 100, workers = 4, yes_sbx = -1;
    long bytes = 1 << 20, rate = 65536;
    double secs = 0;
    bool exec = false;
    const char *ycmd = "yes";
    char *s, *tok, *save;

    setvbuf(stdout, NULL, _IOLBF, 0);
    optind = 2;
    while ((opt = getopt(argc, argv, "p:k:s:n:j:r:y:Y:t:R:b:xw:i:")) != -1) {
        switch (opt) {
        case 'p':
            port = atoi(optarg);
            break;
        case 'k':
            key = optarg;
            break;
        case 's':
            s = strdup(optarg);
            for (tok = strtok_r(s, ",", &save); tok && nsids < MAX_SIDS;
                 tok = strtok_r(NULL, ",", &save))
                sids[nsids++] = tok;
            break;
        case 'n':
            n = atoi(optarg);
            break;
        case 'j':
            workers = atoi(optarg);
            break;
        case 'r':
            rounds = atoi(optarg);
            break;
        case 'y':
            yes_sbx = atoi(optarg);
            break;
        case 'w':
            first_wait = atof(optarg);
            break;
        case 'i':
            key_every = atof(optarg) / 1000;
            break;
        case 'Y':
            ycmd = optarg;
            break;
        case 't':
            secs = atof(optarg);
            break;
        case 'R':
            rate = atol(optarg);
            break;
        case 'b':
            bytes = atol(optarg);
            break;
        case 'x':
            exec = true;
            break;
        default:
            return 2;
        }
    }
    if (!port || !key || !nsids)
        die("usage: wsload idle|echo|tput|exec -p PORT -k KEY -s SID[,SID..] [options]");
    signal(SIGPIPE, SIG_IGN);
    if (!strcmp(mode, "idle"))
        return run_idle(n, workers < 1 ? 1 : workers);
    if (!strcmp(mode, "echo"))
        return run_echo(n, rounds, yes_sbx, secs, rate, ycmd);
    if (!strcmp(mode, "tput"))
        return run_tput(bytes, exec);
    if (!strcmp(mode, "exec"))
        return run_exec(rounds);
    die("unknown mode '%s'", mode);
    return 2;
}
