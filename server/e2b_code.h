/*
 * e2b_code.h - E2B's code interpreter (port 49999) on the envd door
 * (envd.c): routes, the /execute body, and the request's steps.
 */
#ifndef WARREN_E2B_CODE_H
#define WARREN_E2B_CODE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "api.h"

struct pss;

enum e2b_code_route {
    E2B_CODE_NONE = 0,
    E2B_CODE_BAD_ID, /* /contexts/{id} with an id no context can have */
    E2B_CODE_HEALTH,
    E2B_CODE_EXECUTE,
    E2B_CODE_CREATE,
    E2B_CODE_LIST,
    E2B_CODE_RESTART,
    E2B_CODE_DELETE,
};

/* Pure: the route of path uri (no query) and method (API_GET...), with the context id
 * of /contexts/{id} in ctx. *status: 0, or 404/405 to answer. */
enum e2b_code_route e2b_code_route_of(const char *uri, unsigned method, char ctx[API_ID_MAX + 1],
                                      int *status);
/* Pure: POST /execute's body as the run body klink_run_req takes. 0 and *run (new), or
 * the HTTP status to answer with msg (cap bytes) filled. */
int e2b_code_exec_body(json_t *body, json_t **run, char *msg, size_t cap);

/* Pure: POST /contexts's body {language?, cwd?} as context_create's fields for
 * klink_context_req. 0 and *args (new), or the status with msg filled. */
int e2b_code_create_body(json_t *body, json_t **args, char *msg, size_t cap);

/* An admitted port-49999 request head for p->sbx: *route set first (a request without
 * a body runs before this returns), then 0 when its body is being read or it ran, or
 * -1 answered. */
int e2b_code_request(struct pss *p, const char *uri, int has_cl, uint64_t cl,
                     enum e2b_code_route *route);
/* Its whole body arrived (p->body): parsed, then run through envd_run. */
void e2b_code_body(struct pss *p);
/* Run route r with its parsed body (after a resume too). */
void e2b_code_run(struct pss *p, enum e2b_code_route r, json_t *body);
/* The request ends: a run whose client left is interrupted. */
void e2b_code_end(struct pss *p);

#endif
