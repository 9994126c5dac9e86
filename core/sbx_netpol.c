/*
 * sbx_netpol.c - PATCH /v1/sandboxes/{id}/network: a running VM's egress
 * policy replaced (docs/NETWORK.md).
 *
 * The change is one process spawned into the VM's namespace (net.h
 * net_apply_argv: one nft transaction, tc, the resolver restarted), watched
 * through a pidfd the way net_ahead.c watches its set-ups: the loop never
 * waits. Success is a marker file the process creates last (libev may reap
 * the status first); a failure puts the old policy back and leaves its
 * reason in state_dir/net-dns/<vm>.err, which the answer carries. The new
 * policy is recorded (the VM's index record) only once applied. One change
 * at a time per VM.
 */
#include "sbx_int.h"
#include "log.h"
#include "net.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

struct net_apply {
    struct net_apply *next;
    struct sbx_table *t;
    char vm_id[24];
    sbx_op_t op;
    struct net_policy pol; /* the new policy */
    pid_t pid;
    int pidfd;
    ev_io w;
    char marker[4096 + 64], errpath[4096 + 64];
};

static void apply_free(struct net_apply *a)
{
    for (struct net_apply **p = &a->t->applies; *p; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            break;
        }
    }
    if (a->pidfd >= 0) {
        ev_io_stop(a->t->loop, &a->w);
        close(a->pidfd);
    }
    unlink(a->marker);
    unlink(a->errpath);
    free(a);
}

/* The process's stderr (its last line is the reason), trimmed, into buf. */
static void read_reason(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, cap - 1) : -1;

    if (fd >= 0)
        close(fd);
    buf[n > 0 ? n : 0] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    for (char *c = buf; *c; c++)
        *c = *c == '\n' ? ';' : *c;
    if (!buf[0])
        snprintf(buf, cap, "the set-up process failed");
}

static void on_applied(struct ev_loop *loop, ev_io *w, int revents)
{
    struct net_apply *a = w->data;
    struct sbx_table *t = a->t;
    struct sbx_vm *vm = sbx_vm_find(t, a->vm_id);
    struct op *op = ops_by_id(t, a->op);
    bool ok;
    char why[512];

    (void)loop;
    (void)revents;
    ev_io_stop(t->loop, &a->w);
    close(a->pidfd);
    a->pidfd = -1;
    (void)waitpid(a->pid, NULL, WNOHANG); /* ours unless libev reaped it already */
    ok = access(a->marker, F_OK) == 0;
    if (!vm || !vm->vmm || vm->gone) {
        /* The VM went meanwhile: a resolver the change started must not outlive it. */
        net_dns_stop(t->net, a->vm_id);
        if (op)
            ops_fail(op, SBX_E_GONE, "the sandbox's VM stopped during the change");
    } else if (ok) {
        vm->pol = a->pol;
        if (sbx_vm_save(vm) != 0 && op)
            ops_fail(op, SBX_E_INDEX_WRITE_FAILED,
                     "the policy is applied but could not be recorded in the index");
        else if (op)
            ops_finish_sandbox(op, op->sb);
        LOGS(LOG_INFO, vm->sb_id, "network policy replaced (VM %s)", vm->id);
    } else {
        read_reason(a->errpath, why, sizeof(why));
        LOGS(LOG_WARN, vm->sb_id, "network policy change failed: %s", why);
        if (op)
            ops_fail(op, SBX_E_INTERNAL,
                     "the new network policy could not be applied (the old one is in force): %s",
                     why);
    }
    apply_free(a);
}

int sbx_set_network(struct sbx_table *t, const char *id, const struct sbx_net_req *req,
                    const struct sbx_sink *sink, void *user, sbx_op_t *opid, struct sbx_err *err)
{
    struct sandbox *sb = sbx_find(t, id);
    struct sbx_vm *vm;
    struct net_apply *a;
    posix_spawn_file_actions_t fa;
    char **argv = NULL;
    struct op *op;
    int status, r;

    if (!sb)
        return sbx_err_set(err, SBX_E_NOT_FOUND, "no sandbox with id '%s'", id);
    if (sbx_state_final(sb->state))
        return sbx_err_set(err, sb->state == ST_DEAD ? SBX_E_DEAD : SBX_E_GONE,
                           "sandbox %s is %s: %s", sb->id, sbx_state_name(sb->state), sb->reason);
    if (!t->net)
        return sbx_err_set(err, SBX_E_INVALID_ARGUMENT,
                           "networking is off on this server (net_enabled = false)");
    if (!(a = calloc(1, sizeof(*a))))
        return sbx_err_set(err, SBX_E_INTERNAL, "out of memory");
    a->pidfd = -1;
    a->t = t;
    if ((status = sbx_net_from_req(t, req, &a->pol, err)) ||
        (status = sbx_net_check_host(t, &a->pol, err))) {
        free(a);
        return status;
    }
    vm = sb->vmr;
    if ((sb->state != ST_RUNNING && sb->state != ST_FROZEN) || !vm || !vm->vmm || vm->gone) {
        free(a);
        return sbx_err_set(err, SBX_E_NOT_READY,
                           "sandbox %s is %s: change its network when it runs", sb->id,
                           sbx_state_name(sb->state));
    }
    for (struct net_apply *o = t->applies; o; o = o->next) {
        if (strcmp(o->vm_id, vm->id) == 0) {
            free(a);
            return sbx_err_set(err, SBX_E_CONFLICT,
                               "a change of sandbox %s's network is in progress", sb->id);
        }
    }
    snprintf(a->vm_id, sizeof(a->vm_id), "%s", vm->id);
    snprintf(a->marker, sizeof(a->marker), "%s/net-dns/%s.applied", t->cfg->state_dir, vm->id);
    snprintf(a->errpath, sizeof(a->errpath), "%s/net-dns/%s.err", t->cfg->state_dir, vm->id);
    unlink(a->marker);
    if ((r = net_apply_argv(t->net, vm->id, &a->pol, &vm->pol, a->marker, &argv)) != 0) {
        free(a);
        return sbx_err_set(err, SBX_E_INTERNAL, "cannot apply the policy: %s", strerror(-r));
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, a->errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    r = posix_spawn(&a->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    net_wrap_free(argv);
    if (r == 0 && (a->pidfd = (int)syscall(SYS_pidfd_open, a->pid, 0)) < 0) {
        r = errno;
        kill(a->pid, SIGKILL);
    }
    if (r != 0 || !(op = ops_new(sb, OP_NETPOL, sink, user))) {
        if (a->pidfd >= 0) {
            kill(a->pid, SIGKILL);
            close(a->pidfd);
            a->pidfd = -1;
        }
        unlink(a->errpath);
        free(a);
        return sbx_err_set(err, SBX_E_INTERNAL, "cannot apply the policy: %s",
                           strerror(r ? r : ENOMEM));
    }
    a->op = op->id;
    ev_io_init(&a->w, on_applied, a->pidfd, EV_READ);
    a->w.data = a;
    ev_io_start(t->loop, &a->w);
    a->next = t->applies;
    t->applies = a;
    *opid = op->id;
    return 0;
}

void sbx_net_apply_free(struct sbx_table *t)
{
    while (t->applies) {
        struct net_apply *a = t->applies;
        if (a->pidfd >= 0)
            kill(a->pid, SIGKILL);
        apply_free(a);
    }
}
