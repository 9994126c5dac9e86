/*
 * sbx_int.h - the sandbox table's internals (warren_core): the structs and
 * calls its parts share (lifecycle, index, reaper, VMs, operations,
 * snapshots, freeze, networking). Not for the HTTP layer, which sees only
 * sbx.h, nor for the pool, which sees the table through struct pool_host
 * (pool.h, filled by sbx.c) and its pure helpers through sbx_util.h.
 *
 * Lifetimes: a sandbox lives in t->sandboxes from create (or restore) until
 * the reaper purges it after its retention time. An op lives from its
 * sbx_* call until it finishes (ops_finish: it is unlinked and freed, with
 * what it owns (struct op), then the sink's done is called) or is cancelled
 * (sbx_op_cancel: a create is freed at once and its sandbox ended; any op is
 * freed at once when there is no channel; else it stays, silent, until its
 * work or the guest's last frame for its stream finishes it). Every op belongs to one
 * running sandbox; ending a sandbox finishes all its ops first, so an op
 * never outlives its sandbox.
 *
 * VMs have their own identity (struct sbx_vm, sbx_vm.c): an id of their own,
 * a record in the index's vms table and a run dir named after that id. A VM
 * lives in t->vms from sbx_vm_new (or restore) until sbx_vm_destroy; it is
 * bound to at most one sandbox (sbx_vm_bind), which then gets its channel and
 * exit callbacks. A sandbox's VM is destroyed when the sandbox is purged. At
 * start, VM records whose sandbox is gone are destroyed (QEMU killed, run dir
 * removed), and run dirs no VM record names are swept.
 */
#ifndef WARREN_SBX_INT_H
#define WARREN_SBX_INT_H

#include "sbx.h"
#include "sbx_state.h"
#include "sbx_util.h"
#include "bg.h"
#include "chan.h"
#include "config.h"
#include "gstream.h"
#include "idx.h"
#include "net.h"
#include "proto.h"
#include "vmm.h"
#include "rec.h"

#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>

/* OP_PLIST, OP_ATTACH and OP_PCTL are the process operations of ops_proc.c. */
/* OP_SNAP: a snapshot being taken (sbx_snap.c); no guest stream. OP_RESUME: a resume
 * waiting for the guest's session, answered like a create. */
enum op_kind {
    OP_CREATE,
    OP_EXEC,
    OP_FREAD,
    OP_FWRITE,
    OP_FOP,
    OP_PLIST,
    OP_ATTACH,
    OP_PCTL,
    OP_SNAP,
    OP_RESUME,
    OP_NETPOL /* PATCH .../network: no guest stream (sbx_netpol.c) */
};

struct sandbox;

/* One VM, bound to a sandbox or not (see the top of this file). */
struct sbx_vm {
    struct sbx_vm *next;
    struct sbx_table *t;
    char id[24];        /* "vm-" + 16 hex; a VM of an older warrend keeps its sandbox's id */
    char tmpl[64];      /* the template it was booted from */
    char boot[16];      /* how it was started: "kernel" (cold boot) */
    char run_dir[4096]; /* state_dir/vms/<id> (state_dir/sandboxes/<id> for older VMs) */
    char disk[4096];
    /* The file warrend made (or took) its overlay over, as warrend named it: never
     * read back from the overlay, whose header QEMU (the guest's side) can write.
     * "" for a VM recorded by an older warrend. */
    char backing[4096 + 16];
    unsigned mem_mb, vcpus;
    int64_t created_ms;     /* wall clock */
    pid_t pid;              /* QEMU's pid; 0 once stopped */
    struct vmm *vmm;        /* NULL: not running, not (yet) adopted, or stopped */
    bool gone;              /* QEMU exited: vmm is freed outside its callback */
    struct sandbox *sb;     /* bound to, or NULL */
    char sb_id[SBX_ID_CAP]; /* the sandbox it is bound to, as recorded ("" for none) */
    /* networking (net.h): the /30 it holds (-1: none) and its policy */
    int net_slot;
    struct net_policy pol; /* set before launch, replaced by PATCH .../network; in the record */
    bool net_made;         /* its namespace was made ahead: QEMU is spawned inside it */
    /* Launched in restore mode over a template's RAM file: its path (a fork or pause of
     * it saves a delta over it; in the record, so an adopted VM keeps it). "" otherwise,
     * and for a VM recorded by an earlier warrend. */
    char mem[4096];
};

/*
 * An operation in flight: a common head every kind has, then the state of its
 * kind only (u, chosen by kind; no other member of u may be read). A path or a
 * tag is kept in str[], allocated with the op to its actual length (ops_new_str),
 * so one free releases it; what else an op owns is freed by ops_free: an exec's
 * output buffers, a listing's entries.
 */
struct op {
    struct op *next_all, *next_sb; /* links in t->ops and sb->ops */
    sbx_op_t id;
    enum op_kind kind;
    struct sandbox *sb;
    uint32_t stream; /* channel stream id (0 for create) */
    bool cancelled;  /* the requester is gone: no callbacks, drain the guest's frames */
    struct sbx_sink sink;
    void *user;
    int64_t started_ms;
    /* A guest stream's accounting (sbx_op_consumed may credit any op's stream). */
    size_t unacked;    /* bytes consumed but not yet credited back (sent in batches) */
    struct gstream gs; /* offsets, credit and size of the stream, as the host counts them */
    union {
        struct op_exec {      /* OP_EXEC */
            bool stream_mode; /* output goes to sink.data as it comes, not buffered */
            bool bg;          /* in the background (or a PTY): RESULT{pid} answers it */
            bool truncated[2];
            struct proto_buf out[2]; /* JSON mode: stdout, stderr */
            const char *tag;         /* the client's label for it (in str[]), or NULL */
        } exec;
        struct op_file {         /* OP_FREAD, OP_FWRITE */
            const char *path;    /* in str[] */
            bool got_head;       /* download: the guest's RESULT{size} came */
            bool waiting_credit; /* upload: the requester was refused and waits for writable */
            bool finished_input; /* upload: END sent */
        } file;
        struct op_fop {                   /* OP_FOP */
            const char *path;             /* in str[] */
            enum proto_type type;         /* PROTO_STAT, PROTO_LIST, ... */
            struct sbx_stat_rec *entries; /* list results being gathered: n of cap, */
            size_t n, cap;                /* their strings as offsets into bytes */
            struct proto_buf bytes;
            size_t list_bytes; /* the listing's size so far, against list_max_bytes */
        } fop;
        struct op_proc {         /* OP_PLIST, OP_ATTACH, OP_PCTL */
            uint32_t pid;        /* the process (PLIST: 0 for all) */
            uint64_t attach_off; /* ATTACH: the offset asked for */
            bool resize;         /* PCTL: a resize (else a signal or stdin) */
        } proc;
    } u;
    char str[]; /* the path or the tag, NUL-terminated ("" for other kinds) */
};

struct sandbox {
    struct sandbox *next;
    struct sbx_table *t;
    char id[SBX_ID_CAP];
    char tmpl[64];
    enum sbx_state state; /* changed only by sandbox_state_set (sbx.c) */
    char reason[256];
    /* Wall clock (ms since the epoch): what GET shows and the index keeps. */
    int64_t created_ms, expires_ms, ended_ms;
    /* Monotonic (sbx_now_ms): what the reaper compares, so a step of the wall clock
     * neither expires a sandbox early nor keeps it past its TTL. */
    int64_t created_mono, expires_mono, ended_mono, active_mono;
    unsigned idle_s, mem_mb, vcpus;
    struct rec_kv env, metadata; /* as given to its create, each key once */
    char vm_id[24];              /* its VM's id, as recorded ("" for none) */
    char snap_id[SBX_ID_CAP]; /* the snapshot it was restored from ("" for none); paused: its own */
    bool persistent;          /* create option: the idle timeout pauses it instead of ending it */
    bool auto_pause;          /* create option: the TTL pauses it instead of ending it... */
    uint32_t ttl_s;           /* ...and gives it this TTL (the last one set) again at resume */
    int64_t paused_ms, paused_mono; /* when it was paused (wall, monotonic); 0: not paused */
    struct sbx_vm *vmr;             /* its VM (bound by sbx_vm_bind), or NULL */
    struct vmm *vm;                 /* vmr->vmm, kept in step by sbx_vm_*: NULL when none */
    bool vm_gone;                   /* the VM exited; vm is freed outside its callback */
    bool thaw_on_phase;             /* frozen at a restart: continue once QEMU's phase is known */
    struct chan *ch;
    bool ready;       /* the guest answered INIT on the current channel */
    uint32_t session; /* id of the INIT sent on the current channel */
    uint32_t next_stream;
    struct op *ops;
    unsigned nops;
    ev_timer boot_timer;
    uint64_t init_end;         /* channel bytes up to the end of the last INIT (chan_tx_mark) */
    unsigned inits_unanswered; /* INITs sent on this channel since the guest last answered */
    unsigned violations;       /* protocol violations so far (protocol_violations_max: dead) */
    ev_timer backoff_timer;    /* reconnect after a violation, later each time */
    int64_t viol_log_ms;       /* when the last violation was logged */
    unsigned viol_log_quiet;   /* violations not logged since */
    /* idle freeze (sbx_freeze.c) */
    bool keep_running;      /* create option: a live background process holds off freezing */
    uint32_t resync_stream; /* the RESYNC in flight (0: none) */
    void (*resync_cb)(struct sandbox *sb, int err, void *ud);
    void *resync_ud;
    uint32_t probe_stream; /* keep_running: the PLIST asked before freezing (0: none) */
    int64_t probe_mono;    /* when that PLIST was asked */
    int64_t frozen_mono;   /* when the VM was last stopped */
    int64_t thaw_us;       /* when the last thaw began (CLOCK_MONOTONIC us, for the log) */
    bool pageout_tried;    /* this freeze's page-out was started (or could not be) */
    bool paged_out;        /* and it pushed the VM's memory out to swap */
    /* a cold boot's warm hook (sbx_warm.c): its EXEC in flight (0: none), and done */
    uint32_t warm_stream;
    bool warm_done;
    int64_t warm_start;
    char warm_out[160]; /* the start of what it printed: a failure's reason */
    size_t warm_nout;
    /* create option public_ports: reachable through the port proxy without auth */
    uint16_t public_ports[SBX_PUBLIC_PORTS_MAX];
    unsigned npublic;
};

struct sbx_table {
    struct ev_loop *loop;
    const struct srv_config *cfg;
    struct idx *idx;
    struct sandbox *sandboxes;
    struct sbx_vm *vms;
    struct op *ops;
    sbx_op_t next_op;
    enum vmm_accel accel;
    char image_dir[4096];
    char kernel[4096 + 16], initrd[4096 + 16]; /* image_dir/vmlinux, image_dir/initramfs.cpio */
    ev_timer reaper;
    struct bg *bg;     /* disk work off the loop: run dir removal, index flush */
    bool idx_dirty;    /* written since the last flush was queued */
    bool idx_flushing; /* a flush is queued or running */
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
    struct vmm_jail *jail;      /* NULL: QEMU runs unjailed (jail = off, or not possible here) */
    struct pool *pool;          /* the warm pool (pool.h), NULL when off */
    struct net *net;            /* sandbox networking (net.h), NULL when off */
    struct net_ahead *ahead;    /* namespaces made ahead (net_ahead.c) */
    bool ahead_failed;          /* the last one failed: none made until the next create */
    struct net_apply *applies;  /* policy changes in progress (sbx_netpol.c) */
    struct sbx_snaps *snaps;    /* snapshots and the ones being taken (sbx_snap.c) */
    struct sandbox *pageout_sb; /* whose VM's page-out runs (one at a time), or NULL */
    int64_t swap_mono;          /* when swap_kb was read (sbx_freeze.c) */
    int64_t swap_kb;            /* the host's free swap then */
};

struct sandbox *sbx_find(struct sbx_table *t, const char *id);
/* Look up a sandbox for an operation: 0 and *out, or an sbx_errcode with *err. */
int sbx_usable(struct sbx_table *t, const char *id, struct sandbox **out, struct sbx_err *err);
/* Would mem MiB more for guests pass the memory quota (memory_reserve_mb,
 * memory_overcommit_percent; live sandboxes count, paused ones do not)? 0, or
 * SBX_E_MEMORY_EXHAUSTED with *err. Checked at create and at resume. */
int sbx_mem_quota(struct sbx_table *t, unsigned mem, struct sbx_err *err);
void sbx_touch(struct sandbox *sb);
/* End a sandbox for reason (state "ended"): fails its ops, stops its VM. */
void sbx_end(struct sandbox *sb, const char *reason);
/* Write sb's record to the index: 0, or the idx_* error (logged). */
int sbx_save(struct sandbox *sb);
/*
 * The guest broke the protocol (why: what it did, for the log, the failed ops
 * and the end reason): close the channel, fail every op on it with
 * protocol_violation, and reconnect after a backoff that doubles with each
 * violation; the protocol_violations_max-th one ends the sandbox dead with
 * reason "protocol_violation: why". Safe inside a channel callback; the op
 * being handled may be freed: return right after.
 */
void sbx_violation(struct sandbox *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sbx_random(struct sbx_table *t, void *p, size_t n);
/* A new id of a kind ("sb", "snap"): kind, this host's id, 16 random hex digits. out has
 * SBX_ID_CAP bytes. */
void sbx_new_id(struct sbx_table *t, const char *kind, char out[SBX_ID_CAP]);
/* Remove a run dir off the loop; keep_logs keeps console.log and qemu.log. */
void sbx_run_dir_remove(struct sbx_table *t, const char *dir, bool keep_logs);
/* The bound VM's events, for its sandbox (sbx.c). */
void sbx_on_channel(struct sandbox *sb, int fd);
void sbx_on_vm_exited(struct sandbox *sb, int status, const char *reason);
void sbx_on_vm_phase(struct sandbox *sb, enum vmm_phase from, enum vmm_phase to);

/* ---- VMs (sbx_vm.c) ---- */

/* A new VM record (not saved, not running, bound to nothing) for a cold boot of tmpl,
 * with its run dir made: 0 and *out, or -errno. */
int sbx_vm_new(struct sbx_table *t, const char *tmpl, unsigned mem_mb, unsigned vcpus,
               struct sbx_vm **out);
/* Bind vm to sb: its channel and exit callbacks go to sb from now on. Neither may be
 * bound already. Saves nothing: the caller saves both records. A channel that came
 * while vm was unbound was closed: a running VM's new sandbox asks for one
 * (vmm_channel_reconnect). */
void sbx_vm_bind(struct sbx_vm *vm, struct sandbox *sb);
/* Start QEMU for vm (disk backed by the read-only file backing): 0 or -errno. */
int sbx_vm_launch(struct sbx_vm *vm, const char *backing);
/* Make vm's overlay (vm->disk) over backing (vmm_qcow2_create; size 0: backing's)
 * and remember that name as vm->backing: 0 or -errno. */
int sbx_vm_overlay(struct sbx_vm *vm, const char *backing, uint64_t size);
/* *vc zeroed, then what every VM's QEMU gets from the table and conf (QEMU, kernel,
 * initramfs, command line, accelerator, translation cache, log caps) and these. No jail:
 * the caller's choice. */
void sbx_vm_config_init(const struct sbx_table *t, struct vmm_config *vc, const char *id,
                        const char *disk, const char *run_dir, unsigned mem_mb, unsigned vcpus);
/* Networking (net.h) for a VM launched outside sbx_vm_launch (the pool's
 * template): with t->net, take a slot into *slot if it holds none (-1) and
 * point vc at the wrapper (*wrap, freed with net_wrap_free after vmm_launch),
 * the MAC and the guest's command line. Without t->net: 0, nothing done. */
int sbx_vm_net_config(struct sbx_table *t, const char *id, int *slot, const struct net_policy *pol,
                      struct vmm_config *vc, char ***wrap);
/* Remove id's namespace and give its slot back (*slot becomes -1). */
void sbx_vm_net_release(struct sbx_table *t, const char *id, int *slot);
/* sbx_vm_new with a given id (from sbx_net_ahead_take); NULL: a random one. */
int sbx_vm_new_id(struct sbx_table *t, const char *id, const char *tmpl, unsigned mem_mb,
                  unsigned vcpus, struct sbx_vm **out);

/* ---- namespaces made ahead (net_ahead.c) ---- */

/* Start making namespaces (default policy) until cfg->net_ahead exist or are
 * being made. No-op without networking. */
void sbx_net_ahead_fill(struct sbx_table *t);
/* A ready one: its VM id into id and its slot into *slot (both the caller's
 * now), true; false if none is ready. */
bool sbx_net_ahead_take(struct sbx_table *t, char *id, size_t cap, int *slot);
/* At start, before the first fill: remove markers a killed warrend left. */
void sbx_net_ahead_sweep(struct sbx_table *t);
/* Remove every namespace not taken (shutdown). */
void sbx_net_ahead_free(struct sbx_table *t);
/* Kill the policy changes still running (shutdown). */
void sbx_net_apply_free(struct sbx_table *t);
/* Start QEMU for a pool VM: restore mode over the template's RAM file mem_path (its
 * disk an overlay of the template's frozen one), WAITING for vmm_restore: 0 or -errno.
 * Jailed, QEMU maps mem_fd, a sealed copy of that file (vmm_mem_seal), in its place;
 * 0: the pool's. */
int sbx_vm_launch_restore(struct sbx_vm *vm, const char *mem_path, int mem_fd);
/* Re-attach to vm's QEMU after a restart: 0 or -errno (-ESRCH: it is gone). */
int sbx_vm_adopt(struct sbx_vm *vm);
/* Write vm's record to the vms table: 0, or the idx_* error (logged). */
int sbx_vm_save(struct sbx_vm *vm);
/* Stop vm (its sandbox ended): QEMU killed unless it already exited, the run dir
 * removed (keep_logs: all but the logs), the record saved with no pid. */
void sbx_vm_stop(struct sbx_vm *vm, bool keep_logs);
/* Free the vmm of a VM that exited (never from inside its own callback). */
void sbx_vm_reap(struct sbx_vm *vm);
/* Remove vm for good: QEMU killed, record deleted, run dir removed, unbound, freed. */
void sbx_vm_destroy(struct sbx_vm *vm);
/* Read the vms table into t->vms (nothing bound, nothing adopted): 0 or -errno. */
int sbx_vm_restore_all(struct sbx_table *t);
/* A VM record for a sandbox record of an older warrend (its VM named after the
 * sandbox, with pid, run_dir and disk in the sandbox record), unless one with that id
 * was restored already: 0 and *out, or -errno. */
int sbx_vm_legacy(struct sbx_table *t, const char *sb_id, const char *tmpl, pid_t pid,
                  const char *run_dir, const char *disk, unsigned mem_mb, unsigned vcpus,
                  struct sbx_vm **out);
struct sbx_vm *sbx_vm_find(struct sbx_table *t, const char *id);
/* Kill and remove every run dir (state_dir/vms/, and state_dir/sandboxes/ of older
 * warrends) whose name no VM record has as its id, with any QEMU started for it. */
void sbx_vm_sweep(struct sbx_table *t);
/* Detach (kill_vms false: leave QEMU running for the next warrend) or kill every VM,
 * and free the records. */
void sbx_vm_free_all(struct sbx_table *t, bool kill_vms);

/* Move sb to state `to` if sbx_state.h allows it: 0, or -EINVAL (logged, state unchanged). */
int sbx_state_set(struct sandbox *sb, enum sbx_state to);
/* End a sandbox dead for reason: fails its ops, stops its VM. */
void sbx_die(struct sandbox *sb, const char *reason);

/* Record a new sandbox and its VM (the VM's record first); on failure the sandbox ends
 * dead and err is set: 0 or -1. */
int sbx_record_new(struct sandbox *sb, struct sbx_vm *vm, struct sbx_err *err);

/* ---- snapshots (sbx_snap.c; the API is sbx_snap.h) ---- */

/* Read the snapshots table into t->snaps and remove snapshot dirs no record names:
 * 0 or -errno. */
int sbx_snap_restore_all(struct sbx_table *t);
void sbx_snap_free_all(struct sbx_table *t);
/* Remove the files in state_dir/bases that no snapshot (recorded or in the making)
 * names and no running VM maps (call it after the VM records are read: a resumed
 * booted sandbox maps its own). */
void sbx_snap_bases_sweep(struct sbx_table *t);
/* path is a file in state_dir/bases. */
bool sbx_in_bases(const struct sbx_table *t, const char *path);
/* sb's VM, adopted after a restart, was found stopped while sb is running: a snapshot
 * or pause cut short by the restart. Continued once QEMU's save is over. */
void sbx_snap_found_stopped(struct sandbox *sb);
/* The reaper's tick: remove fork snapshots nothing depends on any more. */
void sbx_snap_tick(struct sbx_table *t);
/* A sandbox resumed from its pause snapshot is up: record it as restored from the
 * snapshot that owns its disk's backing file now (the pause snapshot's disk became
 * its own), so the pause snapshot can go (sbx_snap.c). */
void sbx_snap_resumed(struct sandbox *sb);
/* A resume's guest was continued and then failed (no answer within boot_timeout, or its
 * QEMU ended): PAUSED again, as it was, if its pause snapshot is untouched (the disk was
 * copied, not taken); true if so, false: the caller ends it. */
bool sbx_snap_resume_failed(struct sandbox *sb, const char *why);
/* A create body naming snapshot_id id: its template, memory and vCPUs (the body may not
 * ask for others), its base image unchanged. 0, or an sbx_errcode with *err. */
int sbx_snap_for_create(struct sbx_table *t, const struct sbx_create_req *req, const char **tmpl,
                        unsigned *mem, unsigned *vcpus, struct sbx_err *err);
/* Start sb (STARTING, sb->snap_id set) from its snapshot: new VM, overlay over the
 * snapshot's disk, restore; the create op answers once the guest's session is up. As
 * sbx_create (on failure sb ends dead). Its egress policy: pol (the create asked for
 * one), else the one its snapshot's sandbox had (networking on then), else the default. */
int sbx_snap_start(struct sandbox *sb, const struct net_policy *pol, const struct sbx_sink *sink,
                   void *user, sbx_op_t *opid, struct sbx_err *err);
/* The same from the pool's template (pool_template: its snapshot, frozen overlay and
 * RAM file) when the pool is empty: a clone made for this create, not warmed up; into
 * spare (the pool's QEMU started ahead over those files, unbound, default policy: sb's
 * from now on) if not NULL, else a QEMU started now under pol. */
int sbx_clone_start(struct sandbox *sb, const char *snap, const char *disk, const char *mem,
                    struct sbx_vm *spare, const struct net_policy *pol, const struct sbx_sink *sink,
                    void *user, sbx_op_t *opid, struct sbx_err *err);

/* A request's policy (NULL: the default one) into pol, validated: 0, or an sbx_errcode
 * with *err. A snapshot's stored policy (store/rec.h) is read back through it too. */
int sbx_net_from_req(struct sbx_table *t, const struct sbx_net_req *n, struct net_policy *pol,
                     struct sbx_err *err);
/* Whether this host can enforce pol (domain rules need dnsmasq): 0 or an sbx_errcode.
 * Apart from the parse: a snapshot recorded with domain rules stays readable. */
int sbx_net_check_host(struct sbx_table *t, const struct net_policy *pol, struct sbx_err *err);
/* conf/'s default policy (internet, limits) into pol; whether pol is it. */
void sbx_net_default(const struct srv_config *c, struct net_policy *pol);
bool sbx_net_is_default(const struct srv_config *c, const struct net_policy *pol);

/* Pause (sbx_snap.h) at the idle timeout of a persistent sandbox, nobody to answer:
 * 0 or -EIO. */
int sbx_pause_idle(struct sandbox *sb);
/* PAUSED -> STARTING: a VM restored from its snapshot; a resume op or the next request
 * finds it running. 0, or an sbx_errcode with *err (then it ended dead). */
int sbx_resume_start(struct sandbox *sb, struct sbx_err *err);
/* The sandbox's record (sbx.h), borrowed from sb. */
void sbx_rec_of(const struct sandbox *sb, struct sbx_rec *r);
/* An egress policy as a record, borrowed from p. */
void sbx_net_rec_of(const struct net_policy *p, struct sbx_net_rec *r);
/* n entries as the owned map *out (rec_kv_set); a NULL key or value, or one that is
 * not UTF-8, is refused as "<what> must be an object of strings (UTF-8 text)". 0 or an
 * sbx_errcode with *err. */
int sbx_kv_map(const struct sbx_kv *kv, size_t n, const char *what, struct rec_kv *out,
               struct sbx_err *err);
/* Finish op with sb's record (see ops_finish). */
void ops_finish_sandbox(struct op *op, const struct sandbox *sb);

/* ---- idle freeze and resync (sbx_freeze.c) ---- */

/*
 * Set the guest's clock (host CLOCK_REALTIME) and mix fresh entropy into its
 * RNG (RNDADDENTROPY + RNDRESEEDCRNG), with a new random boot id and/or the
 * hostname (the sandbox id) again if flags say so, without ending any stream or
 * process (unlike INIT). Frames go in order: what is sent after this call
 * runs in the guest after the resync. For every thaw now; for hand-out,
 * resume and fork later. 0 (cb follows, once), or -ENOTCONN (no ready
 * channel; no callback) or -ENOMEM. cb (may be NULL) gets 0 when the guest
 * applied it, the guest's -errno if a part failed (all parts are tried),
 * -ECANCELED if a later sbx_resync superseded it, -ECONNRESET if a new
 * session began first (its INIT set clock and entropy), -ESHUTDOWN if the
 * sandbox ended (not called when warrend itself shuts down). cb must not call
 * sbx_resync or send on the channel.
 */
#define SBX_RESYNC_BOOT_ID  (1u << 0)
#define SBX_RESYNC_HOSTNAME (1u << 1)
typedef void (*sbx_resync_cb)(struct sandbox *sb, int err, void *ud);
int sbx_resync(struct sandbox *sb, unsigned flags, sbx_resync_cb cb, void *ud);
/* FROZEN -> RUNNING: SIGCONT; or, for a VM this warrend did not stop, QMP cont and (resync)
 * a RESYNC on the channel, neither awaited (see sbx_freeze.c). 0 (also when not frozen), or
 * -ESRCH / the signal's or vmm_qmp's error (still frozen). */
int sbx_thaw(struct sandbox *sb, bool resync);
/* The reaper's tick, for a RUNNING or FROZEN sb: freeze it if it has been idle for
 * freeze_after_ms; push its VM's memory out to swap once frozen for
 * freeze_pageout_after_ms. */
void sbx_freeze_tick(struct sandbox *sb, int64_t now);
/* A guest frame on an internal stream (RESYNC, the keep_running PLIST): handled, true.
 * May call sbx_violation: return right after. */
bool sbx_freeze_frame(struct sandbox *sb, const struct proto_frame *f);

/* sbx_warm.c: a cold boot's /etc/warren/warm, between the guest's first HELLO and the
 * create's answer. start: sent (true), or nothing to warm (not a cold boot, or done).
 * frame: the hook's frames (true: consumed); at its end, sbx_ready_again or sbx_die.
 * timeout_reason: the reason for the boot timer while it runs, else NULL. */
bool sbx_warm_start(struct sandbox *sb);
bool sbx_warm_frame(struct sandbox *sb, const struct proto_frame *f);
const char *sbx_warm_timeout_reason(struct sandbox *sb);
/* sbx.c: go on with the first HELLO's work (answer the create) after the warm hook. */
void sbx_ready_again(struct sandbox *sb);
/* The session ended (new INIT) or the sandbox did: forget internal requests; a pending
 * resync's cb gets err. */
void sbx_freeze_reset(struct sandbox *sb, int err);
void sbx_freeze_reset_resync(struct sandbox *sb, int err);

/* A new op, linked in t->ops and sb->ops, with a stream of its own (none for a create):
 * NULL when out of memory. ops_new_str also copies s (NULL: "") into op->str, sized to it;
 * the caller bounds s (a checked path, a checked tag). */
struct op *ops_new(struct sandbox *sb, enum op_kind kind, const struct sbx_sink *sink, void *user);
struct op *ops_new_str(struct sandbox *sb, enum op_kind kind, const struct sbx_sink *sink,
                       void *user, const char *s);
/* Free the op, then call sink->done (unless cancelled): err NULL and the result (NULL:
 * none), or err and NULL. res must not point into the op. */
void ops_finish(struct op *op, const struct sbx_err *err, const struct sbx_result *res);
/* ops_finish with an error of this code and message. */
void ops_fail(struct op *op, enum sbx_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Unlink op and free it with what it owns; no callback. */
void ops_free(struct op *op);
struct op *ops_by_stream(struct sandbox *sb, uint32_t stream);
/* The op of that id, or NULL (finished, freed). */
struct op *ops_by_id(struct sbx_table *t, sbx_op_t id);
/* Deliver a guest frame that belongs to an op (ops.c). */
void ops_frame(struct sandbox *sb, struct op *op, const struct proto_frame *f);
/* Finish every op of sb with this error ("sandbox <id>: msg"). */
void ops_fail_all(struct sandbox *sb, enum sbx_errcode code, const char *msg);
/* An object whose values are all strings (env, metadata) at body[key]; absent means empty.
 * 0 and a new reference in *out, or an sbx_errcode with *err. */
/* Operations in flight on sb and overall within their limits: 0, or an error code with *err.
 * Ops still draining after a cancel count. */
int ops_quota(struct sandbox *sb, struct sbx_err *err);
/* End the request frame e began for op, send it and set *opid: 0. */
int ops_send(struct op *op, struct proto_enc *e, sbx_op_t *opid);
/* The requester passed n bytes of op's stream on: credit them to the guest (batched). */
void ops_credit(struct op *op, size_t n);
/* The code a guest errno maps to. */
enum sbx_errcode ops_errno_code(int err);
/* A guest frame for a process op, or for a background exec (ops_proc.c). */
void ops_proc_frame(struct op *op, const struct proto_frame *f);

#endif
