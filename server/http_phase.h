/*
 * http_phase.h - one HTTP request's lifecycle (struct pss) as an explicit phase machine.
 *
 *   HEAD --a JSON body is wanted--> BODY --all of it arrived--> RUN
 *   HEAD --a body route with no body to read--> RUN
 *   HEAD, RUN --a guest route on a paused sandbox--> RESUMING --resumed (or not)--> RUN
 *   HEAD, RUN --an operation started--> OP
 *   OP --its answer's head is chosen while it runs (NDJSON, a download)--> STREAM
 *   RESUMING, OP, STREAM --done() or cancelled--> ANSWER (the op is over: the answer,
 *     or the end of the stream, is made)
 *   HEAD, BODY, RUN, ANSWER --the last byte of the answer is queued--> COMPLETE
 *   COMPLETE --written while an upload body is still coming--> LINGER (drain, then close)
 *
 * A request is born HEAD (the pss is zeroed for each head, HEAD is 0) and every later
 * change goes through http_phase_check (resp.c's req_phase applies it, and logs and
 * refuses one the table lacks). An operation is live in RESUMING, OP and STREAM only, so
 * leaving them any other way than through ANSWER would lose an op that still has to be
 * cancelled. Facts orthogonal to the lifecycle (whether the body has all arrived, the
 * chosen framing, keep-alive, reading paused for credit) stay flags of struct pss.
 *
 * Pure functions over the table: no I/O, unit-tested (tests/server/test_http_phase.c).
 */
#ifndef WARREN_HTTP_PHASE_H
#define WARREN_HTTP_PHASE_H

#include <stdbool.h>

enum http_phase {
    HP_HEAD = 0, /* the head arrived: routing and checks; a bodiless request runs here */
    HP_BODY,     /* collecting its JSON body */
    HP_RUN,      /* its args are in hand (body parsed, or the sandbox resumed): it runs */
    HP_RESUMING, /* held while a paused sandbox comes back (the op is the resume's) */
    HP_OP,       /* an operation is live: started, and no done() yet */
    HP_STREAM,   /* ... and its answer streams while it runs (kind says which) */
    HP_ANSWER,   /* the operation is over: its answer is being made */
    HP_COMPLETE, /* the last byte of the answer is queued */
    HP_LINGER,   /* answered: draining the rest of an upload body before closing */
    HP__COUNT
};

/* "head", "body", "run", "resuming", "op", "stream", "answer", "complete", "linger"; "?"
 * out of range. */
const char *http_phase_name(enum http_phase ph);
/* 0 if from -> to is an allowed transition, else -EINVAL (also for a phase out of range). */
int http_phase_check(enum http_phase from, enum http_phase to);

/* A JSON body is being collected: bytes are kept, its end runs the request. */
bool http_phase_collecting(enum http_phase ph);
/* An operation (or the resume before it) is live: it must be cancelled if the request
 * ends now, and its sink's callbacks are for this request. */
bool http_phase_op_live(enum http_phase ph);
/* The request's own operation runs (OP, STREAM): not a resume, so upload bytes may be
 * written to it and its end finished. */
bool http_phase_op_running(enum http_phase ph);
/* The request waits for its sandbox to resume: body bytes are held, not written. */
bool http_phase_resuming(enum http_phase ph);
/* The last byte of the answer is queued (COMPLETE, LINGER). */
bool http_phase_complete(enum http_phase ph);
/* Answered, and draining an upload body before closing. */
bool http_phase_lingering(enum http_phase ph);

#endif
