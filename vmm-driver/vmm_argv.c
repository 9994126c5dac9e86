/*
 * vmm_argv.c - QEMU's command line for a Warren microVM.
 *
 * One builder for every way a VM starts: the boot mode decides the memory
 * backend (anonymous, or a file shared or private) and the tail (-kernel, or
 * -incoming defer); the rest (machine, sandbox, sockets, disk, channel) is
 * shared, so a clone's devices match its template's exactly, as migration
 * requires. Values that
 * QEMU parses as option lists must not contain commas, so ids and paths are
 * checked instead of escaped.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm_int.h"

static void av_push(struct vmm_argv *a, char *s)
{
    if (!s) {
        if (!a->err)
            a->err = -ENOMEM;
        return;
    }
    if (a->n + 2 > a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        char **v = realloc(a->v, cap * sizeof(*v));
        if (!v) {
            free(s);
            if (!a->err)
                a->err = -ENOMEM;
            return;
        }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = s;
    a->v[a->n] = NULL;
}

static void av_add(struct vmm_argv *a, const char *s)
{
    av_push(a, strdup(s));
}

__attribute__((format(printf, 2, 3))) static void av_addf(struct vmm_argv *a, const char *fmt, ...)
{
    va_list ap;
    char *s = NULL;

    va_start(ap, fmt);
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    av_push(a, s);
}

void vmm_argv_free(struct vmm_argv *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->v[i]);
    free(a->v);
    memset(a, 0, sizeof(*a));
}

int vmm_id_check(const char *id)
{
    size_t n = id ? strlen(id) : 0;

    if (n == 0 || n > 64)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return -EINVAL;
    }
    return 0;
}

int vmm_argv_name(char *buf, size_t cap, const char *id)
{
    int n = snprintf(buf, cap, "warren-%s,debug-threads=off", id);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int vmm_argv_qmp(char *buf, size_t cap, const char *run_dir)
{
    int n = snprintf(buf, cap, "unix:%s/qmp.sock,server=on,wait=off", run_dir);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* A path QEMU reads inside an option list (file=, path=): no commas, and a
 * socket path must fit sun_path (108 bytes with the NUL). */
static int path_ok(const char *p)
{
    return p && *p && !strchr(p, ',') ? 0 : -EINVAL;
}

int vmm_argv_build(struct vmm_argv *a, const struct vmm_config *cfg, unsigned long tsc_khz)
{
    enum vmm_boot mode = cfg->boot;
    /* TEMPLATE needs a file; RESTORE maps one when given (a template's clone), else
     * loads the whole RAM from the stream into anonymous memory (a snapshot). */
    bool memfile = mode == VMM_BOOT_TEMPLATE || (mode == VMM_BOOT_RESTORE && cfg->mem_path);
    char name[160], qmp[4200];
    unsigned vcpus = cfg->vcpus ? cfg->vcpus : 1;
    unsigned mem = cfg->mem_mb ? cfg->mem_mb : 256;
    bool kvm = cfg->accel == VMM_ACCEL_KVM;
    int r;

    memset(a, 0, sizeof(*a));
    if ((r = vmm_id_check(cfg->id)) || (r = path_ok(cfg->run_dir)) ||
        (cfg->disk && (r = path_ok(cfg->disk))))
        return r;
    if (strlen(cfg->run_dir) + sizeof("/console.sock") > 108)
        return -ENAMETOOLONG;
    if (mode != VMM_BOOT_KERNEL && mode != VMM_BOOT_TEMPLATE && mode != VMM_BOOT_RESTORE)
        return -EINVAL;
    if (mode != VMM_BOOT_RESTORE && !cfg->kernel)
        return -EINVAL;
    if (memfile && (r = path_ok(cfg->mem_path)) != 0)
        return r;
    if (cfg->accel != VMM_ACCEL_KVM && cfg->accel != VMM_ACCEL_TCG)
        return -EINVAL;
    if ((r = vmm_argv_name(name, sizeof(name), cfg->id)) ||
        (r = vmm_argv_qmp(qmp, sizeof(qmp), cfg->run_dir)))
        return r;

    if (cfg->net_wrap || cfg->netns) {
        /* Unjailed: the wrapper or the namespace, not both. Jailed: the
         * namespace always (the child enters it), the wrapper optionally (run
         * by the child first, never part of QEMU's argv). */
        if ((cfg->net_wrap && !cfg->net_wrap[0]) || (cfg->jail && !cfg->netns) ||
            (!cfg->jail && cfg->net_wrap && cfg->netns) || !cfg->net_mac ||
            strlen(cfg->net_mac) != 17 || strchr(cfg->net_mac, ','))
            return -EINVAL;
        for (size_t i = 0; !cfg->jail && cfg->net_wrap && cfg->net_wrap[i]; i++)
            av_add(a, cfg->net_wrap[i]);
    }
    av_add(a, cfg->qemu ? cfg->qemu : "qemu-system-x86_64");
    av_add(a, "-name");
    av_add(a, name);
    /* PIT and PIC off: the kernel gets its TSC rate from tsc_early_khz and uses
     * the LAPIC timer and IOAPIC; measured to boot reliably under TCG here. */
    av_add(a, "-M");
    av_add(a, "microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=off,pic=off,memory-backend=mem");
    /* Streams without a configuration section, saved and loaded: a delta snapshot's
     * device state (xen-save-devices-state) has none, and a VM must load every kind
     * of stream (vmm_snap.c, version 2). The header checks QEMU's version instead. */
    av_add(a, "-global");
    av_add(a, "migration.send-configuration=off");
    av_add(a, "-accel");
    /* TCG: MTTCG (thread=multi) even for one vCPU: the vCPU thread then runs
     * without the big QEMU lock, so QMP answers during boot in ~40 ms where the
     * single-threaded mode sometimes took 180 ms; boot time is the same.
     * The translation cache defaults to 1 GiB per VM; a boot touches ~37 MiB
     * and 128 MiB bounds what a long-running guest can make QEMU touch
     * (64 and 128 MiB measured to boot as fast as the default). */
    if (kvm)
        av_add(a, "kvm");
    else
        av_addf(a, "tcg,thread=multi,tb-size=%u", cfg->tcg_tb_mib ? cfg->tcg_tb_mib : 128);
    av_add(a, "-cpu");
    av_add(a, kvm ? "host" : "max");
    av_add(a, "-m");
    av_addf(a, "%u", mem);
    av_add(a, "-object");
    if (memfile) {
        /* Guest RAM in a file: share=on makes the template's RAM the file's
         * pages (what clones map); share=off maps it privately, copy-on-write,
         * so a clone starts from the template's memory without copying it. */
        av_addf(a, "memory-backend-file,id=mem,size=%uM,mem-path=%s,share=%s", mem, cfg->mem_path,
                mode == VMM_BOOT_TEMPLATE ? "on" : "off");
    } else {
        /* Anonymous RAM, but named "mem" like a file's: the migration stream names
         * its RAM block, so a snapshot of any VM (booted, clone or restored) loads
         * into any other (QEMU's default backend would be "microvm.ram"). */
        av_addf(a, "memory-backend-ram,id=mem,size=%uM", mem);
    }
    av_add(a, "-smp");
    av_addf(a, "%u", vcpus);
    av_add(a, "-nodefaults");
    av_add(a, "-no-user-config");
    /* -display none rather than -nographic: nothing ever touches stdio. */
    av_add(a, "-display");
    av_add(a, "none");
    av_add(a, "-sandbox");
    av_add(a, "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny");
    av_add(a, "-msg");
    av_add(a, "timestamp=on");
    av_add(a, "-qmp");
    av_add(a, qmp);
    av_add(a, "-chardev");
    av_addf(a, "socket,id=con,path=%s/console.sock,server=on,wait=off", cfg->run_dir);
    av_add(a, "-serial");
    av_add(a, "chardev:con");
    if (cfg->disk) {
        /* writeback: guest flushes reach the overlay file; no O_DIRECT. */
        av_add(a, "-drive");
        av_addf(a, "id=root,file=%s,format=qcow2,if=none,discard=unmap,cache=writeback", cfg->disk);
        av_add(a, "-device");
        av_add(a, "virtio-blk-device,drive=root");
    }
    if (cfg->net_wrap || cfg->netns) {
        /* The tap the wrapper made in the VM's namespace; every VM has the same
         * name, MAC and guest address there, so clones of one snapshot match. */
        av_add(a, "-netdev");
        /* Jailed, QEMU has no right to attach to a tap (no CAP_NET_ADMIN, no
         * /dev/net/tun in its root): the child attached tap0 as root and hands
         * it over as fd VMM_TAP_FD. */
        if (cfg->jail)
            av_add(a, "tap,id=net0,fd=" VMM_TAP_FD_STR);
        else
            av_add(a, "tap,id=net0,ifname=tap0,script=no,downscript=no");
        av_add(a, "-device");
        av_addf(a, "virtio-net-device,netdev=net0,mac=%s", cfg->net_mac);
    }
    av_add(a, "-device");
    av_add(a, "virtio-serial-device,max_ports=2");
    av_add(a, "-chardev");
    av_addf(a, "socket,id=chan,path=%s/chan.sock,server=on,wait=off", cfg->run_dir);
    av_add(a, "-device");
    av_add(a, "virtserialport,chardev=chan,name=warren.0");
    av_add(a, "-no-reboot");

    switch (mode) {
    case VMM_BOOT_RESTORE:
        /* No guest until vmm_restore sends migrate-incoming. */
        av_add(a, "-incoming");
        av_add(a, "defer");
        /* And none after it until vmm_cont: a delta's device state says "running"
         * (xen-save-devices-state stores it so), which would start the guest at once. */
        av_add(a, "-S");
        break;
    case VMM_BOOT_KERNEL:
    case VMM_BOOT_TEMPLATE: {
        char tsc[48] = "";
        if (tsc_khz)
            snprintf(tsc, sizeof(tsc), " tsc_early_khz=%lu", tsc_khz);
        av_add(a, "-kernel");
        av_add(a, cfg->kernel);
        if (cfg->initrd) {
            av_add(a, "-initrd");
            av_add(a, cfg->initrd);
        }
        av_add(a, "-append");
        /* Not init_on_free=1, though it shrinks snapshots (72 -> 57 MiB idle: the pages
         * the guest freed become zero pages, which QEMU's stream skips): QEMU's RSS for
         * a booted 256 MiB guest went 262 -> 408 MiB with it, and a 512 MiB guest was
         * killed by its jail's memory limit while booting (test_jail).
         * No RCU stall reports: a VM frozen whole (vmm_freeze) finds on thaw that a
         * grace period outlasted the stall timeout, and printed ~60 lines of stack
         * dump through the emulated serial port, ~8 ms under TCG, before the exec. */
        av_addf(a,
                "console=ttyS0 quiet reboot=t panic=-1%s tsc=reliable no_timer_check "
                "cryptomgr.notests audit=0 i8042.noaux i8042.nokbd nowatchdog "
                "rcupdate.rcu_cpu_stall_suppress=1 pci=off%s "
                "rdinit=/init warren.id=%s%s%s",
                tsc, cfg->disk ? " root=/dev/vda" : "", cfg->id, cfg->append ? " " : "",
                cfg->append ? cfg->append : "");
        break;
    }
    }
    if (a->err) {
        r = a->err;
        vmm_argv_free(a);
        return r;
    }
    return 0;
}
