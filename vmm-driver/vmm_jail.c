/*
 * vmm_jail.c - QEMU in a jail: its own uid, mount namespace and cgroup.
 *
 * What a jailed QEMU gets (Firecracker's jailer, done with QEMU 7.2 and
 * Debian's kernel interfaces):
 *  - its own uid/gid from [uid_base, uid_base + uid_count). The run dir is
 *    chowned to it (0700), so it is the only uid besides warrend's that can
 *    reach the VM's sockets and disk. The uid is found again after a restart
 *    from the run dir's owner, so no record is needed beside the files.
 *  - privileges dropped in the cloned child before exec (setgroups,
 *    setresgid, setresuid, PR_SET_NO_NEW_PRIVS), not with -runas: with
 *    -runas QEMU opens every file and socket as root first; here QEMU never
 *    runs a single instruction as root.
 *  - a mount namespace whose root is a small read-only tmpfs holding only
 *    /usr (ro), the host's /lib* and /bin symlinks, a few device nodes, the
 *    read-only template files and its own run dir, each at its host path, so
 *    QEMU's argv (and vmm_adopt's cmdline check) are the same jailed or not.
 *    The API key, the index and other VMs' run dirs do not exist in there.
 *  - a network namespace: the VM's own (with its tap) when it has a NIC,
 *    else an empty one of its own, never the host's.
 *  - a cgroup "u<uid>.<id>" under <hierarchy>/<cgroup_name> in the memory,
 *    cpu and pids controllers (v1: one group per controller hierarchy; v2:
 *    one group, controllers enabled in each ancestor's subtree_control).
 *    The child joins it before exec (writing "0" to cgroup.procs), so even
 *    QEMU's first allocation is charged. The name carries the uid, so the
 *    start-up sweep keeps exactly the groups of adopted VMs.
 *
 * The child (clone with CLONE_VM | CLONE_VFORK, as posix_spawn does) shares
 * warrend's memory until exec: it runs only system calls on a plan the
 * parent prepared (no malloc, no stdio, raw set*id calls). A failing step is
 * reported through a close-on-exec pipe.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "vmm_int.h"

struct vmm_jail {
    struct vmm_jail_conf c;
    char *cgroup_name, *root_dir;
    struct vmm_cg_host cg;
    int *locks; /* per uid of the range: its lock's fd, -1 when not ours */
    char *lock_dir;
    unsigned refs;             /* the owner + every vmm that may still release into it */
    char pending[8][PATH_MAX]; /* cgroup dirs whose rmdir said EBUSY: retried later */
    unsigned npending;
};

/* ---- pure helpers (unit-tested) ---- */

int vmm_cg_name(char *buf, size_t cap, uid_t uid, const char *id)
{
    int n = snprintf(buf, cap, "u%u.%s", (unsigned)uid, id);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int vmm_cg_parse(const char *name, uid_t *uid)
{
    char *end;
    unsigned long v;

    if (name[0] != 'u' || name[1] < '0' || name[1] > '9')
        return -EINVAL;
    errno = 0;
    v = strtoul(name + 1, &end, 10);
    if (errno || *end != '.' || v > UINT32_MAX - 1)
        return -EINVAL;
    *uid = (uid_t)v;
    return 0;
}

void vmm_cg_limits(unsigned mem_mb, unsigned vcpus, unsigned overhead_mb, unsigned pids_max,
                   struct vmm_cg_limits *l)
{
    if (!mem_mb)
        mem_mb = 256;
    if (!vcpus)
        vcpus = 1;
    l->mem_bytes = ((uint64_t)mem_mb + overhead_mb) << 20;
    /* The vCPU threads plus half a core for QEMU's main loop and I/O. */
    l->cpu_period_us = 100000;
    l->cpu_quota_us = (uint64_t)vcpus * 100000 + 50000;
    l->cpu_weight = vcpus * 100 > 10000 ? 10000 : vcpus * 100;
    l->cpu_shares = vcpus * 1024;
    l->pids_max = pids_max ? pids_max : 512;
}

static bool file_exists(const char *dir, const char *name)
{
    char p[PATH_MAX];

    if (snprintf(p, sizeof(p), "%s/%s", dir, name) >= (int)sizeof(p))
        return false;
    return access(p, F_OK) == 0;
}

/* True if the space-separated list in dir/cgroup.controllers has every word. */
static bool v2_has_controllers(const char *dir)
{
    char p[PATH_MAX], buf[512];
    bool mem = false, cpu = false, pids = false;

    if (snprintf(p, sizeof(p), "%s/cgroup.controllers", dir) >= (int)sizeof(p) ||
        vmm_read_small(p, buf, sizeof(buf)) < 0)
        return false;
    for (char *save = NULL, *w = strtok_r(buf, " \n", &save); w; w = strtok_r(NULL, " \n", &save)) {
        mem |= strcmp(w, "memory") == 0;
        cpu |= strcmp(w, "cpu") == 0;
        pids |= strcmp(w, "pids") == 0;
    }
    return mem && cpu && pids;
}

int vmm_cg_detect(const char *sysfs, const char *name, struct vmm_cg_host *h, char *why, size_t cap)
{
    static const char *const v1[VMM_CG_V1_N] = {"memory", "cpu", "pids"};
    char u[PATH_MAX];

    memset(h, 0, sizeof(*h));
    if (!name || !name[0] || name[0] == '/' || strstr(name, "..") || strchr(name, '\n')) {
        snprintf(why, cap, "jail_cgroup must be a relative path without '..', got '%s'",
                 name ? name : "");
        return -EINVAL;
    }
    /* v1 first: on a hybrid host (this one) the controllers live there and
     * the unified hierarchy has none of them. */
    bool all_v1 = true;
    for (int i = 0; i < VMM_CG_V1_N; i++) {
        char d[PATH_MAX];
        snprintf(d, sizeof(d), "%s/%s", sysfs, v1[i]);
        if (!file_exists(d, "cgroup.procs") || file_exists(d, "cgroup.controllers"))
            all_v1 = false;
    }
    if (all_v1) {
        h->mode = VMM_CG_V1;
        h->n = VMM_CG_V1_N;
        for (int i = 0; i < VMM_CG_V1_N; i++)
            if (snprintf(h->parent[i], sizeof(h->parent[i]), "%s/%s/%s", sysfs, v1[i], name) >=
                (int)sizeof(h->parent[i]))
                return -ENAMETOOLONG;
        snprintf(h->root, sizeof(h->root), "%s", sysfs);
        return 0;
    }
    snprintf(u, sizeof(u), "%s/unified", sysfs);
    if (v2_has_controllers(sysfs) || v2_has_controllers(u)) {
        h->mode = VMM_CG_V2;
        h->n = 1;
        snprintf(h->root, sizeof(h->root), "%s", v2_has_controllers(sysfs) ? sysfs : u);
        if (snprintf(h->parent[0], sizeof(h->parent[0]), "%s/%s", h->root, name) >=
            (int)sizeof(h->parent[0]))
            return -ENAMETOOLONG;
        return 0;
    }
    snprintf(why, cap,
             "no cgroup hierarchy with the memory, cpu and pids controllers under %s "
             "(neither v1 nor v2)",
             sysfs);
    return -ENOTSUP;
}

int vmm_cg_group_dirs(const struct vmm_cg_host *h, uid_t uid, const char *id, char dirs[][PATH_MAX])
{
    char n[128];
    int r;

    if ((r = vmm_cg_name(n, sizeof(n), uid, id)))
        return r;
    for (int i = 0; i < h->n; i++) {
        int k = snprintf(dirs[i], PATH_MAX, "%s/%s", h->parent[i], n);
        if (k < 0 || k >= PATH_MAX)
            return -ENAMETOOLONG;
    }
    return 0;
}

/* ---- uid range ----
 *
 * A uid is a VM's alone on the whole host, not only within this warrend: two
 * warrends (or one and the orphans of a killed one) handing out the same uid
 * would let one VM's QEMU signal and inspect the other's. Each uid held is an
 * flock'd file <uid_lock_dir>/<uid>, which every warrend sees; the lock goes
 * with the holder (a kill -9 included). A killed warrend's QEMUs outlive their
 * locks, so a uid is also taken only when no process runs as it. */

static bool uid_bit(const struct vmm_jail *j, unsigned i)
{
    return j->locks[i] >= 0;
}

/* The lock of uid base + i, held: its fd, or -EBUSY (another holder) or -errno. */
static int uid_lock(const struct vmm_jail *j, unsigned i)
{
    char p[PATH_MAX];
    int fd;

    if (snprintf(p, sizeof(p), "%s/%u", j->lock_dir, j->c.uid_base + i) >= (int)sizeof(p))
        return -ENAMETOOLONG;
    if ((fd = open(p, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno == EWOULDBLOCK ? EBUSY : errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* Which uids of the range a live process runs as (real, effective or saved): a
 * bitmap over uid_count (NULL: out of memory, then every uid counts as busy). */
static uint8_t *uids_running(const struct vmm_jail *j)
{
    uint8_t *busy = calloc(j->c.uid_count / 8 + 1, 1);
    char p[16 + 256], buf[2048];
    struct dirent *e;
    DIR *d;

    if (!busy || !(d = opendir("/proc")))
        return busy;
    while ((e = readdir(d)) != NULL) {
        unsigned u[3];
        ssize_t n;
        char *l;
        int fd;

        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        snprintf(p, sizeof(p), "/proc/%s/status", e->d_name);
        if ((fd = open(p, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        if (!(l = strstr(buf, "\nUid:")) || sscanf(l, "\nUid: %u %u %u", &u[0], &u[1], &u[2]) != 3)
            continue;
        for (int k = 0; k < 3; k++)
            if (u[k] >= j->c.uid_base && u[k] - j->c.uid_base < j->c.uid_count)
                busy[(u[k] - j->c.uid_base) / 8] |= (uint8_t)(1u << ((u[k] - j->c.uid_base) % 8));
    }
    closedir(d);
    return busy;
}

int vmm_jail_uid_alloc(struct vmm_jail *j, uid_t *uid)
{
    uint8_t *busy = NULL;
    int fd, r = -EUSERS;

    /* Lowest free: deterministic, and after a restart the adopted VMs' uids
     * are claimed before anything new is handed out. The process scan (~10 us
     * a process) only once a lock is had. */
    for (unsigned i = 0; i < j->c.uid_count; i++) {
        if (uid_bit(j, i))
            continue;
        if ((fd = uid_lock(j, i)) < 0) {
            if (fd != -EBUSY) {
                r = fd;
                break;
            }
            continue;
        }
        if (!busy && !(busy = uids_running(j))) {
            close(fd);
            r = -ENOMEM;
            break;
        }
        if (busy[i / 8] & (1u << (i % 8))) {
            close(fd);
            continue;
        }
        j->locks[i] = fd;
        *uid = (uid_t)(j->c.uid_base + i);
        r = 0;
        break;
    }
    free(busy);
    return r;
}

int vmm_jail_uid_claim(struct vmm_jail *j, uid_t uid)
{
    unsigned i;
    int fd;

    if (uid < j->c.uid_base || uid - j->c.uid_base >= j->c.uid_count)
        return -ERANGE;
    i = uid - j->c.uid_base;
    if (uid_bit(j, i))
        return -EEXIST;
    /* An adopted VM's QEMU runs as it already: only the lock counts here. */
    if ((fd = uid_lock(j, i)) < 0)
        return fd == -EBUSY ? -EEXIST : fd;
    j->locks[i] = fd;
    return 0;
}

void vmm_jail_uid_release(struct vmm_jail *j, uid_t uid)
{
    if (uid >= j->c.uid_base && uid - j->c.uid_base < j->c.uid_count) {
        unsigned i = uid - j->c.uid_base;
        if (j->locks[i] >= 0)
            close(j->locks[i]);
        j->locks[i] = -1;
    }
}

unsigned vmm_jail_uids_in_use(const struct vmm_jail *j)
{
    unsigned n = 0;
    for (unsigned i = 0; i < j->c.uid_count; i++)
        n += uid_bit(j, i);
    return n;
}

/* ---- jail object ---- */

static int write_file(const char *dir, const char *name, const char *val)
{
    char p[PATH_MAX];
    int fd, r = 0;
    size_t n = strlen(val);

    if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, name) >= sizeof(p))
        return -ENAMETOOLONG;
    if ((fd = open(p, O_WRONLY | O_CLOEXEC)) < 0)
        return -errno;
    if (write(fd, val, n) != (ssize_t)n)
        r = -errno;
    close(fd);
    return r;
}

/* v2: enable memory, cpu and pids for the children of root, each ancestor of
 * parent, and parent itself (creating the missing ones). */
static int v2_enable(const struct vmm_cg_host *h, char *why, size_t cap)
{
    char p[PATH_MAX];
    size_t rl = strlen(h->root);
    int r;

    snprintf(p, sizeof(p), "%s", h->parent[0]);
    for (char *s = p + rl;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (s > p + rl && mkdir(p, 0755) != 0 && errno != EEXIST) {
                snprintf(why, cap, "cannot create cgroup %s: %s", p, strerror(errno));
                return -errno;
            }
            if ((r = write_file(p, "cgroup.subtree_control", "+memory +cpu +pids")) != 0) {
                snprintf(why, cap,
                         "cannot enable memory, cpu and pids in %s/cgroup.subtree_control: %s", p,
                         strerror(-r));
                return r;
            }
            *s = c;
            if (!c)
                break;
        }
    }
    return 0;
}

/* mkdir -p: parents 0755, the last one mode. 0 or -errno. */
static int mkdir_p(const char *path, mode_t mode)
{
    char p[PATH_MAX];

    if (snprintf(p, sizeof(p), "%s", path) >= (int)sizeof(p))
        return -ENAMETOOLONG;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -errno;
        *s = '/';
    }
    return mkdir(p, mode) != 0 && errno != EEXIST ? -errno : 0;
}

int vmm_jail_new(const struct vmm_jail_conf *c, struct vmm_jail **out, char *why, size_t cap)
{
    struct vmm_jail *j = NULL;
    int r;

    *out = NULL;
    if (geteuid() != 0) {
        snprintf(why, cap, "warrend does not run as root: cannot switch QEMU to its own uid");
        return -EPERM;
    }
    if (!c->uid_count || c->uid_base == 0 || (uint64_t)c->uid_base + c->uid_count > UINT32_MAX) {
        snprintf(why, cap, "jail_uid_base/jail_uid_count give no usable uid range");
        return -EINVAL;
    }
    if (!c->root_dir || c->root_dir[0] != '/') {
        snprintf(why, cap, "no jail root directory");
        return -EINVAL;
    }
    if (!(j = calloc(1, sizeof(*j))) || !(j->locks = malloc(c->uid_count * sizeof(int))) ||
        !(j->cgroup_name = strdup(c->cgroup_name ? c->cgroup_name : "")) ||
        !(j->root_dir = strdup(c->root_dir)) ||
        !(j->lock_dir = strdup(c->uid_lock_dir ? c->uid_lock_dir : VMM_UID_LOCK_DIR))) {
        snprintf(why, cap, "out of memory");
        r = -ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < c->uid_count; i++)
        j->locks[i] = -1;
    j->c = *c;
    j->c.cgroup_name = j->cgroup_name;
    j->c.root_dir = j->root_dir;
    j->c.uid_lock_dir = j->lock_dir;
    j->refs = 1;
    if ((r = mkdir_p(j->lock_dir, 0700)) != 0) {
        snprintf(why, cap, "cannot create %s: %s", j->lock_dir, strerror(-r));
        goto fail;
    }
    /* Every uid locked by another warrend: refuse now, rather than fail each create.
     * (Processes running as a uid do not count here: they may be this state dir's
     * VMs, adopted next.) */
    {
        unsigned i, held = 0;
        for (i = 0; i < c->uid_count; i++) {
            int fd = uid_lock(j, i);
            if (fd >= 0) {
                close(fd);
                break;
            }
            if (fd != -EBUSY) {
                r = fd;
                snprintf(why, cap, "cannot lock a uid in %s: %s", j->lock_dir, strerror(-r));
                goto fail;
            }
            held++;
        }
        if (held == c->uid_count) {
            r = -EBUSY;
            snprintf(why, cap,
                     "every uid of %u-%u is held by another warrend (locks in %s): give this one "
                     "a jail_uid_base of its own",
                     c->uid_base, c->uid_base + c->uid_count - 1, j->lock_dir);
            goto fail;
        }
    }
    if ((r = vmm_cg_detect(c->cgroup_sysfs ? c->cgroup_sysfs : "/sys/fs/cgroup", j->cgroup_name,
                           &j->cg, why, cap)) != 0)
        goto fail;
    if (j->cg.mode == VMM_CG_V2) {
        if ((r = v2_enable(&j->cg, why, cap)) != 0)
            goto fail;
    } else {
        for (int i = 0; i < j->cg.n; i++) {
            /* mkdir -p below the controller's mount (sysfs/<ctrl>). */
            char p[PATH_MAX];
            size_t skip = strlen(j->cg.root) + 1;
            snprintf(p, sizeof(p), "%s", j->cg.parent[i]);
            skip += strcspn(p + skip, "/");
            for (char *s = p + skip + 1;; s++) {
                if (*s != '/' && *s != '\0')
                    continue;
                char ch = *s;
                *s = '\0';
                if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                    r = -errno;
                    snprintf(why, cap, "cannot create cgroup %s: %s", p, strerror(errno));
                    goto fail;
                }
                *s = ch;
                if (!ch)
                    break;
            }
        }
    }
    if (mkdir(j->root_dir, 0700) != 0 && errno != EEXIST) {
        r = -errno;
        snprintf(why, cap, "cannot create %s: %s", j->root_dir, strerror(errno));
        goto fail;
    }
    *out = j;
    return 0;
fail:
    if (j) {
        free(j->locks);
        free(j->lock_dir);
        free(j->cgroup_name);
        free(j->root_dir);
        free(j);
    }
    return r;
}

struct vmm_jail *vmm_jail_ref(struct vmm_jail *j)
{
    if (j)
        j->refs++;
    return j;
}

static void retry_pending(struct vmm_jail *j);

void vmm_jail_free(struct vmm_jail *j)
{
    if (!j || --j->refs > 0)
        return;
    retry_pending(j);
    for (unsigned i = 0; i < j->c.uid_count; i++)
        if (j->locks[i] >= 0)
            close(j->locks[i]);
    free(j->locks);
    free(j->lock_dir);
    free(j->cgroup_name);
    free(j->root_dir);
    free(j);
}

const char *vmm_jail_describe(const struct vmm_jail *j, char *buf, size_t cap)
{
    snprintf(buf, cap, "uids %u-%u, cgroup %s %s%s", j->c.uid_base,
             j->c.uid_base + j->c.uid_count - 1, j->cg.mode == VMM_CG_V2 ? "v2" : "v1",
             j->cg.mode == VMM_CG_V2 ? j->cg.parent[0] : "{memory,cpu,pids}/",
             j->cg.mode == VMM_CG_V2 ? "" : j->cgroup_name);
    return buf;
}

/* rmdir, remembering a group still busy (its last task not yet gone). */
static void cg_remove(struct vmm_jail *j, const char *dir)
{
    if (rmdir(dir) == 0 || errno == ENOENT)
        return;
    if (errno == EBUSY && j->npending < sizeof(j->pending) / sizeof(j->pending[0]))
        snprintf(j->pending[j->npending++], PATH_MAX, "%s", dir);
}

static void retry_pending(struct vmm_jail *j)
{
    unsigned k = 0;

    for (unsigned i = 0; i < j->npending; i++)
        if (rmdir(j->pending[i]) != 0 && errno == EBUSY)
            memmove(j->pending[k++], j->pending[i], PATH_MAX);
    j->npending = k;
}

unsigned vmm_jail_retry(struct vmm_jail *j)
{
    retry_pending(j);
    return j->npending;
}

/* SIGKILL every process in a group dir (a QEMU left over from a lost record). */
static int cg_kill_all(const char *dir)
{
    char p[PATH_MAX];
    FILE *f;
    int pid, n = 0;

    if (snprintf(p, sizeof(p), "%s/cgroup.procs", dir) >= (int)sizeof(p) || !(f = fopen(p, "re")))
        return 0;
    while (fscanf(f, "%d", &pid) == 1)
        if (pid > 0 && kill(pid, SIGKILL) == 0)
            n++;
    fclose(f);
    return n;
}

/* Whether a VM group is another warrend's, so a sweep leaves it alone: its uid is
 * locked by another (a live warrend's VM; ours are skipped before), or a process in it
 * is not one of this warrend's QEMUs (whose command lines all name own, its state dir:
 * an orphan of another warrend that was killed, which that one will adopt again). */
static bool cg_foreign(const struct vmm_jail *j, const char *dir, uid_t uid, const char *own)
{
    char p[PATH_MAX], cmd[4096];
    FILE *f;
    int pid;
    bool foreign = false;

    if (uid >= j->c.uid_base && uid - j->c.uid_base < j->c.uid_count) {
        int fd = uid_lock(j, uid - j->c.uid_base);
        if (fd == -EBUSY)
            return true;
        if (fd >= 0)
            close(fd);
    }
    if (!own || !*own)
        return false;
    if (snprintf(p, sizeof(p), "%s/cgroup.procs", dir) >= (int)sizeof(p) || !(f = fopen(p, "re")))
        return false;
    while (!foreign && fscanf(f, "%d", &pid) == 1) {
        ssize_t n;
        int fd;
        snprintf(p, sizeof(p), "/proc/%d/cmdline", pid);
        if ((fd = open(p, O_RDONLY | O_CLOEXEC)) < 0)
            continue; /* gone already */
        n = read(fd, cmd, sizeof(cmd) - 1);
        close(fd);
        if (n <= 0)
            continue;
        for (ssize_t i = 0; i < n; i++)
            if (!cmd[i])
                cmd[i] = ' ';
        cmd[n] = '\0';
        foreign = !strstr(cmd, own);
    }
    fclose(f);
    return foreign;
}

int vmm_jail_sweep(struct vmm_jail *j, const char *own)
{
    int removed = 0;

    retry_pending(j);
    for (int i = 0; i < j->cg.n; i++) {
        DIR *d = opendir(j->cg.parent[i]);
        struct dirent *e;

        if (!d)
            continue;
        while ((e = readdir(d)) != NULL) {
            char p[PATH_MAX];
            uid_t uid;

            if (e->d_type != DT_DIR || vmm_cg_parse(e->d_name, &uid) != 0)
                continue;
            if (uid >= j->c.uid_base && uid - j->c.uid_base < j->c.uid_count &&
                uid_bit(j, uid - j->c.uid_base))
                continue; /* an adopted VM's */
            if (snprintf(p, sizeof(p), "%s/%s", j->cg.parent[i], e->d_name) >= (int)sizeof(p))
                continue;
            if (cg_foreign(j, p, uid, own))
                continue;
            if (cg_kill_all(p) > 0) {
                /* Killed just now: the tasks leave the group within milliseconds.
                 * This runs once at start, before the loop. */
                for (int t = 0; t < 200 && rmdir(p) != 0 && errno == EBUSY; t++)
                    nanosleep(&(struct timespec){0, 5000000}, NULL);
            }
            if (rmdir(p) == 0 || errno == ENOENT)
                removed++;
        }
        closedir(d);
    }
    return removed;
}

/* ---- one VM ---- */

static int make_group(struct vmm_jail *j, struct vmm_jail_vm *jv, const struct vmm_config *cfg)
{
    struct vmm_cg_limits l;
    char v[64];
    int r;

    vmm_cg_limits(cfg->mem_mb, cfg->vcpus, j->c.mem_overhead_mb, j->c.pids_max, &l);
    jv->mem_limit = l.mem_bytes;
    if ((r = vmm_cg_group_dirs(&j->cg, jv->uid, cfg->id, jv->cg)) != 0)
        return r;
    jv->ncg = j->cg.n;
    for (int i = 0; i < jv->ncg; i++)
        if (mkdir(jv->cg[i], 0755) != 0 && errno != EEXIST)
            return -errno;
    if (j->cg.mode == VMM_CG_V2) {
        snprintf(v, sizeof(v), "%llu", (unsigned long long)l.mem_bytes);
        if ((r = write_file(jv->cg[0], "memory.max", v)))
            return r;
        /* No swap beyond the limit (absent when the kernel has no swap accounting). */
        (void)write_file(jv->cg[0], "memory.swap.max", "0");
        snprintf(v, sizeof(v), "%llu %llu", (unsigned long long)l.cpu_quota_us,
                 (unsigned long long)l.cpu_period_us);
        if ((r = write_file(jv->cg[0], "cpu.max", v)))
            return r;
        snprintf(v, sizeof(v), "%u", l.cpu_weight);
        (void)write_file(jv->cg[0], "cpu.weight", v);
        snprintf(v, sizeof(v), "%u", l.pids_max);
        return write_file(jv->cg[0], "pids.max", v);
    }
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l.mem_bytes);
    if ((r = write_file(jv->cg[VMM_CG_MEM], "memory.limit_in_bytes", v)))
        return r;
    /* memsw >= limit must hold: written after limit_in_bytes. Absent without swap accounting. */
    (void)write_file(jv->cg[VMM_CG_MEM], "memory.memsw.limit_in_bytes", v);
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l.cpu_period_us);
    if ((r = write_file(jv->cg[VMM_CG_CPU], "cpu.cfs_period_us", v)))
        return r;
    snprintf(v, sizeof(v), "%llu", (unsigned long long)l.cpu_quota_us);
    if ((r = write_file(jv->cg[VMM_CG_CPU], "cpu.cfs_quota_us", v)))
        return r;
    snprintf(v, sizeof(v), "%u", l.cpu_shares);
    (void)write_file(jv->cg[VMM_CG_CPU], "cpu.shares", v);
    snprintf(v, sizeof(v), "%u", l.pids_max);
    return write_file(jv->cg[VMM_CG_PIDS], "pids.max", v);
}

int vmm_jail_prepare(struct vmm_jail *j, const struct vmm_config *cfg, struct vmm_jail_vm *jv)
{
    int r;

    memset(jv, 0, sizeof(*jv));
    retry_pending(j);
    if ((r = vmm_jail_uid_alloc(j, &jv->uid)) != 0)
        return r;
    jv->on = true;
    if ((r = make_group(j, jv, cfg)) != 0)
        goto fail;
    /* The VM's files: its uid owns the run dir (0700) and the disk; warrend (root)
     * reaches them anyway, no other uid can. */
    if (chown(cfg->run_dir, jv->uid, jv->uid) != 0 || chmod(cfg->run_dir, 0700) != 0 ||
        (cfg->disk && (chown(cfg->disk, jv->uid, jv->uid) != 0 || chmod(cfg->disk, 0600) != 0))) {
        r = -errno;
        goto fail;
    }
    return 0;
fail:
    vmm_jail_release(j, jv);
    return r;
}

int vmm_jail_adopt(struct vmm_jail *j, const struct vmm_config *cfg, pid_t pid,
                   struct vmm_jail_vm *jv)
{
    char p[64], line[256];
    struct stat st;
    FILE *f;
    unsigned ruid = 0;
    int r;

    memset(jv, 0, sizeof(*jv));
    if (stat(cfg->run_dir, &st) != 0)
        return -errno;
    /* A VM started unjailed (root-owned run dir) stays unjailed. */
    if (st.st_uid < j->c.uid_base || st.st_uid - j->c.uid_base >= j->c.uid_count)
        return 0;
    snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
    if (!(f = fopen(p, "re")))
        return -ESRCH;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Uid: %u", &ruid) == 1)
            break;
    fclose(f);
    if (ruid != st.st_uid)
        return -ESRCH; /* not the process that owns this run dir */
    if ((r = vmm_jail_uid_claim(j, st.st_uid)) != 0)
        return r; /* -EEXIST: another live VM has it: refuse rather than share */
    jv->on = true;
    jv->uid = st.st_uid;
    jv->ncg = j->cg.n;
    if ((r = vmm_cg_group_dirs(&j->cg, jv->uid, cfg->id, jv->cg)) != 0) {
        vmm_jail_release(j, jv);
        return r;
    }
    {
        struct vmm_cg_limits l;
        vmm_cg_limits(cfg->mem_mb, cfg->vcpus, j->c.mem_overhead_mb, j->c.pids_max, &l);
        jv->mem_limit = l.mem_bytes;
    }
    return 0;
}

void vmm_jail_release(struct vmm_jail *j, struct vmm_jail_vm *jv)
{
    if (!jv->on)
        return;
    for (int i = 0; i < jv->ncg; i++)
        cg_remove(j, jv->cg[i]);
    vmm_jail_uid_release(j, jv->uid);
    jv->on = false;
}

bool vmm_jail_oom_killed(const struct vmm_jail *j, const struct vmm_jail_vm *jv)
{
    char p[PATH_MAX + 32], line[128];
    unsigned long long n = 0;
    FILE *f;

    if (!jv->on)
        return false;
    snprintf(p, sizeof(p), "%s/%s", jv->cg[j->cg.mode == VMM_CG_V2 ? 0 : VMM_CG_MEM],
             j->cg.mode == VMM_CG_V2 ? "memory.events" : "memory.oom_control");
    if (!(f = fopen(p, "re")))
        return false;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "oom_kill %llu", &n) == 1)
            break;
    fclose(f);
    return n > 0;
}

/* ---- the child: build the root, join the group, drop privileges, exec ---- */

enum mnt_kind { M_DIR_RO, M_FILE_RO, M_DEV, M_DIR_RW, M_LINK, M_PROC };

struct mnt {
    enum mnt_kind kind;
    char src[PATH_MAX]; /* host path, or the link target */
    char dst[PATH_MAX]; /* root_dir + host path */
};

#define MAX_MNT 32

struct plan {
    const char *root;
    struct mnt m[MAX_MNT];
    int n;
    int procs_fd[VMM_CG_V1_N];
    int nprocs;
    gid_t groups[1];
    int ngroups;
    uid_t uid;
    const char *exe;
    char *const *argv;
    int null_fd, out_fd, err_pipe; /* err_pipe -1: forked (set-up first), report to out_fd */
    int mem_fd;                    /* > 0: left on VMM_MEM_FD for QEMU (cfg->mem_fd) */
    const char *netns;             /* NULL: no network; else the namespace to enter */
    char *const *wrap;             /* NULL, or the set-up to run (and wait for) first */
};

static int plan_add(struct plan *pl, enum mnt_kind k, const char *src, const char *hostpath)
{
    struct mnt *m;

    if (pl->n >= MAX_MNT)
        return -E2BIG;
    m = &pl->m[pl->n];
    m->kind = k;
    if (snprintf(m->src, sizeof(m->src), "%s", src) >= (int)sizeof(m->src) ||
        snprintf(m->dst, sizeof(m->dst), "%s%s", pl->root, hostpath) >= (int)sizeof(m->dst))
        return -ENAMETOOLONG;
    pl->n++;
    return 0;
}

/* A file the jail must show read-only (kernel, initramfs, template): skipped if
 * it lives under /usr, which is there already. */
static int plan_file(struct plan *pl, const char *path)
{
    char real[PATH_MAX];

    if (!path)
        return 0;
    if (!realpath(path, real))
        return -errno;
    if (strncmp(real, "/usr/", 5) == 0)
        return 0;
    /* Bind the resolved file at the path QEMU is given (a symlink there would
     * point outside the jail). */
    return plan_add(pl, M_FILE_RO, real, path);
}

/* The disk's backing files below the overlay (a restored snapshot's overlay is
 * backed by the snapshot's frozen overlay, backed in turn by the template image,
 * or by an older snapshot's): QEMU opens each by the name the one before records,
 * so the jail shows each, read-only, once, at that name. A kernel boot's chain is
 * overlay -> cfg->backing, already there: nothing is added. A file that is not a
 * qcow2 ends the walk (the raw template image). The names must be warrend's own
 * (vmm_qcow2_create, vmm_qcow2_rebase; vmm.h): a chain deeper than
 * BACKING_CHAIN_MAX (a loop) or a relative name is refused. */
#define BACKING_CHAIN_MAX 8

static int plan_chain(struct plan *pl, const char *disk)
{
    char cur[PATH_MAX], next[PATH_MAX];
    int r;

    if (!disk)
        return 0;
    snprintf(cur, sizeof(cur), "%s", disk);
    for (int depth = 0;; depth++) {
        bool have = false;
        if (vmm_qcow2_backing(cur, next, sizeof(next)) != 0 || !next[0])
            return 0;
        if (depth == BACKING_CHAIN_MAX || next[0] != '/')
            return -ELOOP;
        for (int i = 0; i < pl->n; i++)
            have |= strcmp(pl->m[i].dst + strlen(pl->root), next) == 0;
        if (!have && (r = plan_file(pl, next)))
            return r;
        memcpy(cur, next, sizeof(cur));
    }
}

int vmm_jail_plan_build(const char *root, const struct vmm_config *cfg, const char *exe,
                        struct vmm_jail_plan_view *view)
{
    static const char *const tops[] = {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"};
    static const char *const devs[] = {"/dev/null", "/dev/zero", "/dev/random", "/dev/urandom"};
    struct plan *pl = (struct plan *)view;
    int r;

    memset(pl, 0, sizeof(*pl));
    pl->root = root;
    if ((r = plan_add(pl, M_DIR_RO, "/usr", "/usr")))
        return r;
    for (size_t i = 0; i < sizeof(tops) / sizeof(tops[0]); i++) {
        char link[PATH_MAX];
        ssize_t n = readlink(tops[i], link, sizeof(link) - 1);
        struct stat st;
        if (n > 0) {
            link[n] = 0;
            r = plan_add(pl, M_LINK, link, tops[i]);
        } else if (stat(tops[i], &st) == 0 && S_ISDIR(st.st_mode)) {
            r = plan_add(pl, M_DIR_RO, tops[i], tops[i]);
        }
        if (r)
            return r;
    }
    if (access("/etc/ld.so.cache", R_OK) == 0 &&
        (r = plan_add(pl, M_FILE_RO, "/etc/ld.so.cache", "/etc/ld.so.cache")))
        return r;
    for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++)
        if ((r = plan_add(pl, M_DEV, devs[i], devs[i])))
            return r;
    if (cfg->accel == VMM_ACCEL_KVM && (r = plan_add(pl, M_DEV, "/dev/kvm", "/dev/kvm")))
        return r;
    if ((r = plan_file(pl, exe)) || (r = plan_file(pl, cfg->kernel)) ||
        (r = plan_file(pl, cfg->initrd)) || (r = plan_file(pl, cfg->backing)))
        return r;
    if ((r = plan_chain(pl, cfg->disk)))
        return r;
    if (cfg->mem_path && cfg->mem_fd > 0) {
        /* A clone's template RAM: the sealed memfd QEMU inherits on VMM_MEM_FD, at the
         * path its argv names, through /proc/self/fd (a proc of its own: only the
         * processes of its uid, no system files). */
        pl->mem_fd = cfg->mem_fd;
        if ((r = plan_add(pl, M_PROC, "proc", "/proc")) ||
            (r = plan_add(pl, M_LINK, "/proc/self/fd/" VMM_MEM_FD_STR, cfg->mem_path)))
            return r;
    }
    return plan_add(pl, M_DIR_RW, cfg->run_dir, cfg->run_dir);
}

size_t vmm_jail_plan_size(void)
{
    return sizeof(struct plan);
}

int vmm_jail_plan_entry(const struct vmm_jail_plan_view *view, int i, int *kind, const char **src,
                        const char **dst)
{
    const struct plan *pl = (const struct plan *)view;

    if (i < 0 || i >= pl->n)
        return -ENOENT;
    *kind = pl->m[i].kind;
    *src = pl->m[i].src;
    *dst = pl->m[i].dst;
    return 0;
}

struct child_err {
    int step;
    int err;
};

static const char *const step_names[] = {
    "setsid",         "join cgroup",         "unshare (mount, network)",
    "make / private", "mount tmpfs root",    "create path",
    "bind mount",     "remount read-only",   "symlink",
    "pivot_root",     "detach old root",     "remount root read-only",
    "setrlimit",      "setgroups",           "setresgid",
    "setresuid",      "PR_SET_NO_NEW_PRIVS", "dup2",
    "exec",           "network set-up",      "enter the network namespace",
    "attach to tap0", "mount proc",
};

enum {
    S_SETSID,
    S_CGROUP,
    S_UNSHARE,
    S_PRIVATE,
    S_TMPFS,
    S_MKDIR,
    S_BIND,
    S_REMOUNT,
    S_LINK,
    S_PIVOT,
    S_UMOUNT,
    S_ROOT_RO,
    S_RLIMIT,
    S_SETGROUPS,
    S_SETGID,
    S_SETUID,
    S_NNP,
    S_DUP,
    S_EXEC,
    S_NETSETUP,
    S_NETNS,
    S_TAP,
    S_PROC,
};

static __attribute__((noreturn)) void child_fail(const struct plan *pl, int step)
{
    struct child_err e = {step, errno};

    if (pl->err_pipe >= 0) {
        (void)!write(pl->err_pipe, &e, sizeof(e));
    } else {
        /* Forked: nobody reads the pipe; the message is qemu.log's last line,
         * the exit reason. Only async-signal-safe calls: no stdio. */
        const char *name = strerrorname_np(e.err);
        const char *parts[] = {"[warren: jail: ", step_names[step], ": ", name ? name : "error",
                               "]\n"};
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
            (void)!write(pl->out_fd, parts[i], strlen(parts[i]));
    }
    _exit(127);
}

/* Forked child only: close every descriptor it does not use (warrend's
 * listening socket, clients, the index), so that none outlives warrend while
 * the set-up runs. */
static void close_others(const struct plan *pl)
{
    int keep[VMM_CG_V1_N + 3], n = 0;
    unsigned lo = 3;

    for (int i = 0; i < pl->nprocs; i++)
        keep[n++] = pl->procs_fd[i];
    keep[n++] = pl->null_fd;
    keep[n++] = pl->out_fd;
    if (pl->mem_fd > 0)
        keep[n++] = pl->mem_fd;
    /* Ascending (at most six: insertion sort). */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && keep[j - 1] > keep[j]; j--) {
            int t = keep[j];
            keep[j] = keep[j - 1];
            keep[j - 1] = t;
        }
    for (int i = 0; i < n; i++) {
        if (keep[i] < (int)lo)
            continue;
        if ((unsigned)keep[i] > lo)
            syscall(SYS_close_range, lo, (unsigned)keep[i] - 1, 0);
        lo = (unsigned)keep[i] + 1;
    }
    syscall(SYS_close_range, lo, ~0u, 0);
}

/* Forked child only: run the network set-up as root, its output into out_fd,
 * and wait for it. */
static void run_wrap(const struct plan *pl)
{
    char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
    int st = 0;
    pid_t p = fork();

    if (p == 0) {
        if (dup2(pl->null_fd, 0) < 0 || dup2(pl->out_fd, 1) < 0 || dup2(pl->out_fd, 2) < 0)
            _exit(126);
        syscall(SYS_close_range, 3, ~0u, 0x4 /* CLOSE_RANGE_CLOEXEC */);
        execve(pl->wrap[0], pl->wrap, envp);
        _exit(126);
    }
    if (p < 0)
        child_fail(pl, S_NETSETUP);
    while (waitpid(p, &st, 0) < 0)
        if (errno != EINTR)
            child_fail(pl, S_NETSETUP);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        errno = EIO; /* ip's or nft's own message is just above in qemu.log */
        child_fail(pl, S_NETSETUP);
    }
}

/* Enter the VM's network namespace and attach to its tap0 (as root, before
 * the privileges go): returns the tap's fd, above the standard three. */
static int net_enter(const struct plan *pl)
{
    struct ifreq ifr;
    int ns, fd, hi;

    if ((ns = open(pl->netns, O_RDONLY | O_CLOEXEC)) < 0 || setns(ns, CLONE_NEWNET) != 0)
        child_fail(pl, S_NETNS);
    close(ns);
    /* Opened after setns: a tun file belongs to the namespace it was opened in. */
    if ((fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC)) < 0)
        child_fail(pl, S_TAP);
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, "tap0", 5);
    /* What QEMU asks for itself with ifname=tap0 (vnet header: offloads). */
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if (ioctl(fd, TUNSETIFF, &ifr) != 0)
        child_fail(pl, S_TAP);
    if ((hi = fcntl(fd, F_DUPFD_CLOEXEC, 10)) < 0)
        child_fail(pl, S_TAP);
    close(fd);
    return hi;
}

/* mkdir -p of path's parents (mode 0755) inside the new root; path is copied. */
static int mkparents(const char *path, size_t skip)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);

    if (n >= sizeof(buf))
        return -1;
    memcpy(buf, path, n + 1);
    for (char *p = buf + skip + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    return 0;
}

static __attribute__((noreturn)) void child(const struct plan *pl)
{
    int tap = -1, mem;
    size_t rl = strlen(pl->root);
    struct rlimit core = {0, 0};
    sigset_t none;
    char *const envp[] = {"PATH=/usr/bin:/bin", NULL};

    /* Signals warrend ignores or blocks would stay so across exec. */
    sigemptyset(&none);
    for (int s = 1; s < NSIG; s++)
        if (s != SIGKILL && s != SIGSTOP)
            signal(s, SIG_DFL);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (pl->wrap)
        close_others(pl);
    if (setsid() < 0)
        child_fail(pl, S_SETSID);
    /* The group first: a process the start-up sweep finds in it is killed,
     * even while its network set-up still runs. */
    for (int i = 0; i < pl->nprocs; i++)
        if (write(pl->procs_fd[i], "0", 1) != 1)
            child_fail(pl, S_CGROUP);
    if (pl->wrap)
        run_wrap(pl);
    if (pl->netns)
        tap = net_enter(pl);
    /* Without a NIC, a network namespace of its own, empty (not even lo up):
     * in the host's, QEMU's uid could reach every service on loopback,
     * warrend's API included. ~0.3 ms (docs/SECURITY.md), paid at launch, so
     * a pool's waiting QEMU pays it before any create. */
    if (unshare(pl->netns ? CLONE_NEWNS : CLONE_NEWNS | CLONE_NEWNET) != 0)
        child_fail(pl, S_UNSHARE);
    /* Nothing mounted from here on may propagate back to the host. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        child_fail(pl, S_PRIVATE);
    if (mount("tmpfs", pl->root, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") !=
        0)
        child_fail(pl, S_TMPFS);
    for (int i = 0; i < pl->n; i++) {
        const struct mnt *m = &pl->m[i];
        unsigned long ro;
        int fd;

        if (mkparents(m->dst, rl) != 0)
            child_fail(pl, S_MKDIR);
        if (m->kind == M_PROC) {
            if ((mkdir(m->dst, 0555) != 0 && errno != EEXIST) ||
                mount("proc", m->dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      "hidepid=invisible,subset=pid") != 0)
                child_fail(pl, S_PROC);
            continue;
        }
        if (m->kind == M_LINK) {
            if (symlink(m->src, m->dst) != 0)
                child_fail(pl, S_LINK);
            continue;
        }
        if (m->kind == M_DIR_RO || m->kind == M_DIR_RW) {
            if (mkdir(m->dst, 0755) != 0 && errno != EEXIST)
                child_fail(pl, S_MKDIR);
        } else {
            if ((fd = open(m->dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) < 0)
                child_fail(pl, S_MKDIR);
            close(fd);
        }
        if (mount(m->src, m->dst, NULL, MS_BIND | (m->kind == M_DIR_RO ? MS_REC : 0), NULL) != 0)
            child_fail(pl, S_BIND);
        switch (m->kind) {
        case M_DEV:
            ro = MS_NOSUID | MS_NOEXEC;
            break;
        case M_DIR_RW:
            ro = MS_NOSUID | MS_NODEV | MS_NOEXEC;
            break;
        case M_FILE_RO:
            ro = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC;
            break;
        default: /* /usr: QEMU and its libraries are executed from there */
            ro = MS_RDONLY | MS_NOSUID | MS_NODEV;
            break;
        }
        if (mount(NULL, m->dst, NULL, MS_REMOUNT | MS_BIND | ro, NULL) != 0)
            child_fail(pl, S_REMOUNT);
    }
    /* pivot_root(".", "."): the old root ends up on top of the new one and is
     * detached at once; no put_old directory needed. */
    if (chdir(pl->root) != 0 || syscall(SYS_pivot_root, ".", ".") != 0)
        child_fail(pl, S_PIVOT);
    if (umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
        child_fail(pl, S_UMOUNT);
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) !=
        0)
        child_fail(pl, S_ROOT_RO);
    /* Guest RAM must never land in a core file. */
    if (setrlimit(RLIMIT_CORE, &core) != 0)
        child_fail(pl, S_RLIMIT);
    /* Raw system calls: glibc's wrappers would signal every thread of the
     * process, whose memory this child shares (CLONE_VM). */
    if (syscall(SYS_setgroups, (size_t)pl->ngroups, pl->groups) != 0)
        child_fail(pl, S_SETGROUPS);
    if (syscall(SYS_setresgid, pl->uid, pl->uid, pl->uid) != 0)
        child_fail(pl, S_SETGID);
    if (syscall(SYS_setresuid, pl->uid, pl->uid, pl->uid) != 0)
        child_fail(pl, S_SETUID);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        child_fail(pl, S_NNP);
    /* The memfd out of the way of the tap's number first (dup2 onto 3 would close it). */
    mem = pl->mem_fd > 0 ? fcntl(pl->mem_fd, F_DUPFD, VMM_MEM_FD + 1) : -1;
    if (pl->mem_fd > 0 && mem < 0)
        child_fail(pl, S_DUP);
    /* Every descriptor from 3 on is close-on-exec, but the tap and the memfd at their
     * numbers (dup2 clears the flag; a tap already at its number gets it cleared). */
    syscall(SYS_close_range, 3, ~0u, 0x4 /* CLOSE_RANGE_CLOEXEC */);
    if (dup2(pl->null_fd, 0) < 0 || dup2(pl->out_fd, 1) < 0 || dup2(pl->out_fd, 2) < 0 ||
        (tap >= 0 && tap != VMM_TAP_FD && dup2(tap, VMM_TAP_FD) < 0) ||
        (tap == VMM_TAP_FD && fcntl(tap, F_SETFD, 0) != 0) ||
        (mem >= 0 && dup2(mem, VMM_MEM_FD) < 0))
        child_fail(pl, S_DUP);
    execve(pl->exe, pl->argv, envp);
    child_fail(pl, S_EXEC);
}

#define CHILD_STACK (256u << 10)

static int child_entry(void *arg)
{
    child(arg);
}

/* argv[0] as an absolute path (PATH search like posix_spawnp). */
static int find_exe(const char *name, char *out, size_t cap)
{
    const char *path = getenv("PATH");

    if (strchr(name, '/'))
        return realpath(name, out) ? 0 : -errno;
    if (!path)
        path = "/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char cand[PATH_MAX];
        if (len &&
            (size_t)snprintf(cand, sizeof(cand), "%.*s/%s", (int)len, p, name) < sizeof(cand) &&
            access(cand, X_OK) == 0 && realpath(cand, out) && strlen(out) < cap)
            return 0;
        if (!c)
            break;
        p = c + 1;
    }
    return -ENOENT;
}

int vmm_jail_spawn(struct vmm_jail *j, const struct vmm_jail_vm *jv, const struct vmm_config *cfg,
                   char **argv, int out_fd, pid_t *pid, char *why, size_t cap)
{
    char exe[PATH_MAX];
    struct plan *pl = NULL;
    int pipefd[2] = {-1, -1}, r;
    struct child_err ce;
    sigset_t all, old;
    char *stack = NULL, **wrap = NULL;
    ssize_t n;
    pid_t p;
    int e;

    *pid = -1;
    if ((r = find_exe(argv[0], exe, sizeof(exe))) != 0) {
        snprintf(why, cap, "QEMU binary %s not found", argv[0]);
        return r;
    }
    if (!(pl = malloc(sizeof(*pl))))
        return -ENOMEM;
    r = vmm_jail_plan_build(j->root_dir, cfg, exe, (struct vmm_jail_plan_view *)pl);
    pl->null_fd = -1;
    if (r != 0) {
        snprintf(why, cap, "cannot plan the jail's files: %s", strerror(-r));
        goto out;
    }
    for (int i = 0; i < VMM_CG_V1_N; i++)
        pl->procs_fd[i] = -1;
    pl->nprocs = jv->ncg;
    for (int i = 0; i < jv->ncg; i++) {
        char f[PATH_MAX + 16];
        snprintf(f, sizeof(f), "%s/cgroup.procs", jv->cg[i]);
        if ((pl->procs_fd[i] = open(f, O_WRONLY | O_CLOEXEC)) < 0) {
            r = -errno;
            snprintf(why, cap, "cannot open %s: %s", f, strerror(errno));
            goto out;
        }
    }
    if (cfg->accel == VMM_ACCEL_KVM) {
        /* /dev/kvm is usually root:kvm 0660: the VM uid joins that group only. */
        struct stat st;
        if (stat("/dev/kvm", &st) == 0 && (st.st_mode & 0060) == 0060 && st.st_gid != 0) {
            pl->groups[0] = st.st_gid;
            pl->ngroups = 1;
        }
    }
    pl->uid = jv->uid;
    pl->exe = exe;
    pl->argv = argv;
    pl->out_fd = out_fd;
    pl->netns = cfg->netns;
    if ((pl->null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        r = -errno;
        goto out;
    }
    if (cfg->net_wrap) {
        /* The namespace is made first, by the child, as root: the set-up's
         * final exec ends in /bin/true rather than QEMU. A fork(), not the
         * clone below, since the parent must not wait for it: the child's
         * memory is its own, and it reports failures into out_fd. */
        size_t nw = 0;
        while (cfg->net_wrap[nw])
            nw++;
        if (!cfg->netns || !(wrap = calloc(nw + 2, sizeof(*wrap)))) {
            r = cfg->netns ? -ENOMEM : -EINVAL;
            goto out;
        }
        memcpy(wrap, cfg->net_wrap, nw * sizeof(*wrap));
        wrap[nw] = "/bin/true";
        pl->wrap = wrap;
        pl->err_pipe = -1;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        p = fork();
        e = errno;
        if (p == 0)
            child(pl);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (p < 0) {
            r = -e;
            snprintf(why, cap, "fork: %s", strerror(e));
            goto out;
        }
        *pid = p;
        r = 0;
        goto out;
    }
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        r = -errno;
        goto out;
    }
    pl->err_pipe = pipefd[1];
    /* clone(CLONE_VM | CLONE_VFORK) as posix_spawn does: no copy of warrend's
     * page tables (fork() cost 10-18 ms per launch in warrend under load). The
     * child runs on its own stack with every signal blocked until it has reset
     * the handlers, so none of warrend's handlers can run in it. */
    if (!(stack = malloc(CHILD_STACK))) {
        r = -ENOMEM;
        goto out;
    }
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    p = clone(child_entry, stack + CHILD_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, pl);
    e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (p < 0) {
        r = -e;
        snprintf(why, cap, "clone: %s", strerror(e));
        goto out;
    }
    close(pipefd[1]);
    pipefd[1] = -1;
    /* EOF: exec happened (the pipe is close-on-exec). The child's work before
     * that is a few mounts: bounded, no waiting on anything external. */
    do
        n = read(pipefd[0], &ce, sizeof(ce));
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof(ce)) {
        waitpid(p, NULL, 0); /* it _exit()s right after writing */
        r = -ce.err;
        if (r == 0)
            r = -EIO;
        snprintf(why, cap, "jail: %s: %s",
                 ce.step >= 0 && ce.step < (int)(sizeof(step_names) / sizeof(step_names[0]))
                     ? step_names[ce.step]
                     : "?",
                 strerror(ce.err));
        goto out;
    }
    *pid = p;
    r = 0;
out:
    for (int i = 0; pl && i < pl->nprocs; i++)
        if (pl->procs_fd[i] >= 0)
            close(pl->procs_fd[i]);
    if (pl && pl->null_fd >= 0)
        close(pl->null_fd);
    if (pipefd[0] >= 0)
        close(pipefd[0]);
    if (pipefd[1] >= 0)
        close(pipefd[1]);
    free(stack);
    free(wrap);
    free(pl);
    return r;
}
