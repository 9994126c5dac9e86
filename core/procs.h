/*
 * procs.h - what a guest says about its background processes and PTYs,
 * checked and turned into records (sbx.h struct sbx_proc_rec).
 *
 * The guest keeps the processes (and their output rings) itself, so the
 * host asks it (PLIST) whenever a client lists them, and after a restart
 * there is nothing to rebuild. Its answer is untrusted: every entry is
 * checked here (pid range, offsets, sizes, signals, strings) before any of
 * it reaches a client, and a bad entry is a protocol violation, said in
 * why. Strings stay bytes (a command line can hold any): the doors make them
 * text.
 *
 * Pure: no I/O, no loop. ops_proc.c calls it; tests/core/test_procs.c tests
 * it and tests/fuzz/fuzz_gstream.c feeds it whole guest frame sequences.
 * Ownership: *out is the caller's to free(); its strings point into procs.
 */
#ifndef WARREN_PROCS_H
#define WARREN_PROCS_H

#include <stddef.h>
#include <stdint.h>
#include <msgpack.h>

#include "sbx.h"

#define PROCS_PID_MAX  4194304      /* Linux's PID_MAX_LIMIT */
#define PROCS_SIZE_MAX 10000        /* most PTY columns or rows */
#define PROCS_OFF_MAX  (1ULL << 53) /* offsets stay exact in every JSON client */
#define PROCS_CMD_MAX  4096         /* longest command line shown (the guest cuts at 1024) */

/*
 * procs: the array of a PLIST RESULT. max: the most entries the host allows
 * (max_processes_per_sandbox). 0 and *n records in *out, or -EPROTO with why
 * (cap bytes) saying what was wrong, or -ENOMEM.
 */
int procs_list(const msgpack_object_array *procs, unsigned max, struct sbx_proc_rec **out,
               size_t *n, char *why, size_t cap);

#endif
