/*
 * fake_sbx.h - what the fake sandbox table (fake_sbx.c) lets a test see.
 *
 * fake_sbx.c implements core/sbx.h without VMs so the HTTP layer can be
 * driven on its own: sandboxes are records, exec and file reads produce
 * scripted output with credit-based flow control, uploads are checked and
 * dropped. Counters below tell a test what the HTTP layer did to it.
 */
#ifndef WARREN_FAKE_SBX_H
#define WARREN_FAKE_SBX_H

#include <stdbool.h>
#include <stdint.h>
#include <jansson.h>

/* The process that misbehaves (fake_sbx.c). */
#define FAKE_PID_LOSSY 777

struct fake_stats {
    unsigned ops_live;       /* operations started and not yet done or drained after a cancel */
    unsigned cancels;        /* sbx_op_cancel on a live operation */
    unsigned misuse;         /* calls the contract forbids (write after finish, ...) */
    uint64_t upload_bytes;   /* bytes taken by the last upload */
    bool upload_ok;          /* its content matched the expected pattern */
    uint64_t max_unconsumed; /* most streamed bytes ever awaiting sbx_op_consumed */
    unsigned upload_stalls;  /* times sbx_op_write took less than offered */
    uint64_t write_calls;    /* sbx_op_write calls and bytes offered, all uploads */
    uint64_t write_bytes;
    char list_state[16]; /* the last sbx_list's state ("" for none) */
    json_t *list_filter; /* and its metadata filter, as an object */
    /* The last sbx_file_op's request: its kind (enum sbx_file_kind), path ("" for
     * none), to, depth (SBX_UNSET when not given) and recursive. */
    int file_kind;
    char file_path[256], file_to[256];
    int64_t file_depth;
    bool file_recursive;
};

extern struct fake_stats fake_stats;
/* How long a create of template "slow" takes to answer, in ms (5000 unless set). */
extern unsigned fake_slow_ms;

/* Bytes of the fake's file and upload pattern at offset i. */
static inline unsigned char fake_pattern(uint64_t i)
{
    return (unsigned char)((i * 7) ^ (i >> 10));
}

#endif
