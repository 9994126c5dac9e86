/*
 * ports.c - the port proxy (ports.h): admission, the connection into the
 * VM's namespace, and the byte pump.
 */
#include "cred.h"
#include "http_int.h"
#include "ports.h"
#include "vmm.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#define GUEST_ADDR "10.0.2.2"
#define HEAD_ROOM  (2 * 8192) /* the rewritten first head always fits the buffer */
#define TICK_S     1.0
#define LINGER_S   2.0 /* an error answer: wait this long for the client to close */
/* Path mode serves the guest's pages on warrend's own origin, where they could script
 * warrend's pages and pass the WebSocket Origin check as "own". Every such answer gets
 * this: the browser gives the page an opaque origin ("null"), so its sockets to
 * warrend are refused and warrend's windows are another origin's. The guest cannot
 * lift it: a policy of its own only adds restrictions. */
#define PATH_CSP                                                                                   \
    "Content-Security-Policy: sandbox allow-scripts allow-forms allow-popups allow-modals "        \
    "allow-downloads\r\n"
#define STATUS_LINE_MAX 8192 /* a guest's status line in path mode */

enum body {
    BODY_NONE,     /* the request's body is through: client bytes are not forwarded */
    BODY_LEN,      /* Content-Length bytes left */
    BODY_CHUNKED,  /* until the chunked decoder says done */
    BODY_AWAIT101, /* an upgrade: nothing until the guest's status line */
    BODY_RAW,      /* upgraded: everything, both ways */
};

struct pbuf {
    char *p;
    size_t off, len, cap;
};

struct pconn {
    struct pconn *next, **pprev;
    struct ports *pp;
    void *ud; /* http_conn_release's */
    char sbx[PORTS_ID_MAX + 1];
    char vm[24];
    unsigned port;
    int cfd, gfd;
    ev_io crd, cwr, grd, gwr;
    ev_timer tm; /* connect timeout, then the lingering close of an error answer */
    struct pbuf c2g, g2c;
    enum body body;
    uint64_t left;
    size_t hold; /* bytes at c2g's end that wait for the guest's 101 (sent with an upgrade) */
    struct chunked ch;
    bool admitted; /* passed admission: from then on it is the sandbox's */
    bool g_head;   /* path mode: the guest's status line is not through yet (PATH_CSP) */
    bool connecting, answered_err;
    bool c_eof, g_eof;   /* that side will send no more */
    bool g_shut, c_shut; /* shutdown(SHUT_WR) done towards that side */
    bool used;           /* bytes moved since the last tick */
    int64_t last_ms;     /* the last byte either way */
    int64_t touched_ms;  /* the last sbx_port_check(used) */
};

struct ports {
    struct http_server *srv;
    struct pconn *conns;
    ev_timer tick;
};

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void pc_close(struct pconn *pc)
{
    struct ev_loop *loop = pc->pp->srv->loop;

    ev_io_stop(loop, &pc->crd);
    ev_io_stop(loop, &pc->cwr);
    ev_io_stop(loop, &pc->grd);
    ev_io_stop(loop, &pc->gwr);
    ev_timer_stop(loop, &pc->tm);
    if (pc->cfd >= 0)
        close(pc->cfd);
    if (pc->gfd >= 0)
        close(pc->gfd);
    *pc->pprev = pc->next;
    if (pc->next)
        pc->next->pprev = pc->pprev;
    free(pc->c2g.p);
    free(pc->g2c.p);
    http_conn_release(pc->ud);
    free(pc);
}

/* Watchers follow the buffers: read a side while the buffer towards the other has
 * room, write a side while its buffer has bytes. */
static void pc_arm(struct pconn *pc)
{
    struct ev_loop *loop = pc->pp->srv->loop;
    bool c_read =
        !pc->c_eof && pc->body != BODY_AWAIT101 &&
        (pc->answered_err || pc->body == BODY_NONE || pc->c2g.off + pc->c2g.len < pc->c2g.cap);
    bool g_read =
        pc->gfd >= 0 && !pc->connecting && !pc->g_eof && pc->g2c.off + pc->g2c.len < pc->g2c.cap;
    bool c_write = pc->g2c.len > 0 && !pc->g_head;
    bool g_write = pc->gfd >= 0 && (pc->connecting || pc->c2g.len > pc->hold);

    if (c_read != ev_is_active(&pc->crd))
        (c_read ? ev_io_start : ev_io_stop)(loop, &pc->crd);
    if (g_read != ev_is_active(&pc->grd))
        (g_read ? ev_io_start : ev_io_stop)(loop, &pc->grd);
    if (c_write != ev_is_active(&pc->cwr))
        (c_write ? ev_io_start : ev_io_stop)(loop, &pc->cwr);
    if (g_write != ev_is_active(&pc->gwr))
        (g_write ? ev_io_start : ev_io_stop)(loop, &pc->gwr);
}

/* Done? Both directions over and their buffers empty (or an error answered). */
static bool pc_finished(struct pconn *pc)
{
    if (pc->answered_err)
        return false; /* the linger timer or the client's close ends it */
    if (pc->g_eof && pc->g2c.len == 0) {
        /* The guest has said everything. One request per connection: close; an
         * upgraded one may still carry the client's last bytes. */
        if (pc->body != BODY_RAW || (pc->c_eof && pc->c2g.len == 0))
            return true;
    }
    return false;
}

static void buf_compact(struct pbuf *b)
{
    if (b->len == 0)
        b->off = 0;
    else if (b->off > b->cap / 2) {
        memmove(b->p, b->p + b->off, b->len);
        b->off = 0;
    }
}

/* Answer the client with a JSON error (apierr format) and close after a linger. */
static void pc_fail(struct pconn *pc, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void pc_fail(struct pconn *pc, int status, const char *code, const char *fmt, ...)
{
    char msg[512];
    json_t *o;
    char *body;
    va_list ap;
    int n;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    o = json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg);
    body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (pc->gfd >= 0) {
        close(pc->gfd);
        pc->gfd = -1;
    }
    pc->connecting = false;
    pc->g_head = false; /* the answer is warrend's own */
    pc->body = BODY_NONE;
    pc->c2g.len = pc->g2c.len = pc->g2c.off = pc->hold = 0;
    n = snprintf(pc->g2c.p, pc->g2c.cap,
                 "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                 "Connection: close\r\n\r\n%s\n",
                 status, status < 500 ? "Client Error" : "Server Error",
                 body ? strlen(body) + 1 : 1, body ? body : "");
    free(body);
    pc->g2c.len = n > 0 && (size_t)n < pc->g2c.cap ? (size_t)n : 0;
    pc->answered_err = true;
    ev_timer_stop(pc->pp->srv->loop, &pc->tm);
    ev_timer_set(&pc->tm, LINGER_S, 0);
    ev_timer_start(pc->pp->srv->loop, &pc->tm);
    pc_arm(pc);
}

/* Sandbox state changed or traffic: check (and touch) it; false when it went. */
static bool pc_still_there(struct pconn *pc, bool used)
{
    if (sbx_port_check(pc->pp->srv->t, pc->sbx, pc->vm, used) != 0)
        return false;
    if (used)
        pc->touched_ms = now_ms();
    return true;
}

static void pc_moved(struct pconn *pc)
{
    pc->last_ms = now_ms();
    pc->used = true;
    /* The first bytes after a quiet second: the VM may be frozen, thaw it now. */
    if (pc->last_ms - pc->touched_ms >= 1000 && !pc_still_there(pc, true))
        pc->g_eof = pc->c_eof = true;
}

/* Client bytes just appended at c2g [from, from + n): decide how many go to the guest. */
static size_t body_filter(struct pconn *pc, size_t from, size_t n)
{
    unsigned char *p = (unsigned char *)pc->c2g.p + from;
    size_t used, doff, dlen, took = 0;

    switch (pc->body) {
    case BODY_RAW:
        return n;
    case BODY_LEN:
        took = pc->left < n ? (size_t)pc->left : n;
        pc->left -= took;
        if (!pc->left)
            pc->body = BODY_NONE;
        return took;
    case BODY_CHUNKED:
        while (took < n) {
            int r = chunked_decode(&pc->ch, p + took, n - took, &used, &doff, &dlen);
            took += used;
            if (r != CHUNKED_MORE) {
                /* Done, or bad framing: either way no more client bytes go in. */
                pc->body = BODY_NONE;
                break;
            }
            if (!used)
                break;
        }
        return took;
    default:
        return 0;
    }
}

/* Done both ways: closed; else its watchers set for what it waits for now. */
static void pc_next(struct pconn *pc)
{
    if (pc_finished(pc))
        pc_close(pc);
    else
        pc_arm(pc);
}

/* Send what b holds but its last hold bytes; what went is consumed. send's result. */
static ssize_t buf_send(int fd, struct pbuf *b, size_t hold)
{
    ssize_t r = send(fd, b->p + b->off, b->len - hold, MSG_NOSIGNAL);

    if (r > 0) {
        b->off += (size_t)r;
        b->len -= (size_t)r;
        if (b->len == 0)
            b->off = 0;
    }
    return r;
}

static void on_client_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct pconn *pc = (struct pconn *)((char *)w - offsetof(struct pconn, crd));
    struct pbuf *b = &pc->c2g;
    char junk[16384];
    ssize_t r;

    (void)loop;
    (void)revents;
    if (pc->body == BODY_NONE || pc->answered_err) {
        /* Past the one request: read (to see the close) and drop. */
        r = recv(pc->cfd, junk, sizeof(junk), 0);
    } else {
        buf_compact(b);
        r = recv(pc->cfd, b->p + b->off + b->len, b->cap - b->off - b->len, 0);
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r <= 0) {
        pc->c_eof = true;
        if (r < 0 || pc->answered_err) {
            pc_close(pc);
            return;
        }
    } else if (pc->body != BODY_NONE && !pc->answered_err) {
        size_t keep = body_filter(pc, b->off + b->len, (size_t)r);
        b->len += keep;
        pc_moved(pc);
    }
    if (pc->c_eof && b->len == 0 && pc->gfd >= 0 && !pc->connecting && !pc->g_shut) {
        shutdown(pc->gfd, SHUT_WR);
        pc->g_shut = true;
    }
    pc_next(pc);
}

static void on_client_write(struct ev_loop *loop, ev_io *w, int revents)
{
    struct pconn *pc = (struct pconn *)((char *)w - offsetof(struct pconn, cwr));
    struct pbuf *b = &pc->g2c;
    ssize_t r;

    (void)loop;
    (void)revents;
    r = buf_send(pc->cfd, b, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r < 0) {
        pc_close(pc);
        return;
    }
    if (!pc->answered_err)
        pc_moved(pc);
    if (b->len == 0 && pc->answered_err && !pc->c_shut) {
        shutdown(pc->cfd, SHUT_WR);
        pc->c_shut = true;
    }
    if (b->len == 0 && pc->g_eof && !pc->c_shut && !pc->answered_err) {
        shutdown(pc->cfd, SHUT_WR);
        pc->c_shut = true;
    }
    pc_next(pc);
}

/* Path mode: once the guest's status line is in g2c, put PATH_CSP after it. 0: done or
 * not yet complete; -1: answered 502 (not an HTTP/1.x status line, an interim 1xx answer
 * other than 101 whose next head would go out without the policy, or too long). */
static int head_csp(struct pconn *pc)
{
    struct pbuf *b = &pc->g2c;
    const size_t il = sizeof(PATH_CSP) - 1;
    char *s, *eol;
    size_t ll;

    if (b->off) {
        memmove(b->p, b->p + b->off, b->len);
        b->off = 0;
    }
    s = b->p;
    eol = b->len ? memchr(s, '\n', b->len) : NULL;
    if (!eol) {
        if (!pc->g_eof && b->len < STATUS_LINE_MAX)
            return 0;
        goto bad;
    }
    ll = (size_t)(eol - s) + 1;
    if (ll < 14 || memcmp(s, "HTTP/1.", 7) != 0 || s[8] != ' ' || eol[-1] != '\r' ||
        (s[9] == '1' && memcmp(s + 9, "101", 3) != 0) || b->len + il > b->cap)
        goto bad;
    memmove(s + ll + il, s + ll, b->len - ll);
    memcpy(s + ll, PATH_CSP, il);
    b->len += il;
    pc->g_head = false;
    return 0;
bad:
    pc_fail(pc, 502, "bad_response",
            "port %u in sandbox %s did not answer with an HTTP/1.x status line", pc->port, pc->sbx);
    return -1;
}

static void on_guest_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct pconn *pc = (struct pconn *)((char *)w - offsetof(struct pconn, grd));
    struct pbuf *b = &pc->g2c;
    size_t room;
    ssize_t r;

    (void)loop;
    (void)revents;
    buf_compact(b);
    room = b->cap - b->off - b->len;
    /* Until the status line is through, leave room for the policy that follows it. */
    if (pc->g_head)
        room = room > sizeof(PATH_CSP) ? room - sizeof(PATH_CSP) : 0;
    r = recv(pc->gfd, b->p + b->off + b->len, room, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r <= 0) {
        pc->g_eof = true;
    } else {
        b->len += (size_t)r;
        pc_moved(pc);
    }
    if (pc->g_head && (b->len || pc->g_eof) && head_csp(pc) < 0)
        return;
    if (pc->body == BODY_AWAIT101 && (b->len >= 12 || pc->g_eof)) {
        /* The guest's answer to an upgrade: 101 makes the connection raw both ways. */
        pc->body = b->len >= 12 && memcmp(b->p + b->off, "HTTP/1.", 7) == 0 &&
                           memcmp(b->p + b->off + 8, " 101", 4) == 0
                       ? BODY_RAW
                       : BODY_NONE;
        if (pc->body == BODY_NONE)
            pc->c2g.len = 0; /* held bytes of a refused upgrade never go in */
        pc->hold = 0;
    }
    if (pc->g_eof && b->len == 0 && !pc->c_shut) {
        shutdown(pc->cfd, SHUT_WR);
        pc->c_shut = true;
    }
    pc_next(pc);
}

static void on_guest_write(struct ev_loop *loop, ev_io *w, int revents)
{
    struct pconn *pc = (struct pconn *)((char *)w - offsetof(struct pconn, gwr));
    struct pbuf *b = &pc->c2g;
    ssize_t r;

    (void)revents;
    if (pc->connecting) {
        int err = 0;
        socklen_t sl = sizeof(err);
        getsockopt(pc->gfd, SOL_SOCKET, SO_ERROR, &err, &sl);
        if (err == EINPROGRESS)
            return;
        ev_timer_stop(loop, &pc->tm);
        pc->connecting = false;
        if (err == ECONNREFUSED) {
            pc_fail(pc, 502, "port_closed", "nothing listens on port %u in sandbox %s", pc->port,
                    pc->sbx);
            return;
        }
        if (err) {
            pc_fail(pc, 502, "port_unreachable", "cannot connect to port %u in sandbox %s: %s",
                    pc->port, pc->sbx, strerror(err));
            return;
        }
        pc_arm(pc);
        return;
    }
    r = buf_send(pc->gfd, b, pc->hold);
    if (r < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (r < 0) {
        pc->g_eof = true; /* the guest went away: what it said still reaches the client */
        b->len = 0;
        pc_next(pc);
        return;
    }
    pc_moved(pc);
    if (b->len == 0 && pc->c_eof && !pc->g_shut) {
        shutdown(pc->gfd, SHUT_WR);
        pc->g_shut = true;
    }
    pc_next(pc);
}

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct pconn *pc = (struct pconn *)((char *)w - offsetof(struct pconn, tm));

    (void)loop;
    (void)revents;
    if (pc->connecting) {
        pc_fail(pc, 504, "port_timeout", "port %u in sandbox %s did not answer within %u ms",
                pc->port, pc->sbx, pc->pp->srv->cfg->port_connect_ms);
        return;
    }
    pc_close(pc); /* an error answer's linger is over */
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct ports *pp = (struct ports *)((char *)w - offsetof(struct ports, tick));
    int64_t now = now_ms(), idle = (int64_t)pp->srv->cfg->port_idle_s * 1000;
    struct pconn *pc, *next;

    (void)loop;
    (void)revents;
    for (pc = pp->conns; pc; pc = next) {
        next = pc->next;
        if (pc->answered_err)
            continue;
        /* A deleted sandbox's connections close here, within a tick. */
        if (!pc_still_there(pc, pc->used) || now - pc->last_ms >= idle) {
            pc_close(pc);
            continue;
        }
        pc->used = false;
    }
}

/* ---- admission ---- */

/* 0: admitted; 1: answered (refused, or the cookie redirect). */
static int admit(struct pconn *pc, const struct ports_head *h, const struct ports_dest *d)
{
    struct http_server *srv = pc->pp->srv;
    char tok[TOKEN_STR_MAX + 2];
    const char *how = NULL;
    enum token_why why;
    int q;

    /* The same reader as the API's: whatever it takes as the key, the rewrite strips. */
    if (h->authorization.p && cred_is_key(h->authorization.p, h->authorization.n, srv->key))
        return 0;
    /* A public port needs nothing (our token header, query and cookie still go). */
    if (sbx_port_public(srv->t, d->sbx, d->port))
        return 0;
    /* E2B's SDK users reach a port with the sandbox's trafficAccessToken (derived, so
     * it needs the sandbox alive: checked after admission, as for every token). */
    if (h->e2btoken.p) {
        if (srv->token_key_set &&
            token_e2b_check(srv->token_key, "traffic", d->sbx, h->e2btoken.p, h->e2btoken.n))
            return 0;
        pc_fail(pc, 401, "token_invalid",
                PORTS_E2B_TOKEN_HDR " must be this sandbox's trafficAccessToken");
        return 1;
    }
    tok[0] = '\0';
    if (h->xtoken.p) {
        if (h->xtoken.n >= sizeof(tok)) {
            pc_fail(pc, 401, "token_invalid", "the access token is malformed");
            return 1;
        }
        memcpy(tok, h->xtoken.p, h->xtoken.n);
        tok[h->xtoken.n] = '\0';
        how = "header";
    } else if ((q = ports_query_token(d, tok, sizeof(tok))) != 0) {
        if (q < 0) {
            pc_fail(pc, 401, "token_invalid", "the access token is malformed or given twice");
            return 1;
        }
        how = "query";
    } else if ((q = ports_cookie_token(h, tok, sizeof(tok))) != 0) {
        if (q < 0) {
            pc_fail(pc, 401, "token_invalid", "the access token is malformed or given twice");
            return 1;
        }
        how = "cookie";
    }
    if (!how) {
        pc_fail(pc, 401, "unauthorized",
                "sandbox ports need the API key (Authorization: Bearer), or an access token "
                "with the ports scope (X-Warren-Token, ?" PORTS_TOKEN_Q "= or its cookie), or "
                "E2B's E2B-Traffic-Access-Token");
        return 1;
    }
    why = srv->token_key_set ? token_verify(srv->token_key, tok, strlen(tok), d->sbx,
                                            TOKEN_SCOPE_PORTS, (uint64_t)time(NULL), NULL)
                             : TOKEN_BAD_MAC;
    explicit_bzero(tok, sizeof(tok));
    if (why != TOKEN_OK) {
        bool forbidden = why == TOKEN_WRONG_SANDBOX || why == TOKEN_WRONG_SCOPE;
        pc_fail(pc, forbidden ? 403 : 401,
                why == TOKEN_EXPIRED         ? "token_expired"
                : why == TOKEN_WRONG_SANDBOX ? "token_wrong_sandbox"
                : why == TOKEN_WRONG_SCOPE   ? "token_wrong_scope"
                                             : "token_invalid",
                "%s", token_why_str(why));
        return 1;
    }
    if (d->mode == PORTS_HOST && strcmp(how, "query") == 0) {
        /* A browser on a Host-routed URL: keep the token in a cookie, out of the URL. */
        char url[8192];
        long ul = ports_url_without_token(h, url, sizeof(url));
        int n;
        if (ul == -EINVAL) {
            pc_fail(pc, 400, "bad_request",
                    "the path must start with exactly one '/' and hold printable ASCII only");
            return 1;
        }
        ports_query_token(d, tok, sizeof(tok));
        n = snprintf(pc->g2c.p, pc->g2c.cap,
                     "HTTP/1.1 302 Found\r\nLocation: %.*s\r\nSet-Cookie: " PORTS_TOKEN_Q
                     "=%s; HttpOnly; Path=/; SameSite=Lax\r\nContent-Length: 0\r\n"
                     "Connection: close\r\n\r\n",
                     ul > 0 ? (int)ul : 1, ul > 0 ? url : "/", tok);
        explicit_bzero(tok, sizeof(tok));
        pc->g2c.len = n > 0 && (size_t)n < pc->g2c.cap ? (size_t)n : 0;
        pc->answered_err = true;
        ev_timer_set(&pc->tm, LINGER_S, 0);
        ev_timer_start(srv->loop, &pc->tm);
        pc_arm(pc);
        return 1;
    }
    return 0;
}

/* A socket in the VM's namespace, connecting to the guest's port. 0 or -errno. */
static int guest_connect(struct pconn *pc, const char *ns)
{
    struct sockaddr_in a;
    int self, fd, r;

    if ((r = vmm_netns_enter(ns, &self)) != 0)
        return r;
    fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    r = fd < 0 ? -errno : 0;
    vmm_netns_leave(self);
    if (r)
        return r;
    /* A byte proxy passes on what it reads at once: no Nagle delay on top of the
     * endpoints' own (the client side's socket has it off too, http.c). */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &(int){1}, sizeof(int));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)pc->port);
    inet_pton(AF_INET, GUEST_ADDR, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
        r = -errno;
        close(fd);
        return r;
    }
    pc->gfd = fd;
    pc->connecting = true;
    return 0;
}

void ports_take(struct ports *pp, int fd, char *buf, size_t n, size_t cap,
                const struct ports_head *h, int route, const struct ports_dest *d, void *ud)
{
    struct http_server *srv = pp->srv;
    size_t bcap = srv->cfg->port_buf_bytes > HEAD_ROOM ? srv->cfg->port_buf_bytes : HEAD_ROOM;
    char ns[4096];
    struct sbx_err err;
    struct pconn *pc, *o;
    unsigned same = 0, all = 0;
    char *g2c;
    long hl;
    int r;

    (void)cap;
    /* Until it is admitted a connection gets only what an answer needs: a flood of
     * refusals costs little, and counts only against its address (http.c's
     * max_connections_per_client holds it until it closes), never its sandbox. */
    if (!(pc = calloc(1, sizeof(*pc))) || !(pc->g2c.p = malloc(HEAD_ROOM))) {
        free(pc);
        free(buf);
        close(fd);
        http_conn_release(ud);
        return;
    }
    pc->g2c.cap = HEAD_ROOM;
    pc->pp = pp;
    pc->ud = ud;
    pc->cfd = fd;
    pc->gfd = -1;
    pc->last_ms = pc->touched_ms = now_ms();
    ev_io_init(&pc->crd, on_client_read, fd, EV_READ);
    ev_io_init(&pc->cwr, on_client_write, fd, EV_WRITE);
    ev_init(&pc->tm, on_timer);
    pc->next = pp->conns;
    if (pp->conns)
        pp->conns->pprev = &pc->next;
    pp->conns = pc;
    pc->pprev = &pp->conns;

    if (route < 0) {
        if (route == -ENOENT)
            pc_fail(pc, 404, "sandbox_not_found", "no sandbox with that id");
        else
            pc_fail(pc, 400, "bad_port", "a port is a decimal number from 1 to 65535");
        goto out;
    }
    snprintf(pc->sbx, sizeof(pc->sbx), "%s", d->sbx);
    pc->port = d->port;
    if (!srv->cfg->net_enabled) {
        pc_fail(pc, 409, "networking_off",
                "sandbox networking is off (net_enabled in conf/): no ports to reach");
        goto out;
    }
    if (admit(pc, h, d))
        goto out;
    /* Only admitted connections that are proxying count: a refusal or an error answer
     * lingering for its client to close is no sandbox's. */
    for (o = pp->conns; o; o = o->next) {
        if (o == pc || !o->admitted || o->answered_err)
            continue;
        all++;
        same += strcmp(o->sbx, pc->sbx) == 0;
    }
    if (all >= srv->cfg->port_conns || same >= srv->cfg->port_conns_per_sbx) {
        pc_fail(pc, 503, "too_many_connections",
                "too many proxied connections (port_connections, port_connections_per_sandbox "
                "in conf/); retry later");
        goto out;
    }
    if (!(pc->c2g.p = malloc(bcap)) || !(g2c = realloc(pc->g2c.p, bcap))) {
        pc_fail(pc, 503, "out_of_memory", "no memory for the connection's buffers");
        goto out;
    }
    pc->g2c.p = g2c;
    pc->c2g.cap = pc->g2c.cap = bcap;
    pc->admitted = true;
    if ((r = sbx_port_open(srv->t, pc->sbx, ns, sizeof(ns), pc->vm, &err)) != 0) {
        pc_fail(pc, api_status_of(err.code), sbx_err_name(err.code), "%s", err.msg);
        goto out;
    }
    hl = ports_head_rewrite(h, d, srv->key, pc->c2g.p, pc->c2g.cap);
    if (hl < 0) {
        pc_fail(pc, 431, "header_too_large", "the request head is too large to forward");
        goto out;
    }
    pc->c2g.len = (size_t)hl;
    pc->g_head = d->mode == PORTS_PATH;
    if (h->upgrade)
        pc->body = BODY_AWAIT101;
    else if (h->chunked) {
        pc->body = BODY_CHUNKED;
        chunked_init(&pc->ch);
    } else if (h->has_length && h->length) {
        pc->body = BODY_LEN;
        pc->left = h->length;
    } else
        pc->body = BODY_NONE;
    /* Bytes that came with an upgrade's head (a client that did not wait for the 101)
     * go in only once the guest has answered 101. */
    if (n > h->len && pc->body == BODY_AWAIT101) {
        memcpy(pc->c2g.p + pc->c2g.len, buf + h->len, n - h->len);
        pc->c2g.len += n - h->len;
        pc->hold = n - h->len;
    }
    /* Body bytes that came with the head. */
    if (n > h->len && pc->body != BODY_AWAIT101 && pc->body != BODY_NONE) {
        size_t extra = n - h->len;
        memcpy(pc->c2g.p + pc->c2g.len, buf + h->len, extra);
        pc->c2g.len += body_filter(pc, pc->c2g.len, extra);
    }
    if ((r = guest_connect(pc, ns)) != 0) {
        pc_fail(pc, 502, "port_unreachable", "cannot connect to port %u in sandbox %s: %s",
                pc->port, pc->sbx, strerror(-r));
        goto out;
    }
    ev_io_init(&pc->grd, on_guest_read, pc->gfd, EV_READ);
    ev_io_init(&pc->gwr, on_guest_write, pc->gfd, EV_WRITE);
    ev_timer_set(&pc->tm, srv->cfg->port_connect_ms / 1000.0, 0);
    ev_timer_start(srv->loop, &pc->tm);
    pc_arm(pc);
out:
    explicit_bzero(buf, n);
    free(buf);
}

int ports_new(struct http_server *srv, struct ports **out)
{
    struct ports *pp = calloc(1, sizeof(*pp));

    if (!pp)
        return -ENOMEM;
    pp->srv = srv;
    ev_timer_init(&pp->tick, on_tick, TICK_S, TICK_S);
    ev_timer_start(srv->loop, &pp->tick);
    *out = pp;
    return 0;
}

void ports_free(struct ports *pp)
{
    if (!pp)
        return;
    while (pp->conns)
        pc_close(pp->conns);
    ev_timer_stop(pp->srv->loop, &pp->tick);
    free(pp);
}
