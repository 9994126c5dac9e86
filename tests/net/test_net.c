/*
 * Unit tests of net/net.c's pure parts: the range parser and the ruleset
 * loaded into each VM's namespace. When nft is installed and we are root,
 * each ruleset is also checked by nft itself (nft -c: nothing is loaded).
 */
#include "net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

int failures;

static void test_range(void)
{
    unsigned base, prefix;

    CHECK(net_parse_range("10.201.0.0/16", &base, &prefix) == 0);
    CHECK(base == 0x0ac90000u && prefix == 16);
    CHECK(net_parse_range("10.201.7.9/16", &base, &prefix) == 0 && base == 0x0ac90000u);
    CHECK(net_parse_range("192.168.4.0/28", &base, &prefix) == 0 && prefix == 28);
    CHECK(net_parse_range("10.0.0.0/7", &base, &prefix) != 0);
    CHECK(net_parse_range("10.0.0.0/29", &base, &prefix) != 0);
    CHECK(net_parse_range("10.0.0.0", &base, &prefix) != 0);
    CHECK(net_parse_range("10.0.0.0/", &base, &prefix) != 0);
    CHECK(net_parse_range("10.0.0.0/16x", &base, &prefix) != 0);
    CHECK(net_parse_range("10.0.0/16", &base, &prefix) != 0);
    CHECK(net_parse_range(NULL, &base, &prefix) != 0);
}

/* nft -c on the text, when possible: 1 ok, 0 refused, -1 not checked. */
static int nft_check(const char *rules)
{
    FILE *p;

    if (geteuid() != 0 || access("/usr/sbin/nft", X_OK) != 0)
        return -1;
    if (!(p = popen("/usr/sbin/nft -c -f - 2>&1", "w")))
        return -1;
    fputs(rules, p);
    return pclose(p) == 0;
}

static void test_rules(void)
{
    static const char *const denied[] = {
        "0.0.0.0/8",     "10.0.0.0/8",     "100.64.0.0/10", "127.0.0.0/8",   "169.254.0.0/16",
        "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/3",   "10.201.0.0/16", "168.63.129.16/32"};
    struct net_policy on = {.internet = true}, off = {.internet = false};
    char *r[3] = {net_vm_rules("10.201.0.0/16", "198.51.100.53", &on),
                  net_vm_rules("10.201.0.0/16", "198.51.100.53", &off),
                  net_vm_rules("10.201.0.0/16", "", &on)};
    int ok;

    for (int i = 0; i < 3; i++) {
        CHECK(r[i] != NULL);
        if (!r[i])
            return;
        /* The deny set is the same whatever the policy; forwarding drops by default. */
        for (size_t j = 0; j < sizeof(denied) / sizeof(*denied); j++)
            CHECK(strstr(r[i], denied[j]) != NULL);
        CHECK(strstr(r[i], "hook forward priority filter; policy drop;") != NULL);
        CHECK(strstr(r[i], "hook input priority filter; policy drop;") != NULL);
        if ((ok = nft_check(r[i])) >= 0)
            CHECK(ok == 1);
    }
    /* internet on: out to anything not denied, DNS forwarded to the resolver. */
    CHECK(strstr(r[0], "ip daddr != @deny jump out_ok") != NULL);
    CHECK(strstr(r[0], "dnat ip to 198.51.100.53") != NULL);
    /* internet off: no accept towards eth0 at all, no DNS. */
    CHECK(strstr(r[1], "oifname \"eth0\"") == strstr(r[1], "oifname \"eth0\" masquerade"));
    CHECK(strstr(r[1], "dnat") == NULL && strstr(r[1], "jump out_ok") == NULL);
    /* No resolver: nothing forwarded. */
    CHECK(strstr(r[2], "dnat") == NULL && strstr(r[2], "@deny jump out_ok") != NULL);
    /* The namespace's own processes send nothing out of eth0 but the resolver's
     * queries (only with a resolver of its own). */
    for (int i = 0; i < 3; i++)
        CHECK(strstr(r[i], "hook output priority filter; policy drop;") != NULL &&
              strstr(strstr(r[i], "chain guard_out"), "oifname \"eth0\"") == NULL);
    for (int i = 0; i < 3; i++)
        free(r[i]);
}

/* warrend's own table: the always-deny set again, out of reach of anything in a
 * VM's namespace; the resolver first, on port 53 only. */
static void test_host_rules(void)
{
    static const char *const denied[] = {
        "0.0.0.0/8",     "10.0.0.0/8",     "100.64.0.0/10", "127.0.0.0/8",   "169.254.0.0/16",
        "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/3",   "10.201.0.0/16", "168.63.129.16/32"};
    char *r[2] = {net_host_rules("0123abcd", "up0", "10.201.0.0/16", "10.9.0.53"),
                  net_host_rules("0123abcd", "up0", "10.201.0.0/16", "")};
    const char *dns, *drop;
    int ok;

    for (int i = 0; i < 2; i++) {
        CHECK(r[i] != NULL);
        if (!r[i])
            return;
        CHECK(strstr(r[i], "table inet warren_0123abcd {") != NULL);
        for (size_t j = 0; j < sizeof(denied) / sizeof(*denied); j++)
            CHECK(strstr(r[i], denied[j]) != NULL);
        CHECK((drop = strstr(r[i], "iifname \"wn-*\" ip daddr @deny drop")) != NULL);
        CHECK(strstr(r[i], "iifname \"wn-*\" meta nfproto ipv6 drop") != NULL);
        CHECK(strstr(r[i], "iifname \"wn-*\" oifname != \"up0\" drop") != NULL);
        if ((ok = nft_check(r[i])) >= 0)
            CHECK(ok == 1);
    }
    dns = strstr(r[0], "ip daddr 10.9.0.53 meta l4proto { tcp, udp } th dport 53 accept");
    CHECK(dns && dns < strstr(r[0], "ip daddr @deny drop"));
    CHECK(strstr(r[1], "dport 53") == NULL);
    free(r[0]);
    free(r[1]);
}

/* allow_out / deny_out: canonical CIDRs, bounded, and rules nft accepts. */
static void test_lists(void)
{
    struct net_policy p = {.internet = true};
    char list[NET_LIST_CAP] = "", small[24] = "";
    char *r;
    int ok, i;

    CHECK(net_list_add(list, sizeof(list), "192.0.2.10") == 0);
    CHECK(net_list_add(list, sizeof(list), "198.51.100.77/24") == 0);
    CHECK(net_list_add(list, sizeof(list), "0.0.0.0/0") == 0);
    CHECK(strcmp(list, "192.0.2.10/32, 198.51.100.0/24, 0.0.0.0/0") == 0);
    CHECK(net_list_add(list, sizeof(list), "192.0.2.1/33") == -EINVAL);
    CHECK(net_list_add(list, sizeof(list), "192.0.2/24") == -EINVAL);
    CHECK(net_list_add(list, sizeof(list), "example.com") == -EINVAL);
    CHECK(net_list_add(list, sizeof(list), "1.2.3.4/") == -EINVAL);
    CHECK(net_list_add(list, sizeof(list), "1.2.3.4/-1") == -EINVAL);
    CHECK(net_list_add(list, sizeof(list), NULL) == -EINVAL);
    CHECK(strcmp(list, "192.0.2.10/32, 198.51.100.0/24, 0.0.0.0/0") == 0); /* unchanged */
    CHECK(net_list_add(small, sizeof(small), "192.0.2.10") == 0);
    CHECK(net_list_add(small, sizeof(small), "192.0.2.11") == -E2BIG);
    CHECK(strcmp(small, "192.0.2.10/32") == 0);
    /* NET_LIST_MAX of the longest entries fit. */
    list[0] = '\0';
    for (i = 0; i < NET_LIST_MAX; i++)
        CHECK(net_list_add(list, sizeof(list), "255.255.255.255/32") == 0);

    snprintf(p.allow_out, sizeof(p.allow_out), "192.0.2.0/24, 198.51.100.0/24");
    snprintf(p.deny_out, sizeof(p.deny_out), "198.51.100.80/32");
    r = net_vm_rules("10.201.0.0/16", "198.51.100.53", &p);
    CHECK(r && strstr(r, "ip daddr @deny_out drop") != NULL);
    CHECK(r && strstr(r, "ip daddr != @deny ip daddr @allow_out jump out_ok") != NULL);
    if (r && (ok = nft_check(r)) >= 0)
        CHECK(ok == 1);
    free(r);
    /* Lists mean nothing without internet: nothing is accepted out. */
    p.internet = false;
    r = net_vm_rules("10.201.0.0/16", "198.51.100.53", &p);
    CHECK(r && strstr(r, "allow_out") == NULL && strstr(r, "deny_out") == NULL &&
          strstr(r, "jump out_ok") == NULL);
    free(r);
}

/* Domain names: validated, canonical, bounded. */
static void test_names(void)
{
    char list[NET_NAMES_CAP] = "", small[24] = "", long_name[300];

    CHECK(net_name_add(list, sizeof(list), "Example.COM") == 0);
    CHECK(net_name_add(list, sizeof(list), "*.example.org.") == 0);
    CHECK(net_name_add(list, sizeof(list), "a-b.c0.example.net") == 0);
    CHECK(strcmp(list, "example.com, *.example.org, a-b.c0.example.net") == 0);
    static const char *const bad[] = {"",       "com",   "*.com.", "*",           "*.",
                                      "a..b",   ".a.b",  "a.b..",  "-a.b",        "a-.b",
                                      "a.b/c",  "a b.c", "a.*.b",  "**.a.b",      "a.b;rm",
                                      "x\"y.z", "a.b\n", "a_b.c",  "192.0.2.1/24"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        CHECK(net_name_add(list, sizeof(list), bad[i]) == -EINVAL);
    CHECK(net_name_add(list, sizeof(list), NULL) == -EINVAL);
    memset(long_name, 'a', 64);
    snprintf(long_name + 64, sizeof(long_name) - 64, ".com");
    CHECK(net_name_add(list, sizeof(list), long_name) == -EINVAL); /* a 64-byte label */
    for (int i = 0; i < 4; i++)
        memset(long_name + i * 64, 'a', 63), long_name[i * 64 + 63] = '.';
    long_name[254] = '\0'; /* 254 bytes */
    CHECK(net_name_add(list, sizeof(list), long_name) == -EINVAL);
    long_name[253] = '\0';
    long_name[252] = 'a';
    CHECK(net_name_add(small, sizeof(small), long_name) == -E2BIG && small[0] == '\0');
    CHECK(strcmp(list, "example.com, *.example.org, a-b.c0.example.net") == 0);
    /* NET_LIST_MAX names of the longest length fit. */
    list[0] = '\0';
    for (int i = 0; i < NET_LIST_MAX; i++)
        CHECK(net_name_add(list, sizeof(list), long_name) == 0);
}

/* Domain rules: the resolver's config and the sets it fills; limits. */
static void test_dns_and_limits(void)
{
    struct net_policy p = {.internet = true};
    char *r, *c;
    int ok;

    snprintf(p.allow_names, sizeof(p.allow_names), "www.example.com, *.example.org");
    snprintf(p.deny_names, sizeof(p.deny_names), "bad.example.org");
    snprintf(p.allow_out, sizeof(p.allow_out), "192.0.2.0/24");
    p.max_conns = 5;
    CHECK(net_policy_dns(&p));
    c = net_dns_conf("198.51.100.53", &p, "/run/x.pid");
    CHECK(c && strstr(c, "no-resolv\nno-hosts\n") && strstr(c, "listen-address=10.0.2.1\n") &&
          strstr(c, "user=root\n") && strstr(c, "pid-file=/run/x.pid\n"));
    CHECK(c && strstr(c, "address=/#/\n") && strstr(c, "server=/www.example.com/198.51.100.53\n") &&
          strstr(c, "server=/*.example.org/198.51.100.53\n") &&
          strstr(c, "nftset=/example.org/4#inet#warren#allow_dns\n") &&
          strstr(c, "nftset=/bad.example.org/4#inet#warren#deny_dns\n"));
    CHECK(c && !strstr(c, "dhcp-range"));
    free(c);
    r = net_vm_rules("10.201.0.0/16", "198.51.100.53", &p);
    CHECK(r && strstr(r, "set allow_dns") && strstr(r, "set deny_dns"));
    CHECK(r && strstr(r, "ip daddr @deny_dns drop") &&
          strstr(r, "ip daddr != @deny ip daddr @allow_dns jump out_ok") &&
          strstr(r, "ip daddr != @deny ip daddr @allow_out jump out_ok"));
    /* The guest asks the VM's resolver (input), no DNAT; connections counted. */
    CHECK(r && !strstr(r, "dnat") && strstr(r, "th dport 53 accept") &&
          strstr(r, "ct state new ct count over 5 reject"));
    if (r && (ok = nft_check(r)) >= 0)
        CHECK(ok == 1);
    free(r);
    /* A deny list of names alone: everything forwarded, the names' answers dropped. */
    p.allow_names[0] = p.allow_out[0] = '\0';
    p.max_conns = 0;
    c = net_dns_conf("198.51.100.53", &p, "/run/x.pid");
    CHECK(c && strstr(c, "server=198.51.100.53\n") && !strstr(c, "address=/#/"));
    free(c);
    r = net_vm_rules("10.201.0.0/16", "198.51.100.53", &p);
    CHECK(r && !strstr(r, "allow_dns") && strstr(r, "@deny_dns drop") && !strstr(r, "ct count"));
    if (r && (ok = nft_check(r)) >= 0)
        CHECK(ok == 1);
    free(r);
    /* Internet off: no resolver, whatever the names. */
    p.internet = false;
    CHECK(!net_policy_dns(&p));
    c = net_dns_conf("198.51.100.53", &p, "/run/x.pid");
    CHECK(c && c[0] == '\0');
    free(c);
    r = net_vm_rules("10.201.0.0/16", "198.51.100.53", &p);
    CHECK(r && !strstr(r, "deny_dns") && !strstr(r, "dport 53 accept"));
    free(r);
}

int main(void)
{
    test_range();
    test_rules();
    test_host_rules();
    test_lists();
    test_names();
    test_dns_and_limits();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
