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

/* A VM's egress policy, fixed at create (docs/NETWORK.md). */
#define NET_LIST_MAX 32 /* entries in allow_out, and in deny_out */
#define NET_LIST_CAP (NET_LIST_MAX * 20)
struct net_policy {
    bool internet;                /* false: nothing leaves, DNS included */
    char allow_out[NET_LIST_CAP]; /* "a.b.c.d/p, ...": only these ("": anywhere) */
    char deny_out[NET_LIST_CAP];  /* never these (on top of the always-deny set) */
};

/* Pure: add one IPv4 address or CIDR ("a.b.c.d" or "a.b.c.d/p", 0 <= p <= 32),
 * host bits cleared, to the ", "-separated list. 0, -EINVAL, or -E2BIG (full). */
int net_list_add(char *list, size_t cap, const char *cidr);

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

/* Remove vm_id's namespace if it exists (and with it the veth, tap, table).
 * Call after its QEMU is gone. Two syscalls, no process spawned. */
void net_ns_remove(const struct net *n, const char *vm_id);

/* Remove every namespace of this warrend whose VM id known() denies (called
 * at start, after adoption). Returns how many went. */
int net_sweep(const struct net *n, bool (*known)(void *ud, const char *vm_id), void *ud);

/* Pure: parse "a.b.c.d/p" (8 <= p <= 28) into base address (host order) and
 * prefix. 0 or -EINVAL. For the tests. */
int net_parse_range(const char *s, unsigned *base, unsigned *prefix);
/* Pure: the ruleset loaded into a VM's namespace (malloc'd, NULL on ENOMEM). */
char *net_vm_rules(const char *range, const char *dns, const struct net_policy *pol);

#endif
