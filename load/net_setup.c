/*
 * net_setup: what a VM's network namespace costs to make, with no VM
 * (load/RESULTS.md). Run as root inside a scratch namespace that has
 * an interface named up0, e.g.
 *
 *   ip netns add s && ip -n s link add up0 type veth peer name up1 &&
 *   ip -n s link set up0 up && ip netns exec s build/load/net_setup 15; ip netns del s
 *
 * For each of N rounds: the full set-up at launch (net_wrap's argv with
 * /bin/true in QEMU's place), then, in a namespace made ahead, /bin/true
 * spawned through `ip netns exec` (net_wrap_ready) and spawned by a thread
 * that setns'd into it (what vmm_launch does with vmm_config.netns), each
 * timed from spawn to exit; and the setns there and back alone (what that
 * costs the loop).
 * Loads one host table (warren_<tag> for state dir /tmp/warren-net-setup) and
 * sets ip_forward in the namespace it runs in: never run it in the host's.
 */
#include "net.h"

#include <fcntl.h>
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Spawn wrap + /bin/true, wait: the time in ms, or -1 if it failed. */
static double run(char **wrap)
{
    char *av[24];
    size_t k = 0;
    pid_t pid;
    int st = 0;
    double t0;

    for (; wrap[k] && k < 22; k++)
        av[k] = wrap[k];
    av[k++] = "/bin/true";
    av[k] = NULL;
    t0 = now_ms();
    if (posix_spawn(&pid, av[0], NULL, NULL, av, environ) != 0 || waitpid(pid, &st, 0) < 0)
        return -1;
    return st == 0 ? now_ms() - t0 : -1;
}

/* /bin/true spawned from inside the namespace at path (setns there and back):
 * the time in ms, or -1; *hop gets the setns round trip alone. */
static double run_in(const char *path, double *hop)
{
    char *av[] = {"/bin/true", NULL};
    int self = open("/proc/thread-self/ns/net", O_RDONLY), ns = open(path, O_RDONLY), st = 0;
    double t0 = now_ms(), t1;
    pid_t pid;

    if (self < 0 || ns < 0 || setns(ns, CLONE_NEWNET) != 0)
        return -1;
    t1 = now_ms();
    if (posix_spawn(&pid, av[0], NULL, NULL, av, environ) != 0)
        pid = -1;
    if (setns(self, CLONE_NEWNET) != 0)
        abort();
    *hop = (t1 - t0) + (now_ms() - t1); /* includes the spawn: subtracted below */
    {
        double t2 = now_ms();
        if (setns(ns, CLONE_NEWNET) != 0 || setns(self, CLONE_NEWNET) != 0)
            abort();
        *hop = now_ms() - t2;
    }
    close(self);
    close(ns);
    if (pid < 0 || waitpid(pid, &st, 0) < 0 || st != 0)
        return -1;
    return now_ms() - t0;
}

int main(int argc, char **argv)
{
    struct srv_config c;
    struct net_policy pol = {.internet = true};
    struct net *n;
    char why[256] = "";
    int rounds = argc > 1 ? atoi(argv[1]) : 10, ok = 0;
    double sum_full = 0, sum_enter = 0, sum_setns = 0, sum_hop = 0;

    memset(&c, 0, sizeof(c));
    c.net_enabled = 1;
    c.net_uplink = "up0";
    c.net_range = "10.203.0.0/16";
    c.net_dns_upstream = "198.51.100.53";
    c.state_dir = "/tmp/warren-net-setup";
    if (net_new(&c, &n, why, sizeof(why)) != 0) {
        fprintf(stderr, "net_setup: %s\n", why);
        return 1;
    }
    for (int i = 0; i < rounds; i++) {
        char a[32], b[32], path[256], **w;
        double full, enter, in, hop = 0;

        /* Ids differing in their first 12 hex digits: veth names must not meet
         * one still being deleted. */
        snprintf(a, sizeof(a), "vm-a%03x000000000000", i);
        snprintf(b, sizeof(b), "vm-b%03x000000000000", i);
        if (net_wrap(n, a, 2 * i, &pol, &w) != 0)
            return 1;
        full = run(w);
        net_wrap_free(w);
        net_ns_remove(n, a);
        if (net_wrap(n, b, 2 * i + 1, &pol, &w) != 0)
            return 1;
        (void)run(w); /* made ahead */
        net_wrap_free(w);
        if (net_wrap_ready(n, b, &w) != 0)
            return 1;
        enter = run(w);
        net_wrap_free(w);
        net_ns_path(n, b, path, sizeof(path));
        in = run_in(path, &hop);
        net_ns_remove(n, b);
        printf("round %d: set-up at launch %.1f ms; made ahead: ip netns exec %.1f ms, "
               "setns + spawn %.1f ms (setns there and back %.3f ms)\n",
               i, full, enter, in, hop);
        if (full >= 0 && enter >= 0 && in >= 0) {
            sum_full += full;
            sum_enter += enter;
            sum_setns += in;
            sum_hop += hop;
            ok++;
        }
    }
    if (ok)
        printf("mean of %d: set-up at launch %.1f ms; made ahead: ip netns exec %.1f ms, "
               "setns + spawn %.1f ms (setns there and back %.3f ms)\n",
               ok, sum_full / ok, sum_enter / ok, sum_setns / ok, sum_hop / ok);
    net_free(n);
    return ok == rounds ? 0 : 1;
}
