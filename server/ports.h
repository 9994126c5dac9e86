/*
 * ports.h - the port proxy: a process listening in a sandbox, reachable
 * through warrend (docs/NETWORK.md "Inbound", docs/API.md "Ports").
 *
 * http.c accepts every connection itself and reads its first request head;
 * one for a sandbox port (ports_head.h: path /v1/sandboxes/{id}/ports/{port}
 * or Host {port}-{id}.{port_domain}) is handed here with the bytes read.
 * The proxy admits it (API key, a token with the "ports" scope, or none for
 * a public port), connects from inside the VM's network namespace to the
 * guest's 10.0.2.2:{port}, sends the rewritten head (credentials removed,
 * "Connection: close" or "Connection: Upgrade") and then moves bytes both
 * ways through one bounded buffer per direction: a side is not read while
 * the buffer towards the other is full. One request per connection: after
 * the first request's body no more client bytes reach the guest (a later
 * request could carry credentials nobody stripped) unless the guest
 * answered 101 (WebSocket and other upgrades), after which the connection is
 * spliced both ways until both sides have closed.
 *
 * Ownership: struct ports is the HTTP server's (ports_new/ports_free). Each
 * connection is the proxy's from ports_take until it closes it, then it
 * calls http_conn_release(ud). Sandboxes are named by id and VM id, never
 * pointed to: a tick closes the connections of a sandbox that went.
 */
#ifndef WARREN_PORTS_H
#define WARREN_PORTS_H

#include <stddef.h>

#include "ports_head.h"

struct http_server;
struct ports;

int ports_new(struct http_server *srv, struct ports **out);
/* Close every proxied connection (each released), free. NULL: no-op. */
void ports_free(struct ports *pp);
/* Take connection fd, whose first cap-byte buffer buf (malloc'd, taken) holds n
 * bytes: a head h that ports_route gave route (> 0 with d filled, or < 0) for. */
void ports_take(struct ports *pp, int fd, char *buf, size_t n, size_t cap,
                const struct ports_head *h, int route, const struct ports_dest *d, void *ud);

#endif
