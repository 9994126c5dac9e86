/*
 * exec.c - EXEC streams: start a process in its own session, process group
 * and (with cgroup2) cgroup; turn its stdout/stderr into OUT frames under
 * the host's credit; feed its stdin from STDIN frames; enforce the timeout;
 * report EXIT.
 *
 * Start failures: a missing cwd, or an argv[0] that cannot be executed, is
 * an ERROR frame carrying the errno (ENOENT, EACCES, ...) rather than an
 * EXIT 127, so the host can tell "could not start" from "ran and failed".
 * The child reports the step that failed through a close-on-exec pipe; the
 * loop polls that pipe (its EOF means exec succeeded) instead of waiting on
 * it, because under a fork bomb a new child may wait seconds for a CPU and
 * the agent must keep answering meanwhile. Output is not read before the
 * start is settled. A shell command (cmd) whose program is missing is the
 * shell's business: EXIT code 127.
 *
 * EXIT is the last frame of a stream and is sent once both output pipes
 * reached EOF (all output is queued before it) and the child was reaped.
 * Its code is the exit status, or 128 + the signal when the process was
 * killed (sig then names the signal; it is 0 otherwise).
 *
 * Starting: the child is born in a cgroup made ahead (gi_exec_idle) through
 * clone3(CLONE_INTO_CGROUP), vfork-style on x86-64 (spawn_child says why).
 * The agent is suspended until a vfork-style child execs: the child is killed
 * if it has not within GI_SPAWN_GUARD_MS (spawn_vm). Cgroups are named cg-<n>
 * (cgroup2 cannot rename one made ahead); a process finds its own stream id
 * in WARREN_EXEC_ID.
 *
 * Killing: SIGNAL and timeouts signal the process group; SIGKILL also
 * writes cgroup.kill, which reaches processes that left the group (setsid,
 * daemons). A finished exec whose cgroup still holds background processes
 * keeps it (as an orphan entry) until they are gone.
 */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#define USER_UID     1000

/* Pipe ends, as filled by pipe2(): [R] for reading, [W] for writing. */
enum { P_IN_R, P_IN_W, P_OUT_R, P_OUT_W, P_ERR_R, P_ERR_W, P_REP_R, P_REP_W, P__N };

/* Steps of the child's set-up, for the error message of a failed start. */
enum child_step { STEP_SETSID, STEP_CGROUP, STEP_STDIO, STEP_CHDIR, STEP_USER, STEP_EXEC };

/* How long a vfork-style child may take to reach its exec (the agent waits meanwhile). */
#define GI_SPAWN_GUARD_MS 5000

/* One write of at most PIPE_BUF bytes: atomic. */
struct child_report {
    int step;
    int err;
    char arg[256]; /* the cwd or program that failed */
};

struct exec_req {
    char **argv; /* NULL-terminated, owned */
    char **envp; /* NULL-terminated, owned */
    char cwd[PATH_MAX];
    bool cwd_given;
    uid_t uid;
    const char *home;
    bool want_stdin;
    bool pty;
    int pty_slave;      /* the PTY's slave end: the child's fds 0, 1, 2; -1 without a PTY */
    const char *cgroup; /* borrowed from the stream; NULL once the child is born in it */
    bool drop_rr;       /* the child holds the agent's SCHED_RR until its exec */
    int guard_ms;       /* > 0: a vfork-style child, killed if not exec'd by then */
};

/*
 * GI_EXEC_TIMING (a measuring build only: -DCMAKE_C_FLAGS=-DGI_EXEC_TIMING): stamp
 * each step of a foreground exec with CLOCK_MONOTONIC in a page shared with the
 * child, and append one line per exec to XT_LOG once its cgroup is gone, for
 * load/exec_rt.py. Off, XT() is nothing.
 */
#ifdef GI_EXEC_TIMING
#define XT_LOG "/tmp/warren-exec-timing.log"
enum {
    XT_IN,
    XT_PARSED,
    XT_CGROUP,
    XT_PIPES,
    XT_FORKED,
    XC_FORK,
    XC_SIGNALS,
    XC_SETSID,
    XC_CGJOIN,
    XC_OOM,
    XC_STDIO,
    XC_CLOSE,
    XC_CHDIR,
    XC_EXEC,
    XT_STARTED,
    XT_REAPED,
    XT_EOF,
    XT_EXIT,
    XT_RMDIR,
    XT__N
};
static const char *const xt_names[XT__N] = {
    "in",       "parsed",   "cgroup", "pipes",   "forked",  "c_fork",  "c_signals",
    "c_setsid", "c_cgjoin", "c_oom",  "c_stdio", "c_close", "c_chdir", "c_exec",
    "started",  "reaped",   "eof",    "exit",    "rmdir"};
struct xt_rec {
    long long t[XT__N];
    uint32_t id;
    bool open;
    char argv0[32];
};
static struct xt_rec *xt;

static long long xt_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void xt_flush(void)
{
    FILE *f;

    if (!xt || !xt->open)
        return;
    xt->open = false;
    f = fopen(XT_LOG, "ae");
    if (!f)
        return;
    fprintf(f, "exec %u argv0=%s", xt->id, xt->argv0);
    for (int i = 0; i < XT__N; i++)
        fprintf(f, " %s=%lld", xt_names[i], xt->t[i] ? (xt->t[i] - xt->t[XT_IN]) / 1000 : -1);
    fputc('\n', f);
    fclose(f);
}

static void xt_begin(uint32_t id)
{
    if (!xt) {
        xt = mmap(NULL, sizeof(*xt), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (xt == MAP_FAILED) {
            xt = NULL;
            return;
        }
    }
    xt_flush();
    memset(xt, 0, sizeof(*xt));
    xt->id = id;
    xt->open = true;
    xt->t[XT_IN] = xt_now();
}
#define XT(i)                                                                                      \
    do {                                                                                           \
        if (xt && xt->open && !xt->t[i])                                                           \
            xt->t[i] = xt_now();                                                                   \
    } while (0)
#define XT_ID(n) (xt && xt->open && xt->id == (n))
#else
#define XT(i)        ((void)0)
#define xt_begin(id) ((void)0)
#define xt_flush()   ((void)0)
#define XT_ID(id)    false
#endif

/* ---- request parsing ---- */

static void strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

static char *str_dup(const char *p, size_t n)
{
    char *s;

    if (memchr(p, '\0', n))
        return NULL;
    s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

static int parse_argv(const struct proto_frame *f, struct exec_req *req)
{
    const msgpack_object_array *arr;

    if (req->pty && !proto_has(f, PK_ARGV) && !proto_has(f, PK_CMD)) {
        /* A terminal without a command: a login shell. */
        req->argv = calloc(3, sizeof(char *));
        if (!req->argv)
            return -ENOMEM;
        req->argv[0] = strdup("/bin/sh");
        req->argv[1] = strdup("-l");
        return req->argv[0] && req->argv[1] ? 0 : -ENOMEM;
    }
    if (proto_has(f, PK_ARGV) == proto_has(f, PK_CMD))
        return -EINVAL; /* exactly one of argv and cmd */
    if (proto_has(f, PK_CMD)) {
        req->argv = calloc(4, sizeof(char *));
        if (!req->argv)
            return -ENOMEM;
        req->argv[0] = strdup("/bin/sh");
        req->argv[1] = strdup("-c");
        req->argv[2] = str_dup(f->v[PK_CMD].s.p, f->v[PK_CMD].s.len);
        return req->argv[0] && req->argv[1] && req->argv[2] ? 0 : -EINVAL;
    }
    arr = f->v[PK_ARGV].arr;
    if (arr->size == 0)
        return -EINVAL;
    req->argv = calloc(arr->size + 1, sizeof(char *));
    if (!req->argv)
        return -ENOMEM;
    for (uint32_t i = 0; i < arr->size; i++) {
        req->argv[i] = str_dup(arr->ptr[i].via.str.ptr, arr->ptr[i].via.str.size);
        if (!req->argv[i])
            return -EINVAL;
    }
    return 0;
}

static int parse_user(const struct proto_frame *f, struct exec_req *req)
{
    const struct proto_str *u = &f->v[PK_USER].s;

    if (!proto_has(f, PK_USER) || (u->len == 4 && memcmp(u->p, "root", 4) == 0)) {
        req->uid = 0;
        req->home = "/root";
    } else if (u->len == 4 && memcmp(u->p, "user", 4) == 0) {
        req->uid = USER_UID;
        req->home = "/home/user";
    } else {
        return -EINVAL;
    }
    return 0;
}

/* Set "key=value" in envp (n entries used), replacing an entry with the same key. */
static int env_set(char **envp, size_t *n, const char *key, size_t klen, const char *val,
                   size_t vlen)
{
    char *kv;

    if (klen == 0 || memchr(key, '=', klen) || memchr(key, '\0', klen) || memchr(val, '\0', vlen))
        return -EINVAL;
    if (asprintf(&kv, "%.*s=%.*s", (int)klen, key, (int)vlen, val) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < *n; i++) {
        if (strncmp(envp[i], kv, klen + 1) == 0) {
            free(envp[i]);
            envp[i] = kv;
            return 0;
        }
    }
    envp[(*n)++] = kv;
    return 0;
}

/*
 * Defaults first, then the request's env overrides them, then WARREN_EXEC_ID:
 * the stream id, which no request can override (a program that speaks the
 * channel itself, like tests/hostile, needs it; cgroup names carry no id).
 */
static int build_env(const struct proto_frame *f, struct exec_req *req)
{
    const msgpack_object_map *m = proto_has(f, PK_ENV) ? f->v[PK_ENV].map : NULL;
    const char *user = req->uid ? "user" : "root";
    const char *defs[][2] = {{"PATH", DEFAULT_PATH},
                             {"HOME", req->home},
                             {"USER", user},
                             {"LANG", "C.UTF-8"},
                             {"TERM", req->pty ? "xterm-256color" : "xterm"}};
    size_t n = 0, cap = 5 + (m ? m->size : 0) + 1 + 1;
    char id[16];
    int r = 0;

    req->envp = calloc(cap, sizeof(char *));
    if (!req->envp)
        return -ENOMEM;
    for (size_t i = 0; i < 5 && r == 0; i++)
        r = env_set(req->envp, &n, defs[i][0], strlen(defs[i][0]), defs[i][1], strlen(defs[i][1]));
    for (uint32_t i = 0; m && i < m->size && r == 0; i++) {
        const msgpack_object_str *k = &m->ptr[i].key.via.str, *v = &m->ptr[i].val.via.str;
        r = env_set(req->envp, &n, k->ptr, k->size, v->ptr, v->size);
    }
    snprintf(id, sizeof(id), "%u", f->id);
    if (r == 0)
        r = env_set(req->envp, &n, "WARREN_EXEC_ID", 14, id, strlen(id));
    return r;
}

/* cwd defaults to HOME; a relative cwd is taken relative to HOME. */
static int parse_cwd(const struct proto_frame *f, struct exec_req *req)
{
    char rel[PATH_MAX];
    int r;

    req->cwd_given = proto_has(f, PK_CWD) && f->v[PK_CWD].s.len > 0;
    if (!req->cwd_given) {
        snprintf(req->cwd, sizeof(req->cwd), "%s", req->home);
        return 0;
    }
    r = proto_str_copy(&f->v[PK_CWD].s, rel, sizeof(rel));
    if (r < 0)
        return r;
    if (rel[0] == '/') {
        memcpy(req->cwd, rel, strlen(rel) + 1);
        return 0;
    }
    if ((size_t)snprintf(req->cwd, sizeof(req->cwd), "%s/%s", req->home, rel) >= sizeof(req->cwd))
        return -ENAMETOOLONG;
    return 0;
}

static int parse_request(const struct proto_frame *f, struct exec_req *req)
{
    int r;

    r = parse_argv(f, req);
    if (r == 0)
        r = parse_user(f, req);
    if (r == 0)
        r = build_env(f, req);
    if (r == 0)
        r = parse_cwd(f, req);
    req->want_stdin = proto_has(f, PK_STDIN) && f->v[PK_STDIN].b;
    return r;
}

static void req_free(struct exec_req *req)
{
    strv_free(req->argv);
    strv_free(req->envp);
}

/* ---- cgroups ---- */

static void orphans_tidy(struct gi_agent *a);

int gi_cg_write(const char *dir, const char *file, const char *val)
{
    char path[PATH_MAX];
    int fd, r = 0;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, file) >= sizeof(path))
        return -ENAMETOOLONG;
    fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (write(fd, val, strlen(val)) < 0)
        r = -errno;
    close(fd);
    return r;
}

/* Make one exec cgroup, <root>/cg-<n>, with its pids limit, and open it for clone3. */
static int cg_make(struct gi_agent *a, struct gi_cg *out)
{
    const char *root = a->opts->cgroup_root;
    char *path = NULL;
    int r = -EEXIST, fd;

    /* A name left by an earlier agent (a unit test reusing its root) is skipped. */
    for (int tries = 0; tries < 64 && r == -EEXIST; tries++) {
        free(path);
        if (asprintf(&path, "%s/cg-%u", root, ++a->cg_seq) < 0)
            return -ENOMEM;
        r = mkdir(path, 0755) == 0 ? 0 : -errno;
    }
    if (r < 0)
        goto fail;
    /* One exec may hold at most a quarter of the sandbox's pids, so a fork bomb leaves
     * room for the next command (fails quietly where the pids controller is absent). */
    gi_cg_write(path, "pids.max", "1024");
    fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        r = -errno;
        rmdir(path);
        goto fail;
    }
    *out = (struct gi_cg){.path = path, .fd = fd};
    return 0;
fail:
    free(path);
    return r;
}

/*
 * The cgroup of a new exec: one made ahead by gi_exec_idle, or a new one when
 * the pool is empty (execs faster than the loop turns). No cgroup2: path NULL.
 */
static int cgroup_take(struct gi_agent *a, struct gi_cg *out)
{
    *out = (struct gi_cg){.path = NULL, .fd = -1};
    if (!a->opts->cgroup_root)
        return 0;
    if (a->cg_npool > 0) {
        *out = a->cg_pool[--a->cg_npool];
        return 0;
    }
    return cg_make(a, out);
}

void gi_exec_idle(struct gi_agent *a)
{
    if (a->cg_tidy) {
        a->cg_tidy = false;
        orphans_tidy(a);
    }
    while (a->opts->cgroup_root && a->cg_npool < GI_CG_POOL &&
           cg_make(a, &a->cg_pool[a->cg_npool]) == 0)
        a->cg_npool++;
}

/* The kernel's struct clone_args up to `cgroup` (CLONE_ARGS_SIZE_VER2): glibc has no
 * wrapper, and <linux/sched.h> clashes with <sched.h>. */
struct gi_clone_args {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
        set_tid_size, cgroup;
};
#define GI_CLONE_INTO_CGROUP 0x200000000ULL
#ifndef SYS_clone3
#define SYS_clone3 435
#endif

static _Noreturn void child_run(const struct exec_req *req, const int p[P__N]);

#if defined(__SANITIZE_ADDRESS__)
#define GI_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GI_ASAN 1
#endif
#endif
#ifdef GI_ASAN
#include <sanitizer/asan_interface.h>
#endif

#if defined(__x86_64__)
#define GI_SPAWN_VM    1
#define GI_SPAWN_STACK (256 * 1024) /* child_execvp keeps a path on it; argv: spawn_vm */
#define GI_SPAWN_GUARD 4096

/*
 * A POSIX timer that SIGKILLs this child after ms unless it execs first: execve
 * deletes a process's timers, so the program never sees it. SIGKILL ends even a
 * stopped child or one in a killable wait (a lease break, FUSE), which releases
 * the agent suspended in spawn_vm. Raw syscalls: glibc's timer_create may allocate.
 */
static int child_guard(int ms)
{
    struct sigevent sev = {.sigev_notify = SIGEV_SIGNAL, .sigev_signo = SIGKILL};
    struct itimerspec its = {.it_value = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L}};
    int id;

    if (syscall(SYS_timer_create, CLOCK_MONOTONIC, &sev, &id) != 0)
        return -1;
    return syscall(SYS_timer_settime, id, 0, &its, NULL) == 0 ? 0 : -1;
}

struct spawn_arg {
    const struct exec_req *req;
    const int *p;
    int guard_err; /* set by a child that could not arm its guard (it exits at once) */
};

/* The child's first code. Without a guard it does not go on (the agent would wait on it
 * unbounded): it says why and exits, and spawn_vm forks this exec instead. */
static void spawn_entry(void *arg)
{
    struct spawn_arg *sa = arg;

    if (sa->req->guard_ms > 0 && child_guard(sa->req->guard_ms) != 0) {
        sa->guard_err = errno;
        _exit(127);
    }
    child_run(sa->req, sa->p);
}

/*
 * clone3 whose child starts on ca->stack in fn(arg) and never returns: with
 * CLONE_VM the child may not come back through a C wrapper, whose return
 * address lives on the stack it would share with the parent. Returns the
 * child's pid or -errno.
 */
static long clone3_fn(struct gi_clone_args *ca, void (*fn)(void *), void *arg)
{
    register void (*r12)(void *) __asm__("r12") = fn;
    register void *r13 __asm__("r13") = arg;
    long ret;

    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t" /* the child: a fresh stack, no frames above */
                     "mov %%r13, %%rdi\n\t"
                     "call *%%r12\n\t"
                     "mov $60, %%eax\n\t" /* SYS_exit(127), should fn ever return */
                     "mov $127, %%edi\n\t"
                     "syscall\n\t"
                     "hlt\n\t"
                     "1:\n\t"
                     : "=a"(ret)
                     : "a"((long)SYS_clone3), "D"(ca), "S"(sizeof(*ca)), "r"(r12), "r"(r13)
                     : "rcx", "r11", "memory");
    return ret;
}

/*
 * posix_spawn's way: CLONE_VM | CLONE_VFORK, so no page table is copied and
 * no page faulted copy-on-write by either side (dear under TCG: the agent's
 * fork cost more than a whole fork+exec+wait of /bin/true). We are suspended
 * until the child execs or exits; so that a fork bomb in another exec cannot
 * stretch that, the child keeps our real-time priority (SCHED_RESET_ON_FORK is
 * lifted around the clone) and drops it just before the exec. A child can
 * still block before its exec (an open that waits: a FUSE file, a leased file;
 * a SIGSTOP from a sandbox process): it arms a SIGKILL timer first
 * (child_guard), so the agent is suspended for at most req->guard_ms, and the
 * exec ends as killed (EXIT sig 9). The child writes nothing of ours but errno
 * (we are stopped meanwhile).
 */
static long spawn_vm(struct exec_req *req, const int p[P__N], int cgfd)
{
    static char *stack;
    static size_t size;
    static int rr = -1;
    struct sched_param sp = {.sched_priority = 1};
    struct spawn_arg sa = {.req = req, .p = p};
    struct gi_clone_args ca = {.flags = CLONE_VM | CLONE_VFORK, .exit_signal = SIGCHLD};
    const char *cg = req->cgroup;
    size_t argc = 0, need;
    int64_t t0;
    long r;

    /* child_execve copies argv into a /bin/sh argv on this stack (a file without #!): room for
     * any argc a frame can carry; a guard page below turns an overflow into the child's
     * SIGSEGV rather than a write into our memory. */
    while (req->argv[argc])
        argc++;
    need = (GI_SPAWN_STACK + (argc + 2) * sizeof(char *) + 0xffff) & ~(size_t)0xffff;
    if (need > size) {
        char *base;
        if (stack)
            munmap(stack - GI_SPAWN_GUARD, size + GI_SPAWN_GUARD);
        stack = NULL;
        size = 0;
        base = mmap(NULL, need + GI_SPAWN_GUARD, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK | MAP_NORESERVE, -1, 0);
        if (base == MAP_FAILED)
            return -ENOMEM;
        if (mprotect(base, GI_SPAWN_GUARD, PROT_NONE) != 0) {
            munmap(base, need + GI_SPAWN_GUARD);
            return -ENOMEM;
        }
        stack = base + GI_SPAWN_GUARD;
        size = need;
    }
    if (rr < 0)
        rr = sched_getscheduler(0) == (SCHED_RR | SCHED_RESET_ON_FORK);
    if (cgfd >= 0) {
        ca.flags |= GI_CLONE_INTO_CGROUP;
        ca.cgroup = (uint64_t)cgfd;
        req->cgroup = NULL; /* born there: the child does not join */
    }
    ca.stack = (uint64_t)(uintptr_t)stack;
    ca.stack_size = size;
#ifdef GI_ASAN
    /* The last child's frames never returned: their redzones are still poisoned. */
    ASAN_UNPOISON_MEMORY_REGION(stack, size);
#endif
    req->drop_rr = rr == 1 && sched_setscheduler(0, SCHED_RR, &sp) == 0;
    t0 = gi_now_ms();
    r = clone3_fn(&ca, spawn_entry, &sa);
    if (r > 0 && sa.guard_err) {
        /* RLIMIT_SIGPENDING spent (a timer holds a queued signal): fork this one. */
        gi_log("cannot arm a start guard (%s): forking", strerror(sa.guard_err));
        waitpid((pid_t)r, NULL, 0);
        r = -EAGAIN;
    } else if (r > 0 && req->guard_ms > 0 && gi_now_ms() - t0 >= req->guard_ms) {
        gi_log("pid %ld did not reach its exec within %d ms: killed (or it was slow)", r,
               req->guard_ms);
    }
    if (req->drop_rr)
        sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &sp);
    req->drop_rr = false;
    req->cgroup = cg;
    return r;
}
#endif

/*
 * Start the child (it runs child_run and never returns here); returns its pid
 * or -errno. The child is born inside the cgroup cgfd when there is one:
 * clone3 with CLONE_INTO_CGROUP (Linux 5.7) spares it the write to
 * cgroup.procs, which takes the cgroup threadgroup lock for writing (an RCU
 * grace period: the dearest step of an exec, measured in load/RESULTS.md).
 * Each way a kernel refuses is remembered and the next one used from then on:
 * vfork-style clone3, fork-style clone3, fork() + a write to cgroup.procs.
 */
static pid_t spawn_child(struct exec_req *req, const int p[P__N], int cgfd)
{
    static bool no_clone3, no_vm;
    const char *cg = req->cgroup;
    pid_t pid;

#ifdef GI_SPAWN_VM
    if (!no_vm && !no_clone3) {
        long r = spawn_vm(req, p, cgfd);
        if (r >= 0)
            return (pid_t)r;
        if (r == -ENOSYS || r == -E2BIG || r == -EINVAL || r == -ENOMEM)
            no_vm = true; /* else (EAGAIN: a pids limit) the next ways try as before */
    }
#else
    (void)no_vm;
#endif
    req->guard_ms = 0; /* the agent does not wait for a forked child: nothing to bound */
    if (cgfd >= 0 && !no_clone3) {
        struct gi_clone_args ca = {
            .flags = GI_CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)cgfd};
        req->cgroup = NULL;
        pid = (pid_t)syscall(SYS_clone3, &ca, sizeof(ca));
        if (pid == 0)
            child_run(req, p);
        req->cgroup = cg;
        if (pid > 0)
            return pid;
        if (errno == ENOSYS || errno == E2BIG || errno == EINVAL)
            no_clone3 = true;
    }
    pid = fork();
    if (pid == 0)
        child_run(req, p);
    return pid < 0 ? -errno : pid;
}

static void exec_kill(struct gi_exec *x, int sig)
{
    if (sig == SIGKILL && x->cgroup)
        gi_cg_write(x->cgroup, "cgroup.kill", "1");
    /* The group outlives its leader while members remain, so this works after the reap too;
     * a child still starting may not have called setsid() yet: signal it directly. */
    if (x->pid > 0 && kill(-x->pid, sig) != 0 && x->rep >= 0 && !x->reaped)
        kill(x->pid, sig);
}

/* ---- the child ---- */

static void child_reset_signals(void)
{
    sigset_t none;

    for (int sig = 1; sig < NSIG; sig++)
        signal(sig, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Make fds 0, 1, 2 the child's stdin/stdout/stderr. */
static int child_stdio(const struct exec_req *req, const int p[P__N])
{
    int src[3] = {req->want_stdin ? p[P_IN_R] : open("/dev/null", O_RDONLY | O_CLOEXEC), p[P_OUT_W],
                  p[P_ERR_W]};

    if (req->pty_slave >= 0) {
        /* setsid() ran: the slave becomes this session's controlling terminal. */
        if (ioctl(req->pty_slave, TIOCSCTTY, 0) != 0)
            return -1;
        src[0] = src[1] = src[2] = req->pty_slave;
    }

    /* Lift the sources above 2 first: if PID 1 ran without std fds a pipe may sit on 0..2,
     * and dup2 would clobber one source with another. */
    for (int i = 0; i < 3; i++) {
        if (src[i] < 0)
            return -1;
        if (src[i] < 3 && (src[i] = fcntl(src[i], F_DUPFD_CLOEXEC, 3)) < 0)
            return -1;
    }
    for (int i = 0; i < 3; i++)
        if (dup2(src[i], i) < 0)
            return -1;
    return 0;
}

static void child_oom_default(void)
{
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);

    /* PID 1 runs at -1000 (never OOM-killed); user processes must be killable. */
    if (fd >= 0) {
        if (write(fd, "0", 1) < 0) {
        }
        close(fd);
    }
}

static int child_user(const struct exec_req *req)
{
    if (req->uid == 0)
        return 0;
    if (setgroups(0, NULL) != 0 || setgid(req->uid) != 0 || setuid(req->uid) != 0)
        return -1;
    return 0;
}

/* A value of envp's PATH, or NULL. */
static const char *env_path(char *const *envp)
{
    for (; *envp; envp++)
        if (strncmp(*envp, "PATH=", 5) == 0)
            return *envp + 5;
    return NULL;
}

/* execve, and a file the kernel cannot execute (no #!) run by the shell, as execvp does. */
static void child_execve(const char *file, char *const *argv, char *const *envp)
{
    size_t n = 0;

    execve(file, argv, envp);
    if (errno != ENOEXEC)
        return;
    while (argv[n])
        n++;
    {
        char *sh[n + 2];
        sh[0] = "/bin/sh";
        sh[1] = (char *)file;
        memcpy(&sh[2], &argv[1], n * sizeof(char *)); /* argv[1..n-1] and the NULL */
        execve(sh[0], sh, envp);
    }
    errno = ENOEXEC;
}

/*
 * execvp with the request's PATH, which looks before it leaps: on Linux 6.1
 * every execve that misses (ENOENT) first builds a whole new mm and copies
 * argv and env into it, ~1.5 ms each under TCG, and `true` misses five times
 * in the default PATH. access() skips the misses; the errors left over are
 * execvp's: EACCES if some candidate was not executable, else ENOENT.
 */
static void child_execvp(const struct exec_req *req)
{
    const char *file = req->argv[0], *path = env_path(req->envp), *p, *end;
    bool eacces = false;
    char buf[PATH_MAX];

    if (*file == '\0') {
        errno = ENOENT; /* as execvp: not a lookup of the PATH's directories themselves */
        return;
    }
    if (strchr(file, '/')) {
        child_execve(file, req->argv, req->envp);
        return;
    }
    for (p = path ? path : DEFAULT_PATH;; p = end + 1) {
        int len;

        end = strchrnul(p, ':');
        len = snprintf(buf, sizeof(buf), "%.*s%s%s", (int)(end - p), p, end > p ? "/" : "",
                       file); /* an empty entry is the current directory */
        if (len > 0 && (size_t)len < sizeof(buf)) {
            if (access(buf, X_OK) == 0)
                child_execve(buf, req->argv, req->envp);
            if (errno == EACCES)
                eacces = true;
            else if (errno != ENOENT && errno != ENOTDIR && errno != ESTALE && errno != ENODEV &&
                     errno != ETIMEDOUT)
                return;
        }
        if (*end == '\0')
            break;
    }
    errno = eacces ? EACCES : ENOENT;
}

/* The order matters: join the session and cgroup before anything can fork, drop
 * privileges last (chdir into root-only dirs still works), report failures by step. */
static _Noreturn void child_run(const struct exec_req *req, const int p[P__N])
{
    struct child_report rep = {.step = STEP_SETSID};

    XT(XC_FORK);
    child_reset_signals();
    XT(XC_SIGNALS);
    if (setsid() < 0)
        goto fail;
    XT(XC_SETSID);
    rep.step = STEP_CGROUP;
    if (req->cgroup && (errno = -gi_cg_write(req->cgroup, "cgroup.procs", "0")) != 0)
        goto fail;
    XT(XC_CGJOIN);
    child_oom_default();
    XT(XC_OOM);
    rep.step = STEP_STDIO;
    if (child_stdio(req, p) < 0)
        goto fail;
    XT(XC_STDIO);
    /* Everything should be close-on-exec already; this also covers fds main.c opened. */
    syscall(SYS_close_range, 3, ~0U, CLOSE_RANGE_CLOEXEC);
    XT(XC_CLOSE);
    rep.step = STEP_CHDIR;
    if (chdir(req->cwd) != 0 && (req->cwd_given || chdir("/") != 0))
        goto fail;
    XT(XC_CHDIR);
    rep.step = STEP_USER;
    if (req->drop_rr && sched_setscheduler(0, SCHED_OTHER, &(struct sched_param){0}) != 0)
        goto fail;
    if (child_user(req) < 0)
        goto fail;
    rep.step = STEP_EXEC;
    XT(XC_EXEC);
    child_execvp(req);
fail:
    rep.err = errno;
    if (rep.step == STEP_CHDIR || rep.step == STEP_EXEC) {
        const char *arg = rep.step == STEP_CHDIR ? req->cwd : req->argv[0];
        size_t n = strnlen(arg, sizeof(rep.arg) - 1); /* a long path is cut: it is a message */
        memcpy(rep.arg, arg, n);
    }
    if (write(p[P_REP_W], &rep, sizeof(rep)) < 0) {
    }
    _exit(127);
}

/* ---- the parent ---- */

static void close_fds(int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = -1;
    }
}

static int open_pipes(int p[P__N], bool want_stdin)
{
    static const int ours[] = {P_IN_W, P_OUT_R, P_ERR_R, P_REP_R};

    for (int i = 0; i < P__N; i += 2) {
        if (i == P_IN_R && !want_stdin)
            continue;
        if (pipe2(&p[i], O_CLOEXEC) != 0)
            return -errno;
    }
    /* Our ends never block the loop; the child's ends stay blocking. */
    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (p[ours[i]] >= 0 && fcntl(p[ours[i]], F_SETFL, O_NONBLOCK) != 0)
            return -errno;
    return 0;
}

void gi_exec_start(struct gi_agent *a, const struct proto_frame *f)
{
    struct exec_req req = {.pty_slave = -1};
    struct gi_stream *s;
    struct gi_exec *x;
    struct gi_cg cg = {.fd = -1};
    int p[P__N] = {-1, -1, -1, -1, -1, -1, -1, -1};
    pid_t pid = -1;
    int r;

    if ((proto_has(f, PK_BG) && f->v[PK_BG].b) || proto_has(f, PK_COLS) || proto_has(f, PK_ROWS)) {
        gi_proc_start(a, f);
        return;
    }
    xt_begin(f->id);
    r = parse_request(f, &req);
    XT(XT_PARSED);
#ifdef GI_EXEC_TIMING
    if (xt && r == 0)
        snprintf(xt->argv0, sizeof(xt->argv0), "%s", req.argv[0]);
#endif
    if (r < 0) {
        gi_reply_error(a, f->id, -r, "bad exec request: %s", strerror(-r));
        goto out;
    }
    s = gi_stream_new(a, f->id, GI_EXEC);
    if (!s)
        goto out;
    x = &s->u.x;
    r = cgroup_take(a, &cg);
    x->cgroup = cg.path;
    XT(XT_CGROUP);
    if (r == 0)
        r = open_pipes(p, req.want_stdin);
    XT(XT_PIPES);
    req.cgroup = x->cgroup;
    req.guard_ms = a->opts->spawn_guard_ms > 0 ? a->opts->spawn_guard_ms : GI_SPAWN_GUARD_MS;
    if (r == 0 && (pid = spawn_child(&req, p, cg.fd)) < 0)
        r = pid;
    if (pid > 0)
        XT(XT_FORKED);
    if (r < 0) {
        gi_reply_error(a, f->id, -r, "cannot start: %s", strerror(-r));
        if (x->cgroup)
            rmdir(x->cgroup);
        s->done = true;
        goto out;
    }
    x->pid = pid;
    x->rep = p[P_REP_R];
    x->out[0] = p[P_OUT_R];
    x->out[1] = p[P_ERR_R];
    x->in = p[P_IN_W];
    p[P_REP_R] = p[P_OUT_R] = p[P_ERR_R] = p[P_IN_W] = -1;
    x->credit = PROTO_WINDOW;
    if (proto_has(f, PK_TIMEOUT) && f->v[PK_TIMEOUT].u > 0)
        x->deadline_ms = gi_now_ms() + (int64_t)f->v[PK_TIMEOUT].u;
out:
    close_fds(&cg.fd, 1);
    close_fds(p, P__N); /* the child's ends, or everything after a failure */
    req_free(&req);
}

/* Open a PTY of cols x rows; the size is set before the child can exist. */
static int open_pty(int *master, int *slave, uint16_t cols, uint16_t rows)
{
    struct winsize ws = {.ws_row = rows, .ws_col = cols};
    char name[64];

    /* No grantpt(): devpts already gives the slave its owner and mode, and in a static PID 1
     * older glibc versions would look the tty group up through NSS. */
    *master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (*master < 0)
        return -errno;
    if (unlockpt(*master) != 0 || ptsname_r(*master, name, sizeof(name)) != 0 ||
        ioctl(*master, TIOCSWINSZ, &ws) != 0 || fcntl(*master, F_SETFL, O_NONBLOCK) != 0)
        return -errno;
    *slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    return *slave < 0 ? -errno : 0;
}

static char *join_argv(char *const *argv)
{
    size_t n = 1;
    char *s, *q;

    for (char *const *v = argv; *v; v++)
        n += strlen(*v) + 1;
    s = malloc(n);
    if (!s)
        return NULL;
    q = s;
    for (char *const *v = argv; *v; v++) {
        size_t l = strlen(*v);
        if (q != s)
            *q++ = ' ';
        memcpy(q, *v, l);
        q += l;
    }
    *q = '\0';
    return s;
}

int gi_spawn(struct gi_agent *a, const struct proto_frame *f, bool pty, uint16_t cols,
             uint16_t rows, struct gi_spawn *sp)
{
    struct exec_req req = {.pty = pty, .pty_slave = -1};
    struct gi_cg cg = {.fd = -1};
    int p[P__N] = {-1, -1, -1, -1, -1, -1, -1, -1};
    int master = -1;
    pid_t pid = -1;
    int r;

    *sp = (struct gi_spawn){.pid = -1, .rep = -1, .out = {-1, -1}, .in = -1};
    r = parse_request(f, &req);
    /* A background process always has a stdin pipe (PCTL writes it); a PTY has the master. */
    req.want_stdin = !pty;
    if (r == 0 && pty)
        r = open_pty(&master, &req.pty_slave, cols, rows);
    if (r == 0 && !(sp->cmd = proto_has(f, PK_CMD) ? join_argv(req.argv + 2) : join_argv(req.argv)))
        r = -ENOMEM;
    if (r == 0) {
        r = cgroup_take(a, &cg);
        sp->cgroup = cg.path;
    }
    if (r == 0)
        r = open_pipes(p, req.want_stdin);
    if (r == 0 && pty)
        close_fds(&p[P_OUT_R], 4); /* the PTY carries all output */
    req.cgroup = sp->cgroup;
    req.guard_ms = a->opts->spawn_guard_ms > 0 ? a->opts->spawn_guard_ms : GI_SPAWN_GUARD_MS;
    if (r == 0 && (pid = spawn_child(&req, p, cg.fd)) < 0)
        r = pid;
    if (r < 0) {
        if (sp->cgroup)
            rmdir(sp->cgroup);
        free(sp->cgroup);
        free(sp->cmd);
        sp->cgroup = sp->cmd = NULL;
        close_fds(&master, 1);
        goto out;
    }
    sp->pid = pid;
    sp->rep = p[P_REP_R];
    p[P_REP_R] = -1;
    if (pty) {
        sp->out[0] = master;
        sp->in = master;
    } else {
        sp->out[0] = p[P_OUT_R];
        sp->out[1] = p[P_ERR_R];
        sp->in = p[P_IN_W];
        p[P_OUT_R] = p[P_ERR_R] = p[P_IN_W] = -1;
    }
out:
    close_fds(&cg.fd, 1);
    close_fds(&req.pty_slave, 1); /* the child has it: the master sees EIO once it is gone */
    close_fds(p, P__N);
    req_free(&req);
    return r;
}

/* ---- running streams ---- */

static void send_exit(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;
    struct proto_enc e;
    int code = 0, sig = 0;

    if (WIFEXITED(x->status)) {
        code = WEXITSTATUS(x->status);
    } else if (WIFSIGNALED(x->status)) {
        sig = WTERMSIG(x->status);
        code = 128 + sig;
    }
    if (proto_enc_begin(&e, &a->out, PROTO_EXIT, s->id, 5) != 0)
        return;
    proto_put_i(&e, PK_CODE, code);
    proto_put_i(&e, PK_SIG, sig);
    proto_put_b(&e, PK_TIMED_OUT, x->timed_out);
    proto_enc_end(&e);
}

static void exec_maybe_exit(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;

    if (s->done || x->rep >= 0 || x->out[0] >= 0 || x->out[1] >= 0 || !x->reaped)
        return;
    if (XT_ID(s->id)) {
        XT(XT_EOF);
        XT(XT_EXIT);
    }
    send_exit(a, s);
    /* The cgroup goes after the flush (gi_exec_idle), or once background processes that
     * outlived the exec are gone. */
    gi_orphan_add(a, 0, x->cgroup);
    a->cg_tidy = true;
    x->cgroup = NULL;
    s->done = true;
}

static void send_out(struct gi_agent *a, struct gi_stream *s, int i, const void *p, size_t n)
{
    struct gi_exec *x = &s->u.x;
    struct proto_enc e;

    if (proto_enc_begin(&e, &a->out, PROTO_OUT, s->id, 5) != 0)
        goto fail;
    proto_put_u(&e, PK_FD, (uint64_t)i + 1);
    proto_put_u(&e, PK_OFF, x->off[i]);
    proto_put_bin(&e, PK_DATA, p, n);
    if (proto_enc_end(&e) != 0)
        goto fail;
    return;
fail:
    gi_log("exec %u: lost %zu bytes of output (out of memory)", s->id, n);
}

static void exec_read(struct gi_agent *a, struct gi_stream *s, int i)
{
    static uint8_t buf[PROTO_MAX_DATA];
    struct gi_exec *x = &s->u.x;
    size_t want = x->credit < sizeof(buf) ? (size_t)x->credit : sizeof(buf);
    ssize_t n;

    /* Re-checked per read: many pipes can be ready in one poll round. */
    if (x->out[i] < 0 || want == 0 || gi_out_full(a))
        return;
    n = read(x->out[i], buf, want);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        close_fds(&x->out[i], 1);
        if (XT_ID(s->id) && x->out[0] < 0 && x->out[1] < 0)
            XT(XT_EOF);
        exec_maybe_exit(a, s);
        return;
    }
    send_out(a, s, i, buf, (size_t)n);
    x->off[i] += (uint64_t)n;
    x->credit -= (uint64_t)n;
}

/* Forget a stream without an EXIT: its process (if not reaped) and cgroup become orphans. */
static void exec_forget(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;

    close_fds(&x->rep, 1);
    close_fds(x->out, 2);
    close_fds(&x->in, 1);
    gi_orphan_add(a, x->reaped ? 0 : x->pid, x->cgroup);
    x->cgroup = NULL;
    s->done = true;
    a->cg_tidy = true;
}

int gi_start_report(int fd, char *msg, size_t cap)
{
    static const char *const what[] = {"setsid", "join cgroup", "set up stdio",
                                       "chdir",  "switch user", "exec"};
    struct child_report rep;
    ssize_t n = read(fd, &rep, sizeof(rep));

    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return 1;
    if (n != (ssize_t)sizeof(rep) || rep.step < 0 || rep.step > STEP_EXEC)
        return 0; /* EOF: it exec'd (or died before reporting: its exit status tells) */
    rep.arg[sizeof(rep.arg) - 1] = '\0';
    snprintf(msg, cap, "%s %s: %s", what[rep.step], rep.arg, strerror(rep.err));
    return rep.err > 0 ? -rep.err : -EIO;
}

/* The report pipe of a starting child: EOF means it exec'd (or died: EXIT tells). */
static void exec_started(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;
    char msg[512];
    int r = gi_start_report(x->rep, msg, sizeof(msg));

    if (r == 1)
        return;
    close_fds(&x->rep, 1);
    if (r == 0) {
        if (XT_ID(s->id))
            XT(XT_STARTED);
        exec_maybe_exit(a, s);
        return;
    }
    gi_reply_error(a, s->id, -r, "%s", msg);
    exec_forget(a, s); /* the child _exits at once: reap it and drop its cgroup */
}

/* Write queued stdin; every byte taken off the queue (written or dropped) is credited back. */
static void exec_write_stdin(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;
    uint64_t done = 0;

    while (x->in >= 0 && proto_buf_pending(&x->inq) > 0) {
        size_t left = proto_buf_pending(&x->inq);
        ssize_t n = write(x->in, x->inq.p + x->inq.off, left);
        if (n > 0) {
            proto_buf_consume(&x->inq, (size_t)n);
            done += (uint64_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            break;
        } else {
            /* EPIPE: the child closed its stdin; nobody will read the rest. */
            proto_buf_consume(&x->inq, left);
            done += left;
            close_fds(&x->in, 1);
        }
    }
    if (x->in >= 0 && x->in_eof && proto_buf_pending(&x->inq) == 0)
        close_fds(&x->in, 1);
    if (done)
        proto_send_credit(&a->out, s->id, done);
}

void gi_exec_stdin(struct gi_agent *a, struct gi_stream *s, const struct proto_frame *f)
{
    struct gi_exec *x = &s->u.x;
    const struct proto_str *d = &f->v[PK_DATA].s;

    if (proto_has(f, PK_DATA) && d->len > 0) {
        bool room = proto_buf_pending(&x->inq) + d->len <= GI_STDIN_CAP;
        if (!room)
            gi_log("exec %u: stdin over the credit window; dropping %u bytes", s->id, d->len);
        /* Bytes that cannot be delivered are credited back so the host never stalls. */
        if (x->in < 0 || !room || proto_buf_append(&x->inq, d->p, d->len) != 0)
            proto_send_credit(&a->out, s->id, d->len);
    }
    if (proto_has(f, PK_EOF) && f->v[PK_EOF].b)
        x->in_eof = true;
    exec_write_stdin(a, s);
}

void gi_exec_signal(struct gi_agent *a, struct gi_stream *s, int sig)
{
    if (sig <= 0 || sig >= NSIG) {
        gi_log("exec %u: ignoring signal %d", s->id, sig);
        return;
    }
    exec_kill(&s->u.x, sig);
}

void gi_exec_credit(struct gi_agent *a, struct gi_stream *s, uint64_t n)
{
    struct gi_exec *x = &s->u.x;

    x->credit = n > UINT64_MAX - x->credit ? UINT64_MAX : x->credit + n;
}

int gi_exec_watch(struct gi_agent *a, struct gi_stream *s, struct pollfd *pfd, int *slot)
{
    struct gi_exec *x = &s->u.x;
    bool can_read = x->credit > 0 && !gi_out_full(a) && x->rep < 0;
    int n = 0;

    if (x->rep >= 0) {
        pfd[n] = (struct pollfd){.fd = x->rep, .events = POLLIN};
        slot[n++] = 3;
    }
    /* Without credit the pipes are left alone: they fill and the child blocks. */
    for (int i = 0; i < 2; i++) {
        if (x->out[i] >= 0 && can_read) {
            pfd[n] = (struct pollfd){.fd = x->out[i], .events = POLLIN};
            slot[n++] = i;
        }
    }
    if (x->in >= 0 && proto_buf_pending(&x->inq) > 0) {
        pfd[n] = (struct pollfd){.fd = x->in, .events = POLLOUT};
        slot[n++] = 2;
    }
    return n;
}

void gi_exec_event(struct gi_agent *a, struct gi_stream *s, int slot, short revents)
{
    if (s->done)
        return;
    if (slot < 2)
        exec_read(a, s, slot);
    else if (slot == 2)
        exec_write_stdin(a, s);
    else
        exec_started(a, s);
}

int64_t gi_exec_tick(struct gi_agent *a, struct gi_stream *s, int64_t now)
{
    struct gi_exec *x = &s->u.x;

    if (!x->deadline_ms)
        return 0;
    if (now < x->deadline_ms)
        return x->deadline_ms;
    x->deadline_ms = 0;
    x->timed_out = true;
    exec_kill(x, SIGKILL);
    return 0;
}

/* ---- reaping ---- */

static void on_reaped(struct gi_agent *a, pid_t pid, int status)
{
    for (size_t i = 0; i < a->nstreams; i++) {
        struct gi_stream *s = a->streams[i];
        if (!s->done && s->kind == GI_EXEC && s->u.x.pid == pid && !s->u.x.reaped) {
            if (XT_ID(s->id))
                XT(XT_REAPED);
            s->u.x.reaped = true;
            s->u.x.status = status;
            exec_maybe_exit(a, s);
            return;
        }
    }
    if (gi_proc_reaped(a, pid, status))
        return;
    for (size_t i = 0; i < a->norphans; i++) {
        if (a->orphans[i].pid == pid) {
            a->orphans[i].pid = 0;
            return;
        }
    }
}

/* Drop reaped orphans whose cgroup is gone or could now be removed. */
static void orphans_tidy(struct gi_agent *a)
{
    size_t j = 0;

    for (size_t i = 0; i < a->norphans; i++) {
        struct gi_orphan *o = &a->orphans[i];
        if (o->pid == 0 && (!o->cgroup || rmdir(o->cgroup) == 0 || errno == ENOENT)) {
#ifdef GI_EXEC_TIMING
            if (xt && xt->open && xt->t[XT_EXIT]) {
                XT(XT_RMDIR);
                xt_flush();
            }
#endif
            free(o->cgroup);
        } else
            a->orphans[j++] = *o;
    }
    a->norphans = j;
}

/*
 * As PID 1 every orphan of the VM becomes our child: reap them all, report
 * only ours. Otherwise reap only the processes we started, so an embedding
 * process (a unit test) keeps its own children.
 */
void gi_exec_reap(struct gi_agent *a)
{
    int st;
    pid_t pid;

    if (a->opts->pid1) {
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0)
            on_reaped(a, pid, st);
    } else {
        for (size_t i = 0; i < a->nstreams; i++) {
            struct gi_exec *x = &a->streams[i]->u.x;
            if (a->streams[i]->kind != GI_EXEC || a->streams[i]->done || x->reaped || x->pid <= 0)
                continue;
            if (waitpid(x->pid, &st, WNOHANG) == x->pid)
                on_reaped(a, x->pid, st);
        }
        gi_proc_reap_own(a);
        for (size_t i = 0; i < a->norphans; i++) {
            pid = a->orphans[i].pid;
            if (pid > 0 && waitpid(pid, &st, WNOHANG) == pid)
                a->orphans[i].pid = 0;
        }
    }
    /* rmdir waits for the flush: gi_exec_idle. */
    a->cg_tidy = true;
}

/* Session end: kill everything the exec started and forget the stream (no EXIT). */
void gi_exec_abort(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;

    exec_kill(x, SIGKILL);
    exec_forget(a, s);
}

void gi_exec_release(struct gi_stream *s)
{
    struct gi_exec *x = &s->u.x;

    close_fds(&x->rep, 1);
    close_fds(x->out, 2);
    close_fds(&x->in, 1);
    proto_buf_free(&x->inq);
    free(x->cgroup);
    x->cgroup = NULL;
}

/* Final cleanup: wait for the killed orphans, then remove their cgroups. */
void gi_orphans_wait(struct gi_agent *a)
{
    for (size_t i = 0; i < a->norphans; i++) {
        struct gi_orphan *o = &a->orphans[i];
        if (o->pid > 0 && waitpid(o->pid, NULL, 0) < 0 && errno != ECHILD)
            gi_log("waitpid %d: %s", (int)o->pid, strerror(errno));
        o->pid = 0;
    }
    /* A process killed through cgroup.kill that had left the group is not ours to wait
     * for: its cgroup stays busy until the kernel has finished it, a moment later. Retry
     * for up to a second rather than leave the directory behind. */
    orphans_tidy(a);
    for (int tries = 0; a->norphans > 0 && tries < 100; tries++) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        orphans_tidy(a);
    }
    for (size_t i = 0; i < a->norphans; i++)
        free(a->orphans[i].cgroup);
    a->norphans = 0;
    while (a->cg_npool > 0) {
        struct gi_cg *c = &a->cg_pool[--a->cg_npool];
        close(c->fd);
        rmdir(c->path);
        free(c->path);
    }
}
