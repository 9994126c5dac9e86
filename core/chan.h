/*
 * chan.h - host end of a guest channel: framed msgpack over one stream
 * socket (virtio-serial through QEMU's chardev).
 *
 * Reads are decoded into frames and passed to cbs->frame one at a time;
 * the frame (and everything it points to) is valid only during the
 * callback. Writes go through chan_tx(): encode frames into it, then call
 * chan_flush(), which writes what the socket takes now and watches for
 * writability for the rest.
 *
 * Ownership: the chan owns its fd. chan_free() may be called from inside a
 * callback: the struct is then released when the callback returns
 * (deferred), and no further callback is made. cbs->closed is called once
 * when the peer closes, a read/write fails, the peer sends a frame that
 * breaks the protocol, or the send buffer grows past its cap (a peer that
 * does not read: err CHAN_EFULL); the owner then frees the chan. closed is
 * never called from inside chan_flush(): always from the loop.
 */
#ifndef WARREN_CHAN_H
#define WARREN_CHAN_H

#include <errno.h>
#include <stdbool.h>
#include <ev.h>
#include "proto.h"

struct chan;

struct chan_cbs {
    void (*frame)(void *ud, const struct proto_frame *f);
    void (*closed)(void *ud, int err, const char *why);
};

#define CHAN_EFULL      (-ENOBUFS)        /* closed: the peer left tx_max bytes unread */
#define CHAN_TX_MAX_DEF (8 * 1024 * 1024) /* send buffer cap until chan_set_tx_max */

int chan_new(struct ev_loop *loop, int fd, const struct chan_cbs *cbs, void *ud, struct chan **out);
/* Cap the bytes queued and not yet taken by the socket. */
void chan_set_tx_max(struct chan *c, size_t max);
struct proto_buf *chan_tx(struct chan *c);
/* Write what the socket takes now; watch for the rest. Past the cap, the chan is closed
 * (CHAN_EFULL) from the loop, soon after. */
void chan_flush(struct chan *c);
/* Bytes ever queued on c (a mark), and whether the socket has taken every byte before
 * a mark: so a caller can tell a message of its own still sits in the buffer. */
uint64_t chan_tx_mark(const struct chan *c);
bool chan_tx_passed(const struct chan *c, uint64_t mark);
void chan_free(struct chan *c);

#endif
