/* chan.c - framed channel to a guest (see chan.h). */
#include "chan.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct chan {
    struct ev_loop *loop;
    int fd;
    ev_io rio, wio;
    struct chan_cbs cbs;
    void *ud;
    struct proto_buf rx, tx;
    msgpack_zone zone;
    int in_cb;   /* >0 while a callback runs: freeing is deferred */
    int dead;    /* freed or closed: make no further callback */
    int freeing; /* chan_free() called during a callback */
    int full;    /* the send buffer passed tx_max: close from the loop */
    size_t tx_max;
    uint64_t tx_sent; /* bytes the socket took, ever */
};

static void release(struct chan *c)
{
    ev_io_stop(c->loop, &c->rio);
    ev_io_stop(c->loop, &c->wio);
    if (c->fd >= 0)
        close(c->fd);
    proto_buf_free(&c->rx);
    proto_buf_free(&c->tx);
    msgpack_zone_destroy(&c->zone);
    free(c);
}

static void fail(struct chan *c, int err, const char *why)
{
    if (c->dead)
        return;
    c->dead = 1;
    ev_io_stop(c->loop, &c->rio);
    ev_io_stop(c->loop, &c->wio);
    c->in_cb++;
    c->cbs.closed(c->ud, err, why);
    c->in_cb--;
}

/* Decode and deliver every whole frame in rx. Returns -1 if the chan died. */
static int dispatch(struct chan *c)
{
    while (!c->dead) {
        const uint8_t *pl;
        size_t pl_len, used;
        struct proto_frame f;
        int r =
            proto_frame_split(c->rx.p + c->rx.off, proto_buf_pending(&c->rx), &pl, &pl_len, &used);
        if (r == PROTO_EAGAIN)
            return 0;
        if (r != 0) {
            fail(c, r, proto_strerror(r));
            return -1;
        }
        r = proto_decode(pl, pl_len, &c->zone, &f);
        if (r != 0) {
            /* A well-framed but invalid frame: the stream is still in sync, but a guest
             * that sends garbage is broken or hostile; stop talking to it. */
            fail(c, r, proto_strerror(r));
            return -1;
        }
        c->in_cb++;
        c->cbs.frame(c->ud, &f);
        c->in_cb--;
        msgpack_zone_clear(&c->zone);
        proto_buf_consume(&c->rx, used);
    }
    return -1;
}

static void on_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct chan *c = w->data;
    uint8_t tmp[64 * 1024];

    /* Bounded work per wake-up so one busy guest cannot starve the loop. */
    for (int rounds = 0; rounds < 16 && !c->dead; rounds++) {
        ssize_t n = read(c->fd, tmp, sizeof(tmp));
        if (n == 0) {
            fail(c, 0, "guest channel closed");
            break;
        }
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                fail(c, -errno, strerror(errno));
            break;
        }
        if (proto_buf_append(&c->rx, tmp, (size_t)n) != 0) {
            fail(c, -ENOMEM, "out of memory");
            break;
        }
        c->in_cb++;
        dispatch(c);
        c->in_cb--;
        if ((size_t)n < sizeof(tmp))
            break;
    }
    if (c->freeing && c->in_cb == 0)
        release(c);
}

/* Write what the socket takes. 0 when done or waiting for writability, else -errno. */
static int try_write(struct chan *c)
{
    while (proto_buf_pending(&c->tx) > 0) {
        ssize_t n = write(c->fd, c->tx.p + c->tx.off, proto_buf_pending(&c->tx));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                ev_io_start(c->loop, &c->wio);
                return 0;
            }
            return -errno;
        }
        proto_buf_consume(&c->tx, (size_t)n);
        c->tx_sent += (uint64_t)n;
    }
    ev_io_stop(c->loop, &c->wio);
    return 0;
}

static void on_write(struct ev_loop *loop, ev_io *w, int revents)
{
    struct chan *c = w->data;
    int r = c->full ? CHAN_EFULL : try_write(c);

    if (r == CHAN_EFULL)
        fail(c, r, "the guest is not reading its channel (send buffer full)");
    else if (r < 0)
        fail(c, r, strerror(-r));
    if (c->freeing && c->in_cb == 0)
        release(c);
}

int chan_new(struct ev_loop *loop, int fd, const struct chan_cbs *cbs, void *ud, struct chan **out)
{
    struct chan *c = calloc(1, sizeof(*c));

    if (!c)
        return -ENOMEM;
    c->loop = loop;
    c->fd = fd;
    c->cbs = *cbs;
    c->ud = ud;
    c->tx_max = CHAN_TX_MAX_DEF;
    proto_buf_init(&c->rx);
    proto_buf_init(&c->tx);
    if (!msgpack_zone_init(&c->zone, 4096)) {
        free(c);
        return -ENOMEM;
    }
    ev_io_init(&c->rio, on_read, fd, EV_READ);
    ev_io_init(&c->wio, on_write, fd, EV_WRITE);
    c->rio.data = c->wio.data = c;
    ev_io_start(loop, &c->rio);
    *out = c;
    return 0;
}

struct proto_buf *chan_tx(struct chan *c)
{
    return &c->tx;
}

void chan_set_tx_max(struct chan *c, size_t max)
{
    c->tx_max = max;
}

void chan_flush(struct chan *c)
{
    if (c->dead || c->full)
        return;
    if (!ev_is_active(&c->wio) && try_write(c) < 0) {
        /* A write error is reported from the loop (the write watcher sees it again),
         * never from inside the caller's call. */
        ev_io_start(c->loop, &c->wio);
        return;
    }
    /* A peer that never reads would grow the buffer without end (a guest answering every
     * INIT with HELLO{id:0} and reading nothing did). The write watcher may never fire
     * for such a peer, so the close is fed to the loop as an event of its own. */
    if (proto_buf_pending(&c->tx) > c->tx_max) {
        c->full = 1;
        ev_feed_event(c->loop, &c->wio, EV_WRITE);
    }
}

uint64_t chan_tx_mark(const struct chan *c)
{
    return c->tx_sent + proto_buf_pending(&c->tx);
}

bool chan_tx_passed(const struct chan *c, uint64_t mark)
{
    return c->tx_sent >= mark;
}

void chan_free(struct chan *c)
{
    if (!c)
        return;
    c->dead = 1;
    if (c->in_cb > 0) {
        c->freeing = 1;
        ev_io_stop(c->loop, &c->rio);
        ev_io_stop(c->loop, &c->wio);
        return;
    }
    release(c);
}
