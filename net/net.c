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
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NETNS_DIR "/run/netns"
/* The user namespace that owns each VM's network namespace is kept here, by the
 * namespace's name, for its resolver to enter. */
#define NET_RUN_DIR  "/run/warren"
#define NET_USNS_DIR NET_RUN_DIR "/userns"
/* Root of a VM's user namespace is this uid (nobody) outside it: the resolver runs
 * as that root, with capabilities over its VM's network namespace only. */
#define NET_DNS_UID     65534
#define NET_DNS_UID_STR "65534"

extern char **environ;

struct net {
    char tag[9];       /* hash of the state dir: names namespaces and the host table */
    char range[40];    /* net_range as given (canonical a.b.c.d/p) */
    char dns[16];      /* net_dns_upstream, "" for none */
    char uplink[16];   /* net_uplink */
    char ip[32];       /* ip's absolute path: entering a namespace made ahead spawns it directly */
    char nft[32];      /* nft's: the host table at start */
    char dnsmasq[32];  /* dnsmasq's ("": not installed, domain rules refused) */
    char dnsdir[4096]; /* state_dir/net-dns: each resolver's config */
    char piddir[64];   /* NET_RUN_DIR/dns-<tag>: resolvers' pidfiles, NET_DNS_UID's */
    unsigned base, prefix;
    unsigned nslots;
    uint8_t *used; /* one byte per slot */
    int hint;      /* next slot to try: slots are reused last */
};

/*
 * Run inside a VM's namespace, as root, by the set-up (before QEMU) and by a
 * policy change: ap RULES RATE DNSCONF CONFPATH PIDPATH USERNS loads the nft
 * ruleset (one transaction), the tc limits on tap0 (towards the guest) and
 * eth0 (from it), and stops the VM's old resolver and starts the new one
 * (dnsmasq daemonizes once it listens: its exit status is the start's). The
 * resolver runs as root of the user namespace that owns the VM's network
 * namespace (nsenter --user), i.e. as NET_DNS_UID outside it, with
 * capabilities over that namespace alone: its nft sets, its port 53. It
 * reads its configuration from stdin (state_dir is closed to it) and is
 * found again by its pidfile's path, which its command line names.
 * Explicit returns rather than set -e: a function run on the left of || does
 * not stop at a failure under set -e.
 */
#define APPLY_FN                                                                                   \
    "PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"                                                         \
    "ap() {\n"                                                                                     \
    "  printf '%s' \"$1\" | nft -f - || return 1\n"                                                \
    "  echo 1 >/proc/sys/net/ipv4/ip_forward || return 1\n"                                        \
    "  for d in tap0 eth0; do\n"                                                                   \
    "    if [ \"$2\" -gt 0 ]; then\n"                                                              \
    "      b=$(($2 * 1250)); [ $b -ge 16000 ] || b=16000\n"                                        \
    "      tc qdisc replace dev $d root tbf rate \"$2\"mbit burst $b latency 50ms || return 1\n"   \
    "    else tc qdisc del dev $d root 2>/dev/null || :; fi\n"                                     \
    "  done\n"                                                                                     \
    "  p=; [ -s \"$5\" ] && read p <\"$5\"\n"                                                      \
    "  if [ -n \"$p\" ] && grep -qF -- \"$5\" /proc/$p/cmdline 2>/dev/null; then\n"                \
    "    kill $p; i=0\n"                                                                           \
    "    while grep -qF -- \"$5\" /proc/$p/cmdline 2>/dev/null && [ $i -lt 100 ]; do\n"            \
    "      sleep 0.02; i=$((i + 1)); done\n"                                                       \
    "  fi\n"                                                                                       \
    "  rm -f \"$5\" \"$4\"\n"                                                                      \
    "  [ -z \"$3\" ] && return 0\n"                                                                \
    "  printf '%s' \"$3\" >\"$4\" && chmod 644 \"$4\" &&\n"                                        \
    "    nsenter --user=\"$6\" -- dnsmasq --conf-file=/dev/stdin --pid-file=\"$5\" <\"$4\"\n"      \
    "}\n"

/*
 * Run in QEMU's place: $1 namespace, $2 host veth, $3 host address, $4 the
 * namespace's address, $5 its nft ruleset, $6 the apply function's script
 * (APPLY_FN), $7 rate, $8 resolver config, $9 its path, $10 its pidfile,
 * $11 where its user namespace is kept; then QEMU's argv. set -e: the first
 * failure ends it with ip's, nft's or dnsmasq's message in qemu.log, and the
 * VM is reported exited. ip netns exec execs QEMU (no fork): the pid stays.
 *
 * The namespace is made as `ip netns add` does (a bind mount in /run/netns),
 * but owned by a user namespace of its own whose root is NET_DNS_UID outside:
 * whatever holds a capability there (the resolver) holds it over this
 * namespace only, never over the host's or another VM's (with CAP_NET_ADMIN
 * of the init user namespace, nobody moved an interface into another network
 * namespace by naming a process there). Root (warrend, the set-up, the
 * jail's child) still enters and configures it as before.
 */
static const char setup_script[] =
    "set -e\n"
    "PATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
    "ns=$1 hv=$2 hip=$3 nip=$4 rules=$5 apply=$6 rate=$7 dconf=$8 dpath=$9 dpid=${10} us=${11}\n"
    "shift 11\n"
    "mkdir -p /run/netns \"${us%/*}\"\n"
    ": >\"/run/netns/$ns\"; : >\"$us\"\n"
    "unshare -U -n sleep 60 & p=$!\n"
    "trap 'kill $p 2>/dev/null' EXIT\n"
    "while [ \"$(readlink /proc/$p/ns/user)\" = \"$(readlink /proc/$$/ns/user)\" ]; do sleep "
    "0.001; done\n"
    "echo '0 " NET_DNS_UID_STR " 1' >/proc/$p/uid_map\n"
    "echo '0 " NET_DNS_UID_STR " 1' >/proc/$p/gid_map\n"
    "mount --bind /proc/$p/ns/net \"/run/netns/$ns\"\n"
    "mount --bind /proc/$p/ns/user \"$us\"\n"
    "kill $p; trap - EXIT\n"
    "printf 'link add %s type veth peer name eth0 netns %s\\naddr add %s/30 dev %s\\n"
    "link set %s up\\n' \"$hv\" \"$ns\" \"$hip\" \"$hv\" \"$hv\" | ip -b -\n"
    "printf 'addr add %s/30 dev eth0\\nlink set eth0 up\\nlink set lo up\\n"
    "tuntap add dev tap0 mode tap\\nlink set tap0 address " NET_GW_MAC "\\n"
    "addr add 10.0.2.1/30 dev tap0\\nlink set tap0 up\\n"
    "route add default via %s\\n' \"$nip\" \"$hip\" | ip -n \"$ns\" -b -\n"
    "ip netns exec \"$ns\" sh -c \"$apply\"'ap \"$@\"' ap \\\n"
    "  \"$rules\" \"$rate\" \"$dconf\" \"$dpath\" \"$dpid\" \"$us\"\n"
    "exec ip netns exec \"$ns\" \"$@\"\n";

/* A policy change: $1 namespace, $2 marker, then the new policy's six ap
 * arguments and the old one's. */
static const char apply_script[] =
    APPLY_FN "ns=$1 marker=$2\n"
             "shift 2\n"
             "if ap \"$1\" \"$2\" \"$3\" \"$4\" \"$5\" \"$6\"; then : >\"$marker\"; exit 0; fi\n"
             "echo 'warren: the new policy failed; putting the old one back' >&2\n"
             "shift 6\n"
             "ap \"$@\"\n"
             "exit 1\n";

/* Always denied (besides net_range, added per ruleset): nothing a guest may
 * reach whatever its policy. 224/3 is multicast, reserved and broadcast;
 * 168.63.129.16 a cloud's metadata and host agent address (169.254.169.254
 * is in 169.254/16). Enforced twice: in the VM's namespace (net_vm_rules) and
 * in warrend's (net_host_rules), which nothing in the VM's namespace can change. */
static const char deny_list[] = "0.0.0.0/8, 10.0.0.0/8, 100.64.0.0/10, 127.0.0.0/8, "
                                "168.63.129.16/32, 169.254.0.0/16, 172.16.0.0/12, "
                                "192.168.0.0/16, 224.0.0.0/3";

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

int net_name_add(char *list, size_t cap, const char *name)
{
    char buf[NET_NAME_LEN + 2];
    size_t len, used = strlen(list), label = 0, labels = 1, start;
    int n;

    if (!name || (len = strlen(name)) == 0 || len > NET_NAME_LEN + 1)
        return -EINVAL;
    memcpy(buf, name, len + 1);
    if (buf[len - 1] == '.')
        buf[--len] = '\0';
    start = strncmp(buf, "*.", 2) == 0 ? 2 : 0;
    if (len <= start || len > NET_NAME_LEN)
        return -EINVAL;
    for (size_t i = start; i <= len; i++) {
        char c = buf[i];
        if (c >= 'A' && c <= 'Z')
            buf[i] = c = (char)(c - 'A' + 'a');
        if (c == '.' || c == '\0') {
            /* A label: 1-63 bytes, not starting or ending with '-'. */
            if (label == 0 || label > 63 || buf[i - 1] == '-' || buf[i - label] == '-')
                return -EINVAL;
            if (c == '.')
                labels++;
            label = 0;
        } else if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-') {
            label++;
        } else {
            return -EINVAL;
        }
    }
    if (labels < 2)
        return -EINVAL;
    n = snprintf(list + used, cap - used, "%s%s", used ? ", " : "", buf);
    if (n < 0 || (size_t)n >= cap - used) {
        list[used] = '\0';
        return -E2BIG;
    }
    return 0;
}

bool net_policy_dns(const struct net_policy *pol)
{
    return pol->internet && (pol->allow_names[0] || pol->deny_names[0]);
}

/* Append to *s (malloc'd, grown); false on ENOMEM (then *s is freed and NULL). */
static bool str_add(char **s, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool str_add(char **s, size_t *len, const char *fmt, ...)
{
    va_list ap;
    char *more = NULL, *grown;
    int n;

    if (!*s)
        return false;
    va_start(ap, fmt);
    n = vasprintf(&more, fmt, ap);
    va_end(ap);
    if (n < 0 || !(grown = realloc(*s, *len + (size_t)n + 1))) {
        free(n < 0 ? NULL : more);
        free(*s);
        *s = NULL;
        return false;
    }
    memcpy(grown + *len, more, (size_t)n + 1);
    *len += (size_t)n;
    *s = grown;
    free(more);
    return true;
}

/* Each name of a ", "-separated list, in turn: *name (NUL-ended, in buf). */
static const char *next_name(const char **c, char *buf, size_t cap)
{
    size_t len;

    *c += strspn(*c, ", ");
    if (!**c)
        return NULL;
    len = strcspn(*c, ",");
    snprintf(buf, cap, "%.*s", (int)len, *c);
    *c += len;
    return buf;
}

char *net_dns_conf(const char *dns, const struct net_policy *pol, const char *pidfile)
{
    char *s = strdup(""), name[NET_NAME_LEN + 2];
    size_t len = 0;
    bool up = dns && *dns;
    const char *c;

    if (!s || !net_policy_dns(pol))
        return s;
    /* Isolation from the host's dnsmasq set-up: this file is the whole
     * configuration (--conf-file replaces /etc/dnsmasq.conf), no
     * /etc/hosts, no resolv.conf, no DHCP (no dhcp-range), only the guest's
     * gateway address. user=root: it stays root of its VM's user namespace
     * (NET_DNS_UID outside), whose capabilities reach only its VM's network
     * namespace, where the nft sets need CAP_NET_ADMIN; nobody and dip, its
     * defaults, do not exist in there. filter-AAAA: guests have no IPv6 route. */
    str_add(&s, &len,
            "no-resolv\nno-hosts\nno-poll\nlisten-address=10.0.2.1\nbind-interfaces\n"
            "user=root\ngroup=root\npid-file=%s\nfilter-AAAA\ncache-size=1000\n",
            pidfile);
    if (pol->allow_names[0]) {
        /* Only the allowed names are forwarded; everything else is NXDOMAIN
         * (the longest match wins: "#" is the shortest). */
        str_add(&s, &len, "address=/#/\n");
        for (c = pol->allow_names; next_name(&c, name, sizeof(name));) {
            /* dnsmasq's /x/ is x and its subdomains, /\*.x/ only the subdomains;
             * its nftset has no "*." form: /x/ there (x itself is NXDOMAIN anyway). */
            const char *base = name[0] == '*' ? name + 2 : name;
            if (up)
                str_add(&s, &len, "server=/%s/%s\n", name, dns);
            str_add(&s, &len, "nftset=/%s/4#inet#warren#allow_dns\n", base);
        }
    } else if (up) {
        str_add(&s, &len, "server=%s\n", dns);
    }
    for (c = pol->deny_names; next_name(&c, name, sizeof(name));) {
        /* Resolved (to learn the addresses the forward chain then drops). With
         * an allow list, a denied name outside it is NXDOMAIN already. */
        const char *base = name[0] == '*' ? name + 2 : name;
        str_add(&s, &len, "nftset=/%s/4#inet#warren#deny_dns\n", base);
    }
    return s;
}

char *net_vm_rules(const char *range, const char *dns, const struct net_policy *pol)
{
    bool internet = pol->internet, own_dns = net_policy_dns(pol);
    bool allow = pol->allow_out[0] || pol->allow_names[0];
    char *s = strdup("");
    size_t len = 0;

    str_add(&s, &len,
            "table inet warren\n"
            "delete table inet warren\n"
            "table inet warren {\n"
            "  set deny {\n"
            "    type ipv4_addr; flags interval; auto-merge\n"
            "    elements = { %s, %s }\n"
            "  }\n",
            deny_list, range);
    /* The operator's lists: deny_out drops first; allow_out narrows what is
     * accepted. Neither can open anything in the always-deny set. */
    for (int i = 0; internet && i < 2; i++) {
        const char *name = i ? "allow_out" : "deny_out",
                   *elems = i ? pol->allow_out : pol->deny_out;
        if (elems[0])
            str_add(&s, &len,
                    "  set %s {\n"
                    "    type ipv4_addr; flags interval; auto-merge\n"
                    "    elements = { %s }\n"
                    "  }\n",
                    name, elems);
    }
    /* Filled by the VM's dnsmasq with what it resolved for the listed names;
     * no timeout: an address stays for the policy's life (docs/NETWORK.md). */
    if (own_dns && pol->allow_names[0])
        str_add(&s, &len, "  set allow_dns {\n    type ipv4_addr; size 65536\n  }\n");
    if (own_dns && pol->deny_names[0])
        str_add(&s, &len, "  set deny_dns {\n    type ipv4_addr; size 65536\n  }\n");
    str_add(&s, &len,
            "  chain nat_pre {\n"
            "    type nat hook prerouting priority dstnat; policy accept;\n");
    if (internet && !own_dns && dns && *dns)
        /* The guest asks its gateway; the namespace forwards to the resolver. */
        str_add(&s, &len,
                "    iifname \"tap0\" ip daddr 10.0.2.1 udp dport 53 dnat ip to %s\n"
                "    iifname \"tap0\" ip daddr 10.0.2.1 tcp dport 53 dnat ip to %s\n",
                dns, dns);
    str_add(&s, &len,
            "  }\n"
            "  chain nat_post {\n"
            "    type nat hook postrouting priority srcnat; policy accept;\n"
            "    oifname \"eth0\" masquerade\n"
            "  }\n");
    if (internet) {
        /* Every accepted packet from the guest passes here: new connections
         * are counted against max_connections (refused over it). */
        str_add(&s, &len, "  chain out_ok {\n");
        if (pol->max_conns)
            str_add(&s, &len, "    ct state new ct count over %u reject\n", pol->max_conns);
        str_add(&s, &len, "    accept\n  }\n");
    }
    str_add(&s, &len,
            "  chain guard_fwd {\n"
            "    type filter hook forward priority filter; policy drop;\n"
            "    iifname \"eth0\" oifname \"tap0\" ct state established,related accept\n");
    if (internet && !own_dns && dns && *dns)
        /* Accepted before the deny set: the resolver may be private. */
        str_add(&s, &len,
                "    iifname \"tap0\" oifname \"eth0\" ct status dnat ip daddr %s "
                "meta l4proto { tcp, udp } th dport 53 accept\n",
                dns);
    /* Every packet from the guest is checked, not only a connection's first:
     * after a policy change a connection the new one forbids goes nowhere. */
    if (internet && pol->deny_out[0])
        str_add(&s, &len, "    iifname \"tap0\" ip daddr @deny_out drop\n");
    if (own_dns && pol->deny_names[0])
        str_add(&s, &len, "    iifname \"tap0\" ip daddr @deny_dns drop\n");
    if (internet && !allow)
        str_add(&s, &len,
                "    iifname \"tap0\" oifname \"eth0\" meta nfproto ipv4 ip daddr != @deny "
                "jump out_ok\n");
    if (internet && pol->allow_out[0])
        str_add(&s, &len,
                "    iifname \"tap0\" oifname \"eth0\" meta nfproto ipv4 ip daddr != @deny "
                "ip daddr @allow_out jump out_ok\n");
    if (own_dns && pol->allow_names[0])
        str_add(&s, &len,
                "    iifname \"tap0\" oifname \"eth0\" meta nfproto ipv4 ip daddr != @deny "
                "ip daddr @allow_dns jump out_ok\n");
    str_add(&s, &len,
            "  }\n"
            "  chain guard_in {\n"
            "    type filter hook input priority filter; policy drop;\n"
            "    iifname \"lo\" accept\n"
            /* answers to warrend's port proxy connections (server/ports.c) */
            "    iifname \"tap0\" ct state established,related accept\n");
    if (own_dns)
        /* The VM's resolver: the guest's queries, and its upstream's answers. */
        str_add(&s, &len,
                "    iifname \"tap0\" ip daddr 10.0.2.1 meta l4proto { tcp, udp } th dport 53 "
                "accept\n"
                "    iifname \"eth0\" ct state established,related accept\n");
    /* What the namespace's own processes (QEMU, the resolver) may send: to the guest
     * (the resolver's answers, warrend's port proxy), answers, and the resolver's
     * queries to its upstream; nothing else out of eth0. */
    str_add(&s, &len,
            "  }\n"
            "  chain guard_out {\n"
            "    type filter hook output priority filter; policy drop;\n"
            "    oifname { \"lo\", \"tap0\" } accept\n"
            "    ct state established,related accept\n");
    if (own_dns && dns && *dns)
        str_add(&s, &len,
                "    oifname \"eth0\" ip daddr %s meta l4proto { tcp, udp } th dport 53 accept\n",
                dns);
    str_add(&s, &len, "  }\n}\n");
    return s;
}

char *net_host_rules(const char *tag, const char *uplink, const char *range, const char *dns)
{
    char *s = strdup("");
    size_t len = 0;

    /* Nothing from a wn-* interface reaches the host itself or any interface but
     * the uplink (another sandbox); the always-deny set is refused here too, so
     * a process in a VM's namespace (QEMU's uid, the resolver) or a table swapped
     * there by whatever holds CAP_NET_ADMIN in it reaches none of it. Only the
     * resolver (which may be private) is let through first, on port 53. IPv6 is
     * never forwarded. */
    str_add(&s, &len,
            "table inet warren_%s\n"
            "delete table inet warren_%s\n"
            "table inet warren_%s {\n"
            "  set deny {\n"
            "    type ipv4_addr; flags interval; auto-merge\n"
            "    elements = { %s, %s }\n"
            "  }\n"
            "  chain guard_fwd {\n"
            "    type filter hook forward priority filter - 10; policy accept;\n"
            "    iifname \"wn-*\" oifname != \"%s\" drop\n"
            "    oifname \"wn-*\" iifname != \"%s\" drop\n"
            "    iifname \"wn-*\" meta nfproto ipv6 drop\n",
            tag, tag, tag, deny_list, range, uplink, uplink);
    if (dns && *dns)
        str_add(&s, &len,
                "    iifname \"wn-*\" ip daddr %s meta l4proto { tcp, udp } th dport 53 accept\n",
                dns);
    str_add(&s, &len,
            "    iifname \"wn-*\" ip daddr @deny drop\n"
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
            uplink, range);
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
    if (c->net_rate_mbit > NET_RATE_MAX || c->net_max_connections > NET_CONNS_MAX) {
        snprintf(why, cap, "net_rate_mbit must be at most %d, net_max_connections at most %d",
                 NET_RATE_MAX, NET_CONNS_MAX);
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
    /* Optional: without it domain rules are refused (sbx_get_network). */
    (void)find_tool("dnsmasq", n->dnsmasq, sizeof(n->dnsmasq));
    snprintf(n->dnsdir, sizeof(n->dnsdir), "%s/net-dns", c->state_dir);
    snprintf(n->piddir, sizeof(n->piddir), NET_RUN_DIR "/dns-%s", n->tag);
    if (mkdir(n->dnsdir, 0700) != 0 && errno != EEXIST) {
        snprintf(why, cap, "cannot create %s: %s", n->dnsdir, strerror(errno));
        free(n);
        return -EIO;
    }
    /* The resolvers write their pidfiles as NET_DNS_UID. */
    if ((mkdir(NET_RUN_DIR, 0755) != 0 && errno != EEXIST) ||
        (mkdir(NET_USNS_DIR, 0700) != 0 && errno != EEXIST) ||
        (mkdir(n->piddir, 0700) != 0 && errno != EEXIST) ||
        chown(n->piddir, NET_DNS_UID, NET_DNS_UID) != 0 || chmod(n->piddir, 0700) != 0) {
        snprintf(why, cap, "cannot create %s: %s", n->piddir, strerror(errno));
        free(n);
        return -EIO;
    }
    n->nslots = 1u << (32 - n->prefix - 2);
    if (!(n->used = calloc(n->nslots, 1))) {
        free(n);
        return -ENOMEM;
    }
    /* warrend's side: NAT out of the uplink only; a sandbox's veth reaches
     * neither the host itself nor any other interface (another sandbox), nor
     * the always-deny set. */
    if (!(rules = net_host_rules(n->tag, n->uplink, n->range, n->dns))) {
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
    (void)rmdir(n->piddir); /* empty once every resolver went */
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

/* Entries of net_wrap's argv before QEMU's (or the marker's), of net_apply_argv's */
#define WRAP_ARGS  15
#define APPLY_ARGS 22

static void dns_paths(const struct net *n, const char *vm_id, char *conf, char *pid, size_t cap)
{
    snprintf(conf, cap, "%s/%s.conf", n->dnsdir, vm_id);
    snprintf(pid, cap, "%s/%s.pid", n->piddir, vm_id);
}

/* ap's six arguments for pol into v (strdup'd; a NULL on ENOMEM). */
static void apply_args(const struct net *n, const char *vm_id, const struct net_policy *pol,
                       char **v)
{
    char conf[4096 + 64], pid[4096 + 64], rate[16], us[256];

    dns_paths(n, vm_id, conf, pid, sizeof(conf));
    snprintf(rate, sizeof(rate), "%u", pol->internet ? pol->rate_mbit : 0);
    v[0] = net_vm_rules(n->range, n->dns, pol);
    v[1] = strdup(rate);
    v[2] = net_dns_conf(n->dns, pol, pid);
    v[3] = strdup(conf);
    v[4] = strdup(pid);
    ns_name(n, vm_id, us, sizeof(us));
    v[5] = NULL;
    if (asprintf(&v[5], NET_USNS_DIR "/%s", us) < 0)
        v[5] = NULL;
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
    if (!(v = calloc(WRAP_ARGS + 1, sizeof(*v))))
        return -ENOMEM;
    v[0] = strdup("/bin/sh");
    v[1] = strdup("-c");
    v[2] = strdup(setup_script);
    v[3] = strdup("warren-net");
    v[4] = strdup(ns);
    v[5] = strdup(hv);
    v[6] = strdup(hip);
    v[7] = strdup(nip);
    apply_args(n, vm_id, pol, v + 9);
    v[8] = v[9];
    v[9] = strdup(APPLY_FN);
    for (int i = 0; i < WRAP_ARGS; i++) {
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
    for (int i = 0; argv[i] || i < WRAP_ARGS; i++)
        free(argv[i]);
    free(argv);
}

/* v[0..3]: `ip netns exec <vm_id's namespace>` (NULL where out of memory). */
static void ns_exec_argv(const struct net *n, const char *vm_id, char **v)
{
    char ns[128];

    ns_name(n, vm_id, ns, sizeof(ns));
    v[0] = strdup(n->ip);
    v[1] = strdup("netns");
    v[2] = strdup("exec");
    v[3] = strdup(ns);
}

int net_apply_argv(const struct net *n, const char *vm_id, const struct net_policy *pol,
                   const struct net_policy *old, const char *marker, char ***out)
{
    char ns[128];
    char **v = calloc(APPLY_ARGS + 1, sizeof(*v));

    if (!v)
        return -ENOMEM;
    ns_exec_argv(n, vm_id, v);
    ns_name(n, vm_id, ns, sizeof(ns));
    v[4] = strdup("/bin/sh");
    v[5] = strdup("-c");
    v[6] = strdup(apply_script);
    v[7] = strdup("warren-net-apply");
    v[8] = strdup(ns);
    v[9] = strdup(marker);
    apply_args(n, vm_id, pol, v + 10);
    apply_args(n, vm_id, old, v + 16);
    for (int i = 0; i < APPLY_ARGS; i++) {
        if (!v[i]) {
            for (int j = 0; j < APPLY_ARGS; j++)
                free(v[j]);
            free(v);
            return -ENOMEM;
        }
    }
    *out = v;
    return 0;
}

int net_wrap_ready(const struct net *n, const char *vm_id, char ***out)
{
    char **v = calloc(WRAP_ARGS + 1, sizeof(*v));

    if (!v)
        return -ENOMEM;
    /* ip by its path, no shell: one exec fewer before QEMU (ip execs QEMU itself). */
    ns_exec_argv(n, vm_id, v);
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
    if (!(w = realloc(v, (WRAP_ARGS + 5) * sizeof(*v)))) {
        net_wrap_free(v);
        return -ENOMEM;
    }
    v = w;
    v[WRAP_ARGS] = strdup("/bin/sh");
    v[WRAP_ARGS + 1] = strdup("-c");
    v[WRAP_ARGS + 2] = strdup(": >\"$0\"");
    v[WRAP_ARGS + 3] = strdup(marker);
    v[WRAP_ARGS + 4] = NULL;
    for (int i = WRAP_ARGS; i < WRAP_ARGS + 4; i++) {
        if (!v[i]) {
            for (int j = i + 1; j < WRAP_ARGS + 4; j++)
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

static void unmount_file(const char *path)
{
    /* MNT_DETACH: a namespace still entered by a dying process goes when it does. */
    if (umount2(path, MNT_DETACH) != 0 && errno != EINVAL && errno != ENOENT)
        LOG(LOG_WARN, "net: cannot unmount %s: %s", path, strerror(errno));
    if (unlink(path) != 0 && errno != ENOENT)
        LOG(LOG_WARN, "net: cannot remove %s: %s", path, strerror(errno));
}

/* The network namespace and the user namespace that owns it. */
static void ns_remove_name(const char *name)
{
    char path[320];

    snprintf(path, sizeof(path), NETNS_DIR "/%s", name);
    unmount_file(path);
    snprintf(path, sizeof(path), NET_USNS_DIR "/%s", name);
    unmount_file(path);
}

void net_ns_path(const struct net *n, const char *vm_id, char *buf, size_t cap)
{
    char name[128];

    ns_name(n, vm_id, name, sizeof(name));
    snprintf(buf, cap, NETNS_DIR "/%s", name);
}

bool net_has_dnsmasq(const struct net *n)
{
    return n && n->dnsmasq[0];
}

void net_dns_stop(const struct net *n, const char *vm_id)
{
    char conf[4096 + 64], pid[4096 + 64], buf[8192];
    ssize_t got;
    long p = 0;
    int fd;

    if (!n)
        return;
    dns_paths(n, vm_id, conf, pid, sizeof(conf));
    if ((fd = open(pid, O_RDONLY | O_CLOEXEC)) >= 0) {
        got = read(fd, buf, 31);
        close(fd);
        buf[got > 0 ? got : 0] = '\0';
        p = strtol(buf, NULL, 10);
    }
    if (p > 1) {
        /* Its command line names its pidfile (dnsmasq --pid-file=<pid>): only
         * then is the pid still that resolver's. */
        char path[64];
        snprintf(path, sizeof(path), "/proc/%ld/cmdline", p);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
            got = read(fd, buf, sizeof(buf) - 1);
            close(fd);
            for (ssize_t i = 0; i < got; i++)
                buf[i] = buf[i] ? buf[i] : ' ';
            buf[got > 0 ? got : 0] = '\0';
            if (strstr(buf, "dnsmasq") && strstr(buf, pid))
                kill((pid_t)p, SIGKILL);
        }
    }
    unlink(pid);
    unlink(conf);
    /* A policy change's marker and message (sbx_netpol.c), left by a kill -9. */
    snprintf(conf, sizeof(conf), "%s/%s.applied", n->dnsdir, vm_id);
    unlink(conf);
    snprintf(conf, sizeof(conf), "%s/%s.err", n->dnsdir, vm_id);
    unlink(conf);
}

void net_ns_remove(const struct net *n, const char *vm_id)
{
    char name[128];

    if (!n)
        return;
    ns_name(n, vm_id, name, sizeof(name));
    /* The resolver first: it holds the namespace (and its tap) until it goes. */
    net_dns_stop(n, vm_id);
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
        net_dns_stop(n, e->d_name + plen);
        ns_remove_name(e->d_name);
        count++;
    }
    closedir(d);
    /* User namespaces whose network namespace went (a kill -9 between the two). */
    if ((d = opendir(NET_USNS_DIR))) {
        while ((e = readdir(d)) != NULL) {
            char path[256 + 32];
            if (strncmp(e->d_name, prefix, plen) != 0 || known(ud, e->d_name + plen))
                continue;
            snprintf(path, sizeof(path), NET_USNS_DIR "/%s", e->d_name);
            unmount_file(path);
        }
        closedir(d);
    }
    /* Resolvers whose namespace is already gone (a kill -9 between the two). */
    for (int k = 0; k < 2; k++) {
        if (!(d = opendir(k ? n->piddir : n->dnsdir)))
            continue;
        while ((e = readdir(d)) != NULL) {
            /* <vm id>.pid, .conf, .applied, .err */
            char id[256];
            const char *dot = strrchr(e->d_name, '.');
            if (e->d_name[0] == '.' || !dot || (size_t)(dot - e->d_name) >= sizeof(id))
                continue;
            snprintf(id, sizeof(id), "%.*s", (int)(dot - e->d_name), e->d_name);
            if (known(ud, id))
                continue;
            if (strcmp(dot, ".pid") == 0)
                LOGS(LOG_WARN, id, "net: no live VM: stopping its resolver");
            net_dns_stop(n, id);
        }
        closedir(d);
    }
    return count;
}
