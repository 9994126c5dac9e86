/*
 * boot.c - PID 1's set-up, from the initramfs to a running system.
 *
 * Order: devtmpfs/proc/sysfs, then the modules listed by images/build.sh
 * (virtio transport, console, block, ext4) with finit_module, then the root
 * disk replaces the initramfs (switch_root done by hand), then everything
 * that must live in the final root: devpts, tmpfs, cgroup2, hostname, lo,
 * and eth0 with its route and resolv.conf when warrend asks (warren.net=).
 * Without a root disk the guest keeps running from the initramfs.
 */
#include "boot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <arpa/inet.h>
#include <net/route.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define NEWROOT   "/newroot"
#define LOAD_LIST "/lib/modules/load.list"
#define CGROUP_FS "/sys/fs/cgroup"

void gi_boot_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n;

    n = snprintf(line, sizeof line, "warren-init: ");
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    va_end(ap);
    strcat(line, "\n");
    (void)!write(STDERR_FILENO, line, strlen(line));
}

static long long boottime_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_BOOTTIME, &ts);
    return ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/* Read a small file into buf (NUL-terminated, trailing newline cut). */
static int read_small(const char *path, char *buf, size_t cap)
{
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return -errno;
    n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        return -errno;
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
    return 0;
}

static int write_str(const char *path, const char *s)
{
    int rc = 0;
    int fd = open(path, O_WRONLY | O_CLOEXEC);

    if (fd < 0)
        return -errno;
    if (write(fd, s, strlen(s)) < 0)
        rc = -errno;
    close(fd);
    return rc;
}

static int mount_at(const char *src, const char *dst, const char *type, unsigned long flags,
                    const char *data)
{
    mkdir(dst, 0755);
    if (mount(src, dst, type, flags, data) < 0) {
        int rc = -errno;
        gi_boot_log("mount %s on %s: %s", type ? type : src, dst, strerror(-rc));
        return rc;
    }
    return 0;
}

/* The kernel gives init /dev/console only if the initramfs has the node. */
static void ensure_stdio(void)
{
    int fd;

    if (fcntl(STDERR_FILENO, F_GETFD) >= 0)
        return;
    fd = open("/dev/console", O_RDWR | O_NOCTTY);
    if (fd < 0)
        return;
    for (int i = 0; i < 3; i++)
        if (fd != i)
            dup2(fd, i);
    if (fd > 2)
        close(fd);
}

/*
 * Module options the kernel cannot apply to a loadable module (modprobe's
 * job): "name.key=value" words of the command line, as "key=value ...".
 */
static void module_params(const char *cmdline, const char *name, char *out, size_t cap)
{
    size_t nlen = strlen(name), used = 0;
    const char *p = cmdline;

    out[0] = '\0';
    while (*p) {
        size_t wlen = strcspn(p, " ");

        if (wlen > nlen + 1 && strncmp(p, name, nlen) == 0 && p[nlen] == '.' &&
            used + wlen - nlen + 1 < cap) {
            memcpy(out + used, p + nlen + 1, wlen - nlen - 1);
            used += wlen - nlen - 1;
            out[used++] = ' ';
            out[used] = '\0';
        }
        p += wlen;
        p += strspn(p, " ");
    }
}

static void load_modules(const char *cmdline)
{
    char path[256], params[512];
    FILE *f = fopen(LOAD_LIST, "re");

    if (!f)
        return; /* a kernel with everything built in needs no list */
    while (fgets(path, sizeof path, f)) {
        const char *base;
        char name[64];
        int fd;

        path[strcspn(path, "\n")] = '\0';
        if (!path[0])
            continue;
        base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        snprintf(name, sizeof name, "%.*s", (int)strcspn(base, "."), base);
        module_params(cmdline, name, params, sizeof params);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            gi_boot_log("module %s: %s", path, strerror(errno));
            continue;
        }
        if (syscall(SYS_finit_module, fd, params, 0) < 0 && errno != EEXIST)
            gi_boot_log("module %s: %s", name, strerror(errno));
        close(fd);
    }
    fclose(f);
}

/* root=DEV from the command line; /dev/vda when absent. */
static void root_device(const char *cmdline, char *out, size_t cap)
{
    const char *p = cmdline;

    snprintf(out, cap, "/dev/vda");
    while ((p = strstr(p, "root="))) {
        if (p == cmdline || p[-1] == ' ') {
            snprintf(out, cap, "%.*s", (int)strcspn(p + 5, " "), p + 5);
            return;
        }
        p += 5;
    }
}

/* Remove the initramfs' files (they cost RAM) without crossing mounts. */
static void delete_tree(int dirfd, dev_t dev)
{
    DIR *d = fdopendir(dirfd);
    struct dirent *e;

    if (!d) {
        close(dirfd);
        return;
    }
    while ((e = readdir(d))) {
        struct stat st;

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != dev)
            continue;
        if (S_ISDIR(st.st_mode)) {
            int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

            if (sub >= 0)
                delete_tree(sub, dev);
            unlinkat(dirfd, e->d_name, AT_REMOVEDIR);
        } else {
            unlinkat(dirfd, e->d_name, 0);
        }
    }
    closedir(d);
}

/* Mount the root disk on NEWROOT and make it "/"; 0, or -errno and no change. */
static int switch_root(const char *dev)
{
    static const char *const moves[] = {"/dev", "/proc", "/sys"};
    char dst[64], blk[96];
    struct stat st;
    int rc, fd;

    /* virtio_blk probes synchronously, so a missing disk is known at once;
     * devtmpfs may still be a moment behind with the node. */
    snprintf(blk, sizeof blk, "/sys/class/block/%s",
             strrchr(dev, '/') ? strrchr(dev, '/') + 1 : dev);
    if (stat(blk, &st) < 0)
        return -ENODEV;
    for (int i = 0; i < 100 && stat(dev, &st) < 0; i++)
        sleep_ms(2);

    mkdir(NEWROOT, 0755);
    if (mount(dev, NEWROOT, "ext4", MS_NOATIME, NULL) < 0) {
        rc = -errno;
        gi_boot_log("mount %s: %s", dev, strerror(-rc));
        return rc;
    }
    for (size_t i = 0; i < sizeof moves / sizeof moves[0]; i++) {
        snprintf(dst, sizeof dst, NEWROOT "%s", moves[i]);
        mkdir(dst, 0755);
        if (mount(moves[i], dst, NULL, MS_MOVE, NULL) < 0)
            gi_boot_log("move %s: %s", moves[i], strerror(errno));
    }
    if (stat("/", &st) == 0 && (fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0)
        delete_tree(fd, st.st_dev);
    if (chdir(NEWROOT) < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 || chroot(".") < 0 ||
        chdir("/") < 0) {
        rc = -errno;
        gi_boot_log("switch to %s: %s", dev, strerror(-rc));
        return rc;
    }
    return 0;
}

/* The process of the user cgroup the kernel would pick (highest oom_score), or 0. */
static pid_t oom_victim(void)
{
    const char *rel = &GI_CGROUP_ROOT[strlen(CGROUP_FS)]; /* "/warren" */
    size_t rlen = strlen(rel);
    DIR *d = opendir("/proc");
    struct dirent *e;
    long best = -1;
    pid_t victim = 0;

    if (!d)
        return 0;
    while ((e = readdir(d))) {
        char path[64], buf[256];
        pid_t pid = (pid_t)atoi(e->d_name);
        long score;

        if (pid <= 1)
            continue;
        snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
        if (read_small(path, buf, sizeof buf) < 0 || strncmp(buf, "0::", 3) != 0 ||
            strncmp(buf + 3, rel, rlen) != 0 || (buf[3 + rlen] != '/' && buf[3 + rlen] != '\0'))
            continue;
        snprintf(path, sizeof path, "/proc/%d/oom_score", (int)pid);
        if (read_small(path, buf, sizeof buf) == 0 && (score = atol(buf)) > best) {
            best = score;
            victim = pid;
        }
    }
    closedir(d);
    return victim;
}

/*
 * A memory hog in the user cgroup can livelock instead of meeting the OOM
 * killer: reclaim keeps evicting its own file pages (program text), which it
 * faults back in from a slow disk, so reclaim always "makes progress". A
 * child of PID 1 waits on a PSI trigger of the cgroup (no wake-ups while
 * calm) and kills what the OOM killer would have chosen.
 */
#define OOM_TRIGGER "full 1000000 2000000" /* all user tasks stalled 1 s of 2 s */

static void oom_watch(void)
{
    int fd = open(GI_CGROUP_ROOT "/memory.pressure", O_RDWR | O_NONBLOCK | O_CLOEXEC);

    if (fd < 0 || write(fd, OOM_TRIGGER, strlen(OOM_TRIGGER) + 1) < 0) {
        gi_boot_log("memory pressure trigger: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return;
    }
    if (fork() != 0) { /* PID 1 (or a failed fork) goes on */
        close(fd);
        return;
    }
    prctl(PR_SET_NAME, "warren-oomd");
    for (;;) {
        struct pollfd p = {fd, POLLPRI, 0};
        char comm[32] = "?", path[64];
        pid_t pid;

        if (poll(&p, 1, -1) < 0 && errno != EINTR)
            _exit(1);
        if (p.revents & POLLERR)
            _exit(1);
        if (!(p.revents & POLLPRI) || (pid = oom_victim()) <= 0)
            continue;
        snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
        read_small(path, comm, sizeof comm);
        if (kill(pid, SIGKILL) == 0)
            gi_boot_log("memory thrashing in %s: killed %d (%s)", GI_CGROUP_ROOT, (int)pid, comm);
        sleep_ms(500); /* let the memory come back before judging again */
    }
}

/* Total RAM in KiB from /proc/meminfo, or 0. */
static long long mem_total_kib(void)
{
    char buf[256];
    long long kib = 0;

    if (read_small("/proc/meminfo", buf, sizeof buf) == 0)
        sscanf(buf, "MemTotal: %lld", &kib);
    return kib;
}

/*
 * User processes live in GI_CGROUP_ROOT, capped below the VM's RAM so the
 * kernel's OOM killer picks from them long before warren-init (which stays
 * in the root cgroup, at oom_score_adj -1000) runs short.
 */
static int setup_cgroup(void)
{
    long long total = mem_total_kib() * 1024, reserve, max;
    char num[32];
    int rc;

    if (mount_at("cgroup2", CGROUP_FS, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL))
        return -ENODEV;
    /* cpu too: every exec gets its own group with an equal weight, so a fork bomb in one
     * exec cannot starve the next exec of CPU (PID 1 itself runs SCHED_RR in the root). */
    rc = write_str(CGROUP_FS "/cgroup.subtree_control", "+cpu +memory +pids");
    if (rc < 0) {
        gi_boot_log("cgroup controllers: %s", strerror(-rc));
        return rc;
    }
    if (mkdir(GI_CGROUP_ROOT, 0755) < 0 && errno != EEXIST)
        return -errno;
    reserve = total / 8 > (48LL << 20) ? total / 8 : 48LL << 20;
    max = total - reserve > (32LL << 20) ? total - reserve : 32LL << 20;
    snprintf(num, sizeof num, "%lld", max);
    if ((rc = write_str(GI_CGROUP_ROOT "/memory.max", num)) < 0 ||
        (rc = write_str(GI_CGROUP_ROOT "/pids.max", "4096")) < 0) {
        gi_boot_log("cgroup limits: %s", strerror(-rc));
        return rc;
    }
    write_str(GI_CGROUP_ROOT "/memory.swap.max", "0"); /* absent without swap accounting */
    if ((rc = write_str(GI_CGROUP_ROOT "/cgroup.subtree_control", "+cpu +pids")) < 0)
        gi_boot_log("exec cgroup controllers: %s", strerror(-rc));
    oom_watch();
    return 0;
}

static void setup_lo(void)
{
    struct ifreq ifr;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

    if (s < 0)
        return;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, IFNAMSIZ, "lo");
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ioctl(s, SIOCSIFADDR, &ifr) < 0 && errno != EEXIST)
        gi_boot_log("lo address: %s", strerror(errno));
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
            gi_boot_log("lo up: %s", strerror(errno));
    }
    close(s);
}

/* The word "key=value" of the kernel command line: value copied to out, or -1. */
static int cmdline_word(const char *cmdline, const char *key, char *out, size_t cap)
{
    size_t klen = strlen(key);

    for (const char *p = cmdline; *p; p += strspn(p, " ")) {
        size_t wlen = strcspn(p, " ");
        if (wlen > klen && strncmp(p, key, klen) == 0 && p[klen] == '=') {
            snprintf(out, cap, "%.*s", (int)(wlen - klen - 1), p + klen + 1);
            return 0;
        }
        p += wlen;
    }
    return -1;
}

static int inet_ioctl(int s, unsigned long req, const char *ifname, in_addr_t addr)
{
    struct ifreq ifr;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;

    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    sin->sin_family = AF_INET;
    sin->sin_addr.s_addr = addr;
    return ioctl(s, req, &ifr);
}

/*
 * warren.net=ADDR/PREFIX,GATEWAY (set by warrend when networking is on):
 * eth0 gets the address, the default route goes through the gateway, and the
 * gateway is the resolver (warrend's namespace forwards its port 53 to the
 * resolver the operator chose). Every VM gets the same values: clones of one
 * template snapshot must all be right without being told anything.
 */
static void setup_net(const char *cmdline)
{
    char val[64], *slash, *comma;
    struct in_addr addr, gw;
    unsigned prefix;
    struct ifreq ifr;
    struct rtentry rt;
    int s;
    FILE *f;

    if (cmdline_word(cmdline, "warren.net", val, sizeof val) < 0)
        return;
    slash = strchr(val, '/');
    comma = strchr(val, ',');
    if (!slash || !comma || comma < slash)
        goto bad;
    *slash = *comma = '\0';
    prefix = (unsigned)atoi(slash + 1);
    if (inet_aton(val, &addr) == 0 || inet_aton(comma + 1, &gw) == 0 || prefix < 1 || prefix > 32)
        goto bad;
    if ((s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) < 0)
        return;
    if (inet_ioctl(s, SIOCSIFADDR, "eth0", addr.s_addr) < 0 ||
        inet_ioctl(s, SIOCSIFNETMASK, "eth0", htonl(~0u << (32 - prefix))) < 0) {
        gi_boot_log("eth0 address: %s", strerror(errno));
        close(s);
        return;
    }
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, IFNAMSIZ, "eth0");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) == 0) {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
            gi_boot_log("eth0 up: %s", strerror(errno));
    }
    memset(&rt, 0, sizeof rt);
    ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_gateway)->sin_family = AF_INET;
    ((struct sockaddr_in *)&rt.rt_gateway)->sin_addr = gw;
    rt.rt_flags = RTF_UP | RTF_GATEWAY;
    if (ioctl(s, SIOCADDRT, &rt) < 0 && errno != EEXIST)
        gi_boot_log("default route: %s", strerror(errno));
    close(s);
    unlink("/etc/resolv.conf"); /* may be a symlink into a resolver we do not run */
    if ((f = fopen("/etc/resolv.conf", "we"))) {
        fprintf(f, "nameserver %s\n", inet_ntoa(gw));
        fclose(f);
    }
    return;
bad:
    gi_boot_log("warren.net=%s: not ADDR/PREFIX,GATEWAY", val);
}

int gi_boot(struct gi_boot_info *info)
{
    char cmdline[4096] = "", dev[64], host[65];
    struct utsname u;

    memset(info, 0, sizeof *info);
    umask(022);
    mount_at("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    ensure_stdio();
    mount_at("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    mount_at("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    read_small("/proc/cmdline", cmdline, sizeof cmdline);

    load_modules(cmdline);
    root_device(cmdline, dev, sizeof dev);
    info->rooted = switch_root(dev) == 0;

    mount_at("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
             "newinstance,ptmxmode=0666,mode=0620,gid=5");
    if (access("/dev/ptmx", F_OK) < 0)
        symlink("pts/ptmx", "/dev/ptmx");
    /* udev's job elsewhere; bash's <(...) and scripts writing to /dev/stderr need them. */
    symlink("/proc/self/fd", "/dev/fd");
    symlink("/proc/self/fd/0", "/dev/stdin");
    symlink("/proc/self/fd/1", "/dev/stdout");
    symlink("/proc/self/fd/2", "/dev/stderr");
    mount_at("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    mount_at("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=25%");
    mount_at("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=10%");
    if (write_str("/proc/self/oom_score_adj", "-1000") < 0) /* before any fork */
        gi_boot_log("oom_score_adj: %s", strerror(errno));
    info->have_cgroup = setup_cgroup() == 0;

    if (read_small("/etc/hostname", host, sizeof host) < 0 || !host[0])
        snprintf(host, sizeof host, "warren");
    sethostname(host, strlen(host));
    setup_lo();
    setup_net(cmdline);

    /* The kernel starts init with HOME=/ TERM=linux; children inherit ours. */
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    setenv("HOME", "/root", 1);
    unsetenv("TERM");
    /* PID 1 gets no signal whose action is the default, so none is set to
     * SIG_IGN here: ignored signals would be inherited by every command. */
    reboot(RB_DISABLE_CAD);

    uname(&u);
    snprintf(info->kernel, sizeof info->kernel, "%s", u.release);
    info->boot_ms = boottime_ms();
    return 0;
}

static int find_port(const char *name, char *dev, size_t cap)
{
    DIR *d = opendir("/sys/class/virtio-ports");
    struct dirent *e;
    int rc = -ENOENT;

    if (!d)
        return -ENOENT;
    while ((e = readdir(d))) {
        char path[300], val[64];

        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
        if (read_small(path, val, sizeof val) == 0 && strcmp(val, name) == 0) {
            snprintf(dev, cap, "/dev/%s", e->d_name);
            rc = 0;
            break;
        }
    }
    closedir(d);
    return rc;
}

int gi_boot_open_port(const char *name, int timeout_ms, int *fd_out)
{
    long long deadline = boottime_ms() + timeout_ms;
    char dev[300];
    int rc;

    *fd_out = -1;
    /* The port's name arrives from the host after the device is probed,
     * and devtmpfs creates the node on its own: poll both briefly. */
    for (;;) {
        rc = find_port(name, dev, sizeof dev);
        if (rc == 0) {
            int fd = open(dev, O_RDWR | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
            if (fd >= 0) {
                *fd_out = fd;
                return 0;
            }
            rc = -errno;
        }
        if (boottime_ms() >= deadline)
            return rc;
        sleep_ms(2);
    }
}

noreturn void gi_poweroff(void)
{
    sync();
    reboot(RB_POWER_OFF);
    /* No power-off method: with reboot=t a reboot ends QEMU (-no-reboot). */
    reboot(RB_AUTOBOOT);
    for (;;)
        pause();
}
