/*
 * ws_session.h - the agent socket "warren.session.v1" (docs/API.md "Agent socket"):
 * GET /v1/sandboxes/{id}/session upgraded to a WebSocket whose messages are msgpack
 * maps (session_frame.h), each request carrying an id, many in flight at once, each
 * one an operation of the sandbox table (sbx.h).
 *
 * Ownership: lws owns the per-socket struct (per_session_data); each request is
 * malloc'd by this file and is the user pointer of its op's sink; the socket closing
 * cancels every op in flight (sbx_op_cancel: no callback after it) and frees them. A
 * sandbox never belongs to a socket: processes started on one outlive it and are
 * re-attached by pid from an offset.
 */
#ifndef WARREN_WS_SESSION_H
#define WARREN_WS_SESSION_H

#include <libwebsockets.h>

/* The protocol entry for the ONE protocols array in http.c. */
extern const struct lws_protocols ws_session_protocol;

/* LWS_CALLBACK_HTTP_CONFIRM_UPGRADE on the HTTP protocol: WS_NOT_MINE when the request
 * is not for the agent socket (neither its path nor its protocol), 0 to let the upgrade
 * go on, or 1 once it was refused with a JSON error answer (auth, unknown sandbox,
 * limits, path/protocol mismatch). */
#define WS_NOT_MINE 2
int ws_session_confirm(struct lws *wsi);

#endif
