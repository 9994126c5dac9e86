/*
 * sbx_vm.c - VMs apart from sandboxes: ids, records in the index's vms
 * table, run dirs, launch and adoption, binding to a sandbox, and the sweep
 * of what no record knows (see sbx_int.h).
 *
 * A VM's vmm callbacks carry the VM, never a sandbox: they are forwarded to
 * whatever sandbox the VM is bound to at the time, so a VM started before
 * any sandbox exists (a pool's) can be handed to one later by sbx_vm_bind.
 */
#include "sbx_int.h"
#include "log.h"
#include "net.h"
#include "pool.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- callbacks: forwarded to the bound sandbox ---- */

static void on_channel(void *ud, int fd)
{
    struct sbx_vm *vm = ud;

    if (vm->sb) {
        sbx_on_channel(vm->sb, fd);
        return;
    }
    /* A pool VM warming up talks to the pool. */
    if (pool_vm_channel(vm->t->pool, vm, fd))
        return;
    /* Nobody to talk to yet: QEMU keeps the guest's side until a sandbox asks again. */
    close(fd);
}

static void on_exited(void *ud, int status, const char *reason)
{
    struct sbx_vm *vm = ud;

    vm->gone = true;
    if (vm->sb) {
        vm->sb->vm_gone = true;
        sbx_on_vm_exited(vm->sb, status, reason);
        return;
    }
    LOGS(LOG_WARN, vm->id, "unbound VM exited: %s", reason);
    pool_vm_exited(vm->t->pool, vm);
}

static void on_phase(void *ud, enum vmm_phase from, enum vmm_phase to)
{
    struct sbx_vm *vm = ud;

    if (vm->sb)
        sbx_on_vm_phase(vm->sb, from, to);
}

static const struct vmm_cbs vm_cbs = {on_channel, on_exited};

/* ---- records ---- */

static struct sbx_vm *vm_alloc(struct sbx_table *t)
{
    struct sbx_vm *vm = calloc(1, sizeof(*vm));

    if (!vm)
        return NULL;
    vm->t = t;
    vm->net_slot = -1;
    sbx_net_default(t->cfg, &vm->pol);
    vm->next = t->vms;
    t->vms = vm;
    return vm;
}

static void vm_unlink(struct sbx_vm *vm)
{
    for (struct sbx_vm **p = &vm->t->vms; *p; p = &(*p)->next) {
        if (*p == vm) {
            *p = vm->next;
            return;
        }
    }
}

struct sbx_vm *sbx_vm_find(struct sbx_table *t, const char *id)
{
    for (struct sbx_vm *vm = t->vms; vm; vm = vm->next)
        if (strcmp(vm->id, id) == 0)
            return vm;
    return NULL;
}

int sbx_vm_new(struct sbx_table *t, const char *tmpl, unsigned mem_mb, unsigned vcpus,
               struct sbx_vm **out)
{
    return sbx_vm_new_id(t, NULL, tmpl, mem_mb, vcpus, out);
}

int sbx_vm_new_id(struct sbx_table *t, const char *id, const char *tmpl, unsigned mem_mb,
                  unsigned vcpus, struct sbx_vm **out)
{
    struct sbx_vm *vm = vm_alloc(t);
    uint8_t rnd[8];
    int r;

    if (!vm)
        return -ENOMEM;
    sbx_random(t, rnd, sizeof(rnd));
    snprintf(vm->id, sizeof(vm->id), "vm-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
             rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    if (id)
        snprintf(vm->id, sizeof(vm->id), "%s", id);
    snprintf(vm->tmpl, sizeof(vm->tmpl), "%s", tmpl);
    snprintf(vm->boot, sizeof(vm->boot), "kernel");
    vm->mem_mb = mem_mb;
    vm->vcpus = vcpus;
    vm->created_ms = sbx_wall_ms();
    if (snprintf(vm->run_dir, sizeof(vm->run_dir), "%s/vms/%s", t->cfg->state_dir, vm->id) >=
            (int)sizeof(vm->run_dir) - 16 ||
        snprintf(vm->disk, sizeof(vm->disk), "%s/disk.qcow2", vm->run_dir) >=
            (int)sizeof(vm->disk)) {
        r = -ENAMETOOLONG;
        goto fail;
    }
    if (mkdir(vm->run_dir, 0700) != 0) {
        r = -errno;
        goto fail;
    }
    *out = vm;
    return 0;
fail:
    vm_unlink(vm);
    free(vm);
    return r;
}

int sbx_vm_save(struct sbx_vm *vm)
{
    struct rec_vm rec = {.id = vm->id,
                         .tmpl = vm->tmpl,
                         .boot = vm->boot,
                         .run_dir = vm->run_dir,
                         .disk = vm->disk,
                         .sandbox = vm->sb_id,
                         .mem_mb = vm->mem_mb,
                         .vcpus = vm->vcpus,
                         .created_ms = vm->created_ms,
                         .pid = vm->pid,
                         .has_net_slot = vm->net_slot >= 0,
                         .net_slot = vm->net_slot,
                         .backing = vm->backing,
                         .mem_path = vm->mem,
                         .has_network = !!vm->t->net};
    char *s;
    int r;

    sbx_net_rec_of(&vm->pol, &rec.network);
    s = rec_vm_encode(&rec);
    r = s ? idx_put(vm->t->idx, IDX_VMS, vm->id, s, strlen(s)) : -ENOMEM;

    if (r != 0)
        LOGS(LOG_ERR, vm->id, "cannot save to the index (VM record): %s", idx_strerror(r));
    else
        vm->t->idx_dirty = true;
    free(s);
    return r;
}

void sbx_vm_bind(struct sbx_vm *vm, struct sandbox *sb)
{
    vm->sb = sb;
    snprintf(vm->sb_id, sizeof(vm->sb_id), "%s", sb->id);
    sb->vmr = vm;
    snprintf(sb->vm_id, sizeof(sb->vm_id), "%s", vm->id);
    sb->vm = vm->vmm;
    sb->vm_gone = vm->gone;
}

void sbx_vm_config_init(const struct sbx_table *t, struct vmm_config *vc, const char *id,
                        const char *disk, const char *run_dir, unsigned mem_mb, unsigned vcpus)
{
    memset(vc, 0, sizeof(*vc));
    vc->id = id;
    vc->qemu = t->cfg->qemu;
    vc->kernel = t->kernel;
    vc->initrd = t->initrd;
    vc->append = t->cfg->kernel_append && *t->cfg->kernel_append ? t->cfg->kernel_append : NULL;
    vc->disk = disk;
    vc->run_dir = run_dir;
    vc->mem_mb = mem_mb;
    vc->vcpus = vcpus;
    vc->accel = t->accel;
    vc->tcg_tb_mib = t->cfg->tcg_tb_mib;
    vc->tcg_huge_pages = t->cfg->tcg_huge_pages != 0;
    vc->console_max = t->cfg->console_max_bytes;
    vc->qemu_log_max = t->cfg->qemu_log_bytes;
}

static void vm_config(struct sbx_vm *vm, struct vmm_config *vc)
{
    sbx_vm_config_init(vm->t, vc, vm->id, vm->disk, vm->run_dir, vm->mem_mb, vm->vcpus);
    vc->jail = vm->t->jail;
}

static void vmm_set(struct sbx_vm *vm, struct vmm *vmm)
{
    vm->vmm = vmm;
    vmm_set_phase_cb(vmm, on_phase);
    if (vm->sb)
        vm->sb->vm = vmm;
}

int sbx_vm_net_config(struct sbx_table *t, const char *id, int *slot, const struct net_policy *pol,
                      struct vmm_config *vc, char ***wrap)
{
    int r;

    *wrap = NULL;
    if (!t->net)
        return 0;
    if (*slot < 0 && (r = net_slot_get(t->net)) < 0)
        return r;
    if (*slot < 0)
        *slot = r;
    if ((r = net_wrap(t->net, id, *slot, pol, wrap)) != 0)
        return r;
    vc->net_wrap = (const char *const *)*wrap;
    vc->net_mac = NET_GUEST_MAC;
    /* A restore boots nothing: the guest configured itself in the template. */
    if (vc->boot != VMM_BOOT_RESTORE)
        vc->append = net_append(vc->append);
    return 0;
}

void sbx_vm_net_release(struct sbx_table *t, const char *id, int *slot)
{
    net_ns_remove(t->net, id);
    net_slot_put(t->net, *slot);
    *slot = -1;
}

/* Start QEMU for vm with vc: 0 or -errno. With networking on, QEMU starts
 * inside the VM's own namespace, set up by the wrapper net_wrap gives. */
static int launch(struct sbx_vm *vm, struct vmm_config *vc)
{
    struct sbx_table *t = vm->t;
    struct vmm *vmm;
    char **wrap = NULL, ns[256];
    int r;

    if (vm->net_made && t->net) {
        /* Made ahead: QEMU is spawned inside it (setns around the spawn). */
        net_ns_path(t->net, vm->id, ns, sizeof(ns));
        vc->netns = ns;
        vc->net_mac = NET_GUEST_MAC;
        if (vc->boot != VMM_BOOT_RESTORE)
            vc->append = net_append(vc->append);
    } else if ((r = sbx_vm_net_config(t, vm->id, &vm->net_slot, &vm->pol, vc, &wrap)) != 0) {
        return r;
    } else if (wrap && vc->jail) {
        /* Jailed: the jail's child runs the set-up as root, then enters the
         * namespace it made (vmm.h, net_wrap). */
        net_ns_path(t->net, vm->id, ns, sizeof(ns));
        vc->netns = ns;
    }
    r = vmm_launch(t->loop, vc, &vm_cbs, vm, &vmm);
    net_wrap_free(wrap);
    if (r != 0)
        return r;
    vmm_set(vm, vmm);
    vm->pid = vmm_pid(vmm);
    return 0;
}

int sbx_vm_launch(struct sbx_vm *vm, const char *backing)
{
    struct vmm_config vc;

    vm_config(vm, &vc);
    vc.backing = backing;
    return launch(vm, &vc);
}

int sbx_vm_overlay(struct sbx_vm *vm, const char *backing, uint64_t size)
{
    snprintf(vm->backing, sizeof(vm->backing), "%s", backing);
    return vmm_qcow2_create(vm->disk, backing, size);
}

int sbx_vm_launch_restore(struct sbx_vm *vm, const char *mem_path, int mem_fd)
{
    struct vmm_config vc;

    vm_config(vm, &vc);
    vc.kernel = vc.initrd = vc.append = NULL; /* no boot: the snapshot has the guest */
    vc.boot = VMM_BOOT_RESTORE;
    vc.mem_path = mem_path;
    snprintf(vm->mem, sizeof(vm->mem), "%s", mem_path ? mem_path : "");
    if (mem_path && vc.jail)
        vc.mem_fd = mem_fd > 0 ? mem_fd : pool_mem_fd(vm->t->pool, mem_path);
    return launch(vm, &vc);
}

int sbx_vm_adopt(struct sbx_vm *vm)
{
    struct vmm_config vc;
    struct vmm *vmm;
    int r;

    if (vm->pid <= 0)
        return -ESRCH;
    vm_config(vm, &vc);
    if (vm->mem[0]) { /* restored over a RAM file: the driver finds it mapped */
        vc.boot = VMM_BOOT_RESTORE;
        vc.mem_path = vm->mem;
    }
    r = vmm_adopt(vm->t->loop, &vc, vm->pid, &vm_cbs, vm, &vmm);
    if (r != 0)
        return r;
    vmm_set(vm, vmm);
    return 0;
}

void sbx_vm_reap(struct sbx_vm *vm)
{
    if (vm->vmm && vm->gone) {
        vmm_free(vm->vmm);
        vmm_set(vm, NULL);
    }
}

/* vm's QEMU no longer maps its RAM file: one of state_dir/bases (a booted sandbox's own,
 * since its pause or fork) may go now. */
static void bases_release(struct sbx_vm *vm)
{
    if (vm->mem[0] && sbx_in_bases(vm->t, vm->mem))
        sbx_snap_bases_sweep(vm->t);
}

void sbx_vm_stop(struct sbx_vm *vm, bool keep_logs)
{
    if (vm->vmm && !vm->gone) {
        /* User data is discarded with the sandbox: no need for a graceful guest shutdown. */
        vmm_free(vm->vmm);
        vmm_set(vm, NULL);
    }
    vm->pid = 0;
    sbx_vm_net_release(vm->t, vm->id, &vm->net_slot);
    sbx_run_dir_remove(vm->t, vm->run_dir, keep_logs);
    sbx_vm_save(vm);
    bases_release(vm);
}

void sbx_vm_destroy(struct sbx_vm *vm)
{
    if (vm->vmm) {
        vmm_free(vm->vmm); /* kills a running QEMU; an exited one is only freed */
        vmm_set(vm, NULL);
    } else if (vm->pid > 0) {
        /* Never adopted (its sandbox is gone): kill it by what it was started as. */
        vmm_kill_stray(vm->id, vm->run_dir);
    }
    /* After QEMU: the namespace (veth, tap, rules with it) goes once nothing is in it. */
    sbx_vm_net_release(vm->t, vm->id, &vm->net_slot);
    idx_del(vm->t->idx, IDX_VMS, vm->id);
    vm->t->idx_dirty = true;
    sbx_run_dir_remove(vm->t, vm->run_dir, false);
    if (vm->sb)
        vm->sb->vmr = NULL;
    vm_unlink(vm);
    bases_release(vm);
    free(vm);
}

/* ---- restore after a restart ---- */

static int restore_one(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct sbx_table *t = ud;
    struct rec_vm o;
    struct sbx_vm *vm;
    const struct sbx_net_rec *n = &o.network;
    int rc = rec_vm_decode(val, vlen, &o);

    if (rc == -ENOMEM)
        return rc;
    if (rc != 0 || strlen(o.id) >= sizeof(vm->id) || strlen(o.sandbox) >= sizeof(vm->sb_id) ||
        strlen(o.run_dir) >= sizeof(vm->run_dir) || strlen(o.disk) >= sizeof(vm->disk)) {
        /* Its run dir, named after the id, goes with the sweep. */
        LOG(LOG_WARN, "VM record %.*s is unreadable; dropping it", (int)klen, key);
        rec_vm_free(&o);
        return 0;
    }
    vm = vm_alloc(t);
    if (!vm) {
        rec_vm_free(&o);
        return -ENOMEM;
    }
    snprintf(vm->id, sizeof(vm->id), "%s", o.id);
    snprintf(vm->tmpl, sizeof(vm->tmpl), "%s", o.tmpl);
    snprintf(vm->boot, sizeof(vm->boot), "%s", o.boot);
    snprintf(vm->run_dir, sizeof(vm->run_dir), "%s", o.run_dir);
    snprintf(vm->disk, sizeof(vm->disk), "%s", o.disk);
    snprintf(vm->sb_id, sizeof(vm->sb_id), "%s", o.sandbox);
    vm->mem_mb = (unsigned)o.mem_mb;
    vm->vcpus = (unsigned)o.vcpus;
    vm->created_ms = o.created_ms;
    vm->pid = (pid_t)o.pid;
    if (o.backing && strlen(o.backing) < sizeof(vm->backing))
        snprintf(vm->backing, sizeof(vm->backing), "%s", o.backing);
    if (o.mem_path && strlen(o.mem_path) < sizeof(vm->mem))
        snprintf(vm->mem, sizeof(vm->mem), "%s", o.mem_path);
    vm->pol.internet = n->internet;
    snprintf(vm->pol.allow_out, sizeof(vm->pol.allow_out), "%s", n->allow_out ? n->allow_out : "");
    snprintf(vm->pol.deny_out, sizeof(vm->pol.deny_out), "%s", n->deny_out ? n->deny_out : "");
    snprintf(vm->pol.allow_names, sizeof(vm->pol.allow_names), "%s",
             n->allow_names ? n->allow_names : "");
    snprintf(vm->pol.deny_names, sizeof(vm->pol.deny_names), "%s",
             n->deny_names ? n->deny_names : "");
    /* Records of an older warrend have no limits: none. */
    vm->pol.rate_mbit = n->rate_mbit;
    vm->pol.max_conns = n->max_connections;
    /* Held even with networking off now: the namespace is removed with the VM. */
    if (o.has_net_slot && t->net && net_slot_hold(t->net, (int)o.net_slot) == 0)
        vm->net_slot = (int)o.net_slot;
    rec_vm_free(&o);
    return 0;
}

int sbx_vm_restore_all(struct sbx_table *t)
{
    return idx_foreach(t->idx, IDX_VMS, restore_one, t);
}

int sbx_vm_legacy(struct sbx_table *t, const char *sb_id, const char *tmpl, pid_t pid,
                  const char *run_dir, const char *disk, unsigned mem_mb, unsigned vcpus,
                  struct sbx_vm **out)
{
    struct sbx_vm *vm = sbx_vm_find(t, sb_id);

    /* Found: an earlier start wrote the VM record but died before rewriting the sandbox's. */
    if (vm) {
        *out = vm;
        return 0;
    }
    if (strlen(sb_id) >= sizeof(vm->id) || strlen(run_dir) >= sizeof(vm->run_dir) ||
        strlen(disk) >= sizeof(vm->disk))
        return -ENAMETOOLONG;
    if (!(vm = vm_alloc(t)))
        return -ENOMEM;
    /* QEMU was started as warren-<sandbox id> with this run dir: that stays its identity. */
    snprintf(vm->id, sizeof(vm->id), "%s", sb_id);
    snprintf(vm->tmpl, sizeof(vm->tmpl), "%s", tmpl);
    snprintf(vm->boot, sizeof(vm->boot), "kernel");
    snprintf(vm->run_dir, sizeof(vm->run_dir), "%s", run_dir);
    snprintf(vm->disk, sizeof(vm->disk), "%s", disk);
    snprintf(vm->sb_id, sizeof(vm->sb_id), "%s", sb_id);
    vm->mem_mb = mem_mb;
    vm->vcpus = vcpus;
    vm->created_ms = sbx_wall_ms();
    vm->pid = pid;
    *out = vm;
    return 0;
}

static void sweep_dir(struct sbx_table *t, const char *sub)
{
    char dir[4096], path[4096 + 256];
    DIR *d;
    struct dirent *e;

    snprintf(dir, sizeof(dir), "%s/%s", t->cfg->state_dir, sub);
    if (!(d = opendir(dir)))
        return;
    while ((e = readdir(d)) != NULL) {
        int killed;
        /* By name, not path: a state dir given another way (a symlink, a relative path)
         * must never make a known VM look like a stray. */
        if (e->d_name[0] == '.' || sbx_vm_find(t, e->d_name))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        killed = vmm_kill_stray(e->d_name, path);
        LOGS(LOG_WARN, e->d_name, "no VM record: removing its run dir%s",
             killed > 0 ? " and killing its QEMU" : "");
        sbx_run_dir_remove(t, path, false);
    }
    closedir(d);
}

/*
 * A run directory without a record (warrend died between creating it and
 * saving the record, or the index was lost) may still have a VM: kill it and
 * remove the files, so a restart never leaks a VM or a disk.
 */
static bool vm_known(void *ud, const char *id)
{
    struct sbx_vm *vm = sbx_vm_find(ud, id);

    /* A VM that is not running (stopped, or not re-adopted) needs no namespace. */
    return vm && vm->vmm && !vm->gone;
}

void sbx_vm_sweep(struct sbx_table *t)
{
    int n = net_sweep(t->net, vm_known, t);

    if (n > 0)
        LOG(LOG_INFO, "net: removed %d stray namespace(s)", n);
    sweep_dir(t, "vms");
    sweep_dir(t, "sandboxes"); /* run dirs of older warrends, named after their sandbox */
}

void sbx_vm_free_all(struct sbx_table *t, bool kill_vms)
{
    while (t->vms) {
        struct sbx_vm *vm = t->vms;
        t->vms = vm->next;
        if (vm->vmm && !kill_vms)
            vmm_detach(vm->vmm);
        if (vm->vmm)
            vmm_free(vm->vmm);
        if (kill_vms) /* a detached VM keeps its namespace: the next start adopts it */
            net_ns_remove(t->net, vm->id);
        if (vm->sb) {
            vm->sb->vmr = NULL;
            vm->sb->vm = NULL;
        }
        free(vm);
    }
}
