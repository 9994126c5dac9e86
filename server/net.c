/*
 * net.c - sandbox networking (net.h, docs/NETWORK.md): warrend's side at
 * start, the per-VM set-up script, namespace removal and the sweep.
 *
 * Why a script run in QEMU's place rather than netlink from warrend: the
 * set-up is ~8 netlink/nft transactions whose cost (tens of ms, measured in
 * load/RESULTS.md) must not land on the loop, and spawning it as the
 * process that becomes QEMU gives it a pid, an exit status and a log (QEMU's)
 * that the VM driver already watches: a failed set-up is simply a VM that
 * exited with a reason, and nothing new has to be waited for.
 */
#include "net.h"
#include "log.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NETNS_DIR "/run/netns"

extern char **environ;

struct net {
    char tag[9];     /* hash of the state dir: names namespaces and the host table */
    char range[40];  /* net_range as given (canonical a.b.c.d/p) */
    char dns[16];    /* net_dns_upstream, "" for none */
    char uplink[16]; /* net_uplink */
    char ip[32];     /* ip's absolute path: entering a namespace made ahead spawns it directly */
    char nft[32];    /* nft's: the host table at start */
    unsigned base, prefix;
    unsigned nslots;
    uint8_t *used; /* one byte per slot */
    int hint;      /* next slot to try: slots are reused last */
};

/*
 * Run in QEMU's place: $1 namespace, $2 host veth, $3 host address, $4 the
 * namespace's address, $5 its nft ruleset; then QEMU's argv. set -e: the
 * first failure ends it with ip's or nft's message in qemu.log, and the VM
 * is reported exited. ip netns exec execs QEMU (no fork): the pid stays.
 */
static const char setup_script[] =
    "set -e\n"
    "PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
    "ns=$1 hv=$2 hip=$3 nip=$4 rules=$5\n"
    "shift 5\n"
    "ip netns add \"$ns\"\n"
    "printf 'link add %s type veth peer name eth0 netns %s\\naddr add %s/30 dev %s\\n"
    "link set %s up\\n' \"$hv\" \"$ns\" \"$hip\" \"$hv\" \"$hv\" | ip -b -\n"
    "printf 'addr add %s/30 dev eth0\\nlink set eth0 up\\nlink set lo up\\n"
    "tuntap add dev tap0 mode tap\\nlink set tap0 address " NET_GW_MAC "\\n"
    "addr add 10.0.2.1/30 dev tap0\\nlink set tap0 up\\n"
    "route add default via %s\\n' \"$nip\" \"$hip\" | ip -n \"$ns\" -b -\n"
    "printf '%s' \"$rules\" | ip netns exec \"$ns\" sh -c "
    "'nft -f - && echo 1 >/proc/sys/net/ipv4/ip_forward'\n"
    "exec ip netns exec \"$ns\" \"$@\"\n";

/* Always denied (besides net_range, added per ruleset): nothing a guest may
 * reach whatever its policy. 224/3 is multicast, reserved and broadcast. */
static const char deny_list[] = "0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, "
                                "169.254.0.0/16, 172.16.0.0/12, 192.168.0.0/16, 224.0.0.0/3";

int net_parse_range(const char *s, unsigned *base, unsigned *prefix)
{
    char buf[40], *slash, *end;
    struct in_addr a;
    long p;

    if (!s || strlen(s) >= sizeof(buf))
        return -EINVAL;
    snprintf(buf, sizeof(buf), "%s", s);
    if (!(slash = strchr(buf, '/')))
        return -EINVAL;
    *slash = '\0';
    errno = 0;
    p = strtol(slash + 1, &end, 10);
    if (errno || *end || end == slash + 1 || p < 8 || p > 28 || inet_pton(AF_INET, buf, &a) != 1)
        return -EINVAL;
    *prefix = (unsigned)p;
    *base = ntohl(a.s_addr) & (~0u << (32 - p));
    return 0;
}

int net_list_add(char *list, size_t cap, const char *cidr)
{
    char buf[32], *slash, *end;
    struct in_addr a;
    long p = 32;
    size_t used = strlen(list);
    int n;

    if (!cidr || strlen(cidr) >= sizeof(buf))
        return -EINVAL;
    snprintf(buf, sizeof(buf), "%s", cidr);
    if ((slash = strchr(buf, '/'))) {
        *slash = '\0';
        errno = 0;
        p = strtol(slash + 1, &end, 10);
        if (errno || *end || end == slash + 1 || p < 0 || p > 32)
            return -EINVAL;
    }
    if (inet_pton(AF_INET, buf, &a) != 1)
        return -EINVAL;
    a.s_addr = htonl(ntohl(a.s_addr) & (p ? ~0u << (32 - p) : 0));
    n = snprintf(list + used, cap - used, "%s%s/%ld", used ? ", " : "", inet_ntoa(a), p);
    if (n < 0 || (size_t)n >= cap - used) {
        list[used] = '\0';
        return -E2BIG;
    }
    return 0;
}

char *net_vm_rules(const char *range, const char *dns, const struct net_policy *pol)
{
    bool internet = pol->internet;
    char *s = NULL;
    char dns_rules[512] = "", fwd_dns[256] = "", sets[2 * NET_LIST_CAP + 256] = "", out[256] = "";

    if (internet && dns && *dns) {
        /* The guest asks its gateway; the namespace forwards to the resolver.
         * Accepted before the deny set: the resolver may be private. */
        snprintf(dns_rules, sizeof(dns_rules),
                 "    iifname \"tap0\" ip daddr 10.0.2.1 udp dport 53 dnat ip to %s\n"
                 "    iifname \"tap0\" ip daddr 10.0.2.1 tcp dport 53 dnat ip to %s\n",
                 dns, dns);
        snprintf(fwd_dns, sizeof(fwd_dns),
                 "    iifname \"tap0\" oifname \"eth0\" ct status dnat ip daddr %s "
                 "meta l4proto { tcp, udp } th dport 53 accept\n",
                 dns);
    }
    /* The operator's lists: deny_out drops first; allow_out narrows what is
     * accepted. Neither can open anything in the always-deny set. */
    for (int i = 0; internet && i < 2; i++) {
        const char *name = i ? "allow_out" : "deny_out",
                   *elems = i ? pol->allow_out : pol->deny_out;
        if (elems[0])
            snprintf(sets + strlen(sets), sizeof(sets) - strlen(sets),
                     "  set %s {\n"
                     "    type ipv4_addr; flags interval; auto-merge\n"
                     "    elements = { %s }\n"
                     "  }\n",
                     name, elems);
    }
    if (internet)
        snprintf(out, sizeof(out),
                 "%s    iifname \"tap0\" oifname \"eth0\" meta nfproto ipv4 ip daddr != @deny "
                 "%saccept\n",
                 pol->deny_out[0] ? "    iifname \"tap0\" ip daddr @deny_out drop\n" : "",
                 pol->allow_out[0] ? "ip daddr @allow_out " : "");
    if (asprintf(&s,
                 "table inet warren\n"
                 "delete table inet warren\n"
                 "table inet warren {\n"
                 "  set deny {\n"
                 "    type ipv4_addr; flags interval; auto-merge\n"
                 "    elements = { %s, %s }\n"
                 "  }\n"
                 "%s"
                 "  chain nat_pre {\n"
                 "    type nat hook prerouting priority dstnat; policy accept;\n"
                 "%s"
                 "  }\n"
                 "  chain nat_post {\n"
                 "    type nat hook postrouting priority srcnat; policy accept;\n"
                 "    oifname \"eth0\" masquerade\n"
                 "  }\n"
                 "  chain guard_fwd {\n"
                 "    type filter hook forward priority filter; policy drop;\n"
                 "    iifname \"eth0\" oifname \"tap0\" ct state established,related accept\n"
                 "%s"
                 "%s"
                 "  }\n"
                 "  chain guard_in {\n"
                 "    type filter hook input priority filter; policy drop;\n"
                 "    iifname \"lo\" accept\n"
                 /* answers to warrend's port proxy connections (server/ports.c) */
                 "    iifname \"tap0\" ct state established,related accept\n"
                 "  }\n"
                 "}\n",
                 deny_list, range, sets, dns_rules, fwd_dns, out) < 0)
        return NULL;
    return s;
}

/* Spawn argv with text on its stdin and wait: start-up only. 0 or -errno
 * (-ECHILD... when it failed: its exit status is in why). */
static int run(char *const argv[], const char *text, char *why, size_t cap)
{
    posix_spawn_file_actions_t fa;
    int p[2], st = 0, r;
    pid_t pid;

    if (pipe2(p, O_CLOEXEC) != 0)
        return -errno;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[0], 0);
    r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[0]);
    if (r != 0) {
        close(p[1]);
        snprintf(why, cap, "cannot run %s: %s", argv[0], strerror(r));
        return -r;
    }
    if (text && write(p[1], text, strlen(text)) != (ssize_t)strlen(text))
        r = -EIO;
    close(p[1]);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (r == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        snprintf(why, cap, "%s failed (status %d): see its message above", argv[0], st);
        r = -EIO;
    }
    return r;
}

static int find_tool(const char *name, char *out, size_t cap)
{
    static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};

    for (size_t i = 0; i < sizeof(dirs) / sizeof(*dirs); i++) {
        snprintf(out, cap, "%s/%s", dirs[i], name);
        if (access(out, X_OK) == 0)
            return 0;
    }
    out[0] = '\0';
    return -ENOENT;
}

static bool ifname_ok(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > 15)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
              (s[i] >= '0' && s[i] <= '9') || s[i] == '-' || s[i] == '_' || s[i] == '.'))
            return false;
    return true;
}

int net_new(const struct srv_config *c, struct net **out, char *why, size_t cap)
{
    struct net *n;
    struct in_addr a;
    char *rules = NULL;
    uint32_t h = 2166136261u;
    int r;

    *out = NULL;
    if (!c->net_enabled)
        return 0;
    if (geteuid() != 0) {
        snprintf(why, cap, "net_enabled needs root (namespaces, veth, nftables)");
        return -EPERM;
    }
    if (!c->net_uplink || !ifname_ok(c->net_uplink)) {
        snprintf(why, cap, "net_uplink must name the interface guest traffic leaves through");
        return -EINVAL;
    }
    if (c->net_dns_upstream && *c->net_dns_upstream &&
        inet_pton(AF_INET, c->net_dns_upstream, &a) != 1) {
        snprintf(why, cap, "net_dns_upstream must be an IPv4 address");
        return -EINVAL;
    }
    if (!(n = calloc(1, sizeof(*n))))
        return -ENOMEM;
    /* By path: warrend's PATH may lack the sbin directories (the set-up script
     * sets its own). */
    if (find_tool("ip", n->ip, sizeof(n->ip)) != 0 ||
        find_tool("nft", n->nft, sizeof(n->nft)) != 0) {
        snprintf(why, cap, "net_enabled needs ip (iproute2) and nft (nftables)");
        free(n);
        return -ENOENT;
    }
    if (net_parse_range(c->net_range, &n->base, &n->prefix) != 0) {
        snprintf(why, cap, "net_range must be a.b.c.d/p with 8 <= p <= 28");
        free(n);
        return -EINVAL;
    }
    a.s_addr = htonl(n->base);
    snprintf(n->range, sizeof(n->range), "%s/%u", inet_ntoa(a), n->prefix);
    snprintf(n->dns, sizeof(n->dns), "%s", c->net_dns_upstream ? c->net_dns_upstream : "");
    snprintf(n->uplink, sizeof(n->uplink), "%s", c->net_uplink);
    for (const char *p = c->state_dir; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    snprintf(n->tag, sizeof(n->tag), "%08x", h);
    n->nslots = 1u << (32 - n->prefix - 2);
    if (!(n->used = calloc(n->nslots, 1))) {
        free(n);
        return -ENOMEM;
    }
    /* warrend's side: NAT out of the uplink only; a sandbox's veth reaches
     * neither the host itself nor any other interface (another sandbox). */
    if (asprintf(&rules,
                 "table inet warren_%s\n"
                 "delete table inet warren_%s\n"
                 "table inet warren_%s {\n"
                 "  chain guard_fwd {\n"
                 "    type filter hook forward priority filter - 10; policy accept;\n"
                 "    iifname \"wn-*\" oifname != \"%s\" drop\n"
                 "    oifname \"wn-*\" iifname != \"%s\" drop\n"
                 "  }\n"
                 "  chain guard_in {\n"
                 "    type filter hook input priority filter - 10; policy accept;\n"
                 "    iifname \"wn-*\" drop\n"
                 "  }\n"
                 "  chain nat_post {\n"
                 "    type nat hook postrouting priority srcnat; policy accept;\n"
                 "    oifname \"%s\" ip saddr %s masquerade\n"
                 "  }\n"
                 "}\n",
                 n->tag, n->tag, n->tag, n->uplink, n->uplink, n->uplink, n->range) < 0) {
        net_free(n);
        return -ENOMEM;
    }
    {
        char *argv[] = {n->nft, "-f", "-", NULL};
        r = run(argv, rules, why, cap);
    }
    free(rules);
    if (r == 0) {
        int fd = open("/proc/sys/net/ipv4/ip_forward", O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "1", 1) != 1) {
            r = -errno;
            snprintf(why, cap, "cannot enable ip_forward: %s", strerror(errno));
        }
        if (fd >= 0)
            close(fd);
    }
    if (r != 0) {
        net_free(n);
        return r;
    }
    mkdir(NETNS_DIR, 0755);
    LOG(LOG_INFO, "net: on; namespaces warren-%s-<vm>, range %s, uplink %s, resolver %s", n->tag,
        n->range, n->uplink, n->dns[0] ? n->dns : "none");
    *out = n;
    return 0;
}

void net_free(struct net *n)
{
    if (!n)
        return;
    free(n->used);
    free(n);
}

int net_slot_get(struct net *n)
{
    for (unsigned i = 0; i < n->nslots; i++) {
        unsigned s = (n->hint + i) % n->nslots;
        if (!n->used[s]) {
            n->used[s] = 1;
            n->hint = (int)((s + 1) % n->nslots);
            return (int)s;
        }
    }
    return -ENOSPC;
}

int net_slot_hold(struct net *n, int slot)
{
    if (slot < 0 || (unsigned)slot >= n->nslots)
        return -ERANGE;
    if (n->used[slot])
        return -EEXIST;
    n->used[slot] = 1;
    return 0;
}

void net_slot_put(struct net *n, int slot)
{
    if (n && slot >= 0 && (unsigned)slot < n->nslots)
        n->used[slot] = 0;
}

static void ns_name(const struct net *n, const char *vm_id, char *buf, size_t cap)
{
    snprintf(buf, cap, "warren-%s-%s", n->tag, vm_id);
}

int net_wrap(const struct net *n, const char *vm_id, int slot, const struct net_policy *pol,
             char ***out)
{
    char ns[128], hv[16], hip[16], nip[16];
    const char *dash = strchr(vm_id, '-');
    struct in_addr a;
    char **v;

    if (slot < 0 || (unsigned)slot >= n->nslots)
        return -ERANGE;
    ns_name(n, vm_id, ns, sizeof(ns));
    /* IFNAMSIZ: "wn-" and 12 characters of the id's random part. */
    snprintf(hv, sizeof(hv), "wn-%.12s", dash ? dash + 1 : vm_id);
    a.s_addr = htonl(n->base + 4u * (unsigned)slot + 1);
    snprintf(hip, sizeof(hip), "%s", inet_ntoa(a));
    a.s_addr = htonl(n->base + 4u * (unsigned)slot + 2);
    snprintf(nip, sizeof(nip), "%s", inet_ntoa(a));
    if (!(v = calloc(10, sizeof(*v))))
        return -ENOMEM;
    v[0] = strdup("/bin/sh");
    v[1] = strdup("-c");
    v[2] = strdup(setup_script);
    v[3] = strdup("warren-net");
    v[4] = strdup(ns);
    v[5] = strdup(hv);
    v[6] = strdup(hip);
    v[7] = strdup(nip);
    v[8] = net_vm_rules(n->range, n->dns, pol);
    for (int i = 0; i < 9; i++) {
        if (!v[i]) {
            net_wrap_free(v);
            return -ENOMEM;
        }
    }
    *out = v;
    return 0;
}

void net_wrap_free(char **argv)
{
    if (!argv)
        return;
    for (int i = 0; argv[i] || i < 9; i++)
        free(argv[i]);
    free(argv);
}

int net_wrap_ready(const struct net *n, const char *vm_id, char ***out)
{
    char ns[128];
    char **v = calloc(10, sizeof(*v));

    if (!v)
        return -ENOMEM;
    ns_name(n, vm_id, ns, sizeof(ns));
    /* ip by its path, no shell: one exec fewer before QEMU (ip execs QEMU itself). */
    v[0] = strdup(n->ip);
    v[1] = strdup("netns");
    v[2] = strdup("exec");
    v[3] = strdup(ns);
    for (int i = 0; i < 4; i++) {
        if (!v[i]) {
            net_wrap_free(v);
            return -ENOMEM;
        }
    }
    *out = v;
    return 0;
}

int net_prepare_argv(const struct net *n, const char *vm_id, int slot, const struct net_policy *pol,
                     const char *marker, char ***out)
{
    char **v, **w;
    int r = net_wrap(n, vm_id, slot, pol, &v);

    if (r != 0)
        return r;
    if (!(w = realloc(v, 14 * sizeof(*v)))) {
        net_wrap_free(v);
        return -ENOMEM;
    }
    v = w;
    v[9] = strdup("/bin/sh");
    v[10] = strdup("-c");
    v[11] = strdup(": >\"$0\"");
    v[12] = strdup(marker);
    v[13] = NULL;
    for (int i = 9; i < 13; i++) {
        if (!v[i]) {
            for (int j = i + 1; j < 13; j++)
                free(v[j]);
            v[i] = NULL;
            net_wrap_free(v);
            return -ENOMEM;
        }
    }
    *out = v;
    return 0;
}

const char *net_append(const char *base)
{
    static char buf[4096];

    snprintf(buf, sizeof(buf), "%s%s%s", base ? base : "", base && *base ? " " : "",
             NET_GUEST_APPEND);
    return buf;
}

static void ns_remove_name(const char *name)
{
    char path[256];

    snprintf(path, sizeof(path), NETNS_DIR "/%s", name);
    /* MNT_DETACH: a namespace still entered by a dying process goes when it does. */
    if (umount2(path, MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT)
        LOG(LOG_WARN, "net: cannot unmount %s: %s", path, strerror(errno));
    if (unlink(path) != 0 && errno != ENOENT)
        LOG(LOG_WARN, "net: cannot remove %s: %s", path, strerror(errno));
}

void net_ns_path(const struct net *n, const char *vm_id, char *buf, size_t cap)
{
    char name[128];

    ns_name(n, vm_id, name, sizeof(name));
    snprintf(buf, cap, NETNS_DIR "/%s", name);
}

void net_ns_remove(const struct net *n, const char *vm_id)
{
    char name[128];

    if (!n)
        return;
    ns_name(n, vm_id, name, sizeof(name));
    ns_remove_name(name);
}

int net_sweep(const struct net *n, bool (*known)(void *ud, const char *vm_id), void *ud)
{
    char prefix[32];
    size_t plen;
    DIR *d;
    struct dirent *e;
    int count = 0;

    if (!n || !(d = opendir(NETNS_DIR)))
        return 0;
    plen = (size_t)snprintf(prefix, sizeof(prefix), "warren-%s-", n->tag);
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, plen) != 0 || known(ud, e->d_name + plen))
            continue;
        LOGS(LOG_WARN, e->d_name + plen, "net: no live VM: removing namespace %s", e->d_name);
        ns_remove_name(e->d_name);
        count++;
    }
    closedir(d);
    return count;
}
