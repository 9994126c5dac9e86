/*
 * pool.c - template snapshots and the warm pool (see pool.h).
 *
 * States of the template: NONE (nothing usable yet) -> BOOTING (template VM
 * launched, pinging its agent, then `sync` in it) -> SAVING (vmm_save) -> READY (snapshot
 * recorded; the pool fills). A failure goes back to NONE with a retry timer
 * (10 s, doubling, at most 5 tries in a row); a refused restore rebuilds.
 * Everything runs on the loop; nothing waits: the filling VM is one restore
 * (then cont, warm-up session, stop) in flight, continued from callbacks,
 * bounded by fill_timer.
 */
#include "pool.h"
#include "sbx_util.h"
#include "rec.h"
#include "chan.h"
#include "proto.h"
#include "log.h"
#include "net.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX        64 /* pool_size is capped here */
#define POOL_VM_MB      48 /* budget per waiting VM (a warmed-up stopped clone: ~40 MiB PSS) */
#define TPL_TRIES_MAX   5
#define TPL_PING_PERIOD 0.25
#define WARM_HOOK       "/etc/warren/warm" /* docs/KERNELD.md: a template's own warm-up */
#define WARM_SLACK_S    10 /* the template's deadline past the hook's own guest timeout */

enum tpl_state { TPL_NONE, TPL_BOOTING, TPL_SAVING, TPL_READY };

static const char *const tpl_state_names[] = {"none", "booting", "saving", "ready"};

/*
 * A short session of the pool's own on a VM's guest channel: (PING until PONG,
 * for a VM still booting,) INIT, one EXEC, its EXIT; before it, an optional
 * first EXEC whose outcome does not count, and then the template's warm hook
 * (hook: the image's executable WARM_HOOK, when it has one) whose failure
 * fails the session: a template that cannot warm is never saved. The template first runs
 * pool_template_warmup (what it reads stays in the page cache of every clone:
 * by default the PATH's directories and python3, load/RESULTS.md), then `sync`
 * (no dirty page cache in the snapshot: every clone would write it back). A
 * pool VM runs `true` after its restore, twice: as `sh -c true` (a client's
 * "cmd") and as the argv ["true"] (a client's "argv": the PATH lookup, an
 * external binary's exec), so the guest code a create and either kind of first
 * exec need is translated (TCG) and its pages faulted in before the hand-out,
 * not during it (each warmed only its own kind: load/RESULTS.md). The sandbox
 * that gets the VM starts a session of its own (a new INIT ends this one's
 * streams).
 */
struct wsess {
    struct tpool *p;
    struct chan *ch;
    int stage;       /* 0: PINGs, 1: INIT sent, 2: EXEC sent, 3: done, 4: pre's EXEC sent,
                      * 5: the hook's EXEC sent */
    const char *pre; /* sh -c, first; NULL or "": none */
    bool hook;       /* then WARM_HOOK, if the image has it (template_warm_timeout_seconds) */
    int64_t hook_start;
    char hook_out[2048]; /* the start of what the hook printed: its failure's reason */
    size_t hook_nout;
    bool pre_logged; /* the template's warm-up: log how it went */
    int64_t pre_start;
    const char *cmd;
    bool cmd_argv; /* cmd is one word, run as an argv of its own, not by sh -c */
    void (*done)(struct tpool *p, int err, const char *why);
};

/* Ids of the pool's sessions, apart from the 1, 2, ... of a sandbox's. */
#define WSESS_ID 0x70000000u

/* One template's pool: its snapshot, its ready VMs and spares, for one template,
 * memory size and vCPU count. */
struct tpool {
    const struct pool_host *h;
    struct pool *all; /* the pools it shares pool_max_mb with */
    char tmpl[64];
    char key[96]; /* its index record's: tmpl, or tmpl@<mem>m<vcpus>c for another shape */
    unsigned size, mem_mb, vcpus;
    enum tpl_state state;
    /* the template: its VM's id names its dir and RAM file */
    char id[24];
    char dir[4096], snap[4096 + 16], disk[4096 + 16], mem[128];
    struct sbx_ident base, kernel, initrd;
    struct vmm *vmm;   /* the template VM while booting or saving */
    int net_slot;      /* its network's /30 (net/net.h), -1: none */
    bool vmm_gone;     /* it exited: freed from the loop */
    struct wsess tw;   /* its session: PING until the agent answers, then sync */
    ev_timer ping;     /* PING until the agent answers */
    ev_timer deadline; /* boot_timeout_s for the template to answer */
    ev_timer retry;    /* after a failure: build again */
    ev_timer kick;     /* refill and reap, from the loop */
    ev_timer defer;    /* pool_defer: no VM started until it fires or pool_undefer */
    unsigned tries;
    int64_t t_start;
    ev_tstamp defer_end; /* when the last deferral ended (or will) */
    /* the pool */
    struct sbx_vm *ready[POOL_MAX];
    unsigned nready;
    struct sbx_vm *filling; /* the one restore (and warm-up) in flight */
    int64_t fill_start;
    struct wsess fw;               /* the filling VM's warm-up session */
    bool fill_warming;             /* restored, running its warm-up: its channel is ours */
    ev_timer fill_timer;           /* boot_timeout_s for the restore and warm-up */
    struct sbx_vm *dead[POOL_MAX]; /* exited while unbound: destroyed from kick */
    unsigned ndead;
    unsigned handed_out, rebuilds;
    bool verified; /* a restore from this template's snapshot succeeded (pool_template) */
    /* QEMUs started in restore mode over the template's files and waiting (no restore
     * yet) for a create that finds the pool empty or a fork's restore: each skips a
     * QEMU start (pool_template, pool_spare_take). At most pool_spares. */
    struct sbx_vm *spares[POOL_MAX];
    unsigned nspares;
    /* Jailed: the template's RAM as a sealed memfd (vmm_mem_seal), what every jailed
     * clone maps in place of the RAM file (which the jail does not show); 0 until made,
     * and when unjailed. */
    int mem_fd;
    struct seal_job *sealing; /* its copy in flight on the bg worker */
    unsigned exits;           /* waiting VMs that exited since one last became ready */
};

#define POOL_TEMPLATES_MAX SBX_POOLS_MAX /* pool_max_templates is capped here */

/* Every template's pool (pool.h): default_template's, pool_templates' and those made
 * on first use (pool_first_use), within pool_max_mb together. */
struct pool {
    struct pool_host host;     /* the table's, copied at pool_new */
    const struct pool_host *h; /* &host, as every tpool holds it */
    struct tpool *tp[POOL_TEMPLATES_MAX];
    unsigned n;
    char refused[POOL_TEMPLATES_MAX][96]; /* keys refused a pool: logged once each */
    unsigned nrefused;                    /* at most pool_max_templates */
    bool refused_more;                    /* one more was refused: said once, then quiet */
};

/* A copy of the RAM file into a sealed memfd, off the loop. p NULL: the pool went
 * meanwhile (the fd is closed). */
struct seal_job {
    struct tpool *p;
    char id[24];
    char mem[128];
    int fd; /* or -errno */
};

static void tpl_build(struct tpool *p);
static void spare_drop(struct tpool *p);
static void pool_fill(struct tpool *p);
static void tpl_failed(struct tpool *p, const char *why);

static void kick_soon(struct tpool *p, double after)
{
    if (!ev_is_active(&p->kick)) {
        ev_timer_set(&p->kick, after, 0);
        ev_timer_start(p->h->loop, &p->kick);
    }
}

/* ---- the template's files and record ---- */

static void tpl_paths(struct tpool *p)
{
    char tag[9];

    snprintf(p->dir, sizeof(p->dir), "%s/templates/%s", p->h->cfg->state_dir, p->id);
    snprintf(p->snap, sizeof(p->snap), "%s/state.snap", p->dir);
    snprintf(p->disk, sizeof(p->disk), "%s/disk.qcow2", p->dir);
    /* The state dir's tag first: a warrend's start-up sweep knows its own files in
     * /dev/shm (shm_sweep), whatever other warrends run here. */
    sbx_state_tag(p->h->cfg->state_dir, tag);
    snprintf(p->mem, sizeof(p->mem), "/dev/shm/warren-%s-%s.mem", tag, p->id);
}

/* Remove the current template's files and record (clones running keep their open
 * files: unlinking changes nothing under them). */
static void tpl_remove(struct tpool *p)
{
    if (p->sealing) {
        p->sealing->p = NULL;
        p->sealing = NULL;
    }
    if (p->mem_fd > 0)
        close(p->mem_fd); /* jailed clones running hold their own copy of it */
    p->mem_fd = 0;
    if (!p->id[0])
        return;
    unlink(p->mem);
    util_rm_dir(p->dir, NULL);
    idx_del(p->h->idx, IDX_TEMPLATES, p->key);
    p->h->idx_changed(p->h->ctx);
    p->id[0] = 0;
}

static bool pool_names(const struct pool *all, const char *id)
{
    for (unsigned i = 0; all && i < all->n; i++)
        if (all->tp[i]->id[0] && strcmp(all->tp[i]->id, id) == 0)
            return true;
    return false;
}

/* Whether a live process maps path (its maps name it). Start-up only. */
static bool shm_mapped(const char *path)
{
    char maps[16 + 256], line[4096 + 256];
    bool found = false;
    DIR *d = opendir("/proc");
    struct dirent *e;
    FILE *f;

    if (!d)
        return true; /* cannot tell: keep it */
    while (!found && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(maps, sizeof(maps), "/proc/%s/maps", e->d_name);
        if (!(f = fopen(maps, "re")))
            continue;
        while (!found && fgets(line, sizeof(line), f))
            found = strstr(line, path) != NULL;
        fclose(f);
    }
    closedir(d);
    return found;
}

/* Template RAM files of this state dir's tag that no pool of all's names and no
 * live process maps: a warrend killed (-9) before its pool ended leaves its
 * template's guest RAM in /dev/shm, which nothing else would ever free. Files of
 * other tags are other warrends': never touched. */
static void shm_sweep(const struct pool_host *h, const struct pool *all)
{
    char tag[9], prefix[32], path[9 + 256], id[64];
    size_t plen, len;
    DIR *d;
    struct dirent *e;

    sbx_state_tag(h->cfg->state_dir, tag);
    plen = (size_t)snprintf(prefix, sizeof(prefix), "warren-%s-", tag);
    if (!(d = opendir("/dev/shm")))
        return;
    while ((e = readdir(d)) != NULL) {
        len = strlen(e->d_name);
        if (strncmp(e->d_name, prefix, plen) != 0 || len < plen + 5 ||
            strcmp(e->d_name + len - 4, ".mem") != 0 || len - plen - 4 >= sizeof(id))
            continue;
        snprintf(id, sizeof(id), "%.*s", (int)(len - plen - 4), e->d_name + plen);
        snprintf(path, sizeof(path), "/dev/shm/%s", e->d_name);
        if (pool_names(all, id) || shm_mapped(path))
            continue;
        LOG(LOG_INFO, "pool: removing a template RAM file no record names: %s", path);
        unlink(path);
    }
    closedir(d);
}

/* Template dirs and RAM files no pool of all's names (a crash mid-build, or a pool
 * turned off since); all NULL: every one. */
static void tpl_sweep(const struct pool_host *h, const struct pool *all)
{
    char dir[4096], path[4096 + 300], tag[9];
    DIR *d;
    struct dirent *e;

    shm_sweep(h, all);
    sbx_state_tag(h->cfg->state_dir, tag);

    snprintf(dir, sizeof(dir), "%s/templates", h->cfg->state_dir);
    if (!(d = opendir(dir)))
        return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || pool_names(all, e->d_name))
            continue;
        LOG(LOG_INFO, "pool: removing template files no record names: %s", e->d_name);
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        util_rm_dir(path, NULL);
        /* Named after the same VM id: only ours (ids are random per warrend). */
        snprintf(path, sizeof(path), "/dev/shm/warren-%s-%s.mem", tag, e->d_name);
        unlink(path);
    }
    closedir(d);
}

static const char *kernel_append(const struct pool_host *h)
{
    return h->cfg->kernel_append ? h->cfg->kernel_append : "";
}

static const char *warmup_cmd(const struct pool_host *h)
{
    return h->cfg->pool_template_warmup ? h->cfg->pool_template_warmup : "";
}

static int tpl_record(struct tpool *p)
{
    /* With the NIC (or none), kernel command line and warm-up it was made with: every
     * clone keeps its devices, command line and page cache. */
    struct rec_tpl rec = {.tmpl = p->tmpl,
                          .vm_id = p->id,
                          .dir = p->dir,
                          .snapshot = p->snap,
                          .disk = p->disk,
                          .mem_path = p->mem,
                          .mem_mb = p->mem_mb,
                          .vcpus = p->vcpus,
                          .base = p->base,
                          .kernel = p->kernel,
                          .initrd = p->initrd,
                          .created_ms = sbx_wall_ms(),
                          .net = p->h->net,
                          .cmdline_rev = VMM_CMDLINE_REV,
                          .cmdline_append = kernel_append(p->h),
                          .warmup = warmup_cmd(p->h)};
    char *s = rec_tpl_encode(&rec);
    int r = s ? idx_put(p->h->idx, IDX_TEMPLATES, p->key, s, strlen(s)) : -ENOMEM;

    if (r == 0)
        p->h->idx_changed(p->h->ctx);
    free(s);
    return r;
}

struct find_rec {
    const char *key;
    bool found;
    int status; /* rec_tpl_decode's */
    struct rec_tpl rec;
};

static int find_one(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct find_rec *f = ud;

    if (klen == strlen(f->key) && memcmp(key, f->key, klen) == 0 && !f->found) {
        f->found = true;
        f->status = rec_tpl_decode(val, vlen, &f->rec);
    }
    return 0;
}

/* The recorded snapshot, if its files are there and its images unchanged: 0, else
 * why it cannot be used (and nothing of it kept). The restore checks the rest. */
static const char *tpl_check_record(struct tpool *p)
{
    struct find_rec f = {.key = p->key};
    const struct rec_tpl *r = &f.rec;
    const char *why = NULL;
    struct stat st;

    idx_foreach(p->h->idx, IDX_TEMPLATES, find_one, &f);
    if (!f.found || f.status == -ENOMEM)
        return "none recorded";
    if (f.status != 0 || !r->shape_ok || strlen(r->vm_id) >= sizeof(p->id)) {
        rec_tpl_free(&f.rec);
        return "record unreadable";
    }
    snprintf(p->id, sizeof(p->id), "%s", r->vm_id);
    tpl_paths(p);
    if ((unsigned)r->mem_mb != p->mem_mb || (unsigned)r->vcpus != p->vcpus)
        why = "saved with another memory size or vCPU count";
    else if (r->net != p->h->net)
        why = "saved with networking turned the other way";
    else if (!r->cmdline_ok || r->cmdline_rev != VMM_CMDLINE_REV ||
             strcmp(r->cmdline_append, kernel_append(p->h)) != 0)
        why = "booted with another kernel command line";
    else if (!r->warmup || strcmp(r->warmup, warmup_cmd(p->h)))
        why = "warmed up with another pool_template_warmup";
    else if (!r->base_ok || sbx_ident_differs(&r->base, &p->base))
        why = "its base image changed";
    else if (!r->kernel_ok || sbx_ident_differs(&r->kernel, &p->kernel))
        why = "its kernel changed";
    else if (!r->initrd_ok || sbx_ident_differs(&r->initrd, &p->initrd))
        why = "its initramfs changed";
    else if (stat(p->snap, &st) != 0 || stat(p->disk, &st) != 0)
        why = "its snapshot or overlay is missing";
    else if (stat(p->mem, &st) != 0 || (uint64_t)st.st_size != (uint64_t)p->mem_mb << 20)
        why = "its memory file is missing or of another size";
    rec_tpl_free(&f.rec);
    return why;
}

/* ---- building the template ---- */

static void tpl_end_vm(struct tpool *p)
{
    ev_timer_stop(p->h->loop, &p->ping);
    ev_timer_stop(p->h->loop, &p->deadline);
    if (p->tw.ch) {
        chan_free(p->tw.ch);
        p->tw.ch = NULL;
    }
    if (p->vmm) {
        vmm_free(p->vmm);
        p->vmm = NULL;
    }
    p->vmm_gone = false;
    if (p->net_slot >= 0) /* its namespace goes with it */
        p->h->net_release(p->h->ctx, p->id, &p->net_slot);
}

/* The build failed: drop it, try again later (never from inside a vmm callback:
 * the VM is freed from the retry timer). */
static void tpl_failed(struct tpool *p, const char *why)
{
    double delay = 10.0 * (double)(1u << (p->tries < 5 ? p->tries : 5));

    ev_timer_stop(p->h->loop, &p->ping);
    ev_timer_stop(p->h->loop, &p->deadline);
    ev_timer_stop(p->h->loop, &p->retry);
    p->state = TPL_NONE;
    if (p->tries >= TPL_TRIES_MAX) {
        LOG(LOG_ERR, "pool: template %s: %s; gave up after %u tries (creates boot)", p->key, why,
            p->tries);
        kick_soon(p, 0); /* frees the VM */
        return;
    }
    LOG(LOG_WARN, "pool: template %s: %s; trying again in %.0f s (creates boot meanwhile)", p->key,
        why, delay);
    ev_timer_set(&p->retry, delay, 0);
    ev_timer_start(p->h->loop, &p->retry);
}

/* ---- the pool's own sessions ---- */

static void ws_send_init(struct wsess *w)
{
    struct proto_enc e;
    uint8_t entropy[PROTO_ENTROPY];
    struct timespec ts;

    w->p->h->random(w->p->h->ctx, entropy, sizeof(entropy));
    clock_gettime(CLOCK_REALTIME, &ts);
    proto_enc_begin(&e, chan_tx(w->ch), PROTO_INIT, WSESS_ID, 9);
    proto_put_u(&e, PK_V, PROTO_VERSION);
    proto_put_u(&e, PK_TIME_NS, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    proto_put_bin(&e, PK_ENTROPY, entropy, sizeof(entropy));
    proto_put_cstr(&e, PK_HOSTNAME, "sandbox");
    proto_put_u(&e, PK_MEM_MB, w->p->mem_mb);
    proto_put_u(&e, PK_RING, w->p->h->cfg->process_ring_bytes);
    proto_put_u(&e, PK_MAX_PROCS, w->p->h->cfg->max_procs_per_sbx);
    proto_enc_end(&e);
    chan_flush(w->ch);
    w->stage = 1;
}

/* The warm hook (WSESS_ID + 3, stage 5): argv alone, as root, bounded in the guest by
 * its timeout and here by the template's deadline, moved past it. */
static void ws_send_hook(struct wsess *w)
{
    const struct srv_config *c = w->p->h->cfg;
    struct proto_enc e;

    proto_enc_begin(&e, chan_tx(w->ch), PROTO_EXEC, WSESS_ID + 3, 7);
    proto_enc_key(&e, PK_ARGV);
    msgpack_pack_array(&e.pk, 1);
    msgpack_pack_str_with_body(&e.pk, WARM_HOOK, strlen(WARM_HOOK));
    proto_enc_key(&e, PK_ENV);
    msgpack_pack_map(&e.pk, 0);
    proto_put_cstr(&e, PK_USER, "root");
    proto_put_b(&e, PK_STDIN, false);
    proto_put_u(&e, PK_TIMEOUT, (uint64_t)c->template_warm_timeout_s * 1000u);
    proto_enc_end(&e);
    chan_flush(w->ch);
    w->stage = 5;
    w->hook_start = sbx_now_ms();
    w->hook_nout = 0;
    ev_timer_stop(w->p->h->loop, &w->p->deadline);
    ev_timer_set(&w->p->deadline, (double)c->template_warm_timeout_s + WARM_SLACK_S, 0);
    ev_timer_start(w->p->h->loop, &w->p->deadline);
}

/* The pre command (id WSESS_ID + 2, stage 4) when there is one and it has not run,
 * then the hook (ws_send_hook) when asked for, else the command (WSESS_ID + 1,
 * stage 2). */
static void ws_send_exec(struct wsess *w)
{
    bool pre = w->stage == 1 && w->pre && w->pre[0];
    struct proto_enc e;

    if (!pre && w->hook && (w->stage == 1 || w->stage == 4)) {
        ws_send_hook(w);
        return;
    }
    proto_enc_begin(&e, chan_tx(w->ch), PROTO_EXEC, WSESS_ID + (pre ? 2 : 1), 6);
    if (!pre && w->cmd_argv) {
        proto_enc_key(&e, PK_ARGV);
        msgpack_pack_array(&e.pk, 1);
        msgpack_pack_str_with_body(&e.pk, w->cmd, strlen(w->cmd));
    } else
        proto_put_cstr(&e, PK_CMD, pre ? w->pre : w->cmd);
    if (pre)
        w->pre_start = sbx_now_ms();
    proto_enc_key(&e, PK_ENV);
    msgpack_pack_map(&e.pk, 0);
    proto_put_cstr(&e, PK_USER, "root");
    proto_put_b(&e, PK_STDIN, false);
    proto_enc_end(&e);
    chan_flush(w->ch);
    w->stage = pre ? 4 : 2;
}

static void ws_done(struct wsess *w, int err, const char *why)
{
    if (w->stage == 3)
        return;
    w->stage = 3;
    w->done(w->p, err, why);
}

/* The hook's EXIT or ERROR: on to the command, or the session fails with why. An image
 * without the hook (ENOENT) or where it is not executable (EACCES) has none. */
static void ws_hook_done(struct wsess *w, const struct proto_frame *f)
{
    int64_t code = proto_has(f, PK_CODE) ? f->v[PK_CODE].i : -1;
    bool timed_out = proto_has(f, PK_TIMED_OUT) && f->v[PK_TIMED_OUT].b;
    char why[256];

    if (f->type == PROTO_ERROR && (code == ENOENT || code == EACCES)) {
        ws_send_exec(w);
        return;
    }
    if (f->type == PROTO_EXIT && code == 0 && !timed_out) {
        LOG(LOG_INFO, "pool: template %s: %s ran in %lld ms", w->p->key, WARM_HOOK,
            (long long)(sbx_now_ms() - w->hook_start));
        ev_timer_stop(w->p->h->loop, &w->p->deadline);
        ev_timer_set(&w->p->deadline, w->p->h->cfg->boot_timeout_s, 0);
        ev_timer_start(w->p->h->loop, &w->p->deadline);
        ws_send_exec(w);
        return;
    }
    for (size_t i = 0; i < w->hook_nout; i++) /* one log line, printable */
        if ((unsigned char)w->hook_out[i] < 0x20 || (unsigned char)w->hook_out[i] > 0x7e)
            w->hook_out[i] = ' ';
    w->hook_out[w->hook_nout] = '\0';
    if (f->type == PROTO_ERROR)
        snprintf(why, sizeof(why), "%s could not start: %s", WARM_HOOK, strerror((int)code));
    else if (timed_out)
        snprintf(why, sizeof(why), "%s did not finish within template_warm_timeout_seconds = %u",
                 WARM_HOOK, w->p->h->cfg->template_warm_timeout_s);
    else
        snprintf(why, sizeof(why), "%s exited %lld: %.160s", WARM_HOOK, (long long)code,
                 w->hook_out);
    /* The reason keeps the start; a hook that says more (kerneld's diagnosis of a kernel
     * that stopped answering) is logged whole, once per failed build. */
    if (w->hook_nout > 160)
        LOG(LOG_WARN, "pool: template %s: %s printed: %s", w->p->key, WARM_HOOK, w->hook_out);
    ws_done(w, -EIO, why);
}

static void ws_frame(void *ud, const struct proto_frame *f)
{
    struct wsess *w = ud;

    if (f->type == PROTO_PONG && w->stage == 0)
        ws_send_init(w);
    else if (f->type == PROTO_HELLO && f->id == WSESS_ID && w->stage == 1)
        ws_send_exec(w);
    else if (f->type == PROTO_OUT && f->id >= WSESS_ID + 1 && f->id <= WSESS_ID + 3 &&
             proto_has(f, PK_DATA)) {
        /* Output is dropped, its credit returned: a warm-up that prints more than the
         * window must not stall until the template's deadline. The hook's first bytes
         * are kept: they say why it failed. */
        size_t n = f->v[PK_DATA].s.len, room = sizeof(w->hook_out) - 1 - w->hook_nout;
        if (f->id == WSESS_ID + 3 && room > 0) {
            memcpy(w->hook_out + w->hook_nout, f->v[PK_DATA].s.p, n < room ? n : room);
            w->hook_nout += n < room ? n : room;
        }
        if (proto_send_credit(chan_tx(w->ch), f->id, n) == 0)
            chan_flush(w->ch);
    } else if ((f->type == PROTO_EXIT || f->type == PROTO_ERROR) && f->id == WSESS_ID + 3 &&
               w->stage == 5) {
        ws_hook_done(w, f);
    } else if ((f->type == PROTO_EXIT || f->type == PROTO_ERROR) && f->id == WSESS_ID + 2 &&
               w->stage == 4) {
        /* The pre command is a warm-up: its failure is the operator's to see, not a
         * reason to give up the template (or the pool VM: its own exec decides). */
        int64_t code = proto_has(f, PK_CODE) ? f->v[PK_CODE].i : -1;
        bool failed = f->type == PROTO_ERROR || code != 0;

        if (w->pre_logged && failed)
            LOG(LOG_WARN, "pool: template %s: its warm-up command %s %lld; saved anyway", w->p->key,
                f->type == PROTO_ERROR ? "could not start: errno" : "exited", (long long)code);
        else if (w->pre_logged)
            LOG(LOG_INFO, "pool: template %s: warm-up ran in %lld ms", w->p->key,
                (long long)(sbx_now_ms() - w->pre_start));
        ws_send_exec(w);
    } else if (f->type == PROTO_EXIT && f->id == WSESS_ID + 1 && w->stage == 2)
        ws_done(w, 0, "");
    else if (f->type == PROTO_ERROR && f->id == WSESS_ID + 1 && w->stage == 2)
        ws_done(w, -EIO, "the guest could not run the warm-up command");
}

static void ws_closed(void *ud, int err, const char *why)
{
    struct wsess *w = ud;

    chan_free(w->ch);
    w->ch = NULL;
    ws_done(w, -EPIPE, why);
}

/* Take a VM's channel fd for a session; pinging: a VM still booting. */
static int ws_start(struct wsess *w, int fd, bool pinging)
{
    static const struct chan_cbs cbs = {ws_frame, ws_closed};

    if (w->ch)
        chan_free(w->ch);
    w->ch = NULL;
    if (chan_new(w->p->h->loop, fd, &cbs, w, &w->ch) != 0) {
        close(fd);
        return -ENOMEM;
    }
    w->stage = 0;
    if (!pinging)
        ws_send_init(w);
    return 0;
}

/* ---- building the template (continued) ---- */

static void tpl_ping(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct tpool *p = w->data;
    struct proto_enc e;

    if (!p->tw.ch || p->tw.stage != 0) {
        ev_timer_stop(loop, w);
        return;
    }
    proto_enc_begin(&e, chan_tx(p->tw.ch), PROTO_PING, 1, 2);
    proto_enc_end(&e);
    chan_flush(p->tw.ch);
}

static void seal_work(void *arg)
{
    struct seal_job *j = arg;

    j->fd = vmm_mem_seal(j->mem);
}

static void seal_done(void *arg)
{
    struct seal_job *j = arg;
    struct tpool *p = j->p;

    if (!p || strcmp(p->id, j->id) != 0) { /* the pool or this template went meanwhile */
        if (j->fd >= 0)
            close(j->fd);
        free(j);
        return;
    }
    p->sealing = NULL;
    if (j->fd < 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot seal its RAM for jailed clones: %s", strerror(-j->fd));
        free(j);
        tpl_failed(p, why);
        return;
    }
    p->mem_fd = j->fd;
    free(j);
    p->state = TPL_READY;
    p->tries = 0;
    kick_soon(p, 0); /* ends the sealed VM, fills */
}

/* The template's snapshot and RAM file are complete: clones may be made, once (when
 * QEMU is jailed) its RAM is sealed into a memfd, which takes a copy of it on the bg
 * worker. */
static void tpl_ready(struct tpool *p)
{
    struct seal_job *j;

    /* A jailed clone (its own uid) opens the template's overlay read-only through a
     * bind mount of that one file (vmm_jail.c plan_chain); state_dir is 0700, so no
     * other host user reaches it. */
    if (p->h->jail && chmod(p->disk, 0644) != 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot make its overlay readable to jailed clones: %s",
                 strerror(errno));
        tpl_failed(p, why);
        return;
    }
    if (!p->h->jail) {
        p->state = TPL_READY;
        p->tries = 0;
        kick_soon(p, 0); /* ends the sealed VM, fills */
        return;
    }
    if (!(j = calloc(1, sizeof(*j)))) {
        tpl_failed(p, "out of memory");
        return;
    }
    j->p = p;
    snprintf(j->id, sizeof(j->id), "%s", p->id);
    snprintf(j->mem, sizeof(j->mem), "%s", p->mem);
    if (bg_run(p->h->bg, seal_work, seal_done, j) != 0) {
        free(j);
        tpl_failed(p, "cannot start sealing its RAM");
        return;
    }
    p->sealing = j;
}

static int tp_mem_fd(const struct tpool *p, const char *mem_path)
{
    return p->mem_fd > 0 && strcmp(mem_path, p->mem) == 0 ? p->mem_fd : 0;
}

static void tpl_saved(void *ud, int err, const char *why)
{
    struct tpool *p = ud;
    int r;

    if (err != 0) {
        tpl_failed(p, why);
        return;
    }
    /* SEALED: it may never run again; its RAM file and overlay are the clones' now. */
    if ((r = tpl_record(p)) != 0) {
        tpl_failed(p, "cannot record the template snapshot in the index");
        return;
    }
    LOG(LOG_INFO, "pool: template %s saved (VM %s, %.0f ms from launch): %s", p->key, p->id,
        (double)(sbx_now_ms() - p->t_start), p->snap);
    tpl_ready(p);
}

/* The template's agent answered and ran `sync`: save it. */
static void tpl_synced(struct tpool *p, int err, const char *why)
{
    char msg[300];
    int r;

    ev_timer_stop(p->h->loop, &p->ping);
    ev_timer_stop(p->h->loop, &p->deadline);
    if (p->state != TPL_BOOTING)
        return;
    if (err != 0) {
        snprintf(msg, sizeof(msg), "its sync session failed: %s", why);
        tpl_failed(p, msg);
        return;
    }
    p->state = TPL_SAVING;
    r = vmm_save(p->vmm, p->snap, 0, tpl_saved, p);
    if (r != 0)
        tpl_failed(p, "cannot start the save");
}

static void tpl_on_channel(void *ud, int fd)
{
    struct tpool *p = ud;

    if (p->state != TPL_BOOTING || ws_start(&p->tw, fd, true) != 0) {
        if (p->state != TPL_BOOTING)
            close(fd);
        return;
    }
    ev_timer_stop(p->h->loop, &p->ping); /* a reconnect: set only a stopped watcher */
    ev_timer_set(&p->ping, 0, TPL_PING_PERIOD);
    ev_timer_start(p->h->loop, &p->ping);
}

static void tpl_on_exited(void *ud, int status, const char *reason)
{
    struct tpool *p = ud;
    char why[300];

    p->vmm_gone = true;
    if (p->state != TPL_BOOTING && p->state != TPL_SAVING)
        return; /* the sealed VM ended on purpose, or a build that failed already */
    snprintf(why, sizeof(why), "template VM exited: %s", reason);
    tpl_failed(p, why);
}

static void tpl_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct tpool *p = w->data;
    char why[128];

    snprintf(why, sizeof(why), "the template's agent did not answer within %u s",
             p->h->cfg->boot_timeout_s);
    tpl_failed(p, why);
}

static void tpl_build(struct tpool *p)
{
    p->verified = false;
    spare_drop(p); /* started over the old template's files */
    static const struct vmm_cbs cbs = {tpl_on_channel, tpl_on_exited};
    const struct pool_host *h = p->h;
    struct vmm_config vc;
    char path[4096 + 16];
    char **wrap = NULL;
    struct net_policy pol = {0};
    uint8_t rnd[8];
    int r, fd;

    tpl_end_vm(p);
    tpl_remove(p);
    p->tries++;
    p->t_start = sbx_now_ms();
    if (sbx_ident_get(&p->base, p->base.path) != 0 || sbx_ident_get(&p->kernel, h->kernel) != 0 ||
        sbx_ident_get(&p->initrd, h->initrd) != 0) {
        tpl_failed(p, "its base image, kernel or initramfs is missing");
        return;
    }
    h->random(h->ctx, rnd, sizeof(rnd));
    snprintf(p->id, sizeof(p->id), "vm-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
             rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    tpl_paths(p);
    /* Made here, 0600: QEMU would create it 0644, every pooled guest's memory at
     * template time readable by any local user. The template runs unjailed (as
     * warrend's uid), unjailed clones too; jailed clones map a sealed memfd copy. */
    (void)unlink(p->mem);
    if ((fd = open(p->mem, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
        tpl_failed(p, "cannot create its RAM file");
        return;
    }
    close(fd);
    snprintf(path, sizeof(path), "%s/templates", h->cfg->state_dir);
    if ((mkdir(path, 0700) != 0 && errno != EEXIST) || mkdir(p->dir, 0700) != 0) {
        tpl_failed(p, "cannot make its directory");
        return;
    }
    if ((r = vmm_qcow2_create(p->disk, p->base.path, (uint64_t)p->base.size)) != 0) {
        tpl_failed(p, "cannot make its overlay");
        return;
    }
    h->vm_config_init(h->ctx, &vc, p->id, p->disk, p->dir, p->mem_mb, p->vcpus);
    vc.boot = VMM_BOOT_TEMPLATE;
    vc.mem_path = p->mem;
    /* With networking on, the template has the NIC and guest address every
     * clone restored from it will have (their devices must match). */
    pol.internet = h->cfg->net_default_internet != 0;
    r = h->net_config(h->ctx, p->id, &p->net_slot, &pol, &vc, &wrap);
    if (r == 0)
        r = vmm_launch(h->loop, &vc, &cbs, p, &p->vmm);
    net_wrap_free(wrap);
    if (r != 0) {
        char why[128];
        snprintf(why, sizeof(why), "cannot launch the template VM: %s", strerror(-r));
        tpl_failed(p, why);
        return;
    }
    p->state = TPL_BOOTING;
    ev_timer_set(&p->deadline, h->cfg->boot_timeout_s, 0);
    ev_timer_start(h->loop, &p->deadline);
    LOG(LOG_INFO, "pool: building template %s snapshot: VM %s pid %d, RAM in %s", p->key, p->id,
        (int)vmm_pid(p->vmm), p->mem);
}

static void on_retry(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct tpool *p = w->data;

    tpl_build(p);
}

/* ---- the pool ---- */

/* What a template's files take of pool_max_mb: its RAM file and, when jailed, its
 * sealed copy (at most as much again). */
static uint64_t tpl_mb(const struct pool_host *h, unsigned mem_mb)
{
    return h->jail ? 2ull * mem_mb : mem_mb;
}

static unsigned vms_held(const struct tpool *p)
{
    return p->nready + p->nspares + (p->filling != NULL);
}

/* MiB of pool_max_mb that every template and VM of all's holds, less except's VMs. */
static uint64_t pool_used_mb(const struct pool *all, const struct tpool *except)
{
    uint64_t used = 0;

    for (unsigned i = 0; i < all->n; i++)
        used += tpl_mb(all->h, all->tp[i]->mem_mb) +
                (all->tp[i] == except ? 0 : (uint64_t)POOL_VM_MB * vms_held(all->tp[i]));
    return used;
}

/* How many VMs p may hold: what pool_max_mb leaves after every template's files and
 * the other templates' VMs. */
static unsigned budget_vms(const struct tpool *p)
{
    uint64_t max = p->h->cfg->pool_max_mb, used = pool_used_mb(p->all, p);

    return used >= max ? 0 : (unsigned)((max - used) / POOL_VM_MB);
}

/* Forget the VM being filled: its timer and warm-up channel go, the VM is the
 * caller's. */
static void fill_forget(struct tpool *p)
{
    p->filling = NULL;
    p->fill_warming = false;
    ev_timer_stop(p->h->loop, &p->fill_timer);
    if (p->fw.ch) {
        chan_free(p->fw.ch);
        p->fw.ch = NULL;
    }
}

/* Drop the VM being filled (not from inside its own vmm callbacks' exited). */
static void fill_abort(struct tpool *p, const char *why, double retry_after)
{
    struct sbx_vm *vm = p->filling;

    fill_forget(p);
    if (vm) {
        LOGS(LOG_WARN, p->h->vm_id(vm), "pool: dropped: %s", why);
        p->h->vm_destroy(vm);
    }
    kick_soon(p, retry_after);
}

static void fill_stopped(void *ud, int err, const char *why)
{
    struct tpool *p = ud;
    struct sbx_vm *vm = p->filling;

    if (!vm)
        return;
    if (err != 0) {
        fill_abort(p, why, 1.0);
        return;
    }
    p->filling = NULL;
    p->fill_warming = false;
    ev_timer_stop(p->h->loop, &p->fill_timer);
    p->ready[p->nready++] = vm;
    p->exits = 0;
    LOGS(LOG_INFO, p->h->vm_id(vm), "pool: %s: ready (%u of %u; %.0f ms from launch)", p->key,
         p->nready, p->size, (double)(sbx_now_ms() - p->fill_start));
    pool_fill(p);
}

/* The warm-up ran: close our session, stop the vCPUs until the hand-out. */
static void fill_warmed(struct tpool *p, int err, const char *why)
{
    struct sbx_vm *vm = p->filling;
    char msg[300];

    if (p->fw.ch) {
        chan_free(p->fw.ch); /* deferred when inside its callback */
        p->fw.ch = NULL;
    }
    if (!vm)
        return;
    if (err != 0 || vmm_stop(p->h->vm_vmm(vm), fill_stopped, p) != 0) {
        snprintf(msg, sizeof(msg), "warm-up failed: %s", err ? why : "cannot stop it");
        fill_abort(p, msg, 1.0);
    }
}

static void fill_cont(void *ud, int err, const char *why)
{
    struct tpool *p = ud;

    if (err != 0 && p->filling)
        fill_abort(p, why, 1.0);
}

static void fill_restored(void *ud, int err, const char *why)
{
    struct tpool *p = ud;
    struct sbx_vm *vm = p->filling;

    if (!vm)
        return;
    if (err == -EINVAL) {
        /* The snapshot itself is refused (corrupt, truncated, mismatched): never used. */
        LOG(LOG_WARN, "pool: template %s snapshot %s refused: %s; rebuilding it", p->key, p->snap,
            why);
        fill_abort(p, "its snapshot was refused", 0);
        p->rebuilds++;
        p->tries = 0;
        tpl_build(p);
        return;
    }
    if (err != 0) {
        fill_abort(p, why, 1.0);
        return;
    }
    p->verified = true;
    /* Run it once, through a session of ours, then stop it again (fill_warmed). */
    p->fill_warming = true;
    if (vmm_cont(p->h->vm_vmm(vm), fill_cont, p) != 0 ||
        vmm_channel_reconnect(p->h->vm_vmm(vm)) != 0)
        fill_abort(p, "cannot run it for its warm-up", 1.0);
}

static void on_fill_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct tpool *p = w->data;

    fill_abort(p, "restore or warm-up did not finish in time", 1.0);
}

static bool tp_vm_channel(struct tpool *p, struct sbx_vm *vm, int fd)
{
    if (p->filling != vm || !p->fill_warming)
        return false;
    if (ws_start(&p->fw, fd, false) != 0)
        fill_abort(p, "cannot set up its channel", 1.0);
    return true;
}

/* true if p is deferred from now on */
static bool tp_defer(struct tpool *p)
{
    ev_tstamp now;

    if (ev_is_active(&p->defer))
        return false;
    /* One deferral at a time, and never two in a row: creates that keep finding the
     * pool empty must not keep it from refilling. */
    now = ev_now(p->h->loop);
    if (now < p->defer_end + POOL_DEFER_S)
        return false;
    p->defer_end = now + POOL_DEFER_S;
    ev_timer_set(&p->defer, POOL_DEFER_S, 0);
    ev_timer_start(p->h->loop, &p->defer);
    return true;
}

static void tp_undefer(struct tpool *p)
{
    if (ev_is_active(&p->defer)) {
        ev_timer_stop(p->h->loop, &p->defer);
        p->defer_end = ev_now(p->h->loop);
        kick_soon(p, 0);
    }
}

static void on_defer(struct ev_loop *loop, ev_timer *w, int revents)
{
    kick_soon(w->data, 0);
}

/* The pool is full: start one more spare QEMU, if pool_spares wants it, the budget
 * has room for one more VM and a restore from this template has worked. The next is
 * started from the loop's next turn (each launch is spent on the loop). */
static void spare_start(struct tpool *p)
{
    struct sbx_vm *vm;
    unsigned want = p->h->cfg->pool_spares < POOL_MAX ? p->h->cfg->pool_spares : POOL_MAX;
    int r;

    if (p->nspares >= want || !p->verified || budget_vms(p) <= p->size + p->nspares)
        return;
    if (p->h->vm_new(p->h->ctx, p->tmpl, p->mem_mb, p->vcpus, &vm) != 0)
        return;
    if ((r = p->h->vm_start_restore(vm, p->disk, p->mem)) != 0) {
        LOGS(LOG_WARN, p->h->vm_id(vm), "pool: cannot start the spare QEMU: %s",
             strerror(r < 0 ? -r : r));
        p->h->vm_destroy(vm);
        return;
    }
    /* Its TCG buffer touched ahead once it is up (vmm.h vmm_prefault_tcg). */
    if (p->h->cfg->pool_spare_prefault_mb &&
        (r = vmm_prefault_tcg(p->h->vm_vmm(vm),
                              (uint64_t)p->h->cfg->pool_spare_prefault_mb << 20)) != 0)
        LOGS(LOG_WARN, p->h->vm_id(vm), "pool: cannot touch the spare's TCG buffer ahead: %s",
             strerror(-r));
    p->spares[p->nspares++] = vm;
    if (p->nspares < want)
        kick_soon(p, 0.05);
}

static void spare_drop(struct tpool *p)
{
    while (p->nspares)
        p->h->vm_destroy(p->spares[--p->nspares]);
}

/* Start one more VM if the pool is short and nothing else is filling it; the spare
 * QEMU once it is full. */
static void pool_fill(struct tpool *p)
{
    struct sbx_vm *vm;
    unsigned want = p->size < budget_vms(p) ? p->size : budget_vms(p);
    int r;

    if (p->state != TPL_READY || p->filling || ev_is_active(&p->defer))
        return;
    if (p->nready >= want) {
        spare_start(p);
        return;
    }
    r = p->h->vm_new(p->h->ctx, p->tmpl, p->mem_mb, p->vcpus, &vm);
    if (r != 0) {
        LOG(LOG_WARN, "pool: cannot make a VM record: %s", strerror(-r));
        kick_soon(p, 5.0);
        return;
    }
    p->fill_start = sbx_now_ms();
    if ((r = p->h->vm_start_restore(vm, p->disk, p->mem)) != 0 ||
        (r = vmm_restore(p->h->vm_vmm(vm), p->snap, fill_restored, p)) != 0) {
        LOGS(LOG_WARN, p->h->vm_id(vm), "pool: cannot start a VM: %s", strerror(r < 0 ? -r : r));
        p->h->vm_destroy(vm);
        kick_soon(p, 5.0);
        return;
    }
    p->filling = vm;
    ev_timer_set(&p->fill_timer, p->h->cfg->boot_timeout_s, 0);
    ev_timer_start(p->h->loop, &p->fill_timer);
}

static void on_kick(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct tpool *p = w->data;

    while (p->ndead)
        p->h->vm_destroy(p->dead[--p->ndead]);
    /* The template VM, sealed or failed: nothing more to do with it. */
    if (p->vmm && (p->state == TPL_READY || p->state == TPL_NONE))
        tpl_end_vm(p);
    pool_fill(p);
}

static bool drop_from(struct sbx_vm **arr, unsigned *n, struct sbx_vm *vm)
{
    for (unsigned i = 0; i < *n; i++) {
        if (arr[i] == vm) {
            memmove(&arr[i], &arr[i + 1], (*n - i - 1) * sizeof(*arr));
            (*n)--;
            return true;
        }
    }
    return false;
}

/* The oldest spare past its start-up (QMP ready: QEMU has opened its files), the
 * caller's from then on, or NULL; another follows. */
static struct sbx_vm *spare_up_take(struct tpool *p)
{
    for (unsigned i = 0; i < p->nspares; i++) {
        struct sbx_vm *vm = p->spares[i];
        if (p->h->vm_up(vm) && vmm_qmp_ready(p->h->vm_vmm(vm))) {
            double ms;
            uint64_t b = vmm_prefault_touched(p->h->vm_vmm(vm), &ms);
            if (b)
                LOGS(LOG_DEBUG, p->h->vm_id(vm),
                     "pool: spare taken, %.1f MiB of its TCG buffer touched ahead%s", b / 1048576.0,
                     ms >= 0 ? "" : " (not finished)");
            drop_from(p->spares, &p->nspares, vm);
            kick_soon(p, 0.05);
            return vm;
        }
    }
    return NULL;
}

/* A spare for a clone: one past its start-up, else the newest (its start then goes
 * into the create), or NULL. */
static struct sbx_vm *spare_pop(struct tpool *p)
{
    struct sbx_vm *vm;

    if (!p->nspares)
        return NULL;
    if ((vm = spare_up_take(p)))
        return vm;
    kick_soon(p, 0.05);
    return p->spares[--p->nspares];
}

static bool tp_vm_exited(struct tpool *p, struct sbx_vm *vm)
{
    double delay;

    if (p->filling == vm)
        fill_forget(p);
    else if (!drop_from(p->spares, &p->nspares, vm) && !drop_from(p->ready, &p->nready, vm))
        return false;
    /* Replaced at once the first time; if they keep exiting (a VM that cannot start),
     * after 1, 2, 4 ... 32 s: never a loop of launches. */
    delay = p->exits ? (double)(1u << (p->exits - 1 < 5 ? p->exits - 1 : 5)) : 0;
    p->exits++;
    LOGS(LOG_WARN, p->h->vm_id(vm), "pool: a waiting VM exited; replacing it in %.0f s", delay);
    if (p->ndead < POOL_MAX)
        p->dead[p->ndead++] = vm;
    kick_soon(p, delay);
    return true;
}

static struct sbx_vm *tp_take(struct tpool *p)
{
    struct sbx_vm *vm;

    if (p->state != TPL_READY || p->nready == 0)
        return NULL;
    vm = p->ready[0];
    memmove(&p->ready[0], &p->ready[1], (p->nready - 1) * sizeof(p->ready[0]));
    p->nready--;
    p->handed_out++;
    /* Refill after this create has answered: the launch is spent on the loop. */
    kick_soon(p, 0.05);
    return vm;
}

static struct sbx_vm *tp_spare_take(struct tpool *p, const char *mem, const char *backing)
{
    struct stat a, b;

    if (p->state != TPL_READY || !p->verified || !p->nspares || strcmp(mem, p->mem) != 0 ||
        stat(backing, &a) != 0 || stat(p->disk, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino)
        return NULL;
    /* Only one past its start-up: the caller rewrites its overlay, which a QEMU still
     * starting may be reading (a torn header: measured). */
    return spare_up_take(p);
}

static void tp_stats(const struct tpool *p, struct sbx_pool_rec *r)
{
    unsigned up = 0;      /* spares past their start-up (pool_spare_take) */
    unsigned touched = 0; /* spares whose TCG buffer was touched ahead (spare_start) */
    double ms;

    for (unsigned i = 0; i < p->nspares; i++) {
        up += p->h->vm_vmm(p->spares[i]) && vmm_qmp_ready(p->h->vm_vmm(p->spares[i]));
        touched += vmm_prefault_touched(p->h->vm_vmm(p->spares[i]), &ms) > 0 && ms >= 0;
    }
    *r = (struct sbx_pool_rec){.tmpl = p->tmpl,
                               .mem_mb = p->mem_mb,
                               .vcpus = p->vcpus,
                               .state = tpl_state_names[p->state],
                               .size = p->size,
                               .ready = p->nready,
                               .filling = p->filling != NULL,
                               .handed_out = p->handed_out,
                               .rebuilds = p->rebuilds,
                               .spare = p->nspares > 0,
                               .spares = p->nspares,
                               .spares_ready = up,
                               .spares_prefaulted = touched};
}

static void tp_key(const struct srv_config *c, const char *tmpl, unsigned mem_mb, unsigned vcpus,
                   char *out, size_t cap)
{
    if (mem_mb == c->default_memory_mb && vcpus == c->default_vcpus)
        snprintf(out, cap, "%s", tmpl);
    else
        snprintf(out, cap, "%s@%um%uc", tmpl, mem_mb, vcpus);
}

/* A pool for this template and shape, not started (tp_start), its recorded snapshot's
 * files named when there is one; NULL (logged) when the template has no image. */
static struct tpool *tp_new(struct pool *all, const char *tmpl, unsigned mem_mb, unsigned vcpus)
{
    const struct pool_host *h = all->h;
    const struct srv_config *c = h->cfg;
    struct tpool *p;
    char base[4096 + 200];

    if (!sbx_template_name_ok(tmpl)) {
        LOG(LOG_WARN, "pool: '%s' is not a template name", tmpl);
        return NULL;
    }
    if (!(p = calloc(1, sizeof(*p))))
        return NULL;
    p->h = h;
    p->all = all;
    p->net_slot = -1;
    snprintf(p->tmpl, sizeof(p->tmpl), "%s", tmpl);
    tp_key(c, tmpl, mem_mb, vcpus, p->key, sizeof(p->key));
    p->size = c->pool_size < POOL_MAX ? c->pool_size : POOL_MAX;
    p->mem_mb = mem_mb;
    p->vcpus = vcpus;
    ev_timer_init(&p->ping, tpl_ping, 0, TPL_PING_PERIOD);
    ev_timer_init(&p->deadline, tpl_deadline, 1, 0);
    ev_timer_init(&p->retry, on_retry, 1, 0);
    ev_timer_init(&p->kick, on_kick, 0, 0);
    ev_timer_init(&p->defer, on_defer, 0, 0);
    ev_timer_init(&p->fill_timer, on_fill_timer, 1, 0);
    p->ping.data = p->deadline.data = p->retry.data = p->kick.data = p->fill_timer.data = p;
    p->defer.data = p;
    p->tw = (struct wsess){.p = p,
                           .pre = c->pool_template_warmup,
                           .pre_logged = true,
                           .hook = true,
                           .cmd = "sync",
                           .done = tpl_synced};
    p->fw =
        (struct wsess){.p = p, .pre = "true", .cmd = "true", .cmd_argv = true, .done = fill_warmed};
    snprintf(base, sizeof(base), "%s/%s.ext4", h->image_dir, p->tmpl);
    if (sbx_ident_get(&p->base, base) != 0 || sbx_ident_get(&p->kernel, h->kernel) != 0 ||
        sbx_ident_get(&p->initrd, h->initrd) != 0) {
        LOG(LOG_WARN, "pool: no pool for template %s: it has no image (%s)", p->tmpl, base);
        free(p);
        return NULL;
    }
    return p;
}

/* Build p's template snapshot, or reuse the recorded one (why: tpl_check_record's). */
static void tp_start(struct tpool *p, const char *why)
{
    if (budget_vms(p) < p->size)
        LOG(LOG_WARN,
            "pool: %s: pool_max_mb = %u holds %u VM(s) of %u (templates %llu MiB, %u MiB each)",
            p->key, p->h->cfg->pool_max_mb, budget_vms(p), p->size,
            (unsigned long long)pool_used_mb(p->all, p), POOL_VM_MB);
    if (why && strcmp(why, "none recorded") == 0) {
        tpl_build(p);
    } else if (why) {
        LOG(LOG_WARN, "pool: template %s snapshot not used: %s; rebuilding it", p->key, why);
        p->rebuilds++;
        tpl_build(p);
    } else {
        /* Used only if the first restore accepts it (fill_restored). */
        LOG(LOG_INFO, "pool: reusing template %s snapshot %s", p->key, p->snap);
        tpl_ready(p);
    }
}

static struct tpool *pool_find(const struct pool *all, const char *tmpl, unsigned mem_mb,
                               unsigned vcpus)
{
    for (unsigned i = 0; all && i < all->n; i++) {
        struct tpool *p = all->tp[i];
        if (strcmp(p->tmpl, tmpl) == 0 && p->mem_mb == mem_mb && p->vcpus == vcpus)
            return p;
    }
    return NULL;
}

static unsigned templates_max(const struct srv_config *c)
{
    return c->pool_max_templates < POOL_TEMPLATES_MAX ? c->pool_max_templates : POOL_TEMPLATES_MAX;
}

/* Add a pool for this template and shape, unless there is one, or no room (in
 * pool_max_templates, or in pool_max_mb for its template and one VM: logged once per
 * shape); its record's check (tpl_check_record) in *why. */
static struct tpool *pool_add(struct pool *all, const char *tmpl, unsigned mem_mb, unsigned vcpus,
                              const char **why)
{
    const struct srv_config *c = all->h->cfg;
    uint64_t need = tpl_mb(all->h, mem_mb) + POOL_VM_MB;
    char key[96], reason[160] = "";
    struct tpool *p;

    if (pool_find(all, tmpl, mem_mb, vcpus))
        return NULL;
    tp_key(c, tmpl, mem_mb, vcpus, key, sizeof(key));
    if (all->n >= templates_max(c))
        snprintf(reason, sizeof(reason), "pool_max_templates = %u reached", templates_max(c));
    else if (pool_used_mb(all, NULL) + need > c->pool_max_mb)
        snprintf(reason, sizeof(reason),
                 "pool_max_mb = %u has no room for its RAM file and a VM (%llu MiB)",
                 c->pool_max_mb, (unsigned long long)need);
    if (reason[0]) {
        /* Logged once per shape, for the first pool_max_templates shapes: a client
         * choosing a new memory size for each create cannot fill the log. */
        for (unsigned i = 0; i < all->nrefused; i++)
            if (strcmp(all->refused[i], key) == 0)
                return NULL;
        if (all->nrefused < templates_max(c)) {
            LOG(LOG_WARN, "pool: no pool for template %s: %s; its creates boot", key, reason);
            snprintf(all->refused[all->nrefused++], sizeof(all->refused[0]), "%s", key);
        } else if (!all->refused_more) {
            LOG(LOG_WARN,
                "pool: no pool for template %s either (%s); other shapes refused a "
                "pool are not logged",
                key, reason);
            all->refused_more = true;
        }
        return NULL;
    }
    if (!(p = tp_new(all, tmpl, mem_mb, vcpus)))
        return NULL;
    *why = tpl_check_record(p);
    all->tp[all->n++] = p;
    return p;
}

void pool_first_use(struct pool *all, const char *tmpl, unsigned mem_mb, unsigned vcpus)
{
    const char *why = NULL;
    struct tpool *p;

    if (!all || !all->h->cfg->pool_on_first_use || !(p = pool_add(all, tmpl, mem_mb, vcpus, &why)))
        return;
    LOG(LOG_INFO,
        "pool: first create of template %s: building its pool (creates boot until it "
        "is ready)",
        p->key);
    tp_start(p, why);
}

/* A template record as pool_new weighs it: its key and the shape it names. */
struct tpl_seen {
    char *key, *tmpl; /* tmpl NULL: none */
    int64_t mem_mb, vcpus;
};

struct tpl_list {
    struct tpl_seen *v;
    size_t n, cap;
};

static int list_one(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct tpl_list *l = ud;
    struct rec_tpl r;
    struct tpl_seen *e;
    bool ok = rec_tpl_decode(val, vlen, &r) == 0;

    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 8;
        struct tpl_seen *v = realloc(l->v, cap * sizeof(*v));
        if (!v) {
            if (ok)
                rec_tpl_free(&r);
            return 0;
        }
        l->v = v;
        l->cap = cap;
    }
    e = &l->v[l->n];
    *e = (struct tpl_seen){.key = strndup(key, klen)};
    if (ok) {
        e->tmpl = r.tmpl ? strdup(r.tmpl) : NULL;
        e->mem_mb = r.mem_mb;
        e->vcpus = r.vcpus;
        rec_tpl_free(&r);
    }
    if (e->key)
        l->n++;
    return 0;
}

static void tpl_list_free(struct tpl_list *l)
{
    for (size_t i = 0; i < l->n; i++) {
        free(l->v[i].key);
        free(l->v[i].tmpl);
    }
    free(l->v);
}

int pool_new(const struct pool_host *h, struct pool **out)
{
    const struct srv_config *c = h->cfg;
    const char *whys[POOL_TEMPLATES_MAX] = {0};
    struct tpl_list recs = {0};
    struct pool *all;

    *out = NULL;
    /* Every template record in the index, read before any is removed. */
    idx_foreach(h->idx, IDX_TEMPLATES, list_one, &recs);
    if (c->pool_size == 0 || !(all = calloc(1, sizeof(*all)))) {
        /* What a pool of an earlier start left after a crash. */
        tpl_sweep(h, NULL);
        for (size_t i = 0; i < recs.n; i++)
            if (idx_del(h->idx, IDX_TEMPLATES, recs.v[i].key) == 0)
                h->idx_changed(h->ctx);
        tpl_list_free(&recs);
        return c->pool_size == 0 ? 0 : -ENOMEM;
    }
    all->host = *h;
    all->h = &all->host;
    /* The default template's, then pool_templates' (at each one's default shape), then
     * those a crash left recorded (made on first use before it). */
    pool_add(all, c->default_template, cfg_template_memory_mb(c, c->default_template),
             c->default_vcpus, &whys[all->n]);
    if (c->pool_templates) {
        char list[1024], *save = NULL;
        snprintf(list, sizeof(list), "%s", c->pool_templates);
        for (char *n = strtok_r(list, " ,\t", &save); n; n = strtok_r(NULL, " ,\t", &save)) {
            char alias[64];
            if (cfg_tmap_get(c->template_aliases, n, alias, sizeof(alias)))
                n = alias;
            pool_add(all, n, cfg_template_memory_mb(c, n), c->default_vcpus, &whys[all->n]);
        }
    }
    for (size_t i = 0; i < recs.n; i++) {
        const char *tmpl = recs.v[i].tmpl, *key = recs.v[i].key;
        int64_t mem = recs.v[i].mem_mb, vcpus = recs.v[i].vcpus;
        char want[96];
        bool kept = false;

        /* A pool made on first use, recorded under the key its own shape gives. */
        if (tmpl && mem > 0 && mem <= UINT_MAX && vcpus > 0 && vcpus <= UINT_MAX &&
            c->pool_on_first_use) {
            tp_key(c, tmpl, (unsigned)mem, (unsigned)vcpus, want, sizeof(want));
            if (strcmp(want, key) == 0)
                pool_add(all, tmpl, (unsigned)mem, (unsigned)vcpus, &whys[all->n]);
        }
        for (unsigned k = 0; k < all->n; k++)
            kept |= strcmp(all->tp[k]->key, key) == 0;
        if (!kept && idx_del(h->idx, IDX_TEMPLATES, key) == 0)
            h->idx_changed(h->ctx);
    }
    tpl_list_free(&recs);
    tpl_sweep(h, all);
    for (unsigned k = 0; k < all->n; k++)
        tp_start(all->tp[k], whys[k]);
    *out = all;
    return 0;
}

struct sbx_vm *pool_take(struct pool *all, const char *tmpl, unsigned mem_mb, unsigned vcpus)
{
    struct tpool *p = pool_find(all, tmpl, mem_mb, vcpus);

    return p ? tp_take(p) : NULL;
}

bool pool_template(struct pool *all, const char *tmpl, unsigned mem_mb, unsigned vcpus,
                   const char **snap, const char **disk, const char **mem, struct sbx_vm **spare)
{
    struct tpool *p = pool_find(all, tmpl, mem_mb, vcpus);

    if (!p || p->state != TPL_READY || !p->verified)
        return false;
    *snap = p->snap;
    *disk = p->disk;
    *mem = p->mem;
    if (spare)
        *spare = spare_pop(p);
    return true;
}

struct sbx_vm *pool_spare_take(struct pool *all, const char *mem, const char *backing)
{
    struct sbx_vm *vm;

    for (unsigned i = 0; all && i < all->n; i++)
        if ((vm = tp_spare_take(all->tp[i], mem, backing)))
            return vm;
    return NULL;
}

void pool_defer(struct pool *all)
{
    bool any = false;

    for (unsigned i = 0; all && i < all->n; i++)
        any |= tp_defer(all->tp[i]);
    if (any)
        LOG(LOG_INFO, "pool: refill deferred while a create restores a clone");
}

void pool_undefer(struct pool *all)
{
    for (unsigned i = 0; all && i < all->n; i++)
        tp_undefer(all->tp[i]);
}

bool pool_vm_channel(struct pool *all, struct sbx_vm *vm, int fd)
{
    for (unsigned i = 0; all && i < all->n; i++)
        if (tp_vm_channel(all->tp[i], vm, fd))
            return true;
    return false;
}

void pool_vm_exited(struct pool *all, struct sbx_vm *vm)
{
    for (unsigned i = 0; all && i < all->n; i++)
        if (tp_vm_exited(all->tp[i], vm))
            return;
}

int pool_mem_fd(const struct pool *all, const char *mem_path)
{
    int fd;

    for (unsigned i = 0; all && i < all->n; i++)
        if ((fd = tp_mem_fd(all->tp[i], mem_path)) > 0)
            return fd;
    return 0;
}

size_t pool_template_stats(const struct pool *all, const char *tmpl, struct sbx_pool_rec *out,
                           size_t cap)
{
    size_t n = 0;

    for (unsigned i = 0; all && i < all->n && n < cap; i++)
        if (strcmp(all->tp[i]->tmpl, tmpl) == 0)
            tp_stats(all->tp[i], &out[n++]);
    return n;
}

void pool_stats(const struct pool *all, struct sbx_pool_stats *out)
{
    const struct srv_config *c;
    struct tpool *dflt;

    memset(out, 0, sizeof(*out));
    if (!all)
        return;
    c = all->h->cfg;
    out->on = true;
    out->default_tmpl = c->default_template;
    dflt = pool_find(all, c->default_template, cfg_template_memory_mb(c, c->default_template),
                     c->default_vcpus);
    if (dflt) {
        out->has_default = true;
        tp_stats(dflt, &out->dflt);
    }
    for (unsigned i = 0; i < all->n && out->npools < SBX_POOLS_MAX; i++)
        tp_stats(all->tp[i], &out->pools[out->npools++]);
}

static void tp_free(struct tpool *p)
{
    if (!p)
        return;
    ev_timer_stop(p->h->loop, &p->retry);
    ev_timer_stop(p->h->loop, &p->kick);
    ev_timer_stop(p->h->loop, &p->defer);
    ev_timer_stop(p->h->loop, &p->fill_timer);
    if (p->fw.ch)
        chan_free(p->fw.ch);
    tpl_end_vm(p);
    while (p->nready)
        p->h->vm_destroy(p->ready[--p->nready]);
    while (p->ndead)
        p->h->vm_destroy(p->dead[--p->ndead]);
    if (p->filling)
        p->h->vm_destroy(p->filling);
    spare_drop(p);
    /* Clean shutdown: the template goes too (its RAM file lives in /dev/shm, i.e. in
     * RAM); the next start builds it again. Clones still running hold it open. */
    tpl_remove(p);
    free(p);
}

void pool_free(struct pool *all)
{
    if (!all)
        return;
    for (unsigned i = 0; i < all->n; i++)
        tp_free(all->tp[i]);
    free(all);
}
