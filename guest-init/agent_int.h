/*
 * agent_int.h - state shared by agent.c (loop, channel, session), exec.c
 * (processes), proc.c (background processes, PTYs, attach) and files.c
 * (file requests). Not a public API.
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
 * - Background processes (a->procs) belong to no stream: their output is
 *   always read into their ring, whatever the queue or any credit; only
 *   attach readers, which are streams, are paced. Entries are freed by the
 *   same sweep (gi_proc_sweep) once marked gone.
 */
#ifndef WARREN_GI_AGENT_INT_H
#define WARREN_GI_AGENT_INT_H

#include "agent.h"
#include "proto.h"
#include "ring.h"

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
#define GI_CG_POOL          2 /* exec cgroups made ahead: back-to-back execs rarely need more */
/* After a read of a PTY master the next waits a while (us), adapted to how much the
 * last one found: see proc.c. */
#define GI_PTY_HOLD_US      250 /* the first, and the first after a quiet spell */
#define GI_PTY_HOLD_MIN_US  100
#define GI_PTY_HOLD_MAX_US  1000
#define GI_PTY_HOLD_QUIET   5000          /* unread this long after its hold ended: a quiet spell */
#define GI_PTY_HOLD_BYTES   10240         /* what a hold aims at: the tty holds only ~12 KiB */
#define GI_LIST_BATCH_BYTES (128 * 1024)  /* entries per RESULT frame, well under the cap */
#define GI_RING_DEFAULT     (1024 * 1024) /* INIT without `ring` */
#define GI_PROCS_DEFAULT    64            /* INIT without `max_procs` */
/* Most background processes: a PLIST RESULT of this many entries, each with a full tag
 * (PROTO_TAG_MAX) and command (PROTO_CMD_SHOWN) and ~200 bytes of keys, fits one frame. */
#define GI_PROCS_MAX 128

void gi_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

enum gi_kind { GI_EXEC, GI_FWRITE, GI_FREAD, GI_LIST, GI_ATTACH };

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

/*
 * A background process or PTY (EXEC with bg or cols+rows). It belongs to no
 * stream: its output is always read into its ring (never paced by credit),
 * and it survives INIT. Kept after exit until evicted (max_procs), so its
 * output and status can still be read. Freed by the sweep once `gone`.
 */
struct gi_proc {
    pid_t pid;         /* also its session and process group id */
    uint32_t start_id; /* EXEC stream awaiting RESULT{pid} or ERROR; 0 once answered */
    int rep;           /* start report pipe; -1 once settled */
    int out[2];        /* stdout, stderr read ends (a PTY: out[0] is the master) */
    int in;            /* stdin write end (a PTY: the master again); -1 when closed */
    bool pty;
    bool reaped;
    bool gone; /* evicted or failed to start: freed by the sweep */
    int status;
    uint16_t cols, rows;
    struct proto_buf inq; /* PCTL bytes not yet written */
    bool in_eof;          /* close stdin once inq drains */
    bool in_closed;       /* stdin was closed (eof, EPIPE, or the process ended) */
    struct gi_ring ring;
    char *tag, *cmd;     /* owned; tag may be NULL */
    char *cgroup;        /* owned until it exits, then handed to the orphan list */
    uint64_t started_ms; /* CLOCK_REALTIME */
    uint64_t seq;        /* start order: the oldest exited entry is evicted first */
    int64_t hold_us;     /* a PTY: its master is not read again before this (gi_now_us) */
    int32_t hold_len;    /* a PTY: the length of its last hold, us */
};

struct gi_attach {
    pid_t pid;
    uint64_t pos;    /* next ring offset to deliver */
    uint64_t credit; /* data bytes the host still accepts */
    bool follow;
};

struct gi_stream {
    uint32_t id;
    enum gi_kind kind;
    bool done; /* finished: freed by the sweep, invisible to lookups */
    union {
        struct gi_exec x;
        struct gi_xfer f;
        struct gi_list *l;
        struct gi_attach t;
    } u;
};

struct gi_orphan {
    pid_t pid;    /* 0 once reaped */
    char *cgroup; /* removed once empty; owned */
};

struct gi_watch {
    struct gi_stream *s; /* an exec, or NULL for a background process */
    struct gi_proc *p;
    int slot; /* 0 stdout, 1 stderr, 2 stdin, 3 start report */
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
    struct gi_proc **procs; /* background processes and PTYs */
    size_t nprocs, cap_procs;
    uint64_t proc_seq;
    uint64_t ring_cap;    /* ring of processes started from now on (INIT `ring`) */
    size_t max_procs;     /* INIT `max_procs`, clamped to GI_PROCS_MAX */
    bool boot_id_mounted; /* RESYNC bind-mounted its boot id file over the proc one */
    int urandom_fd;       /* /dev/urandom for INIT and RESYNC entropy, opened once (-1) */
    struct gi_orphan *orphans;
    size_t norphans;
    unsigned cg_seq;
    /* Exec cgroups made ahead (pids.max set), taken by the next execs: mkdir is slow
     * (percpu allocations for every controller) and is kept off the exec's path. */
    struct gi_cg {
        char *path; /* owned */
        int fd;     /* the directory, for clone3(CLONE_INTO_CGROUP) */
    } cg_pool[GI_CG_POOL];
    size_t cg_npool;
    bool cg_tidy;       /* something was reaped or finished: try removing orphan cgroups */
    struct pollfd *pfd; /* poll set, rebuilt every iteration */
    struct gi_watch *watch;
    size_t pcap;
    bool hup;    /* host end closed or stream broken: the session must end */
    bool desync; /* pid1: a frame was over the cap; discard input until hang-up */
    char kernel[65];
};

/* agent.c */
int64_t gi_now_ms(void);
int64_t gi_now_us(void); /* CLOCK_MONOTONIC */
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
/* Between loop turns, after output was flushed: remove empty cgroups of finished execs and
 * refill the cgroup pool, off any exec's path. */
void gi_exec_idle(struct gi_agent *a);

/* exec.c: shared with proc.c */
struct gi_spawn {
    pid_t pid;
    int rep, out[2], in;
    char *cgroup;
    char *cmd; /* argv joined by spaces, for PLIST (owned) */
};
/* Fork the process an EXEC frame asks for, with a PTY of cols x rows when pty. Returns 0 or
 * -errno (then nothing is left over). Start failures come later through sp->rep. */
int gi_spawn(struct gi_agent *a, const struct proto_frame *f, bool pty, uint16_t cols,
             uint16_t rows, struct gi_spawn *sp);
/* Read a start report pipe: 1 still starting, 0 started, -errno failed (msg says what). */
int gi_start_report(int fd, char *msg, size_t cap);
int gi_cg_write(const char *dir, const char *file, const char *val);

/* proc.c */
void gi_proc_start(struct gi_agent *a, const struct proto_frame *f);
void gi_proc_attach(struct gi_agent *a, const struct proto_frame *f);
void gi_proc_detach(struct gi_agent *a, uint32_t id);
void gi_proc_list(struct gi_agent *a, const struct proto_frame *f);
void gi_proc_ctl(struct gi_agent *a, const struct proto_frame *f);
/* A PTY's next hold (us) after a read of got bytes that followed a hold of last. */
int32_t gi_pty_hold_next(int32_t last, size_t got);
/* Its fds to poll. A PTY master still in its hold (read less than a hold ago) is left
 * out, and *hold (0 otherwise) says until when (gi_now_us). */
int gi_proc_watch(struct gi_agent *a, struct gi_proc *p, struct pollfd *pfd, int *slot,
                  int64_t now_us, int64_t *hold);
void gi_proc_event(struct gi_agent *a, struct gi_proc *p, int slot, short revents);
/* A child was reaped: true if it was a background process. */
bool gi_proc_reaped(struct gi_agent *a, pid_t pid, int status);
void gi_proc_reap_own(struct gi_agent *a);    /* !pid1: waitpid our background processes */
void gi_proc_session_end(struct gi_agent *a); /* INIT/hang-up: forget pending start replies */
void gi_proc_kill_all(struct gi_agent *a);    /* the agent returns: nothing may outlive it */
void gi_proc_sweep(struct gi_agent *a);
void gi_proc_free_all(struct gi_agent *a);
bool gi_attach_ready(struct gi_agent *a, const struct gi_stream *s);
void gi_attach_pump(struct gi_agent *a, struct gi_stream *s);
void gi_attach_credit(struct gi_stream *s, uint64_t n);

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
