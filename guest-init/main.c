/*
 * main.c - warren-init, PID 1 of every Warren guest: set the system up
 * (boot.c), then serve the host over the virtio-serial port (agent.c).
 * PID 1 must never exit (the kernel panics): every end is a power-off.
 */
#include "agent.h"
#include "boot.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define PORT_TIMEOUT_MS 10000

int main(void)
{
    struct gi_agent_opts opts = {0};
    struct gi_boot_info info;
    int fd = -1, rc;

    if (getpid() != 1) {
        fprintf(stderr, "warren-init: runs only as PID 1 of a Warren guest\n");
        return 1;
    }
    rc = gi_boot(&info);
    if (rc < 0) {
        gi_boot_log("boot failed: %s", strerror(-rc));
        gi_poweroff();
    }
    rc = gi_boot_open_port(GI_PORT_NAME, PORT_TIMEOUT_MS, &fd);
    if (rc < 0) {
        gi_boot_log("no port %s: %s", GI_PORT_NAME, strerror(-rc));
        gi_poweroff();
    }
    gi_boot_log("%s up in %lld ms%s", info.kernel, info.boot_ms,
                info.rooted ? "" : " (no root disk: running from the initramfs)");

    opts.cgroup_root = info.have_cgroup ? GI_CGROUP_ROOT : NULL;
    opts.pid1 = 1;
    opts.boot_id_file = GI_BOOT_ID_FILE;
    opts.boot_id_target = GI_BOOT_ID_PROC;
    rc = gi_agent_run(fd, &opts);
    gi_boot_log("agent stopped: %s", rc < 0 ? strerror(-rc) : "channel closed");
    gi_poweroff();
}
