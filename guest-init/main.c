/*
 * main.c - warren-init, PID 1 of every Warren guest: set the system up
 * (boot.c), then serve the host over the virtio-serial port (agent.c).
 * PID 1 must never exit (the kernel panics): every end is a power-off.
 */
#include "agent.h"
#include "boot.h"
#include "watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PORT_TIMEOUT_MS 10000

/*
 * "--spawn-bench N PROG": the floor an exec is measured against (load/exec_rt.py).
 * Run as a user command inside the guest (through /proc/1/exe, the initramfs being
 * gone after switch_root): N times a bare fork + execv(PROG) + waitpid, each timed
 * with CLOCK_MONOTONIC; prints each time in microseconds, one a line, on stdout.
 */
static int spawn_bench(int n, const char *prog)
{
    long long *t = calloc((size_t)n, sizeof(*t));
    char *const argv[] = {(char *)prog, NULL};

    if (!t)
        return 1;
    for (int i = 0; i < n; i++) {
        struct timespec a, b;
        pid_t pid;
        int st;

        clock_gettime(CLOCK_MONOTONIC, &a);
        pid = fork();
        if (pid == 0) {
            execv(prog, argv);
            _exit(127);
        }
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "spawn-bench: %s did not run\n", prog);
            free(t);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        t[i] = (b.tv_sec - a.tv_sec) * 1000000LL + (b.tv_nsec - a.tv_nsec) / 1000;
    }
    for (int i = 0; i < n; i++)
        printf("%lld\n", t[i]);
    free(t);
    return 0;
}

int main(int argc, char **argv)
{
    struct gi_agent_opts opts = {0};
    struct gi_boot_info info;
    int fd = -1, rc;

    if (getpid() != 1 && argc == 4 && strcmp(argv[1], "--spawn-bench") == 0 && atoi(argv[2]) > 0)
        return spawn_bench(atoi(argv[2]), argv[3]);
    if (getpid() != 1 && argc >= 2 && strcmp(argv[1], "--watch") == 0)
        return gi_watch_main(argc - 1, argv + 1);
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
