/*
 * boot.h - PID 1's start of day in every Warren guest: mounts, modules,
 * switch to the root disk, cgroups, loopback, and the host channel.
 *
 * Ownership: gi_boot fills a caller-owned struct with plain strings (no
 * allocations); gi_boot_open_port hands the caller an fd it must keep open.
 */
#ifndef WARREN_GI_BOOT_H
#define WARREN_GI_BOOT_H

#include <stdnoreturn.h>

#define GI_PORT_NAME   "warren.0"
#define GI_CGROUP_ROOT "/sys/fs/cgroup/warren"

struct gi_boot_info {
    char kernel[65];   /* uname -r */
    int rooted;        /* 1 when running on the root disk, 0 from the initramfs */
    int have_cgroup;   /* GI_CGROUP_ROOT exists with memory/pids limits */
    long long boot_ms; /* CLOCK_BOOTTIME when gi_boot finished */
};

/*
 * Run PID 1's set-up. Only a failure that leaves no usable system returns
 * an error (-errno); everything else is logged on the console and skipped,
 * so the agent still comes up and the host can see what is wrong.
 */
int gi_boot(struct gi_boot_info *info);

/* Open the virtio-serial port called name (O_RDWR|O_NONBLOCK|O_CLOEXEC),
 * waiting up to timeout_ms for the device to appear. 0 or -errno. */
int gi_boot_open_port(const char *name, int timeout_ms, int *fd_out);

/* One line on the console (stderr), prefixed "warren-init: ". */
void gi_boot_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Sync the disks and power the VM off; never returns. */
noreturn void gi_poweroff(void);

#endif
