/*
 * vmm.c - one QEMU process: spawn or adopt, connect its sockets, watch it exit.
 *
 * Phases: the table in vmm_phase.h (BOOTING, WAITING, RESTORING, RUNNING,
 * STOPPED, SAVING, SEALED while the process is watched; EXITED, DETACHED,
 * FREED after). Every change goes through phase_set, which checks that table.
 * Only the live phases make callbacks, plus one last delivery at EXITED (the
 * queued phase changes, then cbs->exited); DETACHED and FREED, which the
 * owner causes itself, make none. Every path out of the live phases first
 * stops every watcher and closes every socket (teardown_io), so nothing can
 * fire later.
 *
 * Exit is watched through a pidfd, which works for our own children and for
 * VMs adopted after a warrend restart alike. The status comes from
 * waitid(P_PIDFD). On libev's default loop libev itself reaps every child
 * (its SIGCHLD handler calls waitpid(-1)), which would steal the status: so
 * there, for our own children, an ev_child watcher is added too and
 * whichever of the two learns the status first ends the VM.
 *
 * Callbacks into the owner happen only from watcher callbacks, bracketed by
 * vmm_enter/vmm_leave: vmm_free inside a callback only marks the struct and
 * the outermost vmm_leave frees it (the Redis deferred-delete idea).
 * vmm_free of a running VM kills it and keeps the struct on a private list
 * until the pidfd says the process is gone, so the loop never waits.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <jansson.h>

#include "vmm_int.h"

extern char **environ;

/* vmm_ prefixed: the sandbox table has its own, different enum op_kind. */
enum vmm_op_kind { VMM_OP_NONE = 0, VMM_OP_STOP, VMM_OP_CONT, VMM_OP_SAVE, VMM_OP_RESTORE };
/* Where a save or restore is: which step answers next. */
enum op_stage { STG_QMP = 0, STG_JOB, STG_PAGES, STG_LOAD };

struct vmm_job;

/* vmm_pageout's worker (see there). */
struct vmm_po {
    int efd, pidfd;
    int refs;   /* the thread and the VM; atomic */
    int cancel; /* atomic: vmm_thaw or the VM's end */
    pid_t pid;
    int err;
    struct vmm_pageout_stats st;
    char why[240];
};

/* Phase changes queued for the phase callback between two deliveries. Past
 * it the newest entry absorbs the change (see vmm.h). */
#define PHASE_Q 16

/* The one stop/cont/save/restore in progress. */
struct vmm_op {
    enum vmm_op_kind kind;
    enum op_stage stage;
    vmm_op_cb cb;
    void *ud;
    int replies; /* internal QMP replies still due */
    int err;
    char why[240];
    bool mig_done;       /* MIGRATION completed seen */
    int fd;              /* the snapshot file, or -1 */
    char *path, *tmp;    /* save: final and temporary names */
    char *ram;           /* save: the RAM file to write (vmm_save_ram), or NULL */
    bool nosync;         /* save: VMM_SAVE_NOSYNC */
    bool delta;          /* save: VMM_SAVE_DELTA */
    struct vmm_job *job; /* running on a worker thread, or NULL */
    struct vmm_snap_info info;
};

struct vmm_conn {
    struct vmm *vm;
    const char *path;
    ev_timer t;
    ev_tstamp deadline;
    void (*done)(struct vmm *vm, int fd, int err);
};

struct vmm {
    struct ev_loop *loop;
    struct vmm_cbs cbs;
    void *ud;
    char id[72];
    char *run_dir, *qmp_path, *con_path, *chan_path, *log_path, *qemu_log_path, *pipe_path;
    pid_t pid;
    int pidfd;
    ev_io pid_w;
    ev_child child_w;
    ev_timer reap_t;  /* status not known yet when the pidfd fired */
    ev_timer kill_t;  /* shutdown grace, or QMP-lost watchdog */
    ev_timer ready_t; /* QMP handshake deadline */
    unsigned reap_tries;
    bool child_grace;  /* waiting for ev_child after waitid said ECHILD */
    bool sigkilled;    /* we sent SIGKILL (says so when the status is unknown) */
    bool frozen;       /* vmm_freeze sent SIGSTOP, vmm_thaw not yet SIGCONT */
    struct vmm_po *po; /* vmm_pageout's worker, or NULL */
    ev_io po_w;        /* its eventfd */
    vmm_op_cb po_cb;
    void *po_ud;
    struct vmm_pf pf; /* vmm_prefault_tcg's progress (pf.mem -1: none under way) */
    uint64_t pf_want; /* asked before QEMU answered query-status: bytes to touch then */
    ev_idle pf_w;     /* its slices, in the loop's idle time */
    ev_tstamp pf_t0;  /* when it started */
    double pf_ms;     /* how long it took, once done */
    bool pf_done;     /* it ran to its end */
    enum vmm_phase phase;
    int depth;
    bool free_pending;
    char fail[160];     /* why we killed it, set when we decide to */
    char kill_why[160]; /* what kill_t will record when it fires */
    struct vmm_qmp qmp;
    struct vmm_conn qmp_c, con_c, chan_c;
    int con_fd;
    ev_io con_w;
    struct vmm_log log;
    int qout_fd; /* read end of qemu.pipe: QEMU's stdout and stderr */
    ev_io qout_w;
    struct vmm_log qlog;   /* bounded qemu.log */
    struct vmm_jail *jail; /* referenced; NULL when unjailed */
    struct vmm_jail_vm jv; /* jv.on: uid and cgroups to give back when the process is gone */
    struct vmm *next_orphan;
    enum vmm_boot boot;
    bool mem_file;     /* guest RAM maps cfg->mem_path (else anonymous) */
    char mem_base[64]; /* launched in restore mode over a RAM file: its name (deltas) */
    ino_t map_ino;     /* and the inode QEMU maps it by (the sealed memfd's, jailed); 0 */
    char *mem_path;    /* cfg->mem_path, or NULL */
    int mem_rfd;       /* restore over a sealed memfd: a duplicate, to check it; else -1 */
    /* The CRC-32C of the RAM file it maps, once known (the snapshot it was restored
     * from, or a save that computed it): each delta over the file carries it. */
    bool ram_crc_known;
    uint32_t ram_crc;
    unsigned mem_mb, vcpus;
    char qemu_version[64]; /* from query-version, once asked */
    struct vmm_op op;
    ev_io job_w;           /* the worker thread's eventfd */
    vmm_phase_cb phase_cb; /* vmm_set_phase_cb, or NULL */
    /* Phase changes not yet told to phase_cb, oldest first: told from the
     * loop (phase_t), never inside the vmm_* call that made them. */
    ev_timer phase_t;
    unsigned phase_n;
    struct {
        enum vmm_phase from, to;
    } phase_q[PHASE_Q];
};

/* VMs freed while their process still ran: kept until reaped, and reachable
 * (leak checkers) until then. The driver is single-threaded like its loop. */
static struct vmm *orphans;

static int sys_pidfd_open(pid_t pid)
{
    return (int)syscall(SYS_pidfd_open, pid, 0);
}

static int sys_pidfd_signal(int pidfd, int sig)
{
    return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

struct vmm_qmp *vmm_qmp_of(struct vmm *vm)
{
    return &vm->qmp;
}

struct ev_loop *vmm_loop_of(struct vmm *vm)
{
    return vm->loop;
}

bool vmm_live(const struct vmm *vm)
{
    return vmm_phase_live(vm->phase);
}

const char *vmm_id_of(const struct vmm *vm)
{
    return vm->id;
}

pid_t vmm_pid(const struct vmm *vm)
{
    return vm->pid;
}

bool vmm_qmp_ready(const struct vmm *vm)
{
    return vm && vmm_phase_live(vm->phase) && vm->qmp.state == VMM_QMP_READY;
}

const char *vmm_console_path(const struct vmm *vm)
{
    return vm->log_path;
}

uid_t vmm_uid(const struct vmm *vm)
{
    return vm->jv.on ? vm->jv.uid : (uid_t)-1;
}

/* Queue a change for the phase callback and make the loop deliver it. The
 * ends an owner causes itself (vmm_detach, vmm_free) are not told: no
 * callback may follow them. EXITED is told by finish_exit, right before
 * cbs->exited. */
static void phase_note(struct vmm *vm, enum vmm_phase from, enum vmm_phase to)
{
    if (!vm->phase_cb || (!vmm_phase_live(to) && to != VMM_PH_EXITED))
        return;
    if (vm->phase_n == PHASE_Q) {
        /* A full queue: the newest entry spans this change too; a round
         * trip back to where it started is no change at all. */
        vm->phase_q[PHASE_Q - 1].to = to;
        if (vm->phase_q[PHASE_Q - 1].from == to)
            vm->phase_n--;
    } else {
        vm->phase_q[vm->phase_n].from = from;
        vm->phase_q[vm->phase_n].to = to;
        vm->phase_n++;
    }
    if (vmm_phase_live(to) && !ev_is_active(&vm->phase_t)) {
        ev_timer_set(&vm->phase_t, 0., 0.);
        ev_timer_start(vm->loop, &vm->phase_t);
    }
}

/* Tell the owner every queued change, oldest first, while it still takes
 * callbacks (a callback may detach or free the VM). From the loop only,
 * inside vmm_enter. */
static void phase_deliver(struct vmm *vm)
{
    while (vm->phase_n > 0 && (vmm_phase_live(vm->phase) || vm->phase == VMM_PH_EXITED)) {
        enum vmm_phase from = vm->phase_q[0].from, to = vm->phase_q[0].to;
        vm->phase_n--;
        memmove(vm->phase_q, vm->phase_q + 1, vm->phase_n * sizeof(vm->phase_q[0]));
        vm->phase_cb(vm->ud, from, to);
    }
}

static void on_phase_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct vmm *vm = w->data;

    vmm_enter(vm);
    phase_deliver(vm);
    vmm_leave(vm);
}

/* The only place a VM changes phase: the table decides (vmm_phase.c); an
 * illegal change is refused and written into qemu.log, where an operator
 * looking at that VM will find it. */
static int phase_set(struct vmm *vm, enum vmm_phase to)
{
    enum vmm_phase from = vm->phase;
    char line[128];
    int n;

    if (vm->phase == to)
        return 0;
    if (vmm_phase_check(vm->phase, to) != 0) {
        n = snprintf(line, sizeof(line), "[warren: refused phase change %s -> %s]\n",
                     vmm_phase_name(vm->phase), vmm_phase_name(to));
        if (vm->qlog.s)
            vmm_log_write(&vm->qlog, line, (size_t)n);
        return -EINVAL;
    }
    vm->phase = to;
    phase_note(vm, from, to);
    return 0;
}

enum vmm_phase vmm_phase(const struct vmm *vm)
{
    return vm->phase;
}

void vmm_set_phase_cb(struct vmm *vm, vmm_phase_cb cb)
{
    if (!vm)
        return;
    vm->phase_cb = cb;
    if (!cb) {
        vm->phase_n = 0;
        ev_timer_stop(vm->loop, &vm->phase_t);
    }
}

static void op_clear(struct vmm *vm);

static void destroy(struct vmm *vm)
{
    if (vm->mem_rfd >= 0)
        close(vm->mem_rfd);
    free(vm->mem_path);
    free(vm->run_dir);
    free(vm->qmp_path);
    free(vm->con_path);
    free(vm->chan_path);
    free(vm->log_path);
    free(vm->qemu_log_path);
    free(vm->pipe_path);
    vmm_jail_free(vm->jail);
    free(vm);
}

/* Groups still busy when their VM was released are retried from the loop every
 * 50 ms for up to 30 s (then the next start's sweep takes them). One timer for
 * the process: warrend has one jail. */
static struct {
    ev_timer t;
    struct ev_loop *loop;
    struct vmm_jail *jail; /* referenced while the timer runs */
    unsigned tries;
} cg_retry;

static void cg_retry_stop(void)
{
    ev_timer_stop(cg_retry.loop, &cg_retry.t);
    vmm_jail_free(cg_retry.jail);
    cg_retry.jail = NULL;
}

static void on_cg_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    if (vmm_jail_retry(cg_retry.jail) == 0 || ++cg_retry.tries >= 600)
        cg_retry_stop();
}

static void cg_retry_start(struct vmm *vm)
{
    if (vmm_jail_retry(vm->jail) == 0)
        return;
    cg_retry.tries = 0;
    if (cg_retry.jail)
        return;
    cg_retry.jail = vmm_jail_ref(vm->jail);
    cg_retry.loop = vm->loop;
    ev_timer_init(&cg_retry.t, on_cg_retry, 0.05, 0.05);
    ev_timer_start(vm->loop, &cg_retry.t);
}

/* The process is gone: its uid and cgroups go back to the jail. The run dir
 * (kept for a dead sandbox's logs) goes back to root first, so the next VM
 * given this uid never owns it. */
static void jail_release(struct vmm *vm)
{
    if (!vm->jail || !vm->jv.on)
        return;
    (void)!chown(vm->run_dir, 0, 0);
    vmm_jail_release(vm->jail, &vm->jv);
    cg_retry_start(vm);
}

void vmm_enter(struct vmm *vm)
{
    vm->depth++;
}

void vmm_leave(struct vmm *vm)
{
    if (--vm->depth == 0 && vm->free_pending)
        destroy(vm);
}

/* Stop every watcher and close every fd except the pidfd. Idempotent. */
static void po_drop(struct vmm *vm);

static void teardown_io(struct vmm *vm)
{
    op_clear(vm);
    po_drop(vm);
    vmm_pf_stop(vm);
    ev_timer_stop(vm->loop, &vm->qmp_c.t);
    ev_timer_stop(vm->loop, &vm->con_c.t);
    ev_timer_stop(vm->loop, &vm->chan_c.t);
    ev_timer_stop(vm->loop, &vm->ready_t);
    ev_timer_stop(vm->loop, &vm->kill_t);
    ev_timer_stop(vm->loop, &vm->reap_t);
    ev_timer_stop(vm->loop, &vm->phase_t);
    ev_io_stop(vm->loop, &vm->pid_w);
    ev_child_stop(vm->loop, &vm->child_w);
    vmm_qmp_close(vm, &vm->qmp);
    ev_io_stop(vm->loop, &vm->con_w);
    if (vm->con_fd >= 0)
        close(vm->con_fd);
    vm->con_fd = -1;
    vmm_log_close(&vm->log);
    ev_io_stop(vm->loop, &vm->qout_w);
    if (vm->qout_fd >= 0)
        close(vm->qout_fd);
    vm->qout_fd = -1;
    vmm_log_close(&vm->qlog);
}

/* Copy what QEMU wrote into the bounded qemu.log. Bounded work per call.
 * Returns false at EOF (every writer gone) or on error. */
static bool qout_pump(struct vmm *vm)
{
    char buf[16384];

    for (int i = 0; i < 16; i++) {
        ssize_t n = read(vm->qout_fd, buf, sizeof(buf));
        if (n > 0) {
            vmm_log_write(&vm->qlog, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        return n < 0 && errno == EAGAIN;
    }
    return true;
}

static void on_qemu_out(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;

    if (!qout_pump(vm)) {
        ev_io_stop(loop, w);
        close(vm->qout_fd);
        vm->qout_fd = -1;
    }
}

/* Open the read end of qemu.pipe (never following a link: a jailed QEMU owns the dir). */
static int qout_open(struct vmm *vm)
{
    struct stat st;
    int fd = open(vm->pipe_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW);

    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
        close(fd);
        return -EINVAL;
    }
    vm->qout_fd = fd;
    return 0;
}

static void close_pidfd(struct vmm *vm)
{
    if (vm->pidfd >= 0)
        close(vm->pidfd);
    vm->pidfd = -1;
}

/* ---- exit ---- */

/* The last non-empty line of qemu.log: QEMU's own error, if it wrote one.
 * From the log's in-memory tail: the file lags behind its writer thread. */
static void qemu_log_tail(struct vmm *vm, char *out, size_t cap)
{
    char buf[VMM_LOG_TAIL + 1];
    size_t n = vmm_log_tail(&vm->qlog, buf, sizeof(buf));
    char *p, *line;

    out[0] = 0;
    if (n == 0)
        return;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        buf[--n] = 0;
    p = strrchr(buf, '\n');
    line = p ? p + 1 : buf;
    /* -msg timestamp=on prefixes "2026-01-02T03:04:05.678901Z ": the reason
     * does not need it. */
    if (line[0] >= '0' && line[0] <= '9' && (p = strstr(line, "Z ")) && p - line < 40)
        line = p + 2;
    /* "qemu-system-x86_64: -drive <its whole argument>: Could not open ..."
     * becomes "-drive: Could not open ...": the argument is ours anyway. */
    if ((p = strstr(line, ": -")) && p - line < 40) {
        char *opt = p + 2, *sp = strchr(opt, ' '), *msg = sp ? strstr(sp, ": ") : NULL;
        if (msg) {
            snprintf(out, cap, "%.*s%s", (int)(sp - opt), opt, msg);
            return;
        }
    }
    /* Not snprintf: the compiler cannot see that a truncated reason is fine here. */
    size_t len = strlen(line) < cap - 1 ? strlen(line) : cap - 1;
    memcpy(out, line, len);
    out[len] = '\0';
}

static const char *shutdown_text(const char *r)
{
    if (strcmp(r, "guest-shutdown") == 0)
        return "the guest powered off";
    if (strcmp(r, "guest-reset") == 0)
        return "the guest rebooted or its kernel panicked";
    if (strcmp(r, "guest-panic") == 0)
        return "the guest kernel panicked";
    if (strcmp(r, "host-qmp-quit") == 0)
        return "quit requested";
    if (strcmp(r, "host-signal") == 0)
        return "QEMU got a termination signal";
    return r;
}

static void finish_exit(struct vmm *vm, int status, bool known)
{
    char reason[VMM_REASON_MAX], extra[200] = "";
    size_t n;

    vmm_qmp_drain_events(vm, &vm->qmp);
    /* The writer is gone: what is left in the pipe is QEMU's last words. */
    if (vm->qout_fd >= 0)
        (void)qout_pump(vm);
    if (!known)
        n = (size_t)snprintf(reason, sizeof(reason), "process exited%s",
                             vm->sigkilled ? " after SIGKILL" : "");
    else if (WIFSIGNALED(status))
        n = (size_t)snprintf(reason, sizeof(reason), "killed by signal %d", WTERMSIG(status));
    else
        n = (size_t)snprintf(reason, sizeof(reason), "exited with status %d", WEXITSTATUS(status));
    if (vm->fail[0])
        snprintf(extra, sizeof(extra), " (%s)", vm->fail);
    else if (vm->jail && vmm_jail_oom_killed(vm->jail, &vm->jv))
        snprintf(extra, sizeof(extra),
                 " (out of memory: the VM's cgroup limit of %llu MiB was reached)",
                 (unsigned long long)(vm->jv.mem_limit >> 20));
    else if (vm->qmp.shutdown_reason[0])
        snprintf(extra, sizeof(extra), ": %s", shutdown_text(vm->qmp.shutdown_reason));
    else if (known && WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        char line[160];
        qemu_log_tail(vm, line, sizeof(line));
        if (line[0])
            snprintf(extra, sizeof(extra), ": %s", line);
    }
    if (n < sizeof(reason))
        snprintf(reason + n, sizeof(reason) - n, "%s", extra);

    teardown_io(vm);
    close_pidfd(vm);
    jail_release(vm);
    phase_set(vm, VMM_PH_EXITED);
    /* The owner learns the last changes (this one included) first; it may
     * free the VM from one of them, and then hears nothing more. */
    phase_deliver(vm);
    if (vm->phase == VMM_PH_EXITED && vm->cbs.exited)
        vm->cbs.exited(vm->ud, known ? status : -1, reason);
}

/* waitid on the pidfd. 1: reaped (status set), 0: not yet, -errno: error. */
static int reap(struct vmm *vm, int *status)
{
    siginfo_t si;

    memset(&si, 0, sizeof(si));
    if (waitid(P_PIDFD, (id_t)vm->pidfd, &si, WEXITED | WNOHANG) != 0)
        return -errno;
    if (si.si_pid == 0)
        return 0;
    if (si.si_code == CLD_EXITED)
        *status = W_EXITCODE(si.si_status, 0);
    else
        *status = si.si_status | (si.si_code == CLD_DUMPED ? 0x80 : 0);
    return 1;
}

static void orphan_unlink(struct vmm *vm)
{
    for (struct vmm **p = &orphans; *p; p = &(*p)->next_orphan)
        if (*p == vm) {
            *p = vm->next_orphan;
            return;
        }
}

/* A freed VM's process is gone: reap it (if it is our child) and free. */
static void orphan_done(struct vmm *vm)
{
    int st;

    (void)reap(vm, &st);
    ev_io_stop(vm->loop, &vm->pid_w);
    close_pidfd(vm);
    jail_release(vm);
    orphan_unlink(vm);
    destroy(vm);
}

int vmm_settle_orphans(unsigned max_ms)
{
    struct timespec t0, now;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (orphans) {
        struct pollfd pf = {.fd = orphans->pidfd, .events = POLLIN};
        long left;

        clock_gettime(CLOCK_MONOTONIC, &now);
        left =
            (long)max_ms - ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000);
        if (left <= 0 || poll(&pf, 1, (int)left) <= 0)
            break;
        orphan_done(orphans);
    }
    /* Their groups empty once they are reaped: give that a moment too. */
    while (cg_retry.jail && vmm_jail_retry(cg_retry.jail) > 0) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >= max_ms)
            break;
        nanosleep(&(struct timespec){0, 5000000}, NULL);
    }
    if (cg_retry.jail && vmm_jail_retry(cg_retry.jail) == 0)
        cg_retry_stop();
    /* Every VM is gone or detached: their logs' last words reach the files. */
    vmm_log_shutdown();
    return orphans || cg_retry.jail ? -ETIMEDOUT : 0;
}

static void try_reap(struct vmm *vm)
{
    int status = 0, r = reap(vm, &status);

    ev_io_stop(vm->loop, &vm->pid_w);
    if (r == 1) {
        finish_exit(vm, status, true);
    } else if (r == 0 && vm->reap_tries++ < 100) {
        /* The pidfd reported the exit a moment before the zombie is waitable. */
        ev_timer_set(&vm->reap_t, 0.01, 0.);
        ev_timer_start(vm->loop, &vm->reap_t);
    } else if (r == -ECHILD && ev_is_active(&vm->child_w) && !vm->child_grace) {
        /* libev's SIGCHLD handler reaped it first: ev_child brings the status.
         * The timer only guards against some other waitpid(-1) in the process. */
        vm->child_grace = true;
        ev_timer_set(&vm->reap_t, 0.5, 0.);
        ev_timer_start(vm->loop, &vm->reap_t);
    } else {
        finish_exit(vm, -1, false); /* not our child (adopted): status unknown */
    }
}

static void on_pidfd(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;

    if (vm->phase == VMM_PH_FREED) {
        orphan_done(vm);
        return;
    }
    vmm_enter(vm);
    if (vmm_phase_live(vm->phase))
        try_reap(vm);
    vmm_leave(vm);
}

static void on_reap_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct vmm *vm = w->data;

    vmm_enter(vm);
    if (vmm_phase_live(vm->phase))
        try_reap(vm);
    vmm_leave(vm);
}

static void on_child(struct ev_loop *loop, ev_child *w, int revents)
{
    struct vmm *vm = w->data;

    ev_child_stop(loop, w);
    vmm_enter(vm);
    if (vmm_phase_live(vm->phase))
        finish_exit(vm, w->rstatus, true);
    vmm_leave(vm);
}

/* SIGKILL through the pidfd: a recycled pid can never be hit. */
static void send_kill(struct vmm *vm)
{
    vm->sigkilled = true;
    if (vm->pidfd >= 0)
        (void)sys_pidfd_signal(vm->pidfd, SIGKILL);
}

/* Kill the VM because something failed; the exit reason will say why. */
static void fail_kill(struct vmm *vm, const char *why)
{
    if (!vmm_phase_live(vm->phase))
        return;
    if (!vm->fail[0])
        snprintf(vm->fail, sizeof(vm->fail), "%s", why);
    send_kill(vm);
}

static void on_kill_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct vmm *vm = w->data;

    fail_kill(vm, vm->kill_why);
}

void vmm_qmp_lost(struct vmm *vm, const char *why)
{
    /* QEMU closes QMP as it exits: give the pidfd a moment to say so. If the
     * process stays, a VM we cannot control is killed. */
    if (!vmm_phase_live(vm->phase) || ev_is_active(&vm->kill_t))
        return;
    ev_timer_stop(vm->loop, &vm->ready_t);
    snprintf(vm->kill_why, sizeof(vm->kill_why), "QMP link lost: %s", why);
    ev_timer_set(&vm->kill_t, 3.0, 0.);
    ev_timer_start(vm->loop, &vm->kill_t);
}

/* ---- socket connections (retried until QEMU has created the socket) ---- */

static void on_conn_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct vmm_conn *c = w->data;
    struct vmm *vm = c->vm;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd, e;

    vmm_enter(vm);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", c->path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        c->done(vm, -1, -errno);
        goto out;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        c->done(vm, fd, 0);
        goto out;
    }
    e = errno;
    close(fd);
    if (e != ENOENT && e != ECONNREFUSED && e != EAGAIN && e != EINTR && e != EINPROGRESS) {
        c->done(vm, -1, -e);
    } else if (ev_now(loop) >= c->deadline) {
        c->done(vm, -1, -ETIMEDOUT);
    } else {
        ev_timer_set(w, VMM_CONNECT_RETRY, 0.);
        ev_timer_start(loop, w);
    }
out:
    vmm_leave(vm);
}

static void conn_init(struct vmm *vm, struct vmm_conn *c, const char *path,
                      void (*done)(struct vmm *, int, int))
{
    c->vm = vm;
    c->path = path;
    c->done = done;
    ev_timer_init(&c->t, on_conn_timer, 0., 0.);
    c->t.data = c;
}

/* The first attempt runs from the loop too: callbacks never fire inside vmm_*. */
static void conn_start(struct vmm *vm, struct vmm_conn *c)
{
    /* The loop's cached time is stale if the caller worked (or blocked)
     * since the loop last woke: deadlines must start from the real now. */
    ev_now_update(vm->loop);
    ev_timer_stop(vm->loop, &c->t);
    c->deadline = ev_now(vm->loop) + VMM_CONNECT_TIMEOUT;
    ev_timer_set(&c->t, 0., 0.);
    ev_timer_start(vm->loop, &c->t);
}

static void on_ready_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct vmm *vm = w->data;

    if (vm->qmp.state != VMM_QMP_READY)
        fail_kill(vm, "QMP handshake timed out");
}

static int pf_begin(struct vmm *vm, uint64_t bytes);

static void on_status(void *ud, int err, const char *json)
{
    struct vmm *vm = ud;
    json_t *o = err ? NULL : json_loads(json, 0, NULL);
    const char *st = json_string_value(json_object_get(o, "status"));

    if (vm->phase == VMM_PH_BOOTING && st) {
        if (strcmp(st, "running") == 0)
            phase_set(vm, VMM_PH_RUNNING);
        else if (strcmp(st, "inmigrate") == 0)
            phase_set(vm, VMM_PH_WAITING);
        /* An adopted template whose migration completed was saved: its RAM
         * file may be every clone's base, so it is sealed again (also if the
         * file was never finished: sealing only forbids running). */
        else if (strcmp(st, "postmigrate") == 0 && vm->boot == VMM_BOOT_TEMPLATE)
            phase_set(vm, VMM_PH_SEALED);
        else
            phase_set(vm, VMM_PH_STOPPED);
    }
    if (vm->pf_want && vm->phase == VMM_PH_WAITING && vm->op.kind == VMM_OP_NONE && st &&
        strcmp(st, "inmigrate") == 0)
        (void)pf_begin(vm, vm->pf_want);
    json_decref(o);
}

static void qmp_connected(struct vmm *vm, int fd, int err)
{
    char why[120];

    if (fd < 0) {
        snprintf(why, sizeof(why), "QMP socket not ready: %s", strerror(-err));
        fail_kill(vm, why);
        return;
    }
    vmm_qmp_attach(vm, &vm->qmp, fd);
    /* The phase from QEMU's own word; later changes come from its events. */
    (void)vmm_qmp_send_first(vm, &vm->qmp, "{\"execute\":\"query-status\"}", on_status, vm);
    ev_timer_set(&vm->ready_t, VMM_CONNECT_TIMEOUT, 0.);
    ev_timer_start(vm->loop, &vm->ready_t);
}

static void on_console(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;
    char buf[16384];

    /* Bounded work per wake-up so a chatty guest cannot hog the loop; the
     * guest's UART stalls while we do not read, host memory never grows. */
    for (int i = 0; i < 16; i++) {
        ssize_t n = read(vm->con_fd, buf, sizeof(buf));
        if (n > 0) {
            vmm_log_write(&vm->log, buf, (size_t)n);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        ev_io_stop(loop, w); /* EOF: QEMU is going away */
        close(vm->con_fd);
        vm->con_fd = -1;
        return;
    }
}

static void console_connected(struct vmm *vm, int fd, int err)
{
    char note[160];

    if (fd < 0) {
        /* Not fatal: the VM runs, only its console is not recorded. */
        snprintf(note, sizeof(note), "\n[warren: console socket unavailable: %s]\n",
                 strerror(-err));
        vmm_log_write(&vm->log, note, strlen(note));
        return;
    }
    vm->con_fd = fd;
    ev_io_init(&vm->con_w, on_console, fd, EV_READ);
    vm->con_w.data = vm;
    ev_io_start(vm->loop, &vm->con_w);
}

static void channel_connected(struct vmm *vm, int fd, int err)
{
    char why[120];

    if (fd < 0) {
        snprintf(why, sizeof(why), "guest channel socket not ready: %s", strerror(-err));
        fail_kill(vm, why);
        return;
    }
    if (vm->cbs.channel)
        vm->cbs.channel(vm->ud, fd);
    else
        close(fd);
}

/* ---- construction ---- */

static char *path_join(const char *dir, const char *name)
{
    char *s = NULL;

    return asprintf(&s, "%s/%s", dir, name) < 0 ? NULL : s;
}

static void on_job(struct ev_loop *loop, ev_io *w, int revents);
static void on_po(struct ev_loop *loop, ev_io *w, int revents);
static void on_pf_idle(struct ev_loop *loop, ev_idle *w, int revents);

static int vm_new(struct ev_loop *loop, const struct vmm_config *cfg, const struct vmm_cbs *cbs,
                  void *ud, struct vmm **out)
{
    struct vmm *vm;
    int r;

    if (!loop || !cfg || !cbs || !out || !cfg->run_dir)
        return -EINVAL;
    if ((r = vmm_id_check(cfg->id)) != 0)
        return r;
    if (strlen(cfg->run_dir) + sizeof("/console.sock") >
        sizeof(((struct sockaddr_un *)0)->sun_path))
        return -ENAMETOOLONG;
    vm = calloc(1, sizeof(*vm));
    if (!vm)
        return -ENOMEM;
    vm->loop = loop;
    vm->cbs = *cbs;
    vm->ud = ud;
    snprintf(vm->id, sizeof(vm->id), "%s", cfg->id);
    vm->pid = -1;
    vm->pidfd = -1;
    vm->con_fd = -1;
    vm->qout_fd = -1;
    vm->jail = vmm_jail_ref(cfg->jail);
    vm->boot = cfg->boot;
    vm->mem_file = cfg->mem_path != NULL;
    vm->mem_rfd = -1;
    if (cfg->boot == VMM_BOOT_RESTORE && cfg->mem_path && cfg->mem_fd > 0)
        vm->mem_rfd = fcntl(cfg->mem_fd, F_DUPFD_CLOEXEC, 3); /* -1: the file is read */
    if (cfg->boot == VMM_BOOT_RESTORE && cfg->mem_path) {
        const char *slash = strrchr(cfg->mem_path, '/');
        struct stat st;
        if (strlen(slash ? slash + 1 : cfg->mem_path) < sizeof(vm->mem_base)) {
            snprintf(vm->mem_base, sizeof(vm->mem_base), "%s", slash ? slash + 1 : cfg->mem_path);
            /* An adopted VM's is looked up in its maps instead (vmm_adopt). */
            if ((cfg->mem_fd > 0 ? fstat(cfg->mem_fd, &st) : stat(cfg->mem_path, &st)) == 0)
                vm->map_ino = st.st_ino;
        }
    }
    vm->mem_mb = cfg->mem_mb ? cfg->mem_mb : 256;
    vm->vcpus = cfg->vcpus ? cfg->vcpus : 1;
    vm->phase = cfg->boot == VMM_BOOT_RESTORE ? VMM_PH_WAITING : VMM_PH_BOOTING;
    vm->op.fd = -1;
    ev_io_init(&vm->job_w, on_job, -1, EV_READ);
    vm->job_w.data = vm;
    ev_io_init(&vm->po_w, on_po, -1, EV_READ);
    vm->po_w.data = vm;
    vm->pf.mem = vm->pf.pagemap = -1;
    ev_idle_init(&vm->pf_w, on_pf_idle);
    vm->pf_w.data = vm;
    vm->run_dir = strdup(cfg->run_dir);
    vm->qmp_path = path_join(cfg->run_dir, "qmp.sock");
    vm->con_path = path_join(cfg->run_dir, "console.sock");
    vm->chan_path = path_join(cfg->run_dir, "chan.sock");
    vm->log_path = path_join(cfg->run_dir, "console.log");
    vm->qemu_log_path = path_join(cfg->run_dir, "qemu.log");
    vm->pipe_path = path_join(cfg->run_dir, "qemu.pipe");
    vm->mem_path = cfg->mem_path ? strdup(cfg->mem_path) : NULL;
    if (!vm->run_dir || !vm->qmp_path || !vm->con_path || !vm->chan_path || !vm->log_path ||
        !vm->qemu_log_path || !vm->pipe_path || (cfg->mem_path && !vm->mem_path)) {
        destroy(vm);
        return -ENOMEM;
    }
    vmm_qmp_init(vm, &vm->qmp);
    conn_init(vm, &vm->qmp_c, vm->qmp_path, qmp_connected);
    conn_init(vm, &vm->con_c, vm->con_path, console_connected);
    conn_init(vm, &vm->chan_c, vm->chan_path, channel_connected);
    ev_io_init(&vm->pid_w, on_pidfd, -1, EV_READ);
    vm->pid_w.data = vm;
    ev_child_init(&vm->child_w, on_child, 0, 0);
    vm->child_w.data = vm;
    ev_init(&vm->reap_t, on_reap_timer);
    vm->reap_t.data = vm;
    ev_init(&vm->kill_t, on_kill_timer);
    vm->kill_t.data = vm;
    ev_init(&vm->ready_t, on_ready_timer);
    vm->ready_t.data = vm;
    ev_init(&vm->phase_t, on_phase_timer);
    vm->phase_t.data = vm;
    ev_io_init(&vm->con_w, on_console, -1, EV_READ);
    vm->con_w.data = vm;
    ev_io_init(&vm->qout_w, on_qemu_out, -1, EV_READ);
    vm->qout_w.data = vm;
    *out = vm;
    return 0;
}

/* Watch the process and start connecting its sockets. */
static void vm_start(struct vmm *vm, bool our_child)
{
    ev_io_set(&vm->pid_w, vm->pidfd, EV_READ);
    ev_io_start(vm->loop, &vm->pid_w);
    if (our_child && ev_is_default_loop(vm->loop)) {
        ev_child_set(&vm->child_w, vm->pid, 0);
        ev_child_start(vm->loop, &vm->child_w);
    }
    conn_start(vm, &vm->qmp_c);
    conn_start(vm, &vm->con_c);
    conn_start(vm, &vm->chan_c);
    if (vm->qout_fd >= 0) {
        ev_io_set(&vm->qout_w, vm->qout_fd, EV_READ);
        ev_io_start(vm->loop, &vm->qout_w);
    }
}

/* Enter the network namespace at path on this thread: 0 and *self (this
 * thread's own, to return to), or -errno. */
int vmm_netns_enter(const char *path, int *self)
{
    int target, r = 0;

    *self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    target = open(path, O_RDONLY | O_CLOEXEC);
    if (*self < 0 || target < 0 || setns(target, CLONE_NEWNET) != 0)
        r = -errno;
    if (target >= 0)
        close(target);
    if (r != 0 && *self >= 0) {
        close(*self);
        *self = -1;
    }
    return r;
}

void vmm_netns_leave(int self)
{
    /* Staying in a VM's namespace would put every socket the loop makes from
     * now on inside it: never continue from there. */
    if (setns(self, CLONE_NEWNET) != 0) {
        fprintf(stderr, "vmm: cannot return to warrend's network namespace: %s\n", strerror(errno));
        abort();
    }
    close(self);
}

static int spawn(struct vmm *vm, char **argv, int out_fd, const char *netns)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sigset_t none, all;
    int self = -1;
    int r;

    sigemptyset(&none);
    /* Signals warrend ignores (SIGPIPE...) would stay ignored across exec. */
    sigfillset(&all);
    sigdelset(&all, SIGKILL);
    sigdelset(&all, SIGSTOP);
    if ((r = posix_spawn_file_actions_init(&fa)) != 0)
        return -r;
    if ((r = posix_spawnattr_init(&at)) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        return -r;
    }
    if ((r = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) ||
        (r = posix_spawn_file_actions_adddup2(&fa, out_fd, 1)) ||
        (r = posix_spawn_file_actions_adddup2(&fa, out_fd, 2)) ||
        (r = posix_spawn_file_actions_addclosefrom_np(&fa, 3)) ||
        /* Own session: a signal to warrend's process group never reaches the VM. */
        (r = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                               POSIX_SPAWN_SETSIGDEF)) ||
        (r = posix_spawnattr_setsigmask(&at, &none)) ||
        (r = posix_spawnattr_setsigdefault(&at, &all)))
        goto out;
    /* The child inherits this thread's namespaces: QEMU starts in the VM's. */
    if (netns && (r = -vmm_netns_enter(netns, &self)) != 0)
        goto out;
    if (strchr(argv[0], '/'))
        r = posix_spawn(&vm->pid, argv[0], &fa, &at, argv, environ);
    else
        r = posix_spawnp(&vm->pid, argv[0], &fa, &at, argv, environ);
    if (netns)
        vmm_netns_leave(self);
out:
    posix_spawnattr_destroy(&at);
    posix_spawn_file_actions_destroy(&fa);
    return -r;
}

static void unlink_sockets(struct vmm *vm)
{
    /* Stale sockets from an earlier run would answer ECONNREFUSED at best. */
    unlink(vm->qmp_path);
    unlink(vm->con_path);
    unlink(vm->chan_path);
    unlink(vm->pipe_path);
}

int vmm_launch(struct ev_loop *loop, const struct vmm_config *cfg, const struct vmm_cbs *cbs,
               void *ud, struct vmm **out)
{
    static unsigned long tsc_khz;
    struct vmm_config c;
    struct vmm_argv av = {0};
    struct vmm *vm = NULL;
    char why[200] = "";
    int wfd = -1, r;
    bool thp_off;

    if (!cfg)
        return -EINVAL;
    c = *cfg;
    /* A jailed QEMU sees only its run dir and the images. A template writes its
     * memory file: not jailed. A clone maps the template's memory file: only as a
     * sealed memfd (mem_fd), which no clone can write. A restore without one gets
     * its RAM from the stream (an fd) and its disk chain read-only. */
    if (c.jail && (c.boot == VMM_BOOT_TEMPLATE ||
                   (c.boot == VMM_BOOT_RESTORE && c.mem_path && c.mem_fd <= 0)))
        return -ENOTSUP;
    if (c.jail && c.mem_path && c.mem_fd > 0 && vmm_mem_sealed(c.mem_fd) != 0)
        return -EPERM;
    /* Jailed, the child enters the namespace itself (it runs the set-up
     * first when net_wrap is given too): it must be named. */
    if (c.jail && c.net_wrap && !c.netns)
        return -EINVAL;
    if (c.accel == VMM_ACCEL_AUTO)
        c.accel = vmm_detect_accel(NULL, 0);
    if (!tsc_khz)
        tsc_khz = vmm_tsc_khz();
    if ((r = vm_new(loop, &c, cbs, ud, &vm)) != 0)
        return r;
    if ((r = vmm_argv_build(&av, &c, tsc_khz)) != 0)
        goto fail;
    unlink_sockets(vm);
    if ((r = vmm_log_open(&vm->log, vm->log_path, c.console_max, false)) != 0 ||
        (r = vmm_log_open_named(&vm->qlog, "qemu", vm->qemu_log_path, c.qemu_log_max, false)) != 0)
        goto fail;
    /* QEMU's output goes through a pipe into the bounded qemu.log. A named
     * pipe, so that a warrend restarted later can read it again. QEMU's end
     * is non-blocking: a full pipe drops its messages, never stalls the VM;
     * with no reader (warrend down) QEMU gets EPIPE (it ignores SIGPIPE). */
    if (mkfifo(vm->pipe_path, 0600) != 0 || (r = qout_open(vm)) != 0 ||
        (wfd = open(vm->pipe_path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) < 0) {
        r = r ? r : -errno;
        goto fail;
    }
    if (vm->jail && (r = vmm_jail_prepare(vm->jail, &c, &vm->jv)) != 0) {
        snprintf(why, sizeof(why), "jail: %s", strerror(-r));
        goto fail;
    }
    /* Under TCG, a VM whose RAM is a file (a template, a pool VM, a clone) gets no
     * transparent huge pages unless asked: its RAM is shared memory, which has
     * none here, and QEMU wants them only for its translation buffer, every 2 MiB
     * of which it touches is then paid in full: ~2.4 MiB more private memory per
     * VM for no speed measured (load/RESULTS.md, "Huge pages"). A VM with
     * anonymous RAM keeps them: without, a booted sandbox's restore faulted its
     * RAM in 4 KiB at a time, 6x slower (its pause 2x). The flag is the mm's and
     * passes to the new mm at exec; the child shares warrend's mm until it execs
     * (CLONE_VFORK), so warrend carries it for the call and drops it after. */
    thp_off = c.accel == VMM_ACCEL_TCG && !c.tcg_huge_pages &&
              (c.boot == VMM_BOOT_TEMPLATE || (c.boot == VMM_BOOT_RESTORE && c.mem_path)) &&
              prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0;
    if (vm->jail)
        r = vmm_jail_spawn(vm->jail, &vm->jv, &c, av.v, wfd, &vm->pid, why, sizeof(why));
    else
        r = spawn(vm, av.v, wfd, c.netns);
    if (thp_off)
        prctl(PR_SET_THP_DISABLE, 0, 0, 0, 0);
    if (r != 0)
        goto fail;
    close(wfd);
    wfd = -1;
    vm->pidfd = sys_pidfd_open(vm->pid);
    if (vm->pidfd < 0) {
        r = -errno;
        kill(vm->pid, SIGKILL);
        waitpid(vm->pid, NULL, 0); /* just SIGKILLed: returns at once */
        goto fail;
    }
    vmm_argv_free(&av);
    vm_start(vm, true);
    *out = vm;
    return 0;
fail:
    if (why[0]) {
        /* The only witness of a jail that could not be set up. */
        char line[256];
        int n = snprintf(line, sizeof(line), "[warren: %s]\n", why);
        vmm_log_write(&vm->qlog, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
    }
    if (wfd >= 0)
        close(wfd);
    vmm_argv_free(&av);
    teardown_io(vm);
    jail_release(vm);
    destroy(vm);
    return r;
}

/* 0 if /proc/<pid>/cmdline holds both argv strings exactly. */
static int cmdline_matches(pid_t pid, const char *name, const char *qmp)
{
    char path[64], *buf = NULL;
    size_t len = 0, cap = 0;
    bool has_name = false, has_qmp = false;
    int fd, r = -ESRCH;

    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -ESRCH;
    for (;;) {
        ssize_t n;
        if (len + 4096 > cap) {
            char *b;
            if (cap >= (1u << 20) || !(b = realloc(buf, cap ? cap * 2 : 16384)))
                goto out;
            buf = b;
            cap = cap ? cap * 2 : 16384;
        }
        n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            goto out;
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    for (size_t off = 0; off < len; off += strlen(buf + off) + 1) {
        has_name |= strcmp(buf + off, name) == 0;
        has_qmp |= strcmp(buf + off, qmp) == 0;
    }
    r = has_name && has_qmp ? 0 : -ESRCH;
out:
    free(buf);
    close(fd);
    return r;
}

/* True if pid's parent is this process (after a detach in the same warrend). */
static bool is_our_child(pid_t pid)
{
    char path[64], buf[512], *p;
    int ppid = 0;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (vmm_read_small(path, buf, sizeof(buf)) < 0)
        return false;
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses. */
    if (!(p = strrchr(buf, ')')) || sscanf(p + 1, " %*c %d", &ppid) != 1)
        return false;
    return ppid == (int)getpid();
}

int vmm_kill_stray(const char *id, const char *run_dir)
{
    char name[160], qmp[4200];
    DIR *d;
    struct dirent *e;
    int r, killed = 0;

    if ((r = vmm_argv_name(name, sizeof(name), id)) ||
        (r = vmm_argv_qmp(qmp, sizeof(qmp), run_dir)))
        return r;
    if (!(d = opendir("/proc")))
        return -errno;
    while ((e = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        int pidfd;

        if (*end || pid <= 0)
            continue;
        /* As in vmm_adopt: pin the process, then check it is that VM, then kill it. */
        if ((pidfd = sys_pidfd_open((pid_t)pid)) < 0)
            continue;
        if (cmdline_matches((pid_t)pid, name, qmp) == 0 && sys_pidfd_signal(pidfd, SIGKILL) == 0)
            killed++;
        close(pidfd);
    }
    closedir(d);
    return killed;
}

int vmm_adopt(struct ev_loop *loop, const struct vmm_config *cfg, pid_t pid,
              const struct vmm_cbs *cbs, void *ud, struct vmm **out)
{
    char name[160], qmp[4200];
    struct vmm *vm = NULL;
    int pidfd = -1, r;

    if (!cfg || pid <= 0)
        return -EINVAL;
    if ((r = vm_new(loop, cfg, cbs, ud, &vm)) != 0)
        return r;
    if ((r = vmm_argv_name(name, sizeof(name), cfg->id)) ||
        (r = vmm_argv_qmp(qmp, sizeof(qmp), cfg->run_dir)))
        goto fail;
    /* Order matters: the pidfd pins the process first, then its cmdline is
     * checked, then a signal-0 proves that pinned process is still alive,
     * so a recycled pid cannot pass. */
    pidfd = sys_pidfd_open(pid);
    if (pidfd < 0) {
        r = errno == ESRCH ? -ESRCH : -errno;
        goto fail;
    }
    if ((r = cmdline_matches(pid, name, qmp)) != 0)
        goto fail;
    if (sys_pidfd_signal(pidfd, 0) != 0) {
        r = -ESRCH;
        goto fail;
    }
    if (vm->jail && (r = vmm_jail_adopt(vm->jail, cfg, pid, &vm->jv)) != 0)
        goto fail;
    /* A QEMU frozen by an earlier warrend (vmm_freeze) would never answer QMP: it runs
     * again. A sandbox the index calls frozen is continued by its owner anyway. */
    (void)sys_pidfd_signal(pidfd, SIGCONT);
    if ((r = vmm_log_open(&vm->log, vm->log_path, cfg->console_max, true)) != 0 ||
        (r = vmm_log_open_named(&vm->qlog, "qemu", vm->qemu_log_path, cfg->qemu_log_max, true)) !=
            0)
        goto fail;
    /* A VM started before qemu.log was bounded has no pipe: nothing to read. */
    (void)qout_open(vm);
    vm->map_ino = vm->mem_base[0] ? vmm_delta_map_ino(pid, cfg->mem_path, vm->mem_mb) : 0;
    vm->pid = pid;
    vm->pidfd = pidfd;
    /* Whatever it was doing: the first query-status says (running, paused, inmigrate). */
    vm->phase = VMM_PH_BOOTING;
    vm_start(vm, is_our_child(pid));
    *out = vm;
    return 0;
fail:
    if (pidfd >= 0)
        close(pidfd);
    teardown_io(vm);
    /* The process lives on: give the uid back to the table without touching
     * its groups (another adoption attempt may still want them). */
    if (vm->jv.on)
        vmm_jail_uid_release(vm->jail, vm->jv.uid);
    destroy(vm);
    return r;
}

/* ---- control ---- */

int vmm_channel_reconnect(struct vmm *vm)
{
    if (!vm || !vmm_phase_live(vm->phase))
        return -ESRCH;
    conn_start(vm, &vm->chan_c);
    return 0;
}

/* May the owner send this command raw in this phase (vmm.h, vmm_qmp)? The
 * driver's own commands do not come through here. */
static bool raw_allowed(enum vmm_phase p, const char *cmd)
{
    /* Only vmm_restore feeds a stream in: it checks the file first, and a
     * stream loaded behind its back would leave the phase WAITING under a
     * running guest. */
    if (strcmp(cmd, "migrate-incoming") == 0)
        return false;
    /* A sealed template's RAM file is every clone's base: nothing that could
     * run the guest or write its RAM (a reset reloads ROMs into it). */
    if (p == VMM_PH_SEALED)
        return strncmp(cmd, "query-", 6) == 0 || strcmp(cmd, "stop") == 0 ||
               strcmp(cmd, "quit") == 0;
    /* What could run the guest or write its RAM waits until the phase says
     * the guest may run (STOPPED, or RUNNING already): not during a save (a
     * template's RAM file would no longer match its saved devices), a
     * restore, or before the phase is known. HMP can say any of them. */
    if (strcmp(cmd, "cont") == 0 || strcmp(cmd, "system_reset") == 0 ||
        strcmp(cmd, "system_wakeup") == 0 || strcmp(cmd, "snapshot-load") == 0 ||
        strcmp(cmd, "human-monitor-command") == 0)
        return vmm_phase_can_cont(p) || vmm_phase_guest_runs(p);
    if (strcmp(cmd, "migrate") == 0)
        return vmm_phase_can_save(p);
    return true;
}

int vmm_qmp(struct vmm *vm, const char *json, vmm_qmp_cb cb, void *ud)
{
    json_t *o;
    bool ok;

    if (!vm || !json)
        return -EINVAL;
    if (!vmm_phase_live(vm->phase))
        return -ESRCH;
    o = json_loads(json, 0, NULL);
    if (!json_is_string(json_object_get(o, "execute"))) {
        json_decref(o);
        return -EINVAL;
    }
    ok = raw_allowed(vm->phase, json_string_value(json_object_get(o, "execute")));
    json_decref(o);
    if (!ok)
        return -EPERM;
    return vmm_qmp_send(vm, &vm->qmp, json, cb, ud);
}

void vmm_kill(struct vmm *vm)
{
    if (!vm || !vmm_phase_live(vm->phase))
        return;
    send_kill(vm);
}

void vmm_shutdown(struct vmm *vm, unsigned grace_ms)
{
    if (!vm || !vmm_phase_live(vm->phase))
        return;
    if (grace_ms == 0) {
        vmm_kill(vm);
        return;
    }
    /* If QMP is down the quit cannot go out; the timer still ends the VM. */
    (void)vmm_qmp_send(vm, &vm->qmp, "{\"execute\":\"quit\"}", NULL, NULL);
    ev_timer_stop(vm->loop, &vm->kill_t);
    ev_now_update(vm->loop);
    snprintf(vm->kill_why, sizeof(vm->kill_why), "did not quit within %u ms", grace_ms);
    ev_timer_set(&vm->kill_t, grace_ms / 1000.0, 0.);
    ev_timer_start(vm->loop, &vm->kill_t);
}

void vmm_detach(struct vmm *vm)
{
    if (!vm || !vmm_phase_live(vm->phase))
        return;
    teardown_io(vm);
    close_pidfd(vm);
    phase_set(vm, VMM_PH_DETACHED);
}

void vmm_free(struct vmm *vm)
{
    bool running;

    if (!vm || vm->phase == VMM_PH_FREED)
        return;
    running = vmm_phase_live(vm->phase);
    teardown_io(vm);
    phase_set(vm, VMM_PH_FREED);
    if (running && vm->pidfd >= 0) {
        struct pollfd pf = {.fd = vm->pidfd, .events = POLLIN};
        int st, rr;
        send_kill(vm);
        rr = reap(vm, &st);
        /* An adopted VM is not our child (ECHILD): the pidfd alone says when it is
         * gone, and only then may its uid and cgroups be given back. */
        if (rr == 0 || (rr < 0 && poll(&pf, 1, 0) == 0)) {
            /* Still dying: reap it from the loop when the pidfd says so. */
            ev_io_start(vm->loop, &vm->pid_w);
            vm->next_orphan = orphans;
            orphans = vm;
            return;
        }
        jail_release(vm);
    }
    close_pidfd(vm);
    if (vm->depth > 0)
        vm->free_pending = true;
    else
        destroy(vm);
}

/* ---- stop, cont, save, restore ----
 *
 * One operation at a time (vm->op). Its QMP commands are sent with vm as the
 * callback's ud (safe: QMP callbacks are dropped when the VM goes away) and
 * counted in op.replies; the operation moves on when every reply is in and,
 * for migrations, QEMU's MIGRATION event said completed. Disk work (checksum,
 * fsync, rename) runs on a worker thread that signals an eventfd. */

struct vmm_job {
    int efd;
    int refs; /* the thread and the VM; atomic */
    bool save, nosync, delta;
    /* the VM as the thread needs it: QEMU's pid, the inode its RAM file is mapped by
     * and that file's name, its guest size */
    pid_t pid;
    ino_t map_ino;
    char mem_base[64];
    unsigned mem_mb;
    bool pages;   /* restore: write a delta's pages (else: check the file) */
    bool touched; /* restore: pages were written into QEMU's RAM */
    bool tmpl;    /* save: a template's, whose RAM file QEMU shares (its checksum too) */
    bool ram_crc_known;
    uint32_t ram_crc; /* of the RAM file QEMU maps, if known (vm->ram_crc) */
    int fd;           /* a duplicate of op.fd, the job's own */
    int mem_fd;       /* restore: a duplicate of vm->mem_rfd, or -1 (then mem_path is read) */
    char *tmp, *path, *ram, *mem_path;
    struct vmm_snap_info info;
    int err;
    char why[240];
};

/* A detached worker thread running fn(arg): 0 or a positive error number. */
static int start_detached(void *(*fn)(void *), void *arg)
{
    pthread_attr_t at;
    pthread_t th;
    int r;

    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    r = pthread_create(&th, &at, fn, arg);
    pthread_attr_destroy(&at);
    return r;
}

static void job_unref(struct vmm_job *j)
{
    if (!j || __atomic_sub_fetch(&j->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (j->fd >= 0)
        close(j->fd);
    if (j->efd >= 0)
        close(j->efd);
    if (j->mem_fd >= 0)
        close(j->mem_fd);
    free(j->mem_path);
    free(j->tmp);
    free(j->path);
    free(j->ram);
    free(j);
}

/* A save over a RAM file (a template's, a delta's): its checksum into info, the one
 * the VM knows, else computed (13 ms for 70 MiB touched here; once per VM: a template,
 * or a VM adopted from an earlier warrend). None if the file cannot be read. */
static void job_ram_crc(struct vmm_job *j)
{
    uint32_t crc;
    int fd;

    if (j->ram_crc_known) {
        j->info.ram_crc = j->ram_crc;
    } else if (j->tmpl && j->mem_path) {
        if ((fd = open(j->mem_path, O_RDONLY | O_CLOEXEC)) < 0)
            return;
        bool cached;
        int r = vmm_ram_crc_once(fd, (uint64_t)j->mem_mb << 20, &crc, &cached);
        close(fd);
        if (r != 0)
            return;
        j->info.ram_crc = crc;
    } else if (j->map_ino && vmm_ram_crc_mapped(j->pid, j->map_ino, j->mem_mb, &crc) == 0) {
        j->info.ram_crc = crc;
    } else {
        return;
    }
    j->info.flags |= VMM_SNAP_F_RAM_CRC;
}

/* A restore whose header carries its RAM file's checksum (a delta's, a template's): the
 * file QEMU maps (the sealed copy a jailed one maps) must match it, or a damaged file
 * would run. Read once per file and run of warrend (vmm_ram_crc_once): a pool's clones
 * after the first cost a stat. */
static int job_ram_check(struct vmm_job *j)
{
    /* A delta names its file; a template's state goes over the file the VM maps. */
    const char *name = j->info.base[0] ? j->info.base : j->mem_path ? j->mem_path : "(none)";
    int fd = j->mem_fd >= 0 ? j->mem_fd : -1, r;
    bool cached;
    uint32_t crc;

    if (!(j->info.flags & VMM_SNAP_F_RAM_CRC))
        return 0;
    if (fd < 0 && (!j->mem_path || (fd = open(j->mem_path, O_RDONLY | O_CLOEXEC)) < 0)) {
        snprintf(j->why, sizeof(j->why), "its RAM file %s cannot be read to check it: %s", name,
                 j->mem_path ? strerror(errno) : "this VM maps none");
        return -EINVAL;
    }
    r = vmm_ram_crc_once(fd, (uint64_t)j->mem_mb << 20, &crc, &cached);
    if (fd != j->mem_fd)
        close(fd);
    if (r == -EIO) {
        snprintf(j->why, sizeof(j->why), "its RAM file %s is not %u MiB long", name, j->mem_mb);
        return -EINVAL;
    }
    if (r != 0) {
        snprintf(j->why, sizeof(j->why), "its RAM file %s: read: %s", name, strerror(-r));
        return r;
    }
    if (crc != j->info.ram_crc) {
        snprintf(j->why, sizeof(j->why), "its RAM file %s: checksum mismatch (damaged file)", name);
        return -EINVAL;
    }
    return 0;
}

static void *job_main(void *arg)
{
    struct vmm_job *j = arg;
    uint64_t one = 1;

    if (j->save) {
        if (j->ram) {
            j->err = vmm_ram_write(j->fd, j->pid, j->mem_mb, j->ram, !j->nosync, &j->info, j->why,
                                   sizeof(j->why));
        } else if (j->delta) {
            snprintf(j->info.base, sizeof(j->info.base), "%s", j->mem_base);
            j->err = vmm_delta_write(j->fd, j->pid, j->map_ino, j->mem_mb, &j->info, j->why,
                                     sizeof(j->why));
            if (!j->err)
                job_ram_crc(j);
        } else if (j->tmpl) {
            job_ram_crc(j);
        }
        if (!j->err)
            j->err = vmm_snap_finalize(j->fd, j->tmp, j->path, !j->nosync, &j->info, j->why,
                                       sizeof(j->why));
    } else if (!j->pages) {
        j->err = vmm_snap_verify(j->fd, &j->info, j->why, sizeof(j->why));
        if (!j->err)
            j->err = job_ram_check(j);
    } else {
        /* The pages go over the very RAM file they were taken over, or nowhere. */
        if (!j->map_ino || strcmp(j->info.base, j->mem_base) != 0) {
            snprintf(j->why, sizeof(j->why),
                     "snapshot holds pages over the RAM file %s, this VM maps %s", j->info.base,
                     j->mem_base[0] ? j->mem_base : "none it can name");
            j->err = -EINVAL;
        } else {
            j->err = vmm_delta_load(j->fd, &j->info, j->pid, j->map_ino, &j->touched, j->why,
                                    sizeof(j->why));
        }
    }
    (void)!write(j->efd, &one, sizeof(one));
    job_unref(j);
    return NULL;
}

static int job_start(struct vmm *vm, bool save)
{
    struct vmm_job *j = calloc(1, sizeof(*j));
    int r;

    if (!j)
        return -ENOMEM;
    j->save = save;
    j->pages = vm->op.stage == STG_PAGES;
    j->nosync = vm->op.nosync;
    j->delta = vm->op.delta;
    j->pid = vm->pid;
    j->map_ino = vm->map_ino;
    j->mem_mb = vm->mem_mb;
    j->tmpl = vm->boot == VMM_BOOT_TEMPLATE;
    j->ram_crc_known = vm->ram_crc_known;
    j->ram_crc = vm->ram_crc;
    j->mem_fd = -1;
    snprintf(j->mem_base, sizeof(j->mem_base), "%s", vm->mem_base);
    j->refs = 2;
    j->info = vm->op.info;
    j->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    j->fd = fcntl(vm->op.fd, F_DUPFD_CLOEXEC, 3);
    if (!save && !j->pages && vm->mem_rfd >= 0)
        j->mem_fd = fcntl(vm->mem_rfd, F_DUPFD_CLOEXEC, 3);
    if (vm->mem_path)
        j->mem_path = strdup(vm->mem_path);
    if (save) {
        j->tmp = strdup(vm->op.tmp);
        j->path = strdup(vm->op.path);
        j->ram = vm->op.ram ? strdup(vm->op.ram) : NULL;
    }
    if (j->efd < 0 || j->fd < 0 || (save && (!j->tmp || !j->path || (vm->op.ram && !j->ram))) ||
        (vm->mem_path && !j->mem_path) ||
        (!save && !j->pages && vm->mem_rfd >= 0 && j->mem_fd < 0)) {
        j->refs = 1;
        job_unref(j);
        return -ENOMEM;
    }
    if ((r = start_detached(job_main, j)) != 0) {
        j->refs = 1;
        job_unref(j);
        return -r;
    }
    vm->op.job = j;
    ev_io_set(&vm->job_w, j->efd, EV_READ);
    ev_io_start(vm->loop, &vm->job_w);
    return 0;
}

/* Forget the operation without calling it (the VM is going away). A save whose
 * file is not being finished by a worker leaves no temporary file behind. */
static void op_clear(struct vmm *vm)
{
    struct vmm_op *op = &vm->op;

    ev_io_stop(vm->loop, &vm->job_w);
    if (op->job) {
        job_unref(op->job); /* the thread finishes (a save's file included) on its own */
        op->job = NULL;
    } else if (op->kind == VMM_OP_SAVE && op->tmp) {
        unlink(op->tmp);
    }
    if (op->fd >= 0)
        close(op->fd);
    free(op->path);
    free(op->tmp);
    free(op->ram);
    memset(op, 0, sizeof(*op));
    op->fd = -1;
}

/* The operation is over: clear it, tell the phase changes it made, then
 * call its owner (who may free vm). */
static void op_finish(struct vmm *vm, int err, const char *why)
{
    vmm_op_cb cb = vm->op.cb;
    void *ud = vm->op.ud;
    char buf[240];

    snprintf(buf, sizeof(buf), "%s", why ? why : (err ? strerror(-err) : "ok"));
    if (vm->op.kind == VMM_OP_SAVE && err && vm->op.tmp && !vm->op.job)
        unlink(vm->op.tmp);
    ev_io_stop(vm->loop, &vm->job_w);
    job_unref(vm->op.job);
    vm->op.job = NULL;
    if (vm->op.fd >= 0)
        close(vm->op.fd);
    free(vm->op.path);
    free(vm->op.tmp);
    free(vm->op.ram);
    memset(&vm->op, 0, sizeof(vm->op));
    vm->op.fd = -1;
    /* The op is over, so a phase callback may start the next one. */
    phase_deliver(vm);
    if (cb && vmm_phase_live(vm->phase))
        cb(ud, err, buf);
}

static void op_fail(struct vmm *vm, int err, const char *fmt, const char *arg)
{
    if (vm->op.err)
        return; /* the first failure is the one to report */
    vm->op.err = err;
    snprintf(vm->op.why, sizeof(vm->op.why), fmt, arg);
}

static void op_step(struct vmm *vm);

static void on_op_reply(void *ud, int err, const char *json)
{
    struct vmm *vm = ud;

    if (vm->op.kind == VMM_OP_NONE)
        return;
    vm->op.replies--;
    if (err)
        op_fail(vm, -EIO, "QEMU refused: %.200s", json);
    op_step(vm);
}

/* "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)" from query-version. */
static void on_version(void *ud, int err, const char *json)
{
    struct vmm *vm = ud;
    json_t *o = err ? NULL : json_loads(json, 0, NULL), *q = json_object_get(o, "qemu");
    const char *pkg = json_string_value(json_object_get(o, "package"));

    if (q)
        snprintf(vm->qemu_version, sizeof(vm->qemu_version), "%lld.%lld.%lld%s%.40s%s",
                 (long long)json_integer_value(json_object_get(q, "major")),
                 (long long)json_integer_value(json_object_get(q, "minor")),
                 (long long)json_integer_value(json_object_get(q, "micro")),
                 pkg && *pkg ? " (" : "", pkg ? pkg : "", pkg && *pkg ? ")" : "");
    json_decref(o);
    on_op_reply(vm, err, json);
}

static int op_send(struct vmm *vm, const char *json, vmm_qmp_cb cb)
{
    int r = vmm_qmp_send(vm, &vm->qmp, json, cb, vm);

    if (r == 0)
        vm->op.replies++;
    return r;
}

#define CAPS_JSON                                                                                  \
    "{\"execute\":\"migrate-set-capabilities\",\"arguments\":{\"capabilities\":["                  \
    "{\"capability\":\"x-ignore-shared\",\"state\":true},"                                         \
    "{\"capability\":\"events\",\"state\":true}]}}"

/* Restore: the snapshot checked out; hand its stream to QEMU. */
static int restore_load(struct vmm *vm)
{
    int r;

    if (lseek(vm->op.fd, VMM_SNAP_HDR, SEEK_SET) < 0)
        return -errno;
    vm->op.stage = STG_LOAD;
    if ((r = op_send(vm, CAPS_JSON, on_op_reply)) != 0)
        return r;
    r = vmm_qmp_send_fd(vm, &vm->qmp,
                        "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"wsnap\"}}", vm->op.fd,
                        on_op_reply, vm);
    if (r != 0)
        return r;
    vm->op.replies++;
    return op_send(vm, "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"fd:wsnap\"}}",
                   on_op_reply);
}

static void op_step(struct vmm *vm)
{
    struct vmm_op *op = &vm->op;
    int r;

    if (op->replies > 0 || op->job)
        return;
    switch (op->kind) {
    case VMM_OP_NONE:
        return;
    case VMM_OP_STOP:
    case VMM_OP_CONT:
        op_finish(vm, op->err, op->err ? op->why : NULL);
        return;
    case VMM_OP_SAVE:
        if (op->err) {
            /* A failed migration leaves the (stopped) source as it was. */
            phase_set(vm, VMM_PH_STOPPED);
            op_finish(vm, op->err, op->why);
            return;
        }
        if (!op->mig_done)
            return;
        snprintf(op->info.qemu_version, sizeof(op->info.qemu_version), "%s", vm->qemu_version);
        op->info.mem_mb = vm->mem_mb;
        op->info.vcpus = vm->vcpus;
        /* Only a share=on file is left out of the stream (x-ignore-shared): a clone's
         * private mapping of the template's file is saved whole, like anonymous RAM. */
        op->info.flags = vm->boot == VMM_BOOT_TEMPLATE ? VMM_SNAP_F_SHARED_RAM : 0;
        op->stage = STG_JOB;
        if ((r = job_start(vm, true)) != 0) {
            phase_set(vm, VMM_PH_STOPPED);
            op_finish(vm, r, "snapshot: could not start the writer thread");
        }
        return;
    case VMM_OP_RESTORE:
        if (op->err && !op->mig_done) {
            /* Refused before QEMU read a byte of it (or QEMU refused the
             * command): the VM still waits for a stream. If QEMU rejected
             * the stream itself, it exits and cbs->exited follows. */
            phase_set(vm, VMM_PH_WAITING);
            op_finish(vm, op->err, op->why);
            return;
        }
        if (op->stage == STG_JOB) {
            /* The file checked out (the worker) and QEMU's version is known (QMP), the
             * two done side by side: does the file fit this VM? A delta's pages then go
             * into its RAM (the worker again) before QEMU reads the device state. */
            if (vmm_snap_match(&op->info, vm->qemu_version, vm->mem_mb, vm->vcpus, vm->mem_file,
                               op->why, sizeof(op->why)) != 0) {
                phase_set(vm, VMM_PH_WAITING);
                op_finish(vm, -EINVAL, op->why);
                return;
            }
            if (op->info.flags & VMM_SNAP_F_DELTA) {
                op->stage = STG_PAGES;
                r = job_start(vm, false);
            } else {
                r = restore_load(vm);
            }
            if (r != 0) {
                op_fail(vm, r, "restore: %s", strerror(-r));
                if (op->replies == 0 && !op->job)
                    op_step(vm);
            }
            return;
        }
        if (op->stage == STG_LOAD && op->mig_done) {
            if (vm->phase == VMM_PH_RESTORING)
                phase_set(vm, VMM_PH_STOPPED);
            /* Its RAM file's checksum, for the deltas it will write over the file. */
            if (op->info.flags & VMM_SNAP_F_RAM_CRC) {
                vm->ram_crc = op->info.ram_crc;
                vm->ram_crc_known = true;
            }
            if (vm->mem_rfd >= 0) { /* checked */
                close(vm->mem_rfd);
                vm->mem_rfd = -1;
            }
            op_finish(vm, 0, NULL);
        }
        return;
    }
}

static void on_job(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;
    struct vmm_job *j = vm->op.job;
    uint64_t v;
    int r;

    if (!j || read(j->efd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        return;
    ev_io_stop(loop, w);
    vm->op.job = NULL;
    vmm_enter(vm);
    if (vm->op.kind == VMM_OP_SAVE) {
        /* A saved template's RAM file is the clones' base from now on. */
        phase_set(vm, !j->err && vm->boot == VMM_BOOT_TEMPLATE ? VMM_PH_SEALED : VMM_PH_STOPPED);
        if (j->err)
            unlink(vm->op.tmp);
        else if (!j->ram && (j->info.flags & VMM_SNAP_F_RAM_CRC)) { /* of the file it maps */
            vm->ram_crc = j->info.ram_crc;
            vm->ram_crc_known = true;
        }
        op_finish(vm, j->err, j->err ? j->why : NULL);
    } else if (j->err) {
        /* Half a delta's pages in its RAM: this QEMU can never be restored right. */
        if (j->touched)
            vmm_kill(vm);
        op_fail(vm, j->err, "%s", j->why);
        if (vm->op.replies == 0) /* else the version's reply finishes it (op_step) */
            op_step(vm);
    } else if (!j->pages) {
        vm->op.info = j->info; /* checked: op_step matches it once QEMU's version is in */
        op_step(vm);
    } else if ((r = restore_load(vm)) != 0) {
        op_fail(vm, r, "restore: %s", strerror(-r));
        if (vm->op.replies == 0)
            op_step(vm);
    }
    job_unref(j);
    vmm_leave(vm);
}

void vmm_qmp_event(struct vmm *vm, const char *ev, const char *status)
{
    if (strcmp(ev, "STOP") == 0) {
        if (vm->phase == VMM_PH_BOOTING || vmm_phase_guest_runs(vm->phase))
            phase_set(vm, VMM_PH_STOPPED);
    } else if (strcmp(ev, "RESUME") == 0) {
        if (vm->phase == VMM_PH_BOOTING || vm->phase == VMM_PH_STOPPED ||
            vm->phase == VMM_PH_RESTORING)
            phase_set(vm, VMM_PH_RUNNING);
    } else if (strcmp(ev, "MIGRATION") == 0 && status) {
        if (vm->op.kind != VMM_OP_SAVE && vm->op.kind != VMM_OP_RESTORE)
            return;
        if (strcmp(status, "completed") == 0)
            vm->op.mig_done = true;
        else if (strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0)
            op_fail(vm, -EIO, "migration %s (see qemu.log)", status);
        else
            return;
        op_step(vm);
    }
}

static int op_begin(struct vmm *vm, enum vmm_op_kind kind, vmm_op_cb cb, void *ud)
{
    if (!vm)
        return -EINVAL;
    if (!vmm_phase_live(vm->phase))
        return -ESRCH;
    if (vm->op.kind != VMM_OP_NONE)
        return -EBUSY;
    memset(&vm->op, 0, sizeof(vm->op));
    vm->op.kind = kind;
    vm->op.cb = cb;
    vm->op.ud = ud;
    vm->op.fd = -1;
    return 0;
}

/* An operation in progress answers -EBUSY before any phase rule: the phase
 * it put the VM in (SAVING, RESTORING) is its own doing. */
static bool busy(const struct vmm *vm)
{
    return vm && vmm_phase_live(vm->phase) && vm->op.kind != VMM_OP_NONE;
}

static int stop_cont(struct vmm *vm, bool stop, vmm_op_cb cb, void *ud)
{
    int r;

    if (busy(vm))
        return -EBUSY;
    if (vm && vmm_phase_live(vm->phase) &&
        !(stop ? vmm_phase_can_stop(vm->phase) : vmm_phase_can_cont(vm->phase)))
        return -EPERM;
    if ((r = op_begin(vm, stop ? VMM_OP_STOP : VMM_OP_CONT, cb, ud)) != 0)
        return r;
    if ((r = op_send(vm, stop ? "{\"execute\":\"stop\"}" : "{\"execute\":\"cont\"}",
                     on_op_reply)) != 0)
        op_clear(vm);
    return r;
}

int vmm_freeze(struct vmm *vm)
{
    if (!vm)
        return -EINVAL;
    if (!vmm_phase_live(vm->phase) || vm->pidfd < 0)
        return -ESRCH;
    if (vm->frozen)
        return 0;
    if (busy(vm) || vm->qmp.fly_head || vm->qmp.wait_head)
        return -EBUSY;
    if (!vmm_phase_guest_runs(vm->phase))
        return -EPERM;
    if (sys_pidfd_signal(vm->pidfd, SIGSTOP) != 0)
        return -errno;
    vm->frozen = true;
    return 0;
}

int vmm_thaw(struct vmm *vm)
{
    if (!vm)
        return -EINVAL;
    if (!vm->frozen)
        return 0;
    if (vm->pidfd < 0 || sys_pidfd_signal(vm->pidfd, SIGCONT) != 0)
        return vm->pidfd < 0 ? -ESRCH : -errno;
    vm->frozen = false;
    /* A page-out still going would only evict what the guest is about to touch. */
    if (vm->po)
        __atomic_store_n(&vm->po->cancel, 1, __ATOMIC_RELEASE);
    return 0;
}

/* ---- a waiting QEMU's TCG buffer, touched ahead in slices (vmm_prefault.c) ---- */

/* Pages per slice: ~16 first touches, 0.2-0.3 ms of the loop here. */
#define PF_SLICE 16

void vmm_pf_stop(struct vmm *vm)
{
    vm->pf_want = 0;
    if (vm->pf.mem < 0)
        return;
    ev_idle_stop(vm->loop, &vm->pf_w);
    vmm_pf_close(&vm->pf);
}

static void on_pf_idle(struct ev_loop *loop, ev_idle *w, int revents)
{
    struct vmm *vm = w->data;
    int r;

    (void)revents;
    if ((r = vmm_pf_step(&vm->pf, PF_SLICE)) > 0)
        return;
    ev_now_update(loop);
    vm->pf_ms = (ev_now(loop) - vm->pf_t0) * 1e3;
    vm->pf_done = r == 0;
    vmm_pf_stop(vm);
}

/* QEMU is past its start-up (it answered query-status) and its guest never ran. */
static int pf_begin(struct vmm *vm, uint64_t bytes)
{
    int r;

    vm->pf_want = 0;
    if ((r = vmm_pf_open(vm->pid, vm->pidfd, bytes, &vm->pf)) != 0)
        return r == -ENOENT ? 0 : r;
    ev_now_update(vm->loop);
    vm->pf_t0 = ev_now(vm->loop);
    ev_idle_start(vm->loop, &vm->pf_w);
    return 0;
}

int vmm_prefault_tcg(struct vmm *vm, uint64_t bytes)
{
    if (!vm)
        return -EINVAL;
    if (!vmm_phase_live(vm->phase) || vm->pidfd < 0)
        return -ESRCH;
    if (vm->phase != VMM_PH_WAITING || vm->op.kind != VMM_OP_NONE)
        return -EPERM;
    if (vm->pf.mem >= 0 || vm->pf_want || vm->pf_done)
        return -EBUSY;
    if (!vmm_qmp_ready(vm)) {
        vm->pf_want = bytes; /* on_status starts it */
        return 0;
    }
    return pf_begin(vm, bytes);
}

uint64_t vmm_prefault_touched(const struct vmm *vm, double *ms)
{
    if (!vm)
        return 0;
    if (ms)
        *ms = vm->pf_done ? vm->pf_ms : -1;
    return vm->pf.touched;
}

/* ---- page-out of a frozen VM: a worker thread runs vmm_pageout_run ---- */

static void po_unref(struct vmm_po *p)
{
    if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    if (p->efd >= 0)
        close(p->efd);
    if (p->pidfd >= 0)
        close(p->pidfd);
    free(p);
}

static void *po_main(void *arg)
{
    struct vmm_po *p = arg;
    uint64_t one = 1;

    p->err = vmm_pageout_run(p->pid, p->pidfd, &p->cancel, &p->st, p->why, sizeof(p->why));
    (void)!write(p->efd, &one, sizeof(one));
    po_unref(p);
    return NULL;
}

/* The VM is going away (or its process ended): the thread stops at its next mapping
 * and nobody is told. */
static void po_drop(struct vmm *vm)
{
    if (!vm->po)
        return;
    ev_io_stop(vm->loop, &vm->po_w);
    __atomic_store_n(&vm->po->cancel, 1, __ATOMIC_RELEASE);
    po_unref(vm->po);
    vm->po = NULL;
}

static void on_po(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;
    struct vmm_po *p = vm->po;
    vmm_op_cb cb = vm->po_cb;
    void *ud = vm->po_ud;
    uint64_t v;
    char why[240];
    int err;

    (void)revents;
    if (!p || read(p->efd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        return;
    ev_io_stop(loop, w);
    err = p->err;
    snprintf(why, sizeof(why), "%s", p->why);
    vm->po = NULL;
    vm->po_cb = NULL;
    vm->po_ud = NULL;
    po_unref(p);
    if (cb)
        cb(ud, err, why);
}

bool vmm_pageout_busy(const struct vmm *vm)
{
    return vm && vm->po;
}

void vmm_pageout_cancel(struct vmm *vm)
{
    if (!vm || !vm->po)
        return;
    __atomic_store_n(&vm->po->cancel, 1, __ATOMIC_RELEASE);
    vm->po_cb = NULL;
    vm->po_ud = NULL;
}

int vmm_pageout(struct vmm *vm, vmm_op_cb cb, void *ud)
{
    struct vmm_po *p;
    int r;

    if (!vm)
        return -EINVAL;
    if (!vmm_phase_live(vm->phase) || vm->pidfd < 0)
        return -ESRCH;
    if (!vm->frozen)
        return -EPERM;
    if (vm->po)
        return -EBUSY;
    if (!(p = calloc(1, sizeof(*p))))
        return -ENOMEM;
    p->refs = 2;
    p->pid = vm->pid;
    p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->pidfd = fcntl(vm->pidfd, F_DUPFD_CLOEXEC, 3);
    if (p->efd < 0 || p->pidfd < 0) {
        r = -errno;
        p->refs = 1;
        po_unref(p);
        return r;
    }
    if ((r = start_detached(po_main, p)) != 0) {
        p->refs = 1;
        po_unref(p);
        return -r;
    }
    vm->po = p;
    vm->po_cb = cb;
    vm->po_ud = ud;
    ev_io_set(&vm->po_w, p->efd, EV_READ);
    ev_io_start(vm->loop, &vm->po_w);
    return 0;
}

bool vmm_frozen(const struct vmm *vm)
{
    return vm && vm->frozen;
}

int vmm_stop(struct vmm *vm, vmm_op_cb cb, void *ud)
{
    return stop_cont(vm, true, cb, ud);
}

int vmm_cont(struct vmm *vm, vmm_op_cb cb, void *ud)
{
    return stop_cont(vm, false, cb, ud);
}

/* xen-save-devices-state's answer: the device state is in the file (no MIGRATION
 * event comes for it). */
static void on_dev_saved(void *ud, int err, const char *json)
{
    struct vmm *vm = ud;

    if (vm->op.kind == VMM_OP_SAVE && !err)
        vm->op.mig_done = true;
    on_op_reply(ud, err, json);
}

/* A delta save's commands: stop, the device state (no RAM) written by QEMU into the
 * file through an fd set (its path is all xen-save-devices-state takes), the fd set
 * dropped again. The worker then appends the pages (vmm_delta_write). */
#define DELTA_FDSET "7007"
static int save_delta(struct vmm *vm)
{
    int wfd, r;

    /* QEMU opens the set's fd write-only: it must be one (the access modes must
     * match); it shares the offset after the header with op.fd. */
    if ((wfd = open(vm->op.tmp, O_WRONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        return -errno;
    if (lseek(wfd, VMM_SNAP_HDR, SEEK_SET) < 0) {
        r = -errno;
        close(wfd);
        return r;
    }
    if ((r = op_send(vm, "{\"execute\":\"stop\"}", on_op_reply)) ||
        (r = op_send(vm, "{\"execute\":\"query-version\"}", on_version))) {
        close(wfd);
        return r;
    }
    r = vmm_qmp_send_fd(vm, &vm->qmp,
                        "{\"execute\":\"add-fd\",\"arguments\":{\"fdset-id\":" DELTA_FDSET "}}",
                        wfd, on_op_reply, vm);
    close(wfd);
    if (r != 0)
        return r;
    vm->op.replies++;
    /* live false: the disks stay active (true would hand them to a migration target). */
    if ((r = vmm_qmp_send(vm, &vm->qmp,
                          "{\"execute\":\"xen-save-devices-state\",\"arguments\":"
                          "{\"filename\":\"/dev/fdset/" DELTA_FDSET "\",\"live\":false}}",
                          on_dev_saved, vm)) != 0)
        return r;
    vm->op.replies++;
    return op_send(vm, "{\"execute\":\"remove-fd\",\"arguments\":{\"fdset-id\":" DELTA_FDSET "}}",
                   on_op_reply);
}

static int save_start(struct vmm *vm, const char *path, const char *ram, unsigned flags,
                      vmm_op_cb cb, void *ud)
{
    struct vmm_op *op;
    int r;

    if (!vm || !path || !*path || (ram && !*ram))
        return -EINVAL;
    if (busy(vm))
        return -EBUSY;
    if (vmm_phase_live(vm->phase) && !vmm_phase_can_save(vm->phase))
        return -EPERM;
    /* A delta is the pages a clone owns over its template's RAM file. */
    if ((flags & VMM_SAVE_DELTA) && (vm->boot != VMM_BOOT_RESTORE || !vm->map_ino || vm->pid <= 0))
        return -ENOTSUP;
    /* A RAM file is made of a booted VM's anonymous RAM, found among QEMU's mappings. */
    if (ram && (vm->mem_file || vm->pid <= 0 || !vmm_ram_anon_find(vm->pid, vm->mem_mb)))
        return -ENOTSUP;
    if ((r = op_begin(vm, VMM_OP_SAVE, cb, ud)) != 0)
        return r;
    op = &vm->op;
    op->nosync = flags & VMM_SAVE_NOSYNC;
    op->delta = (flags & VMM_SAVE_DELTA) || ram;
    if (ram && !(op->ram = strdup(ram))) {
        r = -ENOMEM;
        goto fail;
    }
    if (asprintf(&op->tmp, "%s.tmp", path) < 0) {
        op->tmp = NULL;
        r = -ENOMEM;
        goto fail;
    }
    if (!(op->path = strdup(path))) {
        r = -ENOMEM;
        goto fail;
    }
    /* O_TRUNC: a .tmp left by a crash is garbage. QEMU writes the stream at
     * the fd's offset, after the header's room. */
    op->fd = open(op->tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (op->fd < 0 || lseek(op->fd, VMM_SNAP_HDR, SEEK_SET) < 0) {
        r = -errno;
        goto fail;
    }
    if (op->delta) {
        if ((r = save_delta(vm)) != 0)
            goto sent_fail;
        phase_set(vm, VMM_PH_SAVING);
        return 0;
    }
    /* Stop first: the file must hold one consistent instant. The default 128
     * MiB/s bandwidth cap would make a full-RAM save 4x slower. */
    if ((r = op_send(vm, "{\"execute\":\"stop\"}", on_op_reply)) ||
        (r = op_send(vm, "{\"execute\":\"query-version\"}", on_version)) ||
        (r = op_send(vm, CAPS_JSON, on_op_reply)) ||
        (r = op_send(vm,
                     "{\"execute\":\"migrate-set-parameters\",\"arguments\":"
                     "{\"max-bandwidth\":34359738368}}",
                     on_op_reply)))
        goto sent_fail;
    if ((r = vmm_qmp_send_fd(vm, &vm->qmp,
                             "{\"execute\":\"getfd\",\"arguments\":{\"fdname\":\"wsnap\"}}", op->fd,
                             on_op_reply, vm)) != 0)
        goto sent_fail;
    op->replies++;
    if ((r = op_send(vm, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:wsnap\"}}",
                     on_op_reply)) != 0)
        goto sent_fail;
    phase_set(vm, VMM_PH_SAVING);
    return 0;
sent_fail:
    /* Some commands are out (a stop, perhaps): let their replies finish the
     * operation through its callback rather than leave them dangling. */
    if (op->replies > 0) {
        op_fail(vm, r, "save: %s", strerror(-r));
        phase_set(vm, VMM_PH_SAVING);
        return 0;
    }
fail:
    if (op->tmp)
        unlink(op->tmp);
    op_clear(vm);
    return r;
}

int vmm_save(struct vmm *vm, const char *path, unsigned flags, vmm_op_cb cb, void *ud)
{
    return save_start(vm, path, NULL, flags, cb, ud);
}

int vmm_save_ram(struct vmm *vm, const char *path, const char *ram_path, unsigned flags,
                 vmm_op_cb cb, void *ud)
{
    return save_start(vm, path, ram_path, flags & ~VMM_SAVE_DELTA, cb, ud);
}

int vmm_restore(struct vmm *vm, const char *path, vmm_op_cb cb, void *ud)
{
    int r;

    if (!vm || !path || !*path)
        return -EINVAL;
    if (busy(vm))
        return -EBUSY;
    if (vmm_phase_live(vm->phase) && !vmm_phase_can_restore(vm->phase))
        return -EPERM;
    if ((r = op_begin(vm, VMM_OP_RESTORE, cb, ud)) != 0)
        return r;
    vm->op.fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (vm->op.fd < 0) {
        r = -errno;
        op_clear(vm);
        return r;
    }
    /* The file's check (the worker) and QEMU's version (QMP, which may still be
     * connecting) side by side: op_step goes on once both are in. */
    vm->op.stage = STG_JOB;
    if ((r = op_send(vm, "{\"execute\":\"query-version\"}", on_version)) != 0 ||
        (r = job_start(vm, false)) != 0) {
        if (vm->op.replies == 0) {
            op_clear(vm);
            return r;
        }
        op_fail(vm, r, "restore: %s", strerror(-r)); /* the reply finishes it */
    }
    phase_set(vm, VMM_PH_RESTORING);
    return 0;
}
