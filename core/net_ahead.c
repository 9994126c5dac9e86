/*
 * net_ahead.c - network namespaces made ahead of time (net_ahead in conf/).
 *
 * A cold create would otherwise wait ~90 ms (measured, load/RESULTS.md) for
 * its namespace before QEMU starts. Here up to net_ahead namespaces for the
 * default policy are set up in the background, each for a VM id generated
 * now: a create that takes one gives its VM that id (the namespace is named
 * after it, so the sweep and removal need nothing new) and QEMU is spawned
 * straight into it (vmm_config.netns). A namespace is made by the same set-up script as at
 * launch, spawned with a marker file as its last step; its process exiting
 * wakes us through a pidfd (the loop never waits), and the marker says
 * whether it succeeded (libev may reap the status first). A failure is
 * logged and not retried until the next create, so a broken set-up cannot
 * spin. Namespaces not taken are removed at shutdown; after a kill -9 the
 * start's sweep removes them (no VM record names them).
 */
#include "sbx_int.h"
#include "log.h"
#include "net.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

struct net_ahead {
    struct net_ahead *next;
    struct sbx_table *t;
    char id[24];
    int slot;
    pid_t pid;  /* the set-up, while it runs */
    int pidfd;  /* -1 once it ended */
    bool ready; /* set up: may be taken */
    ev_io w;
    char marker[4096 + 64];
};

static void ahead_path(struct sbx_table *t, char *buf, size_t cap, const char *id)
{
    snprintf(buf, cap, "%s/net-ahead%s%s", t->cfg->state_dir, id ? "/" : "", id ? id : "");
}

static void ahead_unlink(struct net_ahead *a)
{
    for (struct net_ahead **p = &a->t->ahead; *p; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            return;
        }
    }
}

/* Forget a (its namespace removed, its slot back). */
static void ahead_drop(struct net_ahead *a)
{
    struct sbx_table *t = a->t;

    if (a->pidfd >= 0) {
        ev_io_stop(t->loop, &a->w);
        close(a->pidfd);
        kill(a->pid, SIGKILL);
    }
    ahead_unlink(a);
    unlink(a->marker);
    net_ns_remove(t->net, a->id);
    net_slot_put(t->net, a->slot);
    free(a);
}

static void on_done(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_ahead *a = w->data;

    (void)loop;
    (void)revents;
    ev_io_stop(a->t->loop, &a->w);
    close(a->pidfd);
    a->pidfd = -1;
    (void)waitpid(a->pid, NULL, WNOHANG); /* ours unless libev reaped it already */
    if (access(a->marker, F_OK) != 0) {
        LOGS(LOG_WARN, a->id, "net: a namespace made ahead failed (see the messages above)");
        a->t->ahead_failed = true;
        ahead_drop(a);
        return;
    }
    unlink(a->marker);
    a->ready = true;
}

static int ahead_start(struct sbx_table *t)
{
    struct net_ahead *a = calloc(1, sizeof(*a));
    struct net_policy pol;
    posix_spawn_file_actions_t fa;
    uint8_t rnd[8];
    char **argv = NULL;
    int r;

    if (!a)
        return -ENOMEM;
    sbx_net_default(t->cfg, &pol);
    a->t = t;
    a->pidfd = -1;
    sbx_random(t, rnd, sizeof(rnd));
    snprintf(a->id, sizeof(a->id), "vm-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
             rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    ahead_path(t, a->marker, sizeof(a->marker), a->id);
    if ((a->slot = net_slot_get(t->net)) < 0) {
        r = a->slot;
        free(a);
        return r;
    }
    if ((r = net_prepare_argv(t->net, a->id, a->slot, &pol, a->marker, &argv)) != 0) {
        net_slot_put(t->net, a->slot);
        free(a);
        return r;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    r = -posix_spawn(&a->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    net_wrap_free(argv);
    if (r == 0 && (a->pidfd = (int)syscall(SYS_pidfd_open, a->pid, 0)) < 0) {
        r = -errno;
        kill(a->pid, SIGKILL);
    }
    if (r != 0) {
        net_slot_put(t->net, a->slot);
        free(a);
        return r;
    }
    ev_io_init(&a->w, on_done, a->pidfd, EV_READ);
    a->w.data = a;
    ev_io_start(t->loop, &a->w);
    a->next = t->ahead;
    t->ahead = a;
    return 0;
}

void sbx_net_ahead_fill(struct sbx_table *t)
{
    unsigned n = 0;
    char dir[4096 + 16];

    if (!t->net || t->ahead_failed)
        return;
    ahead_path(t, dir, sizeof(dir), NULL);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return;
    for (struct net_ahead *a = t->ahead; a; a = a->next)
        n++;
    for (; n < t->cfg->net_ahead; n++) {
        int r = ahead_start(t);
        if (r != 0) {
            LOG(LOG_WARN, "net: cannot make a namespace ahead: %s", strerror(-r));
            return;
        }
    }
}

bool sbx_net_ahead_take(struct sbx_table *t, char *id, size_t cap, int *slot)
{
    struct net_ahead *a;

    /* A create is the moment to try again after a failure. */
    t->ahead_failed = false;
    for (a = t->ahead; a && !a->ready; a = a->next)
        ;
    if (!a)
        return false;
    snprintf(id, cap, "%s", a->id);
    *slot = a->slot;
    ahead_unlink(a);
    free(a);
    return true;
}

static bool hidden(const char *name)
{
    return name[0] == '.';
}

void sbx_net_ahead_sweep(struct sbx_table *t)
{
    char dir[4096 + 16];

    ahead_path(t, dir, sizeof(dir), NULL);
    util_rm_dir(dir, hidden); /* the directory itself stays: sbx_net_ahead_free removes it */
}

void sbx_net_ahead_free(struct sbx_table *t)
{
    char dir[4096 + 16];

    while (t->ahead)
        ahead_drop(t->ahead);
    ahead_path(t, dir, sizeof(dir), NULL);
    rmdir(dir);
}
