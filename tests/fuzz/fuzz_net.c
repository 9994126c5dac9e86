/*
 * fuzz_net: the parsers of net/net.c that see client input (network.allow_out
 * and deny_out entries, CIDRs or domain names, net_range). Input: newline-separated
 * strings, each added to one list in turn. Checked: no overflow; every accepted
 * CIDR leaves the list as a canonical "a.b.c.d/p" (p <= 32, host bits clear), so
 * nothing the client wrote reaches nft but digits, dots, slashes and ", "; every
 * accepted name is [a-z0-9-.] with an optional leading "*.", and the dnsmasq
 * config and nft ruleset made from them have only lines of the forms expected
 * (no line a name could have added).
 */
#include "net.h"

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_list(const char *list)
{
    char copy[NET_LIST_CAP], *save = NULL, *tok;

    snprintf(copy, sizeof(copy), "%s", list);
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char addr[32];
        unsigned p;
        struct in_addr a;
        while (*tok == ' ')
            tok++;
        if (sscanf(tok, "%31[0-9.]/%u", addr, &p) != 2 || p > 32 ||
            inet_pton(AF_INET, addr, &a) != 1)
            abort();
        if (p < 32 && (ntohl(a.s_addr) & ~(p ? ~0u << (32 - p) : 0u)))
            abort();
    }
    for (const char *c = list; *c; c++)
        if (!strchr("0123456789./, ", *c))
            abort();
}

static void check_names(const char *list)
{
    bool start = true;

    for (const char *c = list; *c; c++) {
        if (start && c[0] == '*' && c[1] == '.') {
            c++;
            start = false;
            continue;
        }
        if (!strchr("abcdefghijklmnopqrstuvwxyz0123456789-., ", *c))
            abort();
        start = *c == ' ';
    }
}

/* Every line of the resolver's config is one of the keys it is made of. */
static void check_conf(const char *conf)
{
    static const char *const keys[] = {
        "no-resolv", "no-hosts",  "no-poll",     "listen-address=", "bind-interfaces", "user=",
        "group=",    "pid-file=", "filter-AAAA", "cache-size=",     "address=/#/",     "server=",
        "nftset=/",  NULL};
    for (const char *c = conf; *c;) {
        size_t len = strcspn(c, "\n"), k;
        for (k = 0; keys[k] && strncmp(c, keys[k], strlen(keys[k])) != 0; k++)
            ;
        if (!keys[k] || c[len] != '\n')
            abort();
        c += len + 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct net_policy pol;
    char list[NET_LIST_CAP] = "", small[40] = "";
    char *buf = malloc(size + 1), *save = NULL, *tok;
    unsigned base, prefix;

    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    memset(&pol, 0, sizeof(pol));
    pol.internet = true;
    pol.max_conns = (unsigned)size;
    for (tok = strtok_r(buf, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        size_t before = strlen(list), nb = strlen(pol.allow_names);
        char *names = (strlen(tok) & 1) ? pol.allow_names : pol.deny_names;
        if (net_name_add(names, sizeof(pol.allow_names), tok) != 0 && names == pol.allow_names &&
            strlen(names) != nb)
            abort();
        int r = net_list_add(list, sizeof(list), tok);
        if (r != 0 && strlen(list) != before)
            abort(); /* a refused entry leaves the list as it was */
        (void)net_list_add(small, sizeof(small), tok);
        if (net_parse_range(tok, &base, &prefix) == 0 &&
            (prefix < 8 || prefix > 28 || (base & ~(~0u << (32 - prefix)))))
            abort();
    }
    check_list(list);
    check_list(small);
    check_names(pol.allow_names);
    check_names(pol.deny_names);
    {
        char *conf = net_dns_conf("198.51.100.53", &pol, "/run/x.pid");
        char *rules = net_vm_rules("10.201.0.0/16", "198.51.100.53", &pol);
        if (!conf || !rules)
            abort();
        check_conf(conf);
        free(conf);
        free(rules);
    }
    free(buf);
    return 0;
}
