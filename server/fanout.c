/*
 * fanout.c - the same GET to every peer host (fanout.h).
 */
#include "fanout.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

struct fanout_peer {
    char name[FANOUT_NAME_MAX + 1];
    char hostport[256]; /* as written, for the Host header and messages */
    struct sockaddr_storage addr;
    socklen_t addrlen;
};

struct fanout_peers {
    unsigned n;
    struct fanout_peer p[FANOUT_PEERS_MAX];
};

struct call {
    struct fanout *f;
    struct fanout_peer peer; /* a copy: the list may be replaced meanwhile */
    int fd;
    ev_io io;
    char *req; /* the request, then unused */
    size_t req_len, req_off;
    char *buf; /* the answer as it arrives */
    size_t len, cap;
    bool done;
    struct fanout_result r;
};

struct fanout {
    struct ev_loop *loop;
    ev_timer deadline;
    ev_idle finish; /* done() after the current callback, never inside fanout_start */
    unsigned n, pending;
    size_t max_bytes;
    fanout_done_fn done;
    void *user;
    struct call c[];
};

static int valid_name(const char *s, size_t n)
{
    if (n < 1 || n > FANOUT_HOST_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9')))
            return 0;
    return 1;
}

static int resolve(struct fanout_peer *p, char *err, size_t errcap)
{
    char host[256], *colon;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int r;

    snprintf(host, sizeof(host), "%s", p->hostport);
    colon = strrchr(host, ':');
    if (!colon || colon == host || !colon[1]) {
        snprintf(err, errcap, "peers: %s=%s: want host:port", p->name, p->hostport);
        return -EINVAL;
    }
    *colon = '\0';
    if (host[0] == '[' && colon[-1] == ']') { /* [v6]:port */
        memmove(host, host + 1, strlen(host));
        host[strlen(host) - 1] = '\0';
    }
    r = getaddrinfo(host, colon + 1, &hints, &ai);
    if (r || !ai) {
        snprintf(err, errcap, "peers: %s=%s: %s", p->name, p->hostport, gai_strerror(r));
        return -EINVAL;
    }
    memcpy(&p->addr, ai->ai_addr, ai->ai_addrlen);
    p->addrlen = ai->ai_addrlen;
    freeaddrinfo(ai);
    return 0;
}

int fanout_peers_parse(const char *spec, const char *self, struct fanout_peers **out, char *err,
                       size_t errcap)
{
    struct fanout_peers *ps = calloc(1, sizeof(*ps));
    const char *s = spec ? spec : "";

    if (!ps)
        return -ENOMEM;
    while (*s) {
        const char *end = strchr(s, ','), *eq;
        size_t len;

        if (!end)
            end = s + strlen(s);
        while (s < end && *s == ' ')
            s++;
        len = (size_t)(end - s);
        while (len && s[len - 1] == ' ')
            len--;
        if (len) {
            struct fanout_peer *p;

            eq = memchr(s, '=', len);
            if (!eq || !valid_name(s, (size_t)(eq - s)) || (size_t)(s + len - eq - 1) == 0 ||
                (size_t)(s + len - eq - 1) >= sizeof(p->hostport)) {
                snprintf(err, errcap, "peers: '%.*s': want NAME=HOST:PORT, NAME a host_id",
                         (int)len, s);
                goto bad;
            }
            if (strlen(self) != (size_t)(eq - s) || memcmp(s, self, (size_t)(eq - s)) != 0) {
                if (ps->n == FANOUT_PEERS_MAX) {
                    snprintf(err, errcap, "peers: more than %d", FANOUT_PEERS_MAX);
                    goto bad;
                }
                p = &ps->p[ps->n];
                memcpy(p->name, s, (size_t)(eq - s));
                memcpy(p->hostport, eq + 1, (size_t)(s + len - eq - 1));
                for (unsigned i = 0; i < ps->n; i++)
                    if (!strcmp(ps->p[i].name, p->name)) {
                        snprintf(err, errcap, "peers: %s named twice", p->name);
                        goto bad;
                    }
                if (resolve(p, err, errcap))
                    goto bad;
                ps->n++;
            }
        }
        s = *end ? end + 1 : end;
    }
    *out = ps;
    return 0;
bad:
    free(ps);
    return -EINVAL;
}

void fanout_peers_free(struct fanout_peers *p)
{
    free(p);
}

unsigned fanout_peers_count(const struct fanout_peers *p)
{
    return p ? p->n : 0;
}

const char *fanout_peer_name(const struct fanout_peers *p, unsigned i)
{
    return p->p[i].name;
}

static socklen_t addr_len(const struct sockaddr_storage *a)
{
    return a->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* Same family, address and port (an IPv6 address's flow info and scope aside). */
static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
        return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
    }
    if (a->ss_family == AF_INET6) {
        const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
        return x->sin6_port == y->sin6_port &&
               !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(x->sin6_addr));
    }
    return false;
}

int fanout_peers_merge(const struct fanout_peers *base, const struct sockaddr_storage *addrs,
                       unsigned n, struct fanout_peers **out, unsigned *dropped)
{
    struct fanout_peers *ps = calloc(1, sizeof(*ps));

    if (!ps)
        return -ENOMEM;
    if (base)
        *ps = *base;
    *dropped = 0;
    for (unsigned i = 0; i < n; i++) {
        const struct sockaddr_storage *a = &addrs[i];
        struct fanout_peer *p;
        char host[INET6_ADDRSTRLEN], serv[8];
        bool seen = false;

        if (a->ss_family != AF_INET && a->ss_family != AF_INET6)
            continue;
        for (unsigned j = 0; j < ps->n && !seen; j++)
            seen = same_addr(&ps->p[j].addr, a);
        if (seen)
            continue;
        if (ps->n == FANOUT_PEERS_MAX) {
            (*dropped)++;
            continue;
        }
        if (getnameinfo((const struct sockaddr *)a, addr_len(a), host, sizeof(host), serv,
                        sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV))
            continue;
        p = &ps->p[ps->n++];
        memset(p, 0, sizeof(*p));
        snprintf(p->name, sizeof(p->name), a->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host,
                 serv);
        memcpy(p->hostport, p->name, sizeof(p->name));
        memcpy(&p->addr, a, addr_len(a));
        p->addrlen = addr_len(a);
    }
    *out = ps;
    return 0;
}

bool fanout_peers_same(const struct fanout_peers *a, const struct fanout_peers *b)
{
    if (fanout_peers_count(a) != fanout_peers_count(b))
        return false;
    for (unsigned i = 0; i < fanout_peers_count(a); i++)
        if (strcmp(a->p[i].name, b->p[i].name) || !same_addr(&a->p[i].addr, &b->p[i].addr))
            return false;
    return true;
}

static void call_end(struct call *c, const char *why)
{
    struct fanout *f = c->f;

    if (c->done)
        return;
    c->done = true;
    if (c->fd >= 0) {
        ev_io_stop(f->loop, &c->io);
        close(c->fd);
        c->fd = -1;
    }
    if (why) {
        c->r.ok = false;
        c->r.why = why;
    }
    if (--f->pending == 0)
        ev_idle_start(f->loop, &f->finish);
}

/* The whole answer is in: status line, headers, body (Connection: close framing; a
 * chunked answer is refused, warrend's JSON answers carry a length). */
static void parse_answer(struct call *c)
{
    char *hend, *p;
    int status = 0;

    c->buf[c->len] = '\0';
    if (sscanf(c->buf, "HTTP/1.%*1[01] %3d", &status) != 1 || status < 100 || status > 599)
        return call_end(c, "not an HTTP answer");
    c->r.status = status;
    hend = strstr(c->buf, "\r\n\r\n");
    if (!hend)
        return call_end(c, "answer without a body");
    *hend = '\0';
    for (p = strstr(c->buf, "\r\n"); p && p < hend; p = strstr(p + 2, "\r\n"))
        if (!strncasecmp(p + 2, "transfer-encoding:", 18))
            return call_end(c, "chunked answer");
    if (status != 200)
        return call_end(c, "status not 200");
    c->r.ok = true;
    c->r.head = c->buf;
    c->r.body = hend + 4;
    c->r.len = c->len - (size_t)(hend + 4 - c->buf);
    call_end(c, NULL);
}

static void on_io(struct ev_loop *loop, ev_io *w, int revents)
{
    struct call *c = w->data;
    ssize_t n;

    (void)loop;
    if (revents & EV_WRITE) {
        if (c->req_off == 0) { /* first writable: the connect's outcome */
            int e = 0;
            socklen_t el = sizeof(e);
            if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el) || e)
                return call_end(c, e == ECONNREFUSED ? "connection refused" : "cannot connect");
        }
        n = send(c->fd, c->req + c->req_off, c->req_len - c->req_off, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EINTR)
            return call_end(c, "send failed");
        if (n > 0)
            c->req_off += (size_t)n;
        if (c->req_off == c->req_len) {
            ev_io_stop(c->f->loop, &c->io);
            ev_io_set(&c->io, c->fd, EV_READ);
            ev_io_start(c->f->loop, &c->io);
        }
        return;
    }
    for (;;) {
        if (c->len == c->cap) {
            size_t ncap = c->cap ? c->cap * 2 : 16384;
            char *nb;
            if (c->cap >= c->f->max_bytes)
                return call_end(c, "answer too large");
            if (ncap > c->f->max_bytes)
                ncap = c->f->max_bytes;
            nb = realloc(c->buf, ncap + 1);
            if (!nb)
                return call_end(c, "out of memory");
            c->buf = nb;
            c->cap = ncap;
        }
        n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n > 0) {
            c->len += (size_t)n;
            continue;
        }
        if (n == 0)
            return parse_answer(c);
        if (errno == EAGAIN || errno == EINTR)
            return;
        return call_end(c, "connection reset");
    }
}

static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct fanout *f = w->data;

    (void)loop;
    (void)revents;
    for (unsigned i = 0; i < f->n; i++)
        call_end(&f->c[i], "timeout");
}

static void free_fanout(struct fanout *f)
{
    ev_timer_stop(f->loop, &f->deadline);
    ev_idle_stop(f->loop, &f->finish);
    for (unsigned i = 0; i < f->n; i++) {
        struct call *c = &f->c[i];
        if (c->fd >= 0) {
            ev_io_stop(f->loop, &c->io);
            close(c->fd);
        }
        free(c->req);
        free(c->buf);
    }
    free(f);
}

static void on_finish(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct fanout *f = w->data;
    struct fanout_result r[FANOUT_PEERS_MAX];

    (void)loop;
    (void)revents;
    ev_idle_stop(f->loop, &f->finish);
    for (unsigned i = 0; i < f->n; i++)
        r[i] = f->c[i].r;
    f->done(f->user, r, f->n);
    free_fanout(f);
}

int fanout_start(struct ev_loop *loop, const struct fanout_peers *peers, const char *path,
                 const char *auth, unsigned timeout_ms, size_t max_bytes, fanout_done_fn done,
                 void *user, struct fanout **out)
{
    struct fanout *f;
    unsigned n = fanout_peers_count(peers);

    if (strpbrk(path, "\r\n") || (auth && strpbrk(auth, "\r\n")))
        return -EINVAL;
    f = calloc(1, sizeof(*f) + n * sizeof(struct call));
    if (!f)
        return -ENOMEM;
    f->loop = loop;
    f->n = f->pending = n;
    f->max_bytes = max_bytes;
    f->done = done;
    f->user = user;
    ev_timer_init(&f->deadline, on_deadline, timeout_ms / 1000.0, 0);
    f->deadline.data = f;
    ev_idle_init(&f->finish, on_finish);
    f->finish.data = f;
    for (unsigned i = 0; i < n; i++) {
        struct call *c = &f->c[i];
        const struct fanout_peer *pe = &c->peer;
        int len;

        c->f = f;
        c->peer = peers->p[i];
        c->fd = -1;
        c->r.name = pe->name;
        len = asprintf(&c->req,
                       "GET %s HTTP/1.1\r\nHost: %s\r\n%s%s%sX-Warren-Local: 1\r\n"
                       "Connection: close\r\n\r\n",
                       path, pe->hostport, auth ? "Authorization: " : "", auth ? auth : "",
                       auth ? "\r\n" : "");
        if (len < 0) {
            c->req = NULL;
            call_end(c, "out of memory");
            continue;
        }
        c->req_len = (size_t)len;
        c->fd = socket(pe->addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (c->fd < 0 || (connect(c->fd, (const struct sockaddr *)&pe->addr, pe->addrlen) &&
                          errno != EINPROGRESS)) {
            call_end(c, errno == ECONNREFUSED ? "connection refused" : "cannot connect");
            continue;
        }
        ev_io_init(&c->io, on_io, c->fd, EV_WRITE);
        c->io.data = c;
        ev_io_start(loop, &c->io);
    }
    if (f->pending)
        ev_timer_start(loop, &f->deadline);
    else
        ev_idle_start(loop, &f->finish);
    *out = f;
    return 0;
}

void fanout_cancel(struct fanout *f)
{
    if (f)
        free_fanout(f);
}
