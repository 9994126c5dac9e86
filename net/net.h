/*
 * net.h - sandbox networking: one network namespace per VM, NAT out of one
 * uplink, always-deny rules (docs/NETWORK.md).
 *
 * Every VM (a sandbox's, the pool's template and clones) runs QEMU inside
 * its own namespace /run/netns/warren-<tag>-<vm id> (tag: a hash of the
 * state dir, so a sweep never touches another warrend's). In it: tap0
 * (QEMU's NIC, 10.0.2.1/30 towards the guest's 10.0.2.2), eth0 (one end of
 * a veth pair; the other end, wn-<12 hex of the id>, is in warrend's
 * namespace) with a /30 of net_range, and one nftables table "warren" that
 * masquerades the guest, forwards its DNS to net_dns_upstream, and applies
 * the policy. The guest side is the same in every namespace, so clones of
 * one snapshot need no reconfiguration. warrend's own namespace holds one
 * table, warren_<tag>: NAT out of net_uplink, nothing from a wn-* interface
 * to the host itself or anywhere but the uplink.
 *
 * Set-up never runs on the loop: net_wrap() gives the argv that vmm_launch
 * spawns in QEMU's place (vmm.h, net_wrap); it builds the namespace with
 * ip and nft, then execs QEMU inside it. Removal is net_ns_remove (an
 * umount and an unlink: the veth pair, tap and table go with the namespace
 * once QEMU is gone).
 *
 * Ownership: struct net is the sandbox table's (net_new/net_free). Strings
 * from net_wrap are the caller's (net_wrap_free).
 */
#ifndef WARREN_NET_H
#define WARREN_NET_H

#include <stdbool.h>
#include <stddef.h>

#include "config.h"

/* What every guest sees (guest-init reads warren.net= from the command line). */
#define NET_GUEST_APPEND "warren.net=10.0.2.2/30,10.0.2.1"
#define NET_GUEST_MAC    "52:54:00:57:52:02"
/* The gateway's (tap0's) MAC, the same in every namespace too: a guest restored
 * from a snapshot of a sandbox that had talked to its gateway keeps that ARP
 * entry, which a tap with a random MAC would make stale (its packets dropped). */
#define NET_GW_MAC "52:54:00:57:52:01"

struct net;

/* A VM's egress policy: set at create, replaced by PATCH .../network (docs/NETWORK.md). */
#define NET_LIST_MAX  32 /* entries (CIDRs and names together) in allow_out, and in deny_out */
#define NET_LIST_CAP  (NET_LIST_MAX * 20)
#define NET_NAME_LEN  253 /* a domain name's length, "*." included */
#define NET_NAMES_CAP (NET_LIST_MAX * (NET_NAME_LEN + 2))
#define NET_RATE_MAX  100000 /* rate_mbit: Mbit/s */
#define NET_CONNS_MAX 65536  /* max_connections */
struct net_policy {
    bool internet;                /* false: nothing leaves, DNS included */
    char allow_out[NET_LIST_CAP]; /* "a.b.c.d/p, ...": only these ("": anywhere) */
    char deny_out[NET_LIST_CAP];  /* never these (on top of the always-deny set) */
    /* Domain rules, "example.com, *.example.org": answered by a dnsmasq of the VM's
     * own that puts what it resolves into the VM's nft sets (net_dns_conf). */
    char allow_names[NET_NAMES_CAP];
    char deny_names[NET_NAMES_CAP];
    unsigned rate_mbit; /* each way (tc tbf on tap0 and eth0); 0: unlimited */
    unsigned max_conns; /* concurrent connections out (nft ct count); 0: unlimited */
};

/* Pure: add one IPv4 address or CIDR ("a.b.c.d" or "a.b.c.d/p", 0 <= p <= 32),
 * host bits cleared, to the ", "-separated list. 0, -EINVAL, or -E2BIG (full). */
int net_list_add(char *list, size_t cap, const char *cidr);
/* Pure: add one domain name ("example.com": it and every name under it;
 * "*.example.com": only the names under it), lowercased, one trailing dot
 * dropped, to the ", "-separated list. Labels of [a-z0-9-] (1-63 bytes, no
 * leading or trailing '-'), at least two of them. 0, -EINVAL, or -E2BIG. */
int net_name_add(char *list, size_t cap, const char *name);
/* Pure: true if pol needs the VM's own resolver (internet on and names listed). */
bool net_policy_dns(const struct net_policy *pol);

/* cfg->net_enabled off: 0 and *out = NULL. Else check and set up warrend's
 * side (root, ip and nft found, a valid uplink, range and resolver; the
 * host table; ip_forward), synchronously: it runs once, at start.
 * 0, or -errno with a one-line reason in why. */
int net_new(const struct srv_config *cfg, struct net **out, char *why, size_t cap);
/* Free (the host table stays: VMs detached at shutdown keep working). NULL: no-op. */
void net_free(struct net *n);

/* A free /30 of net_range: its index, or -ENOSPC. */
int net_slot_get(struct net *n);
/* Mark slot used (a VM re-adopted after a restart): 0, -EEXIST or -ERANGE. */
int net_slot_hold(struct net *n, int slot);
/* Give slot back (-1: no-op). */
void net_slot_put(struct net *n, int slot);

/* The argv for vmm_config.net_wrap: set up the namespace for vm_id with the
 * addresses of slot and the policy, then exec QEMU there. 0 or -errno. */
int net_wrap(const struct net *n, const char *vm_id, int slot, const struct net_policy *pol,
             char ***out);
void net_wrap_free(char **argv);
/* The argv for a namespace already set up (made ahead): only enter it and exec
 * QEMU there. 0 or -ENOMEM. (A wrapper for what cannot setns itself: the
 * bench; sandboxes use net_ns_path with vmm_config.netns.) */
int net_wrap_ready(const struct net *n, const char *vm_id, char ***out);
/* /run/netns/<vm_id's namespace> into buf (for vmm_config.netns). */
void net_ns_path(const struct net *n, const char *vm_id, char *buf, size_t cap);
/* The set-up alone, for a namespace made ahead: net_wrap's argv followed by a
 * command that creates the file marker once everything is in place (its
 * existence after the process exited is the success: libev may reap the
 * status first). Spawn with stdin /dev/null. 0 or -errno; net_wrap_free. */
int net_prepare_argv(const struct net *n, const char *vm_id, int slot, const struct net_policy *pol,
                     const char *marker, char ***out);

/* The kernel command line with NET_GUEST_APPEND added (base may be NULL):
 * a static buffer, valid until the next call. */
const char *net_append(const char *base);

/* Remove vm_id's namespace if it exists (and with it the veth, tap, table)
 * and stop its resolver (net_dns_stop). Call after its QEMU is gone. A few
 * syscalls, no process spawned. */
void net_ns_remove(const struct net *n, const char *vm_id);

/* Remove every namespace of this warrend whose VM id known() denies, and stop
 * every resolver (state_dir/net-dns/<id>.pid) known() denies (called at
 * start, after adoption). Returns how many namespaces went. */
int net_sweep(const struct net *n, bool (*known)(void *ud, const char *vm_id), void *ud);

/* Pure: parse "a.b.c.d/p" (8 <= p <= 28) into base address (host order) and
 * prefix. 0 or -EINVAL. For the tests. */
int net_parse_range(const char *s, unsigned *base, unsigned *prefix);
/* Pure: the ruleset loaded into a VM's namespace (malloc'd, NULL on ENOMEM):
 * one transaction that deletes the table and adds the new one, so a reload
 * while the VM runs is atomic. */
char *net_vm_rules(const char *range, const char *dns, const struct net_policy *pol);
/* Pure: the table loaded into warrend's own namespace at start (malloc'd, NULL on
 * ENOMEM): wn-* interfaces reach only the uplink, never the host itself, and
 * never the always-deny set (the resolver dns, when set, on port 53 only). */
char *net_host_rules(const char *tag, const char *uplink, const char *range, const char *dns);
/* Pure: the dnsmasq configuration for pol (malloc'd; "" when pol needs no
 * resolver; NULL on ENOMEM). dns: the upstream ("" : none, every name fails). */
char *net_dns_conf(const char *dns, const struct net_policy *pol, const char *pidfile);

/* The argv that replaces a running VM's policy (PATCH): in the VM's
 * namespace, reload its table (one nft transaction), its tc limits and its
 * resolver, then create marker; on a failure put old back (best effort) and
 * exit non-zero with the reason on stderr. Spawn with stdin /dev/null.
 * 0 or -errno; net_wrap_free. */
int net_apply_argv(const struct net *n, const char *vm_id, const struct net_policy *pol,
                   const struct net_policy *old, const char *marker, char ***out);
/* Whether dnsmasq was found at start (domain rules need it). */
bool net_has_dnsmasq(const struct net *n);
/* Stop vm_id's resolver, if it has one, and remove its files (pidfile checked
 * against the process's command line: a reused pid is never killed). */
void net_dns_stop(const struct net *n, const char *vm_id);

#endif
