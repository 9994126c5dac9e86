/*
 * agent_int.h - state shared by agent.c (loop, channel, session), exec.c
 * (processes) and files.c (file requests). Not a public API.
 *
 * Invariants:
 * - Every stream lives in a->streams until the sweep at the end of a loop
 *   iteration frees it; ending a stream only marks it done (handlers that
 *   still hold it from the same poll round check ->done first).
 * - Producers (pipe reads, file reads, list batches, replies) only append to
 *   the output queue while it is under GI_OUT_HIGH, so the queue is bounded
 *   by GI_OUT_HIGH plus one frame per producer turn.
 * - A process that no longer has a stream (its session ended, or its exec
 *   failed) is remembered as an orphan until it is reaped and its cgroup
 *   removed.
 */
#ifndef WARREN_GI_AGENT_INT_H
#define WARREN_GI_AGENT_INT_H

#include "agent.h"
#include "proto.h"

#include <dirent.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#define GI_EXEC_WATCH       4             /* pollfds one exec may add */
#define GI_OUT_HIGH         (1024 * 1024) /* queued output bytes above which producers pause */
#define GI_IN_CAP           (2 * (PROTO_HDR + PROTO_MAX_FRAME)) /* channel read buffer */
#define GI_MAX_STREAMS      4096
#define GI_MAX_ORPHANS      4096
#define GI_STDIN_CAP        (2 * PROTO_WINDOW) /* host may not exceed its credit; this is slack */
#define GI_LIST_MAX_DEPTH   10
#define GI_LIST_MAX_ENTRIES 100000
#define GI_LIST_BATCH_BYTES (128 * 1024) /* entries per RESULT frame, well under the cap */

void gi_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

enum gi_kind { GI_EXEC, GI_FWRITE, GI_FREAD, GI_LIST };

struct gi_exec {
    pid_t pid;            /* also its session and process group id */
    int rep;              /* child's start report pipe; -1 once it exec'd or failed */
    bool reaped;          /* waitpid() returned it; status is valid */
    int status;           /* wait status */
    int out[2];           /* read ends of stdout, stderr; -1 after EOF */
    uint64_t off[2];      /* bytes sent per output stream */
    uint64_t credit;      /* output bytes the host still accepts (stdout + stderr) */
    int in;               /* write end of stdin; -1 when closed or stdin=false */
    struct proto_buf inq; /* STDIN bytes not yet written to the child */
    bool in_eof;          /* close stdin once inq drains */
    int64_t deadline_ms;  /* CLOCK_MONOTONIC kill time; 0 = none */
    bool timed_out;
    char *cgroup; /* its cgroup directory (owned), or NULL */
};

struct gi_xfer {
    int fd;
    uint64_t off;    /* bytes written (FWRITE) or sent (FREAD) */
    uint64_t credit; /* FREAD: bytes the host still accepts */
    uint64_t size;   /* FREAD: the size announced in RESULT; never send more */
};

struct gi_list {
    DIR *dirs[GI_LIST_MAX_DEPTH]; /* open directories, root first */
    size_t plen[GI_LIST_MAX_DEPTH];
    int ndirs;
    int depth;
    size_t count; /* entries sent so far */
    char path[PATH_MAX];
};

struct gi_stream {
    uint32_t id;
    enum gi_kind kind;
    bool done; /* finished: freed by the sweep, invisible to lookups */
    union {
        struct gi_exec x;
        struct gi_xfer f;
        struct gi_list *l;
    } u;
};

struct gi_orphan {
    pid_t pid;    /* 0 once reaped */
    char *cgroup; /* removed once empty; owned */
};

struct gi_watch {
    struct gi_stream *s;
    int slot; /* exec: 0 stdout, 1 stderr, 2 stdin, 3 start report */
};

struct gi_agent {
    int fd;
    const struct gi_agent_opts *opts;
    int sigfd;
    uint8_t *in; /* GI_IN_CAP bytes */
    size_t in_len;
    struct proto_buf out;
    msgpack_zone zone;
    struct gi_stream **streams;
    size_t nstreams, cap_streams;
    struct gi_orphan *orphans;
    size_t norphans;
    unsigned cg_seq;
    struct pollfd *pfd; /* poll set, rebuilt every iteration */
    struct gi_watch *watch;
    size_t pcap;
    bool hup;    /* host end closed or stream broken: the session must end */
    bool desync; /* pid1: a frame was over the cap; discard input until hang-up */
    char kernel[65];
};

/* agent.c */
int64_t gi_now_ms(void);
bool gi_out_full(const struct gi_agent *a);
struct gi_stream *gi_stream_find(struct gi_agent *a, uint32_t id);
/* Add a stream (zeroed but for id/kind); replies ERROR itself and returns NULL on failure. */
struct gi_stream *gi_stream_new(struct gi_agent *a, uint32_t id, enum gi_kind kind);
void gi_reply_error(struct gi_agent *a, uint32_t id, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void gi_reply_ok(struct gi_agent *a, uint32_t id); /* RESULT {id} */
void gi_orphan_add(struct gi_agent *a, pid_t pid, char *cgroup);

/* exec.c */
void gi_exec_start(struct gi_agent *a, const struct proto_frame *f);
void gi_exec_stdin(struct gi_agent *a, struct gi_stream *s, const struct proto_frame *f);
void gi_exec_signal(struct gi_agent *a, struct gi_stream *s, int sig);
void gi_exec_credit(struct gi_agent *a, struct gi_stream *s, uint64_t n);
int gi_exec_watch(struct gi_agent *a, struct gi_stream *s, struct pollfd *pfd, int *slot);
void gi_exec_event(struct gi_agent *a, struct gi_stream *s, int slot, short revents);
int64_t gi_exec_tick(struct gi_agent *a, struct gi_stream *s, int64_t now);
void gi_exec_reap(struct gi_agent *a);
void gi_exec_abort(struct gi_agent *a, struct gi_stream *s);
void gi_exec_release(struct gi_stream *s);
void gi_orphans_wait(struct gi_agent *a);

/* files.c */
void gi_file_write(struct gi_agent *a, const struct proto_frame *f);
void gi_file_data(struct gi_agent *a, struct gi_stream *s, const struct proto_frame *f);
void gi_file_end(struct gi_agent *a, struct gi_stream *s);
void gi_file_read(struct gi_agent *a, const struct proto_frame *f);
void gi_file_credit(struct gi_stream *s, uint64_t n);
void gi_file_abort(struct gi_agent *a, struct gi_stream *s);
void gi_file_stat(struct gi_agent *a, const struct proto_frame *f);
void gi_file_list(struct gi_agent *a, const struct proto_frame *f);
void gi_file_mkdir(struct gi_agent *a, const struct proto_frame *f);
void gi_file_remove(struct gi_agent *a, const struct proto_frame *f);
void gi_file_rename(struct gi_agent *a, const struct proto_frame *f);
bool gi_file_ready(const struct gi_stream *s);
void gi_file_pump(struct gi_agent *a, struct gi_stream *s);
void gi_file_release(struct gi_stream *s);

#endif
