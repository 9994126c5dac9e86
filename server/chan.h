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
 * when the peer closes, a read/write fails or the peer sends a frame that
 * breaks the protocol; the owner then frees the chan.
 */
#ifndef WARREN_CHAN_H
#define WARREN_CHAN_H

#include <ev.h>
#include "proto.h"

struct chan;

struct chan_cbs {
    void (*frame)(void *ud, const struct proto_frame *f);
    void (*closed)(void *ud, int err, const char *why);
};

int chan_new(struct ev_loop *loop, int fd, const struct chan_cbs *cbs, void *ud, struct chan **out);
struct proto_buf *chan_tx(struct chan *c);
void chan_flush(struct chan *c);
void chan_free(struct chan *c);

#endif
