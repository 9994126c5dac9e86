/*
 * test_vmm_unit.c - vmm-driver parts that need no VM: qcow2 overlays (checked
 * by qemu-img and qemu-io, QEMU's own block layer), host probes, the argv
 * builder, and the jail's pure parts (cgroup detection over fake sysfs
 * trees, group names, limits, uid allocation, the mount plan). The bounded
 * logs are in test_vmm_log.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <jansson.h>

#include "vmm.h"
#include "vmm_int.h"

int failures;

#include "check.h"

static char dir[64];

/* Run a shell command; return its exit status and (optionally) its stdout. */
static int run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    size_t len = 0;
    int st;

    if (!p)
        return -1;
    if (out && cap) {
        size_t n;
        while (len + 1 < cap && (n = fread(out + len, 1, cap - 1 - len, p)) > 0)
            len += n;
        out[len] = 0;
    } else {
        char sink[4096];
        while (fread(sink, 1, sizeof(sink), p) > 0)
            ;
    }
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void make_base(const char *path, off_t size)
{
    char block[65536];
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    memset(block, 0x11, sizeof(block));
    CHECK(fd >= 0);
    CHECK(ftruncate(fd, size) == 0);
    CHECK(pwrite(fd, block, sizeof(block), 0) == (ssize_t)sizeof(block));
    close(fd);
}

static bool base_region_is(const char *path, off_t off, size_t len, unsigned char v)
{
    unsigned char buf[65536];
    int fd = open(path, O_RDONLY);
    bool ok;

    if (fd < 0 || len > sizeof(buf))
        return false;
    ok = pread(fd, buf, len, off) == (ssize_t)len;
    close(fd);
    for (size_t i = 0; ok && i < len; i++)
        ok = buf[i] == v;
    return ok;
}

static void test_qcow2(void)
{
    char base[128], ov[128], big[128], cmd[1024], out[8192];
    json_t *info;
    const uint64_t size = 64ull << 20;

    snprintf(base, sizeof(base), "%s/base.raw", dir);
    snprintf(ov, sizeof(ov), "%s/ov.qcow2", dir);
    snprintf(big, sizeof(big), "%s/big.qcow2", dir);
    make_base(base, (off_t)size);

    CHECK(vmm_qcow2_create(ov, base, size) == 0);
    CHECK(vmm_qcow2_create(ov, base, size) == -EEXIST);  /* O_EXCL */
    CHECK(vmm_qcow2_create(big, base, 1000) == -EINVAL); /* not whole sectors */
    CHECK(access(big, F_OK) != 0);

    snprintf(cmd, sizeof(cmd), "qemu-img check -f qcow2 '%s' 2>&1", ov);
    CHECK(run(cmd, out, sizeof(out)) == 0);
    CHECK(strstr(out, "No errors were found") != NULL);

    snprintf(cmd, sizeof(cmd), "qemu-img info --output=json '%s'", ov);
    CHECK(run(cmd, out, sizeof(out)) == 0);
    info = json_loads(out, 0, NULL);
    CHECK(info != NULL);
    CHECK(strcmp(json_string_value(json_object_get(info, "format")) ?: "", "qcow2") == 0);
    CHECK((uint64_t)json_integer_value(json_object_get(info, "virtual-size")) == size);
    CHECK(strcmp(json_string_value(json_object_get(info, "backing-filename")) ?: "", base) == 0);
    CHECK(strcmp(json_string_value(json_object_get(info, "backing-filename-format")) ?: "",
                 "raw") == 0);
    CHECK(strcmp(json_string_value(json_object_get(
                     json_object_get(json_object_get(info, "format-specific"), "data"), "compat"))
                     ?: "",
                 "1.1") == 0); /* qcow2 v3 */
    json_decref(info);

    /* Reads fall through to the base; writes land in the overlay only. */
    snprintf(cmd, sizeof(cmd), "qemu-io -f qcow2 -c 'read -P 0x11 0 64k' '%s' 2>&1", ov);
    CHECK(run(cmd, out, sizeof(out)) == 0 && !strstr(out, "Pattern verification failed"));
    snprintf(cmd, sizeof(cmd),
             "qemu-io -f qcow2 -c 'write -P 0xab 1M 64k' -c 'write -P 0xcd 0 4k' '%s' 2>&1", ov);
    CHECK(run(cmd, out, sizeof(out)) == 0);
    snprintf(cmd, sizeof(cmd),
             "qemu-io -f qcow2 -r -c 'read -P 0xab 1M 64k' -c 'read -P 0xcd 0 4k' "
             "-c 'read -P 0x11 4k 60k' '%s' 2>&1",
             ov);
    CHECK(run(cmd, out, sizeof(out)) == 0 && !strstr(out, "Pattern verification failed"));
    CHECK(base_region_is(base, 1 << 20, 65536, 0));
    CHECK(base_region_is(base, 0, 65536, 0x11));
    snprintf(cmd, sizeof(cmd), "qemu-img check -f qcow2 '%s' 2>&1", ov);
    CHECK(run(cmd, out, sizeof(out)) == 0);

    /* size 0 means the backing file's size; a large disk gets a multi-entry L1. */
    CHECK(unlink(ov) == 0);
    CHECK(vmm_qcow2_create(ov, base, 0) == 0);
    snprintf(cmd, sizeof(cmd), "qemu-img info --output=json '%s'", ov);
    CHECK(run(cmd, out, sizeof(out)) == 0);
    info = json_loads(out, 0, NULL);
    CHECK((uint64_t)json_integer_value(json_object_get(info, "virtual-size")) == size);
    json_decref(info);
    CHECK(vmm_qcow2_create(big, base, 3ull << 40) == 0);
    snprintf(cmd, sizeof(cmd),
             "qemu-img check -f qcow2 '%s' >/dev/null 2>&1 && "
             "qemu-io -f qcow2 -c 'write -P 0x5a 2T 64k' -c 'read -P 0x5a 2T 64k' '%s' "
             ">/dev/null 2>&1 && qemu-img check -f qcow2 '%s' >/dev/null 2>&1",
             big, big, big);
    CHECK(run(cmd, NULL, 0) == 0);
}

static void test_host(void)
{
    char why[256] = "";
    enum vmm_accel a = vmm_detect_accel(why, sizeof(why));
    unsigned long khz = vmm_tsc_khz();
    char out[64];
    bool hw = run("grep -qwE 'vmx|svm' /proc/cpuinfo", out, sizeof(out)) == 0;

    printf("detect_accel: %s (%s)\n", a == VMM_ACCEL_KVM ? "kvm" : "tcg", why);
    printf("tsc_khz: %lu\n", khz);
    CHECK(a == VMM_ACCEL_KVM || a == VMM_ACCEL_TCG);
    CHECK(why[0] != 0);
    if (!hw)
        CHECK(a == VMM_ACCEL_TCG && strstr(why, "vmx/svm") != NULL);
    CHECK(khz > 100000 && khz < 10000000);
}

static bool argv_has(const struct vmm_argv *a, const char *s)
{
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->v[i], s) == 0)
            return true;
    return false;
}

static const char *argv_after(const struct vmm_argv *a, const char *opt)
{
    for (size_t i = 0; i + 1 < a->n; i++)
        if (strcmp(a->v[i], opt) == 0)
            return a->v[i + 1];
    return "";
}

static void test_argv(void)
{
    struct vmm_config c = {
        .id = "sb-0123abcd",
        .kernel = "/img/vmlinux",
        .initrd = "/img/initramfs.cpio",
        .disk = "/run/w/sb/disk.qcow2",
        .run_dir = "/run/w/sb",
        .append = "warren.x=1",
        .mem_mb = 512,
        .vcpus = 2,
        .accel = VMM_ACCEL_TCG,
    };
    struct vmm_argv a;
    char name[128], qmp[256];
    char longdir[200];

    CHECK(vmm_argv_build(&a, &c, 2596134) == 0);
    CHECK(vmm_argv_name(name, sizeof(name), c.id) == 0 && argv_has(&a, name));
    CHECK(vmm_argv_qmp(qmp, sizeof(qmp), c.run_dir) == 0 && argv_has(&a, qmp));
    CHECK(strcmp(a.v[0], "qemu-system-x86_64") == 0);
    CHECK(strcmp(argv_after(&a, "-accel"), "tcg,thread=multi,tb-size=128") == 0);
    CHECK(strcmp(argv_after(&a, "-cpu"), "max") == 0);
    CHECK(strcmp(argv_after(&a, "-m"), "512") == 0);
    CHECK(strcmp(argv_after(&a, "-smp"), "2") == 0);
    CHECK(argv_has(&a, "-nodefaults") && argv_has(&a, "-no-reboot"));
    CHECK(strstr(argv_after(&a, "-sandbox"), "on,") == argv_after(&a, "-sandbox"));
    CHECK(strstr(argv_after(&a, "-append"), "tsc_early_khz=2596134") != NULL);
    CHECK(strstr(argv_after(&a, "-append"), "root=/dev/vda") != NULL);
    CHECK(strstr(argv_after(&a, "-append"), "warren.id=sb-0123abcd warren.x=1") != NULL);
    CHECK(strstr(argv_after(&a, "-drive"), "file=/run/w/sb/disk.qcow2,format=qcow2") != NULL);
    CHECK(a.v[a.n] == NULL);
    vmm_argv_free(&a);

    c.accel = VMM_ACCEL_KVM;
    c.vcpus = 1;
    c.disk = NULL;
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(argv_after(&a, "-accel"), "kvm") == 0);
    CHECK(strcmp(argv_after(&a, "-cpu"), "host") == 0);
    CHECK(!argv_has(&a, "-drive"));
    CHECK(strstr(argv_after(&a, "-append"), "root=") == NULL);
    CHECK(strstr(argv_after(&a, "-append"), "tsc_early_khz") == NULL);
    vmm_argv_free(&a);

    c.accel = VMM_ACCEL_AUTO; /* must be resolved before building */
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    c.accel = VMM_ACCEL_TCG;
    c.id = "bad,id";
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    c.id = "bad id";
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    c.id = "ok";
    c.run_dir = "/run/a,b";
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    memset(longdir, 'x', sizeof(longdir) - 1);
    longdir[0] = '/';
    longdir[sizeof(longdir) - 1] = 0;
    c.run_dir = longdir;
    CHECK(vmm_argv_build(&a, &c, 0) == -ENAMETOOLONG);
}

/* Boot modes: -M is built from the config; a memory file is share=on for a
 * template, share=off + -incoming defer (no kernel) for a restore. */
static void test_argv_modes(void)
{
    struct vmm_config c = {
        .id = "vm1",
        .kernel = "/img/vmlinux",
        .run_dir = "/run/w/vm1",
        .mem_mb = 256,
        .accel = VMM_ACCEL_TCG,
    };
    struct vmm_argv a;

    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(argv_after(&a, "-M"),
                 "microvm,x-option-roms=off,isa-serial=on,rtc=on,pit=off,pic=off,"
                 "memory-backend=mem") == 0);
    CHECK(strcmp(argv_after(&a, "-object"), "memory-backend-ram,id=mem,size=256M") == 0);
    CHECK(!argv_has(&a, "-incoming"));
    vmm_argv_free(&a);

    c.boot = VMM_BOOT_TEMPLATE;
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL); /* no mem_path */
    c.mem_path = "/dev/shm/warren-t.mem";
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strstr(argv_after(&a, "-M"), ",memory-backend=mem") != NULL);
    CHECK(strcmp(argv_after(&a, "-object"), "memory-backend-file,id=mem,size=256M,"
                                            "mem-path=/dev/shm/warren-t.mem,share=on") == 0);
    CHECK(argv_has(&a, "-kernel") && !argv_has(&a, "-incoming"));
    vmm_argv_free(&a);

    c.boot = VMM_BOOT_RESTORE;
    c.kernel = NULL; /* a restore boots nothing */
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strstr(argv_after(&a, "-object"), "share=off") != NULL);
    CHECK(strstr(argv_after(&a, "-M"), ",memory-backend=mem") != NULL);
    CHECK(strcmp(argv_after(&a, "-incoming"), "defer") == 0);
    CHECK(!argv_has(&a, "-kernel") && !argv_has(&a, "-append"));
    vmm_argv_free(&a);

    /* A snapshot's restore: anonymous RAM named as every other VM's. */
    c.mem_path = NULL;
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(argv_after(&a, "-object"), "memory-backend-ram,id=mem,size=256M") == 0);
    CHECK(strcmp(argv_after(&a, "-incoming"), "defer") == 0);
    vmm_argv_free(&a);

    c.mem_path = "/dev/shm/a,b";
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    c.mem_path = "/dev/shm/x";
    c.boot = (enum vmm_boot)7;
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
}

/* Networking: the wrapper comes first and keeps QEMU's argv whole after it;
 * the NIC is the tap every namespace names tap0, with the given MAC. */
static void test_argv_net(void)
{
    static const char *const wrap[] = {"/bin/sh", "-c", "exec \"$@\"", "w", NULL};
    struct vmm_config c = {
        .id = "vm1",
        .kernel = "/img/vmlinux",
        .run_dir = "/run/w/vm1",
        .accel = VMM_ACCEL_TCG,
    };
    struct vmm_argv a;

    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(!argv_has(&a, "-netdev"));
    vmm_argv_free(&a);
    c.net_wrap = wrap;
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL); /* no MAC */
    c.net_mac = "52:54:00:00:00:0,";
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    c.net_mac = "52:54:00:57:52:02";
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(a.v[0], "/bin/sh") == 0 && strcmp(a.v[3], "w") == 0);
    CHECK(strcmp(a.v[4], "qemu-system-x86_64") == 0);
    CHECK(strcmp(argv_after(&a, "-netdev"), "tap,id=net0,ifname=tap0,script=no,downscript=no") ==
          0);
    CHECK(argv_has(&a, "virtio-net-device,netdev=net0,mac=52:54:00:57:52:02"));
    CHECK(argv_has(&a, "-nodefaults"));
    vmm_argv_free(&a);
    /* A namespace already set up: no wrapper, QEMU first, the same NIC. */
    c.net_wrap = NULL;
    c.netns = "/run/netns/warren-x-vm1";
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(a.v[0], "qemu-system-x86_64") == 0);
    CHECK(argv_has(&a, "virtio-net-device,netdev=net0,mac=52:54:00:57:52:02"));
    vmm_argv_free(&a);
    c.net_wrap = wrap; /* both: refused */
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
    /* Jailed: QEMU first whatever the wrapper (the jail's child runs it before),
     * the tap as fd 3 (the child attached it as root), the namespace required. */
    c.jail = (struct vmm_jail *)&a; /* only tested for NULL by the builder */
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(a.v[0], "qemu-system-x86_64") == 0);
    CHECK(strcmp(argv_after(&a, "-netdev"), "tap,id=net0,fd=" VMM_TAP_FD_STR) == 0);
    CHECK(!argv_has(&a, "/bin/sh"));
    CHECK(argv_has(&a, "virtio-net-device,netdev=net0,mac=52:54:00:57:52:02"));
    vmm_argv_free(&a);
    c.net_wrap = NULL;
    CHECK(vmm_argv_build(&a, &c, 0) == 0);
    CHECK(strcmp(argv_after(&a, "-netdev"), "tap,id=net0,fd=" VMM_TAP_FD_STR) == 0);
    vmm_argv_free(&a);
    c.netns = NULL;
    c.net_wrap = wrap; /* jailed, a wrapper without the namespace to enter: refused */
    CHECK(vmm_argv_build(&a, &c, 0) == -EINVAL);
}

/* The phase table: every allowed change and no other; names; predicates. */
static void test_phase(void)
{
    static const char *allowed[] = {
        "booting>running",   "booting>stopped",   "booting>waiting",   "waiting>restoring",
        "restoring>stopped", "restoring>running", "restoring>waiting", "running>stopped",
        "running>saving",    "stopped>running",   "stopped>saving",    "saving>stopped",
        "saving>sealed",     "exited>freed",      "detached>freed",    "booting>sealed",
    };
    static const char *live[] = {"booting", "waiting", "restoring", "running",
                                 "stopped", "saving",  "sealed"};
    int n_ok = 0;

    for (int f = 0; f < VMM_PH__COUNT; f++) {
        for (int t = 0; t < VMM_PH__COUNT; t++) {
            char key[64];
            bool want = false;
            snprintf(key, sizeof(key), "%s>%s", vmm_phase_name(f), vmm_phase_name(t));
            for (size_t i = 0; i < sizeof(allowed) / sizeof(*allowed); i++)
                want |= strcmp(key, allowed[i]) == 0;
            /* Every live phase may end: exit, detach, free. */
            for (size_t i = 0; i < sizeof(live) / sizeof(*live); i++)
                want |= strcmp(vmm_phase_name(f), live[i]) == 0 &&
                        (t == VMM_PH_EXITED || t == VMM_PH_DETACHED || t == VMM_PH_FREED);
            if ((vmm_phase_check(f, t) == 0) != want)
                fprintf(stderr, "phase %s: table says %d\n", key, vmm_phase_check(f, t));
            CHECK((vmm_phase_check(f, t) == 0) == want);
            n_ok += want;
        }
    }
    CHECK(n_ok == 16 + 7 * 3);
    CHECK(vmm_phase_check(VMM_PH__COUNT, VMM_PH_RUNNING) == -EINVAL);
    CHECK(vmm_phase_check(VMM_PH_RUNNING, (enum vmm_phase) - 1) == -EINVAL);
    CHECK(strcmp(vmm_phase_name(VMM_PH_RESTORING), "restoring") == 0);
    CHECK(strcmp(vmm_phase_name(VMM_PH__COUNT), "?") == 0);
    for (int p = 0; p < VMM_PH__COUNT; p++) {
        bool is_live = false;
        for (size_t i = 0; i < sizeof(live) / sizeof(*live); i++)
            is_live |= strcmp(vmm_phase_name(p), live[i]) == 0;
        CHECK(vmm_phase_live(p) == is_live);
        CHECK(vmm_phase_can_stop(p) == (p == VMM_PH_BOOTING || p == VMM_PH_RUNNING));
        CHECK(vmm_phase_can_cont(p) == (p == VMM_PH_STOPPED));
        CHECK(vmm_phase_can_save(p) == (p == VMM_PH_RUNNING || p == VMM_PH_STOPPED));
        CHECK(vmm_phase_can_restore(p) == (p == VMM_PH_WAITING));
        CHECK(vmm_phase_guest_runs(p) == (p == VMM_PH_RUNNING));
    }
    CHECK(!vmm_phase_live(VMM_PH__COUNT));
}

/* Re-seal a hand-edited header: its CRC-32 in the last 4 bytes. */
static void snap_fix_crc(uint8_t *h)
{
    uint32_t c = vmm_crc32(0, h, VMM_SNAP_HDR - 4);

    for (int i = 0; i < 4; i++)
        h[VMM_SNAP_HDR - 4 + i] = (uint8_t)(c >> (8 * i));
}

static void snap_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void snap_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Snapshot header: round trip, then every kind of damage is refused with a reason. */
static void test_snap(void)
{
    struct vmm_snap_info in = {.stream_len = 50000,
                               .stream_crc = 0x12345678,
                               .mem_mb = 256,
                               .vcpus = 1,
                               .flags = VMM_SNAP_F_SHARED_RAM};
    struct vmm_snap_info out;
    uint8_t h[VMM_SNAP_HDR], bad[VMM_SNAP_HDR];
    uint64_t fsz = VMM_SNAP_HDR + 50000;
    char why[256];

    snprintf(in.qemu_version, sizeof(in.qemu_version), "7.2.22 (Debian)");
    vmm_snap_encode(h, &in);
    CHECK(vmm_snap_decode(h, sizeof(h), fsz, &out, why, sizeof(why)) == 0);
    CHECK(out.stream_len == 50000 && out.stream_crc == 0x12345678 && out.mem_mb == 256 &&
          out.vcpus == 1 && out.flags == VMM_SNAP_F_SHARED_RAM &&
          strcmp(out.qemu_version, "7.2.22 (Debian)") == 0);
    CHECK(vmm_crc32(0, "123456789", 9) == 0xcbf43926u);  /* the CRC-32 check value */
    CHECK(vmm_crc32c(0, "123456789", 9) == 0xe3069283u); /* CRC-32C's */
    CHECK(vmm_crc32c_soft(0, "123456789", 9) == 0xe3069283u);
    CHECK(out.version == 3);
    /* The CPU's crc32 and the tables agree at every alignment and length, and in
     * pieces (the stream is checksummed 64 KiB at a time). */
    {
        static uint8_t b[3000];
        uint32_t s = 1;
        for (size_t i = 0; i < sizeof(b); i++)
            b[i] = (uint8_t)((s = s * 1103515245u + 12345u) >> 16);
        for (size_t off = 0; off < 9; off++)
            for (size_t n = 0; n + off <= sizeof(b); n += 1 + n / 3)
                CHECK(vmm_crc32c(0, b + off, n) == vmm_crc32c_soft(0, b + off, n));
        CHECK(vmm_crc32c(vmm_crc32c(0, b, 1001), b + 1001, 1999) == vmm_crc32c(0, b, 3000));
        CHECK(vmm_snap_crc(3, 0, b, 3000) == vmm_crc32c(0, b, 3000));
        CHECK(vmm_snap_crc(2, 0, b, 3000) == vmm_crc32(0, b, 3000));
        /* n zero bytes appended by arithmetic (a RAM file's holes) equal the bytes. */
        static uint8_t z[(1 << 20) + 5];
        const size_t zn[] = {0, 1, 2, 7, 8, 9, 255, 4096, 65537, 1 << 20, (1 << 20) + 5};
        for (size_t i = 0; i < sizeof(zn) / sizeof(zn[0]); i++) {
            uint32_t c0 = vmm_crc32c(0, b, 1 + i * 37);
            CHECK(vmm_crc32c_zeros(c0, zn[i]) == vmm_crc32c(c0, z, zn[i]));
            CHECK(vmm_crc32c_zeros(0, zn[i]) == vmm_crc32c_soft(0, z, zn[i]));
        }
        CHECK(vmm_crc32c_zeros(vmm_crc32c_zeros(0, 3 << 20), 1 << 20) ==
              vmm_crc32c_zeros(0, 4 << 20));
    }

    /* Truncated file, short read, trailing bytes. */
    CHECK(vmm_snap_decode(h, sizeof(h), fsz - 1, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "truncated") != NULL);
    CHECK(vmm_snap_decode(h, 100, 100, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "truncated") != NULL);
    CHECK(vmm_snap_decode(h, sizeof(h), fsz + 4096, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "trailing") != NULL);
    /* Every single flipped byte of the header is caught. */
    for (size_t i = 0; i < sizeof(h); i += 7) {
        memcpy(bad, h, sizeof(h));
        bad[i] ^= 0x40;
        CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    }
    memcpy(bad, h, sizeof(h));
    bad[0] = 'X';
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "magic") != NULL);
    memcpy(bad, h, sizeof(h));
    bad[100] = 1;
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "checksum") != NULL);
    /* Fields out of bounds even with a valid header checksum. */
    in.stream_len = 0;
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), VMM_SNAP_HDR, &out, why, sizeof(why)) == -EINVAL);
    in.stream_len = 50000;
    in.vcpus = 0;
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    in.vcpus = 1;
    in.flags = 6;
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    in.flags = VMM_SNAP_F_SHARED_RAM;
    in.qemu_version[0] = 0;
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    in.qemu_version[0] = '\n';
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    /* Bytes after the version's NUL (inside its 64-byte field) are refused, with
     * a valid header checksum: a header has one encoding (found by fuzz_snap). */
    snprintf(in.qemu_version, sizeof(in.qemu_version), "8.2.0");
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);
    bad[48 + 6] = '~';
    {
        uint32_t c = vmm_crc32(0, bad, VMM_SNAP_HDR - 4);
        for (int i = 0; i < 4; i++)
            bad[VMM_SNAP_HDR - 4 + i] = (uint8_t)(c >> (8 * i));
    }
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "version") != NULL);
    snprintf(in.qemu_version, sizeof(in.qemu_version), "7.2.22 (Debian)");

    /* Mismatch with the restoring VM. */
    CHECK(vmm_snap_decode(h, sizeof(h), fsz, &out, why, sizeof(why)) == 0);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 1, true, why, sizeof(why)) == 0);
    CHECK(vmm_snap_match(&out, "8.2.0", 256, 1, true, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "QEMU 7.2.22 (Debian)") != NULL);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 512, 1, true, why, sizeof(why)) == -EINVAL);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 2, true, why, sizeof(why)) == -EINVAL);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 1, false, why, sizeof(why)) == -EINVAL);

    /* The file path: finalize writes header + rename; verify reads it back and
     * catches a flipped stream byte and a truncation. */
    {
        char tmpf[128], fin[128], stream[70000];
        struct vmm_snap_info fi = {.mem_mb = 256, .vcpus = 1, .flags = 0};
        int fd;
        snprintf(tmpf, sizeof(tmpf), "%s/s.tmp", dir);
        snprintf(fin, sizeof(fin), "%s/s.snap", dir);
        snprintf(fi.qemu_version, sizeof(fi.qemu_version), "7.2.22");
        for (size_t i = 0; i < sizeof(stream); i++)
            stream[i] = (char)(i * 7);
        fd = open(tmpf, O_RDWR | O_CREAT | O_TRUNC, 0600);
        CHECK(fd >= 0);
        CHECK(pwrite(fd, stream, sizeof(stream), VMM_SNAP_HDR) == (ssize_t)sizeof(stream));
        CHECK(vmm_snap_finalize(fd, tmpf, fin, true, &fi, why, sizeof(why)) == 0);
        close(fd);
        CHECK(access(tmpf, F_OK) != 0 && access(fin, F_OK) == 0);
        fd = open(fin, O_RDWR);
        CHECK(vmm_snap_verify(fd, &out, why, sizeof(why)) == 0);
        CHECK(out.stream_len == sizeof(stream) && out.version == 3);
        CHECK(out.stream_crc == vmm_crc32c(0, stream, sizeof(stream)));
        /* A version-2 file (its stream's CRC-32) written by an older warrend is read;
         * the same header claiming version 3 is not. */
        {
            uint8_t h2[VMM_SNAP_HDR];
            struct vmm_snap_info o2;
            CHECK(pread(fd, h2, sizeof(h2), 0) == (ssize_t)sizeof(h2));
            snap_put32(h2 + 8, 2);
            snap_put32(h2 + 32, vmm_crc32(0, stream, sizeof(stream)));
            snap_fix_crc(h2);
            CHECK(pwrite(fd, h2, sizeof(h2), 0) == (ssize_t)sizeof(h2));
            CHECK(vmm_snap_verify(fd, &o2, why, sizeof(why)) == 0 && o2.version == 2);
            snap_put32(h2 + 8, 3);
            snap_fix_crc(h2);
            CHECK(pwrite(fd, h2, sizeof(h2), 0) == (ssize_t)sizeof(h2));
            CHECK(vmm_snap_verify(fd, &o2, why, sizeof(why)) == -EINVAL);
            CHECK(strstr(why, "stream checksum") != NULL);
            snap_put32(h2 + 8, 4);
            snap_fix_crc(h2);
            CHECK(pwrite(fd, h2, sizeof(h2), 0) == (ssize_t)sizeof(h2));
            CHECK(vmm_snap_verify(fd, &o2, why, sizeof(why)) == -EINVAL);
            CHECK(strstr(why, "version 4") != NULL);
            snap_put32(h2 + 8, 2);
            snap_fix_crc(h2);
            CHECK(pwrite(fd, h2, sizeof(h2), 0) == (ssize_t)sizeof(h2));
        }
        CHECK(pwrite(fd, "\xff", 1, VMM_SNAP_HDR + 30000) == 1);
        CHECK(vmm_snap_verify(fd, &out, why, sizeof(why)) == -EINVAL);
        CHECK(strstr(why, "stream checksum") != NULL);
        CHECK(ftruncate(fd, VMM_SNAP_HDR + 1000) == 0);
        CHECK(vmm_snap_verify(fd, &out, why, sizeof(why)) == -EINVAL);
        CHECK(strstr(why, "truncated") != NULL);
        printf("snapshot refused: \"%s\"\n", why);
        close(fd);
    }
}

/* A delta info whose stream ends where its layout does; the file size at the return. */
static uint64_t delta_info(struct vmm_snap_info *d, uint64_t dev_len, uint64_t npages,
                           const char *base)
{
    uint64_t idx, data, end;

    memset(d, 0, sizeof(*d));
    d->stream_crc = 0xdeadbeef;
    d->mem_mb = 256;
    d->vcpus = 1;
    d->flags = VMM_SNAP_F_DELTA;
    snprintf(d->qemu_version, sizeof(d->qemu_version), "7.2.22 (Debian)");
    d->dev_len = dev_len;
    d->npages = npages;
    snprintf(d->base, sizeof(d->base), "%s", base);
    end = vmm_delta_layout(dev_len, npages, &idx, &data);
    d->stream_len = end - VMM_SNAP_HDR;
    return end;
}

/* Delta snapshot header (a fork of a pool clone): device state, then the pages
 * the VM owned over its template's RAM file. Round trip, layout, every refusal. */
static void test_snap_delta(void)
{
    struct vmm_snap_info in, out;
    uint8_t h[VMM_SNAP_HDR], bad[VMM_SNAP_HDR];
    uint64_t idx, data, fsz, bsz;
    char why[256];

    /* The layout: the index on the page after the device state, the pages after it. */
    CHECK(vmm_delta_layout(1, 0, &idx, &data) == 8192 && idx == 8192 && data == 8192);
    CHECK(vmm_delta_layout(4096, 1, &idx, &data) == 16384 && idx == 8192 && data == 12288);
    CHECK(vmm_delta_layout(10000, 3000, &idx, &data) == 28672 + 3000 * 4096ull);
    CHECK(idx == 16384 && data == 28672);
    CHECK(vmm_delta_layout(10000, 1025, &idx, &data) == 24576 + 1025 * 4096ull);
    CHECK(idx == 16384 && data == 24576);

    /* Round trip: dev_len, npages and base kept. */
    fsz = delta_info(&in, 10000, 3000, "warren-vm-0123abcd.mem");
    vmm_snap_encode(h, &in);
    CHECK(vmm_snap_decode(h, sizeof(h), fsz, &out, why, sizeof(why)) == 0);
    CHECK(out.flags == VMM_SNAP_F_DELTA && out.dev_len == 10000 && out.npages == 3000 &&
          strcmp(out.base, "warren-vm-0123abcd.mem") == 0);
    CHECK(out.stream_len == fsz - VMM_SNAP_HDR && out.stream_crc == 0xdeadbeef &&
          out.mem_mb == 256 && out.vcpus == 1 && strcmp(out.qemu_version, "7.2.22 (Debian)") == 0);
    /* Re-encoding gives the same bytes (one encoding per header). */
    vmm_snap_encode(bad, &out);
    CHECK(memcmp(bad, h, sizeof(h)) == 0);
    /* No pages (a parent that wrote nothing yet) and a full guest (mem_mb * 256 pages). */
    fsz = delta_info(&in, 4096, 0, "m");
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);
    CHECK(out.npages == 0 && out.dev_len == 4096 && strcmp(out.base, "m") == 0);
    fsz = delta_info(&in, 300000, 256 * 256, "warren-vm-1.mem");
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);
    CHECK(out.npages == 65536);
    /* The device state may be the whole stream: no pages, a page-aligned state. */
    fsz = delta_info(&in, 8192, 0, "m");
    CHECK(in.stream_len == 8192);
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);

    /* A full or template header carries no delta fields... */
    {
        struct vmm_snap_info f = {.stream_len = 50000,
                                  .mem_mb = 256,
                                  .vcpus = 1,
                                  .flags = VMM_SNAP_F_SHARED_RAM,
                                  .dev_len = 77,
                                  .npages = 5,
                                  .base = "ignored"};
        uint64_t ffsz = VMM_SNAP_HDR + 50000;
        snprintf(f.qemu_version, sizeof(f.qemu_version), "7.2.22");
        vmm_snap_encode(bad, &f); /* ...encode leaves them out without the flag */
        CHECK(vmm_snap_decode(bad, sizeof(bad), ffsz, &out, why, sizeof(why)) == 0);
        CHECK(out.dev_len == 0 && out.npages == 0 && out.base[0] == 0);
        /* and decode refuses each one set without the flag. */
        for (int which = 0; which < 4; which++) {
            for (unsigned fl = 0; fl <= VMM_SNAP_F_SHARED_RAM; fl++) {
                f.flags = fl;
                vmm_snap_encode(bad, &f);
                if (which == 0)
                    snap_put64(bad + 112, 10000);
                else if (which == 1)
                    snap_put64(bad + 120, 1);
                else if (which == 2)
                    memcpy(bad + 128, "warren-vm-1.mem", 15);
                else
                    bad[128 + 63] = 'x';
                snap_fix_crc(bad);
                CHECK(vmm_snap_decode(bad, sizeof(bad), ffsz, &out, why, sizeof(why)) == -EINVAL);
                CHECK(strstr(why, "without the delta flag") != NULL);
            }
        }
    }

    /* The RAM file's checksum: kept with a delta or a template, one encoding, refused
     * on a full stream (no RAM file) and set without its flag. */
    {
        uint32_t fl[] = {VMM_SNAP_F_DELTA, VMM_SNAP_F_SHARED_RAM, 0};
        uint8_t again[VMM_SNAP_HDR];
        for (int k = 0; k < 3; k++) {
            fsz = delta_info(&in, 10000, 3, "warren-vm-1.ram");
            if (fl[k] != VMM_SNAP_F_DELTA) {
                in.dev_len = in.npages = 0;
                in.base[0] = 0;
            }
            in.flags = fl[k] | VMM_SNAP_F_RAM_CRC;
            in.ram_crc = 0x8badf00du;
            vmm_snap_encode(bad, &in);
            memset(&out, 0x55, sizeof(out));
            int r = vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why));
            if (fl[k]) {
                CHECK(r == 0 && out.ram_crc == 0x8badf00du && out.flags == in.flags);
                vmm_snap_encode(again, &out);
                CHECK(memcmp(again, bad, sizeof(again)) == 0);
                CHECK(vmm_snap_match(&out, out.qemu_version, 256, 1, true, why, sizeof(why)) == 0);
            } else {
                CHECK(r == -EINVAL && strstr(why, "checksum without a RAM file") != NULL);
            }
            in.flags = fl[k];
            vmm_snap_encode(bad, &in);
            snap_put64(bad + 192, 0x8badf00du); /* the field, no flag */
            snap_fix_crc(bad);
            CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
            CHECK(strstr(why, "set without its flag") != NULL);
        }
        /* Without the flag, a decoded header says 0. */
        fsz = delta_info(&in, 10000, 3, "warren-vm-1.ram");
        vmm_snap_encode(bad, &in);
        memset(&out, 0x55, sizeof(out));
        CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);
        CHECK(out.ram_crc == 0 && !(out.flags & VMM_SNAP_F_RAM_CRC));
    }

    /* dev_len 0, or longer than the stream. */
    fsz = delta_info(&in, 0, 10, "warren-vm-1.mem");
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "device state length 0") != NULL);
    fsz = delta_info(&in, 10000, 10, "warren-vm-1.mem");
    in.dev_len = in.stream_len + 1;
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "device state length") != NULL);
    /* More pages than the guest has (mem_mb * 256), with the layout consistent. */
    fsz = delta_info(&in, 10000, 256 * 256 + 1, "warren-vm-1.mem");
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "65537 pages") != NULL && strstr(why, "256 MiB") != NULL);
    fsz = delta_info(&in, 10000, 4097, "warren-vm-1.mem");
    in.mem_mb = 16; /* 4096 pages */
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "more than a 16 MiB guest") != NULL);
    /* The layout's end differs from the file's: a page more or less, a byte more. */
    fsz = delta_info(&in, 10000, 3000, "warren-vm-1.mem");
    for (int k = 0; k < 3; k++) {
        struct vmm_snap_info d = in;
        d.stream_len = k == 0   ? in.stream_len + 4096
                       : k == 1 ? in.stream_len - 4096
                                : in.stream_len + 1;
        bsz = VMM_SNAP_HDR + d.stream_len;
        vmm_snap_encode(bad, &d);
        CHECK(vmm_snap_decode(bad, sizeof(bad), bsz, &out, why, sizeof(why)) == -EINVAL);
        CHECK(strstr(why, "layout") != NULL);
    }
    {
        /* npages one off for the same file; dev_len crossing into the index's page. */
        struct vmm_snap_info d = in;
        d.npages = 2999;
        vmm_snap_encode(bad, &d);
        CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
        CHECK(strstr(why, "layout") != NULL);
        d = in;
        d.dev_len = 16384 - 4096 + 1; /* the index moves a page on */
        vmm_snap_encode(bad, &d);
        CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
        CHECK(strstr(why, "layout") != NULL);
        d.dev_len = 16384 - 4096; /* the same pages as 10000: accepted */
        vmm_snap_encode(bad, &d);
        CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);
    }

    /* The RAM file name: empty, unterminated, not printable, a path. */
    fsz = delta_info(&in, 10000, 3000, "");
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "RAM file name missing") != NULL);
    fsz = delta_info(&in, 10000, 3000, "warren-vm-1.mem");
    vmm_snap_encode(bad, &in);
    memset(bad + 128, 'a', 64); /* all 64 bytes: no NUL */
    snap_fix_crc(bad);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "unterminated") != NULL);
    memset(bad + 128 + 63, 0, 1); /* 63 bytes and the NUL: the longest accepted */
    snap_fix_crc(bad);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == 0);
    CHECK(strlen(out.base) == 63);
    {
        static const char *const names[] = {"warren\x01.mem",
                                            "a b",
                                            "warren-vm-\x7f",
                                            "../warren.mem",
                                            "/dev/shm/warren-vm-1.mem",
                                            "warren\xc3\xa9.mem",
                                            "x/",
                                            "\t"};
        for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
            fsz = delta_info(&in, 10000, 3000, names[i]);
            vmm_snap_encode(bad, &in);
            CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
            CHECK(strstr(why, "not a printable file name") != NULL);
        }
    }
    /* Bytes after the name's NUL, with a valid header checksum. */
    fsz = delta_info(&in, 10000, 3000, "warren-vm-1.mem");
    vmm_snap_encode(bad, &in);
    bad[128 + 20] = 'z';
    snap_fix_crc(bad);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "after its end") != NULL);

    /* SHARED_RAM and DELTA together contradict each other. */
    fsz = delta_info(&in, 10000, 3000, "warren-vm-1.mem");
    in.flags = VMM_SNAP_F_SHARED_RAM | VMM_SNAP_F_DELTA;
    vmm_snap_encode(bad, &in);
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "contradict") != NULL);
    in.flags = VMM_SNAP_F_DELTA;

    /* A version-1 file (its stream has a configuration section): refused by name. */
    memcpy(bad, h, sizeof(h));
    bad[8] = 1;
    snap_fix_crc(bad);
    fsz = delta_info(&in, 10000, 3000, "warren-vm-0123abcd.mem");
    CHECK(vmm_snap_decode(bad, sizeof(bad), fsz, &out, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "version 1") != NULL && strstr(why, "reads 2") != NULL);
    printf("snapshot refused: \"%s\"\n", why);
    {
        /* And a version-1 full header as an older warrend wrote it. */
        struct vmm_snap_info f = {.stream_len = 50000, .mem_mb = 256, .vcpus = 1};
        snprintf(f.qemu_version, sizeof(f.qemu_version), "7.2.22");
        vmm_snap_encode(bad, &f);
        bad[8] = 1;
        snap_fix_crc(bad);
        CHECK(vmm_snap_decode(bad, sizeof(bad), VMM_SNAP_HDR + 50000, &out, why, sizeof(why)) ==
              -EINVAL);
        CHECK(strstr(why, "version 1") != NULL);
    }
    CHECK(h[8] == 3 && h[9] == 0 && h[10] == 0 && h[11] == 0);

    /* Restore: a delta goes over a memory file (the template's), never into a VM
     * without one. */
    fsz = delta_info(&in, 10000, 3000, "warren-vm-0123abcd.mem");
    CHECK(vmm_snap_decode(h, sizeof(h), fsz, &out, why, sizeof(why)) == 0);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 1, true, why, sizeof(why)) == 0);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 1, false, why, sizeof(why)) == -EINVAL);
    CHECK(strstr(why, "does not hold all its") != NULL && strstr(why, "has no") != NULL);
    CHECK(vmm_snap_match(&out, "8.2.0", 256, 1, true, why, sizeof(why)) == -EINVAL);
    CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 512, 1, true, why, sizeof(why)) == -EINVAL);
    /* A full stream is refused by a VM over a memory file. */
    {
        struct vmm_snap_info f = {.stream_len = 50000, .mem_mb = 256, .vcpus = 1};
        snprintf(f.qemu_version, sizeof(f.qemu_version), "7.2.22 (Debian)");
        vmm_snap_encode(bad, &f);
        CHECK(vmm_snap_decode(bad, sizeof(bad), VMM_SNAP_HDR + 50000, &out, why, sizeof(why)) == 0);
        CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 1, false, why, sizeof(why)) == 0);
        CHECK(vmm_snap_match(&out, "7.2.22 (Debian)", 256, 1, true, why, sizeof(why)) == -EINVAL);
        CHECK(strstr(why, "holds") != NULL && strstr(why, "maps") != NULL);
    }
}

/* A qcow2 backing: overlays over the template's frozen overlay. */
static void test_qcow2_backing(void)
{
    char base[128], mid[128], top[128], cmd[1200], out[8192];
    uint8_t h[512];
    bool q;
    uint64_t vs;

    snprintf(base, sizeof(base), "%s/b2.raw", dir);
    snprintf(mid, sizeof(mid), "%s/mid.qcow2", dir);
    snprintf(top, sizeof(top), "%s/top.qcow2", dir);
    make_base(base, 8 << 20);
    CHECK(vmm_qcow2_create(mid, base, 0) == 0); /* raw backing still works */
    snprintf(cmd, sizeof(cmd), "qemu-io -f qcow2 -c 'write -P 0x77 2M 64k' '%s' 2>&1", mid);
    CHECK(run(cmd, NULL, 0) == 0);
    CHECK(vmm_qcow2_create(top, mid, 4 << 20) == -EINVAL); /* not the backing's size */
    CHECK(vmm_qcow2_create(top, mid, 0) == 0);
    snprintf(cmd, sizeof(cmd), "qemu-img check -f qcow2 '%s' 2>&1", top);
    CHECK(run(cmd, out, sizeof(out)) == 0);
    snprintf(cmd, sizeof(cmd), "qemu-img info --output=json --backing-chain '%s' 2>&1", top);
    CHECK(run(cmd, out, sizeof(out)) == 0);
    CHECK(strstr(out, "\"backing-filename-format\": \"qcow2\"") != NULL);
    CHECK(strstr(out, "\"virtual-size\": 8388608") != NULL);
    /* Reads fall through both layers; a write to the top stays there. */
    snprintf(cmd, sizeof(cmd),
             "qemu-io -f qcow2 -c 'read -P 0x77 2M 64k' -c 'read -P 0x11 0 64k' "
             "-c 'write -P 0x99 2M 4k' '%s' 2>&1 && "
             "qemu-io -f qcow2 -r -c 'read -P 0x77 2M 4k' '%s' 2>&1",
             top, mid);
    CHECK(run(cmd, out, sizeof(out)) == 0 && !strstr(out, "Pattern verification failed"));

    /* The header probe: bounded fields. */
    {
        int fd = open(mid, O_RDONLY);
        CHECK(fd >= 0 && pread(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h));
        close(fd);
    }
    CHECK(vmm_qcow2_probe(h, sizeof(h), &q, &vs) == 0 && q && vs == 8 << 20);
    CHECK(vmm_qcow2_probe((const uint8_t *)"\x11\x11\x11\x11", 4, &q, &vs) == 0 && !q);
    {
        struct {
            size_t off;
            uint8_t v;
        } bad[] = {
            {7, 4},     /* version 4 */
            {23, 30},   /* cluster bits 30 */
            {23, 8},    /* cluster bits 8 */
            {35, 1},    /* encrypted */
            {31, 0x01}, /* size not a multiple of 512 */
            {24, 0xff}, /* size far past the cap */
            {39, 0},    /* l1_size 0: cannot map the size */
            {36, 0x10}, /* l1 table of 2 GiB */
            {79, 0x02}, /* corrupt bit */
            {79, 0x04}, /* external data file */
            {76, 0x80}, /* unknown incompatible bit */
            {103, 40},  /* header length < 104 */
            {99, 9},    /* refcount order 9 */
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
            uint8_t c[512];
            memcpy(c, h, sizeof(c));
            c[bad[i].off] = bad[i].v;
            if (vmm_qcow2_probe(c, sizeof(c), &q, &vs) != -EINVAL)
                fprintf(stderr, "qcow2 probe accepted case %zu\n", i);
            CHECK(vmm_qcow2_probe(c, sizeof(c), &q, &vs) == -EINVAL);
        }
        CHECK(vmm_qcow2_probe(h, 60, &q, &vs) == -EINVAL); /* short header */
        /* A damaged backing is refused by create too, and leaves no file. */
        {
            char badf[128];
            uint8_t c[512];
            int fd;
            snprintf(badf, sizeof(badf), "%s/bad.qcow2", dir);
            memcpy(c, h, sizeof(c));
            c[23] = 30;
            fd = open(badf, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            CHECK(fd >= 0 && write(fd, c, sizeof(c)) == (ssize_t)sizeof(c));
            close(fd);
            snprintf(cmd, sizeof(cmd), "%s/top2.qcow2", dir);
            CHECK(vmm_qcow2_create(cmd, badf, 0) == -EINVAL && access(cmd, F_OK) != 0);
        }
    }

    /* The backing name: read back, bounded, and rewritten for a snapshot's hard link. */
    {
        char name[VMM_QCOW2_NAME_MAX + 1], link_[160], big[2000];
        uint8_t c[512];
        CHECK(vmm_qcow2_backing_name(h, sizeof(h), name, sizeof(name)) == 0 &&
              strcmp(name, base) == 0);
        CHECK(vmm_qcow2_backing(top, name, sizeof(name)) == 0 && strcmp(name, mid) == 0);
        CHECK(vmm_qcow2_backing_name(h, sizeof(h), name, 4) == -EINVAL); /* does not fit */
        memcpy(c, h, sizeof(c));
        c[19] = 200; /* name runs past what was read */
        CHECK(vmm_qcow2_backing_name(c, sizeof(c), name, sizeof(name)) == -EINVAL);
        memcpy(c, h, sizeof(c));
        c[15] = 2; /* name offset inside the fixed header */
        CHECK(vmm_qcow2_backing_name(c, sizeof(c), name, sizeof(name)) == -EINVAL);
        memcpy(c, h, sizeof(c));
        c[h[15] + 1] = 0; /* a NUL inside the name */
        CHECK(vmm_qcow2_backing_name(c, sizeof(c), name, sizeof(name)) == -EINVAL);
        memcpy(c, h, sizeof(c));
        memset(c + 8, 0, 12); /* no backing */
        CHECK(vmm_qcow2_backing_name(c, sizeof(c), name, sizeof(name)) == 0 && !name[0]);
        CHECK(vmm_qcow2_backing_name((const uint8_t *)"raw!", 4, name, sizeof(name)) == -EINVAL);

        /* A longer name and a shorter one: the chain still reads through. */
        snprintf(link_, sizeof(link_), "%s/a-much-longer-name-for-the-middle.qcow2", dir);
        CHECK(link(mid, link_) == 0);
        CHECK(vmm_qcow2_rebase(top, link_) == 0);
        CHECK(vmm_qcow2_backing(top, name, sizeof(name)) == 0 && strcmp(name, link_) == 0);
        snprintf(cmd, sizeof(cmd),
                 "qemu-img check -f qcow2 '%s' 2>&1 && qemu-io -f qcow2 -r -c 'read -P 0x99 2M "
                 "4k' -c 'read -P 0x77 2101248 61440' -c 'read -P 0x11 0 64k' '%s' 2>&1",
                 top, top);
        CHECK(run(cmd, out, sizeof(out)) == 0 && !strstr(out, "Pattern verification failed"));
        CHECK(vmm_qcow2_rebase(top, mid) == 0);
        CHECK(vmm_qcow2_backing(top, name, sizeof(name)) == 0 && strcmp(name, mid) == 0);
        snprintf(cmd, sizeof(cmd), "qemu-io -f qcow2 -r -c 'read -P 0x77 2101248 61440' '%s' 2>&1",
                 top);
        CHECK(run(cmd, out, sizeof(out)) == 0 && !strstr(out, "Pattern verification failed"));
        memset(big, 'x', sizeof(big) - 1);
        big[sizeof(big) - 1] = 0;
        CHECK(vmm_qcow2_rebase(top, big) == -EINVAL);  /* past the name cap */
        CHECK(vmm_qcow2_rebase(base, mid) == -EINVAL); /* raw: no header */
        unlink(link_);
    }
}

static void touch(const char *a, const char *b, const char *content)
{
    char p[512];
    FILE *f;

    snprintf(p, sizeof(p), "%s/%s", a, b);
    f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(content, f);
        fclose(f);
    }
}

static void mkdirs(const char *root, const char *rel)
{
    char p[512];
    snprintf(p, sizeof(p), "mkdir -p '%s/%s'", root, rel);
    CHECK(run(p, NULL, 0) == 0);
}

static void test_cgroup_paths(void)
{
    struct vmm_cg_host h;
    struct vmm_cg_limits lim;
    char root[128], why[256], name[512], dirs[VMM_CG_V1_N][PATH_MAX];
    uid_t uid = 0;

    /* Names carry the uid: the sweep keeps exactly the adopted VMs' groups. */
    CHECK(vmm_cg_name(name, sizeof(name), 200042, "sb-0123") == 0);
    CHECK(strcmp(name, "u200042.sb-0123") == 0);
    CHECK(vmm_cg_parse(name, &uid) == 0 && uid == 200042);
    CHECK(vmm_cg_parse("u12", &uid) == -EINVAL);
    CHECK(vmm_cg_parse("x1.a", &uid) == -EINVAL);
    CHECK(vmm_cg_parse("u.a", &uid) == -EINVAL);
    CHECK(vmm_cg_parse("u99999999999.a", &uid) == -EINVAL);

    /* Limits from the size: RAM + overhead, vCPUs + half a core, pids. */
    vmm_cg_limits(512, 2, 256, 0, &lim);
    CHECK(lim.mem_bytes == (768ull << 20));
    CHECK(lim.cpu_quota_us == 250000 && lim.cpu_period_us == 100000);
    CHECK(lim.cpu_weight == 200 && lim.cpu_shares == 2048 && lim.pids_max == 512);
    vmm_cg_limits(0, 0, 0, 64, &lim);
    CHECK(lim.mem_bytes == (256ull << 20) && lim.cpu_quota_us == 150000 && lim.pids_max == 64);

    /* v1 (this host): one hierarchy per controller. */
    snprintf(root, sizeof(root), "%s/cg-v1", dir);
    mkdirs(root, "memory");
    mkdirs(root, "cpu");
    mkdirs(root, "pids");
    mkdirs(root, "unified");
    touch(root, "memory/cgroup.procs", "");
    touch(root, "cpu/cgroup.procs", "");
    touch(root, "pids/cgroup.procs", "");
    touch(root, "unified/cgroup.controllers", "hugetlb\n");
    CHECK(vmm_cg_detect(root, "warren/abc", &h, why, sizeof(why)) == 0);
    CHECK(h.mode == VMM_CG_V1 && h.n == 3);
    snprintf(name, sizeof(name), "%s/memory/warren/abc", root);
    CHECK(strcmp(h.parent[VMM_CG_MEM], name) == 0);
    snprintf(name, sizeof(name), "%s/pids/warren/abc", root);
    CHECK(strcmp(h.parent[VMM_CG_PIDS], name) == 0);
    CHECK(vmm_cg_group_dirs(&h, 200001, "sb-1", dirs) == 0);
    snprintf(name, sizeof(name), "%s/cpu/warren/abc/u200001.sb-1", root);
    CHECK(strcmp(dirs[VMM_CG_CPU], name) == 0);
    CHECK(vmm_cg_detect(root, "../escape", &h, why, sizeof(why)) == -EINVAL);
    CHECK(vmm_cg_detect(root, "/abs", &h, why, sizeof(why)) == -EINVAL);

    /* Hybrid with the controllers in the unified hierarchy only: v2 there. */
    snprintf(root, sizeof(root), "%s/cg-hybrid", dir);
    mkdirs(root, "unified");
    touch(root, "unified/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma\n");
    CHECK(vmm_cg_detect(root, "warren", &h, why, sizeof(why)) == 0);
    CHECK(h.mode == VMM_CG_V2 && h.n == 1);
    snprintf(name, sizeof(name), "%s/unified/warren", root);
    CHECK(strcmp(h.parent[0], name) == 0);

    /* Pure v2 (production): /sys/fs/cgroup itself. */
    snprintf(root, sizeof(root), "%s/cg-v2", dir);
    mkdirs(root, "");
    touch(root, "cgroup.controllers", "cpuset cpu io memory pids\n");
    CHECK(vmm_cg_detect(root, "warren", &h, why, sizeof(why)) == 0);
    CHECK(h.mode == VMM_CG_V2);
    CHECK(vmm_cg_group_dirs(&h, 7, "x", dirs) == 0);
    snprintf(name, sizeof(name), "%s/warren/u7.x", root);
    CHECK(strcmp(dirs[0], name) == 0);

    /* v2 without the pids controller, and no v1: nothing usable, said why. */
    snprintf(root, sizeof(root), "%s/cg-none", dir);
    mkdirs(root, "");
    touch(root, "cgroup.controllers", "cpu memory\n");
    why[0] = 0;
    CHECK(vmm_cg_detect(root, "warren", &h, why, sizeof(why)) == -ENOTSUP && why[0]);
}

/* The uid range, on a jail over a fake v1 tree (needs root, like the jail). */
static void test_jail_uids(void)
{
    char root[256], jroot[256], locks[256], why[256] = "", p[512];
    struct vmm_jail_conf jc = {0};
    struct vmm_jail *j = NULL, *j2 = NULL;
    uid_t a, b, c;
    pid_t kid;

    if (geteuid() != 0) {
        CHECK(vmm_jail_new(&jc, &j, why, sizeof(why)) == -EPERM && j == NULL);
        printf("jail uids: not root, skipped\n");
        return;
    }
    snprintf(root, sizeof(root), "%s/cg-v1", dir); /* made by test_cgroup_paths */
    snprintf(jroot, sizeof(jroot), "%s/jail-root", dir);
    snprintf(locks, sizeof(locks), "%s/uid-locks", dir);
    jc.uid_base = 250000;
    jc.uid_count = 3;
    jc.cgroup_name = "warren/t";
    jc.cgroup_sysfs = root;
    jc.root_dir = jroot;
    jc.uid_lock_dir = locks;
    CHECK(vmm_jail_new(&jc, &j, why, sizeof(why)) == 0);
    if (!j) {
        printf("jail: %s\n", why);
        return;
    }
    snprintf(p, sizeof(p), "%s/memory/warren/t", root);
    CHECK(access(p, F_OK) == 0); /* parents made with mkdir -p */
    CHECK(access(jroot, F_OK) == 0);
    /* After a restart the adopted VMs' uids are claimed first... */
    CHECK(vmm_jail_uid_claim(j, 250001) == 0);
    CHECK(vmm_jail_uid_claim(j, 250001) == -EEXIST);
    CHECK(vmm_jail_uid_claim(j, 249999) == -ERANGE);
    CHECK(vmm_jail_uid_claim(j, 250003) == -ERANGE);
    /* ...and new VMs never get one of those. */
    CHECK(vmm_jail_uid_alloc(j, &a) == 0 && a == 250000);
    CHECK(vmm_jail_uid_alloc(j, &b) == 0 && b == 250002);
    CHECK(vmm_jail_uid_alloc(j, &c) == -EUSERS);
    CHECK(vmm_jail_uids_in_use(j) == 3);
    vmm_jail_uid_release(j, a);
    CHECK(vmm_jail_uid_alloc(j, &c) == 0 && c == 250000);

    /* Another warrend over the same range (the same lock dir): it refuses to start
     * while every uid is held, and never gets a uid held by the first. */
    CHECK(vmm_jail_new(&jc, &j2, why, sizeof(why)) == -EBUSY && j2 == NULL);
    vmm_jail_uid_release(j, 250002);
    CHECK(vmm_jail_new(&jc, &j2, why, sizeof(why)) == 0);
    if (j2) {
        CHECK(vmm_jail_uid_claim(j2, 250001) == -EEXIST); /* the first's */
        /* A process runs as 250002 (a killed warrend's QEMU): not given out either. */
        if ((kid = fork()) == 0) {
            if (setresgid(250002, 250002, 250002) == 0 && setresuid(250002, 250002, 250002) == 0)
                pause();
            _exit(1);
        }
        for (int i = 0; i < 200; i++) {
            char st[64], line[128];
            FILE *f;
            unsigned u = 0;
            snprintf(st, sizeof(st), "/proc/%d/status", (int)kid);
            if ((f = fopen(st, "re"))) {
                while (fgets(line, sizeof(line), f))
                    if (sscanf(line, "Uid: %u", &u) == 1)
                        break;
                fclose(f);
            }
            if (u == 250002)
                break;
            usleep(5000);
        }
        CHECK(vmm_jail_uid_alloc(j2, &b) == -EUSERS);
        kill(kid, SIGKILL);
        waitpid(kid, NULL, 0);
        CHECK(vmm_jail_uid_alloc(j2, &b) == 0 && b == 250002);
        CHECK(vmm_jail_uid_alloc(j, &c) == -EUSERS);
        /* Its locks go with it (as with a kill -9). */
        vmm_jail_free(j2);
        CHECK(vmm_jail_uid_alloc(j, &c) == 0 && c == 250002);
    }

    /* Sweep: a group of a uid nobody holds goes, the held ones stay, foreign names stay. */
    mkdirs(root, "memory/warren/t/u250001.sb-kept");
    mkdirs(root, "memory/warren/t/u250005.sb-stale");
    mkdirs(root, "memory/warren/t/not-ours");
    CHECK(vmm_jail_sweep(j, NULL) == 1);
    snprintf(p, sizeof(p), "%s/memory/warren/t/u250001.sb-kept", root);
    CHECK(access(p, F_OK) == 0);
    snprintf(p, sizeof(p), "%s/memory/warren/t/u250005.sb-stale", root);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof(p), "%s/memory/warren/t/not-ours", root);
    CHECK(access(p, F_OK) == 0);

    /* Another warrend's VM on the same host (a process whose command line does not
     * name this one's state dir: an orphan of a killed warrend) is left alone. */
    mkdirs(root, "memory/warren/t/u250006.sb-other");
    {
        pid_t sleeper = fork();
        FILE *f;
        if (sleeper == 0) {
            execlp("sleep", "sleep", "30", (char *)NULL);
            _exit(127);
        }
        snprintf(p, sizeof(p), "%s/memory/warren/t/u250006.sb-other/cgroup.procs", root);
        CHECK((f = fopen(p, "w")) != NULL);
        if (f) {
            fprintf(f, "%d\n", (int)sleeper);
            fclose(f);
        }
        usleep(50000); /* exec'd: its command line is sleep's */
        CHECK(vmm_jail_sweep(j, "/var/lib/this-warrend") == 0);
        CHECK(kill(sleeper, 0) == 0);
        unlink(p);
        kill(sleeper, SIGKILL);
        waitpid(sleeper, NULL, 0);
        /* Empty and of no one now: swept. */
        CHECK(vmm_jail_sweep(j, "/var/lib/this-warrend") == 1);
    }
    vmm_jail_free(j);
}

/* What a jailed QEMU gets to see: exactly these paths, at their host paths. */
static void test_jail_plan(void)
{
    struct vmm_config vc = {0};
    struct vmm_jail_plan_view *pv = malloc(vmm_jail_plan_size());
    char run[256], kern[256], want[512];
    bool usr = false, rundir = false, kernel = false, null = false, kvm = false, lib = false;
    int kind, n = 0;
    const char *src, *dst;

    snprintf(run, sizeof(run), "%s/state/sandboxes/sb-1", dir);
    mkdirs(dir, "state/sandboxes/sb-1");
    snprintf(kern, sizeof(kern), "%s/vmlinux", dir);
    touch(dir, "vmlinux", "k");
    vc.id = "sb-1";
    vc.run_dir = run;
    vc.kernel = kern;
    vc.accel = VMM_ACCEL_TCG;
    CHECK(pv != NULL);
    if (!pv)
        return;
    CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == 0);
    for (int i = 0; vmm_jail_plan_entry(pv, i, &kind, &src, &dst) == 0; i++, n++) {
        CHECK(strncmp(dst, "/jr/", 4) == 0);
        CHECK(strstr(dst, "api_key") == NULL && strstr(dst, "index") == NULL);
        if (strcmp(dst, "/jr/usr") == 0)
            usr = kind == 0; /* read-only dir */
        snprintf(want, sizeof(want), "/jr%s", run);
        if (strcmp(dst, want) == 0)
            rundir = kind == 3 && strcmp(src, run) == 0; /* the only writable one */
        else
            CHECK(kind != 3);
        snprintf(want, sizeof(want), "/jr%s", kern);
        if (strcmp(dst, want) == 0)
            kernel = kind == 1;
        if (strcmp(dst, "/jr/dev/null") == 0)
            null = kind == 2;
        if (strcmp(dst, "/jr/dev/kvm") == 0)
            kvm = true;
        if (strcmp(dst, "/jr/lib") == 0)
            lib = true;
        /* QEMU under /usr is not bound twice. */
        CHECK(strstr(dst, "qemu-system") == NULL);
    }
    CHECK(usr && rundir && kernel && null && lib && !kvm);
    CHECK(n < 24);
    /* Under KVM /dev/kvm is there too. */
    vc.accel = VMM_ACCEL_KVM;
    CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == 0);
    kvm = false;
    for (int i = 0; vmm_jail_plan_entry(pv, i, &kind, &src, &dst) == 0; i++)
        kvm |= strcmp(dst, "/jr/dev/kvm") == 0;
    CHECK(kvm);
    /* A restored snapshot's disk: overlay -> the snapshot's frozen overlay -> the
     * template image. Every file of the chain is shown read-only, each once. */
    {
        char base[300], snap[300], top[300], wb[512], ws[512];
        int nb = 0, ns = 0;
        snprintf(base, sizeof(base), "%s/chain-base.ext4", dir);
        snprintf(snap, sizeof(snap), "%s/chain-snap.qcow2", dir);
        snprintf(top, sizeof(top), "%s/chain-top.qcow2", dir);
        touch(dir, "chain-base.ext4", "");
        CHECK(truncate(base, 1 << 20) == 0);
        CHECK(vmm_qcow2_create(snap, base, 0) == 0);
        CHECK(vmm_qcow2_create(top, snap, 0) == 0);
        snprintf(wb, sizeof(wb), "/jr%s", base);
        snprintf(ws, sizeof(ws), "/jr%s", snap);
        vc.accel = VMM_ACCEL_TCG;
        vc.disk = top;
        for (int round = 0; round < 2; round++) {
            vc.backing = round ? snap : NULL; /* given or not, bound once */
            nb = ns = 0;
            CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == 0);
            for (int i = 0; vmm_jail_plan_entry(pv, i, &kind, &src, &dst) == 0; i++) {
                nb += strcmp(dst, wb) == 0 && kind == 1;
                ns += strcmp(dst, ws) == 0 && kind == 1;
            }
            CHECK(nb == 1 && ns == 1);
        }
        /* A chain that loops (its names are meant to be warrend's own) is refused. */
        CHECK(vmm_qcow2_rebase(snap, top) == 0);
        CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == -ELOOP);
        vc.disk = NULL;
        vc.backing = NULL;
    }
    /* A clone over a template's RAM: the sealed memfd is shown at the RAM file's path
     * as a link to the fd QEMU inherits, beside a proc of the jail's own; nothing of
     * the RAM file itself. Without a memfd nothing of it is shown. */
    {
        bool proc = false, link = false;
        vc.mem_path = "/dev/shm/warren-vm-1.mem";
        vc.mem_fd = 7;
        CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == 0);
        for (int i = 0; vmm_jail_plan_entry(pv, i, &kind, &src, &dst) == 0; i++) {
            proc |= strcmp(dst, "/jr/proc") == 0 && kind == 5;
            if (strcmp(dst, "/jr/dev/shm/warren-vm-1.mem") == 0)
                link = kind == 4 && strcmp(src, "/proc/self/fd/" VMM_MEM_FD_STR) == 0;
        }
        CHECK(proc && link);
        vc.mem_fd = 0;
        CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == 0);
        for (int i = 0; vmm_jail_plan_entry(pv, i, &kind, &src, &dst) == 0; i++)
            CHECK(strstr(dst, "warren-vm-1.mem") == NULL && strcmp(dst, "/jr/proc") != 0);
        vc.mem_path = NULL;
    }
    /* A template that does not exist fails the plan, not the child. */
    vc.backing = "/nonexistent/base.ext4";
    CHECK(vmm_jail_plan_build("/jr", &vc, "/usr/bin/qemu-system-x86_64", pv) == -ENOENT);
    free(pv);
}

/* vmm_mem_seal: the file's bytes (holes kept), and nobody can write the copy, grow or
 * shrink it, or map it shared and writable, while a private writable mapping works and
 * stays private; reopened through /proc (as a jailed QEMU opens it) the same holds. */
static void test_mem_seal(void)
{
    char path[300], proc[64];
    const size_t sz = 8u << 20;
    unsigned char *m, *p2;
    struct stat st;
    int fd, fd2;

    snprintf(path, sizeof(path), "%s/ram.mem", dir);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)sz) == 0);
    CHECK(pwrite(fd, "head", 4, 0) == 4 && pwrite(fd, "tail", 4, (off_t)sz - 4) == 4);
    close(fd);
    fd = vmm_mem_seal(path);
    CHECK(fd > 2);
    if (fd < 0)
        return;
    CHECK(vmm_mem_sealed(fd) == 0);
    CHECK(fstat(fd, &st) == 0 && (size_t)st.st_size == sz);
    CHECK((size_t)st.st_blocks * 512 < sz / 2); /* the hole between stayed a hole */
    m = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(m != MAP_FAILED);
    if (m != MAP_FAILED) {
        CHECK(!memcmp(m, "head", 4) && !memcmp(m + sz - 4, "tail", 4) && m[sz / 2] == 0);
        m[0] = 'X'; /* private: the memfd keeps its byte */
        munmap(m, sz);
    }
    CHECK(pwrite(fd, "w", 1, 0) < 0 && errno == EPERM);
    CHECK(ftruncate(fd, (off_t)sz * 2) < 0 && errno == EPERM);
    CHECK(ftruncate(fd, 4096) < 0 && errno == EPERM);
    CHECK(mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED &&
          errno == EPERM);
    CHECK(fcntl(fd, F_ADD_SEALS, 0) < 0 && errno == EPERM); /* F_SEAL_SEAL */
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    fd2 = open(proc, O_RDWR);
    CHECK(fd2 >= 0);
    if (fd2 >= 0) {
        unsigned char c = 0;
        CHECK(pwrite(fd2, "w", 1, 0) < 0 && errno == EPERM);
        CHECK(pread(fd2, &c, 1, 0) == 1 && c == 'h');
        p2 = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd2, 0);
        CHECK(p2 != MAP_FAILED);
        if (p2 != MAP_FAILED)
            munmap(p2, sz);
        close(fd2);
    }
    close(fd);
    /* An unsealed fd is refused by the check. */
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && vmm_mem_sealed(fd) == -EPERM);
    close(fd);
    CHECK(vmm_mem_seal("/nonexistent/ram.mem") == -ENOENT);
}

/* vmm_copy_nonzero: the same bytes as vmm_copy_sparse, and the pages of zeros inside
 * the data (written zeros, across the copy's 64 KiB reads) are holes in the copy. */
static void test_copy_nonzero(void)
{
    char src[300], dst[2][300];
    static unsigned char page[4096], back[4096];
    const off_t sz = 4 << 20;
    int in, out;

    snprintf(src, sizeof(src), "%s/ram-src.mem", dir);
    in = open(src, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(in >= 0 && ftruncate(in, sz) == 0);
    /* 64 pages of data from 0 (every 5th zeros, 15 of them before 64 KiB), a hole, 2 pages
     * at 1 MiB (the first zeros), and the last page with one byte at its end. */
    for (int i = 0; i < 64; i++) {
        memset(page, i % 5 ? 'a' + i % 26 : 0, sizeof(page));
        CHECK(pwrite(in, page, sizeof(page), (off_t)i * 4096) == (ssize_t)sizeof(page));
    }
    memset(page, 0, sizeof(page));
    CHECK(pwrite(in, page, sizeof(page), 1 << 20) == (ssize_t)sizeof(page));
    memset(page, 'z', sizeof(page));
    CHECK(pwrite(in, page, sizeof(page), (1 << 20) + 4096) == (ssize_t)sizeof(page));
    CHECK(pwrite(in, "!", 1, sz - 1) == 1);
    for (int k = 0; k < 2; k++) {
        snprintf(dst[k], sizeof(dst[k]), "%s/ram-dst%d.mem", dir, k);
        out = open(dst[k], O_RDWR | O_CREAT | O_TRUNC, 0600);
        CHECK(out >= 0 && ftruncate(out, sz) == 0);
        CHECK((k ? vmm_copy_nonzero(in, out, sz) : vmm_copy_sparse(in, out, sz)) == 0);
        for (off_t at = 0; at < sz; at += 4096) {
            CHECK(pread(in, page, sizeof(page), at) == (ssize_t)sizeof(page));
            CHECK(pread(out, back, sizeof(back), at) == (ssize_t)sizeof(back));
            CHECK(memcmp(page, back, sizeof(page)) == 0);
        }
        if (k == 1) {
            for (int i = 0; i < 64; i++)
                CHECK((lseek(out, (off_t)i * 4096, SEEK_HOLE) == (off_t)i * 4096) == !(i % 5));
            CHECK(lseek(out, 1 << 20, SEEK_HOLE) == 1 << 20);
            CHECK(lseek(out, 1 << 20, SEEK_DATA) == (1 << 20) + 4096);
            CHECK(lseek(out, sz - 4096, SEEK_DATA) == sz - 4096);
        }
        close(out);
    }
    close(in);
}

/* vmm_delta_map_ino finds a process's guest-RAM mapping by its file's path (also once
 * removed) and size, or a sealed memfd of that name; nothing else. */
static void test_map_ino(void)
{
    char path[300], other[300];
    const size_t sz = 1u << 20;
    struct stat st;
    void *m, *m2 = MAP_FAILED;
    int fd, mfd;

    snprintf(path, sizeof(path), "%s/warren-vm-unit.mem", dir);
    snprintf(other, sizeof(other), "%s/warren-vm-unit.mem2", dir);
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)sz) == 0 && fstat(fd, &st) == 0);
    m = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    CHECK(m != MAP_FAILED);
    close(fd);
    CHECK(vmm_delta_map_ino(getpid(), path, 1) == st.st_ino);
    CHECK(vmm_delta_map_ino(getpid(), path, 2) == 0); /* not that size */
    CHECK(vmm_delta_map_ino(getpid(), other, 1) == 0);
    CHECK(unlink(path) == 0);
    CHECK(vmm_delta_map_ino(getpid(), path, 1) == st.st_ino); /* "(deleted)" */
    if (m != MAP_FAILED)
        munmap(m, sz);
    CHECK(vmm_delta_map_ino(getpid(), path, 1) == 0);
    /* A sealed memfd (what a jailed QEMU maps), whatever path the VM was given. */
    fd = open(other, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)sz) == 0);
    close(fd);
    mfd = vmm_mem_seal(other);
    CHECK(mfd > 0);
    if (mfd > 0 && fstat(mfd, &st) == 0 && (size_t)st.st_size >= sz)
        m2 = mmap(NULL, sz, PROT_READ, MAP_PRIVATE, mfd, 0);
    CHECK(m2 != MAP_FAILED);
    CHECK(vmm_delta_map_ino(getpid(), path, 1) == st.st_ino);
    if (m2 != MAP_FAILED)
        munmap(m2, sz);
    if (mfd > 0)
        close(mfd);
}

/* An anonymous read-write mapping of mb MiB between two PROT_NONE pages (as QEMU lays
 * out a booted guest's RAM: its guard after it; the one before keeps it from merging
 * with a neighbour here): its start, or NULL. */
static char *guarded(unsigned mb)
{
    size_t len = (size_t)mb << 20;
    char *m = mmap(NULL, len + 2 * 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (m == MAP_FAILED || mprotect(m + 4096, len, PROT_READ | PROT_WRITE) != 0)
        return NULL;
    return m + 4096;
}

/* vmm_save_ram's parts: which mapping is the guest's RAM, and the RAM file made of it. */
/* fd's mtime set s seconds before the present one. */
static int set_mtime_back(int fd, int s)
{
    struct stat st;
    struct timespec ts[2];

    if (fstat(fd, &st) != 0)
        return -1;
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1] = st.st_mtim;
    ts[1].tv_sec -= s;
    return futimens(fd, ts);
}

static void test_ram_file(void)
{
    const unsigned mb = 3; /* a size nothing else in this process maps */
    const size_t len = (size_t)mb << 20;
    char path[300], ram[300], why[240], page[4096];
    struct vmm_snap_info info;
    struct stat st;
    uint8_t dev[100];
    char *m, *m2, *bare;
    int fd, rfd;

    CHECK(vmm_ram_anon_find(getpid(), mb) == 0); /* nothing yet */
    m = guarded(mb);
    CHECK(m != NULL);
    if (!m)
        return;
    CHECK(vmm_ram_anon_find(getpid(), mb) == (uintptr_t)m);
    CHECK(vmm_ram_anon_find(getpid(), mb + 1) == 0);
    /* One of that size without a guard after it is not taken for the guest's... */
    bare = mmap(NULL, len + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(bare != MAP_FAILED && mprotect(bare + len, 4096, PROT_READ) == 0);
    CHECK(vmm_ram_anon_find(getpid(), mb) == (uintptr_t)m);
    /* ... and two that both look like it are refused, not guessed between. */
    m2 = guarded(mb);
    CHECK(m2 != NULL);
    CHECK(vmm_ram_anon_find(getpid(), mb) == 0);
    if (m2)
        munmap(m2 - 4096, len + 2 * 4096);
    CHECK(vmm_ram_anon_find(getpid(), mb) == (uintptr_t)m);

    /* Touched pages: two with data, one of zeros; the rest never touched. */
    memset(m, 'A', 4096);
    memset(m + 5 * 4096, 'B', 4096);
    memset(m + 700 * 4096, 0, 4096);
    snprintf(path, sizeof(path), "%s/ram.snap", dir);
    snprintf(ram, sizeof(ram), "%s/vm-1-snap-2.ram", dir);
    memset(dev, 0x5a, sizeof(dev));
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && pwrite(fd, dev, sizeof(dev), VMM_SNAP_HDR) == (ssize_t)sizeof(dev));
    memset(&info, 0, sizeof(info));
    CHECK(vmm_ram_write(fd, getpid(), mb, ram, true, &info, why, sizeof(why)) == 0);
    CHECK(info.npages == 0 && (info.flags & VMM_SNAP_F_DELTA));
    CHECK(strcmp(info.base, "vm-1-snap-2.ram") == 0);
    CHECK(info.dev_len == sizeof(dev) + 5); /* and the vmdescription that ends it */
    CHECK(fstat(fd, &st) == 0 && (uint64_t)st.st_size >= VMM_SNAP_HDR + info.dev_len &&
          (uint64_t)st.st_size < VMM_SNAP_HDR + info.dev_len + 2 * 4096);
    close(fd);
    rfd = open(ram, O_RDONLY);
    CHECK(rfd >= 0 && fstat(rfd, &st) == 0 && (size_t)st.st_size == len);
    CHECK(pread(rfd, page, sizeof(page), 0) == 4096 && page[0] == 'A' && page[4095] == 'A');
    CHECK(pread(rfd, page, sizeof(page), 5 * 4096) == 4096 && page[0] == 'B' && page[4095] == 'B');
    CHECK(pread(rfd, page, sizeof(page), 700 * 4096) == 4096 && page[0] == 0 && page[4095] == 0);
    /* Only the two pages with data were written: the rest are holes. */
    CHECK(st.st_blocks * 512 <= 2 * 4096 + 4096);
    CHECK(lseek(rfd, 0, SEEK_HOLE) == 4096);
    CHECK(lseek(rfd, 4096, SEEK_DATA) == 5 * 4096);
    CHECK(lseek(rfd, 6 * 4096, SEEK_DATA) < 0);
    if (rfd >= 0)
        close(rfd);
    /* Its checksum: the whole file's bytes as read back, holes as zeros. */
    CHECK(info.flags & VMM_SNAP_F_RAM_CRC);
    {
        static uint8_t whole[3 << 20];
        uint32_t crc = 1;
        memset(whole, 0, sizeof(whole));
        memset(whole, 'A', 4096);
        memset(whole + 5 * 4096, 'B', 4096);
        CHECK(info.ram_crc == vmm_crc32c(0, whole, sizeof(whole)));
        bool cached = false;
        rfd = open(ram, O_RDWR);
        CHECK(rfd >= 0 && vmm_ram_crc(rfd, len, &crc) == 0 && crc == info.ram_crc);
        /* Remembered from its writing, until it is written again. */
        crc = 1;
        CHECK(vmm_ram_crc_once(rfd, len, &crc, &cached) == 0 && cached && crc == info.ram_crc);
        /* File times tick coarsely (a jiffy), so a write may keep them: each write
         * below also sets an mtime of its own, a second further back. */
        CHECK(pwrite(rfd, "A", 1, 4095) == 1); /* the same byte: a new mtime all the same */
        CHECK(set_mtime_back(rfd, 1) == 0);
        crc = 1;
        CHECK(vmm_ram_crc_once(rfd, len, &crc, &cached) == 0 && !cached && crc == info.ram_crc);
        CHECK(vmm_ram_crc_once(rfd, len, &crc, &cached) == 0 && cached && crc == info.ram_crc);
        CHECK(pwrite(rfd, "a", 1, 4095) == 1);
        CHECK(set_mtime_back(rfd, 2) == 0);
        CHECK(vmm_ram_crc_once(rfd, len, &crc, &cached) == 0 && !cached && crc != info.ram_crc);
        CHECK(pwrite(rfd, "A", 1, 4095) == 1);
        CHECK(vmm_ram_crc_once(rfd, len + 4096, &crc, &cached) == -EIO);
        /* Mapped by a process, read through /proc/PID/map_files: the same. */
        {
            struct stat rs;
            char *mm = mmap(NULL, len, PROT_READ, MAP_PRIVATE, rfd, 0);
            CHECK(mm != MAP_FAILED && fstat(rfd, &rs) == 0);
            CHECK(vmm_ram_crc_mapped(getpid(), rs.st_ino, mb, &crc) == 0 && crc == info.ram_crc);
            CHECK(vmm_ram_crc_mapped(getpid(), rs.st_ino, mb + 1, &crc) == -ENOENT);
            if (mm != MAP_FAILED)
                munmap(mm, len);
        }
        /* One byte changed in a page, or in a hole: another checksum. */
        CHECK(pwrite(rfd, "a", 1, 4095) == 1);
        CHECK(vmm_ram_crc(rfd, len, &crc) == 0 && crc != info.ram_crc);
        CHECK(pwrite(rfd, "A", 1, 4095) == 1);
        CHECK(pwrite(rfd, "\1", 1, 2 << 20) == 1);
        CHECK(vmm_ram_crc(rfd, len, &crc) == 0 && crc != info.ram_crc);
        /* Zeros written over a hole: the same file, the same checksum. */
        CHECK(pwrite(rfd, "\0", 1, 2 << 20) == 1);
        CHECK(vmm_ram_crc(rfd, len, &crc) == 0 && crc == info.ram_crc);
        /* Cut short, or longer: refused, not read as zero-padded. */
        CHECK(vmm_ram_crc(rfd, len + 4096, &crc) == -EIO);
        CHECK(vmm_ram_crc(rfd, len - 4096, &crc) == -EIO);
        if (rfd >= 0)
            close(rfd);
    }
    {
        char tmp[310];
        snprintf(tmp, sizeof(tmp), "%s.tmp", ram);
        CHECK(access(tmp, F_OK) != 0);
    }
    /* No such RAM: refused before a file is made. */
    fd = open(path, O_RDWR | O_TRUNC);
    CHECK(fd >= 0 && pwrite(fd, dev, sizeof(dev), VMM_SNAP_HDR) == (ssize_t)sizeof(dev));
    snprintf(ram, sizeof(ram), "%s/other.ram", dir);
    CHECK(vmm_ram_write(fd, getpid(), mb + 2, ram, false, &info, why, sizeof(why)) == -ENOTSUP);
    CHECK(access(ram, F_OK) != 0);
    if (fd >= 0)
        close(fd);
    munmap(m - 4096, len + 2 * 4096);
    if (bare != MAP_FAILED)
        munmap(bare, len + 4096);
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(p);
}

/* An rwx anonymous mapping of 16 MiB followed by a PROT_NONE page (TCG's buffer as
 * QEMU maps it; the guard keeps two from merging into one), or MAP_FAILED. */
static char *pf_rwx(void)
{
    char *m = mmap(NULL, (16u << 20) + 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (m != MAP_FAILED && mprotect(m + (16u << 20), 4096, PROT_NONE) != 0)
        return MAP_FAILED;
    return m;
}

/* A child with such mappings, page 0 and 7 of the first written with 0xab; each byte
 * on *cmd maps one more; *addr gets the first's address. Its pid, or -1. */
static pid_t pf_child(int *cmd, uintptr_t *addr)
{
    int up[2], down[2];
    pid_t pid;

    if (pipe(up) != 0 || pipe(down) != 0)
        return -1;
    if ((pid = fork()) == 0) {
        char c;
        char *m = pf_rwx();
        uintptr_t a = m == MAP_FAILED ? 0 : (uintptr_t)m;
        if (a) {
            memset(m, 0xab, 4096);
            memset(m + 7 * 4096, 0xab, 4096);
        }
        (void)!write(up[1], &a, sizeof(a));
        while (read(down[0], &c, 1) == 1) {
            void *more = pf_rwx();
            (void)!write(up[1], &more, sizeof(more));
        }
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    if (pid < 0 || read(up[0], addr, sizeof(*addr)) != (ssize_t)sizeof(*addr) || !*addr) {
        close(up[0]);
        close(down[1]);
        return -1;
    }
    *cmd = down[1];
    close(up[0]); /* the second mapping's answer is not waited for: see below */
    return pid;
}

/* Is page i of the child's mapping at a present, and does it hold v throughout? */
static bool pf_page(pid_t pid, uintptr_t a, unsigned i, unsigned char v, bool *present)
{
    char path[48], buf[4096];
    uint64_t ent = 0;
    int fd;
    bool same = true;

    snprintf(path, sizeof(path), "/proc/%d/pagemap", (int)pid);
    if ((fd = open(path, O_RDONLY)) >= 0) {
        (void)!pread(fd, &ent, sizeof(ent), (off_t)((a / 4096 + i) * sizeof(ent)));
        close(fd);
    }
    *present = (ent >> 63) & 1;
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
    if ((fd = open(path, O_RDONLY)) < 0 ||
        pread(fd, buf, sizeof(buf), (off_t)(a + (uintptr_t)i * 4096)) != (ssize_t)sizeof(buf))
        same = false;
    if (fd >= 0)
        close(fd);
    for (size_t k = 0; same && k < sizeof(buf); k++)
        same = (unsigned char)buf[k] == v;
    return same;
}

/* vmm_pf_*: only pages the process never touched are written (zeros), only in its one
 * large rwx mapping, only as far as asked; another rwx mapping of that size makes it
 * refuse; a process that is gone fails, never a crash. */
static void test_prefault(void)
{
    struct vmm_pf pf;
    uintptr_t a = 0;
    int cmd = -1, pidfd, r, steps = 0, st;
    pid_t pid = pf_child(&cmd, &a);
    bool present;

    CHECK(pid > 0);
    if (pid <= 0)
        return;
    pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    CHECK(pidfd >= 0);
    CHECK(vmm_pf_open(pid, pidfd, 0, &pf) == -ENOENT);
    r = vmm_pf_open(pid, pidfd, (4u << 20) + 100, &pf);
    CHECK(r == 0);
    CHECK(r != 0 || (pf.at == a && pf.end == a + (4u << 20)));
    if (r == 0)
        while ((r = vmm_pf_step(&pf, 16)) > 0)
            steps++;
    CHECK(r == 0);
    CHECK(steps == 63); /* 1024 pages, 16 a step, the last one says done */
    CHECK(pf.touched == (4u << 20) - 2 * 4096);
    CHECK(vmm_pf_step(&pf, 16) == 0);
    vmm_pf_close(&pf);
    CHECK(pf_page(pid, a, 0, 0xab, &present) && present);
    CHECK(pf_page(pid, a, 7, 0xab, &present) && present);
    CHECK(pf_page(pid, a, 1, 0, &present) && present);
    CHECK(pf_page(pid, a, 1023, 0, &present) && present);
    CHECK(pf_page(pid, a, 1024, 0, &present) && !present); /* past what was asked */
    /* Two such mappings: not a layout it knows. */
    CHECK(write(cmd, "x", 1) == 1);
    for (int i = 0; i < 200; i++) {
        if ((r = vmm_pf_open(pid, pidfd, 1u << 20, &pf)) != 0)
            break;
        vmm_pf_close(&pf);
        usleep(5000);
    }
    CHECK(r == -ENOENT);
    /* Open, then the process goes: the steps fail. */
    close(cmd);
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    CHECK(vmm_pf_open(pid, pidfd, 1u << 20, &pf) < 0);
    close(pidfd);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/wvmm-unit-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_qcow2();
    test_host();
    test_argv();
    test_argv_modes();
    test_argv_net();
    test_phase();
    test_snap();
    test_snap_delta();
    test_qcow2_backing();
    test_cgroup_paths();
    test_jail_uids();
    test_jail_plan();
    test_mem_seal();
    test_copy_nonzero();
    test_map_ino();
    test_ram_file();
    test_prefault();
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("vmm unit: all checks passed\n");
    return 0;
}
