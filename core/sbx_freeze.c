/*
 * sbx_freeze.c - idle freeze and thaw of a sandbox's VM, and the resync of
 * the guest's clock and RNG (after a restore, a hand-out, a fork, or a thaw
 * with QMP; see sbx_int.h).
 *
 * Freeze: the reaper's tick finds a RUNNING sandbox with a ready channel, no
 * op in flight (an attached PTY viewer or session stream is an op) and no
 * request for freeze_after_ms; it becomes FROZEN and its QEMU is stopped
 * whole with SIGSTOP (vmm_freeze: vCPUs and everything else, memory kept, no
 * CPU used). With keep_running a PLIST is asked first and a live process
 * holds it off.
 *
 * Thaw: the first operation (sbx_usable), or a guest channel (re)connect,
 * sends SIGCONT (vmm_thaw: the VM runs before the call returns). No RESYNC
 * follows: the guest's clocks kept time while its QEMU was stopped (its TSC
 * is the host's), and a VM that was not copied has an RNG state of its own.
 *
 * Not QMP stop and cont: QEMU's monitor reads a command one byte per turn of
 * its loop, so "cont" alone took ~0.6 ms, and the guest's first steps after
 * it cost ~2 ms more (load/RESULTS.md); a SIGCONT'ed VM answers the next
 * exec within ~0.5 ms of one that never stopped. A VM the index says is frozen but
 * whose QEMU this warrend did not stop (adopted after a restart: vmm_adopt
 * continues it; or stopped with QMP by an older warrend) gets a QMP "cont"
 * instead, harmless on a running VM, and a RESYNC (time, fresh entropy)
 * ahead of the operation's frame: its clock stood still.
 *
 * Ordering against a kill -9 of warrend: the index says "frozen" before the
 * SIGSTOP goes out, and "running" only after the VM was continued. A restart
 * therefore finds "frozen" whenever the VM may be stopped, and continues it.
 *
 * Page-out: a VM frozen for freeze_pageout_after_ms has its QEMU's memory pushed
 * out to swap (vmm_pageout: MADV_PAGEOUT on a worker thread, one VM at a time, only
 * with free swap on the host). Its resident memory falls from ~40 to ~6 MiB under
 * TCG; the thaw is the same SIGCONT, and the guest faults its pages back from swap
 * as it runs (its first request takes tens of ms more: load/RESULTS.md).
 *
 * Internal requests (RESYNC, the keep_running PLIST) use stream ids from
 * sb->next_stream like ops, one of each kind at a time; their answers are
 * taken here before ops see the frame.
 */
#include "sbx_int.h"
#include "log.h"

#include <errno.h>
#include <string.h>
#include <time.h>

static int64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
static const char qmp_cont[] = "{\"execute\":\"cont\"}";

/* ---- resync ---- */

int sbx_resync(struct sandbox *sb, unsigned flags, sbx_resync_cb cb, void *ud)
{
    struct proto_enc e;
    uint8_t entropy[PROTO_ENTROPY], rnd[16];
    char boot_id[PROTO_BOOT_ID + 1];
    struct timespec ts;
    bool bid = flags & SBX_RESYNC_BOOT_ID, host = flags & SBX_RESYNC_HOSTNAME;
    uint32_t id;

    if (!sb->ch || !sb->ready)
        return -ENOTCONN;
    if (bid) {
        /* A random (version 4) UUID, as the kernel makes its own. */
        sbx_random(sb->t, rnd, sizeof(rnd));
        rnd[6] = (uint8_t)((rnd[6] & 0x0f) | 0x40);
        rnd[8] = (uint8_t)((rnd[8] & 0x3f) | 0x80);
        snprintf(boot_id, sizeof(boot_id),
                 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", rnd[0],
                 rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7], rnd[8], rnd[9], rnd[10],
                 rnd[11], rnd[12], rnd[13], rnd[14], rnd[15]);
    }
    sbx_random(sb->t, entropy, sizeof(entropy));
    id = ++sb->next_stream;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (proto_enc_begin(&e, chan_tx(sb->ch), PROTO_RESYNC, id, 4 + bid + host) != 0)
        return -ENOMEM;
    proto_put_u(&e, PK_TIME_NS, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec);
    proto_put_bin(&e, PK_ENTROPY, entropy, sizeof(entropy));
    if (bid)
        proto_put_str(&e, PK_BOOT_ID, boot_id, PROTO_BOOT_ID);
    if (host)
        proto_put_cstr(&e, PK_HOSTNAME, sb->id);
    if (proto_enc_end(&e) != 0)
        return -ENOMEM;
    /* The newer RESYNC wins in the guest (frames are handled in order): the older one's
     * caller hears that it was superseded. */
    sbx_freeze_reset_resync(sb, -ECANCELED);
    sb->resync_stream = id;
    sb->resync_cb = cb;
    sb->resync_ud = ud;
    chan_flush(sb->ch);
    return 0;
}

void sbx_freeze_reset_resync(struct sandbox *sb, int err)
{
    sbx_resync_cb cb = sb->resync_cb;
    void *ud = sb->resync_ud;
    bool pending = sb->resync_stream != 0;

    sb->resync_stream = 0;
    sb->resync_cb = NULL;
    sb->resync_ud = NULL;
    if (pending && cb)
        cb(sb, err, ud);
}

void sbx_freeze_reset(struct sandbox *sb, int err)
{
    sb->probe_stream = 0;
    sbx_freeze_reset_resync(sb, err);
}

/* ---- thaw ---- */

static void on_cont(void *ud, int err, const char *json)
{
    struct sandbox *sb = ud;
    char why[200];

    if (err) {
        snprintf(why, sizeof(why), "thaw_failed: QEMU refused cont: %.150s", json ? json : "");
        LOGS(LOG_ERR, sb->id, "%s", why);
        sbx_die(sb, why);
        return;
    }
    LOGS(LOG_DEBUG, sb->id, "thaw: cont answered in %.3f ms",
         (double)(now_us() - sb->thaw_us) / 1000.0);
    /* Only now is the VM known to run: the index says so from here on (see the top). */
    if (sb->state == ST_RUNNING)
        sbx_save(sb);
}

static void on_resynced(struct sandbox *sb, int err, void *ud)
{
    (void)ud;
    /* The request that woke the sandbox was queued right behind the RESYNC: this is what the
     * thaw added to it, at most. */
    if (!err)
        LOGS(LOG_DEBUG, sb->id, "thaw: resync answered in %.3f ms",
             (double)(now_us() - sb->thaw_us) / 1000.0);
    if (err && err != -ECANCELED && err != -ECONNRESET && err != -ESHUTDOWN)
        LOGS(LOG_WARN, sb->id, "the guest did not apply the resync after a thaw: %s",
             strerror(-err));
}

int sbx_thaw(struct sandbox *sb, bool resync)
{
    bool sig;
    int r;

    if (!sbx_state_stopped(sb->state))
        return 0;
    if (!sb->vm || sb->vm_gone)
        return -ESRCH;
    sb->thaw_us = now_us();
    if (sb->paged_out)
        LOGS(LOG_DEBUG, sb->id, "thaw of a paged-out VM: its pages come back from swap");
    sb->paged_out = false;
    if ((sig = vmm_frozen(sb->vm))) {
        if ((r = vmm_thaw(sb->vm)) != 0) {
            LOGS(LOG_ERR, sb->id, "cannot continue the frozen VM: %s", strerror(-r));
            return r;
        }
    } else if ((r = vmm_qmp(sb->vm, qmp_cont, on_cont, sb)) != 0) {
        LOGS(LOG_ERR, sb->id, "cannot continue the frozen VM: %s", strerror(-r));
        return r;
    }
    if ((r = sbx_state_set(sb, ST_RUNNING)) != 0)
        return r;
    LOGS(LOG_DEBUG, sb->id, "thawed after %.1f s frozen",
         (double)(sbx_now_ms() - sb->frozen_mono) / 1000.0);
    if (sig) {
        /* The VM runs now: the index may say so (with QMP, on_cont does once QEMU
         * answered). No RESYNC: the guest's clocks kept time while it was stopped, and
         * the VM was not copied, so its RNG state is its own. One would hold up the frame
         * of whatever woke it by ~1 ms of the guest's time under TCG (load/RESULTS.md). */
        sbx_save(sb);
        return 0;
    }
    /* Continued with QMP: the guest's clock stood still while stopped, so it is set (and
     * the RNG reseeded) before the frame of whatever woke us. */
    if (resync && (r = sbx_resync(sb, 0, on_resynced, NULL)) != 0)
        LOGS(LOG_WARN, sb->id, "cannot resync the guest after a thaw: %s", strerror(-r));
    return 0;
}

/* ---- freeze ---- */

static void freeze(struct sandbox *sb)
{
    int r;

    if (sbx_state_set(sb, ST_FROZEN) != 0)
        return;
    /* Recorded before the SIGSTOP (see the top): the index never calls a stopped VM
     * running. No record, no freeze. */
    if (sbx_save(sb) != 0) {
        sbx_state_set(sb, ST_RUNNING);
        return;
    }
    sb->pageout_tried = sb->paged_out = false;
    r = vmm_freeze(sb->vm);
    if (r != 0) {
        /* Busy (a QMP command or an operation in flight): the next tick tries again. */
        LOGS(r == -EBUSY || r == -EPERM ? LOG_DEBUG : LOG_WARN, sb->id, "cannot freeze: %s",
             strerror(-r));
        if (sbx_state_set(sb, ST_RUNNING) == 0)
            sbx_save(sb);
        return;
    }
    sb->frozen_mono = sbx_now_ms();
    LOGS(LOG_DEBUG, sb->id, "frozen after %.1f s idle",
         (double)(sb->frozen_mono - sb->active_mono) / 1000.0);
}

/* Idle long enough, nothing in flight, and a VM and a ready channel to stop and wake. A
 * RESYNC still unanswered does not count: a guest that never answers it (an agent older
 * than RESYNC drops the frame) must not stay running for good, and the next thaw sends a
 * new one anyway. */
static bool freezable(const struct sandbox *sb, int64_t now)
{
    unsigned after = sb->t->cfg->freeze_after_ms;

    return after && sb->state == ST_RUNNING && sb->ready && sb->ch && sb->vm && !sb->vm_gone &&
           sb->nops == 0 && now - sb->active_mono >= (int64_t)after;
}

/* keep_running: ask the guest whether a background process or PTY runs (PLIST); the answer
 * freezes or not (sbx_freeze_frame). */
static void probe(struct sandbox *sb, int64_t now)
{
    struct proto_enc e;
    uint32_t id = ++sb->next_stream;

    if (proto_enc_begin(&e, chan_tx(sb->ch), PROTO_PLIST, id, 2) != 0 || proto_enc_end(&e) != 0)
        return;
    sb->probe_stream = id;
    sb->probe_mono = now;
    chan_flush(sb->ch);
}

/* ---- page-out of a long-frozen VM ---- */

static void pageout_tick(struct sandbox *sb, int64_t now);

static void on_pageout(void *ud, int err, const char *why)
{
    struct sandbox *sb = ud;
    struct sbx_table *t = sb->t;
    int64_t now = sbx_now_ms();

    if (t->pageout_sb == sb)
        t->pageout_sb = NULL;
    if (err == 0) {
        sb->paged_out = sb->state == ST_FROZEN;
        LOGS(LOG_INFO, sb->id, "%s, after %.0f s frozen", why,
             (double)(now - sb->frozen_mono) / 1000.0);
    } else if (err != -ECANCELED) {
        LOGS(LOG_WARN, sb->id, "cannot page out the frozen VM: %s", why);
    }
    /* The next one due starts now rather than at the reaper's next tick: a thousand
     * sandboxes frozen at once are paged out in about a minute, not in a thousand ticks. */
    for (struct sandbox *o = t->sandboxes; o && !t->pageout_sb; o = o->next)
        if (o->state == ST_FROZEN)
            pageout_tick(o, now);
}

/* The host's free swap, read at most once a second for all sandboxes. */
static int64_t swap_free_kb(struct sbx_table *t, int64_t now)
{
    if (!t->swap_mono || now - t->swap_mono >= 1000) {
        t->swap_kb = vmm_host_swap_free_kb();
        t->swap_mono = now;
    }
    return t->swap_kb;
}

/* Frozen for freeze_pageout_after_ms: once per freeze, and one VM at a time (each costs
 * tens of ms of a core, compressing for zram), its memory goes to swap. Without free swap
 * nothing is tried: anonymous memory has nowhere to go. */
static void pageout_tick(struct sandbox *sb, int64_t now)
{
    struct sbx_table *t = sb->t;
    unsigned after = t->cfg->freeze_pageout_after_ms;
    int r;

    if (!after || sb->pageout_tried || !vmm_frozen(sb->vm) || sb->vm_gone ||
        now - sb->frozen_mono < (int64_t)after)
        return;
    if (t->pageout_sb && vmm_pageout_busy(t->pageout_sb->vm))
        return;
    if (swap_free_kb(t, now) < 64 * 1024)
        return;
    sb->pageout_tried = true;
    if ((r = vmm_pageout(sb->vm, on_pageout, sb)) != 0) {
        LOGS(LOG_WARN, sb->id, "cannot page out the frozen VM: %s", strerror(-r));
        return;
    }
    t->pageout_sb = sb;
}

void sbx_freeze_tick(struct sandbox *sb, int64_t now)
{
    if (sb->state == ST_FROZEN) {
        pageout_tick(sb, now);
        return;
    }
    if (!freezable(sb, now) || sb->probe_stream)
        return;
    if (sb->keep_running) {
        /* A process found running holds off the next question for another period. */
        if (now - sb->probe_mono >= (int64_t)sb->t->cfg->freeze_after_ms)
            probe(sb, now);
        return;
    }
    freeze(sb);
}

/* A PLIST answer: does any entry say running: true? Entries are untrusted; only that key of
 * each map is looked at, and anything odd counts as running (then nothing is frozen). */
static bool any_running(const struct proto_frame *f)
{
    const msgpack_object_array *a;

    if (f->type != PROTO_RESULT || !proto_has(f, PK_PROCS))
        return true;
    a = f->v[PK_PROCS].arr;
    for (uint32_t i = 0; i < a->size; i++) {
        const msgpack_object_map *m = &a->ptr[i].via.map;
        for (uint32_t k = 0; k < m->size; k++) {
            const msgpack_object *key = &m->ptr[k].key, *v = &m->ptr[k].val;
            if (key->type == MSGPACK_OBJECT_STR && key->via.str.size == 7 &&
                !memcmp(key->via.str.ptr, "running", 7) &&
                (v->type != MSGPACK_OBJECT_BOOLEAN || v->via.boolean))
                return true;
        }
    }
    return false;
}

bool sbx_freeze_frame(struct sandbox *sb, const struct proto_frame *f)
{
    bool resync;

    if (f->id == 0 || (f->id != sb->resync_stream && f->id != sb->probe_stream))
        return false;
    resync = f->id == sb->resync_stream;
    if (f->type != PROTO_RESULT && f->type != PROTO_ERROR) {
        sbx_violation(sb, "%s frame on a %s stream", proto_type_name(f->type),
                      resync ? "resync" : "plist");
        return true;
    }
    if (resync) {
        int64_t code = proto_has(f, PK_CODE) ? f->v[PK_CODE].i : 0;
        int err = f->type == PROTO_RESULT ? 0 : (code > 0 && code < 4096 ? (int)-code : -EIO);
        sbx_freeze_reset_resync(sb, err);
        return true;
    }
    sb->probe_stream = 0;
    if (!any_running(f) && freezable(sb, sbx_now_ms()))
        freeze(sb);
    return true;
}
