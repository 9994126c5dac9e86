/*
 * procs.h - what a guest says about its background processes and PTYs,
 * checked and turned into the JSON clients see.
 *
 * The guest keeps the processes (and their output rings) itself, so the
 * host asks it (PLIST) whenever a client lists them, and after a restart
 * there is nothing to rebuild. Its answer is untrusted: every entry is
 * checked here (pid range, offsets, sizes, signals, strings) before any of
 * it reaches a client, and a bad entry is a protocol violation, said in
 * why. Strings that are not UTF-8 (a command line can hold any bytes) are
 * shown with '?' for each byte outside ASCII.
 *
 * Pure: no I/O, no loop. ops.c calls it; tests/server/test_procs.c tests it
 * and tests/fuzz/fuzz_gstream.c feeds it whole guest frame sequences.
 * Ownership: *out is a new reference for the caller.
 */
#ifndef WARREN_PROCS_H
#define WARREN_PROCS_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>
#include <msgpack.h>

#define PROCS_PID_MAX  4194304      /* Linux's PID_MAX_LIMIT */
#define PROCS_SIZE_MAX 10000        /* most PTY columns or rows */
#define PROCS_OFF_MAX  (1ULL << 53) /* offsets stay exact in every JSON client */
#define PROCS_CMD_MAX  4096         /* longest command line shown (the guest cuts at 1024) */
#define PROCS_TAG_MAX  256          /* longest tag (the host accepted no longer) */

/*
 * procs: the array of a PLIST RESULT. max: the most entries the host allows
 * (max_processes_per_sandbox). 0 and {"processes":[...]} in *out, or -EPROTO
 * with why (cap bytes) saying what was wrong.
 */
int procs_list_json(const msgpack_object_array *procs, unsigned max, json_t **out, char *why,
                    size_t cap);

/* A string as JSON, '?' for each non-ASCII byte when it is not valid UTF-8. NULL: no memory. */
json_t *procs_json_text(const char *p, size_t n);

#endif
