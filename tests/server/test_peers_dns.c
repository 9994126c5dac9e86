/*
 * test_peers_dns.c - peers from DNS: the spec, this host's addresses dropped, the
 * merge with the static peers (named, deduplicated, bounded), and a resolution on
 * its thread replacing the list the loop holds.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "fanout.h"
#include "peers_dns.h"

int failures;

static struct sockaddr_storage v4(const char *ip, unsigned port)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;

    memset(&ss, 0, sizeof(ss));
    a->sin_family = AF_INET;
    a->sin_port = htons((unsigned short)port);
    inet_pton(AF_INET, ip, &a->sin_addr);
    return ss;
}

static struct sockaddr_storage v6(const char *ip, unsigned port)
{
    struct sockaddr_storage ss;
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

    memset(&ss, 0, sizeof(ss));
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((unsigned short)port);
    inet_pton(AF_INET6, ip, &a->sin6_addr);
    return ss;
}

static void test_spec(void)
{
    char host[PEERS_DNS_HOST_MAX + 1], port[6], err[256];
    char longname[300];

    CHECK(peers_dns_spec("warren.warren.svc.cluster.local:8080", host, port, err, sizeof(err)) ==
          0);
    CHECK(!strcmp(host, "warren.warren.svc.cluster.local") && !strcmp(port, "8080"));
    CHECK(peers_dns_spec("peers:1", host, port, err, sizeof(err)) == 0 && !strcmp(port, "1"));
    CHECK(peers_dns_spec("10.0.0.1:65535", host, port, err, sizeof(err)) == 0);
    CHECK(peers_dns_spec("peers:0", host, port, err, sizeof(err)) < 0);
    CHECK(strstr(err, "NAME:PORT") != NULL);
    CHECK(peers_dns_spec("peers:65536", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("peers:123456", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("peers", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("peers:", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec(":8080", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("peers:80x", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("http://peers:80", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("pe ers:80", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec("", host, port, err, sizeof(err)) < 0);
    CHECK(peers_dns_spec(NULL, host, port, err, sizeof(err)) < 0);
    memset(longname, 'a', 254);
    strcpy(longname + 254, ":80");
    CHECK(peers_dns_spec(longname, host, port, err, sizeof(err)) < 0);
    memset(longname, 'a', 253);
    strcpy(longname + 253, ":80");
    CHECK(peers_dns_spec(longname, host, port, err, sizeof(err)) == 0 && strlen(host) == 253);
}

static void test_drop_self(void)
{
    struct sockaddr_storage a[4] = {v4("10.0.0.10", 8080), v4("10.0.0.11", 8080),
                                    v6("fd00::12", 8080), v4("10.0.0.12", 8080)};
    /* This host's addresses carry no port: an address of this host is this host. */
    struct sockaddr_storage self[3] = {v4("127.0.0.1", 0), v4("10.0.0.11", 0), v6("fd00::12", 0)};
    unsigned n = peers_dns_drop_self(a, 4, self, 3);
    char ip[64];

    CHECK(n == 2);
    inet_ntop(AF_INET, &((struct sockaddr_in *)&a[0])->sin_addr, ip, sizeof(ip));
    CHECK(!strcmp(ip, "10.0.0.10"));
    inet_ntop(AF_INET, &((struct sockaddr_in *)&a[1])->sin_addr, ip, sizeof(ip));
    CHECK(!strcmp(ip, "10.0.0.12"));
    CHECK(peers_dns_drop_self(a, 2, NULL, 0) == 2);
}

static void test_merge(void)
{
    struct fanout_peers *base = NULL, *m = NULL, *m2 = NULL, *big = NULL;
    struct sockaddr_storage a[5] = {v4("10.0.0.11", 8080), v4("10.0.0.12", 8080),
                                    v4("10.0.0.12", 8080), v6("fd00::13", 8080),
                                    v4("10.0.0.11", 9090)};
    struct sockaddr_storage many[70];
    char err[256];
    unsigned dropped = 99;

    /* h0 is this host (skipped); h1 is static at .11:8080. */
    CHECK(fanout_peers_parse("h0=10.0.0.10:8080,h1=10.0.0.11:8080", "h0", &base, err,
                             sizeof(err)) == 0);
    CHECK(fanout_peers_count(base) == 1);
    CHECK(fanout_peers_merge(base, a, 5, &m, &dropped) == 0);
    CHECK(dropped == 0);
    /* h1 keeps its name; .12 once; the v6 one bracketed; .11 on another port is another
     * peer. */
    CHECK(fanout_peers_count(m) == 4);
    CHECK(!strcmp(fanout_peer_name(m, 0), "h1"));
    CHECK(!strcmp(fanout_peer_name(m, 1), "10.0.0.12:8080"));
    CHECK(!strcmp(fanout_peer_name(m, 2), "[fd00::13]:8080"));
    CHECK(!strcmp(fanout_peer_name(m, 3), "10.0.0.11:9090"));
    CHECK(strlen(fanout_peer_name(m, 2)) <= FANOUT_NAME_MAX);
    /* The same answer again makes the same list; a shorter one does not. */
    CHECK(fanout_peers_merge(base, a, 5, &m2, &dropped) == 0);
    CHECK(fanout_peers_same(m, m2));
    fanout_peers_free(m2);
    CHECK(fanout_peers_merge(base, a, 2, &m2, &dropped) == 0);
    CHECK(!fanout_peers_same(m, m2));
    CHECK(!fanout_peers_same(m, base));
    fanout_peers_free(m2);
    /* No static peers: DNS alone. */
    CHECK(fanout_peers_merge(NULL, a + 1, 1, &m2, &dropped) == 0);
    CHECK(fanout_peers_count(m2) == 1 && !strcmp(fanout_peer_name(m2, 0), "10.0.0.12:8080"));
    fanout_peers_free(m2);
    /* Bounded: 70 addresses and one static peer make 64, six left out and said so. */
    for (unsigned i = 0; i < 70; i++) {
        char ip[32];
        snprintf(ip, sizeof(ip), "10.1.0.%u", i + 1);
        many[i] = v4(ip, 8080);
    }
    CHECK(fanout_peers_merge(base, many, 70, &big, &dropped) == 0);
    CHECK(fanout_peers_count(big) == FANOUT_PEERS_MAX);
    CHECK(dropped == 70 - (FANOUT_PEERS_MAX - 1));
    fanout_peers_free(big);
    fanout_peers_free(m);
    fanout_peers_free(base);
}

/* A resolution on its thread: a numeric name resolves offline; 127.0.0.1 is this host's
 * own (its loopback) and is dropped, the other joins the static peer. */
static void on_giveup(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)w;
    (void)revents;
    ev_break(loop, EVBREAK_ALL);
}
static void on_poll(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop; /* wakes the loop: the test looks at the list after each round */
    (void)w;
    (void)revents;
}

static void test_resolve(const char *spec, unsigned want, const char *want_last)
{
    struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
    struct fanout_peers *peers = NULL;
    struct peers_dns *d = NULL;
    ev_timer giveup, poll;
    char err[256];

    CHECK(fanout_peers_parse("h1=10.0.0.11:8080", "h0", &peers, err, sizeof(err)) == 0);
    CHECK(peers_dns_start(loop, spec, 1, &peers, &d, err, sizeof(err)) == 0);
    ev_timer_init(&giveup, on_giveup, want == 1 ? 2.5 : 30., 0.);
    ev_timer_start(loop, &giveup);
    ev_timer_init(&poll, on_poll, 0.05, 0.05);
    ev_timer_start(loop, &poll);
    for (;;) { /* until the list changes or the give-up timer fires */
        ev_run(loop, EVRUN_ONCE);
        if (fanout_peers_count(peers) != 1 || !ev_is_active(&giveup))
            break;
    }
    CHECK(fanout_peers_count(peers) == want);
    CHECK(!strcmp(fanout_peer_name(peers, 0), "h1"));
    if (want_last)
        CHECK(!strcmp(fanout_peer_name(peers, want - 1), want_last));
    ev_timer_stop(loop, &giveup);
    ev_timer_stop(loop, &poll);
    peers_dns_stop(d);
    fanout_peers_free(peers);
    ev_loop_destroy(loop);
}

int main(void)
{
    test_spec();
    test_drop_self();
    test_merge();
    test_resolve("10.0.0.12:8080", 2, "10.0.0.12:8080");
    /* This host's own address: the list stays the static one (the loop ran the
     * resolutions of 2.5 s at a 1 s interval). */
    test_resolve("127.0.0.1:8080", 1, NULL);
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
