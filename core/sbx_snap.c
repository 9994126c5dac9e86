/*
 * sbx_snap.c - snapshots of running sandboxes and sandboxes restored from
 * them (see sbx_snap.h).
 *
 * Taking one, all from the loop, nothing waiting:
 *   vmm_save (stops the VM, writes state.snap; QEMU flushed the disk at the
 *   stop) -> on the bg worker: sparse copy of the overlay, the pool
 *   template's overlay hard-linked and named, fsync -> on the loop: record,
 *   answer, cont, RESYNC (clock). The VM stays stopped until the copy is
 *   done, so the copy is the disk of the saved memory.
 * The VM's QEMU can only go away in between with its sandbox (deleted, dead):
 * then no vmm callback comes (the job waits in the table's list until
 * shutdown, small) or the copy's done finds the sandbox ended and removes
 * what it wrote.
 */
#include "sbx_snap.h"
#include "sbx_int.h"
#include "log.h"
#include "util.h"
#include "pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct sbx_snap {
    struct sbx_snap *next;
    char id[SBX_ID_CAP];
    char parent[SBX_ID_CAP];      /* the sandbox it was taken of */
    char parent_snap[SBX_ID_CAP]; /* the snapshot that sandbox was restored from ("" none) */
    char tmpl[64];
    unsigned mem_mb, vcpus;
    uint64_t size; /* bytes its own files take (state.snap, disk.qcow2) */
    int64_t created_ms;
    char dir[4096];
    struct sbx_ident base; /* identity of the template's base image */
    bool base_ok;          /* false: its record's was unreadable (matches no file) */
    struct rec_kv metadata;
    char type[8]; /* "sandbox" (asked for), or internal: "fork", "pause" (removed once
                   * nothing depends on it: sbx_snap_tick) */
    char disk_backing[4096 + 16]; /* what its disk.qcow2 is backed by, as warrend named it (and
                                   * wrote it there: copy_work); "" from an older warrend */
    /* A delta (VMM_SAVE_DELTA: a fork's or a pause's): the template RAM file
     * its pages go over, which every sandbox restored from it maps; "" when its state
     * file holds all the RAM. A pause's outlives that file in /dev/shm through a copy
     * in state_dir/bases/ (base_keep). */
    char mem[4096];
    /* Jailed: a sealed memfd of that file made once for all its forks (a booted
     * parent's fork: vmm_save_ram), which each jailed QEMU restored from it maps; 0:
     * none, each restore seals its own (reseal_start). */
    int sealed_fd;
    bool has_pol;          /* networking was on: the sandbox's egress policy, which every sandbox */
    struct net_policy pol; /* restored from it keeps unless its create names another */
};

/* What a fork's creates get: the parent's env, the forks' metadata (both objects of
 * strings, owned), TTL (SBX_UNSET: the configured default, SBX_NOT_INT: refused by the
 * create) and idle timeout. */
struct fork_plan {
    struct rec_kv env, meta;
    int64_t ttl_s, idle_s;
    bool keep_running;
};

static void plan_free(struct fork_plan *p)
{
    if (!p)
        return;
    rec_kv_free(&p->env);
    rec_kv_free(&p->meta);
}

/* A snapshot being taken. */
struct snap_job {
    struct snap_job *next;
    struct snap_job *next_copy; /* in t->snaps->copying */
    struct sbx_table *t;
    sbx_op_t op;
    char sb_id[SBX_ID_CAP];
    struct sbx_snap *s;      /* not in t->snaps until recorded */
    char src[4096];          /* the sandbox's overlay */
    char link_src[4096];     /* the pool template's frozen overlay to link ("" none) */
    pid_t qemu;              /* the VM's QEMU, which holds that overlay open */
    bool backing_copied;     /* it was removed: copied from QEMU's fd, not linked */
    char backing[4096 + 16]; /* what the copy is backed by (the VM's, as warrend named it) */
    int err;                 /* of the copy */
    char why[256];
    int64_t t0;
    unsigned fork;         /* a fork of this many: their creates follow the snapshot */
    bool pause;            /* a pause: the VM ends after the snapshot instead of continuing */
    bool own_ram;          /* s->mem is a RAM file made for it (vmm_save_ram): in its size */
    struct fork_plan plan; /* a fork's creates */
};

/* A fork's creates in flight; the fork op answers once all are. */
struct fork_ctx {
    struct sbx_table *t;
    sbx_op_t op;
    char snap[SBX_ID_CAP];
    unsigned want, answered;
    char (*made)[SBX_ID_CAP]; /* the sandboxes' ids, in order of answer */
    unsigned nmade;
    struct sbx_err err; /* the first failure (code 0: none) */
    int64_t t0;
};

struct sbx_snaps {
    struct sbx_snap *list;    /* newest first */
    struct snap_job *jobs;    /* saving (waiting on QEMU) */
    struct snap_job *copying; /* saved, the disk being copied (the bg worker) */
    struct sbx_snap *gone;    /* the last one deleted: its record is still borrowed */
};

static void fork_start(struct snap_job *j, const struct sbx_snap *s, struct op *op);
static void pause_finish(struct sandbox *sb, const struct sbx_snap *s, struct op *op);

static void no_done(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    (void)user;
    (void)err;
    (void)res;
}

/* The sink of an op nobody asked for (a pause at the idle timeout). */
static const struct sbx_sink no_sink = {no_done, NULL, NULL, NULL, NULL};

/* ---- identity of a file a snapshot depends on (pool.c's template uses it too) ---- */

int sbx_ident_get(struct sbx_ident *id, const char *path)
{
    struct stat st;

    if (!realpath(path, id->path) || stat(id->path, &st) != 0)
        return -errno;
    id->size = (long long)st.st_size;
    id->mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec;
    id->ino = (long long)st.st_ino;
    return 0;
}

const char *sbx_ident_differs(const struct sbx_ident *was, const struct sbx_ident *now)
{
    if (strcmp(was->path, now->path) != 0)
        return "another file";
    if (was->size != now->size || was->mtime_ns != now->mtime_ns || was->ino != now->ino)
        return "changed on disk";
    return NULL;
}

/* ---- records ---- */

static void path_in(const struct sbx_snap *s, const char *name, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", s->dir, name);
}

static struct sbx_snap *snap_find(struct sbx_table *t, const char *id)
{
    for (struct sbx_snap *s = t->snaps ? t->snaps->list : NULL; s; s = s->next)
        if (strcmp(s->id, id) == 0)
            return s;
    return NULL;
}

static void snap_free(struct sbx_snap *s)
{
    if (!s)
        return;
    rec_kv_free(&s->metadata);
    if (s->sealed_fd > 0)
        close(s->sealed_fd);
    free(s);
}

/* What GET shows: the tree's links ("parent" the sandbox, "parent_snapshot") and the
 * guest's shape. */
static void snap_rec(const struct sbx_snap *s, struct sbx_snap_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->id = s->id;
    r->parent = s->parent;
    r->parent_snap = s->parent_snap[0] ? s->parent_snap : NULL;
    r->tmpl = s->tmpl;
    r->type = s->type;
    r->mem_mb = s->mem_mb;
    r->vcpus = s->vcpus;
    r->size = s->size;
    r->created_ms = s->created_ms;
    r->metadata = s->metadata.v;
    r->nmetadata = s->metadata.n;
    if (s->has_pol) {
        r->has_network = true;
        sbx_net_rec_of(&s->pol, &r->network);
    }
}

static int snap_save(struct sbx_table *t, const struct sbx_snap *s)
{
    struct rec_snap rec = {.id = s->id,
                           .parent = s->parent,
                           .parent_snapshot = s->parent_snap,
                           .tmpl = s->tmpl,
                           .dir = s->dir,
                           .mem_mb = s->mem_mb,
                           .vcpus = s->vcpus,
                           .size = (int64_t)s->size,
                           .created_ms = s->created_ms,
                           .base = s->base,
                           .base_ok = s->base_ok,
                           .metadata = s->metadata,
                           .type = s->type,
                           .disk_backing = s->disk_backing,
                           .mem = s->mem,
                           .has_network = s->has_pol};
    char *str;
    int r;

    if (s->has_pol)
        sbx_net_rec_of(&s->pol, &rec.network);
    str = rec_snap_encode(&rec);
    r = str ? idx_put(t->idx, IDX_SNAPSHOTS, s->id, str, strlen(str)) : -ENOMEM;
    if (r != 0)
        LOGS(LOG_ERR, s->id, "cannot save the snapshot record: %s", idx_strerror(r));
    else
        t->idx_dirty = true;
    free(str);
    return r;
}

static int load_one(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct sbx_table *t = ud;
    struct rec_snap o;
    struct sbx_snap *s;
    int rc = rec_snap_decode(val, vlen, &o);

    if (rc == -ENOMEM)
        return rc;
    if (rc != 0 || strlen(o.id) >= sizeof(s->id) || strlen(o.parent) >= sizeof(s->parent) ||
        strlen(o.parent_snapshot) >= sizeof(s->parent_snap) || strlen(o.tmpl) >= sizeof(s->tmpl) ||
        strlen(o.dir) >= sizeof(s->dir)) {
        /* Its files, named after the id, go with the sweep. */
        LOG(LOG_WARN, "snapshot record %.*s is unreadable; dropping it", (int)klen, key);
        rec_snap_free(&o);
        return 0;
    }
    if (!(s = calloc(1, sizeof(*s)))) {
        rec_snap_free(&o);
        return -ENOMEM;
    }
    snprintf(s->id, sizeof(s->id), "%s", o.id);
    snprintf(s->parent, sizeof(s->parent), "%s", o.parent);
    snprintf(s->parent_snap, sizeof(s->parent_snap), "%s", o.parent_snapshot);
    snprintf(s->tmpl, sizeof(s->tmpl), "%s", o.tmpl);
    snprintf(s->dir, sizeof(s->dir), "%s", o.dir);
    s->mem_mb = (unsigned)o.mem_mb;
    s->vcpus = (unsigned)o.vcpus;
    s->size = (uint64_t)o.size;
    s->created_ms = o.created_ms;
    s->base = o.base;
    s->base_ok = o.base_ok;
    s->metadata = o.metadata; /* moved */
    o.metadata = (struct rec_kv){0};
    snprintf(s->type, sizeof(s->type), "%s",
             o.type && (!strcmp(o.type, "fork") || !strcmp(o.type, "pause")) ? o.type : "sandbox");
    if (o.disk_backing && strlen(o.disk_backing) < sizeof(s->disk_backing))
        snprintf(s->disk_backing, sizeof(s->disk_backing), "%s", o.disk_backing);
    if (o.mem && strlen(o.mem) < sizeof(s->mem))
        snprintf(s->mem, sizeof(s->mem), "%s", o.mem);
    if (o.net.kind != REC_NET_NONE) {
        struct sbx_err e;
        /* Unreadable: no sandbox may start from it with another policy than it had. */
        if (o.net.kind == REC_NET_BAD)
            sbx_err_set(&e, SBX_E_INVALID_ARGUMENT, "network must be an object");
        if (o.net.kind == REC_NET_BAD || sbx_net_from_req(t, &o.net.req, &s->pol, &e) != 0) {
            LOG(LOG_WARN, "snapshot %s: its network policy is unreadable (%s); dropping it", s->id,
                e.msg);
            snap_free(s);
            rec_snap_free(&o);
            return 0;
        }
        s->has_pol = true;
    }
    /* idx_foreach goes in key order; the list is shown oldest first (sbx_snap_list). */
    s->next = t->snaps->list;
    t->snaps->list = s;
    rec_snap_free(&o);
    return 0;
}

void sbx_state_tag(const char *state_dir, char out[9])
{
    uint32_t h = 2166136261u;

    for (const char *p = state_dir; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    snprintf(out, 9, "%08x", h);
}

static void rm_work(void *arg)
{
    util_rm_dir(arg, NULL);
    free(arg);
}

/* Remove a snapshot's dir on the bg worker (multi-GB files). */
static void rm_later(struct sbx_table *t, const char *dir)
{
    char *d = strdup(dir);

    if (!d || bg_run(t->bg, rm_work, NULL, d) != 0) {
        free(d);
        util_rm_dir(dir, NULL);
    }
}

int sbx_snap_restore_all(struct sbx_table *t)
{
    char dir[4096];
    DIR *d;
    struct dirent *e;
    int r;

    if (!(t->snaps = calloc(1, sizeof(*t->snaps))))
        return -ENOMEM;
    snprintf(dir, sizeof(dir), "%s/snapshots", t->cfg->state_dir);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return -errno;
    if ((r = idx_foreach(t->idx, IDX_SNAPSHOTS, load_one, t)) != 0)
        return r;
    /* A crash between mkdir and the record leaves files nobody names. */
    if (!(d = opendir(dir)))
        return 0;
    while ((e = readdir(d)) != NULL) {
        char path[4096 + 300];
        if (e->d_name[0] == '.' || snap_find(t, e->d_name))
            continue;
        LOG(LOG_INFO, "snapshot files without a record (a crash mid-snapshot): removing %s",
            e->d_name);
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        rm_later(t, path);
    }
    closedir(d);
    return 0;
}

void sbx_snap_free_all(struct sbx_table *t)
{
    if (!t->snaps)
        return;
    while (t->snaps->list) {
        struct sbx_snap *s = t->snaps->list;
        t->snaps->list = s->next;
        snap_free(s);
    }
    /* Saves QEMU never finished (their sandbox ended): nothing recorded them. */
    while (t->snaps->jobs) {
        struct snap_job *j = t->snaps->jobs;
        t->snaps->jobs = j->next;
        util_rm_dir(j->s->dir, NULL);
        snap_free(j->s);
        plan_free(&j->plan);
        free(j);
    }
    snap_free(t->snaps->gone);
    free(t->snaps);
    t->snaps = NULL;
}

/* ---- taking a snapshot ---- */

static void job_unlink(struct snap_job *j)
{
    for (struct snap_job **p = &j->t->snaps->jobs; *p; p = &(*p)->next) {
        if (*p == j) {
            *p = j->next;
            return;
        }
    }
}

static void copy_unlink(struct snap_job *j)
{
    if (!j->t->snaps) /* shutting down: the bg worker's last callbacks */
        return;
    for (struct snap_job **p = &j->t->snaps->copying; *p; p = &(*p)->next_copy) {
        if (*p == j) {
            *p = j->next_copy;
            return;
        }
    }
}

/* End a job: its files removed unless the snapshot was recorded (s NULL then). */
static void job_free(struct snap_job *j)
{
    plan_free(&j->plan);
    if (j->s) {
        rm_later(j->t, j->s->dir);
        snap_free(j->s);
    }
    free(j);
}

static struct op *find_op(struct sbx_table *t, sbx_op_t id)
{
    return id ? ops_by_id(t, id) : NULL;
}

/* Copy src to dst keeping holes (a qcow2 overlay is mostly holes past its metadata);
 * zero_holes: pages of zeros too (a RAM file). */
static int sparse_copy(const char *src, const char *dst, bool sync, bool zero_holes)
{
    int in = open(src, O_RDONLY | O_CLOEXEC), out = -1, r = 0;
    off_t end;
    struct stat st;

    if (in < 0)
        return -errno;
    /* 0644: a jailed QEMU restored over it opens it read-only as its own uid
     * (the jail shows it this file alone; the state dir is 0700 on the host). */
    if (fstat(in, &st) != 0 ||
        (out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0 ||
        fchmod(out, 0644) != 0) {
        r = -errno;
        goto out;
    }
    end = st.st_size;
    if ((r = zero_holes ? vmm_copy_nonzero(in, out, end) : vmm_copy_sparse(in, out, end)) != 0)
        goto out;
    if (ftruncate(out, end) != 0 || (sync && fsync(out) != 0))
        r = -errno;
out:
    close(in);
    if (out >= 0 && close(out) != 0 && r == 0)
        r = -errno;
    return r;
}

static uint64_t file_bytes(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

/* ---- durable copies of template RAM files ----
 *
 * A pause delta holds only the pages its sandbox owns over a template's RAM file,
 * which lives in /dev/shm: a rebuild of the template or a host reboot removes it, and
 * a paused sandbox is kept for days. So its first pause copies that file (sparse,
 * synced) into state_dir/bases/ under the same name, which a delta's header records;
 * the file never changes (vmm.h, Boot modes). A restore maps the /dev/shm file while it
 * is there (the pool's spare QEMUs map it too), else the copy. A copy goes with the
 * last pause snapshot that names its file (sbx_snap_bases_sweep); a fork's delta, whose forks
 * do not outlive the host, uses one while it is there but does not keep it. */

static void base_path(struct sbx_table *t, const char *mem, char *out, size_t cap)
{
    const char *slash = strrchr(mem, '/');

    snprintf(out, cap, "%s/bases/%s", t->cfg->state_dir, slash ? slash + 1 : mem);
}

bool sbx_in_bases(const struct sbx_table *t, const char *path)
{
    size_t n = strlen(t->cfg->state_dir);

    return !strncmp(path, t->cfg->state_dir, n) && !strncmp(path + n, "/bases/", 7) &&
           !strchr(path + n + 7, '/');
}

/* The RAM file a delta s restores over: its own, else its durable copy. 0 or -ENOENT. */
static int snap_mem(struct sbx_table *t, const struct sbx_snap *s, char *out, size_t cap)
{
    if (access(s->mem, F_OK) == 0) {
        snprintf(out, cap, "%s", s->mem);
        return 0;
    }
    base_path(t, s->mem, out, cap);
    return access(out, F_OK) == 0 ? 0 : -ENOENT;
}

/* A snapshot in the making names the file name in state_dir/bases (or name is its
 * temporary file): its RAM file (vmm_save_ram) or a pause's copy (base_keep). */
static bool job_names(const struct snap_job *j, const char *name)
{
    const char *mem = j->s && j->s->mem[0] ? j->s->mem : NULL, *slash;
    size_t n;

    if (!mem)
        return false;
    slash = strrchr(mem, '/');
    mem = slash ? slash + 1 : mem;
    n = strlen(mem);
    return !strncmp(name, mem, n) && (!name[n] || !strcmp(name + n, ".tmp"));
}

/* Remove the files in state_dir/bases that no snapshot (recorded or in the making)
 * names and no QEMU maps (a booted sandbox's RAM file after its resume:
 * vmm_save_ram). */
void sbx_snap_bases_sweep(struct sbx_table *t)
{
    char dir[4096], want[4096 + 300];
    struct dirent *e;
    DIR *d;

    if (!t->snaps)
        return;
    snprintf(dir, sizeof(dir), "%s/bases", t->cfg->state_dir);
    if (!(d = opendir(dir)))
        return;
    while ((e = readdir(d)) != NULL) {
        bool named = false;
        if (e->d_name[0] == '.')
            continue;
        for (struct sbx_snap *s = t->snaps->list; s && !named; s = s->next) {
            /* A pause snapshot's copy; a fork's own RAM file (a booted parent's). */
            if (s->mem[0] && (!strcmp(s->type, "pause") || sbx_in_bases(t, s->mem))) {
                base_path(t, s->mem, want, sizeof(want));
                named = strcmp(want + strlen(dir) + 1, e->d_name) == 0;
            }
        }
        for (struct snap_job *j = t->snaps->jobs; j && !named; j = j->next)
            named = job_names(j, e->d_name);
        for (struct snap_job *j = t->snaps->copying; j && !named; j = j->next_copy)
            named = job_names(j, e->d_name);
        snprintf(want, sizeof(want), "%s/%s", dir, e->d_name);
        for (struct sbx_vm *vm = t->vms; vm && !named; vm = vm->next)
            named = vm->pid > 0 && !strcmp(vm->mem, want);
        if (!named) {
            LOG(LOG_INFO, "removing %s/%s: no snapshot names it and no QEMU maps it now", dir,
                e->d_name);
            unlinkat(dirfd(d), e->d_name, 0);
        }
    }
    closedir(d);
}

/* The /proc path of an fd of pid open on path, a file since removed: true and out. */
static bool held_open(pid_t pid, const char *path, char *out, size_t cap)
{
    char dir[64], fd[64 + 256 + 2], target[4096 + 16];
    struct dirent *e;
    bool found = false;
    DIR *d;

    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    if (pid <= 0 || !(d = opendir(dir)))
        return false;
    while (!found && (e = readdir(d))) {
        ssize_t n;
        snprintf(fd, sizeof(fd), "%s/%s", dir, e->d_name);
        if ((n = readlink(fd, target, sizeof(target) - 1)) <= 0)
            continue;
        target[n] = 0;
        if (strncmp(target, path, strlen(path)) == 0 &&
            !strcmp(target + strlen(path), " (deleted)")) {
            found = (size_t)snprintf(out, cap, "%s", fd) < cap;
        }
    }
    closedir(d);
    return found;
}

/* On the bg worker: the durable copy of a pause delta's RAM file, made once (see
 * base_path). The file may be gone by name already (a rebuild): QEMU maps it and
 * holds it open. 0 or -errno, with j->why. */
static int base_keep(struct snap_job *j)
{
    char path[4096 + 300], tmp[4096 + 310], held[64 + 256 + 2], dir[4096 + 16];
    const char *src = j->s->mem;
    int fd, r;

    base_path(j->t, j->s->mem, path, sizeof(path));
    if (access(path, F_OK) == 0)
        return 0;
    snprintf(dir, sizeof(dir), "%s/bases", j->t->cfg->state_dir);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        r = -errno;
        snprintf(j->why, sizeof(j->why), "cannot make state_dir/bases: %s", strerror(errno));
        return r;
    }
    if (access(src, F_OK) != 0 && held_open(j->qemu, src, held, sizeof(held)))
        src = held;
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    unlink(tmp); /* a crash's */
    if ((r = sparse_copy(src, tmp, true, true)) != 0 || (rename(tmp, path) != 0 && (r = -errno))) {
        unlink(tmp);
        snprintf(j->why, sizeof(j->why), "cannot keep a copy of its template's RAM file: %s",
                 strerror(-r));
        return r;
    }
    if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        fsync(fd);
        close(fd);
    }
    return 0;
}

/* On the bg worker: the disk copy, and the template's overlay linked and named. */
static void copy_work(void *arg)
{
    struct snap_job *j = arg;
    char disk[4096 + 16], link_dst[4096 + 16], state[4096 + 16];
    int fd, r;

    path_in(j->s, "disk.qcow2", disk, sizeof(disk));
    path_in(j->s, "backing.qcow2", link_dst, sizeof(link_dst));
    path_in(j->s, "state.snap", state, sizeof(state));
    if (j->pause && j->s->mem[0] && (r = base_keep(j)) != 0)
        goto out;
    /* A jailed QEMU never sees state_dir: the forks of a booted parent map one sealed
     * copy of its RAM file between them. */
    if (j->fork && j->own_ram && j->t->jail) {
        if ((r = vmm_mem_seal(j->s->mem)) < 0) {
            snprintf(j->why, sizeof(j->why), "cannot seal its RAM file for the jail: %s",
                     strerror(-r));
            goto out;
        }
        j->s->sealed_fd = r;
        r = 0;
    }
    /* A fork's snapshot lives as long as its forks, which do not outlive the host: it
     * is not synced to disk (its state file's checksum catches one torn by a crash). */
    if ((r = sparse_copy(j->src, disk, !j->fork, false)) != 0) {
        snprintf(j->why, sizeof(j->why), "cannot copy its disk: %s", strerror(-r));
        goto out;
    }
    if (j->link_src[0]) {
        /* Same file system (both under state_dir): a link, not a copy of the template.
         * A rebuilt template's overlay is gone by name (the pool removed it), not for
         * the QEMUs that still read it: copied from the VM's QEMU's own fd then. */
        if (link(j->link_src, link_dst) != 0) {
            int e = errno;
            char held[64 + 256 + 2];
            if (e != ENOENT || !held_open(j->qemu, j->link_src, held, sizeof(held))) {
                r = -e;
                snprintf(j->why, sizeof(j->why), "cannot link the template's disk: %s",
                         strerror(e));
                goto out;
            }
            if ((r = sparse_copy(held, link_dst, !j->fork, false)) != 0) {
                snprintf(j->why, sizeof(j->why),
                         "cannot copy the rebuilt template's old disk from QEMU: %s", strerror(-r));
                goto out;
            }
            j->backing_copied = true;
        }
        snprintf(j->backing, sizeof(j->backing), "%s", link_dst);
    }
    /* The copy's header came from QEMU, which the guest may have taken over: its
     * backing name is written again with the one warrend knows, so a restore (and a
     * jail, which shows the files the chain names: vmm_jail.c) follows only names
     * warrend chose. */
    if (j->backing[0] && (r = vmm_qcow2_rebase(disk, j->backing)) != 0) {
        snprintf(j->why, sizeof(j->why), "cannot name its disk's backing file: %s", strerror(-r));
        goto out;
    }
    snprintf(j->s->disk_backing, sizeof(j->s->disk_backing), "%s", j->backing);
    if (!j->fork && (fd = open(j->s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        fsync(fd);
        close(fd);
    }
    j->s->size = file_bytes(state) + file_bytes(disk) + (j->own_ram ? file_bytes(j->s->mem) : 0);
out:
    j->err = r;
}

static void on_cont_after(void *ud, int err, const char *why)
{
    struct sandbox *sb = ud;
    char reason[256];

    if (err == 0 || sbx_state_final(sb->state))
        return;
    snprintf(reason, sizeof(reason), "snapshot_failed: cannot continue its VM: %s", why);
    sbx_die(sb, reason);
}

/* The VM runs again (it was stopped for the save and the copy); its clock has stood
 * still meanwhile. 0 or -errno (the sandbox then died). */
static void sandbox_continue(struct sandbox *sb)
{
    int r;

    if (!sb->vm || sb->vm_gone)
        return;
    if ((r = vmm_cont(sb->vm, on_cont_after, sb)) != 0) {
        char reason[128];
        snprintf(reason, sizeof(reason), "snapshot_failed: cannot continue its VM: %s",
                 strerror(-r));
        sbx_die(sb, reason);
        return;
    }
    sbx_resync(sb, 0, NULL, NULL); /* queued behind the cont: the guest runs it first */
}

static void copy_done(void *arg)
{
    struct snap_job *j = arg;
    struct sbx_table *t = j->t;
    struct sandbox *sb = sbx_find(t, j->sb_id);
    struct op *op = find_op(t, j->op);
    struct sbx_snap *s = j->s;

    copy_unlink(j);
    if (!sb || sbx_state_final(sb->state)) {
        /* Ended meanwhile: its op was failed with it. */
        job_free(j);
        return;
    }
    if (j->err != 0) {
        LOGS(LOG_ERR, sb->id, "snapshot %s failed: %s", s->id, j->why);
        if (op)
            ops_fail(op, SBX_E_INTERNAL, "snapshot of %s failed: %s", sb->id, j->why);
        sandbox_continue(sb);
        job_free(j);
        return;
    }
    s->created_ms = sbx_wall_ms();
    if (snap_save(t, s) != 0) {
        if (op)
            ops_fail(op, SBX_E_INDEX_WRITE_FAILED, "cannot record the snapshot in the index");
        sandbox_continue(sb);
        job_free(j);
        return;
    }
    s->next = t->snaps->list;
    t->snaps->list = s;
    j->s = NULL;
    if (j->backing_copied)
        LOGS(LOG_INFO, sb->id,
             "snapshot %s: the template's overlay %s was removed by a rebuild: "
             "copied from the VM's QEMU",
             s->id, j->link_src);
    LOGS(LOG_INFO, sb->id, "snapshot %s taken in %.0f ms (%.1f MiB), %s", s->id,
         (double)(sbx_now_ms() - j->t0), (double)s->size / 1048576.0,
         j->pause ? "pausing" : "continuing");
    if (j->pause) {
        pause_finish(sb, s, op);
        job_free(j);
        return;
    }
    sandbox_continue(sb);
    if (j->fork)
        fork_start(j, s, op);
    else if (op) {
        struct sbx_snap_rec rec;
        struct sbx_result res = {.kind = SBX_RES_SNAPSHOT, .u.snap = &rec};
        snap_rec(s, &rec);
        ops_finish(op, NULL, &res);
    }
    job_free(j);
}

static void on_saved(void *ud, int err, const char *why)
{
    struct snap_job *j = ud;
    struct sandbox *sb = sbx_find(j->t, j->sb_id);
    struct op *op = find_op(j->t, j->op);

    job_unlink(j);
    if (!sb || sbx_state_final(sb->state)) {
        job_free(j);
        return;
    }
    if (err != 0) {
        LOGS(LOG_ERR, sb->id, "snapshot %s: the save failed: %s", j->s->id, why);
        if (op)
            ops_fail(op, SBX_E_INTERNAL, "snapshot of %s failed: %s", sb->id, why);
        sandbox_continue(sb);
        job_free(j);
        return;
    }
    LOGS(LOG_DEBUG, sb->id, "snapshot %s: state saved in %.0f ms", j->s->id,
         (double)(sbx_now_ms() - j->t0));
    /* The VM stays stopped until its disk is copied. */
    j->next_copy = j->t->snaps->copying;
    j->t->snaps->copying = j;
    if (bg_run(j->t->bg, copy_work, copy_done, j) != 0) {
        copy_unlink(j);
        if (op)
            ops_fail(op, SBX_E_INTERNAL, "out of memory");
        sandbox_continue(sb);
        job_free(j);
    }
}

/* The pool template's frozen overlay, if the sandbox's overlay is backed by one:
 * under state_dir/templates/. */
static bool backed_by_template(struct sbx_table *t, const char *backing)
{
    char dir[4096];
    size_t n = (size_t)snprintf(dir, sizeof(dir), "%s/templates/", t->cfg->state_dir);
    char real[PATH_MAX];

    if (strncmp(backing, dir, n) == 0)
        return true;
    /* The state dir may have been given through a symlink or a relative path. */
    return realpath(dir, real) && strncmp(backing, real, strlen(real)) == 0 &&
           backing[strlen(real)] == '/';
}

/* Start a snapshot of sandbox id. fork > 0: that many creates (as plan says) follow
 * it; pause: the VM ends after it instead of continuing. Takes what meta (NULL:
 * none) and plan hold (plan may be NULL when fork is 0). As sbx_snap_take. */
static int snap_begin(struct sbx_table *t, const char *id, struct rec_kv *meta, unsigned fork,
                      struct fork_plan *plan, bool pause, const struct sbx_sink *sink, void *user,
                      sbx_op_t *opid, struct sbx_err *err)
{
    struct sandbox *sb;
    struct snap_job *j;
    struct sbx_snap *s;
    struct sbx_ident base;
    char backing[1024], path[4096 + 80]; /* a qcow2 backing name: at most 1023 bytes */
    struct op *op;
    int status, r;

    if ((status = sbx_usable(t, id, &sb, err))) {
        if (meta)
            rec_kv_free(meta);
        plan_free(plan);
        return status;
    }
    if ((status = ops_quota(sb, err))) {
        if (meta)
            rec_kv_free(meta);
        plan_free(plan);
        return status;
    }
    if (!sb->vmr || !sb->vm || sb->vm_gone) {
        if (meta)
            rec_kv_free(meta);
        plan_free(plan);
        return sbx_err_set(err, SBX_E_NOT_READY, "sandbox %s has no running VM", sb->id);
    }
    snprintf(path, sizeof(path), "%s/%s.ext4", t->image_dir, sb->tmpl);
    /* The VM's backing as warrend made it; a VM of an older warrend: its header's. */
    if (sb->vmr->backing[0] && strlen(sb->vmr->backing) < sizeof(backing))
        memcpy(backing, sb->vmr->backing, strlen(sb->vmr->backing) + 1);
    else if (vmm_qcow2_backing(sb->vmr->disk, backing, sizeof(backing)) != 0)
        backing[0] = 0;
    if ((r = sbx_ident_get(&base, path)) != 0 || (!backing[0] && (r = -EINVAL))) {
        if (meta)
            rec_kv_free(meta);
        plan_free(plan);
        return sbx_err_set(err, SBX_E_INTERNAL, "sandbox %s: cannot read its disk's chain: %s",
                           sb->id, strerror(-r));
    }
    if (!(s = calloc(1, sizeof(*s))) || !(j = calloc(1, sizeof(*j)))) {
        free(s);
        if (meta)
            rec_kv_free(meta);
        plan_free(plan);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    sbx_new_id(t, "snap", s->id);
    snprintf(s->parent, sizeof(s->parent), "%s", sb->id);
    snprintf(s->parent_snap, sizeof(s->parent_snap), "%s", sb->snap_id);
    snprintf(s->tmpl, sizeof(s->tmpl), "%s", sb->tmpl);
    s->mem_mb = sb->mem_mb;
    s->vcpus = sb->vcpus;
    s->base = base;
    s->base_ok = true;
    if (meta) {
        s->metadata = *meta; /* moved */
        *meta = (struct rec_kv){0};
    }
    if (t->net) {
        s->has_pol = true;
        s->pol = sb->vmr->pol;
    }
    snprintf(s->dir, sizeof(s->dir), "%s/snapshots/%s", t->cfg->state_dir, s->id);
    j->t = t;
    j->s = s;
    j->fork = fork;
    if (plan)
        j->plan = *plan;
    j->pause = pause;
    snprintf(s->type, sizeof(s->type), "%s", pause ? "pause" : fork ? "fork" : "sandbox");
    j->t0 = sbx_now_ms();
    snprintf(j->sb_id, sizeof(j->sb_id), "%s", sb->id);
    snprintf(j->src, sizeof(j->src), "%s", sb->vmr->disk);
    snprintf(j->backing, sizeof(j->backing), "%s", backing);
    if (backed_by_template(t, backing))
        snprintf(j->link_src, sizeof(j->link_src), "%s", backing);
    j->qemu = sb->vmr->pid;
    if (mkdir(s->dir, 0700) != 0) {
        r = -errno;
        goto fail;
    }
    path_in(s, "state.snap", path, sizeof(path));
    /* A fork or a pause of a clone of the pool's template: its state is the pages the
     * sandbox owns over the template's RAM, which its forks map too (vmm.h
     * VMM_SAVE_DELTA); a pause's keeps a copy of that file (base_keep). Anything else
     * (a booted VM, one adopted without its RAM file found: vmm_adopt) saves all its
     * RAM. */
    r = -ENOTSUP;
    if ((fork || pause) && sb->vmr->mem[0]) {
        snprintf(s->mem, sizeof(s->mem), "%s", sb->vmr->mem);
        /* A delta restores over the file (or a pause's copy of it), which a rebuilt
         * template removed: all the RAM then, unless (a pause) QEMU holds the file
         * open to copy it from (base_keep; a jailed QEMU holds a memfd instead). */
        char mem[4096 + 300], held[64 + 256 + 2];
        if (snap_mem(t, s, mem, sizeof(mem)) != 0 &&
            (fork || !held_open(sb->vmr->pid, s->mem, held, sizeof(held))))
            s->mem[0] = 0;
    }
    if (s->mem[0]) {
        if ((r = vmm_save(sb->vm, path, VMM_SAVE_DELTA | (fork ? VMM_SAVE_NOSYNC : 0), on_saved,
                          j)) != 0)
            s->mem[0] = 0;
    }
    /* A booted VM's pause or fork: its RAM into a file of its own in state_dir/bases/,
     * which the resume or the forks map instead of loading (vmm_save_ram); their
     * pauses and forks are deltas over that file. */
    if (r == -ENOTSUP && (pause || fork) && !sb->vmr->mem[0]) {
        char ram[sizeof(s->mem)];
        base_path(t, "", ram, sizeof(ram));
        if (mkdir(ram, 0700) == 0 || errno == EEXIST) {
            snprintf(ram + strlen(ram), sizeof(ram) - strlen(ram), "%s-%s.ram", sb->vmr->id, s->id);
            if ((r = vmm_save_ram(sb->vm, path, ram, fork ? VMM_SAVE_NOSYNC : 0, on_saved, j)) ==
                0) {
                snprintf(s->mem, sizeof(s->mem), "%s", ram);
                j->own_ram = true;
            }
        }
    }
    if (r == -ENOTSUP && (r = vmm_save(sb->vm, path, fork ? VMM_SAVE_NOSYNC : 0, on_saved, j)) != 0)
        goto fail;
    if (r != 0)
        goto fail;
    if (!(op = ops_new(sb, OP_SNAP, sink ? sink : &no_sink, user))) {
        /* The save goes on; its end finds no op and continues the VM. */
        j->next = t->snaps->jobs;
        t->snaps->jobs = j;
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    op->cancelled = !sink; /* nobody to answer: silent */
    j->op = op->id;
    j->next = t->snaps->jobs;
    t->snaps->jobs = j;
    LOGS(LOG_INFO, sb->id, "snapshot %s: saving", s->id);
    *opid = op->id;
    return 0;
fail:
    rmdir(s->dir);
    snap_free(s);
    plan_free(&j->plan);
    free(j);
    if (r == -EBUSY)
        return sbx_err_set(err, SBX_E_CONFLICT,
                           "sandbox %s: its VM is busy with another save or restore; retry", id);
    return sbx_err_set(err, SBX_E_INTERNAL, "sandbox %s: cannot start the snapshot: %s", id,
                       strerror(-r));
}

int sbx_snap_take(struct sbx_table *t, const char *id, const struct sbx_snap_req *req,
                  const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct rec_kv meta = {0};
    int status;

    if ((status = sbx_kv_map(req->metadata, req->nmetadata, "metadata", &meta, err)))
        return status;
    return snap_begin(t, id, &meta, 0, NULL, false, sink, user, opid, err);
}

/* ---- fork: one snapshot, then count creates from it ---- */

static void fork_free(struct fork_ctx *f)
{
    free(f->made);
    free(f);
}

static void fork_answered(void *user, const struct sbx_err *err, const struct sbx_result *res)
{
    struct fork_ctx *f = user;
    struct op *op;

    if (err && !f->err.code)
        f->err = *err;
    if (res && res->kind == SBX_RES_SANDBOX && f->nmade < f->want)
        snprintf(f->made[f->nmade++], SBX_ID_CAP, "%s", res->u.sandbox->id);
    if (++f->answered < f->want)
        return;
    op = find_op(f->t, f->op);
    if (f->err.code) {
        /* All or nothing: the forks that were made go again. */
        for (unsigned i = 0; i < f->nmade; i++) {
            struct sbx_rec gone;
            sbx_delete(f->t, f->made[i], &gone, NULL);
        }
        if (op)
            ops_finish(op, &f->err, NULL);
    } else {
        LOG(LOG_INFO, "fork: %u sandbox(es) from snapshot %s in %.0f ms", f->want, f->snap,
            (double)(sbx_now_ms() - f->t0));
        if (op) {
            struct sbx_rec *recs = calloc(f->nmade ? f->nmade : 1, sizeof(*recs));
            struct sbx_result ans = {.kind = SBX_RES_FORK};
            struct sandbox *made;
            size_t n = 0;
            if (!recs) {
                ops_fail(op, SBX_E_INTERNAL, "out of memory");
                fork_free(f);
                return;
            }
            for (unsigned i = 0; i < f->nmade; i++)
                if ((made = sbx_find(f->t, f->made[i])))
                    sbx_rec_of(made, &recs[n++]);
            ans.u.fork.v = recs;
            ans.u.fork.n = n;
            ans.u.fork.snapshot_id = f->snap;
            ops_finish(op, NULL, &ans);
            free(recs);
        }
    }
    fork_free(f);
}

/* The parent's env and the forks' metadata (objects of strings) as one array: env's
 * entries, then metadata's. NULL: out of memory. */
static struct sbx_kv *fork_kv(const struct rec_kv *env, const struct rec_kv *meta)
{
    struct sbx_kv *kv = calloc(env->n + meta->n + 1, sizeof(*kv));

    if (kv) { /* an empty list's v is NULL, which memcpy may not be given */
        if (env->n)
            memcpy(kv, env->v, env->n * sizeof(*kv));
        if (meta->n)
            memcpy(kv + env->n, meta->v, meta->n * sizeof(*kv));
    }
    return kv;
}

/* The fork's snapshot s is recorded: its creates (answered from the loop, never from
 * inside sbx_create). */
static void fork_start(struct snap_job *j, const struct sbx_snap *s, struct op *op)
{
    static const struct sbx_sink sink = {fork_answered, NULL, NULL, NULL, NULL};
    struct fork_ctx *f = calloc(1, sizeof(*f));
    const struct fork_plan *plan = &j->plan;
    struct sbx_create_req cr = {0};
    struct sbx_kv *kv;
    unsigned n = j->fork;

    if (!f || !(f->made = calloc(n, sizeof(*f->made)))) {
        free(f);
        if (op)
            ops_fail(op, SBX_E_INTERNAL, "out of memory");
        return;
    }
    f->t = j->t;
    f->op = op ? op->id : 0;
    f->want = n;
    f->t0 = j->t0;
    snprintf(f->snap, sizeof(f->snap), "%s", s->id);
    if (!(kv = fork_kv(&plan->env, &plan->meta))) {
        for (unsigned i = 0; i < n; i++) {
            struct sbx_err e;
            sbx_err_set(&e, SBX_E_INTERNAL, "out of memory");
            fork_answered(f, &e, NULL); /* f may be gone after the last one */
        }
        return;
    }
    cr.snapshot_id = s->id;
    cr.ttl_s = plan->ttl_s;
    cr.idle_s = plan->idle_s;
    cr.memory_mb = cr.vcpus = SBX_UNSET;
    cr.keep_running = plan->keep_running;
    cr.env = kv;
    cr.nenv = plan->env.n;
    cr.metadata = kv + cr.nenv;
    cr.nmetadata = plan->meta.n;
    for (unsigned i = 0; i < n; i++) {
        struct sbx_err e = {0};
        sbx_op_t cop;
        if (sbx_create(j->t, &cr, &sink, f, &cop, &e) != 0)
            fork_answered(f, &e, NULL); /* f may be gone after the last one */
    }
    free(kv);
}

int sbx_snap_fork(struct sbx_table *t, const char *id, const struct sbx_fork_req *req,
                  const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct fork_plan plan = {0};
    struct sandbox *sb;
    unsigned count = 1, live = 0;
    int status;

    if (req->count != SBX_UNSET && (req->count < 1 || req->count > t->cfg->fork_max))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "count must be an integer from 1 to %u",
                           t->cfg->fork_max);
    if (req->count != SBX_UNSET)
        count = (unsigned)req->count;
    if (req->metadata_given &&
        (status = sbx_kv_map(req->metadata, req->nmetadata, "metadata", &plan.meta, err)))
        return status;
    if ((status = sbx_usable(t, id, &sb, err))) {
        plan_free(&plan);
        return status;
    }
    live = sbx_count_live(t);
    if (live + count > t->cfg->max_sandboxes) {
        plan_free(&plan);
        return sbx_err_set(err, SBX_E_TOO_MANY_SANDBOXES,
                           "%u forks would pass the limit of %u live sandboxes (%u live)", count,
                           t->cfg->max_sandboxes, live);
    }
    /* The forks are the parent's kind of sandbox: its env, metadata (unless given),
     * idle timeout and keep_running; a TTL of the parent's time left unless given. */
    if (rec_kv_set(&plan.env, sb->env.v, sb->env.n) != 0 ||
        (!req->metadata_given && rec_kv_set(&plan.meta, sb->metadata.v, sb->metadata.n) != 0)) {
        plan_free(&plan);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    if (!req->idle_given)
        plan.idle_s = sb->idle_s;
    else
        plan.idle_s = req->idle_s == SBX_NOT_INT ? 0 : req->idle_s;
    plan.keep_running = sb->keep_running;
    if (req->ttl_given) {
        plan.ttl_s = req->ttl_s;
    } else {
        int64_t left = (sb->expires_mono - sbx_now_ms()) / 1000;
        plan.ttl_s = left > 1 ? left : 1;
    }
    return snap_begin(t, id, NULL, count, &plan, false, sink, user, opid, err);
}

/* ---- create from a snapshot ---- */

static int snap_not_found(const char *id, struct sbx_err *err)
{
    return sbx_err_set(err, SBX_E_SNAPSHOT_NOT_FOUND, "no snapshot with id '%s'", id);
}

int sbx_snap_for_create(struct sbx_table *t, const struct sbx_create_req *req, const char **tmpl,
                        unsigned *mem, unsigned *vcpus, struct sbx_err *err)
{
    const char *id = req->snapshot_id;
    struct sbx_snap *s = snap_find(t, id);
    struct sbx_ident now;
    char path[4096 + 80];
    const char *why;

    if (!s)
        return snap_not_found(id, err);
    if (req->tmpl_given)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "give template or snapshot_id, not both (a snapshot has its template)");
    if ((req->memory_mb != SBX_UNSET && req->memory_mb != s->mem_mb) ||
        (req->vcpus != SBX_UNSET && req->vcpus != s->vcpus))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "snapshot %s is of a %u MiB, %u vCPU guest: memory_mb and vcpus "
                           "cannot differ",
                           s->id, s->mem_mb, s->vcpus);
    snprintf(path, sizeof(path), "%s/%s.ext4", t->image_dir, s->tmpl);
    if (sbx_ident_get(&now, path) != 0)
        return sbx_err_set(err, SBX_E_SNAPSHOT_INVALID,
                           "snapshot %s cannot be used: template %s's base image is gone", s->id,
                           s->tmpl);
    if ((why = !s->base_ok ? "unreadable" : sbx_ident_differs(&s->base, &now)))
        return sbx_err_set(err, SBX_E_SNAPSHOT_INVALID,
                           "snapshot %s cannot be used: template %s's base image changed since "
                           "it was taken (%s); delete the snapshot",
                           s->id, s->tmpl, why);
    *tmpl = s->tmpl;
    *mem = s->mem_mb;
    *vcpus = s->vcpus;
    return 0;
}

static void fail_create(struct sandbox *sb, enum sbx_errcode code, const char *fmt, const char *a,
                        const char *b)
{
    for (struct op *op = sb->ops, *next; op; op = next) {
        next = op->next_sb;
        if (op->kind == OP_CREATE || op->kind == OP_RESUME)
            ops_fail(op, code, fmt, a, b);
    }
}

static void paused_now(struct sandbox *sb, struct op *op);

/* A resume of sb failed before its guest came back (the restore refused, QEMU not
 * started, or, guest_ran, a guest continued that never answered or whose QEMU ended):
 * its pause snapshot is intact, so it is PAUSED again rather than dead, the resume's
 * ops failed with code and message (the caller's), the VM gone. A disk the VM took from
 * the snapshot goes back first, unless the guest ran: it may have written to it what
 * the paused memory does not know, so only a resume whose disk was copied (into a
 * spare QEMU: the snapshot's own is still there) can be undone then. true if so;
 * false: not a resume, or it cannot be undone (the caller ends it dead). */
static bool resume_undo(struct sandbox *sb, enum sbx_errcode code, const char *msg, bool guest_ran)
{
    struct sbx_snap *s = snap_find(sb->t, sb->snap_id);
    char disk[4096 + 16];

    if (sb->state != ST_STARTING || !sb->vmr || strcmp(sb->vmr->boot, "resume") != 0 || !s ||
        strcmp(s->type, "pause") != 0)
        return false;
    path_in(s, "disk.qcow2", disk, sizeof(disk));
    if (guest_ran && access(disk, F_OK) != 0)
        return false;
    if (access(disk, F_OK) != 0 && rename(sb->vmr->disk, disk) != 0) {
        LOGS(LOG_ERR, sb->id, "cannot give its disk back to snapshot %s: %s", s->id,
             strerror(errno));
        return false;
    }
    if (sbx_state_set(sb, ST_PAUSED) != 0)
        return false;
    fail_create(sb, code, "%s%s", msg, "");
    paused_now(sb, NULL);
    LOGS(LOG_WARN, sb->id, "the resume failed (%s): paused again (snapshot %s)", msg, s->id);
    return true;
}

bool sbx_snap_resume_failed(struct sandbox *sb, const char *why)
{
    return resume_undo(sb, SBX_E_VM_START_FAILED, why, true);
}

static void on_restored(void *ud, int err, const char *why)
{
    struct sandbox *sb = ud;
    /* A snapshot's id, or the template's name for a clone of the pool's template. */
    const char *src = sb->snap_id[0] ? sb->snap_id : sb->tmpl;
    char reason[300];
    int r;

    if (sbx_state_final(sb->state))
        return;
    if (err != 0) {
        snprintf(reason, sizeof(reason), "snapshot %s cannot be restored: %s", src, why);
        if (resume_undo(sb, err == -EINVAL ? SBX_E_SNAPSHOT_INVALID : SBX_E_VM_START_FAILED, reason,
                        false))
            return;
        /* -EINVAL: the file itself was refused (corrupt, truncated, another QEMU). */
        fail_create(sb, err == -EINVAL ? SBX_E_SNAPSHOT_INVALID : SBX_E_VM_START_FAILED,
                    "snapshot %s cannot be restored: %s", src, why);
        snprintf(reason, sizeof(reason), "%s: snapshot %s: %s",
                 err == -EINVAL ? "snapshot_invalid" : "vm_start_failed", src, why);
        sbx_die(sb, reason);
        return;
    }
    LOGS(LOG_DEBUG, sb->id, "restored (%.1f ms after create): continuing it",
         (double)(sbx_now_ms() - sb->created_mono));
    /* Restored stopped, as it was saved: run it and open a session (sbx_on_channel's
     * INIT; sandbox_ready answers the create and sends a new boot id). */
    if ((r = vmm_cont(sb->vm, on_cont_after, sb)) != 0 ||
        (r = vmm_channel_reconnect(sb->vm)) != 0) {
        fail_create(sb, SBX_E_VM_START_FAILED, "snapshot %s: cannot run the VM: %s", src,
                    strerror(-r));
        sbx_die(sb, "vm_start_failed: cannot run the restored VM");
    }
}

/* A VM for sb (STARTING) restored from state over a new overlay backed by backing
 * (mem_path: the RAM file a template's state was saved over; NULL: the RAM is in the
 * state file), continued once restored; boot names how it started ("snapshot",
 * "resume", "clone"), from what it came (for the log). 0, or an sbx_errcode with
 * *err (sb then ended dead). */
static int launch_failed(struct sandbox *sb, const char *from, int r, struct sbx_err *err)
{
    LOGS(LOG_ERR, sb->id, "cannot start from %s: %s", from, strerror(-r));
    sbx_err_set(err, SBX_E_VM_START_FAILED, "cannot start the VM: %s", strerror(-r));
    if (resume_undo(sb, SBX_E_VM_START_FAILED, err->msg, false)) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof(err->msg) - n, ": sandbox %s stays paused", sb->id);
        return SBX_E_VM_START_FAILED;
    }
    sbx_die(sb, "vm_start_failed");
    return SBX_E_VM_START_FAILED;
}

/* vm (launched in restore mode, bound to sb) loads state; see restore_launch. */
static int restore_into(struct sandbox *sb, struct sbx_vm *vm, const char *boot, const char *from,
                        const char *state, struct sbx_err *err)
{
    int r;

    snprintf(vm->boot, sizeof(vm->boot), "%s", boot);
    if (sbx_record_new(sb, vm, err) != 0)
        return SBX_E_INDEX_WRITE_FAILED;
    if ((r = vmm_restore(sb->vm, state, on_restored, sb)) != 0)
        return launch_failed(sb, from, r, err);
    ev_timer_start(sb->t->loop, &sb->boot_timer);
    LOGS(LOG_INFO, sb->id, "starting: VM %s restored from %s (%s), pid %d", vm->id, from, boot,
         (int)vm->pid);
    return 0;
}

static int restore_launch(struct sandbox *sb, const char *boot, const char *from,
                          const char *backing, const char *taken, const char *state,
                          const char *mem_path, int mem_fd, const struct net_policy *pol,
                          struct sbx_err *err)
{
    struct sbx_vm *vm;
    int r;

    if ((r = sbx_vm_new(sb->t, sb->tmpl, sb->mem_mb, sb->vcpus, &vm)) != 0)
        return launch_failed(sb, from, r, err);
    snprintf(vm->boot, sizeof(vm->boot), "%s", boot);
    if (pol)
        vm->pol = *pol;
    sbx_vm_bind(vm, sb);
    /* taken: backing (a pause snapshot's disk, backed by taken) becomes the VM's own
     * overlay. On another file system (EXDEV) it backs a new overlay instead, as
     * for any snapshot, and the pause snapshot stays while the sandbox needs it. */
    if (taken && rename(backing, vm->disk) == 0) {
        snprintf(vm->backing, sizeof(vm->backing), "%s", taken);
        r = 0;
    } else {
        r = sbx_vm_overlay(vm, backing, 0);
    }
    if (r != 0 || (r = sbx_vm_launch_restore(vm, mem_path, mem_fd)) != 0)
        return launch_failed(sb, from, r, err);
    return restore_into(sb, vm, boot, from, state, err);
}

/* Up to this much of a delta snapshot's disk is copied into a spare QEMU's overlay on
 * the loop (a larger one gets a QEMU of its own, backed by it). */
#define SPARE_DISK_MAX (64ull << 20)

/* A delta snapshot s over the pool's current template, its disk backed by the
 * template's frozen overlay: restore it into the pool's spare QEMU (started ahead over
 * the same RAM file and overlay chain), which saves a QEMU start (~90 ms of CPU, most
 * of a fork's time under TCG). The spare opened its overlay inactive (-incoming): QEMU
 * reads it afresh when the restore completes, as for a migration over shared storage,
 * so the snapshot's disk is copied into it now, backed by the same file under the
 * snapshot's name for it. 1: not possible (the caller launches a QEMU), else restore_into's result.
 */
static int spare_restore(struct sandbox *sb, const struct sbx_snap *s, const char *boot,
                         const char *from, const char *disk, const char *state,
                         const struct net_policy *pol, struct sbx_err *err)
{
    struct sbx_vm *vm;
    struct stat st;
    char into[128];
    int in = -1, out = -1, r;

    if (!s->mem[0] || !s->disk_backing[0] || (pol && !sbx_net_is_default(sb->t->cfg, pol)) ||
        stat(disk, &st) != 0 || (uint64_t)st.st_blocks * 512 > SPARE_DISK_MAX ||
        !(vm = pool_spare_take(sb->t->pool, s->mem, s->disk_backing)))
        return 1;
    if ((in = open(disk, O_RDONLY | O_CLOEXEC)) < 0 ||
        (out = open(vm->disk, O_WRONLY | O_TRUNC | O_CLOEXEC | O_NOFOLLOW)) < 0)
        r = -errno;
    else if ((r = vmm_copy_sparse(in, out, st.st_size)) == 0 && ftruncate(out, st.st_size) != 0)
        r = -errno;
    if (in >= 0)
        close(in);
    if (out >= 0 && close(out) != 0 && r == 0)
        r = -errno;
    /* Named onto the snapshot's link to the template's overlay (the same file the
     * spare opened): a rebuilt template removes its own name, not the link, which lives
     * as long as the fork snapshot does, as the disk of a fork in a QEMU of its own. */
    if (r == 0 && (r = vmm_qcow2_rebase(vm->disk, s->disk_backing)) == 0)
        snprintf(vm->backing, sizeof(vm->backing), "%s", s->disk_backing);
    if (r != 0) {
        LOGS(LOG_WARN, sb->id, "cannot give the spare QEMU snapshot %s's disk: %s", s->id,
             strerror(-r));
        sbx_vm_destroy(vm);
        return 1;
    }
    sbx_vm_bind(vm, sb);
    snprintf(into, sizeof(into), "%s, into a QEMU started ahead", from);
    return restore_into(sb, vm, boot, into, state, err);
}

/* A jailed restore of a delta over a RAM file that is not the pool's current
 * template's (a pause's copy after a rebuild or a reboot): the jail shows QEMU a
 * sealed memfd in place of the file (vmm.h mem_fd), made first on the bg worker. */
struct reseal {
    struct sbx_table *t;
    char sb_id[SBX_ID_CAP];
    char boot[16];
    char mem[4096 + 300];
    bool has_pol;
    struct net_policy pol;
    int fd; /* or -errno */
};

static int snap_launch_fd(struct sandbox *sb, const char *boot, const struct net_policy *pol,
                          int mem_fd, struct sbx_err *err);

static void reseal_work(void *arg)
{
    struct reseal *j = arg;

    j->fd = vmm_mem_seal(j->mem);
}

static void reseal_done(void *arg)
{
    struct reseal *j = arg;
    struct sandbox *sb = sbx_find(j->t, j->sb_id);
    struct sbx_err err;
    char reason[200];

    if (!sb || sb->state != ST_STARTING || sb->vmr) {
        /* Ended meanwhile: its ops went with it. */
    } else if (j->fd < 0) {
        LOGS(LOG_ERR, sb->id, "cannot seal %s for its jailed QEMU: %s", j->mem, strerror(-j->fd));
        fail_create(sb, SBX_E_VM_START_FAILED, "cannot restore %s: %s", sb->id,
                    "cannot seal its template's RAM for the jail");
        snprintf(reason, sizeof(reason), "vm_start_failed: cannot seal its RAM file: %s",
                 strerror(-j->fd));
        sbx_die(sb, reason);
    } else {
        LOGS(LOG_DEBUG, sb->id, "sealed %s for its jailed QEMU", j->mem);
        /* Failures end it dead, failing its ops (launch_failed). */
        snap_launch_fd(sb, j->boot, j->has_pol ? &j->pol : NULL, j->fd, &err);
    }
    if (j->fd >= 0)
        close(j->fd); /* QEMU has its own */
    free(j);
}

static int reseal_start(struct sandbox *sb, const char *boot, const char *mem,
                        const struct net_policy *pol, struct sbx_err *err)
{
    struct reseal *j = calloc(1, sizeof(*j));

    if (!j) {
        sbx_die(sb, "vm_start_failed: out of memory");
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    j->t = sb->t;
    snprintf(j->sb_id, sizeof(j->sb_id), "%s", sb->id);
    snprintf(j->boot, sizeof(j->boot), "%s", boot);
    snprintf(j->mem, sizeof(j->mem), "%s", mem);
    if (pol) {
        j->has_pol = true;
        j->pol = *pol;
    }
    j->fd = -1;
    if (bg_run(sb->t->bg, reseal_work, reseal_done, j) != 0) {
        free(j);
        sbx_die(sb, "vm_start_failed: out of memory");
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    LOGS(LOG_INFO, sb->id, "starting: sealing %s for its jailed QEMU first", mem);
    return 0;
}

/* A VM for sb restored from its snapshot sb->snap_id (see restore_launch). Its policy:
 * pol, else the snapshot's (networking was on), else the default. mem_fd: a sealed
 * copy of a delta's RAM file for a jailed QEMU (0: the pool's, or one is made). */
static int snap_launch_fd(struct sandbox *sb, const char *boot, const struct net_policy *pol,
                          int mem_fd, struct sbx_err *err)
{
    struct sbx_snap *s = snap_find(sb->t, sb->snap_id);
    char disk[4096 + 16], state[4096 + 16], from[64], mem[4096 + 300];
    struct stat st;

    if (!s) {
        sbx_die(sb, "vm_start_failed: its snapshot is gone");
        return snap_not_found(sb->snap_id, err);
    }
    path_in(s, "disk.qcow2", disk, sizeof(disk));
    path_in(s, "state.snap", state, sizeof(state));
    snprintf(from, sizeof(from), "snapshot %s", s->id);
    if (!pol && s->has_pol)
        pol = &s->pol;
    /* A jailed QEMU (its own uid) opens the disk read-only through a bind mount of
     * this one file (vmm_jail.c plan_chain); state_dir is 0700, so no other host user
     * reaches it, and no other VM's jail shows it. A failure shows as QEMU's. */
    if (sb->t->jail && chmod(disk, 0644) != 0)
        LOGS(LOG_WARN, sb->id, "cannot make %s readable to the jail: %s", disk, strerror(errno));
    /* A delta goes over its template's RAM file, unchanged (vmm.h): a rebuilt template
     * removed it (a pause keeps a copy). A jailed QEMU maps a sealed copy of it: the
     * pool's for its current template, else one made now. */
    if (s->mem[0] && snap_mem(sb->t, s, mem, sizeof(mem)) != 0) {
        sbx_die(sb, "snapshot_invalid: its RAM file is gone");
        return sbx_err_set(err, SBX_E_SNAPSHOT_INVALID,
                           "snapshot %s cannot be used: it holds the pages of a sandbox over "
                           "the RAM file %s, which is gone (its template rebuilt since, or "
                           "the file removed)",
                           s->id, s->mem);
    }
    /* QEMU maps the whole guest from it: a short file would end the VM at the first
     * page past its end. */
    if (s->mem[0] && (stat(mem, &st) != 0 || (uint64_t)st.st_size != (uint64_t)s->mem_mb << 20)) {
        sbx_die(sb, "snapshot_invalid: its RAM file is not the guest's size");
        return sbx_err_set(err, SBX_E_SNAPSHOT_INVALID,
                           "snapshot %s cannot be used: its RAM file %s is not %u MiB long", s->id,
                           mem, s->mem_mb);
    }
    if (s->mem[0] && sb->t->jail && mem_fd <= 0 && s->sealed_fd > 0)
        mem_fd = s->sealed_fd; /* a booted parent's fork: sealed once for all */
    if (s->mem[0] && sb->t->jail && mem_fd <= 0 && pool_mem_fd(sb->t->pool, mem) <= 0)
        return reseal_start(sb, boot, mem, pol, err);
    /* Into a spare QEMU where one maps the same files (a resume too: its disk is then
     * copied, not taken). */
    if (s->mem[0] && mem_fd <= 0) {
        int r = spare_restore(sb, s, boot, from, disk, state, pol, err);
        if (r != 1)
            return r;
    }
    return restore_launch(sb, boot, from, disk,
                          !strcmp(boot, "resume") && !strcmp(s->type, "pause") && s->disk_backing[0]
                              ? s->disk_backing
                              : NULL,
                          state, s->mem[0] ? mem : NULL, mem_fd, pol, err);
}

static int snap_launch(struct sandbox *sb, const char *boot, const struct net_policy *pol,
                       struct sbx_err *err)
{
    return snap_launch_fd(sb, boot, pol, 0, err);
}

/* The create's op, once its VM is on its way (status 0). */
static int create_op(struct sandbox *sb, int status, const struct sbx_sink *sink, void *user,
                     sbx_op_t *opid, struct sbx_err *err)
{
    struct op *op;

    if (status)
        return status;
    if (!(op = ops_new(sb, OP_CREATE, sink, user))) {
        sbx_die(sb, "vm_start_failed: out of memory");
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    *opid = op->id;
    return 0;
}

int sbx_snap_start(struct sandbox *sb, const struct net_policy *pol, const struct sbx_sink *sink,
                   void *user, sbx_op_t *opid, struct sbx_err *err)
{
    return create_op(sb, snap_launch(sb, "snapshot", pol, err), sink, user, opid, err);
}

int sbx_clone_start(struct sandbox *sb, const char *snap, const char *disk, const char *mem,
                    struct sbx_vm *spare, const struct net_policy *pol, const struct sbx_sink *sink,
                    void *user, sbx_op_t *opid, struct sbx_err *err)
{
    char from[sizeof(sb->tmpl) + 64];

    snprintf(from, sizeof(from), "template %s's snapshot (the pool is empty%s)", sb->tmpl,
             spare ? "; a QEMU started ahead" : "");
    if (spare) {
        sbx_vm_bind(spare, sb);
        return create_op(sb, restore_into(sb, spare, "clone", from, snap, err), sink, user, opid,
                         err);
    }
    return create_op(sb, restore_launch(sb, "clone", from, disk, NULL, snap, mem, 0, pol, err),
                     sink, user, opid, err);
}

/* ---- pause and resume ---- */

/* sb has just become PAUSED: recorded so (the index first), op (if any) answered with
 * its record, every other op failed, then its VM goes. */
static void paused_now(struct sandbox *sb, struct op *op)
{
    struct sbx_vm *vm = sb->vmr;

    sb->paused_ms = sbx_wall_ms();
    sb->paused_mono = sbx_now_ms();
    sb->ready = false;
    sb->vm_id[0] = 0;
    /* Paused in the index (naming no VM) before the VM and its record go: a kill -9 in
     * between finds a paused sandbox and a VM no sandbox names, which it removes. */
    sbx_save(sb);
    ev_timer_stop(sb->t->loop, &sb->backoff_timer);
    ev_timer_stop(sb->t->loop, &sb->boot_timer);
    if (op)
        ops_finish_sandbox(op, sb);
    ops_fail_all(sb, SBX_E_CHANNEL_LOST, "the sandbox was paused");
    sbx_freeze_reset(sb, -ESHUTDOWN);
    if (sb->ch) {
        chan_free(sb->ch);
        sb->ch = NULL;
    }
    if (vm)
        sbx_vm_destroy(vm);
    sb->vmr = NULL;
    sb->vm = NULL;
    sb->vm_gone = false;
}

/* The pause's snapshot s is recorded: the sandbox is PAUSED from now on (the index
 * first), then its VM goes. */
static void pause_finish(struct sandbox *sb, const struct sbx_snap *s, struct op *op)
{
    char old[SBX_ID_CAP];

    snprintf(old, sizeof(old), "%s", sb->snap_id);
    snprintf(sb->snap_id, sizeof(sb->snap_id), "%s", s->id);
    if (sbx_state_set(sb, ST_PAUSED) != 0) {
        snprintf(sb->snap_id, sizeof(sb->snap_id), "%s", old);
        if (op)
            ops_fail(op, SBX_E_CONFLICT, "sandbox %s cannot be paused now", sb->id);
        sandbox_continue(sb);
        return;
    }
    paused_now(sb, op);
    LOGS(LOG_INFO, sb->id, "paused (snapshot %s)", s->id);
}

int sbx_resume_start(struct sandbox *sb, struct sbx_err *err)
{
    int64_t paused = sbx_now_ms() - sb->paused_mono;
    int status;

    /* It holds a VM again: it counts as a create does, in number and in memory. */
    if (sb->state == ST_PAUSED && sbx_count_live(sb->t) >= sb->t->cfg->max_sandboxes)
        return sbx_err_set(err, SBX_E_TOO_MANY_SANDBOXES,
                           "the limit of %u live sandboxes is reached: sandbox %s stays paused",
                           sb->t->cfg->max_sandboxes, sb->id);
    if (sb->state == ST_PAUSED && (status = sbx_mem_quota(sb->t, sb->mem_mb, err))) {
        size_t n = strlen(err->msg);
        snprintf(err->msg + n, sizeof(err->msg) - n, ": sandbox %s stays paused", sb->id);
        return status;
    }
    if (sbx_state_set(sb, ST_STARTING) != 0)
        return sbx_err_set(err, SBX_E_CONFLICT, "sandbox %s is not paused", sb->id);
    /* Paused time does not count toward the TTL. */
    if (paused > 0) {
        sb->expires_ms += paused;
        sb->expires_mono += paused;
    }
    sb->paused_ms = 0;
    sbx_touch(sb);
    return snap_launch(sb, "resume", NULL, err);
}

int sbx_snap_pause(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
                   sbx_op_t *opid, struct sbx_rec *out, struct sbx_err *err)
{
    struct sandbox *sb = sbx_find(t, id);

    *opid = 0;
    if (sb && sb->state == ST_PAUSED) {
        sbx_rec_of(sb, out); /* already */
        return 0;
    }
    return snap_begin(t, id, NULL, 0, NULL, true, sink, user, opid, err);
}

int sbx_pause_idle(struct sandbox *sb)
{
    struct sbx_err err;
    sbx_op_t op;

    return snap_begin(sb->t, sb->id, NULL, 0, NULL, true, NULL, NULL, &op, &err) ? -EIO : 0;
}

bool sbx_coming_back(struct sbx_table *t, const char *id)
{
    struct sandbox *sb = sbx_find(t, id);

    return sb && (sb->state == ST_PAUSED || sb->state == ST_STARTING);
}

int sbx_snap_resume(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
                    sbx_op_t *opid, struct sbx_rec *out, struct sbx_err *err)
{
    struct sandbox *sb = sbx_find(t, id);
    struct op *op;
    int status;

    *opid = 0;
    if (!sb)
        return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox with id '%s'", id);
    if (sbx_state_final(sb->state))
        return sbx_err_set(err, sb->state == ST_DEAD ? SBX_E_DEAD : SBX_E_GONE,
                           "sandbox %s is %s: %s", sb->id, sbx_state_name(sb->state), sb->reason);
    if (sb->state == ST_PAUSED && (status = sbx_resume_start(sb, err)))
        return status;
    if (sb->state != ST_STARTING) {
        sbx_rec_of(sb, out); /* running (or frozen: the next request thaws it) */
        return 0;
    }
    /* Answered by the guest's first HELLO (sbx.c sandbox_ready), as a create is. */
    if (!(op = ops_new(sb, OP_RESUME, sink, user)))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    *opid = op->id;
    return 0;
}

/* ---- a resumed sandbox's disk ----
 *
 * A resume takes its pause snapshot's disk as the VM's own overlay (restore_launch
 * renames it into the run dir: nobody else restores a pause snapshot, and nothing is
 * copied), so pause and resume cycles add no layer to the disk's chain. Once the
 * sandbox is up, it is recorded as restored from whatever snapshot owns the file its
 * disk is now backed by (none for the template image): the pause snapshot is then
 * needed by nothing and sbx_snap_tick removes it. A pool sandbox's pause disk names
 * the template's overlay linked inside that pause snapshot, which therefore stays
 * (one: the next pause's disk names the same link). Derived from the disk itself,
 * so a warrend killed during the resume gets it right when the VM is adopted. */

void sbx_snap_resumed(struct sandbox *sb)
{
    char own[4096 + 16];
    const char *owner = "", *backing = sb->vmr ? sb->vmr->backing : "";

    if (!backing[0])
        return; /* a VM of an older warrend: the dependency stays as recorded */
    for (struct sbx_snap *o = sb->t->snaps->list; o; o = o->next) {
        snprintf(own, sizeof(own), "%s/", o->dir);
        if (strncmp(backing, own, strlen(own)) == 0) {
            owner = o->id;
            break;
        }
    }
    if (strcmp(owner, sb->snap_id) == 0)
        return;
    LOGS(LOG_INFO, sb->id, "resumed: its disk is its own; snapshot %s is no longer needed",
         sb->snap_id);
    snprintf(sb->snap_id, sizeof(sb->snap_id), "%s", owner);
    if (sbx_save(sb) == 0)
        sbx_snap_tick(sb->t);
}

/* ---- after a restart ---- */

static void on_found_stopped_cont(void *ud, int err, const char *why)
{
    struct sandbox *sb = ud;
    char reason[256];

    if (err == 0 || sbx_state_final(sb->state))
        return;
    snprintf(reason, sizeof(reason), "vm_lost: found stopped after a restart, and cont failed: %s",
             why);
    sbx_die(sb, reason);
}

/* A VM found stopped at adoption: its save may still be streaming, and its end would
 * stop the VM again after a cont. Asked until it is over, then continued. */
struct found_stopped {
    struct sbx_table *t;
    char id[SBX_ID_CAP]; /* the sandbox's */
    unsigned tries;
    ev_timer again;
};

static void found_stopped_ask(struct found_stopped *f);

static void on_found_stopped_again(struct ev_loop *loop, ev_timer *w, int revents)
{
    found_stopped_ask(w->data);
}

static void on_migrate_status(void *ud, int err, const char *json)
{
    struct found_stopped *f = ud;
    struct sandbox *sb = sbx_find(f->t, f->id);
    char st[32];
    bool busy = !err && rec_text_member(json, "status", st, sizeof(st)) == 0 &&
                (!strcmp(st, "setup") || !strcmp(st, "active") || !strcmp(st, "device") ||
                 !strcmp(st, "cancelling") || !strcmp(st, "pre-switchover"));
    int r;

    if (sb && sb->state == ST_RUNNING && sb->vm && busy && ++f->tries < 200) {
        ev_timer_set(&f->again, 0.05, 0);
        ev_timer_start(f->t->loop, &f->again);
        return;
    }
    if (sb && sb->state == ST_RUNNING && sb->vm &&
        (r = vmm_cont(sb->vm, on_found_stopped_cont, sb)) != 0)
        LOGS(LOG_ERR, sb->id, "cannot continue its VM: %s", strerror(-r));
    free(f);
}

static void found_stopped_ask(struct found_stopped *f)
{
    struct sandbox *sb = sbx_find(f->t, f->id);

    if (!sb || !sb->vm ||
        vmm_qmp(sb->vm, "{\"execute\":\"query-migrate\"}", on_migrate_status, f) != 0)
        free(f); /* the VM is gone: nothing to continue (its exit says what happened) */
}

void sbx_snap_found_stopped(struct sandbox *sb)
{
    struct found_stopped *f = calloc(1, sizeof(*f));

    LOGS(LOG_WARN, sb->id,
         "its VM was found stopped (a snapshot cut short by a restart): "
         "continuing it once its save is over");
    if (!f)
        return;
    f->t = sb->t;
    snprintf(f->id, sizeof(f->id), "%s", sb->id);
    ev_timer_init(&f->again, on_found_stopped_again, 0.05, 0);
    f->again.data = f;
    found_stopped_ask(f);
}

/* ---- list, get, delete ---- */

int sbx_snap_all(struct sbx_table *t, struct sbx_snap_rec **out, size_t *n, struct sbx_err *err)
{
    size_t count = 0;

    *out = NULL;
    *n = 0;
    for (struct sbx_snap *s = t->snaps->list; s; s = s->next)
        count++;
    if (!(*out = calloc(count ? count : 1, sizeof(**out))))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    /* The list is newest first; the answer oldest first. */
    for (struct sbx_snap *s = t->snaps->list; s; s = s->next)
        snap_rec(s, &(*out)[count - ++*n]);
    return 0;
}

int sbx_snap_find(struct sbx_table *t, const char *id, struct sbx_snap_rec *out,
                  struct sbx_err *err)
{
    struct sbx_snap *s = snap_find(t, id);

    if (!s)
        return snap_not_found(id, err);
    snap_rec(s, out);
    return 0;
}

/* What needs snapshot id's files: live sandboxes made from it, snapshots whose disk is
 * layered on its disk. How many, named in deps. */
static unsigned dependents(struct sbx_table *t, const char *id, char *deps, size_t cap)
{
    size_t n = 0;
    unsigned count = 0;

    deps[0] = 0;
    for (struct sandbox *sb = t->sandboxes; sb; sb = sb->next) {
        if (!sbx_state_final(sb->state) && strcmp(sb->snap_id, id) == 0 && n + 40 < cap)
            n += (size_t)snprintf(deps + n, cap - n, "%ssandbox %s", count++ ? ", " : "", sb->id);
    }
    for (struct sbx_snap *c = t->snaps->list; c; c = c->next) {
        if (strcmp(c->parent_snap, id) == 0 && n + 40 < cap)
            n += (size_t)snprintf(deps + n, cap - n, "%ssnapshot %s", count++ ? ", " : "", c->id);
    }
    return count;
}

static int snap_remove(struct sbx_table *t, struct sbx_snap *s)
{
    int r = idx_del(t->idx, IDX_SNAPSHOTS, s->id);

    if (r != 0)
        return r;
    t->idx_dirty = true;
    for (struct sbx_snap **p = &t->snaps->list; *p; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            break;
        }
    }
    rm_later(t, s->dir);
    LOGS(LOG_INFO, s->id, "snapshot deleted");
    bool kept_base = s->mem[0] && (!strcmp(s->type, "pause") || sbx_in_bases(t, s->mem));
    /* Unlinked and its files going, but kept until the next removal: the record a
     * delete answers with borrows its strings. */
    snap_free(t->snaps->gone);
    t->snaps->gone = s;
    if (kept_base)
        sbx_snap_bases_sweep(t);
    return 0;
}

int sbx_snap_drop(struct sbx_table *t, const char *id, struct sbx_snap_rec *out,
                  struct sbx_err *err)
{
    struct sbx_snap *s = snap_find(t, id);
    char deps[400];
    unsigned count;
    int r;

    if (!s)
        return snap_not_found(id, err);
    /* Fork and pause snapshots whose sandboxes have ended go now rather than at the next
     * tick: they would be named as dependents. */
    sbx_snap_tick(t);
    if (!(s = snap_find(t, id)))
        return snap_not_found(id, err);
    if ((count = dependents(t, id, deps, sizeof(deps))))
        return sbx_err_set(err, SBX_E_SNAPSHOT_IN_USE,
                           "snapshot %s is still needed by %s: end or delete %s first", id, deps,
                           count > 1 ? "them" : "it");
    if ((r = snap_remove(t, s)) != 0)
        return sbx_err_set(err, SBX_E_INDEX_WRITE_FAILED, "cannot delete the record: %s",
                           idx_strerror(r));
    /* snap_remove kept s (t->snaps->gone) for this record. */
    snap_rec(s, out);
    return 0;
}

void sbx_snap_tick(struct sbx_table *t)
{
    char deps[64];

    /* A fork's snapshot is the forks' disk base: it goes with the last of them. */
    for (struct sbx_snap *s = t->snaps->list, *next; s; s = next) {
        next = s->next;
        if (strcmp(s->type, "sandbox") != 0 && dependents(t, s->id, deps, sizeof(deps)) == 0)
            snap_remove(t, s);
    }
}
