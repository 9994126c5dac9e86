/*
 * agent.h - the protocol agent of warren-init: serves host <-> guest frames
 * (protocol/proto.h) over one byte stream.
 *
 * One single-threaded poll loop multiplexes the channel, the pipes of every
 * process it started (EXEC), open file transfers (FWRITE/FREAD), the
 * directory requests, and background processes / PTYs with their output
 * rings and attach streams (protocol v2, proc.c). Every stream is keyed by
 * the frame id chosen by the host; a new host session (INIT) or a lost host
 * end POLLHUP ends all of them (foreground processes are killed, files
 * closed), while background processes and PTYs keep running with their
 * rings for the next session.
 *
 * Ownership: the agent borrows fd and opts for the duration of the call and
 * does not close fd. Everything it creates (pipes, children, background
 * processes, cgroups, open files) is released before it returns.
 */
#ifndef WARREN_GI_AGENT_H
#define WARREN_GI_AGENT_H

/* Where PID 1 puts RESYNC's boot id (see protocol/README.md, Resync). */
#define GI_BOOT_ID_FILE "/run/warren-boot_id"
#define GI_BOOT_ID_PROC "/proc/sys/kernel/random/boot_id"

struct gi_agent_opts {
    const char *cgroup_root; /* "/sys/fs/cgroup/warren" or NULL if no cgroup2 */
    int pid1;                /* reap every orphan (waitpid(-1)) */
    /* RESYNC's boot id is written to boot_id_file, bind-mounted over boot_id_target the
     * first time (GI_BOOT_ID_FILE and GI_BOOT_ID_PROC for PID 1; NULL: not applied). */
    const char *boot_id_file, *boot_id_target;
    /* A vfork-style child that has not exec'd after this many ms is killed, so the agent,
     * suspended until then, goes on (0: GI_SPAWN_GUARD_MS; exec.c, spawn_vm). */
    int spawn_guard_ms;
};

/*
 * Serve frames on fd until a fatal error (-errno), or, when !opts->pid1,
 * until the peer closes the stream (0) or sends a frame over the size cap
 * (-EPROTO). In pid1 mode a closed host end is waited out (the channel is
 * virtio-serial: the host may reconnect) and the call does not return on
 * it; the agent also runs at SCHED_RR priority 1 (children get the normal
 * policy back) and reaps every orphan of the VM.
 *
 * fd is made non-blocking and close-on-exec. SIGCHLD and SIGIO are blocked
 * and SIGPIPE ignored while the call runs; the old state is restored.
 */
int gi_agent_run(int fd, const struct gi_agent_opts *opts);

/*
 * `warren-init --connect SOCK` (connect.c), run as a process of the guest:
 * copy stdin to the Unix stream socket SOCK and the socket to stdout; stdin's
 * end half-closes the socket, the socket's end ends the call. Returns the exit
 * status: 0 once the socket closed and its bytes were written, 1 with a
 * message on stderr when it cannot connect or an end fails, 128 + the signal
 * on SIGTERM or SIGHUP (the socket is closed first).
 */
int gi_connect_run(const char *path);

#endif
