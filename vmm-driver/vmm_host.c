/*
 * vmm_host.c - host probes: which accelerator works, the TSC rate, free swap.
 *
 * KVM needs all of: a vmx/svm CPU flag (a /dev/kvm without it is a
 * paravirtual KVM such as PVM, on which Debian's kernel does not boot), a
 * /dev/kvm that opens, API version 12 and a VM that can be created.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/kvm.h>

#include "vmm_int.h"

/* True if the first "flags" line of /proc/cpuinfo has the word vmx or svm. */
static bool cpu_has_hw_virt(void)
{
    FILE *f = fopen("/proc/cpuinfo", "re");
    char *line = NULL;
    size_t cap = 0;
    bool found = false;

    if (!f)
        return false;
    while (getline(&line, &cap, f) > 0) {
        if (strncmp(line, "flags", 5) != 0)
            continue;
        for (char *save = NULL, *w = strtok_r(strchr(line, ':'), ": \t\n", &save); w;
             w = strtok_r(NULL, " \t\n", &save))
            if (strcmp(w, "vmx") == 0 || strcmp(w, "svm") == 0)
                found = true;
        break;
    }
    free(line);
    fclose(f);
    return found;
}

enum vmm_accel vmm_detect_accel(char *why, size_t why_cap)
{
    enum vmm_accel acc = VMM_ACCEL_TCG;
    int kvm = -1, vm = -1, ver;
    char dummy[8];

    if (!why) {
        why = dummy;
        why_cap = sizeof(dummy);
    }
    if (!cpu_has_hw_virt()) {
        snprintf(why, why_cap,
                 "the CPU has no vmx/svm flag (no hardware virtualization%s): using TCG",
                 access("/dev/kvm", F_OK) == 0 ? "; /dev/kvm is paravirtual" : "");
        goto out;
    }
    kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0) {
        snprintf(why, why_cap, "/dev/kvm: %s: using TCG", strerror(errno));
        goto out;
    }
    ver = ioctl(kvm, KVM_GET_API_VERSION, 0);
    if (ver != KVM_API_VERSION) {
        snprintf(why, why_cap, "/dev/kvm answers API version %d, not %d: using TCG", ver,
                 KVM_API_VERSION);
        goto out;
    }
    vm = ioctl(kvm, KVM_CREATE_VM, 0);
    if (vm < 0) {
        snprintf(why, why_cap, "KVM_CREATE_VM failed: %s: using TCG", strerror(errno));
        goto out;
    }
    snprintf(why, why_cap, "hardware virtualization and a working /dev/kvm: using KVM");
    acc = VMM_ACCEL_KVM;
out:
    if (vm >= 0)
        close(vm);
    if (kvm >= 0)
        close(kvm);
    return acc;
}

unsigned long vmm_tsc_khz(void)
{
    FILE *f = fopen("/proc/cpuinfo", "re");
    char *line = NULL;
    size_t cap = 0;
    unsigned long khz = 0;

    if (!f)
        return 0;
    while (getline(&line, &cap, f) > 0) {
        char *colon;
        double mhz;
        if (strncmp(line, "cpu MHz", 7) != 0 || !(colon = strchr(line, ':')))
            continue;
        mhz = strtod(colon + 1, NULL);
        if (mhz > 0 && mhz < 1e6)
            khz = (unsigned long)(mhz * 1000.0 + 0.5);
        break;
    }
    free(line);
    fclose(f);
    return khz;
}

ssize_t vmm_read_small(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n;

    if (fd < 0)
        return -errno;
    n = read(fd, buf, cap - 1);
    n = n < 0 ? -errno : n;
    close(fd);
    if (n == 0)
        return -ENODATA;
    if (n > 0)
        buf[n] = 0;
    return n;
}

/* SwapFree of /proc/meminfo. */
int64_t vmm_host_swap_free_kb(void)
{
    char line[128];
    int64_t kb = -1;
    FILE *f = fopen("/proc/meminfo", "re");

    if (!f)
        return -errno;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, "SwapFree:", 9)) {
            kb = strtoll(line + 9, NULL, 10);
            break;
        }
    fclose(f);
    return kb < 0 ? -ENOENT : kb;
}
