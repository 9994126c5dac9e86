/*
 * fuzz_net: the parsers of server/net.c that see client input (network.allow_out
 * and deny_out entries, net_range). Input: NUL- or newline-separated strings,
 * each added to one list in turn. Checked: no overflow; every accepted entry
 * leaves the list as a canonical "a.b.c.d/p" (p <= 32, host bits clear), so
 * nothing the client wrote reaches nft but digits, dots, slashes and ", ".
 */
#include "net.h"

#include <arpa/inet.h>
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char list[NET_LIST_CAP] = "", small[40] = "";
    char *buf = malloc(size + 1), *save = NULL, *tok;
    unsigned base, prefix;

    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    for (tok = strtok_r(buf, "\n", &save); tok; tok = strtok_r(NULL, "\n", &save)) {
        size_t before = strlen(list);
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
    free(buf);
    return 0;
}
