/*
 * http.h - warrend's REST API: libwebsockets (h1) attached to the
 * application's libev loop as a foreign loop.
 *
 * The server answers /healthz and /v1/... by calling the sandbox table
 * (sbx.h) only. The table's sink callbacks carry the request's own state
 * as their user pointer; a request that goes away cancels its operation
 * (sbx_op_cancel), after which the table never calls back for it.
 *
 * Ownership: the caller owns the loop, the config and the table, which must
 * outlive the server; http_start copies the API key. Callbacks find their
 * server through the lws context's user pointer: no global state.
 */
#ifndef WARREN_HTTP_H
#define WARREN_HTTP_H

#include <ev.h>

struct http_server;
struct srv_config;
struct sbx_table;

/* Create the lws context on loop and start listening on cfg->listen_addr:listen_port.
 * 0; -ENOENT when lws cannot run on libev (evlib plugin missing); -EADDRNOTAVAIL when
 * the address cannot be bound; -EINVAL when cfg->http_timeout_s is 0 (lws would take
 * it as "no timeout"; cfg_defaults sets it); -ENOMEM. The reason is logged. */
int http_start(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table *t,
               const char *api_key, struct http_server **out);

/* Port actually bound (differs from the config when it asked for port 0). */
unsigned http_port(const struct http_server *h);

/* Close every connection and destroy the lws context. Operations still in flight are
 * cancelled before this returns, so the table may be freed right after. */
void http_stop(struct http_server *h);

/* The 32-byte HMAC key of access tokens (state_dir/token_secret), copied. Until it is
 * set, no token is minted or accepted. */
void http_set_token_secret(struct http_server *h, const unsigned char *secret, size_t len);

/* The images' hashes and fill (images_src.h), borrowed until http_stop; NULL is fine. */
struct images_src;
void http_set_images(struct http_server *h, struct images_src *s);

#endif
