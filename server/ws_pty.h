/*
 * ws_pty.h - the PTY WebSocket ("warren.pty.v1"): a browser terminal or any
 * client attached to a sandbox's PTY, on the REST server's lws context and
 * libev loop. Frames: ws_pty_frame.h; the protocol: docs/API.md.
 *
 *   GET /v1/sandboxes/{id}/pty?cols=&rows=&cmd=&cwd=   a new PTY, attached from 0
 *   GET /v1/sandboxes/{id}/pty/{pid}?offset=N          attach to an existing one
 *
 * Each socket is one sbx_proc_output(follow) reader of its process, so
 * viewers fan out in the guest. The socket's state (struct wpty) belongs to
 * lws (per_session_data); every sandbox op it starts is cancelled when the
 * socket closes, so no callback reaches freed state.
 */
#ifndef WARREN_WS_PTY_H
#define WARREN_WS_PTY_H

#include <stdbool.h>
#include <libwebsockets.h>

struct http_server;

/* The entry of server/http.c's protocols array. */
extern const struct lws_protocols ws_pty_protocol;

/* The request (an upgrade, headers still bound) names a PTY route. */
bool ws_pty_route(struct lws *wsi);
/* HTTP_CONFIRM_UPGRADE of a PTY route: protocol, auth, sandbox and limits checked before
 * the upgrade. 0 lets it proceed; 1 means it was refused with a JSON error answer. */
int ws_pty_confirm(struct http_server *srv, struct lws *wsi);

#endif
