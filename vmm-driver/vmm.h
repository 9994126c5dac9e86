/*
 * vmm.h - QEMU microvm control: launch, adopt after a restart, QMP, exit,
 * phases, snapshots (save, restore into a pre-started QEMU), qcow2 overlays.
 *
 * One struct vmm is one QEMU process. The driver starts it (or re-attaches
 * to one that survived a warrend restart), connects QMP and the console,
 * and hands the connected guest-channel fd to its owner through
 * cbs->channel. It never blocks the loop: sockets are connected
 * non-blocking, retried every 5 ms until QEMU has created them (10 s at
 * most: then the VM is killed and the exit reason says why).
 *
 * Ownership: the caller owns the struct vmm and frees it with vmm_free()
 * (which kills the process if it still runs, unless vmm_detach() was called).
 * The channel fd passed to cbs->channel belongs to the callee from then on.
 * After cbs->exited has run, no further callback is made for that vmm
 * (queued QMP callbacks included); the struct stays valid until vmm_free.
 * Callbacks are never invoked from inside the vmm_* call that caused them;
 * a callback may call any vmm_* function on its vmm, vmm_free included.
 * Files in run_dir (sockets, console.log, qemu.log) are the caller's to
 * remove after vmm_free. The logs are written by a thread and may still
 * grow for a moment after vmm_free or vmm_detach (unlinking them is safe;
 * vmm_settle_orphans waits for them).
 *
 * Phases (vmm_phase.h, vmm_phase()): BOOTING until QMP's first query-status,
 * then RUNNING/STOPPED as QEMU's STOP and RESUME events say; a VM launched
 * in restore mode starts WAITING, vmm_restore makes it RESTORING, and
 * MIGRATION completed makes it STOPPED; vmm_save goes through SAVING back to
 * STOPPED, or to SEALED for a TEMPLATE VM (it may never run again: vmm_cont
 * and vmm_save refuse it, and so does vmm_qmp for "cont" and anything else
 * that is not a query, "stop" or "quit"; a RESUME all the same is refused by
 * the phase table and noted in qemu.log; a TEMPLATE VM adopted after a
 * restart is SEALED again when QEMU says its migration completed,
 * "postmigrate"); EXITED, DETACHED and FREED end it.
 * The phase changes only inside the driver (from events, replies and the
 * calls above), never by itself between two loop iterations; an illegal
 * change is refused and noted in qemu.log. A phase callback
 * (vmm_set_phase_cb) hears of every change, those QEMU made on its own
 * included (a guest that paused itself, a "stop" sent through vmm_qmp).
 *
 * Boot modes (cfg->boot):
 * - VMM_BOOT_KERNEL: -kernel/-initrd boot, anonymous RAM (as before).
 * - VMM_BOOT_TEMPLATE: the same boot, guest RAM in cfg->mem_path mapped
 *   share=on (memory-backend-file; QEMU creates the file, mem_mb long). Boot
 *   it to a ready guest, vmm_save it, then end it: the file is now the
 *   template's RAM image.
 * - VMM_BOOT_RESTORE: no kernel; cfg->mem_path NULL: anonymous RAM, restored
 *   whole from a snapshot of a VM whose RAM was not a share=on file (a booted
 *   VM, a clone, a VM restored so: their streams hold all RAM); else
 *   cfg->mem_path mapped share=off (a private
 *   copy-on-write view of the template's RAM: a clone costs only the pages it
 *   writes), QEMU started with -incoming defer and -S (phase WAITING) until
 *   vmm_restore loads a snapshot saved from that template, or a delta
 *   (VMM_SAVE_DELTA) of a clone over the same file. mem_mb, vcpus, the
 *   disk's presence and the QEMU version must match the template's (the
 *   snapshot header is checked for all but the disk).
 * The memory file is the caller's: the driver never creates (QEMU does, in
 * template mode), truncates or removes it. It must not change while any
 * clone maps it or may still be restored from it: a share=off mapping sees
 * the file's pages until the clone first writes each one, so a template that
 * ran again after its save (or anything writing the file) would change every
 * clone's memory under it. Keep it until the last clone has exited and no
 * snapshot over it will be restored; /dev/shm files count against RAM.
 * A clone's disk must be a fresh overlay backed by the template's own
 * overlay frozen at save time (vmm_qcow2_create accepts a qcow2 backing),
 * never by the raw base (files read back as NULs: measured). Snapshot files
 * are the caller's too (vmm_save writes path.tmp then renames to path).
 * With cfg->jail, TEMPLATE and RESTORE over a memory file are refused
 * (-ENOTSUP): the memory file is not inside the jail's mount namespace, and
 * making it so safely needs more than a bind mount. RESTORE without one (a
 * snapshot of a booted VM: its RAM is in the stream, which QEMU reads from
 * an fd) is jailed like a boot; every file of the disk's backing chain is
 * shown read-only in the jail and must be readable by the VM's uid. QEMU 7.2 opens a share=off
 * memory file read-write (its readonly=on also maps guest RAM read-only: a restored guest then
 * stops answering, tried here), so every jailed clone would need write access to the template's RAM
 * file, and one compromised QEMU could rewrite the memory of every other clone. QEMU >= 8.2
 * (rom=off with readonly=on) or a file handed over as an fd would allow a read-only mapping.
 * vmm_save works jailed (QEMU gets the snapshot file as an fd).
 *
 * Processes: QEMU runs in its own session (setsid) with stdin /dev/null,
 * stdout/stderr into run_dir/qemu.pipe (copied into the bounded qemu.log)
 * and no other inherited fd; with cfg->jail, under its own uid, mount
 * namespace and cgroup (vmm_jail_new). Its exit is watched with a pidfd; on
 * libev's default loop (which reaps every child itself) an ev_child watcher
 * is added for our own children so the wait status is not lost.
 */
#ifndef WARREN_VMM_H
#define WARREN_VMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <ev.h>

#include "vmm_phase.h"

enum vmm_accel { VMM_ACCEL_AUTO = 0, VMM_ACCEL_KVM, VMM_ACCEL_TCG };

/* Decide the accelerator: KVM when the CPU has vmx/svm and /dev/kvm answers
 * KVM_GET_API_VERSION and KVM_CREATE_VM; else TCG. why gets a one-line reason
 * (why may be NULL). */
enum vmm_accel vmm_detect_accel(char *why, size_t why_cap);

/* Host TSC in kHz (from /proc/cpuinfo "cpu MHz"), 0 if unknown. */
unsigned long vmm_tsc_khz(void);

/* The host's free swap in kB (/proc/meminfo SwapFree), or -errno. */
int64_t vmm_host_swap_free_kb(void);

/* How the guest starts (see "Boot modes" above). */
enum vmm_boot {
    VMM_BOOT_KERNEL = 0, /* -kernel/-initrd boot, anonymous guest RAM */
    VMM_BOOT_TEMPLATE,   /* kernel boot, guest RAM in mem_path (share=on) */
    VMM_BOOT_RESTORE,    /* no boot: mem_path private (share=off), -incoming defer */
};

/* The guest kernel command line vmm_launch writes (before cfg->append) changes with
 * this number: a template saved under another one must be booted again, so that
 * clones restored from it have today's. */
#define VMM_CMDLINE_REV 2

struct vmm_config {
    const char *id;        /* sandbox id, 1-64 of [A-Za-z0-9_.-]: names the VM ("warren-<id>") */
    const char *qemu;      /* qemu-system-x86_64 path; NULL: found in PATH */
    const char *kernel;    /* uncompressed vmlinux (PVH) */
    const char *initrd;    /* initramfs holding warren-init; NULL for none */
    const char *disk;      /* root disk (qcow2 overlay, no commas); NULL for none */
    const char *run_dir;   /* existing dir for qmp.sock, chan.sock, console.sock, console.log,
                            * qemu.log; no commas, short enough for a socket path (< 95) */
    const char *append;    /* extra kernel command line, may be NULL */
    unsigned mem_mb;       /* 0: 256 */
    unsigned vcpus;        /* 0: 1 */
    enum vmm_accel accel;  /* KVM or TCG; AUTO makes vmm_launch probe (better: probe once) */
    bool tcg_huge_pages;   /* TCG, RAM in mem_path: let QEMU back its translation cache with
                            * 2 MiB pages (false: PR_SET_THP_DISABLE, ~2.4 MiB less per
                            * VM). A VM with anonymous RAM always keeps them. */
    unsigned tcg_tb_mib;   /* TCG only: translation cache size in MiB (0: 128). QEMU touches
                            * at most this much for translated code, then flushes it. */
    size_t console_max;    /* console.log size cap (0: 1 MiB, at least 4 KiB). Past it the
                            * file keeps the first half of the output, a marker line
                            * "[warren: console truncated, N bytes dropped]" and the
                            * most recent output. The file is written by a thread, never
                            * on the loop; what waits for it is held in memory, at most
                            * max(cap, 64 KiB) per log: past that the output is dropped
                            * and the file says "[warren: N bytes of console output
                            * dropped]" where it was. */
    size_t qemu_log_max;   /* qemu.log (QEMU's stdout and stderr) cap, same rules (0: 1 MiB).
                            * QEMU writes into a pipe (run_dir/qemu.pipe, non-blocking on
                            * its side) that the driver copies into the bounded file, so
                            * QEMU can neither fill the disk nor stall on a slow warrend. */
    struct vmm_jail *jail; /* NULL: QEMU runs as warrend's uid, unconfined. Else see
                            * vmm_jail_new; the vmm holds a reference until it is freed. */
    const char *backing;   /* jail: the disk's read-only backing file (shown in the jail) */
    /* Appended for snapshots; zero keeps the kernel boot above. */
    enum vmm_boot boot;
    const char *mem_path; /* TEMPLATE, RESTORE (optional there): guest RAM file, e.g.
                           * /dev/shm/warren-<t>.mem (no commas). TEMPLATE creates it (mem_mb long);
                           * RESTORE needs the one its snapshot was saved over, unchanged.
                           * A jailed RESTORE over a mem_path needs mem_fd. */
    /* Appended for networking; NULL keeps the VM without a NIC. */
    const char *const *net_wrap; /* NULL-terminated argv spawned in QEMU's place, QEMU's own
                                  * argv appended: it sets up the VM's network namespace
                                  * (tap0 inside) and execs its trailing arguments there,
                                  * so the pid stays QEMU's. Spawning returns at once: the
                                  * loop never waits for the set-up (QMP's connect retries
                                  * cover it); a failed set-up is a QEMU exit whose reason
                                  * is the wrapper's last message. With a jail, give
                                  * netns too: the jailed child (a fork, root until it
                                  * execs) runs the wrapper with /bin/true in QEMU's
                                  * place, waits for it, then enters netns as below. */
    const char *net_mac;         /* with net_wrap or netns: the NIC's MAC, "52:54:00:xx:xx:xx" */
    const char *netns;           /* instead of net_wrap: a network namespace already set up
                                  * (a path, e.g. /run/netns/<name>, holding tap0) that QEMU
                                  * starts in. The spawning thread enters it with setns
                                  * around the spawn and returns to its own (setns is per
                                  * thread; nothing else runs on the loop meanwhile; failing
                                  * to return aborts: the loop must never stay there).
                                  * With a jail, the jailed child enters it instead, as
                                  * root, attaches to tap0 and hands it to QEMU as fd 3
                                  * (-netdev tap,fd=3): QEMU itself never has root,
                                  * CAP_NET_ADMIN or /dev/net/tun. */
    /* Appended for jailed clones: a memfd holding mem_path's contents, sealed against
     * writes (vmm_mem_seal). The jail shows it at mem_path (a link to the fd QEMU
     * inherits), so QEMU, the guest's side, can map it privately but never write the
     * template's RAM that other clones map. 0: none (a jailed RESTORE with a mem_path
     * is then refused). */
    int mem_fd;
};

/* ---- jail: each QEMU under its own uid, mount namespace and cgroup ---- */

struct vmm_jail_conf {
    unsigned uid_base, uid_count; /* the VMs' uids (gid = uid): [base, base + count) */
    const char *cgroup_name;      /* parent group under each hierarchy, e.g. "warren" */
    const char *cgroup_sysfs;     /* NULL: /sys/fs/cgroup */
    const char *root_dir;         /* an empty directory (created 0700): mount point of
                                   * each VM's root inside its own namespace */
    unsigned mem_overhead_mb;     /* memory limit = guest RAM + this (TCG cache, QEMU) */
    unsigned pids_max;            /* 0: 512 */
    const char *uid_lock_dir;     /* NULL: VMM_UID_LOCK_DIR; one flock'd file per uid held,
                                   * shared by every warrend of the host */
};

#define VMM_UID_LOCK_DIR "/run/warren/uids"

struct vmm_jail;

/* Check that jailing works here (root, a cgroup hierarchy with the memory, cpu and
 * pids controllers, v1 or v2) and create the parent groups. 0 and *out, or -errno
 * with a one-line reason in why (-EPERM: not root; -ENOTSUP: no usable cgroups;
 * -EBUSY: every uid of the range is locked by another warrend). */
int vmm_jail_new(const struct vmm_jail_conf *c, struct vmm_jail **out, char *why, size_t cap);
/* Drop the owner's reference; VMs still holding one keep it alive. */
void vmm_jail_free(struct vmm_jail *j);
/* After every surviving VM was adopted: remove every VM cgroup under the parent
 * whose uid no live VM holds (killing what is still in it), except another warrend's
 * on the same host: a group whose uid another holds, or with a process whose command
 * line does not contain own (this warrend's state dir; NULL: no such check). Returns
 * how many. */
int vmm_jail_sweep(struct vmm_jail *j, const char *own);
/* Uids held by live VMs (for tests and stats). */
unsigned vmm_jail_uids_in_use(const struct vmm_jail *j);
/* "uids 200000-209999, cgroup v1 {memory,cpu,pids}/warren" */
const char *vmm_jail_describe(const struct vmm_jail *j, char *buf, size_t cap);
struct vmm;
/* The uid a VM runs as ((uid_t)-1 when unjailed). */
uid_t vmm_uid(const struct vmm *vm);

struct vmm;

struct vmm_cbs {
    /* The guest channel socket is connected (fd is non-blocking, owned by callee). */
    void (*channel)(void *ud, int fd);
    /* QEMU exited (or, for an adopted VM, vanished). status is the wait status when known
     * (-1 if not: an adopted VM that is not our child), reason a short human sentence:
     * "killed by signal 9", "exited with status 0: quit requested",
     * "exited with status 0: the guest rebooted or its kernel panicked",
     * "exited with status 1: <QEMU's last message>", "process exited after SIGKILL",
     * "killed by signal 9 (did not quit within 5000 ms)",
     * "killed by signal 9 (QMP socket not ready: Connection timed out)". */
    void (*exited)(void *ud, int status, const char *reason);
};

/* Start QEMU. On success *out is set and the process runs; 0 or -errno:
 * -EINVAL (bad id/path/config), -ENAMETOOLONG (run_dir), -ENOENT (no QEMU
 * binary), -ENOTSUP (TEMPLATE, or RESTORE over a memory file,
 * with a jail), other spawn errors.
 * A failed launch makes no callback. */
int vmm_launch(struct ev_loop *loop, const struct vmm_config *cfg, const struct vmm_cbs *cbs,
               void *ud, struct vmm **out);

/* Re-attach to a QEMU that was started earlier by vmm_launch (same cfg->id and
 * cfg->run_dir) and is still running as pid: its /proc cmdline must carry that
 * VM's -name and QMP socket (pid reuse cannot pass). QMP, console (appended to
 * the existing log) and channel are reconnected. -ESRCH if it is gone or is
 * not that VM. A VM launched in restore mode over a RAM file (cfg->boot
 * VMM_BOOT_RESTORE, cfg->mem_path as at launch) is found mapping it (or, jailed,
 * its sealed memfd) in /proc/pid/maps, so that its deltas can be taken again
 * (VMM_SAVE_DELTA); found nowhere, it saves all its RAM. */
int vmm_adopt(struct ev_loop *loop, const struct vmm_config *cfg, pid_t pid,
              const struct vmm_cbs *cbs, void *ud, struct vmm **out);

pid_t vmm_pid(const struct vmm *vm);
/* QEMU has answered the QMP handshake: it is past its start-up, its drives (the whole
 * backing chain) opened. Until then it may still be reading its files. */
bool vmm_qmp_ready(const struct vmm *vm);

/* SIGKILL every QEMU that vmm_launch started for this id and run_dir and that nobody
 * watches any more (e.g. its index record was lost). Returns how many, or -errno. */
int vmm_kill_stray(const char *id, const char *run_dir);

/* Reconnect the guest channel (e.g. after the callee closed it); cbs->channel fires again.
 * Close the previous fd first: QEMU serves one connection at a time. -ESRCH once the VM
 * has exited or was detached. */
int vmm_channel_reconnect(struct vmm *vm);

/* Ask QEMU to quit (QMP "quit"), SIGKILL if it has not exited within grace_ms
 * (0: SIGKILL now). */
void vmm_shutdown(struct vmm *vm, unsigned grace_ms);

/* SIGKILL now (through the pidfd). cbs->exited follows from the loop. No-op after exit. */
void vmm_kill(struct vmm *vm);

/* Stop watching without killing (warrend shutting down, VM kept for adoption):
 * watchers stopped, sockets closed, no callback afterwards. */
void vmm_detach(struct vmm *vm);

/* Free; kills a still-running, non-detached process (SIGKILL) and reaps it from
 * the loop once it is gone (the struct lingers privately until then; no callback). */
void vmm_free(struct vmm *vm);

/* At shutdown: wait up to max_ms for VMs freed while running (already SIGKILLed)
 * to be gone, and finish them (a jailed VM's uid and cgroups are given back).
 * 0, or -ETIMEDOUT if some are still dying (the next start's sweep takes their
 * groups). Then writes what the logs still queue and stops their writer thread
 * (not bounded by max_ms; at most the queued bytes, see console_max).
 * Blocks: for the end of the process only. */
int vmm_settle_orphans(unsigned max_ms);

/* Send one QMP command (a JSON object with "execute"; any "id" is replaced by the
 * driver's own) and get the "return" (err 0) or "error" (err -EREMOTEIO) JSON text
 * back, in order. Commands sent before the QMP handshake completes are queued.
 * cb may be NULL. Not called if the VM exits first. Returns 0, -EINVAL (not such an
 * object, or "exec-oob"), -ESRCH (exited/detached), -EPIPE (QMP link lost), -ENOMEM,
 * -EPERM for a command that would bypass the phase rules:
 * - "migrate-incoming", always: only vmm_restore loads a stream (it checks the file);
 * - "cont", and what could run the guest or write its RAM ("system_reset",
 *   "system_wakeup", "snapshot-load", "human-monitor-command"), unless the
 *   phase is STOPPED or RUNNING (not while BOOTING, WAITING, RESTORING,
 *   SAVING);
 * - "migrate" unless vmm_save would be allowed (RUNNING, STOPPED);
 * - a SEALED VM takes only "query-*", "stop" and "quit" (no "cont",
 *   "system_reset", which reloads ROMs into the shared RAM file, or
 *   "human-monitor-command").
 * A "stop" is always sent: the phase follows QEMU's STOP event (vmm_set_phase_cb). */
typedef void (*vmm_qmp_cb)(void *ud, int err, const char *json);
int vmm_qmp(struct vmm *vm, const char *json, vmm_qmp_cb cb, void *ud);

/* Path of the bounded console log (run_dir/console.log). */
const char *vmm_console_path(const struct vmm *vm);

/* The VM's phase (vmm_phase.h). */
enum vmm_phase vmm_phase(const struct vmm *vm);

/* Phase changes pushed to the owner: cb(ud, from, to) with the ud given to
 * vmm_launch/vmm_adopt, for every change whatever made it: QEMU's events (an
 * unexpected STOP included), replies, or a vmm_* call (told later, never from
 * inside that call). Called from the loop, once per change, in order, before
 * the vmm_op_cb of the operation that made the change and before cbs->exited
 * (the change to EXITED is told too); vmm_phase() may have moved on since.
 * The ends the owner makes itself (vmm_detach, vmm_free) are not told. Set it
 * right after vmm_launch/vmm_adopt, before the loop runs again, and the first
 * report starts from the launch phase (BOOTING, or WAITING in restore mode).
 * At most 16 changes wait between two loop iterations: past that the newest
 * report spans several changes (its from -> to need not be one step of the
 * table), and one that came back to where it started is dropped. cb NULL (the
 * default) tells nothing. A setter, not a field of struct vmm_cbs: owners
 * initialise that struct positionally, and a new field would break their
 * -Wextra builds. */
typedef void (*vmm_phase_cb)(void *ud, enum vmm_phase from, enum vmm_phase to);
void vmm_set_phase_cb(struct vmm *vm, vmm_phase_cb cb);

/* ---- stop, cont, save, restore ----
 * One operation at a time per VM (-EBUSY otherwise); -EPERM if the phase does
 * not allow it (vmm_phase_can_*), -ESRCH once exited/detached. The callback
 * runs from the loop once the operation is over: err 0, or -errno with why a
 * sentence (never NULL). Like QMP callbacks, it is not called if the VM exits
 * first: cbs->exited is the answer then. */
typedef void (*vmm_op_cb)(void *ud, int err, const char *why);

/* Pause / resume the vCPUs (QMP stop / cont); the phase follows QEMU's STOP and
 * RESUME events, and is STOPPED / RUNNING when cb runs with 0. */
int vmm_stop(struct vmm *vm, vmm_op_cb cb, void *ud);
int vmm_cont(struct vmm *vm, vmm_op_cb cb, void *ud);

/* Idle freeze, without QEMU's help: SIGSTOP through the pidfd stops every thread of
 * the VM's QEMU at once (vCPUs, I/O, QMP monitor): no CPU used, memory kept, and no QMP
 * round trip either way (QEMU's monitor reads a command one byte per turn of its loop:
 * ~0.6 ms for "cont"). The guest's clocks keep time meanwhile (its TSC is the host's),
 * so after vmm_thaw it sees the time that passed and its expired timers fire.
 * Only while the guest runs (RUNNING) with no operation or QMP command in flight:
 * -EPERM, -EBUSY otherwise; -ESRCH once exited. A QMP command sent while frozen thaws
 * first (it would never be answered otherwise), and vmm_adopt thaws whatever it
 * adopts. The phase stays RUNNING: QEMU never sees it. */
int vmm_freeze(struct vmm *vm);
/* SIGCONT: the VM runs again at once. 0 also if it was not frozen. */
int vmm_thaw(struct vmm *vm);
bool vmm_frozen(const struct vmm *vm);

/* TCG: touch the first bytes of a waiting QEMU's translation buffer ahead, so that
 * the VM restored into it later translates its first code into pages it already has
 * (each first touch is a page fault, 10-14 us on these machines; a clone restored into
 * a spare QEMU took ~800 to answer and ~3,000 more in its first exec: load/RESULTS.md).
 * Only pages the process never touched are written, with zeros, through /proc/PID/mem
 * (vmm_prefault.c), in slices of 16 pages from the loop's idle time. For a QEMU
 * launched in restore mode whose guest has never run (WAITING, no restore asked):
 * it starts once QEMU is past its start-up (it answered QMP), after which QEMU writes
 * none of those pages itself. Any QMP command (a restore, a cont, a raw command) and
 * the VM's end stop it first. 0 (started or due, or nothing to do: no translation
 * buffer, i.e. KVM), -EPERM (not such a QEMU), -EBUSY (asked before), -ESRCH, or
 * -errno opening its memory. */
int vmm_prefault_tcg(struct vmm *vm, uint64_t bytes);
/* Bytes vmm_prefault_tcg has written so far; *ms (if not NULL) how long it took once
 * it ran to its end, else -1. */
uint64_t vmm_prefault_touched(const struct vmm *vm, double *ms);

/* Long idle: push a frozen VM's memory out to swap, on a worker thread
 * (process_madvise MADV_PAGEOUT over each of its QEMU's mappings; see
 * vmm_pageout.c). Pages the process shares with others (the template's RAM
 * file, libraries) stay; without swap on the host next to nothing is freed.
 * cb(ud, err, why) from the loop once done: 0 and what moved ("paged out:
 * resident A -> B MiB, ..."), -ECANCELED if vmm_thaw came first (the thread
 * stops between two mappings), or another -errno. Not called if the VM is freed
 * or its process ends first. -EPERM unless frozen, -EBUSY while one runs,
 * -ESRCH once exited. The VM needs nothing done on thaw: it faults its pages
 * back in as it touches them (tens of ms of its first request under TCG;
 * load/RESULTS.md). */
int vmm_pageout(struct vmm *vm, vmm_op_cb cb, void *ud);
/* A page-out's thread is still running (until its callback, or its cancel's end). */
bool vmm_pageout_busy(const struct vmm *vm);
/* Stop it at its next mapping and forget its callback (whose ud is going away). */
void vmm_pageout_cancel(struct vmm *vm);

/* Save the VM's device state to path (RUNNING or STOPPED): stop, set
 * x-ignore-shared (RAM that lives in a share=on memory file is not copied) and
 * a high max-bandwidth, migrate through an fd into path.tmp after a 4 KiB
 * header, wait for MIGRATION completed, then, on a worker thread, checksum
 * the stream, write the header (magic, version, QEMU version, guest size,
 * checksums), fsync and rename to path. The VM is left STOPPED, also on
 * failure (path.tmp is then removed); a TEMPLATE VM saved successfully is
 * SEALED instead. Phase SAVING meanwhile. If the VM exits while the worker
 * writes the file, no callback is made but the file may still appear
 * complete at path. For a
 * TEMPLATE VM the file holds device state only (~50 KiB) and is restored
 * over the same memory file; other VMs' RAM goes into the file.
 * flags: VMM_SAVE_NOSYNC leaves out the fsyncs (of the file and of its
 * directory): for a file that need not outlive the host (a fork's), whose
 * checksum still catches a file torn by a crash. */
#define VMM_SAVE_NOSYNC 1u
/* VMM_SAVE_DELTA, for a VM launched in restore mode over a RAM file (a clone): the
 * file holds QEMU's device state (xen-save-devices-state, no RAM) and the guest pages
 * the clone owns (written since the template: /proc/PID/pagemap), read out of QEMU
 * (process_vm_readv) on the worker. Its size and cost follow what the guest dirtied.
 * It restores only into a VM launched over a RAM file of the same name (the header
 * records it; such a file never changes: see Boot modes), whose QEMU gets the pages
 * (process_vm_writev) before the device state. -ENOTSUP for any other VM (booted, or
 * adopted without a RAM file found mapped: vmm_adopt). */
#define VMM_SAVE_DELTA 2u
int vmm_save(struct vmm *vm, const char *path, unsigned flags, vmm_op_cb cb, void *ud);
/* A booted VM (its guest RAM anonymous) saved the way a clone is: a delta with no
 * pages (its device state) over a RAM file made now at ram_path of every non-zero page
 * its guest has touched, each at its place, holes elsewhere (written through
 * ram_path.tmp, fsync'ed unless VMM_SAVE_NOSYNC; its name goes in the header). A VM
 * launched over that file (VMM_BOOT_RESTORE, mem_path) maps it privately and reads
 * only what its guest touches: the restore copies none of the RAM, and that VM's own
 * saves are deltas (VMM_SAVE_DELTA) over the same file, which must never change from
 * then on. -ENOTSUP for a VM whose RAM is a file already, or whose guest RAM cannot be
 * told apart among QEMU's mappings (exactly one anonymous read-write mapping mem_mb
 * long followed by QEMU's guard page): save it whole then. */
int vmm_save_ram(struct vmm *vm, const char *path, const char *ram_path, unsigned flags,
                 vmm_op_cb cb, void *ud);

/* Copy the data of in's first end bytes into out at the same offsets; holes stay
 * holes (out must be long enough already, or be made so after). Blocking. 0 or
 * -errno. */
int vmm_copy_sparse(int in, int out, off_t end);
/* The same, leaving pages of zeros (4 KiB) holes as well: for a guest's RAM file,
 * where a third of what a booted guest touched reads as zeros. */
int vmm_copy_nonzero(int in, int out, off_t end);
/* A copy of the file at path (the template's RAM file) in a new memfd, sealed so that
 * nobody can write, grow or shrink it (F_SEAL_WRITE, F_SEAL_GROW, F_SEAL_SHRINK,
 * F_SEAL_SEAL) while private mappings of it stay writable: for vmm_config.mem_fd.
 * Holes are kept. Blocking (reads and writes the file's data once). The fd, or -errno. */
int vmm_mem_seal(const char *path);
/* 0 if fd is a memfd sealed as vmm_mem_seal seals it, else -EPERM. */
int vmm_mem_sealed(int fd);

/* Load a snapshot into a VM launched with VMM_BOOT_RESTORE (phase WAITING):
 * on a worker thread the header and the stream's checksum are checked; then
 * the QEMU version and guest size are matched (a corrupt, truncated or
 * mismatched file is refused: err -EINVAL, why says which, phase back to
 * WAITING, QEMU never saw it); then x-ignore-shared is set and
 * migrate-incoming reads the stream from a passed fd. cb runs at MIGRATION
 * completed, the VM STOPPED (as it was saved): vmm_cont it. A stream QEMU
 * rejects makes QEMU exit (cbs->exited, the reason from qemu.log). */
int vmm_restore(struct vmm *vm, const char *path, vmm_op_cb cb, void *ud);

/* Create a qcow2 (v3, 64 KiB clusters) overlay at path backed by `backing`,
 * written directly (no qemu-img spawn). The backing file is raw, or a qcow2
 * (a template's frozen overlay): its header is read and checked (magic,
 * version 2/3, cluster size, virtual size and header fields bounded, no
 * encryption or external data file) and the overlay gets backing format qcow2
 * and that virtual size. size: a multiple of 512; 0 takes the backing file's
 * (raw: its length; qcow2: its virtual size); a qcow2 backing needs 0 or its
 * own size. The backing name is stored as given: pass an absolute path.
 * Fails with -EEXIST if path exists. 0 or -errno (-EINVAL: a backing qcow2
 * that fails the checks). */
int vmm_qcow2_create(const char *path, const char *backing, uint64_t size);

/* The backing file name recorded in the qcow2 at path ("" for none): 0 or -errno
 * (-EINVAL: not a qcow2 we accept, or a bad name). Reads one cluster. */
int vmm_qcow2_backing(const char *path, char *out, size_t cap);

/* Point the qcow2 at path (nobody has it open for writing) at another name for the
 * same backing file (a hard link, a copy): the name is rewritten in place, the
 * format and the data are not touched, fsynced. The caller vouches that the new
 * file holds the same bytes; nothing here can check it. 0 or -errno (-EINVAL: not a
 * qcow2 with a backing file; -ENAMETOOLONG: the name does not fit in cluster 0). */
int vmm_qcow2_rebase(const char *path, const char *backing);

/* Enter the network namespace at path on this thread (to make a socket there, or
 * spawn into it): 0 and *self, this thread's own namespace to return to with
 * vmm_netns_leave (which aborts if it cannot: the loop must never continue in a
 * VM's namespace), or -errno. */
int vmm_netns_enter(const char *path, int *self);
void vmm_netns_leave(int self);

#endif
