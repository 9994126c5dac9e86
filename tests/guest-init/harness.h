/*
 * harness.h - drive gi_agent_run() in a forked child over a socketpair,
 * the way the host drives the guest: frames are encoded and decoded with
 * proto.h, the socket is non-blocking and the test reads while it writes
 * (a blocking writer that never reads can deadlock against the agent's
 * bounded queues, exactly like a real host would).
 *
 * Every received frame is folded into res[id]; tests wait for res[id].done.
 */
#ifndef WARREN_TEST_GI_HARNESS_H
#define WARREN_TEST_GI_HARNESS_H

#include "proto.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "check.h"

#define MAX_IDS 1024

enum expect { EXPECT_EXIT, EXPECT_RESULT, EXPECT_END, EXPECT_LIST, EXPECT_PONG };

/* One PLIST entry. */
struct pent {
    uint64_t pid, start, end, cols, rows, started_ms;
    int64_t code, sig;
    bool running, pty, stdin_open, has_code;
    char tag[64], cmd[256];
    size_t cmd_len; /* of the whole cmd (cmd keeps its first 255 bytes) */
};

struct res {
    enum expect expect;
    bool auto_credit; /* grant credit back for every OUT/DATA byte received */
    bool done;
    bool error;
    int64_t err;
    char msg[256];
    struct proto_buf out[3]; /* [1] stdout, [2] stderr, [0] DATA of a file read */
    int64_t code, sig;
    bool timed_out;
    bool have_result;
    uint64_t size, mode;
    int64_t mtime;
    char type[16];
    char name[256];
    uint64_t credit; /* CREDIT received from the agent */
    size_t nentries, nframes;
    struct proto_buf paths; /* LIST: "path type\n" per entry */
    int bad_off;            /* frames whose offset did not continue the stream */
    /* v2 */
    uint64_t pid;            /* RESULT of a background EXEC */
    bool attach;             /* OUT offsets count both fds together, from next_off */
    uint64_t next_off;       /* attach: the offset the next OUT must carry (plus its lost) */
    uint64_t lost;           /* attach: sum of `lost` */
    int lost_frames;         /* attach: OUT frames that carried `lost` */
    uint64_t first_lost_off; /* attach: off of the first frame with `lost` */
    struct proto_buf all;    /* attach: stdout and stderr bytes in ring order */
    bool ended;              /* END (not EXIT) ended it */
    size_t nprocs;           /* PLIST: entries kept here (the first 16) */
    size_t procs_total;      /* PLIST: entries in the answer */
    struct pent procs[16];
};

struct peer {
    int fd;
    pid_t agent;
    struct proto_buf in, out;
    uint8_t *cur; /* payload of the last frame */
    msgpack_zone zone;
    uint32_t hello_id;
    int hellos;
    bool eof; /* the agent closed its end */
    char kernel[128];
    struct res res[MAX_IDS];
};

void peer_start(struct peer *p);
/* pid1 mode: a hang-up does not end the agent (never send INIT: it would set the host clock). */
void peer_start_pid1(struct peer *p);
/* With per-exec cgroups under cgroup_root (a cgroup2 directory). */
void peer_start_cgroup(struct peer *p, const char *cgroup_root);
/* The agent in a private mount namespace, putting RESYNC boot ids in file and bind-mounting
 * it over target (both paths on the host); only where can_unshare_mounts() (root). */
void peer_start_boot_id(struct peer *p, const char *file, const char *target);
bool can_unshare_mounts(void);
/* Close our end; the agent must return 0 and exit within a few seconds. */
int peer_stop(struct peer *p);
/* Free the test side only (the agent was dealt with). */
void peer_free(struct peer *p);
/* Queue a finished frame buffer for sending. */
void peer_queue(struct peer *p, struct proto_buf *b);
/* Exchange bytes for up to timeout_ms; returns after one frame was handled (1) or timeout (0). */
int peer_step(struct peer *p, int timeout_ms);
/* Step until res[id].done or the deadline; returns done. */
bool peer_wait(struct peer *p, uint32_t id, int timeout_ms);
/* Step until the output queue is flushed. */
void peer_flush(struct peer *p, int timeout_ms);

struct exec_opts {
    const char *cmd;
    const char *const *argv; /* NULL-terminated */
    const char *const *env;  /* key, value, ..., NULL */
    const char *cwd;
    const char *user;
    uint64_t timeout_ms;
    bool stdin_pipe;
    bool bg;
    const char *tag;
    uint64_t cols, rows; /* a PTY when both are set */
};
void send_exec(struct peer *p, uint32_t id, const struct exec_opts *o, bool auto_credit);
void send_simple(struct peer *p, enum proto_type t, uint32_t id, const char *path,
                 enum expect expect);
void send_credit(struct peer *p, uint32_t id, uint64_t n);
void send_stdin(struct peer *p, uint32_t id, const void *data, size_t n, bool eof);
void send_signal(struct peer *p, uint32_t id, int sig);
void send_list(struct peer *p, uint32_t id, const char *path, uint64_t depth);
void send_fwrite(struct peer *p, uint32_t id, const char *path, int mode);
void send_data(struct peer *p, uint32_t id, uint64_t off, const void *data, size_t n);
void send_end(struct peer *p, uint32_t id);
void send_remove(struct peer *p, uint32_t id, const char *path, bool recursive);
void send_rename(struct peer *p, uint32_t id, const char *from, const char *to);
void send_init(struct peer *p, uint32_t id);
/* INIT with ring and max_procs (0: absent). */
void send_init2(struct peer *p, uint32_t id, uint64_t ring, uint64_t max_procs);
/* RESYNC with time 1970, nentropy bytes (0: none), boot_id and host (NULL: absent); expects
 * RESULT or ERROR on id. */
void send_resync(struct peer *p, uint32_t id, size_t nentropy, const char *boot_id,
                 const char *host);
/* Background EXEC: waits for its RESULT and returns the pid (0 on ERROR). */
uint64_t start_bg(struct peer *p, uint32_t id, const struct exec_opts *o);
void send_attach(struct peer *p, uint32_t id, uint64_t pid, uint64_t off, bool follow,
                 bool auto_credit);
void send_detach(struct peer *p, uint32_t id);
void send_plist(struct peer *p, uint32_t id, uint64_t pid); /* pid 0: all */
/* PCTL: data (n bytes, if data), eof, sig (0: none), cols/rows (0: none). */
void send_pctl(struct peer *p, uint32_t id, uint64_t pid, const void *data, size_t n, bool eof,
               int sig, uint64_t cols, uint64_t rows);

/* spawn_guard_ms of agents started from now on (0: the agent's default). */
extern int peer_spawn_guard_ms;

/* Kill-test helpers. */
bool pid_gone(pid_t pid, int timeout_ms);
int64_t now_ms(void);

#endif
