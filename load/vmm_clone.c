/*
 * vmm_clone.c - what a VM cloned from a template snapshot costs, through the
 * vmm-driver alone (no warrend, no HTTP).
 *
 *   vmm_clone [-n N] [-d dir]
 *
 * Boots one template VM (RAM in a share=on /dev/shm file, qcow2 overlay over
 * the image's minimal.ext4), waits for its agent's PONG, saves it, ends it.
 * Then two ways to get a running clone, N each, one at a time:
 *   cold:        vmm_launch (restore mode) -> vmm_restore -> vmm_cont
 *   pre-started: the QEMU was launched earlier and is WAITING, QMP ready;
 *                the clock starts at vmm_restore
 * and for each: -> restored (stopped), -> running (cont answered), -> the
 * agent's PONG on the guest channel. Then PSS per clone with N clones alive.
 * Prints p50 / p99 / max in ms. Images as in tests/vmm-driver/test_vmm_vm.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <ev.h>

#include "vmm.h"

static struct ev_loop *loop;

#define WAIT(cond, secs)                                                                           \
    do {                                                                                           \
        ev_tstamp end_ = ev_time() + (secs);                                                       \
        while (!(cond) && ev_time() < end_)                                                        \
            ev_run(loop, EVRUN_ONCE);                                                              \
    } while (0)

static void on_tick(struct ev_loop *l, ev_timer *w, int revents) {}

struct vmc {
    struct vmm *vm;
    int chan_fd, exited;
    char reason[300];
    bool op_done, q_done;
    int op_err;
    char why[300];
    ev_tstamp t_op, t_q;
};

static void on_channel(void *ud, int fd)
{
    struct vmc *c = ud;
    if (c->chan_fd >= 0)
        close(c->chan_fd);
    c->chan_fd = fd;
}

static void on_exited(void *ud, int status, const char *reason)
{
    struct vmc *c = ud;
    c->exited = 1;
    snprintf(c->reason, sizeof(c->reason), "%s", reason);
}

static void on_op(void *ud, int err, const char *why)
{
    struct vmc *c = ud;
    c->op_done = true;
    c->op_err = err;
    c->t_op = ev_time();
    snprintf(c->why, sizeof(c->why), "%s", why);
}

static void on_q(void *ud, int err, const char *json)
{
    struct vmc *c = ud;
    c->q_done = true;
    c->t_q = ev_time();
}

static const struct vmm_cbs cbs = {on_channel, on_exited};

/* PING (type 20) -> PONG (21), see protocol/README.md. */
static bool pong_seen(int fd)
{
    uint8_t buf[8192], want[] = {0xa1, 't', 21};
    ssize_t n;
    bool seen = false;

    while ((n = read(fd, buf, sizeof(buf))) > 0)
        seen |= memmem(buf, (size_t)n, want, sizeof(want)) != NULL;
    return seen;
}

static bool ping(int fd, double secs)
{
    uint8_t f[] = {0, 0, 0, 8, 0x82, 0xa1, 't', 20, 0xa2, 'i', 'd', 9};
    ev_tstamp end = ev_time() + secs;
    bool seen = false;

    while (!seen && ev_time() < end) {
        if (write(fd, f, sizeof(f)) != (ssize_t)sizeof(f))
            return false;
        WAIT((seen = pong_seen(fd)), 1.0);
    }
    return seen;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void row(const char *what, double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    printf("| %-52s | %7.1f | %7.1f | %7.1f |\n", what, v[n / 2], v[(n * 99) / 100], v[n - 1]);
}

static long pss_kb(pid_t pid)
{
    char path[64], line[256];
    long v = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
    if (!(f = fopen(path, "r")))
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "Pss:", 4) == 0)
            v = strtol(line + 4, NULL, 10);
    fclose(f);
    return v;
}

static void cfg_init(struct vmm_config *c, const char *id, char *run, size_t cap, const char *dir)
{
    snprintf(run, cap, "%s/%s", dir, id);
    mkdir(run, 0700);
    memset(c, 0, sizeof(*c));
    c->id = id;
    c->run_dir = run;
    c->mem_mb = 256;
    c->vcpus = 1;
    c->accel = vmm_detect_accel(NULL, 0);
    c->console_max = 64 << 10;
}

static void end_vm(struct vmc *c)
{
    if (!c->vm)
        return;
    vmm_kill(c->vm);
    WAIT(c->exited, 10);
    vmm_free(c->vm);
    c->vm = NULL;
    if (c->chan_fd >= 0)
        close(c->chan_fd);
    c->chan_fd = -1;
}

int main(int argc, char **argv)
{
    const char *home = getenv("HOME"), *env = getenv("WARREN_IMAGE_DIR");
    char img[1024], kernel[1200], initrd[1200], rootfs[1200], dir[256], run[300], mem[128],
        snap[400], tdisk[400], *real;
    int n = 10, opt;
    const char *base = "/var/tmp";
    struct vmm_config tc;
    struct vmc t = {.chan_fd = -1};
    ev_timer tick;
    double *r_cold, *g_cold, *p_cold, *q_cold, *r_pre, *g_pre, *p_pre;
    struct vmc *pre;
    struct vmm_config *pc;
    char(*prun)[300], (*pdisk)[400], (*pid_s)[32];
    long pss_total = 0;

    while ((opt = getopt(argc, argv, "n:d:")) != -1) {
        if (opt == 'n')
            n = atoi(optarg);
        else if (opt == 'd')
            base = optarg;
        else {
            fprintf(stderr, "usage: vmm_clone [-n N] [-d dir]\n");
            return 2;
        }
    }
    if (n < 1 || n > 200)
        n = 10;
    if (env && *env)
        snprintf(img, sizeof(img), "%s", env);
    else
        snprintf(img, sizeof(img), "%s/.cache/warren/images/current", home ? home : "/root");
    snprintf(kernel, sizeof(kernel), "%s/vmlinux", img);
    snprintf(initrd, sizeof(initrd), "%s/initramfs.cpio", img);
    snprintf(rootfs, sizeof(rootfs), "%s/minimal.ext4", img);
    if ((real = realpath(rootfs, NULL))) {
        snprintf(rootfs, sizeof(rootfs), "%s", real);
        free(real);
    }
    snprintf(dir, sizeof(dir), "%s/vmm-clone-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    loop = ev_default_loop(EVBACKEND_EPOLL);
    ev_timer_init(&tick, on_tick, 0.02, 0.02);
    ev_timer_start(loop, &tick);
    snprintf(mem, sizeof(mem), "/dev/shm/warren-bench-%d.mem", (int)getpid());
    snprintf(snap, sizeof(snap), "%s/tpl.snap", dir);

    /* The template. */
    cfg_init(&tc, "bench-tpl", run, sizeof(run), dir);
    snprintf(tdisk, sizeof(tdisk), "%s/disk.qcow2", run);
    if (vmm_qcow2_create(tdisk, rootfs, 0) != 0) {
        fprintf(stderr, "no overlay over %s\n", rootfs);
        return 1;
    }
    tc.kernel = kernel;
    tc.initrd = initrd;
    tc.disk = tdisk;
    tc.boot = VMM_BOOT_TEMPLATE;
    tc.mem_path = mem;
    if (vmm_launch(loop, &tc, &cbs, &t, &t.vm) != 0)
        return 1;
    WAIT(t.chan_fd >= 0 || t.exited, 30);
    if (t.chan_fd < 0 || !ping(t.chan_fd, 60)) {
        fprintf(stderr, "template guest did not answer (%s)\n", t.reason);
        return 1;
    }
    if (vmm_save(t.vm, snap, 0, on_op, &t) != 0)
        return 1;
    WAIT(t.op_done, 30);
    if (t.op_err) {
        fprintf(stderr, "save: %s\n", t.why);
        return 1;
    }
    end_vm(&t);

    r_cold = calloc((size_t)n, sizeof(double));
    g_cold = calloc((size_t)n, sizeof(double));
    p_cold = calloc((size_t)n, sizeof(double));
    q_cold = calloc((size_t)n, sizeof(double));
    r_pre = calloc((size_t)n, sizeof(double));
    g_pre = calloc((size_t)n, sizeof(double));
    p_pre = calloc((size_t)n, sizeof(double));
    pre = calloc((size_t)n, sizeof(*pre));
    pc = calloc((size_t)n, sizeof(*pc));
    prun = calloc((size_t)n, sizeof(*prun));
    pdisk = calloc((size_t)n, sizeof(*pdisk));
    pid_s = calloc((size_t)n, sizeof(*pid_s));

    /* Cold: from process start. */
    for (int i = 0; i < n; i++) {
        struct vmc c = {.chan_fd = -1};
        struct vmm_config kc;
        char id[32], krun[300], kd[400];
        ev_tstamp s0;
        snprintf(id, sizeof(id), "bench-c%d", i);
        cfg_init(&kc, id, krun, sizeof(krun), dir);
        snprintf(kd, sizeof(kd), "%s/disk.qcow2", krun);
        vmm_qcow2_create(kd, tdisk, 0);
        kc.disk = kd;
        kc.boot = VMM_BOOT_RESTORE;
        kc.mem_path = mem;
        ev_now_update(loop);
        s0 = ev_time();
        if (vmm_launch(loop, &kc, &cbs, &c, &c.vm) != 0)
            return 1;
        vmm_qmp(c.vm, "{\"execute\":\"query-status\"}", on_q, &c);
        vmm_restore(c.vm, snap, on_op, &c);
        WAIT(c.op_done || c.exited, 30);
        if (c.op_err || c.exited) {
            fprintf(stderr, "restore: %s %s\n", c.why, c.reason);
            return 1;
        }
        q_cold[i] = (c.t_q - s0) * 1e3;
        r_cold[i] = (c.t_op - s0) * 1e3;
        c.op_done = false;
        vmm_cont(c.vm, on_op, &c);
        WAIT(c.op_done, 10);
        g_cold[i] = (c.t_op - s0) * 1e3;
        WAIT(c.chan_fd >= 0, 10);
        if (!ping(c.chan_fd, 30)) {
            fprintf(stderr, "clone did not answer\n");
            return 1;
        }
        p_cold[i] = (ev_time() - s0) * 1e3;
        end_vm(&c);
    }

    /* Pre-started: launch all, wait until each is WAITING with QMP answering. */
    for (int i = 0; i < n; i++) {
        snprintf(pid_s[i], sizeof(pid_s[i]), "bench-p%d", i);
        pre[i].chan_fd = -1;
        cfg_init(&pc[i], pid_s[i], prun[i], sizeof(prun[i]), dir);
        snprintf(pdisk[i], sizeof(pdisk[i]), "%s/disk.qcow2", prun[i]);
        vmm_qcow2_create(pdisk[i], tdisk, 0);
        pc[i].disk = pdisk[i];
        pc[i].boot = VMM_BOOT_RESTORE;
        pc[i].mem_path = mem;
        if (vmm_launch(loop, &pc[i], &cbs, &pre[i], &pre[i].vm) != 0)
            return 1;
        vmm_qmp(pre[i].vm, "{\"execute\":\"query-status\"}", on_q, &pre[i]);
    }
    for (int i = 0; i < n; i++)
        WAIT(pre[i].q_done && pre[i].chan_fd >= 0, 30);
    WAIT(false, 1.0); /* let them settle */
    for (int i = 0; i < n; i++) {
        struct vmc *c = &pre[i];
        ev_tstamp s0;
        ev_now_update(loop);
        s0 = ev_time();
        vmm_restore(c->vm, snap, on_op, c);
        WAIT(c->op_done || c->exited, 30);
        if (c->op_err || c->exited) {
            fprintf(stderr, "restore: %s %s\n", c->why, c->reason);
            return 1;
        }
        r_pre[i] = (c->t_op - s0) * 1e3;
        c->op_done = false;
        vmm_cont(c->vm, on_op, c);
        WAIT(c->op_done, 10);
        g_pre[i] = (c->t_op - s0) * 1e3;
        if (!ping(c->chan_fd, 30)) {
            fprintf(stderr, "clone did not answer\n");
            return 1;
        }
        p_pre[i] = (ev_time() - s0) * 1e3;
    }
    WAIT(false, 2.0);
    for (int i = 0; i < n; i++)
        pss_total += pss_kb(vmm_pid(pre[i].vm));

    printf("vmm_clone: %d clones of a 256 MiB / 1 vCPU template, one at a time\n", n);
    printf("| %-52s | %7s | %7s | %7s |\n", "ms", "p50", "p99", "max");
    printf("|---|---|---|---|\n");
    row("cold: launch -> QMP answers", q_cold, n);
    row("cold: launch -> restored (stopped)", r_cold, n);
    row("cold: launch -> running (cont answered)", g_cold, n);
    row("cold: launch -> agent PONG", p_cold, n);
    row("pre-started: restore -> restored (stopped)", r_pre, n);
    row("pre-started: restore -> running (cont answered)", g_pre, n);
    row("pre-started: restore -> agent PONG", p_pre, n);
    printf("PSS per running clone (%d alive, 2 s after PONG): %ld KiB\n", n, pss_total / n);
    printf("snapshot file: template device state, RAM in %s\n", mem);

    for (int i = 0; i < n; i++)
        end_vm(&pre[i]);
    unlink(mem);
    {
        char cmd[400];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
        (void)!system(cmd);
    }
    return 0;
}
