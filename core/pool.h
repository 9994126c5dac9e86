/*
 * pool.h - template snapshots and the warm pool.
 *
 * A pool is for one template, memory size and vCPU count: the default
 * template's, those named in pool_templates (default size), both from the start,
 * and, with pool_on_first_use, one for each other template or shape a create asks
 * for (pool_first_use), up to pool_max_templates; all share pool_max_mb. Each is
 * recorded in the index's templates table under its key: the template's name for
 * the default size, else <name>@<mem>m<vcpus>c.
 *
 * For its template, warrend boots one VM in template mode (guest RAM
 * in /dev/shm/warren-<vm id>.mem, share=on; a qcow2 overlay over the
 * template's base image), waits until its agent answers a PING, has it run
 * `sync` (a session of the pool's own: INIT, EXEC, EXIT), saves its
 * device state (vmm_save: the VM is then SEALED and ended; the RAM file and
 * the overlay, now frozen, are the clones' base) into
 * state_dir/templates/<vm id>/, and records it in the index's templates
 * table with the identity (path, size, mtime, inode) of the base image,
 * kernel and initramfs. It then keeps pool_size VMs restored from that
 * snapshot and stopped (each with its own overlay backed by the frozen one),
 * refilled one at a time in the background. Each is run once after its
 * restore (a session of the pool's own: INIT, exec `true`) and stopped again,
 * so the hand-out does not pay the TCG translation of the guest's session and
 * exec paths (measured in load/RESULTS.md). A hand-out is vmm_cont plus a
 * fresh channel session (sbx.c); no boot.
 *
 * A recorded snapshot whose files are missing, whose images changed, or that
 * vmm_restore refuses (corrupt, truncated, another QEMU) is rebuilt, never
 * used. Pool VMs have VM records (boot "pool", bound to no sandbox); a
 * restart destroys them (sbx.c bind_all) and the pool refills. On a clean
 * shutdown the pool's VMs are killed and the template's files (snapshot,
 * overlay, RAM file) and record removed; after a crash (kill -9) they stay
 * and the next start checks and reuses them. Sandboxes handed out keep
 * running across a restart: their QEMUs hold the RAM file and overlay open.
 *
 * Once full, and with room in pool_max_mb, it also keeps up to pool_spares QEMUs
 * started ahead in restore mode over the template's files, waiting: a create that
 * finds the pool empty restores the template into one (pool_template), and each fork
 * of a pool sandbox, or resume of a paused one, restores its delta into one
 * (pool_spare_take), skipping a QEMU start. Jailed, every clone maps a sealed copy of the
 * template's RAM (pool_mem_fd).
 *
 * Off when pool_size is 0; creates then boot as before.
 *
 * struct pool is every template's pool; the functions below find the one for the
 * template and shape (or RAM file, or VM) they are given.
 *
 * Ownership: the pool belongs to the sbx_table (t->pool) and is freed by
 * pool_free before the table's VMs. The pool's VMs are records of the table,
 * made and destroyed through struct pool_host; a VM returned by pool_take (or
 * pool_template, pool_spare_take) is the caller's to bind (sbx_vm_bind) from then on.
 * The pool reaches the table only through pool_host, never its internals.
 */
#ifndef WARREN_POOL_H
#define WARREN_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bg.h"
#include "config.h"
#include "idx.h"
#include "net.h"
#include "sbx.h"
#include "vmm.h"

struct pool;
/* A VM record of the sandbox table: opaque here, reached only through pool_host. */
struct sbx_vm;

/*
 * What the pool needs from the sandbox table, which owns VM records, networking and
 * the index: the table fills it (sbx.c) and pool_new copies it. The pool never sees
 * the table's structs. Every call takes ctx (the table) unless it takes a VM.
 */
struct pool_host {
    void *ctx;
    struct ev_loop *loop;
    const struct srv_config *cfg;
    struct idx *idx; /* the templates table is the pool's; tell idx_changed */
    struct bg *bg;   /* off-loop work (sealing the template's RAM) */
    const char *image_dir, *kernel, *initrd;
    bool jail; /* QEMU runs jailed: the RAM goes through a sealed memfd */
    bool net;  /* networking is on (the template records it) */
    /* The index was written (templates table): the table flushes it later. */
    void (*idx_changed)(void *ctx);
    /* Random bytes from the table's DRBG (the warm-up session's INIT entropy). */
    void (*random)(void *ctx, void *p, size_t n);
    /* A new unsaved VM record marked as the pool's (boot "pool", so a restart that
     * finds it unbound destroys it), run dir made: 0 and *out, or -errno. */
    int (*vm_new)(void *ctx, const char *tmpl, unsigned mem_mb, unsigned vcpus,
                  struct sbx_vm **out);
    /* The VM's overlay over backing (sbx_vm_overlay), its QEMU started in restore
     * mode over mem (sbx_vm_launch_restore, mem_fd 0) and its record saved: 0 or
     * -errno (the caller destroys it). */
    int (*vm_start_restore)(struct sbx_vm *vm, const char *backing, const char *mem);
    /* Remove the VM for good (QEMU killed, record and run dir removed, freed). */
    void (*vm_destroy)(struct sbx_vm *vm);
    /* Its id, for logs. */
    const char *(*vm_id)(const struct sbx_vm *vm);
    /* Its QEMU's handle, or NULL (not started); vm_up: it has one that has not exited. */
    struct vmm *(*vm_vmm)(const struct sbx_vm *vm);
    bool (*vm_up)(const struct sbx_vm *vm);
    /* The template VM's QEMU config (launched by the pool itself, no VM record). */
    void (*vm_config_init)(void *ctx, struct vmm_config *vc, const char *id, const char *disk,
                           const char *run_dir, unsigned mem_mb, unsigned vcpus);
    /* Its networking (sbx_vm_net_config) and the slot given back (sbx_vm_net_release). */
    int (*net_config)(void *ctx, const char *id, int *slot, const struct net_policy *pol,
                      struct vmm_config *vc, char ***wrap);
    void (*net_release)(void *ctx, const char *id, int *slot);
};

/* Start the pool for the default template (after the table's VMs were restored
 * and bound): 0 and *out (NULL when the pool is off), or -errno. */
int pool_new(const struct pool_host *host, struct pool **out);
/* Kill the pool's VMs and the template VM, remove the template's files. */
void pool_free(struct pool *p);
/* A create for a template and shape (memory, vCPUs) with no pool boots: with
 * pool_on_first_use, a pool for them is added (within pool_max_templates and
 * pool_max_mb; logged once when there is no room) and its template built in the
 * background, so the creates after it are hand-outs. */
void pool_first_use(struct pool *p, const char *tmpl, unsigned mem_mb, unsigned vcpus);
/* A ready VM (restored, stopped, unbound) for this template, memory and vCPUs,
 * or NULL (none ready, or another shape: boot instead). Refill follows. */
struct sbx_vm *pool_take(struct pool *p, const char *tmpl, unsigned mem_mb, unsigned vcpus);
/* The pool is empty: the files to restore a VM of this template, memory and vCPUs
 * from for one create (its snapshot, frozen overlay, RAM file), if its snapshot is
 * ready and a restore from it has worked (a refused one is the pool's to rebuild).
 * The strings live until the template is rebuilt: use them at once. With spare not
 * NULL, *spare is the pool's QEMU started ahead in restore mode over those files
 * (no restore yet; under the default network policy), or NULL: the caller's to bind
 * from then on; another is started in the background. */
bool pool_template(struct pool *p, const char *tmpl, unsigned mem_mb, unsigned vcpus,
                   const char **snap, const char **disk, const char **mem, struct sbx_vm **spare);
/* The spare QEMU (see pool_template), if it was started over the RAM file mem (of the
 * current template) with an overlay backed by the file backing names (the template's
 * frozen overlay, or a link to it): the caller's to bind from then on; another is
 * started in the background. NULL if there is none or it does not fit. */
struct sbx_vm *pool_spare_take(struct pool *p, const char *mem, const char *backing);
/* A create found the pool empty and restores a clone of its template: the pool starts
 * no VM (a refill's QEMU start, restore and warm-up take ~300 ms of CPU on the cores
 * the clone needs) until pool_undefer, when the clone runs, or POOL_DEFER_S at most;
 * not again within POOL_DEFER_S of the last deferral's end, so creates that keep
 * finding the pool empty cannot keep it from refilling. A fill already under way goes
 * on. */
#define POOL_DEFER_S 0.3
void pool_defer(struct pool *p);
void pool_undefer(struct pool *p);
/* An unbound VM's guest channel connected: true if the pool takes fd (the VM is
 * warming up), else the caller closes it. */
bool pool_vm_channel(struct pool *p, struct sbx_vm *vm, int fd);
/* An unbound VM exited: if it is the pool's, drop it (from the loop, later). */
void pool_vm_exited(struct pool *p, struct sbx_vm *vm);
/* The figures of the default template's pool and of every pool (sbx.h); on false when
 * p is NULL (the pool is off). */
void pool_stats(const struct pool *p, struct sbx_pool_stats *out);
/* The figures of template tmpl's pools (one per shape), at most cap into out: how
 * many. */
size_t pool_template_stats(const struct pool *p, const char *tmpl, struct sbx_pool_rec *out,
                           size_t cap);

/* When QEMU is jailed: the sealed memfd holding the RAM file mem_path of the current
 * template, for vmm_config.mem_fd; 0 when there is none (unjailed, or not that file). */
int pool_mem_fd(const struct pool *p, const char *mem_path);

#endif
