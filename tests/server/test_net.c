/*
 * Unit tests of server/net.c's pure parts: the range parser and the ruleset
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
    static const char *const denied[] = {"0.0.0.0/8",      "10.0.0.0/8",     "100.64.0.0/10",
                                         "127.0.0.0/8",    "169.254.0.0/16", "172.16.0.0/12",
                                         "192.168.0.0/16", "224.0.0.0/3",    "10.201.0.0/16"};
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
    CHECK(strstr(r[0], "ip daddr != @deny accept") != NULL);
    CHECK(strstr(r[0], "dnat ip to 198.51.100.53") != NULL);
    /* internet off: no accept towards eth0 at all, no DNS. */
    CHECK(strstr(r[1], "oifname \"eth0\"") == strstr(r[1], "oifname \"eth0\" masquerade"));
    CHECK(strstr(r[1], "dnat") == NULL && strstr(r[1], "@deny accept") == NULL);
    /* No resolver: nothing forwarded. */
    CHECK(strstr(r[2], "dnat") == NULL && strstr(r[2], "@deny accept") != NULL);
    for (int i = 0; i < 3; i++)
        free(r[i]);
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
    CHECK(r && strstr(r, "ip daddr != @deny ip daddr @allow_out accept") != NULL);
    if (r && (ok = nft_check(r)) >= 0)
        CHECK(ok == 1);
    free(r);
    /* Lists mean nothing without internet: nothing is accepted out. */
    p.internet = false;
    r = net_vm_rules("10.201.0.0/16", "198.51.100.53", &p);
    CHECK(r && strstr(r, "allow_out") == NULL && strstr(r, "deny_out") == NULL &&
          strstr(r, "@deny accept") == NULL);
    free(r);
}

int main(void)
{
    test_range();
    test_rules();
    test_lists();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
