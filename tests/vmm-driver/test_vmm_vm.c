/*
 * test_vmm_vm.c - the vmm-driver against real QEMU microVMs on libev's
 * default loop (as warrend runs it: libev reaps children there itself).
 *
 * Images: $WARREN_IMAGE_DIR, else ${WARREN_CACHE:-$HOME/.cache/warren}/images/current,
 * holding vmlinux and initramfs.cpio (minimal.ext4 is used as a root disk
 * when present). Exit 77 (ctest SKIP) when they are absent.
 *
 * Covered: launch -> QMP handshake (query-status running), replies in order,
 * QMP errors, channel fd delivered from the loop; detach + adopt from a second
 * struct (QMP and channel again, pid-reuse guard); vmm_kill -> exited exactly
 * once with "killed by signal 9"; QMP quit; guest panic -> exit reason;
 * QEMU startup failure -> reason from qemu.log; a chatty console stays under
 * its cap; vmm_free of a running VM kills and reaps it without blocking;
 * QEMU's own output stays under its cap (qemu.log); a jailed VM (as root
 * with cgroups) runs under its uid, in its cgroup, seeing only its run dir
 * and the read-only images, and gives both back when it is gone; phases
 * (booting -> running, adopted -> running, exited); a template VM with its RAM
 * in a share=on file saved, a damaged snapshot refused, clones restored from
 * it (waiting -> restoring -> stopped -> running) over overlays backed by the
 * template's overlay, holding the template's file, their own writes private.
 * WARREN_VMM_ONLY_SNAP=1 runs only the snapshot part.
 * Prints: clone timings (launch -> QMP -> restored -> running -> PONG), launch -> QMP ready, launch
 * -> channel, idle RSS/PSS, the cost of vmm_launch jailed and not.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <ev.h>

#include "vmm.h"

int failures;
static struct ev_loop *loop;
static char tmp[64], img[1024], kernel[1200], initrd[1200], rootfs[1200];
static bool have_rootfs;

#include "check.h"

/* Run the loop until cond holds or secs pass; a ticking timer bounds each turn. */
#define WAIT(cond, secs)                                                                           \
    do {                                                                                           \
        ev_tstamp end_ = ev_time() + (secs);                                                       \
        while (!(cond) && ev_time() < end_)                                                        \
            ev_run(loop, EVRUN_ONCE);                                                              \
    } while (0)

static void on_tick(struct ev_loop *l, ev_timer *w, int revents) {}

/* Every VM this test starts runs in its own session: a failed check must not
 * leave one behind, so all are SIGKILLed at exit (if still ours by name). */
static pid_t started[64];
static int nstarted;

static void track(pid_t pid)
{
    if (pid > 0 && nstarted < 64)
        started[nstarted++] = pid;
}

static void kill_started(void)
{
    for (int i = 0; i < nstarted; i++) {
        char path[64], buf[4096];
        ssize_t n;
        int fd;
        snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)started[i]);
        if ((fd = open(path, O_RDONLY)) < 0)
            continue;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n > 0 && memmem(buf, (size_t)n, "warren-t-", 9))
            kill(started[i], SIGKILL);
    }
}

struct vmctx {
    struct vmm *vm;
    bool free_on_channel, free_on_exit; /* vmm_free from inside the callback */
    bool free_on_phase;                 /* vmm_free from inside the first phase callback */
    int exited, status, chans, chan_fd;
    int exit_seq, nph; /* phase callbacks told (vmm_set_phase_cb) */
    struct {
        enum vmm_phase from, to, now;
        int seq;
    } ph[128];
    char reason[400];
    ev_tstamp t_launch, t_chan;
};

struct qreq {
    struct vmm **free_vm; /* vmm_free(*free_vm) from inside the callback */
    bool done;
    int err, seq;
    char json[8192];
    ev_tstamp t;
};

static int qseq;

static void on_channel(void *ud, int fd)
{
    struct vmctx *c = ud;

    if (c->free_on_channel) {
        vmm_free(c->vm);
        c->vm = NULL;
    }
    if (c->chan_fd >= 0)
        close(c->chan_fd);
    c->chan_fd = fd;
    c->chans++;
    c->t_chan = ev_time();
    CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
}

static void on_exited(void *ud, int status, const char *reason)
{
    struct vmctx *c = ud;

    c->exited++;
    c->exit_seq = ++qseq;
    c->status = status;
    snprintf(c->reason, sizeof(c->reason), "%s", reason);
    if (c->free_on_exit) {
        vmm_free(c->vm);
        c->vm = NULL;
    }
}

static const struct vmm_cbs cbs = {on_channel, on_exited};

static void on_phase(void *ud, enum vmm_phase from, enum vmm_phase to)
{
    struct vmctx *c = ud;

    if (c->nph < (int)(sizeof(c->ph) / sizeof(c->ph[0]))) {
        c->ph[c->nph].from = from;
        c->ph[c->nph].to = to;
        c->ph[c->nph].now = vmm_phase(c->vm);
        c->ph[c->nph].seq = ++qseq;
        c->nph++;
    }
    if (c->free_on_phase) {
        vmm_free(c->vm);
        c->vm = NULL;
    }
}

/* The last phase change told to c is from -> to. */
static bool told(const struct vmctx *c, enum vmm_phase from, enum vmm_phase to)
{
    return c->nph > 0 && c->ph[c->nph - 1].from == from && c->ph[c->nph - 1].to == to;
}

static void on_qmp(void *ud, int err, const char *json)
{
    struct qreq *q = ud;

    q->done = true;
    q->err = err;
    q->seq = ++qseq;
    q->t = ev_time();
    snprintf(q->json, sizeof(q->json), "%s", json);
    if (q->free_vm && *q->free_vm) {
        vmm_free(*q->free_vm);
        *q->free_vm = NULL;
    }
}

static void ctx_init(struct vmctx *c)
{
    memset(c, 0, sizeof(*c));
    c->chan_fd = -1;
}

static int launch(const struct vmm_config *vc, struct vmctx *c)
{
    int r = vmm_launch(loop, vc, &cbs, c, &c->vm);
    if (r == 0)
        track(vmm_pid(c->vm));
    return r;
}

static void config(struct vmm_config *vc, const char *id, char *run_dir, size_t cap)
{
    snprintf(run_dir, cap, "%s/%s", tmp, id);
    mkdir(run_dir, 0700);
    memset(vc, 0, sizeof(*vc));
    vc->id = id;
    vc->kernel = kernel;
    vc->initrd = initrd;
    vc->run_dir = run_dir;
    vc->mem_mb = 256;
    vc->vcpus = 1;
    vc->accel = vmm_detect_accel(NULL, 0);
    vc->console_max = 256 << 10;
}

static long proc_kb(pid_t pid, const char *file, const char *key)
{
    char path[64], line[256];
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
    if (!(f = fopen(path, "r")))
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, key, strlen(key)) == 0)
            v = strtol(line + strlen(key), NULL, 10);
    fclose(f);
    return v;
}

static bool file_has(const char *path, const char *needle)
{
    static char buf[1 << 20];
    FILE *f = fopen(path, "r");
    size_t n;

    if (!f)
        return false;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    fclose(f);
    return memmem(buf, n, needle, strlen(needle)) != NULL;
}

static off_t fsize(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? st.st_size : -1;
}

static bool gone(pid_t pid)
{
    return kill(pid, 0) != 0 && errno == ESRCH; /* a zombie would still answer */
}

/* Modification time: any write to the template image would move it. */
static long long mtime_ns(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec
                             : -1;
}

/* Launch, QMP, channel, detach, adopt, kill. */
static void test_lifecycle(void)
{
    struct vmctx a, b;
    struct vmm_config vc;
    char run_dir[256], disk[300];
    long long mt0 = 0;
    struct qreq st = {0}, bad = {0}, n1 = {0}, n2 = {0}, n3 = {0}, st2 = {0}, after = {0};
    struct vmm *tmpvm;
    pid_t pid;
    ev_tstamp t0;

    ctx_init(&a);
    ctx_init(&b);
    config(&vc, "t-main", run_dir, sizeof(run_dir));
    if (have_rootfs) {
        snprintf(disk, sizeof(disk), "%s/disk.qcow2", run_dir);
        CHECK(vmm_qcow2_create(disk, rootfs, 0) == 0);
        vc.disk = disk;
        mt0 = mtime_ns(rootfs);
    }
    /* An inheritable fd of ours must not reach QEMU. */
    CHECK(dup2(STDOUT_FILENO, 77) == 77);
    t0 = ev_time();
    CHECK(launch(&vc, &a) == 0);
    close(77);
    if (!a.vm)
        return;
    pid = vmm_pid(a.vm);
    CHECK(pid > 0);
    /* Anonymous guest RAM: QEMU keeps transparent huge pages (a VM over a RAM file
     * has none under TCG: test_snapshot_clones). */
    CHECK(proc_kb(pid, "status", "THP_enabled:") == 1);
    {
        char fdp[64];
        snprintf(fdp, sizeof(fdp), "/proc/%d/fd/77", (int)pid);
        CHECK(access(fdp, F_OK) != 0);
        CHECK(getsid(pid) == pid); /* its own session */
    }
    /* Queued before the handshake: goes out once QMP is ready. */
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"query-status\"}", on_qmp, &st) == 0);
    CHECK(vmm_qmp(a.vm, "not json", on_qmp, &bad) == -EINVAL);
    CHECK(vmm_qmp(a.vm, "{\"exec-oob\":\"query-status\"}", on_qmp, &bad) == -EINVAL);
    CHECK(a.chans == 0); /* never from inside vmm_launch */
    CHECK(vmm_phase(a.vm) == VMM_PH_BOOTING);
    WAIT((st.done && a.chans > 0) || a.exited, 20);
    if (a.exited)
        fprintf(stderr, "main VM exited early: %s\n", a.reason);
    CHECK(st.done && st.err == 0);
    CHECK(strstr(st.json, "\"status\":\"running\"") && strstr(st.json, "\"running\":true"));
    CHECK(a.chans == 1 && a.chan_fd >= 0);
    CHECK(vmm_phase(a.vm) == VMM_PH_RUNNING); /* from QEMU's first query-status */
    printf("launch -> QMP ready (first reply): %.1f ms\n", (st.t - t0) * 1e3);
    printf("launch -> channel connected: %.1f ms\n", (a.t_chan - t0) * 1e3);

    /* Replies come back in order; errors carry QMP's error object. */
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"query-name\"}", on_qmp, &n1) == 0);
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"no-such-command\"}", on_qmp, &bad) == 0);
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"query-name\"}", on_qmp, &n2) == 0);
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"query-kvm\"}", on_qmp, &n3) == 0);
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"query-status\"}", NULL, NULL) == 0);
    WAIT(n3.done, 10);
    CHECK(n1.done && bad.done && n2.done && n3.done);
    CHECK(n1.seq < bad.seq && bad.seq < n2.seq && n2.seq < n3.seq);
    CHECK(strcmp(n1.json, "{\"name\":\"warren-t-main\"}") == 0);
    CHECK(bad.err == -EREMOTEIO && strstr(bad.json, "CommandNotFound"));
    CHECK(n3.err == 0 && strstr(n3.json, "\"enabled\":false")); /* TCG */

    /* Idle footprint after the guest has booted. */
    WAIT(false, 4.0);
    printf("idle 256 MiB guest: QEMU VmRSS %ld KiB, Pss %ld KiB\n",
           proc_kb(pid, "status", "VmRSS:"), proc_kb(pid, "smaps_rollup", "Pss:"));
    CHECK(a.exited == 0);

    /* Detach: the VM keeps running; nothing fires for the old struct. */
    vmm_detach(a.vm);
    vmm_free(a.vm);
    a.vm = NULL;
    close(a.chan_fd); /* warrend's fds die with it */
    a.chan_fd = -1;
    WAIT(false, 0.2);
    CHECK(!gone(pid) && a.exited == 0);

    /* Adopt: refused for the wrong id, run_dir or process. */
    vc.id = "t-other";
    CHECK(vmm_adopt(loop, &vc, pid, &cbs, &b, &tmpvm) == -ESRCH);
    vc.id = "t-main";
    CHECK(vmm_adopt(loop, &vc, getpid(), &cbs, &b, &tmpvm) == -ESRCH);
    CHECK(vmm_adopt(loop, &vc, 0x3ffffff, &cbs, &b, &tmpvm) == -ESRCH);
    vc.run_dir = tmp;
    CHECK(vmm_adopt(loop, &vc, pid, &cbs, &b, &tmpvm) == -ESRCH);
    vc.run_dir = run_dir;
    CHECK(vmm_adopt(loop, &vc, pid, &cbs, &b, &b.vm) == 0);
    if (!b.vm)
        return;
    CHECK(vmm_pid(b.vm) == pid);
    CHECK(vmm_qmp(b.vm, "{\"execute\":\"query-status\"}", on_qmp, &st2) == 0);
    WAIT(st2.done && b.chans > 0, 10);
    CHECK(st2.done && st2.err == 0 && strstr(st2.json, "\"running\":true"));
    CHECK(vmm_phase(b.vm) == VMM_PH_RUNNING); /* an adopted VM learns its phase too */
    CHECK(b.chans == 1);

    /* The owner closed the channel: reconnect hands out a new fd. */
    close(b.chan_fd);
    b.chan_fd = -1;
    CHECK(vmm_channel_reconnect(b.vm) == 0);
    CHECK(b.chans == 1);
    WAIT(b.chans == 2, 10);
    CHECK(b.chans == 2 && b.chan_fd >= 0);

    /* Kill: exited exactly once, with the signal. */
    vmm_kill(b.vm);
    CHECK(b.exited == 0);
    WAIT(b.exited > 0, 10);
    WAIT(false, 0.5);
    CHECK(b.exited == 1);
    CHECK(b.status != -1 && WIFSIGNALED(b.status) && WTERMSIG(b.status) == SIGKILL);
    CHECK(strcmp(b.reason, "killed by signal 9") == 0);
    CHECK(vmm_phase(b.vm) == VMM_PH_EXITED);
    printf("kill: exited once: status %d, \"%s\"\n", b.status, b.reason);
    CHECK(vmm_qmp(b.vm, "{\"execute\":\"query-status\"}", on_qmp, &after) == -ESRCH);
    CHECK(vmm_channel_reconnect(b.vm) == -ESRCH);
    vmm_kill(b.vm);   /* harmless after exit */
    vmm_detach(b.vm); /* likewise */
    WAIT(false, 0.1);
    CHECK(b.exited == 1 && b.chans == 2 && !after.done);
    CHECK(gone(pid));
    vmm_free(b.vm);
    if (b.chan_fd >= 0)
        close(b.chan_fd);

    if (have_rootfs) {
        CHECK(mt0 > 0 && mtime_ns(rootfs) == mt0); /* the template is never written */
        printf("overlay after boot: %lld bytes (created at 196616)\n", (long long)fsize(disk));
    }
}

/* QMP quit: a clean exit with the reason. */
static void test_shutdown(void)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256];
    struct qreq st = {0};

    ctx_init(&c);
    config(&vc, "t-quit", run_dir, sizeof(run_dir));
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    CHECK(vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &st) == 0);
    WAIT(st.done, 20);
    vmm_shutdown(c.vm, 5000);
    WAIT(c.exited, 10);
    CHECK(c.exited == 1 && c.status == 0);
    CHECK(strstr(c.reason, "exited with status 0") && strstr(c.reason, "quit requested"));
    printf("shutdown: \"%s\"\n", c.reason);
    vmm_free(c.vm);
    if (c.chan_fd >= 0)
        close(c.chan_fd);

    /* Grace expires before QEMU could even answer: SIGKILL, and it says so. */
    ctx_init(&c);
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    vmm_shutdown(c.vm, 1);
    WAIT(c.exited, 10);
    CHECK(c.exited == 1 && WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGKILL);
    CHECK(strcmp(c.reason, "killed by signal 9 (did not quit within 1 ms)") == 0);
    printf("shutdown grace: \"%s\"\n", c.reason);
    vmm_free(c.vm);
    if (c.chan_fd >= 0)
        close(c.chan_fd);
}

/* vmm_free from inside a QMP reply (more replies queued behind it) and from
 * inside the channel callback: no use after free, nothing called after. */
static void test_free_in_callback(void)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256];
    struct qreq q1 = {0}, q2 = {0}, q3 = {0};
    pid_t pid;

    ctx_init(&c);
    config(&vc, "t-cbfree1", run_dir, sizeof(run_dir));
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    pid = vmm_pid(c.vm);
    q1.free_vm = &c.vm;
    CHECK(vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &q1) == 0);
    CHECK(vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &q2) == 0);
    CHECK(vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &q3) == 0);
    WAIT(q1.done, 20);
    WAIT(gone(pid), 5);
    CHECK(q1.done && !q2.done && !q3.done && c.vm == NULL && gone(pid) && c.exited == 0);
    if (c.chan_fd >= 0)
        close(c.chan_fd);

    ctx_init(&c);
    c.free_on_channel = true;
    config(&vc, "t-cbfree2", run_dir, sizeof(run_dir));
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    pid = vmm_pid(c.vm);
    WAIT(c.chans > 0, 20);
    WAIT(gone(pid), 5);
    CHECK(c.chans == 1 && c.vm == NULL && gone(pid) && c.exited == 0);
    if (c.chan_fd >= 0)
        close(c.chan_fd);
}

/* A VM launched by another process that has since exited (a warrend
 * restart): adopt it, control it, and see its end without a wait status. */
static void test_adopt_foreign(const char *self)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256], cmd[1400], line[64] = "";
    struct qreq st = {0};
    FILE *p;
    pid_t pid = 0;

    ctx_init(&c);
    config(&vc, "t-foreign", run_dir, sizeof(run_dir));
    snprintf(cmd, sizeof(cmd), "'%s' --launch-and-leave '%s'", self, run_dir);
    p = popen(cmd, "r");
    CHECK(p != NULL);
    if (!p)
        return;
    if (fgets(line, sizeof(line), p))
        pid = (pid_t)atoi(line);
    CHECK(pclose(p) == 0 && pid > 0);
    if (pid <= 0)
        return;
    track(pid);
    CHECK(vmm_adopt(loop, &vc, pid, &cbs, &c, &c.vm) == 0);
    if (!c.vm)
        return;
    CHECK(vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &st) == 0);
    WAIT(st.done && c.chans > 0, 20);
    CHECK(st.done && st.err == 0 && strstr(st.json, "\"running\":true") && c.chans == 1);
    vmm_kill(c.vm);
    WAIT(c.exited, 10);
    WAIT(false, 0.3);
    CHECK(c.exited == 1 && c.status == -1);
    CHECK(strcmp(c.reason, "process exited after SIGKILL") == 0);
    printf("adopted foreign VM: \"%s\"\n", c.reason);
    vmm_free(c.vm);
    if (c.chan_fd >= 0)
        close(c.chan_fd);
}

/* Child mode for test_adopt_foreign: launch, wait for QMP, detach, print
 * the pid and exit, leaving the VM running. */
static int launch_and_leave(const char *run_dir)
{
    struct vmctx c;
    struct vmm_config vc;
    char rd[256];
    struct qreq st = {0};

    ctx_init(&c);
    config(&vc, "t-foreign", rd, sizeof(rd));
    vc.run_dir = run_dir;
    if (launch(&vc, &c) != 0)
        return 1;
    if (vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &st) != 0)
        return 1;
    WAIT(st.done, 20);
    if (!st.done || st.err) {
        vmm_free(c.vm);
        return 1;
    }
    printf("%d\n", (int)vmm_pid(c.vm));
    vmm_detach(c.vm);
    vmm_free(c.vm);
    return 0;
}

/* No initramfs and no disk: the guest kernel panics, panic=-1 reboots it and
 * -no-reboot turns that into a QEMU exit. */
static void test_panic(void)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256];

    char log[300];

    ctx_init(&c);
    c.free_on_exit = true;
    config(&vc, "t-panic", run_dir, sizeof(run_dir));
    vc.initrd = NULL;
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    snprintf(log, sizeof(log), "%s", vmm_console_path(c.vm));
    WAIT(c.exited, 60);
    CHECK(c.exited == 1 && c.status == 0 && c.vm == NULL);
    CHECK(strstr(c.reason, "rebooted or its kernel panicked") != NULL);
    for (int i = 0; i < 300 && !file_has(log, "Kernel panic"); i++) /* the log's thread */
        WAIT(false, 0.1);
    CHECK(file_has(log, "Kernel panic"));
    printf("panic: \"%s\"\n", c.reason);
    if (c.chan_fd >= 0)
        close(c.chan_fd);
}

/* QEMU refuses to start: the reason quotes its own message; a missing binary
 * fails synchronously without any callback. */
static void test_bad_start(void)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256];
    struct vmm *vm = NULL;

    ctx_init(&c);
    config(&vc, "t-bad", run_dir, sizeof(run_dir));
    vc.kernel = "/nonexistent/vmlinux";
    CHECK(launch(&vc, &c) == 0);
    if (c.vm) {
        WAIT(c.exited, 20);
        CHECK(c.exited == 1 && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1);
        CHECK(strstr(c.reason, "exited with status 1: ") && strstr(c.reason, "vmlinux"));
        printf("bad start: \"%s\"\n", c.reason);
        vmm_free(c.vm);
    }
    vc.kernel = kernel;
    vc.disk = "/nonexistent/disk.qcow2";
    ctx_init(&c);
    CHECK(launch(&vc, &c) == 0);
    if (c.vm) {
        WAIT(c.exited, 20);
        CHECK(c.exited == 1 && WIFEXITED(c.status) && WEXITSTATUS(c.status) == 1);
        CHECK(strcmp(c.reason, "exited with status 1: -drive: Could not open "
                               "'/nonexistent/disk.qcow2': No such file or directory") == 0);
        printf("bad disk: \"%s\"\n", c.reason);
        vmm_free(c.vm);
    }
    vc.disk = NULL;
    vc.qemu = "/nonexistent/qemu-system-x86_64";
    CHECK(vmm_launch(loop, &vc, &cbs, &c, &vm) == -ENOENT && vm == NULL);
    vc.qemu = NULL;
    vc.id = "bad id";
    CHECK(vmm_launch(loop, &vc, &cbs, &c, &vm) == -EINVAL);
}

/* A guest printing every kernel message stays under a small cap; then
 * vmm_free of the running VM kills and reaps it from the loop. */
static void test_console_cap(void)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256];
    const char *log;
    off_t max = 0;
    pid_t pid;

    ctx_init(&c);
    config(&vc, "t-chatty", run_dir, sizeof(run_dir));
    vc.console_max = 8192;
    vc.append = "ignore_loglevel initcall_debug";
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    pid = vmm_pid(c.vm);
    log = vmm_console_path(c.vm);
    for (int i = 0; i < 300 && !file_has(log, "[warren: console truncated,"); i++) {
        WAIT(false, 0.1);
        if (fsize(log) > max)
            max = fsize(log);
    }
    CHECK(file_has(log, "[warren: console truncated,"));
    CHECK(max <= 8192 && fsize(log) <= 8192);
    printf("console: %lld bytes on disk (cap 8192)\n", (long long)fsize(log));
    CHECK(c.exited == 0);
    vmm_free(c.vm);
    WAIT(gone(pid), 5);
    CHECK(gone(pid));
    CHECK(c.exited == 0); /* no callback after vmm_free */
    if (c.chan_fd >= 0)
        close(c.chan_fd);
}

/* QEMU writing far more than qemu_log_max to stderr (a wrapper that prints
 * 200 KB, then execs QEMU): qemu.log stays under the cap, marker included.
 * Before the pipe, qemu.log was QEMU's stderr itself and grew without bound. */
static void test_qemu_log_cap(void)
{
    struct vmctx c;
    struct vmm_config vc;
    char run_dir[256], wrapper[300], qlog[300];
    FILE *f;
    off_t max = 0;

    ctx_init(&c);
    config(&vc, "t-qlog", run_dir, sizeof(run_dir));
    snprintf(wrapper, sizeof(wrapper), "%s/noisy-qemu.sh", tmp);
    snprintf(qlog, sizeof(qlog), "%s/qemu.log", run_dir);
    f = fopen(wrapper, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fprintf(f, "#!/bin/sh\nhead -c 200000 /dev/zero | tr '\\0' x >&2\n"
               "echo >&2\nexec qemu-system-x86_64 \"$@\"\n");
    fclose(f);
    chmod(wrapper, 0755);
    vc.qemu = wrapper;
    vc.qemu_log_max = 8192;
    CHECK(launch(&vc, &c) == 0);
    if (!c.vm)
        return;
    for (int i = 0; i < 300 && !file_has(qlog, "[warren: qemu truncated,"); i++) {
        WAIT(false, 0.1);
        if (fsize(qlog) > max)
            max = fsize(qlog);
    }
    CHECK(file_has(qlog, "[warren: qemu truncated,"));
    CHECK(max <= 8192 && fsize(qlog) <= 8192);
    printf("qemu.log: %lld bytes on disk after 200 KB of output (cap 8192)\n",
           (long long)fsize(qlog));
    vmm_free(c.vm);
    if (c.chan_fd >= 0)
        close(c.chan_fd);
}

static uid_t proc_uid(pid_t pid)
{
    long v = proc_kb(pid, "status", "Uid:");
    return v < 0 ? (uid_t)-1 : (uid_t)v;
}

/* A jailed VM: its own uid and cgroup, a root that shows only its run dir and
 * the images; all given back when it is gone. Also the price of the jail. */
static void test_jail(void)
{
    struct vmm_jail_conf jc = {0};
    struct vmm_jail *j = NULL;
    struct vmctx c, c2;
    struct vmm_config vc, vc2;
    char run_dir[256], run2[256], jroot[300], why[256] = "", cgname[64], p[2048], disk[300];
    char line[512];
    double t_plain = 0, t_jail = 0;
    pid_t pid;
    FILE *f;
    bool in_mem = false;

    if (geteuid() != 0) {
        printf("jail: not root, skipped\n");
        return;
    }
    snprintf(jroot, sizeof(jroot), "%s/jail-root", tmp);
    snprintf(cgname, sizeof(cgname), "warren-test/%d", (int)getpid());
    jc.uid_base = 320000 + (unsigned)(getpid() % 1000) * 10;
    jc.uid_count = 10;
    jc.cgroup_name = cgname;
    jc.root_dir = jroot;
    jc.mem_overhead_mb = 256;
    if (vmm_jail_new(&jc, &j, why, sizeof(why)) != 0) {
        printf("jail: unavailable here (%s), skipped\n", why);
        return;
    }
    ctx_init(&c);
    config(&vc, "t-jail", run_dir, sizeof(run_dir));
    {
        /* Memory-file modes are refused jailed (vmm.h says why), before any spawn. */
        struct vmm *none = NULL;
        vc.jail = j;
        vc.boot = VMM_BOOT_RESTORE;
        vc.mem_path = "/dev/shm/warren-test-none.mem";
        CHECK(vmm_launch(loop, &vc, &cbs, &c, &none) == -ENOTSUP && none == NULL);
        vc.boot = VMM_BOOT_TEMPLATE;
        CHECK(vmm_launch(loop, &vc, &cbs, &c, &none) == -ENOTSUP && none == NULL);
        vc.boot = VMM_BOOT_KERNEL;
        vc.mem_path = NULL;
        vc.jail = NULL;
    }
    if (have_rootfs) {
        snprintf(disk, sizeof(disk), "%s/disk.qcow2", run_dir);
        CHECK(vmm_qcow2_create(disk, rootfs, 0) == 0);
        vc.disk = disk;
        vc.backing = rootfs;
    }
    vc.jail = j;
    /* A file beside the run dirs (as the API key is) and another VM's run dir. */
    snprintf(p, sizeof(p), "%s/api_key", tmp);
    f = fopen(p, "w");
    if (f) {
        fputs("secret\n", f);
        fclose(f);
    }
    ctx_init(&c2);
    config(&vc2, "t-jail2", run2, sizeof(run2));
    vc2.jail = j;
    CHECK(launch(&vc, &c) == 0);
    CHECK(launch(&vc2, &c2) == 0);
    if (!c.vm || !c2.vm)
        goto out;
    pid = vmm_pid(c.vm);
    WAIT(c.chans > 0 && c2.chans > 0, 60);
    CHECK(c.chans == 1 && c2.chans == 1 && c.exited == 0);
    /* Distinct non-root uids, as ps shows them. */
    CHECK(proc_uid(pid) == jc.uid_base && vmm_uid(c.vm) == jc.uid_base);
    CHECK(proc_uid(vmm_pid(c2.vm)) == jc.uid_base + 1);
    CHECK(vmm_jail_uids_in_use(j) == 2);
    CHECK(proc_kb(pid, "status", "THP_enabled:") == 1); /* anonymous RAM, as unjailed */
    /* Its view of the file system. */
    snprintf(p, sizeof(p), "/proc/%d/root%s/qmp.sock", (int)pid, run_dir);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof(p), "/proc/%d/root%s", (int)pid, run2);
    CHECK(access(p, F_OK) != 0); /* the other VM's run dir */
    snprintf(p, sizeof(p), "/proc/%d/root%s/api_key", (int)pid, tmp);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof(p), "/proc/%d/root/etc/passwd", (int)pid);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof(p), "/proc/%d/root%s", (int)pid, kernel);
    CHECK(access(p, R_OK) == 0);
    /* Its cgroup, with the memory limit of its size. */
    snprintf(p, sizeof(p), "/proc/%d/cgroup", (int)pid);
    if ((f = fopen(p, "r"))) {
        char want[128];
        snprintf(want, sizeof(want), "/u%u.t-jail", jc.uid_base);
        while (fgets(line, sizeof(line), f))
            in_mem |= strstr(line, cgname) && strstr(line, want);
        fclose(f);
    }
    CHECK(in_mem);
    /* The run dir is the VM's (0700), its sockets were made by QEMU as that uid. */
    {
        struct stat st;
        snprintf(p, sizeof(p), "%s/qmp.sock", run_dir);
        CHECK(stat(run_dir, &st) == 0 && st.st_uid == jc.uid_base && (st.st_mode & 0777) == 0700);
        CHECK(stat(p, &st) == 0 && st.st_uid == jc.uid_base);
    }
    vmm_kill(c.vm);
    vmm_kill(c2.vm);
    WAIT(c.exited && c2.exited, 20);
    CHECK(c.exited == 1 && c2.exited == 1);
    CHECK(vmm_jail_uids_in_use(j) == 0);
    {
        /* Groups removed with the process. */
        char out[64];
        snprintf(p, sizeof(p),
                 "ls /sys/fs/cgroup/*/%s /sys/fs/cgroup/%s 2>/dev/null | grep -c '^u'", cgname,
                 cgname);
        FILE *ls = popen(p, "r");
        CHECK(ls && fgets(out, sizeof(out), ls) && atoi(out) == 0);
        if (ls)
            pclose(ls);
    }
    vmm_free(c.vm);
    vmm_free(c2.vm);
    c.vm = c2.vm = NULL;
    if (c.chan_fd >= 0)
        close(c.chan_fd);
    if (c2.chan_fd >= 0)
        close(c2.chan_fd);

    /* The price: vmm_launch (it returns once QEMU is exec'd) jailed vs not. */
    for (int i = 0; i < 20; i++) {
        struct vmctx k;
        ev_tstamp t0;
        ctx_init(&k);
        vc2.jail = i % 2 ? j : NULL;
        chown(run2, 0, 0);
        ev_now_update(loop);
        t0 = ev_time();
        CHECK(launch(&vc2, &k) == 0);
        if (i % 2)
            t_jail += ev_time() - t0;
        else
            t_plain += ev_time() - t0;
        if (k.vm) {
            vmm_kill(k.vm);
            WAIT(k.exited, 20);
            vmm_free(k.vm);
        }
    }
    printf("launch cost: %.2f ms unjailed, %.2f ms jailed (mean of 10 each)\n", t_plain * 1e3 / 10,
           t_jail * 1e3 / 10);
    {
        /* Networking, jailed. A namespace that is not there: the (vfork) child
         * cannot enter it, the launch fails at once saying so, nothing kept. */
        static const char *const broken[] = {"/bin/sh", "-c", "echo set-up broke >&2; exit 3", "w",
                                             NULL};
        struct vmctx k;
        ctx_init(&k);
        chown(run2, 0, 0);
        vc2.jail = j;
        vc2.netns = "/run/netns/warren-test-none";
        vc2.net_mac = "52:54:00:57:52:02";
        CHECK(launch(&vc2, &k) == -ENOENT && k.vm == NULL);
        snprintf(p, sizeof(p), "%s/qemu.log", run2);
        CHECK(vmm_jail_uids_in_use(j) == 0);
        /* A set-up that fails (the fork()ed child runs it first): the launch
         * returns at once, and the VM exits with the set-up's message and the
         * step, its uid given back. */
        ctx_init(&k);
        chown(run2, 0, 0);
        vc2.net_wrap = broken;
        CHECK(launch(&vc2, &k) == 0);
        if (k.vm) {
            WAIT(k.exited, 20);
            CHECK(k.exited == 1 && strstr(k.reason, "network set-up"));
            /* qemu.log is written by the log's own thread: up to 30 s for it. */
            for (int i = 0; i < 300 && !file_has(p, "set-up broke"); i++)
                WAIT(false, 0.1);
            CHECK(file_has(p, "set-up broke"));
            vmm_free(k.vm);
        }
        CHECK(vmm_jail_uids_in_use(j) == 0);
        vc2.net_wrap = NULL;
        vc2.netns = NULL;
    }
out:
    if (c.vm)
        vmm_free(c.vm);
    if (c2.vm)
        vmm_free(c2.vm);
    vmm_jail_free(j);
    snprintf(p, sizeof(p), "rmdir /sys/fs/cgroup/*/%s /sys/fs/cgroup/%s 2>/dev/null", cgname,
             cgname);
    (void)!system(p);
}

/* ---- template snapshot and clones ---- */

struct opres {
    bool done;
    int err, seq;
    char why[300];
    ev_tstamp t;
};

static void on_op(void *ud, int err, const char *why)
{
    struct opres *o = ud;

    o->done = true;
    o->err = err;
    o->seq = ++qseq;
    o->t = ev_time();
    snprintf(o->why, sizeof(o->why), "%s", why);
}

/* ---- a few agent frames (protocol/README.md), encoded by hand ----
 * A frame is a u32 big-endian length and one msgpack map. Enough here to show
 * that a clone's guest runs and holds its template's files: PING -> PONG,
 * FWRITE + DATA + END -> RESULT, STAT -> RESULT {size} or ERROR. Type
 * numbers from protocol/proto.h. */
enum {
    T_RESULT = 18,
    T_ERROR = 19,
    T_PING = 20,
    T_PONG = 21,
    T_FWRITE = 9,
    T_DATA = 11,
    T_END = 12,
    T_STAT = 13
};

struct mp {
    uint8_t b[1024];
    size_t n;
};

static void mp_byte(struct mp *m, uint8_t v)
{
    if (m->n < sizeof(m->b))
        m->b[m->n++] = v;
}

static void mp_raw(struct mp *m, const void *p, size_t l)
{
    for (size_t i = 0; i < l; i++)
        mp_byte(m, ((const uint8_t *)p)[i]);
}

static void mp_str(struct mp *m, const char *s)
{
    size_t l = strlen(s);
    if (l < 32) {
        mp_byte(m, (uint8_t)(0xa0 | l));
    } else {
        mp_byte(m, 0xd9);
        mp_byte(m, (uint8_t)l);
    }
    mp_raw(m, s, l);
}

static void mp_uint(struct mp *m, unsigned v) /* v < 65536 */
{
    if (v < 128) {
        mp_byte(m, (uint8_t)v);
    } else {
        mp_byte(m, 0xcd);
        mp_byte(m, (uint8_t)(v >> 8));
        mp_byte(m, (uint8_t)v);
    }
}

/* A frame {t, id, <extra pairs>}: nextra pairs follow in the caller's mp calls. */
static void mp_frame(struct mp *m, unsigned t, unsigned id, unsigned nextra)
{
    m->n = 4; /* room for the length */
    mp_byte(m, (uint8_t)(0x80 | (2 + nextra)));
    mp_str(m, "t");
    mp_uint(m, t);
    mp_str(m, "id");
    mp_uint(m, id);
}

static bool mp_send(int fd, struct mp *m)
{
    uint32_t len = (uint32_t)(m->n - 4);
    m->b[0] = (uint8_t)(len >> 24);
    m->b[1] = (uint8_t)(len >> 16);
    m->b[2] = (uint8_t)(len >> 8);
    m->b[3] = (uint8_t)len;
    return write(fd, m->b, m->n) == (ssize_t)m->n;
}

struct chan {
    int fd;
    size_t len;
    uint8_t buf[1 << 18];
    uint8_t hit[4096]; /* the payload of the frame found */
    size_t hit_len;
};

static bool has_bytes(const uint8_t *p, size_t n, const void *want, size_t wn)
{
    return memmem(p, n, want, wn) != NULL;
}

/* Read what is there; true once a frame of type t (one of two) for id has come
 * (it is copied into c->hit). Other frames (HELLO, CREDIT) are dropped. */
static bool chan_find(struct chan *c, uint8_t t1, uint8_t t2, uint8_t id)
{
    ssize_t n;
    size_t off = 0;
    bool found = false;

    while (c->len < sizeof(c->buf) &&
           (n = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len)) > 0)
        c->len += (size_t)n;
    while (!found && c->len - off >= 4) {
        uint32_t fl = (uint32_t)c->buf[off] << 24 | (uint32_t)c->buf[off + 1] << 16 |
                      (uint32_t)c->buf[off + 2] << 8 | c->buf[off + 3];
        const uint8_t *p = c->buf + off + 4;
        uint8_t k1[] = {0xa1, 't', t1}, k2[] = {0xa1, 't', t2}, ki[] = {0xa2, 'i', 'd', id};
        if (fl == 0 || fl > sizeof(c->buf) - 4) {
            off = c->len; /* broken stream: drop it all */
            break;
        }
        if (c->len - off - 4 < fl)
            break;
        if ((has_bytes(p, fl, k1, 3) || has_bytes(p, fl, k2, 3)) && has_bytes(p, fl, ki, 4) &&
            fl <= sizeof(c->hit)) {
            memcpy(c->hit, p, fl);
            c->hit_len = fl;
            found = true;
        }
        off += 4 + fl;
    }
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
    return found;
}

/* PING every second until a PONG comes back (the agent may still be starting). */
static bool agent_answers(struct chan *c, double secs)
{
    static uint8_t id = 100;
    ev_tstamp end = ev_time() + secs;
    struct mp m;

    id = id >= 120 ? 100 : id + 1;
    while (ev_time() < end) {
        mp_frame(&m, T_PING, id, 0);
        if (!mp_send(c->fd, &m))
            return false;
        WAIT(chan_find(c, T_PONG, T_PONG, id), 1.0);
        if (c->hit_len && has_bytes(c->hit, c->hit_len, (uint8_t[]){0xa1, 't', T_PONG}, 3))
            return true;
    }
    return false;
}

/* Write a small file in the guest (FWRITE, DATA, END) and wait for its RESULT. */
static bool guest_write(struct chan *c, uint8_t id, const char *path, const char *text)
{
    struct mp m;

    mp_frame(&m, T_FWRITE, id, 2);
    mp_str(&m, "path");
    mp_str(&m, path);
    mp_str(&m, "mode");
    mp_uint(&m, 0644);
    if (!mp_send(c->fd, &m))
        return false;
    mp_frame(&m, T_DATA, id, 2);
    mp_str(&m, "off");
    mp_uint(&m, 0);
    mp_str(&m, "data");
    mp_byte(&m, 0xc4); /* bin8 */
    mp_byte(&m, (uint8_t)strlen(text));
    mp_raw(&m, text, strlen(text));
    if (!mp_send(c->fd, &m))
        return false;
    mp_frame(&m, T_END, id, 0);
    if (!mp_send(c->fd, &m))
        return false;
    c->hit_len = 0;
    WAIT(chan_find(c, T_RESULT, T_ERROR, id), 20);
    return c->hit_len && has_bytes(c->hit, c->hit_len, (uint8_t[]){0xa1, 't', T_RESULT}, 3);
}

/* STAT path in the guest: its size (< 128 here), -1 for ERROR, -2 for no answer. */
static int guest_size(struct chan *c, uint8_t id, const char *path)
{
    struct mp m;
    uint8_t key[] = {0xa4, 's', 'i', 'z', 'e'};
    const uint8_t *p;

    mp_frame(&m, T_STAT, id, 1);
    mp_str(&m, "path");
    mp_str(&m, path);
    if (!mp_send(c->fd, &m))
        return -2;
    c->hit_len = 0;
    WAIT(chan_find(c, T_RESULT, T_ERROR, id), 20);
    if (!c->hit_len)
        return -2;
    if (!has_bytes(c->hit, c->hit_len, (uint8_t[]){0xa1, 't', T_RESULT}, 3))
        return -1;
    p = memmem(c->hit, c->hit_len, key, sizeof(key));
    return p && p + 5 < c->hit + c->hit_len && p[5] < 128 ? p[5] : -2;
}

/* A template VM (RAM in a share=on file, qcow2 overlay disk) booted to a
 * guest that answers, saved; a damaged snapshot refused by a waiting clone;
 * then two clones restored from it, each with its own overlay backed by the
 * template's frozen overlay, conted, answering the agent. */
/* ---- phase changes pushed to the owner, raw QMP refused where it would
 * bypass the phase rules ---- */
/* The state letter of /proc/PID/stat: R, S, T (stopped by a signal), ... */
static char proc_state(pid_t pid)
{
    char path[64], buf[512], *p;
    FILE *f;
    size_t n;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (!(f = fopen(path, "r")))
        return '?';
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p[2] : '?';
}

/* vmm_freeze stops QEMU whole (SIGSTOP) without QMP, vmm_thaw continues it; a QMP command
 * sent meanwhile continues it first, and the phase never changes. */
static void check_freeze(struct vmctx *a)
{
    struct qreq q = {0};
    struct opres sp = {0}, ct = {0};
    pid_t pid = vmm_pid(a->vm);
    int n = a->nph;

    CHECK(vmm_freeze(a->vm) == 0 && vmm_frozen(a->vm));
    WAIT(proc_state(pid) == 'T', 5);
    CHECK(proc_state(pid) == 'T');
    CHECK(vmm_freeze(a->vm) == 0 && vmm_phase(a->vm) == VMM_PH_RUNNING);
    CHECK(vmm_thaw(a->vm) == 0 && !vmm_frozen(a->vm));
    WAIT(proc_state(pid) != 'T', 5);
    CHECK(proc_state(pid) != 'T' && vmm_thaw(a->vm) == 0);
    /* Frozen, then asked something: the command thaws it and is answered. */
    CHECK(vmm_freeze(a->vm) == 0);
    CHECK(vmm_qmp(a->vm, "{\"execute\":\"query-status\"}", on_qmp, &q) == 0);
    CHECK(!vmm_frozen(a->vm));
    WAIT(q.done || a->exited, 10);
    CHECK(q.done && q.err == 0 && proc_state(pid) != 'T');
    /* Not with a command in flight (its answer would wait), nor while stopped by QMP. */
    memset(&q, 0, sizeof(q));
    CHECK(vmm_qmp(a->vm, "{\"execute\":\"query-status\"}", on_qmp, &q) == 0);
    CHECK(vmm_freeze(a->vm) == -EBUSY && !vmm_frozen(a->vm));
    WAIT(q.done || a->exited, 10);
    CHECK(vmm_stop(a->vm, on_op, &sp) == 0);
    WAIT(sp.done || a->exited, 10);
    CHECK(sp.done && sp.err == 0 && vmm_freeze(a->vm) == -EPERM);
    CHECK(vmm_cont(a->vm, on_op, &ct) == 0);
    WAIT(ct.done || a->exited, 10);
    CHECK(ct.done && ct.err == 0 && a->nph == n + 2);
}

/* VmSwap of pid in kB, or -1. */
static long vm_swap_kb(pid_t pid)
{
    char path[64], line[128];
    long kb = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (!(f = fopen(path, "r")))
        return -1;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "VmSwap:", 7))
            kb = strtol(line + 7, NULL, 10);
    fclose(f);
    return kb;
}

/* Page-out: only of a frozen VM, one at a time; the VM answers QMP after it. With swap
 * on the host its memory is found there; a thaw stops one under way. */
static void check_pageout(struct vmctx *a)
{
    struct opres po = {0}, po2 = {0};
    struct qreq q = {0};
    pid_t pid = vmm_pid(a->vm);
    bool swap = vmm_host_swap_free_kb() > 256 * 1024;

    CHECK(vmm_pageout(a->vm, on_op, &po) == -EPERM && !vmm_pageout_busy(a->vm));
    CHECK(vmm_freeze(a->vm) == 0);
    CHECK(vmm_pageout(a->vm, on_op, &po) == 0 && vmm_pageout_busy(a->vm));
    CHECK(vmm_pageout(a->vm, on_op, &po2) == -EBUSY);
    WAIT(po.done || a->exited, 30);
    CHECK(po.done && po.err == 0 && !vmm_pageout_busy(a->vm));
    CHECK(strncmp(po.why, "paged out: resident", 19) == 0);
    printf("page-out: %s (host swap: %s)\n", po.why, swap ? "yes" : "none");
    if (swap)
        CHECK(vm_swap_kb(pid) > 1024);
    CHECK(proc_state(pid) == 'T' && vmm_frozen(a->vm));
    CHECK(vmm_thaw(a->vm) == 0);
    CHECK(vmm_qmp(a->vm, "{\"execute\":\"query-status\"}", on_qmp, &q) == 0);
    WAIT(q.done || a->exited, 30);
    CHECK(q.done && q.err == 0);
    /* A thaw right behind the start: cancelled between two mappings, or already done. */
    memset(&po, 0, sizeof(po));
    CHECK(vmm_freeze(a->vm) == 0 && vmm_pageout(a->vm, on_op, &po) == 0);
    CHECK(vmm_thaw(a->vm) == 0);
    WAIT(po.done || a->exited, 30);
    CHECK(po.done && (po.err == 0 || po.err == -ECANCELED));
    /* A cancel forgets the callback: the thread ends and nobody is called. */
    memset(&po, 0, sizeof(po));
    CHECK(vmm_freeze(a->vm) == 0 && vmm_pageout(a->vm, on_op, &po) == 0);
    vmm_pageout_cancel(a->vm);
    WAIT(!vmm_pageout_busy(a->vm) || a->exited, 30);
    CHECK(!vmm_pageout_busy(a->vm) && !po.done);
    CHECK(vmm_thaw(a->vm) == 0);
    memset(&q, 0, sizeof(q));
    CHECK(vmm_qmp(a->vm, "{\"execute\":\"query-status\"}", on_qmp, &q) == 0);
    WAIT(q.done || a->exited, 30);
    CHECK(q.done && q.err == 0 && !a->exited);
}

static void test_phase_events(void)
{
    struct vmctx a, f;
    struct vmm_config vc, fc;
    char run_dir[256], frun[256];
    struct qreq st = {0}, rs = {0};
    struct opres ct = {0}, sp = {0};
    int n;

    ctx_init(&a);
    ctx_init(&f);
    config(&vc, "t-phase", run_dir, sizeof(run_dir));
    config(&fc, "t-phfree", frun, sizeof(frun));
    CHECK(launch(&vc, &a) == 0);
    /* A second VM whose owner frees it from its first phase callback. */
    f.free_on_phase = true;
    CHECK(launch(&fc, &f) == 0);
    if (!a.vm || !f.vm)
        goto out;
    vmm_set_phase_cb(a.vm, on_phase);
    vmm_set_phase_cb(f.vm, on_phase);
    /* BOOTING: the phase is not known yet, so no raw cont; never a raw
     * migrate-incoming (only vmm_restore loads a stream). */
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"cont\"}", on_qmp, &rs) == -EPERM);
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"defer\"}}",
                  on_qmp, &rs) == -EPERM);
    CHECK(a.nph == 0);
    WAIT(told(&a, VMM_PH_BOOTING, VMM_PH_RUNNING) || a.exited, 30);
    CHECK(told(&a, VMM_PH_BOOTING, VMM_PH_RUNNING) && a.nph == 1);

    /* A stop the driver did not make: the owner hears running -> stopped. */
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"stop\"}", on_qmp, &st) == 0);
    CHECK(a.nph == 1); /* never from inside the call */
    WAIT((st.done && told(&a, VMM_PH_RUNNING, VMM_PH_STOPPED)) || a.exited, 10);
    CHECK(st.done && st.err == 0 && told(&a, VMM_PH_RUNNING, VMM_PH_STOPPED) && a.nph == 2);
    CHECK(vmm_phase(a.vm) == VMM_PH_STOPPED && a.ph[1].now == VMM_PH_STOPPED);
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"defer\"}}",
                  on_qmp, &rs) == -EPERM);

    /* cont: stopped -> running, told before the operation's own callback. */
    CHECK(vmm_cont(a.vm, on_op, &ct) == 0);
    WAIT(ct.done || a.exited, 10);
    CHECK(ct.done && ct.err == 0 && told(&a, VMM_PH_STOPPED, VMM_PH_RUNNING) && a.nph == 3);
    CHECK(a.ph[2].seq < ct.seq);
    /* A raw cont of a running guest is harmless (QEMU does nothing). */
    memset(&rs, 0, sizeof(rs));
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"cont\"}", on_qmp, &rs) == 0);
    WAIT(rs.done || a.exited, 10);
    CHECK(rs.done && rs.err == 0 && a.nph == 3);
    /* And once more through the driver: stop, then a raw cont. */
    CHECK(vmm_stop(a.vm, on_op, &sp) == 0);
    WAIT(sp.done || a.exited, 10);
    CHECK(sp.done && sp.err == 0 && told(&a, VMM_PH_RUNNING, VMM_PH_STOPPED) && a.nph == 4);
    memset(&rs, 0, sizeof(rs));
    CHECK(vmm_qmp(a.vm, "{\"execute\":\"cont\"}", on_qmp, &rs) == 0);
    WAIT((rs.done && told(&a, VMM_PH_STOPPED, VMM_PH_RUNNING)) || a.exited, 10);
    CHECK(told(&a, VMM_PH_STOPPED, VMM_PH_RUNNING) && a.nph == 5);
    for (int i = 0; i < a.nph; i++)
        printf("phase told: %s -> %s\n", vmm_phase_name(a.ph[i].from), vmm_phase_name(a.ph[i].to));

    /* A burst of raw stop/cont (more changes than the driver queues between
     * two loop iterations, if QEMU's events arrive together): whatever is
     * told is one unbroken chain ending where the VM is. */
    {
        struct qreq burst[40];
        memset(burst, 0, sizeof(burst));
        for (int i = 0; i < 40; i++)
            CHECK(vmm_qmp(a.vm, i % 2 ? "{\"execute\":\"cont\"}" : "{\"execute\":\"stop\"}", on_qmp,
                          &burst[i]) == 0);
        WAIT(burst[39].done || a.exited, 20);
        CHECK(burst[39].done && burst[39].err == 0);
        WAIT(told(&a, VMM_PH_STOPPED, VMM_PH_RUNNING) || a.exited, 10);
        for (int i = 0; i < 20; i++)
            ev_run(loop, EVRUN_NOWAIT);
        CHECK(vmm_phase(a.vm) == VMM_PH_RUNNING && a.ph[a.nph - 1].to == VMM_PH_RUNNING);
        CHECK(a.nph > 5 && a.nph < (int)(sizeof(a.ph) / sizeof(a.ph[0])));
        for (int i = 1; i < a.nph; i++)
            CHECK(a.ph[i].from == a.ph[i - 1].to && a.ph[i].from != a.ph[i].to);
        printf("burst of 40 raw stop/cont: %d changes told\n", a.nph - 5);
    }

    check_freeze(&a);
    check_pageout(&a);

    /* The end: running -> exited is told, then cbs->exited (frozen: SIGKILL stops it
     * all the same). */
    n = a.nph;
    CHECK(vmm_freeze(a.vm) == 0);
    vmm_kill(a.vm);
    WAIT(a.exited, 10);
    CHECK(a.exited == 1 && a.nph == n + 1 && told(&a, VMM_PH_RUNNING, VMM_PH_EXITED));
    CHECK(a.ph[n].seq < a.exit_seq);

    /* The other VM was freed from its first phase callback: one call, then silence. */
    WAIT(f.nph > 0, 30);
    CHECK(f.nph == 1 && f.vm == NULL && f.ph[0].from == VMM_PH_BOOTING);
    for (int i = 0; i < 20; i++)
        ev_run(loop, EVRUN_NOWAIT);
    CHECK(f.nph == 1 && f.exited == 0);
out:
    if (a.vm)
        vmm_free(a.vm);
    if (f.vm)
        vmm_free(f.vm);
}

static void test_snapshot_clones(void)
{
    struct vmctx t, k[2];
    struct vmm_config vc, kc[2];
    char run_dir[256], krun[2][256], mem[128], snap[300], bad[300], disk[300], kdisk[2][300];
    struct opres sv = {0}, rb = {0}, rs[2], ct[2];
    ev_tstamp t0[2];
    char cmd[1400];
    struct chan *tch = calloc(1, sizeof(struct chan)), *kch = calloc(2, sizeof(struct chan));

    if (!have_rootfs) {
        printf("snapshot clones: no minimal.ext4, skipped\n");
        return;
    }
    ctx_init(&t);
    config(&vc, "t-tpl", run_dir, sizeof(run_dir));
    snprintf(mem, sizeof(mem), "/dev/shm/warren-test-%d.mem", (int)getpid());
    snprintf(snap, sizeof(snap), "%s/tpl.snap", tmp);
    snprintf(bad, sizeof(bad), "%s/bad.snap", tmp);
    snprintf(disk, sizeof(disk), "%s/disk.qcow2", run_dir);
    CHECK(vmm_qcow2_create(disk, rootfs, 0) == 0);
    vc.disk = disk;
    vc.boot = VMM_BOOT_TEMPLATE;
    vc.mem_path = mem;
    CHECK(launch(&vc, &t) == 0);
    if (!t.vm)
        goto out;
    /* RAM in a file under TCG: no huge pages for QEMU (its translated code); warrend,
     * which carried the flag for the launch, has them back. */
    CHECK(proc_kb(vmm_pid(t.vm), "status", "THP_enabled:") == 0);
    CHECK(proc_kb(getpid(), "status", "THP_enabled:") == 1);
    CHECK(vmm_phase(t.vm) == VMM_PH_BOOTING);
    WAIT((t.chans > 0 && vmm_phase(t.vm) == VMM_PH_RUNNING) || t.exited, 30);
    CHECK(t.chans == 1 && vmm_phase(t.vm) == VMM_PH_RUNNING);
    if (t.exited)
        fprintf(stderr, "template exited: %s\n", t.reason);
    tch->fd = t.chan_fd;
    CHECK(t.chan_fd >= 0 && agent_answers(tch, 60));
    /* A file the clones must see (in the guest's page cache and on its disk). */
    CHECK(guest_write(tch, 1, "/root/template.txt", "written in the template\n"));
    CHECK(guest_size(tch, 2, "/root/template.txt") == 24);
    /* Wrong-phase calls are refused; a second operation waits its turn. */
    CHECK(vmm_cont(t.vm, on_op, &rb) == -EPERM);
    CHECK(vmm_restore(t.vm, snap, on_op, &rb) == -EPERM);

    CHECK(vmm_save(t.vm, snap, 0, on_op, &sv) == 0);
    CHECK(vmm_phase(t.vm) == VMM_PH_SAVING && !sv.done);
    CHECK(vmm_stop(t.vm, on_op, &rb) == -EBUSY);
    /* Mid-save nothing raw may run the guest or write its RAM either. */
    CHECK(vmm_qmp(t.vm, "{\"execute\":\"cont\"}", NULL, NULL) == -EPERM);
    CHECK(vmm_qmp(t.vm, "{\"execute\":\"system_reset\"}", NULL, NULL) == -EPERM);
    CHECK(vmm_qmp(t.vm,
                  "{\"execute\":\"human-monitor-command\","
                  "\"arguments\":{\"command-line\":\"c\"}}",
                  NULL, NULL) == -EPERM);
    WAIT(sv.done || t.exited, 30);
    CHECK(sv.done && sv.err == 0);
    if (sv.err)
        fprintf(stderr, "save: %s\n", sv.why);
    CHECK(vmm_phase(t.vm) == VMM_PH_SEALED); /* a saved template never runs again */
    CHECK(vmm_cont(t.vm, on_op, &rb) == -EPERM && vmm_save(t.vm, bad, 0, on_op, &rb) == -EPERM);
    {
        /* Nor through raw QMP: nothing that could run it or write its RAM. */
        struct qreq q = {0};
        CHECK(vmm_qmp(t.vm, "{\"execute\":\"cont\"}", on_qmp, &q) == -EPERM);
        CHECK(vmm_qmp(t.vm, "{\"execute\":\"system_reset\"}", on_qmp, &q) == -EPERM);
        CHECK(vmm_qmp(t.vm,
                      "{\"execute\":\"human-monitor-command\","
                      "\"arguments\":{\"command-line\":\"cont\"}}",
                      on_qmp, &q) == -EPERM);
        CHECK(vmm_qmp(t.vm, "{\"execute\":\"query-status\"}", on_qmp, &q) == 0);
        WAIT(q.done || t.exited, 10);
        CHECK(q.done && q.err == 0 && !strstr(q.json, "\"running\":true"));
        CHECK(vmm_phase(t.vm) == VMM_PH_SEALED);
    }
    {
        char tmpname[320];
        snprintf(tmpname, sizeof(tmpname), "%s.tmp", snap);
        CHECK(access(snap, R_OK) == 0 && access(tmpname, F_OK) != 0);
    }
    printf("template snapshot: %lld bytes (device state; RAM stays in %s)\n",
           (long long)fsize(snap), mem);
    {
        /* A warrend restart: the adopted template is still SEALED (QEMU says
         * "postmigrate"), not merely stopped, so nothing can cont it. */
        pid_t tpid = vmm_pid(t.vm);
        struct qreq q = {0};
        vmm_detach(t.vm);
        vmm_free(t.vm);
        t.vm = NULL;
        CHECK(vmm_adopt(loop, &vc, tpid, &cbs, &t, &t.vm) == 0);
        if (!t.vm)
            goto out;
        WAIT(vmm_phase(t.vm) != VMM_PH_BOOTING || t.exited, 10);
        CHECK(vmm_phase(t.vm) == VMM_PH_SEALED);
        CHECK(vmm_cont(t.vm, on_op, &rb) == -EPERM);
        CHECK(vmm_qmp(t.vm, "{\"execute\":\"cont\"}", on_qmp, &q) == -EPERM);
    }
    /* The template must never run again: its RAM is what clones map. */
    vmm_kill(t.vm);
    WAIT(t.exited, 10);
    CHECK(t.exited == 1 && vmm_phase(t.vm) == VMM_PH_EXITED);

    /* Two clones. Clone 0 is first handed a damaged copy: refused before QEMU
     * sees it, and it keeps waiting for a good one. */
    snprintf(cmd, sizeof(cmd),
             "cp '%s' '%s' && printf 'X' | dd of='%s' bs=1 seek=5000 conv=notrunc 2>/dev/null",
             snap, bad, bad);
    CHECK(system(cmd) == 0);
    for (int i = 0; i < 2; i++) {
        char id[16];
        snprintf(id, sizeof(id), "t-clone%d", i);
        ctx_init(&k[i]);
        memset(&rs[i], 0, sizeof(rs[i]));
        memset(&ct[i], 0, sizeof(ct[i]));
        config(&kc[i], i ? "t-clone1" : "t-clone0", krun[i], sizeof(krun[i]));
        snprintf(kdisk[i], sizeof(kdisk[i]), "%s/disk.qcow2", krun[i]);
        CHECK(vmm_qcow2_create(kdisk[i], disk, 0) == 0); /* backed by the frozen overlay */
        kc[i].disk = kdisk[i];
        kc[i].boot = VMM_BOOT_RESTORE;
        kc[i].mem_path = mem;
        kc[i].kernel = NULL;
        kc[i].initrd = NULL;
        ev_now_update(loop);
        t0[i] = ev_time();
        CHECK(launch(&kc[i], &k[i]) == 0);
        if (!k[i].vm)
            goto out;
        CHECK(proc_kb(vmm_pid(k[i].vm), "status", "THP_enabled:") == 0);
        CHECK(vmm_phase(k[i].vm) == VMM_PH_WAITING);
        /* Waiting for a stream: no raw cont (it would make the restored guest
         * run at once) and no stream loaded behind vmm_restore's back. */
        CHECK(vmm_qmp(k[i].vm, "{\"execute\":\"cont\"}", NULL, NULL) == -EPERM);
        CHECK(vmm_qmp(k[i].vm,
                      "{\"execute\":\"human-monitor-command\","
                      "\"arguments\":{\"command-line\":\"cont\"}}",
                      NULL, NULL) == -EPERM);
        CHECK(vmm_qmp(k[i].vm, "{\"execute\":\"migrate\",\"arguments\":{\"uri\":\"fd:x\"}}", NULL,
                      NULL) == -EPERM);
        CHECK(vmm_qmp(k[i].vm,
                      "{\"execute\":\"migrate-incoming\",\"arguments\":{\"uri\":\"fd:x\"}}", NULL,
                      NULL) == -EPERM);
        if (i == 0) {
            CHECK(vmm_restore(k[i].vm, bad, on_op, &rb) == 0);
            CHECK(vmm_phase(k[i].vm) == VMM_PH_RESTORING);
            WAIT(rb.done, 10);
            CHECK(rb.done && rb.err == -EINVAL && strstr(rb.why, "checksum"));
            printf("damaged snapshot refused: \"%s\"\n", rb.why);
            CHECK(vmm_phase(k[i].vm) == VMM_PH_WAITING);
        }
        CHECK(vmm_restore(k[i].vm, snap, on_op, &rs[i]) == 0);
        CHECK(vmm_phase(k[i].vm) == VMM_PH_RESTORING);
        CHECK(vmm_restore(k[i].vm, snap, on_op, &rb) == -EBUSY);
    }
    for (int i = 0; i < 2; i++) {
        WAIT(rs[i].done || k[i].exited, 30);
        CHECK(rs[i].done && rs[i].err == 0);
        if (rs[i].err || k[i].exited)
            fprintf(stderr, "clone %d restore: %s / %s\n", i, rs[i].why, k[i].reason);
        CHECK(vmm_phase(k[i].vm) == VMM_PH_STOPPED); /* saved stopped, restored stopped */
        CHECK(vmm_cont(k[i].vm, on_op, &ct[i]) == 0);
        WAIT(ct[i].done, 10);
        CHECK(ct[i].done && ct[i].err == 0 && vmm_phase(k[i].vm) == VMM_PH_RUNNING);
        printf("clone %d: launch -> restored %.1f ms, -> running %.1f ms\n", i,
               (rs[i].t - t0[i]) * 1e3, (ct[i].t - t0[i]) * 1e3);
    }
    for (int i = 0; i < 2; i++) {
        WAIT(k[i].chans > 0, 10);
        kch[i].fd = k[i].chan_fd;
        CHECK(k[i].chan_fd >= 0 && agent_answers(&kch[i], 30));
        printf("clone %d: agent answered PING, QEMU Pss %ld KiB\n", i,
               proc_kb(vmm_pid(k[i].vm), "smaps_rollup", "Pss:"));
        CHECK(guest_size(&kch[i], 3, "/root/template.txt") == 24); /* the template's file */
    }
    /* A write in one clone is its own. */
    CHECK(guest_write(&kch[0], 4, "/root/clone0.txt", "only in clone 0\n"));
    CHECK(guest_size(&kch[0], 5, "/root/clone0.txt") == 16);
    CHECK(guest_size(&kch[1], 5, "/root/clone0.txt") == -1);
    /* Stop / cont round trip on a clone. */
    memset(&rb, 0, sizeof(rb));
    CHECK(vmm_stop(k[0].vm, on_op, &rb) == 0);
    WAIT(rb.done, 10);
    CHECK(rb.err == 0 && vmm_phase(k[0].vm) == VMM_PH_STOPPED);
    memset(&rb, 0, sizeof(rb));
    CHECK(vmm_cont(k[0].vm, on_op, &rb) == 0);
    WAIT(rb.done, 10);
    CHECK(rb.err == 0 && vmm_phase(k[0].vm) == VMM_PH_RUNNING);
    CHECK(agent_answers(&kch[0], 10));
    {
        /* Each clone's overlay is its own; the template's is frozen. */
        snprintf(cmd, sizeof(cmd),
                 "qemu-img info -U '%s' 2>&1 | grep -q 'backing file format: qcow2'", kdisk[0]);
        CHECK(system(cmd) == 0);
    }
    for (int i = 0; i < 2; i++) {
        vmm_kill(k[i].vm);
        WAIT(k[i].exited, 10);
        vmm_free(k[i].vm);
        k[i].vm = NULL;
        if (k[i].chan_fd >= 0)
            close(k[i].chan_fd);
    }

    /* Timing, one clone at a time (printed, not asserted): launch -> first QMP
     * reply -> restored (stopped) -> running -> the agent's PONG. */
    for (int i = 0; i < 3; i++) {
        struct vmctx c;
        struct opres r = {0}, g = {0};
        struct qreq st = {0};
        ev_tstamp s0, t_pong;
        char d[300];
        ctx_init(&c);
        snprintf(d, sizeof(d), "%s/disk%d.qcow2", krun[0], i);
        unlink(d);
        CHECK(vmm_qcow2_create(d, disk, 0) == 0);
        kc[0].disk = d;
        ev_now_update(loop);
        s0 = ev_time();
        CHECK(launch(&kc[0], &c) == 0);
        if (!c.vm)
            break;
        CHECK(vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_qmp, &st) == 0);
        CHECK(vmm_restore(c.vm, snap, on_op, &r) == 0);
        WAIT(r.done || c.exited, 30);
        CHECK(r.done && r.err == 0);
        if (r.done && r.err == 0)
            CHECK(vmm_cont(c.vm, on_op, &g) == 0);
        WAIT(g.done || c.exited, 10);
        WAIT(c.chans > 0, 10);
        kch[0].fd = c.chan_fd;
        kch[0].len = 0;
        CHECK(c.chan_fd >= 0 && agent_answers(&kch[0], 30));
        t_pong = ev_time();
        printf("clone timing %d: QMP ready %.1f ms, restored %.1f ms, running %.1f ms, "
               "PONG %.1f ms (from launch)\n",
               i, (st.t - s0) * 1e3, (r.t - s0) * 1e3, (g.t - s0) * 1e3, (t_pong - s0) * 1e3);
        vmm_kill(c.vm);
        WAIT(c.exited, 10);
        vmm_free(c.vm);
        if (c.chan_fd >= 0)
            close(c.chan_fd);
    }
out:
    for (int i = 0; i < 2; i++)
        if (k[i].vm)
            vmm_free(k[i].vm);
    if (t.vm)
        vmm_free(t.vm);
    if (t.chan_fd >= 0)
        close(t.chan_fd);
    unlink(mem);
    free(tch);
    free(kch);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

int main(int argc, char **argv)
{
    const char *env = getenv("WARREN_IMAGE_DIR"), *cache = getenv("WARREN_CACHE"),
               *home = getenv("HOME");
    ev_timer tick;

    if (env && *env)
        snprintf(img, sizeof(img), "%s", env);
    else if (cache && *cache)
        snprintf(img, sizeof(img), "%s/images/current", cache);
    else
        snprintf(img, sizeof(img), "%s/.cache/warren/images/current", home ? home : "/root");
    snprintf(kernel, sizeof(kernel), "%s/vmlinux", img);
    snprintf(initrd, sizeof(initrd), "%s/initramfs.cpio", img);
    snprintf(rootfs, sizeof(rootfs), "%s/minimal.ext4", img);
    if (access(kernel, R_OK) != 0 || access(initrd, R_OK) != 0) {
        printf("SKIP: no guest images in %s (set WARREN_IMAGE_DIR)\n", img);
        return 77;
    }
    have_rootfs = access(rootfs, R_OK) == 0;
    {
        /* The overlay points at the template by absolute path. */
        char *real = realpath(rootfs, NULL);
        if (real) {
            snprintf(rootfs, sizeof(rootfs), "%s", real);
            free(real);
        }
    }
    if (argc == 3 && strcmp(argv[1], "--launch-and-leave") == 0) {
        /* Child mode works inside the parent's directory (argv[2]/..). */
        char *slash;
        snprintf(tmp, sizeof(tmp), "%s", argv[2]);
        if ((slash = strrchr(tmp, '/')))
            *slash = 0;
        loop = ev_default_loop(EVBACKEND_EPOLL);
        ev_timer_init(&tick, on_tick, 0.02, 0.02);
        ev_timer_start(loop, &tick);
        return launch_and_leave(argv[2]);
    }
    snprintf(tmp, sizeof(tmp), "/tmp/wvmm-XXXXXX");
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN); /* as warrend does: must not leak into QEMU */
    loop = ev_default_loop(EVBACKEND_EPOLL);
    ev_timer_init(&tick, on_tick, 0.02, 0.02);
    ev_timer_start(loop, &tick);
    atexit(kill_started);

    printf("images: %s (root disk: %s)\n", img, have_rootfs ? "minimal.ext4" : "none");
    if (getenv("WARREN_VMM_ONLY_SNAP")) {
        test_snapshot_clones();
        goto done;
    }
    if (getenv("WARREN_VMM_ONLY_JAIL")) {
        test_jail();
        goto done;
    }
    if (getenv("WARREN_VMM_ONLY_PHASE")) {
        test_phase_events();
        goto done;
    }
    test_lifecycle();
    test_shutdown();
    test_free_in_callback();
    test_adopt_foreign(argv[0]);
    test_panic();
    test_bad_start();
    test_console_cap();
    test_qemu_log_cap();
    test_jail();
    test_phase_events();
    test_snapshot_clones();

done:
    ev_timer_stop(loop, &tick);
    nftw(tmp, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("vmm integration: all checks passed\n");
    return 0;
}
