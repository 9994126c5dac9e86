/*
 * sbx.c - the sandbox table: create, adopt after a restart, end, reap,
 * persist (see sbx.h and sbx_int.h).
 *
 * State machine: STARTING (VM launched, waiting for the guest's HELLO)
 * -> RUNNING (<-> FROZEN when idle, sbx_freeze.c) -> ENDED (deleted, TTL,
 * idle) or DEAD (the VM died or never booted). Ended and dead sandboxes stay
 * visible for ended_retention_seconds so GET can say why they ended, then the
 * reaper purges them.
 */
#include "sbx_int.h"
#include "log.h"
#include "util.h"
#include "net.h"
#include "pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void sandbox_end(struct sandbox *sb, enum sbx_state state, const char *reason);

static int64_t clock_ms(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t sbx_now_ms(void)
{
    return clock_ms(CLOCK_MONOTONIC);
}

int64_t sbx_wall_ms(void)
{
    return clock_ms(CLOCK_REALTIME);
}

/* The monotonic clock restarts with the host: the index keeps wall times and
 * they are converted at save and restore. */
static int64_t mono_to_wall(int64_t mono)
{
    return sbx_wall_ms() + (mono - sbx_now_ms());
}

static int64_t wall_to_mono(int64_t wall)
{
    return sbx_now_ms() + (wall - sbx_wall_ms());
}

/* Move sb to state `to` if the lifecycle allows it (sbx_state.h): 0, or -EINVAL with
 * the refusal logged and the state unchanged. */
static int sandbox_state_set(struct sandbox *sb, enum sbx_state to)
{
    if (sbx_state_check(sb->state, to) != 0) {
        LOGS(LOG_ERR, sb->id, "refused state change %s -> %s", sbx_state_name(sb->state),
             sbx_state_name(to));
        return -EINVAL;
    }
    sb->state = to;
    return 0;
}

int sbx_state_set(struct sandbox *sb, enum sbx_state to)
{
    return sandbox_state_set(sb, to);
}

void sbx_random(struct sbx_table *t, void *p, size_t n)
{
    if (mbedtls_ctr_drbg_random(&t->drbg, p, n) != 0)
        abort(); /* a DRBG failure means no safe ids or guest entropy: do not go on */
}

void sbx_new_id(struct sbx_table *t, const char *kind, char out[SBX_ID_CAP])
{
    uint8_t r[8];
    const char *host = t->cfg->host_id && t->cfg->host_id[0] ? t->cfg->host_id : NULL;

    sbx_random(t, r, sizeof(r));
    snprintf(out, SBX_ID_CAP, "%s-%s%s%02x%02x%02x%02x%02x%02x%02x%02x", kind, host ? host : "",
             host ? "-" : "", r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7]);
}

struct sandbox *sbx_find(struct sbx_table *t, const char *id)
{
    for (struct sandbox *sb = t->sandboxes; sb; sb = sb->next)
        if (strcmp(sb->id, id) == 0)
            return sb;
    return NULL;
}

void sbx_touch(struct sandbox *sb)
{
    sb->active_mono = sbx_now_ms();
}

static int not_found(const char *id, struct sbx_err *err)
{
    return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox with id '%s'", id);
}

/* The sandbox if it exists and has not ended: 0 and *out, or SBX_E_NOT_FOUND, SBX_E_GONE or
 * SBX_E_DEAD with *err. */
static int sbx_alive(struct sbx_table *t, const char *id, struct sandbox **out, struct sbx_err *err)
{
    struct sandbox *sb = sbx_find(t, id);

    if (!sb)
        return not_found(id, err);
    if (sbx_state_final(sb->state)) {
        return sbx_err_set(err, sb->state == ST_DEAD ? SBX_E_DEAD : SBX_E_GONE,
                           "sandbox %s is %s: %s", sb->id, sbx_state_name(sb->state), sb->reason);
    }
    *out = sb;
    return 0;
}

int sbx_usable(struct sbx_table *t, const char *id, struct sandbox **out, struct sbx_err *err)
{
    struct sandbox *sb;
    int status = sbx_alive(t, id, &sb, err);

    if (status)
        return status;
    /* A paused sandbox comes back (sbx_snap.c); this request is asked to retry. */
    if (sb->state == ST_PAUSED) {
        if ((status = sbx_resume_start(sb, err)))
            return status;
        return sbx_err_set(err, SBX_E_NOT_READY,
                           "sandbox %s was paused and is resuming now; try again shortly", sb->id);
    }
    /* A frozen VM continues before the request's frame is sent (sbx_freeze.c). */
    if (sbx_state_stopped(sb->state) && sb->ready && sb->ch && (status = sbx_thaw(sb, true)))
        return sbx_err_set(err, SBX_E_INTERNAL, "sandbox %s: cannot continue its frozen VM: %s",
                           sb->id, strerror(-status));
    if (!sbx_state_accepts_ops(sb->state) || !sb->ready || !sb->ch) {
        return sbx_err_set(err, SBX_E_NOT_READY, "sandbox %s is %s; try again shortly", sb->id,
                           sb->state == ST_STARTING ? "starting" : "reconnecting to its guest");
    }
    sbx_touch(sb);
    *out = sb;
    return 0;
}

/* ---- records ---- */

void sbx_net_rec_of(const struct net_policy *p, struct sbx_net_rec *r)
{
    *r = (struct sbx_net_rec){.internet = p->internet,
                              .allow_out = p->allow_out,
                              .allow_names = p->allow_names,
                              .deny_out = p->deny_out,
                              .deny_names = p->deny_names,
                              .rate_mbit = p->rate_mbit,
                              .max_connections = p->max_conns};
}

void sbx_rec_of(const struct sandbox *sb, struct sbx_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->id = sb->id;
    r->tmpl = sb->tmpl;
    r->state = sbx_state_shown(sb->state);
    r->created_ms = sb->created_ms;
    r->expires_ms = sb->expires_ms;
    r->idle_s = sb->idle_s;
    r->mem_mb = sb->mem_mb;
    r->vcpus = sb->vcpus;
    r->metadata = sb->metadata.v;
    r->nmetadata = sb->metadata.n;
    r->vm_id = sb->vm_id[0] ? sb->vm_id : NULL;
    r->frozen = sbx_state_stopped(sb->state);
    r->paged_out = sbx_state_stopped(sb->state) && sb->paged_out;
    r->keep_running = sb->keep_running;
    /* Its egress policy, when networking is on (off: the VM has no NIC at all). */
    if (sb->t->net && sb->vmr) {
        r->has_network = true;
        sbx_net_rec_of(&sb->vmr->pol, &r->network);
    }
    r->persistent = sb->persistent;
    r->auto_pause = sb->auto_pause;
    r->public_ports = sb->public_ports;
    r->npublic = sb->npublic;
    r->paused = sb->state == ST_PAUSED;
    r->paused_ms = sb->paused_ms;
    /* Where its VM came from: handed out by the warm pool, or booted for it. */
    /* "clone": restored from the pool's template for this create, the pool being empty. */
    r->source = sb->snap_id[0]                                   ? "snapshot"
                : sb->vmr && strcmp(sb->vmr->boot, "pool") == 0  ? "pool"
                : sb->vmr && strcmp(sb->vmr->boot, "clone") == 0 ? "clone"
                                                                 : "boot";
    r->snapshot_id = sb->snap_id[0] ? sb->snap_id : NULL;
    r->ended = sbx_state_final(sb->state);
    r->ended_ms = sb->ended_ms;
    r->end_reason = sb->reason;
}

/* The index keeps what GET shows plus the id of its VM, whose own record (the vms
 * table) holds what a restart needs to re-adopt it. */
int sbx_save(struct sandbox *sb)
{
    struct rec_sandbox rec = {.id = sb->id,
                              .tmpl = sb->tmpl,
                              .state = sbx_state_name(sb->state),
                              .reason = sb->reason,
                              .vm_id = sb->vm_id,
                              .created_ms = sb->created_ms,
                              .expires_ms = sb->expires_ms,
                              .ended_ms = sb->ended_ms,
                              .last_active_ms = mono_to_wall(sb->active_mono),
                              .idle_s = sb->idle_s,
                              .mem_mb = sb->mem_mb,
                              .vcpus = sb->vcpus,
                              .env = sb->env,
                              .metadata = sb->metadata,
                              .keep_running = sb->keep_running,
                              .persistent = sb->persistent,
                              .auto_pause = sb->auto_pause,
                              .npublic = sb->npublic,
                              .snapshot_id = sb->snap_id,
                              .ttl_s = sb->ttl_s,
                              .paused_ms = sb->paused_ms};
    char *s;
    int r;

    memcpy(rec.public_ports, sb->public_ports, sb->npublic * sizeof(sb->public_ports[0]));
    s = rec_sandbox_encode(&rec);
    r = s ? idx_put(sb->t->idx, IDX_SANDBOXES, sb->id, s, strlen(s)) : -ENOMEM;

    if (r != 0)
        LOGS(LOG_ERR, sb->id, "cannot save to the index: %s", idx_strerror(r));
    else
        sb->t->idx_dirty = true;
    free(s);
    return r;
}

/* ---- run directory ---- */

/* Remove a sandbox's files. keep_logs keeps console.log and qemu.log (a dead sandbox's
 * only witnesses) until the record is purged. */
static bool is_log(const char *name)
{
    return !strcmp(name, "console.log") || !strcmp(name, "qemu.log");
}

static void remove_run_dir(const char *dir, bool keep_logs)
{
    util_rm_dir(dir, keep_logs ? is_log : NULL);
}

struct rm_job {
    bool keep_logs;
    char dir[];
};

static void rm_work(void *arg)
{
    struct rm_job *j = arg;

    remove_run_dir(j->dir, j->keep_logs);
    free(j);
}

/*
 * Remove a run dir on the worker thread: unlinking a multi-GB disk can take
 * the filesystem a long time, and the loop never waits on the disk. Jobs
 * run in order, so a later purge of the same dir comes after this one.
 */
void sbx_run_dir_remove(struct sbx_table *t, const char *dir, bool keep_logs)
{
    size_t n = strlen(dir) + 1;
    struct rm_job *j = malloc(sizeof(*j) + n);

    if (j) {
        /* Filled before it is queued: from bg_run on, the job is the worker's. */
        j->keep_logs = keep_logs;
        memcpy(j->dir, dir, n);
    }
    if (!j || bg_run(t->bg, rm_work, NULL, j) != 0) {
        free(j);
        remove_run_dir(dir, keep_logs); /* out of memory: do it here rather than leak */
    }
}

/* ---- index flush: LMDB runs with MDB_NOSYNC; the reaper flushes what changed ---- */

struct flush_job {
    struct sbx_table *t;
    int r;
};

static void flush_work(void *arg)
{
    struct flush_job *j = arg;

    j->r = idx_sync(j->t->idx);
}

static void flush_done(void *arg)
{
    struct flush_job *j = arg;

    j->t->idx_flushing = false;
    if (j->r != 0)
        LOG(LOG_ERR, "cannot flush the index: %s", idx_strerror(j->r));
    free(j);
}

static void index_flush(struct sbx_table *t)
{
    struct flush_job *j;

    if (!t->idx_dirty || t->idx_flushing || !(j = calloc(1, sizeof(*j))))
        return;
    j->t = t;
    if (bg_run(t->bg, flush_work, flush_done, j) != 0) {
        free(j);
        return;
    }
    t->idx_dirty = false;
    t->idx_flushing = true;
}

/* ---- guest channel ---- */

/* Fail the ops whose streams live on the channel. Not a create or a resume: they wait for
 * the guest's first answer to an INIT (sandbox_ready), bounded by the boot timer, and a
 * session the agent restarts before that answer costs them nothing but the INIT sent
 * again. A resumed guest can do just that: the restored port state and the new
 * connection reach it as a close and an open, which it may take after the first INIT.
 * Failing the resume there answered its request 502 for a sandbox that came up. */
static void fail_streams(struct sandbox *sb, enum sbx_errcode code, const char *msg)
{
    for (struct op *op = sb->ops, *next; op; op = next) {
        next = op->next_sb;
        if (op->kind != OP_CREATE && op->kind != OP_RESUME) {
            ops_fail(op, code, "sandbox %s: %s", sb->id, msg);
            next = sb->ops; /* the callee may have started or ended other ops */
        }
    }
}

static void send_init(struct sandbox *sb)
{
    struct proto_enc e;
    struct proto_buf *tx = chan_tx(sb->ch);
    uint8_t entropy[PROTO_ENTROPY];
    struct timespec ts;

    /* Clones and restored VMs share the RNG state and a stale clock: every session
     * starts by giving the guest fresh entropy and the host's time. */
    sbx_random(sb->t, entropy, sizeof(entropy));
    clock_gettime(CLOCK_REALTIME, &ts);
    sb->session = ++sb->next_stream;
    sb->ready = false;
    sbx_freeze_reset(sb, -ECONNRESET); /* the new session ends their streams in the guest */
    proto_enc_begin(&e, tx, PROTO_INIT, sb->session, 9);
    proto_put_u(&e, PK_V, PROTO_VERSION);
    proto_put_u(&e, PK_TIME_NS, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    proto_put_bin(&e, PK_ENTROPY, entropy, sizeof(entropy));
    proto_put_cstr(&e, PK_HOSTNAME, sb->id); /* distinct in every sandbox, clones too */
    proto_put_u(&e, PK_MEM_MB, sb->mem_mb);
    /* The resume handshake: the guest keeps its background processes and PTYs across
     * INITs, with these limits for the ones started from now on. */
    proto_put_u(&e, PK_RING, sb->t->cfg->process_ring_bytes);
    proto_put_u(&e, PK_MAX_PROCS, sb->t->cfg->max_procs_per_sbx);
    proto_enc_end(&e);
    sb->init_end = chan_tx_mark(sb->ch);
    sb->inits_unanswered++;
    chan_flush(sb->ch);
}

static void sandbox_ready(struct sandbox *sb)
{
    bool first = sb->state == ST_STARTING;

    sb->ready = true;
    ev_timer_stop(sb->t->loop, &sb->boot_timer);
    if (!first) {
        LOGS(LOG_INFO, sb->id, "guest reconnected");
        return;
    }
    if (sbx_warm_start(sb))
        return; /* sbx_ready_again once the image's warm hook ran */
    if (sandbox_state_set(sb, ST_RUNNING) != 0)
        return;
    /* A clone from the pool or a snapshot: its INIT has just set clock, entropy
     * (reseeded) and hostname; the boot id is still the template's (the snapshot's),
     * shared by every clone. A new one goes now, before the create is answered, so it
     * precedes any user command. */
    if (sb->vmr &&
        (!strcmp(sb->vmr->boot, "pool") || !strcmp(sb->vmr->boot, "snapshot") ||
         !strcmp(sb->vmr->boot, "clone")) &&
        sbx_resync(sb, SBX_RESYNC_BOOT_ID | SBX_RESYNC_HOSTNAME, NULL, NULL) != 0)
        LOGS(LOG_WARN, sb->id,
             "cannot send the hand-out's RESYNC: its boot id stays the "
             "template's");
    sbx_touch(sb);
    if (sbx_save(sb) != 0) {
        /* A sandbox the index does not know as running would not be re-adopted by the
         * next warrend: fail the create rather than answer 201 for it. */
        for (struct op *op = sb->ops, *next; op; op = next) {
            next = op->next_sb;
            if (op->kind == OP_CREATE || op->kind == OP_RESUME)
                ops_fail(op, SBX_E_INDEX_WRITE_FAILED,
                         "the sandbox could not be recorded in the index");
        }
        sandbox_end(sb, ST_DEAD, "index_write_failed");
        return;
    }
    LOGS(LOG_INFO, sb->id, "running (%.1f ms after create)",
         (double)(sbx_now_ms() - sb->created_mono));
    if (sb->vmr && !strcmp(sb->vmr->boot, "clone"))
        pool_undefer(sb->t->pool);
    if (sb->vmr && !strcmp(sb->vmr->boot, "resume"))
        sbx_snap_resumed(sb);
    for (struct op *op = sb->ops, *next; op; op = next) {
        next = op->next_sb;
        if (op->kind == OP_CREATE || op->kind == OP_RESUME)
            ops_finish_sandbox(op, sb);
    }
}

void sbx_ready_again(struct sandbox *sb)
{
    sandbox_ready(sb);
}

/* An agent that reopens its port says HELLO{id:0} and answers the INIT that follows; one
 * that keeps saying it without ever answering is flooding. */
#define INITS_UNANSWERED_MAX 16

/* Frame types a guest sends; anything else from it breaks the protocol. */
static bool from_guest(uint32_t type)
{
    switch (type) {
    case PROTO_HELLO:
    case PROTO_OUT:
    case PROTO_EXIT:
    case PROTO_CREDIT:
    case PROTO_DATA:
    case PROTO_END:
    case PROTO_RESULT:
    case PROTO_ERROR:
    case PROTO_PONG:
        return true;
    default:
        return false;
    }
}

static void on_frame(void *ud, const struct proto_frame *f)
{
    struct sandbox *sb = ud;
    struct op *op;

    if (!from_guest(f->type)) {
        sbx_violation(sb, "%s frame from the guest", proto_type_name(f->type));
        return;
    }
    if (f->type == PROTO_HELLO) {
        if (f->id == sb->session && f->id != 0 && !sb->ready) {
            sb->inits_unanswered = 0;
            sandbox_ready(sb);
        } else if (f->id == 0 && sb->inits_unanswered >= INITS_UNANSWERED_MAX) {
            sbx_violation(sb, "%u INITs unanswered, and still HELLO{id:0}", sb->inits_unanswered);
        } else if (f->id == 0 && sb->ch && chan_tx_passed(sb->ch, sb->init_end)) {
            /* The agent (re)opened its port after our INIT: say it again, but only once
             * the last INIT has left: one INIT in flight, however many HELLOs come (a
             * flood of them once queued an INIT each). The new session ends the old
             * one's streams in the guest, so they end here too. */
            sb->ready = false; /* no new op may start on the old session meanwhile */
            fail_streams(sb, SBX_E_CHANNEL_LOST, "the guest agent restarted its session");
            if (sb->ch)
                send_init(sb);
        }
        return;
    }
    /* Before the HELLO of this session, frames may still come from an earlier one (of an
     * earlier warrend, numbered apart): dropped. After it, the ids are this host's: one it
     * never gave out is made up. */
    if (f->type == PROTO_PONG || !sb->ready)
        return;
    if (f->id > sb->next_stream) {
        sbx_violation(sb, "%s frame for stream %u, never opened", proto_type_name(f->type), f->id);
        return;
    }
    if (sbx_freeze_frame(sb, f) || sbx_warm_frame(sb, f))
        return;
    op = ops_by_stream(sb, f->id);
    if (!op)
        return; /* a late frame of a cancelled or finished op */
    ops_frame(sb, op, f);
}

static void on_backoff(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct sandbox *sb = w->data;

    if (sb->vm && !sb->vm_gone && !sb->ch && sbx_state_live(sb->state))
        vmm_channel_reconnect(sb->vm);
}

void sbx_violation(struct sandbox *sb, const char *fmt, ...)
{
    char why[200], reason[256];
    int64_t now = sbx_now_ms();
    double delay;
    va_list ap;

    if (sbx_state_final(sb->state))
        return;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    sb->violations++;
    /* At most one line per sandbox per 10 s, however the guest behaves. */
    if (sb->violations == 1 || now - sb->viol_log_ms >= 10000) {
        LOGS(LOG_WARN, sb->id, "protocol violation %u of %u: %s (%u not logged)", sb->violations,
             sb->t->cfg->violations_max, why, sb->viol_log_quiet);
        sb->viol_log_ms = now;
        sb->viol_log_quiet = 0;
    } else {
        sb->viol_log_quiet++;
    }
    snprintf(reason, sizeof(reason), "protocol_violation: %s", why);
    if (sb->violations >= sb->t->cfg->violations_max) {
        sandbox_end(sb, ST_DEAD, reason);
        return;
    }
    if (sb->ch) {
        chan_free(sb->ch); /* deferred when inside its callback */
        sb->ch = NULL;
    }
    sb->ready = false;
    ops_fail_all(sb, SBX_E_PROTOCOL_VIOLATION, why);
    /* 0.5 s, 1 s, 2 s ... 60 s: a guest that breaks every session cannot make the host
     * reconnect and re-INIT in a tight loop. */
    delay = 0.5 * (double)(1u << (sb->violations - 1 < 7 ? sb->violations - 1 : 7));
    ev_timer_stop(sb->t->loop, &sb->backoff_timer);
    ev_timer_set(&sb->backoff_timer, delay < 60 ? delay : 60, 0);
    ev_timer_start(sb->t->loop, &sb->backoff_timer);
}

static void on_chan_closed(void *ud, int err, const char *why)
{
    struct sandbox *sb = ud;

    /* Bytes that are not frames of ours, or a guest that does not read: its fault. */
    if (err == PROTO_ETOOBIG || err == PROTO_EMSGPACK || err == PROTO_ESCHEMA ||
        err == CHAN_EFULL) {
        sbx_violation(sb, "%s", why);
        return;
    }
    LOGS(LOG_WARN, sb->id, "guest channel lost: %s", why);
    chan_free(sb->ch);
    sb->ch = NULL;
    sb->ready = false;
    /* Streams do not survive a new session: the guest ends them on the next INIT. */
    ops_fail_all(sb, SBX_E_CHANNEL_LOST, why);
    if (sb->vm && sbx_state_live(sb->state))
        vmm_channel_reconnect(sb->vm);
}

void sbx_on_channel(struct sandbox *sb, int fd)
{
    static const struct chan_cbs cbs = {on_frame, on_chan_closed};
    int r;

    if (sb->ch) {
        chan_free(sb->ch);
        sb->ch = NULL;
    }
    r = chan_new(sb->t->loop, fd, &cbs, sb, &sb->ch);
    if (r != 0) {
        close(fd);
        LOGS(LOG_ERR, sb->id, "cannot set up the guest channel: %s", strerror(-r));
        return;
    }
    chan_set_tx_max(sb->ch, sb->t->cfg->chan_send_max);
    sb->inits_unanswered = 0;
    /* A stopped guest would never answer: continue it first (a warrend restarted while it
     * was frozen comes here too). The INIT sets its clock and entropy. An adopted VM's
     * phase is not known until QEMU has answered its first query-status, and the driver
     * refuses a "cont" until then (-EPERM): sbx_on_vm_phase continues it then. */
    if (sbx_state_stopped(sb->state) && (r = sbx_thaw(sb, false)) != 0) {
        if (r == -EPERM)
            sb->thaw_on_phase = true;
        else
            LOGS(LOG_ERR, sb->id, "frozen, and cannot be continued: %s", strerror(-r));
    }
    send_init(sb);
}

void sbx_on_vm_phase(struct sandbox *sb, enum vmm_phase from, enum vmm_phase to)
{
    int r;

    /* Adopted (BOOTING until QEMU's first word) and found stopped while the index says
     * running: a snapshot or pause (sbx_snap.c) was cut short by a warrend restart, which
     * left the vCPUs stopped. Nobody else would continue them. */
    if (from == VMM_PH_BOOTING && to == VMM_PH_STOPPED && sb->state == ST_RUNNING && sb->vm) {
        sbx_snap_found_stopped(sb);
        return;
    }
    if (!sb->thaw_on_phase || !(vmm_phase_can_cont(to) || vmm_phase_guest_runs(to)))
        return;
    sb->thaw_on_phase = false;
    if (sbx_state_stopped(sb->state) && (r = sbx_thaw(sb, false)) != 0)
        LOGS(LOG_ERR, sb->id, "frozen, and cannot be continued: %s", strerror(-r));
}

void sbx_on_vm_exited(struct sandbox *sb, int status, const char *reason)
{
    char why[256];

    /* The vmm is freed later (reaper or purge), never from inside its own callback. */
    sb->vm_gone = true;
    if (sbx_state_final(sb->state))
        return;
    snprintf(why, sizeof(why), "vm_exited: %s", reason);
    LOGS(LOG_WARN, sb->id, "VM exited unexpectedly: %s", reason);
    if (sbx_snap_resume_failed(sb, why))
        return;
    sandbox_end(sb, ST_DEAD, why);
}

static void on_boot_timeout(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct sandbox *sb = w->data;
    char why[128];

    if (sbx_warm_timeout_reason(sb))
        snprintf(why, sizeof(why), "%s", sbx_warm_timeout_reason(sb));
    else
        snprintf(why, sizeof(why), "boot_failed: the guest did not answer within %u s",
                 sb->t->cfg->boot_timeout_s);
    LOGS(LOG_WARN, sb->id, "%s (console log: %s/console.log)", why,
         sb->vmr ? sb->vmr->run_dir : "gone");
    if (sbx_snap_resume_failed(sb, why))
        return;
    sandbox_end(sb, ST_DEAD, why);
}

/* ---- lifecycle ---- */

/* End a sandbox: fail its ops, stop its VM, keep the record for retention. */
static void sandbox_end(struct sandbox *sb, enum sbx_state state, const char *reason)
{
    if (sbx_state_final(sb->state) || sandbox_state_set(sb, state) != 0)
        return;
    snprintf(sb->reason, sizeof(sb->reason), "%s", reason);
    sb->ended_ms = sbx_wall_ms();
    sb->ended_mono = sbx_now_ms();
    sb->ready = false;
    ev_timer_stop(sb->t->loop, &sb->boot_timer);
    ev_timer_stop(sb->t->loop, &sb->backoff_timer);
    LOGS(LOG_INFO, sb->id, "%s: %s", sbx_state_name(state), reason);
    ops_fail_all(sb, state == ST_DEAD ? SBX_E_DEAD : SBX_E_GONE, reason);
    sbx_freeze_reset(sb, -ESHUTDOWN);
    if (sb->ch) {
        chan_free(sb->ch);
        sb->ch = NULL;
    }
    /* The VM record stays (without a pid) until the sandbox is purged: a dead one's
     * logs are in its run dir. */
    if (sb->vmr)
        sbx_vm_stop(sb->vmr, state == ST_DEAD);
    sbx_save(sb);
}

void sbx_end(struct sandbox *sb, const char *reason)
{
    sandbox_end(sb, ST_ENDED, reason);
}

void sbx_die(struct sandbox *sb, const char *reason)
{
    sandbox_end(sb, ST_DEAD, reason);
}

static void sandbox_free(struct sandbox *sb)
{
    ev_timer_stop(sb->t->loop, &sb->boot_timer);
    ev_timer_stop(sb->t->loop, &sb->backoff_timer);
    if (sb->ch)
        chan_free(sb->ch);
    if (sb->vmr) /* still bound: the VM outlives the struct only in the table's free */
        sb->vmr->sb = NULL;
    if (sb->t->pageout_sb == sb) {
        vmm_pageout_cancel(sb->vm); /* its callback's ud is sb */
        sb->t->pageout_sb = NULL;
    }
    rec_kv_free(&sb->env);
    rec_kv_free(&sb->metadata);
    free(sb);
}

static struct sandbox *sandbox_alloc(struct sbx_table *t)
{
    struct sandbox *sb = calloc(1, sizeof(*sb));

    if (!sb)
        return NULL;
    sb->t = t;
    ev_timer_init(&sb->boot_timer, on_boot_timeout, t->cfg->boot_timeout_s, 0);
    sb->boot_timer.data = sb;
    ev_timer_init(&sb->backoff_timer, on_backoff, 1, 0);
    sb->backoff_timer.data = sb;
    sb->next = t->sandboxes;
    t->sandboxes = sb;
    return sb;
}

static void sandbox_unlink(struct sbx_table *t, struct sandbox *sb)
{
    for (struct sandbox **p = &t->sandboxes; *p; p = &(*p)->next) {
        if (*p == sb) {
            *p = sb->next;
            return;
        }
    }
}

void sbx_pool_stats(const struct sbx_table *t, struct sbx_pool_stats *out)
{
    pool_stats(t->pool, out);
}

#define TEMPLATES_MAX 256 /* images listed by GET /v1/templates */

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int sbx_templates(struct sbx_table *t, struct sbx_tmpl_list **out, struct sbx_err *err)
{
    char *names[TEMPLATES_MAX], path[4096 + 64];
    struct sbx_tmpl_list *l;
    size_t n = 0, pools = 0;
    struct dirent *e;
    struct stat st;
    DIR *d;

    *out = NULL;
    if (!(d = opendir(t->image_dir)))
        return sbx_err_set(err, SBX_E_INTERNAL, "cannot read the image directory %s: %s",
                           t->image_dir, strerror(errno));
    while ((e = readdir(d)) != NULL && n < TEMPLATES_MAX) {
        size_t len = strlen(e->d_name);
        char *name;
        if (len <= 5 || strcmp(e->d_name + len - 5, ".ext4") != 0 ||
            !(name = strndup(e->d_name, len - 5)))
            continue;
        if (sbx_template_name_ok(name))
            names[n++] = name;
        else
            free(name);
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), name_cmp);
    l = calloc(1, sizeof(*l) + n * sizeof(l->v[0]));
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s.ext4", t->image_dir, names[i]);
        if (l && stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            struct sbx_tmpl_rec *r = &l->v[l->n++];
            snprintf(r->name, sizeof(r->name), "%s", names[i]);
            r->is_default = strcmp(names[i], t->cfg->default_template) == 0;
            r->size_bytes = (uint64_t)st.st_size;
            r->pools = &l->pools[pools];
            r->npools =
                pool_template_stats(t->pool, names[i], &l->pools[pools], SBX_POOLS_MAX - pools);
            pools += r->npools;
        }
        free(names[i]);
    }
    if (!l)
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    *out = l;
    return 0;
}

unsigned sbx_count_live(const struct sbx_table *t)
{
    unsigned n = 0;
    for (const struct sandbox *sb = t->sandboxes; sb; sb = sb->next)
        n += sbx_state_live(sb->state);
    return n;
}

/* ---- request validation ---- */

static int get_uint(int64_t v, const char *key, unsigned def, unsigned lo, unsigned hi,
                    unsigned *out, struct sbx_err *err)
{
    *out = def; /* set on every path: callers test the returned code, not *out */
    if (v == SBX_UNSET)
        return 0;
    if (v < lo || v > hi) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "%s must be an integer from %u to %u", key,
                           lo, hi);
    }
    *out = (unsigned)v;
    return 0;
}

bool sbx_template_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 48)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= '0' && s[i] <= '9') && s[i] != '-' &&
            s[i] != '_')
            return false;
    return true;
}

/* ---- create: quotas ---- */

/* MemTotal in MiB, 0 if unknown. */
static uint64_t host_mem_mb(void)
{
    char line[128];
    unsigned long long kb = 0;
    FILE *f = fopen("/proc/meminfo", "re");

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return kb / 1024;
}

static bool env_name_ok(const char *k)
{
    size_t n = strlen(k);

    if (n == 0 || n > 256 || (k[0] >= '0' && k[0] <= '9'))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(k[i] == '_' || (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') ||
              (k[i] >= '0' && k[i] <= '9')))
            return false;
    return true;
}

/* env and metadata as given to a create, and the memory it asks for, against the
 * configured limits: 0, or an sbx_errcode with *err. An env key that is not a valid
 * variable name would make every later exec fail in the guest: refused here. */
static int create_quota(struct sbx_table *t, unsigned mem, const struct rec_kv *env,
                        const struct rec_kv *meta, struct sbx_err *err)
{
    const struct srv_config *c = t->cfg;
    size_t size;

    for (size_t i = 0; i < env->n; i++) {
        const char *k = env->v[i].key;
        if (!env_name_ok(k) || strlen(env->v[i].val.p) != env->v[i].val.n) {
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "env key '%.64s' is not a variable name ([A-Za-z_][A-Za-z0-9_]*, "
                               "at most 256) or its value holds a NUL byte",
                               k);
        }
    }
    for (size_t i = 0; i < meta->n; i++) {
        const char *k = meta->v[i].key;
        bool ok = k[0] && strlen(k) <= 256;
        for (const char *p = k; ok && *p; p++)
            ok = (unsigned char)*p >= 0x20 && *p != 0x7f && *p != '=' && *p != '&';
        if (!ok) {
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "metadata key '%.64s' must be 1 to 256 bytes without control "
                               "characters, '=' or '&'",
                               k);
        }
    }
    size = env->stored_bytes + meta->stored_bytes;
    if (size > c->max_env_meta_bytes) {
        return sbx_err_set(err, SBX_E_TOO_LARGE,
                           "env and metadata take %zu bytes of JSON, more than the limit of %zu",
                           size, c->max_env_meta_bytes);
    }
    return sbx_mem_quota(t, mem, err);
}

int sbx_mem_quota(struct sbx_table *t, unsigned mem, struct sbx_err *err)
{
    const struct srv_config *c = t->cfg;
    uint64_t total = host_mem_mb(), used = 0;

    for (struct sandbox *sb = t->sandboxes; sb; sb = sb->next)
        if (sbx_state_live(sb->state))
            used += sb->mem_mb;
    if (total && (used + mem) * 100 > (total > c->mem_reserve_mb ? total - c->mem_reserve_mb : 0) *
                                          c->mem_overcommit_pct) {
        return sbx_err_set(err, SBX_E_MEMORY_EXHAUSTED,
                           "%u MiB more for guests would pass %u%% of the host's %" PRIu64
                           " MiB less the %u MiB reserve (%" PRIu64 " MiB in use by sandboxes)",
                           mem, c->mem_overcommit_pct, total, c->mem_reserve_mb, used);
    }
    return 0;
}

/* ---- create ---- */

static void on_handout_cont(void *ud, int err, const char *why)
{
    struct sandbox *sb = ud;
    char reason[256];

    if (err == 0 || sbx_state_final(sb->state))
        return;
    snprintf(reason, sizeof(reason), "vm_start_failed: cont of a pool VM: %s", why);
    sandbox_end(sb, ST_DEAD, reason);
}

/* Record a new sandbox and its VM before anything is answered: a VM the index does
 * not know is killed as a stray by the next warrend, so a sandbox that cannot be saved
 * is not created (it ends dead). The VM first: a sandbox record naming a VM with no
 * record would be lost at restart. 0, or -1 with err set. */
int sbx_record_new(struct sandbox *sb, struct sbx_vm *vm, struct sbx_err *err)
{
    int r = sbx_vm_save(vm);

    if (r == 0)
        r = sbx_save(sb);
    if (r == 0)
        return 0;
    sbx_err_set(err, SBX_E_INDEX_WRITE_FAILED, "cannot record the sandbox in the index: %s",
                idx_strerror(r));
    sandbox_end(sb, ST_DEAD, "index_write_failed");
    return -1;
}

/*
 * Create from the warm pool: vm is restored and stopped, unbound. Bind it,
 * record both, let its vCPUs run and open a fresh channel session: the INIT
 * sent on connect (sbx_on_channel) gives the guest the host's clock, fresh
 * entropy and a new session, as for a booted VM; its HELLO answers the create
 * (sandbox_ready). The boot timer still bounds it.
 */
static int handout(struct sandbox *sb, struct sbx_vm *vm, const struct sbx_sink *sink, void *user,
                   sbx_op_t *opid, struct sbx_err *err)
{
    struct sbx_table *t = sb->t;
    struct op *op;
    int r;

    sbx_vm_bind(vm, sb);
    if (sbx_record_new(sb, vm, err) != 0)
        return SBX_E_INDEX_WRITE_FAILED;
    /* Before the op exists: a failure here is answered by our return value alone. */
    if ((r = vmm_cont(sb->vm, on_handout_cont, sb)) != 0 ||
        (r = vmm_channel_reconnect(sb->vm)) != 0)
        goto fail;
    if (!(op = ops_new(sb, OP_CREATE, sink, user))) {
        r = -ENOMEM;
        goto fail;
    }
    /* A clone shares the template's RNG state, boot id and hostname, and its clock
     * stopped at the template's save: the INIT on the new channel sets clock, entropy
     * (reseeded) and hostname, and sandbox_ready sends a RESYNC with a new boot id. */
    ev_timer_start(t->loop, &sb->boot_timer);
    LOGS(LOG_INFO, sb->id, "starting: VM %s from the pool, template %s, %u MiB, %u vCPU, pid %d",
         vm->id, sb->tmpl, sb->mem_mb, sb->vcpus, (int)vm->pid);
    *opid = op->id;
    return 0;
fail:
    LOGS(LOG_ERR, sb->id, "cannot start from the pool: %s", strerror(-r));
    sbx_err_set(err, SBX_E_VM_START_FAILED, "cannot start the VM: %s", strerror(-r));
    sandbox_end(sb, ST_DEAD, "vm_start_failed");
    return SBX_E_VM_START_FAILED;
}

/* One of network's lists: each entry an IPv4 CIDR (into cidrs) or a domain
 * name (into names, which needs the VM's own resolver: dnsmasq). */
static int get_list(const char *const *a, size_t n, const char *key, char *cidrs, size_t ccap,
                    char *names, size_t ncap, struct sbx_err *err)
{
    if (n > NET_LIST_MAX)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "network.%s must be an array of at most %d IPv4 CIDRs or domain names",
                           key, NET_LIST_MAX);
    for (size_t i = 0; i < n; i++) {
        const char *e = a[i];
        if (net_list_add(cidrs, ccap, e) == 0)
            continue;
        if (!e || strchr(e, '/') || strspn(e, "0123456789.") == strlen(e) ||
            net_name_add(names, ncap, e) != 0)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "network.%s[%zu] must be an IPv4 address or CIDR (a.b.c.d/p) or a "
                               "domain name (example.com, *.example.com)",
                               key, i);
    }
    return 0;
}

int sbx_net_check_host(struct sbx_table *t, const struct net_policy *pol, struct sbx_err *err)
{
    if (t->net && (pol->allow_names[0] || pol->deny_names[0]) && !net_has_dnsmasq(t->net))
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "network: domain rules need dnsmasq on the host, which is not "
                           "installed");
    return 0;
}

static int get_limit(int64_t v, const char *key, unsigned max, unsigned *out, struct sbx_err *err)
{
    if (v == SBX_UNSET)
        return 0;
    if (v < 0 || v > max)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "network.%s must be an integer from 0 (unlimited) to %u", key, max);
    *out = (unsigned)v;
    return 0;
}

/* A ", "-separated list's entries appended to the array a. */
void sbx_net_default(const struct srv_config *c, struct net_policy *pol)
{
    memset(pol, 0, sizeof(*pol));
    pol->internet = c->net_default_internet != 0;
    pol->rate_mbit = c->net_rate_mbit;
    pol->max_conns = c->net_max_connections;
}

bool sbx_net_is_default(const struct srv_config *c, const struct net_policy *pol)
{
    return pol->internet == (c->net_default_internet != 0) && !pol->allow_out[0] &&
           !pol->deny_out[0] && !pol->allow_names[0] && !pol->deny_names[0] &&
           pol->rate_mbit == c->net_rate_mbit && pol->max_conns == c->net_max_connections;
}

int sbx_net_from_req(struct sbx_table *t, const struct sbx_net_req *n, struct net_policy *pol,
                     struct sbx_err *err)
{
    int status;

    sbx_net_default(t->cfg, pol);
    if (!n)
        return 0;
    if (n->internet >= 0)
        pol->internet = n->internet != 0;
    if ((status =
             get_list(n->allow_out, n->nallow_out, "allow_out", pol->allow_out,
                      sizeof(pol->allow_out), pol->allow_names, sizeof(pol->allow_names), err)) ||
        (status = get_list(n->deny_out, n->ndeny_out, "deny_out", pol->deny_out,
                           sizeof(pol->deny_out), pol->deny_names, sizeof(pol->deny_names), err)) ||
        (status = get_limit(n->rate_mbit, "rate_mbit", NET_RATE_MAX, &pol->rate_mbit, err)) ||
        (status =
             get_limit(n->max_connections, "max_connections", NET_CONNS_MAX, &pol->max_conns, err)))
        return status;
    return 0;
}

/* Create option public_ports: distinct ports 1..65535, at most SBX_PUBLIC_PORTS_MAX. */
static int public_ports_get(const struct sbx_create_req *req, uint16_t *out, unsigned *n,
                            struct sbx_err *err)
{
    *n = 0;
    if (req->npublic > SBX_PUBLIC_PORTS_MAX)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "public_ports must be an array of at most %d ports",
                           SBX_PUBLIC_PORTS_MAX);
    for (size_t i = 0; i < req->npublic; i++) {
        int64_t p = req->public_ports[i];
        if (p < 1 || p > 65535)
            return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                               "public_ports: %s is not a port (1 to 65535)",
                               p == SBX_NOT_INT ? "an entry" : "a number");
        for (unsigned k = 0; k < *n; k++)
            if (out[k] == p)
                return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "public_ports: %d is given twice",
                                   (int)p);
        out[(*n)++] = (uint16_t)p;
    }
    return 0;
}

/* The index keeps string maps as JSON, so keys and values must be UTF-8 text whatever
 * the door (the REST one's are; another's may hold any bytes). */
int sbx_kv_map(const struct sbx_kv *kv, size_t n, const char *what, struct rec_kv *out,
               struct sbx_err *err)
{
    int r = rec_kv_set(out, kv, n);

    if (r == -EINVAL)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "%s must be an object of strings (UTF-8 text)", what);
    return r ? sbx_err_set(err, SBX_E_INTERNAL, "out of memory") : 0;
}

int sbx_create(struct sbx_table *t, const struct sbx_create_req *req, const struct sbx_sink *sink,
               void *user, sbx_op_t *opid, struct sbx_err *err)
{
    const struct srv_config *c = t->cfg;
    const char *tmpl = req->tmpl, *snap_id = req->snapshot_id;
    char alias[64];
    unsigned ttl, idle, mem, vcpus;
    struct rec_kv env = {0}, meta = {0};
    char base[4096], real[PATH_MAX];
    struct stat st;
    struct sandbox *sb;
    struct sbx_vm *vm;
    struct timespec t0, t1;
    struct op *op;
    struct net_policy pol;
    uint16_t pub[SBX_PUBLIC_PORTS_MAX] = {0};
    unsigned npub = 0;
    int status, r;

    /* From a snapshot: its template, memory and vCPUs (sbx_snap.c). */
    if (snap_id && (status = sbx_snap_for_create(t, req, &tmpl, &mem, &vcpus, err)))
        return status;
    if (!snap_id && !req->tmpl_given)
        tmpl = c->default_template;
    if (!tmpl || !sbx_template_name_ok(tmpl)) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "template must be a template name");
    }
    if (!snap_id && cfg_tmap_get(c->template_aliases, tmpl, alias, sizeof(alias)))
        tmpl = alias; /* template_aliases: another name, the same template and pool */
    if (snprintf(base, sizeof(base), "%s/%s.ext4", t->image_dir, tmpl) >= (int)sizeof(base) ||
        !realpath(base, real) || stat(real, &st) != 0) {
        return sbx_err_set(err, SBX_E_UNKNOWN_TEMPLATE, "no template named '%s'", tmpl);
    }
    if ((status =
             get_uint(req->ttl_s, "ttl_seconds", c->default_ttl_s, 1, c->max_ttl_s, &ttl, err)) ||
        (status = get_uint(req->idle_s, "idle_timeout_seconds", c->default_idle_s, 0, c->max_ttl_s,
                           &idle, err)) ||
        (!snap_id &&
         (status = get_uint(req->memory_mb, "memory_mb", cfg_template_memory_mb(c, tmpl),
                            c->min_memory_mb, c->max_memory_mb, &mem, err))) ||
        (!snap_id &&
         (status = get_uint(req->vcpus, "vcpus", c->default_vcpus, 1, c->max_vcpus, &vcpus, err))))
        return status;
    if ((status = sbx_net_from_req(t, req->network, &pol, err)) ||
        (status = sbx_net_check_host(t, &pol, err)))
        return status;
    if ((status = public_ports_get(req, pub, &npub, err)))
        return status;
    if ((status = sbx_kv_map(req->env, req->nenv, "env", &env, err)))
        return status;
    if ((status = sbx_kv_map(req->metadata, req->nmetadata, "metadata", &meta, err))) {
        rec_kv_free(&env);
        return status;
    }
    if (sbx_count_live(t) >= c->max_sandboxes) {
        rec_kv_free(&env);
        rec_kv_free(&meta);
        return sbx_err_set(err, SBX_E_TOO_MANY_SANDBOXES,
                           "the limit of %u live sandboxes is reached", c->max_sandboxes);
    }
    if ((status = create_quota(t, mem, &env, &meta, err))) {
        rec_kv_free(&env);
        rec_kv_free(&meta);
        return status;
    }

    sb = sandbox_alloc(t);
    if (!sb) {
        rec_kv_free(&env);
        rec_kv_free(&meta);
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    }
    sbx_new_id(t, "sb", sb->id);
    snprintf(sb->tmpl, sizeof(sb->tmpl), "%s", tmpl);
    sb->state = ST_STARTING; /* born starting, not a transition */
    sb->created_ms = sbx_wall_ms();
    sb->created_mono = sb->active_mono = sbx_now_ms();
    sb->expires_ms = sb->created_ms + (int64_t)ttl * 1000;
    sb->expires_mono = sb->created_mono + (int64_t)ttl * 1000;
    sb->idle_s = idle;
    sb->mem_mb = mem;
    sb->vcpus = vcpus;
    sb->env = env;
    sb->metadata = meta;
    sb->keep_running = req->keep_running;
    sb->persistent = req->persistent;
    sb->auto_pause = req->auto_pause;
    sb->ttl_s = ttl;
    memcpy(sb->public_ports, pub, sizeof(pub));
    sb->npublic = npub;
    if (snap_id) {
        snprintf(sb->snap_id, sizeof(sb->snap_id), "%s", snap_id);
        return sbx_snap_start(sb, req->network ? &pol : NULL, sink, user, opid, err);
    }
    /* The pool's VMs run under the default policy, fixed when they started. */
    if (sbx_net_is_default(c, &pol) && (vm = pool_take(t->pool, tmpl, mem, vcpus)))
        return handout(sb, vm, sink, user, opid, err);
    /* The pool is empty (or this create's policy differs from its VMs'): a clone of
     * its template restored for this create still beats a boot. */
    {
        bool dflt = sbx_net_is_default(c, &pol);
        const char *tsnap, *tdisk, *tmem;
        struct sbx_vm *spare = NULL;
        if (pool_template(t->pool, tmpl, mem, vcpus, &tsnap, &tdisk, &tmem, dflt ? &spare : NULL)) {
            pool_defer(t->pool);
            return sbx_clone_start(sb, tsnap, tdisk, tmem, spare, &pol, sink, user, opid, err);
        }
    }
    /* No pool for this template and shape: it boots, and its pool is built (on first
     * use) for the creates after it. */
    pool_first_use(t->pool, tmpl, mem, vcpus);
    {
        /* A namespace made ahead, when the policy is the default one. */
        char ahead_id[24];
        int slot = -1;
        bool made = t->net && sbx_net_is_default(c, &pol) &&
                    sbx_net_ahead_take(t, ahead_id, sizeof(ahead_id), &slot);
        r = sbx_vm_new_id(t, made ? ahead_id : NULL, tmpl, mem, vcpus, &vm);
        if (r != 0 && made)
            sbx_vm_net_release(t, ahead_id, &slot);
        if (r == 0) {
            vm->net_slot = slot;
            vm->net_made = made;
        }
        sbx_net_ahead_fill(t);
    }
    if (r != 0)
        goto fail;
    vm->pol = pol;
    sbx_vm_bind(vm, sb);
    r = sbx_vm_overlay(vm, real, (uint64_t)st.st_size);
    if (r != 0)
        goto fail;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    r = sbx_vm_launch(vm, real);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (r != 0)
        goto fail;
    if (sbx_record_new(sb, vm, err) != 0)
        return SBX_E_INDEX_WRITE_FAILED;
    op = ops_new(sb, OP_CREATE, sink, user);
    if (!op) {
        r = -ENOMEM;
        goto fail;
    }
    ev_timer_start(t->loop, &sb->boot_timer);
    /* The launch time (spawn, and the jail's mounts and cgroup when jailed) is
     * spent on the loop: logged so that its cost stays visible. */
    LOGS(LOG_INFO, sb->id,
         "starting: VM %s, template %s, %u MiB, %u vCPU, pid %d, uid %d, launch %.2f ms", vm->id,
         tmpl, mem, vcpus, (int)vm->pid, (int)vmm_uid(sb->vm),
         (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6);
    *opid = op->id;
    return 0;
fail:
    LOGS(LOG_ERR, sb->id, "cannot start: %s", strerror(-r));
    sbx_err_set(err, SBX_E_VM_START_FAILED, "cannot start the VM: %s", strerror(-r));
    sandbox_end(sb, ST_DEAD, "vm_start_failed");
    return SBX_E_VM_START_FAILED;
}

/* ---- synchronous calls ---- */

int sbx_get(struct sbx_table *t, const char *id, struct sbx_rec *out, struct sbx_err *err)
{
    struct sandbox *sb = sbx_find(t, id);

    if (!sb)
        return not_found(id, err);
    /* Looking at a sandbox is not using it: GET does not hold off the idle timeout. */
    sbx_rec_of(sb, out);
    return 0;
}

int sbx_list(struct sbx_table *t, const char *state, const struct sbx_kv *filter, size_t nfilter,
             struct sbx_rec **out, size_t *n, struct sbx_err *err)
{
    enum sbx_state want = ST_RUNNING;
    size_t count = 0;

    *out = NULL;
    *n = 0;
    if (state && *state && sbx_state_parse(state, &want) != 0) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "state must be one of starting, running, frozen, ended, dead");
    }
    for (struct sandbox *sb = t->sandboxes; sb; sb = sb->next)
        count++;
    if (!(*out = calloc(count + 1, sizeof(**out))))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    for (struct sandbox *sb = t->sandboxes; sb; sb = sb->next) {
        /* A frozen sandbox is a running one to clients; ?state=frozen picks those alone. */
        bool match = !(state && *state) || sb->state == want ||
                     (want == ST_RUNNING && sb->state == ST_FROZEN);
        for (size_t i = 0; match && i < nfilter; i++) {
            const struct sbx_str *v = rec_kv_get(&sb->metadata, filter[i].key);
            match = v && v->n == filter[i].val.n && memcmp(v->p, filter[i].val.p, v->n) == 0;
        }
        if (match) {
            sbx_rec_of(sb, &(*out)[*n]);
            (*n)++;
        }
    }
    return 0;
}

int sbx_delete(struct sbx_table *t, const char *id, struct sbx_rec *out, struct sbx_err *err)
{
    struct sandbox *sb = sbx_find(t, id);

    if (!sb)
        return not_found(id, err);
    sandbox_end(sb, ST_ENDED, "deleted");
    return sbx_get(t, id, out, err);
}

int sbx_set_timeout(struct sbx_table *t, const char *id, int64_t ttl_s, struct sbx_rec *out,
                    struct sbx_err *err)
{
    struct sandbox *sb = NULL;
    unsigned ttl;
    int status;

    /* A sandbox still starting or reconnecting may be extended too. */
    if ((status = sbx_alive(t, id, &sb, err)))
        return status;
    if (ttl_s == SBX_UNSET) {
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT, "ttl_seconds is required");
    }
    if ((status = get_uint(ttl_s, "ttl_seconds", 0, 1, t->cfg->max_ttl_s, &ttl, err)))
        return status;
    sb->expires_ms = sbx_wall_ms() + (int64_t)ttl * 1000;
    sb->expires_mono = sbx_now_ms() + (int64_t)ttl * 1000;
    sb->ttl_s = ttl;
    sbx_touch(sb);
    sbx_save(sb);
    return sbx_get(t, id, out, err);
}

/* ---- reaper ---- */

/* The TTL of an auto_pause sandbox ran out: paused, as at a persistent one's idle
 * timeout. Paused time does not count toward a TTL, so the one set here, its last TTL
 * whole, starts when it is resumed. */
static int ttl_pause(struct sandbox *sb, int64_t now)
{
    uint32_t ttl = sb->ttl_s ? sb->ttl_s : 1;

    sb->expires_mono = now + (int64_t)ttl * 1000;
    sb->expires_ms = sbx_wall_ms() + (int64_t)ttl * 1000;
    return sbx_pause_idle(sb);
}

static void on_reap(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct sbx_table *t = w->data;
    int64_t now = sbx_now_ms();

    for (struct sandbox *sb = t->sandboxes, *next; sb; sb = next) {
        next = sb->next;
        if (sb->vmr && sb->vm_gone && sbx_state_final(sb->state))
            sbx_vm_reap(sb->vmr);
        if (sbx_state_expires(sb->state) && now >= sb->expires_mono) {
            if (!sb->auto_pause || ttl_pause(sb, now) != 0)
                sandbox_end(sb, ST_ENDED, "ttl_expired");
        } else if (sbx_state_expires(sb->state) && sb->idle_s && sb->nops == 0 &&
                   now - sb->active_mono >= (int64_t)sb->idle_s * 1000) {
            /* persistent: paused (memory and disk kept, no VM) rather than ended. */
            if (!sb->persistent || sbx_pause_idle(sb) != 0)
                sandbox_end(sb, ST_ENDED, "idle_timeout");
        } else if (sb->state == ST_PAUSED &&
                   now - sb->paused_mono >= (int64_t)t->cfg->paused_retention_s * 1000) {
            sandbox_end(sb, ST_ENDED, "paused_retention_expired");
        } else if (sb->state == ST_RUNNING || sb->state == ST_FROZEN) {
            sbx_freeze_tick(sb, now);
        } else if (sbx_state_final(sb->state) &&
                   now - sb->ended_mono >= (int64_t)t->cfg->ended_keep_s * 1000) {
            idx_del(t->idx, IDX_SANDBOXES, sb->id);
            if (sb->vmr)
                sbx_vm_destroy(sb->vmr);
            sandbox_unlink(t, sb);
            sandbox_free(sb);
        }
    }
    sbx_snap_tick(t);
    index_flush(t);
}

/* ---- restore after a restart ---- */

/*
 * A sandbox record names its VM (vm_id). One written by an older warrend has
 * no vm_id but the VM's pid, run_dir and disk: it gets a VM record of that
 * VM's own identity (its sandbox's id), and both are rewritten in the new
 * form once both tables are read (restore_one sets t->idx_dirty; bind_all
 * rewrites).
 */
static int restore_one(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct sbx_table *t = ud;
    struct rec_sandbox o;
    struct sandbox *sb;
    const char *vm_id, *run_dir, *disk;
    enum sbx_state st;
    int rc = rec_sandbox_decode(val, vlen, &o);

    if (rc == -ENOMEM)
        return rc;
    if (rc != 0 || sbx_state_parse(o.state, &st) != 0 || strlen(o.id) >= sizeof(sb->id) ||
        strlen(o.vm_id) >= sizeof(sb->vm_id) || (!o.run_dir != !o.disk)) {
        LOG(LOG_WARN, "index record %.*s is unreadable; dropping it", (int)klen, key);
        rec_sandbox_free(&o);
        return 0;
    }
    vm_id = o.vm_id;
    run_dir = o.run_dir;
    disk = o.disk;
    sb = sandbox_alloc(t);
    if (!sb) {
        rec_sandbox_free(&o);
        return -ENOMEM;
    }
    snprintf(sb->id, sizeof(sb->id), "%s", o.id);
    snprintf(sb->tmpl, sizeof(sb->tmpl), "%s", o.tmpl);
    snprintf(sb->reason, sizeof(sb->reason), "%s", o.reason);
    snprintf(sb->vm_id, sizeof(sb->vm_id), "%s", vm_id);
    sb->state = st; /* born in its recorded state, not a transition */
    sb->created_ms = o.created_ms;
    sb->expires_ms = o.expires_ms;
    sb->ended_ms = o.ended_ms;
    sb->created_mono = wall_to_mono(o.created_ms);
    sb->expires_mono = wall_to_mono(o.expires_ms);
    sb->ended_mono = wall_to_mono(o.ended_ms);
    sb->active_mono = wall_to_mono(o.last_active_ms);
    sb->idle_s = (unsigned)o.idle_s;
    sb->mem_mb = (unsigned)o.mem_mb;
    sb->vcpus = (unsigned)o.vcpus;
    sb->env = o.env; /* moved */
    sb->metadata = o.metadata;
    o.env = o.metadata = (struct rec_kv){0};
    sb->keep_running = o.keep_running;
    memcpy(sb->public_ports, o.public_ports, o.npublic * sizeof(o.public_ports[0]));
    sb->npublic = o.npublic;
    if (o.snapshot_id && strlen(o.snapshot_id) < sizeof(sb->snap_id))
        snprintf(sb->snap_id, sizeof(sb->snap_id), "%s", o.snapshot_id);
    sb->persistent = o.persistent;
    sb->auto_pause = o.auto_pause;
    if (o.ttl_s > 0 && o.ttl_s <= UINT32_MAX)
        sb->ttl_s = (uint32_t)o.ttl_s;
    sb->paused_ms = o.paused_ms;
    sb->paused_mono = sb->paused_ms ? wall_to_mono(sb->paused_ms) : 0;
    /* No vm_id and no run_dir: its VM never got that far (a failed create). */
    if (!*vm_id && run_dir) {
        struct sbx_vm *vm;
        int r = sbx_vm_legacy(t, sb->id, o.tmpl, sbx_state_final(st) ? 0 : (pid_t)o.pid, run_dir,
                              disk, sb->mem_mb, sb->vcpus, &vm);
        if (r != 0) {
            rec_sandbox_free(&o);
            return r;
        }
        snprintf(sb->vm_id, sizeof(sb->vm_id), "%s", vm->id);
        LOGS(LOG_INFO, sb->id, "record of an older warrend: its VM keeps the id %s", vm->id);
        t->idx_dirty = true;
    }
    rec_sandbox_free(&o);
    return 0;
}

/*
 * Bind every VM record to the sandbox that names it; a VM whose sandbox is
 * gone (or names another VM) is destroyed, QEMU and files. A live sandbox
 * without its VM record is dead (adopt_all). A VM bound to no sandbox is
 * destroyed too: nothing hands out such VMs yet (TODO: the pool re-adopts its
 * own instead).
 */
static void bind_all(struct sbx_table *t, bool rewrite)
{
    for (struct sbx_vm *vm = t->vms, *next; vm; vm = next) {
        struct sandbox *sb = vm->sb_id[0] ? sbx_find(t, vm->sb_id) : NULL;
        next = vm->next;
        if (!sb && !vm->sb_id[0] && strcmp(vm->boot, "pool") == 0) {
            /* Stopped clones of a template: cheaper to make again than to re-adopt. */
            LOGS(LOG_INFO, vm->id, "pool VM of an earlier warrend: removing it (the pool refills)");
            sbx_vm_destroy(vm);
            continue;
        }
        if (!sb || sb->vmr || strcmp(sb->vm_id, vm->id) != 0) {
            LOGS(LOG_WARN, vm->id, "VM of %s, which has no record: removing it",
                 vm->sb_id[0] ? vm->sb_id : "no sandbox");
            sbx_vm_destroy(vm);
            continue;
        }
        sbx_vm_bind(vm, sb);
        /* A record moved from an older warrend's: the VM's first, then the sandbox's. */
        if (rewrite && sbx_vm_save(vm) == 0)
            sbx_save(sb);
    }
}

/*
 * Did this machine restart since the last warrend of this state dir ran? The kernel's
 * boot id, kept in state_dir/host_boot_id, says; the file then holds today's. A
 * machine that restarted lost every VM (a lost host of a fleet): its sandboxes end as
 * host_lost, not as VMs that died on their own.
 */
static bool host_restarted(const struct srv_config *c)
{
    char path[4096 + 32], now[64] = "", was[64] = "";
    FILE *f;
    bool changed;

    if ((f = fopen("/proc/sys/kernel/random/boot_id", "re"))) {
        if (!fgets(now, sizeof(now), f))
            now[0] = '\0';
        fclose(f);
    }
    snprintf(path, sizeof(path), "%s/host_boot_id", c->state_dir);
    if ((f = fopen(path, "re"))) {
        if (!fgets(was, sizeof(was), f))
            was[0] = '\0';
        fclose(f);
    }
    changed = now[0] && was[0] && strcmp(now, was) != 0;
    if (now[0] && strcmp(now, was) != 0 && (f = fopen(path, "we"))) {
        fputs(now, f);
        fclose(f);
    }
    return changed;
}

static void adopt_all(struct sbx_table *t)
{
    bool rebooted = host_restarted(t->cfg);

    if (rebooted)
        LOG(LOG_WARN, "this host restarted since warrend last ran: its VMs are gone");
    for (struct sandbox *sb = t->sandboxes; sb; sb = sb->next) {
        int r;

        if (!sbx_state_live(sb->state)) /* ended, dead, or paused: no VM to adopt */
            continue;
        r = sb->vmr ? sbx_vm_adopt(sb->vmr) : -ENOENT;
        if (r != 0) {
            LOGS(LOG_WARN, sb->id, "VM %s (pid %d) is gone (%s)", sb->vm_id,
                 sb->vmr ? (int)sb->vmr->pid : 0, strerror(-r));
            if (rebooted)
                sandbox_end(sb, ST_ENDED, "host_lost: the host restarted and its VMs with it");
            else
                sandbox_end(sb, ST_DEAD, "vm_lost: the VM was gone when warrend restarted");
            continue;
        }
        /* A sandbox still booting when warrend died gets a new boot deadline; its create
         * request is gone, but the sandbox itself is kept and listed. */
        if (sb->state == ST_STARTING)
            ev_timer_start(t->loop, &sb->boot_timer);
        LOGS(LOG_INFO, sb->id, "re-adopted VM %s pid %d", sb->vm_id, (int)sb->vmr->pid);
    }
}

/* ---- table ---- */

/* QEMU in a jail when possible (see vmm.h); else loudly unjailed, unless required. */
static int jail_setup(struct sbx_table *t)
{
    const struct srv_config *c = t->cfg;
    char root[4096 + 16], cg[512], why[256] = "", desc[256];
    struct vmm_jail_conf jc = {
        .uid_base = c->jail_uid_base,
        .uid_count = c->jail_uid_count,
        .cgroup_name = cg,
        .root_dir = root,
        .mem_overhead_mb = c->jail_mem_overhead_mb,
        .pids_max = c->jail_pids_max,
        .uid_lock_dir = c->jail_uid_lock_dir,
    };
    int r;

    if (strcmp(c->jail, "off") == 0) {
        LOG(LOG_WARN, "WARNING: jail = off: every QEMU runs as warrend's uid and sees the API "
                      "key, the index and every other sandbox's files");
        return 0;
    }
    /* One parent group per state dir: warrend sweeps its parent of groups no
     * live VM holds at start, which must never reach another warrend's VMs. */
    {
        char tag[9];
        sbx_state_tag(c->state_dir, tag);
        snprintf(cg, sizeof(cg), "%s/%s", c->jail_cgroup, tag);
    }
    snprintf(root, sizeof(root), "%s/jail-root", c->state_dir);
    r = vmm_jail_new(&jc, &t->jail, why, sizeof(why));
    if (r == 0) {
        LOG(LOG_INFO, "jail: %s", vmm_jail_describe(t->jail, desc, sizeof(desc)));
        return 0;
    }
    if (strcmp(c->jail, "required") == 0) {
        LOG(LOG_ERR, "jail = required, but QEMU cannot be jailed here: %s", why);
        return r;
    }
    LOG(LOG_WARN,
        "WARNING: QEMU runs UNJAILED (as warrend's uid, seeing the API key, the index and "
        "every other sandbox's files): %s. Set jail = required to refuse this.",
        why);
    return 0;
}

/* ---- what the pool gets of the table (pool.h, struct pool_host) ---- */

static void ph_idx_changed(void *ctx)
{
    ((struct sbx_table *)ctx)->idx_dirty = true;
}

static void ph_random(void *ctx, void *p, size_t n)
{
    sbx_random(ctx, p, n);
}

static int ph_vm_new(void *ctx, const char *tmpl, unsigned mem_mb, unsigned vcpus,
                     struct sbx_vm **out)
{
    int r = sbx_vm_new(ctx, tmpl, mem_mb, vcpus, out);

    if (r == 0) /* unbound at a restart: removed */
        snprintf((*out)->boot, sizeof((*out)->boot), "pool");
    return r;
}

static int ph_vm_start_restore(struct sbx_vm *vm, const char *backing, const char *mem)
{
    int r;

    if ((r = sbx_vm_overlay(vm, backing, 0)) != 0 || (r = sbx_vm_launch_restore(vm, mem, 0)) != 0)
        return r;
    return sbx_vm_save(vm);
}

static const char *ph_vm_id(const struct sbx_vm *vm)
{
    return vm->id;
}

static struct vmm *ph_vm_vmm(const struct sbx_vm *vm)
{
    return vm->vmm;
}

static bool ph_vm_up(const struct sbx_vm *vm)
{
    return vm->vmm && !vm->gone;
}

static void ph_vm_config_init(void *ctx, struct vmm_config *vc, const char *id, const char *disk,
                              const char *run_dir, unsigned mem_mb, unsigned vcpus)
{
    sbx_vm_config_init(ctx, vc, id, disk, run_dir, mem_mb, vcpus);
}

static int ph_net_config(void *ctx, const char *id, int *slot, const struct net_policy *pol,
                         struct vmm_config *vc, char ***wrap)
{
    return sbx_vm_net_config(ctx, id, slot, pol, vc, wrap);
}

static void ph_net_release(void *ctx, const char *id, int *slot)
{
    sbx_vm_net_release(ctx, id, slot);
}

static int pool_start(struct sbx_table *t)
{
    const struct pool_host h = {
        .ctx = t,
        .loop = t->loop,
        .cfg = t->cfg,
        .idx = t->idx,
        .bg = t->bg,
        .image_dir = t->image_dir,
        .kernel = t->kernel,
        .initrd = t->initrd,
        .jail = t->jail != NULL,
        .net = t->net != NULL,
        .idx_changed = ph_idx_changed,
        .random = ph_random,
        .vm_new = ph_vm_new,
        .vm_start_restore = ph_vm_start_restore,
        .vm_destroy = sbx_vm_destroy,
        .vm_id = ph_vm_id,
        .vm_vmm = ph_vm_vmm,
        .vm_up = ph_vm_up,
        .vm_config_init = ph_vm_config_init,
        .net_config = ph_net_config,
        .net_release = ph_net_release,
    };

    return pool_new(&h, &t->pool);
}

int sbx_table_new(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table **out)
{
    struct sbx_table *t = calloc(1, sizeof(*t));
    char path[4096], why[256];
    int r;

    if (!t)
        return -ENOMEM;
    t->loop = loop;
    t->cfg = cfg;
    if ((r = util_drbg_seed(&t->entropy, &t->drbg, "warren-sbx")) != 0)
        goto fail;
    if (!realpath(cfg->image_dir, t->image_dir)) {
        r = -errno;
        LOG(LOG_ERR, "image dir %s: %s (build the images: images/build.sh)", cfg->image_dir,
            strerror(errno));
        goto fail;
    }
    if (snprintf(t->kernel, sizeof(t->kernel), "%s/vmlinux", t->image_dir) >=
            (int)sizeof(t->kernel) ||
        snprintf(t->initrd, sizeof(t->initrd), "%s/initramfs.cpio", t->image_dir) >=
            (int)sizeof(t->initrd)) {
        r = -ENAMETOOLONG;
        goto fail;
    }
    if ((r = bg_new(loop, &t->bg)) != 0)
        goto fail;
    snprintf(path, sizeof(path), "%s/vms", cfg->state_dir);
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        r = -errno;
        goto fail;
    }
    snprintf(path, sizeof(path), "%s/index", cfg->state_dir);
    r = idx_open(path, &t->idx);
    if (r != 0) {
        LOG(LOG_ERR, "cannot open the index %s: %s", path, idx_strerror(r));
        goto fail;
    }
    if (strcmp(cfg->accel, "kvm") == 0)
        t->accel = VMM_ACCEL_KVM;
    else if (strcmp(cfg->accel, "tcg") == 0)
        t->accel = VMM_ACCEL_TCG;
    else
        t->accel = vmm_detect_accel(why, sizeof(why));
    if ((r = jail_setup(t)) != 0)
        goto fail;
    if ((r = net_new(cfg, &t->net, why, sizeof(why))) != 0) {
        LOG(LOG_ERR, "net: cannot start: %s", why);
        goto fail;
    }
    if (idx_migrated(t->idx))
        LOG(LOG_INFO, "index: moved %u record(s) of the old layout into the sandboxes table",
            idx_migrated(t->idx));
    /* VMs first: a sandbox record of an older warrend makes a VM record unless one is
     * there already. */
    r = sbx_snap_restore_all(t);
    if (r == 0)
        r = sbx_vm_restore_all(t);
    if (r == 0) /* what neither a pause snapshot nor a VM record needs any more */
        sbx_snap_bases_sweep(t);
    if (r == 0)
        r = idx_foreach(t->idx, IDX_SANDBOXES, restore_one, t);
    if (r != 0)
        goto fail;
    bind_all(t, t->idx_dirty);
    adopt_all(t);
    sbx_vm_sweep(t);
    sbx_net_ahead_sweep(t);
    sbx_net_ahead_fill(t);
    /* After adoption: the groups of VMs that were not re-adopted go. */
    if (t->jail && (r = vmm_jail_sweep(t->jail, t->cfg->state_dir)) > 0)
        LOG(LOG_INFO, "jail: removed %d stale cgroup(s)", r);
    /* After the sweep: the pool's VMs get records of their own from here on. */
    if ((r = pool_start(t)) != 0)
        LOG(LOG_WARN, "pool: cannot start: %s; every create boots", strerror(-r));
    ev_timer_init(&t->reaper, on_reap, 1.0, 1.0);
    t->reaper.data = t;
    ev_timer_start(loop, &t->reaper);
    *out = t;
    return 0;
fail:
    sbx_table_free(t, false);
    return r;
}

void sbx_table_free(struct sbx_table *t, bool kill_vms)
{
    if (!t)
        return;
    ev_timer_stop(t->loop, &t->reaper);
    pool_free(t->pool); /* its VMs are in t->vms: before they are freed */
    t->pool = NULL;
    while (t->sandboxes) {
        struct sandbox *sb = t->sandboxes;
        t->sandboxes = sb->next;
        ops_fail_all(sb, SBX_E_SHUTTING_DOWN, "warrend is shutting down");
        sandbox_free(sb);
    }
    sbx_vm_free_all(t, kill_vms);
    sbx_net_apply_free(t);
    sbx_net_ahead_free(t);
    net_free(t->net);
    t->net = NULL;
    sbx_snap_free_all(t);
    /* Queued removals and flushes finish first; shutdown may then wait on the disk. */
    bg_free(t->bg);
    if (t->idx) {
        idx_sync(t->idx);
        idx_close(t->idx);
    }
    /* Deleted VMs still dying give their uid and cgroups back before we go. */
    (void)vmm_settle_orphans(2000);
    vmm_jail_free(t->jail);
    util_drbg_free(&t->entropy, &t->drbg);
    free(t);
}

/* ---- the port proxy (sbx.h, server/ports.c) ---- */

int sbx_port_open(struct sbx_table *t, const char *id, char *ns, size_t cap, char vm[24],
                  struct sbx_err *err)
{
    struct sandbox *sb = NULL;
    int status;

    if (!t->net)
        return sbx_err_set(err, SBX_E_CONFLICT,
                           "sandbox networking is off (net_enabled in conf/): no ports to reach");
    if ((status = sbx_usable(t, id, &sb, err)))
        return status;
    if (!sb->vm_id[0])
        return sbx_err_set(err, SBX_E_NOT_READY, "sandbox %s has no VM yet; try again shortly",
                           sb->id);
    net_ns_path(t->net, sb->vm_id, ns, cap);
    snprintf(vm, 24, "%s", sb->vm_id);
    return 0;
}

int sbx_port_check(struct sbx_table *t, const char *id, const char *vm, bool used)
{
    struct sandbox *sb = sbx_find(t, id);

    if (!sb || sbx_state_final(sb->state) || sb->state == ST_PAUSED || strcmp(sb->vm_id, vm) != 0)
        return -ESRCH;
    if (used) {
        sbx_touch(sb);
        /* A frozen VM continues: its guest has a connection to answer. */
        if (sbx_state_stopped(sb->state) && sb->ready && sb->ch)
            sbx_thaw(sb, true);
    }
    return 0;
}

bool sbx_port_public(struct sbx_table *t, const char *id, unsigned port)
{
    struct sandbox *sb = sbx_find(t, id);

    for (unsigned i = 0; sb && i < sb->npublic; i++)
        if (sb->public_ports[i] == port)
            return true;
    return false;
}
