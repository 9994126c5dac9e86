/*
 * e2b_api.h - E2B's control plane on warrend's listener, so the unmodified E2B
 * SDKs create and manage Warren sandboxes (docs/API.md "E2B's control plane";
 * the wire: shared/clients/E2B-WIRE.md).
 *
 * A codec over the sandbox core (sbx.h, sbx_snap.h): E2B's JSON in, the core's
 * calls, the core's records out as E2B's JSON. Nothing here keeps state of its
 * own: list pages are cut from the core's list on every call, and the
 * per-sandbox tokens are derived (token_e2b), never stored.
 *
 * Paths are E2B's own (/sandboxes, /v2/sandboxes, /snapshots, /templates/{id}):
 * none collides with Warren's /v1 routes. Auth is the X-API-KEY header
 * (cred_is_e2b_key) or Warren's Authorization: Bearer; errors are E2B's
 * {"code": status, "message": ...}.
 *
 * The pure part (route matching, query values) is declared first and unit-
 * tested (e2b_wire.c, tests/server/test_e2b.c); the handlers (e2b_api.c) run on
 * rest.c's struct pss.
 */
#ifndef WARREN_E2B_API_H
#define WARREN_E2B_API_H

#include <stdbool.h>
#include <stddef.h>
#include <jansson.h>

#include "api.h"

/* The envd version create and info report. The SDK gates features on it: 0.1.4
 * recursive watch, 0.1.5/0.2.4 metrics, 0.3.0 stdin:false, 0.4.0 no default user,
 * 0.5.2 CloseStdin, 0.5.7 octet-stream uploads; 0.6.2 file metadata and later gates
 * are not served, so this is the lowest version whose gates are all served. */
#define E2B_ENVD_VERSION "0.5.7"
#define E2B_PAGE_MAX     1000 /* most items of one list page (the Python SDK asks 1000) */
#define E2B_PAGE_DEFAULT 100

enum e2b_route {
    E2B_R_NONE = 0,
    E2B_R_ERROR,        /* an E2B path refused before it was routed (auth, method) */
    E2B_R_CREATE,       /* POST /sandboxes, POST /v2/sandboxes */
    E2B_R_LIST_V1,      /* GET /sandboxes */
    E2B_R_LIST,         /* GET /v2/sandboxes */
    E2B_R_INFO,         /* GET /sandboxes/{id} */
    E2B_R_KILL,         /* DELETE /sandboxes/{id} */
    E2B_R_TIMEOUT,      /* POST /sandboxes/{id}/timeout */
    E2B_R_PAUSE,        /* POST /sandboxes/{id}/pause */
    E2B_R_CONNECT,      /* POST /sandboxes/{id}/connect, /v2/sandboxes/{id}/connect */
    E2B_R_RESUME,       /* POST /sandboxes/{id}/resume */
    E2B_R_FORK,         /* POST /sandboxes/{id}/fork */
    E2B_R_SNAPSHOT,     /* POST /sandboxes/{id}/snapshots */
    E2B_R_SNAPSHOTS,    /* GET /snapshots */
    E2B_R_TEMPLATE_DEL, /* DELETE /templates/{id} (a snapshot) */
    E2B_R_NETWORK,      /* PUT /sandboxes/{id}/network */
    E2B_R_METRICS,      /* GET /sandboxes/{id}/metrics */
    E2B_R_METRICS_MANY, /* GET /sandboxes/metrics */
};

struct e2b_match {
    enum e2b_route route;
    bool body;               /* takes a JSON body */
    bool disk;               /* fills the server's disk (min_free_disk_mb applies) */
    bool created;            /* a success is 201 */
    char id[API_ID_MAX + 1]; /* {id}, or "" */
};

/* Route a decoded path and a method (api.h API_*). 0; -ENOENT when the path is not
 * one of E2B's (the caller goes on with its own routes); -ENOTSUP when it is but the
 * method is not (405); -EINVAL when its {id} is malformed (404). */
int e2b_route_match(const char *path, unsigned method, struct e2b_match *m);

/* Decoded query fragments ("name=value") as an object of strings in *out; a repeated
 * name's values are joined with ',' (E2B's arrays come repeated, or comma-joined). 0,
 * -EINVAL (a name or value that is not UTF-8) or -ENOMEM. */
int e2b_query_args(const char *const *frags, size_t n, json_t **out);

/* E2B's metadata filter value ("k=v&k2=v2", each part form-encoded) as an object of
 * strings in *out. 0, or -EINVAL (a part without '=', a bad %-escape, too many). */
int e2b_metadata_filter(const char *s, json_t **out);

struct pss;
/* Run an E2B request whose args (its JSON body, or e2b_query_args) are all there. */
void e2b_handle(struct pss *p, json_t *args);
/* The X-API-KEY header (or Authorization: Bearer) holds the key: 0, or -EACCES with *e. */
int e2b_authorize(struct pss *p, struct api_err *e);
/* An error answer in E2B's shape: {"code": status, "message": ...} from Warren's
 * {"error": {"code", "message"}} body (consumed); a new reference. */
json_t *e2b_error_body(int status, json_t *warren_err);

#endif
