/*
 * peers_dns.h - a fleet's peers from DNS (conf `peers_dns = name:port`).
 *
 * A Kubernetes headless Service's name resolves to the addresses of its ready
 * pods: every one of them but this host is a peer on that port. The name is
 * resolved at start and every interval, each time on a thread of its own (a
 * resolver may wait seconds on a server; the event loop never does), and the
 * answer, less this host's own addresses, joins the static `peers` to make the
 * list that lists fan out to. A failed resolution keeps the last good list and
 * is logged once, until a resolution succeeds again.
 */
#ifndef WARREN_PEERS_DNS_H
#define WARREN_PEERS_DNS_H

#include <ev.h>
#include <sys/socket.h>

#include "fanout.h"

#define PEERS_DNS_HOST_MAX 253 /* a DNS name's longest text */

/* Split spec "name:port" (port 1-65535, the name a host name, no scheme or path).
 * 0, or -EINVAL with a message in err. */
int peers_dns_spec(const char *spec, char host[PEERS_DNS_HOST_MAX + 1], char port[6], char *err,
                   size_t errcap);

/* Keep those of the n addresses a[] whose IP is none of the nself addresses self[] (ports
 * are not compared: an address of this host is this host). The kept stay in order at the
 * front; their number is returned. */
unsigned peers_dns_drop_self(struct sockaddr_storage *a, unsigned n,
                             const struct sockaddr_storage *self, unsigned nself);

struct peers_dns;

/* Resolve spec now and every interval_s seconds; each new list (the peers *slot held at
 * start, then the resolved addresses) replaces *slot, freeing the one it held. *slot
 * must stay valid until peers_dns_stop. 0 and *out, or -errno (message in err). */
int peers_dns_start(struct ev_loop *loop, const char *spec, unsigned interval_s,
                    struct fanout_peers **slot, struct peers_dns **out, char *err, size_t errcap);
/* Stop; waits for a resolution in flight (the resolver's own timeout bounds it). NULL is
 * fine. */
void peers_dns_stop(struct peers_dns *d);

#endif
