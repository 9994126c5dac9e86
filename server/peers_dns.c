/*
 * peers_dns.c - peers from DNS, resolved off the event loop (peers_dns.h).
 *
 * At most one resolution is in flight: a thread that runs getaddrinfo and
 * getifaddrs, writes its outcome into the job and wakes the loop through an
 * ev_async; the loop joins it, then reads the outcome (the join orders the
 * thread's writes before the reads). A tick that finds a resolution still
 * running skips.
 */
#include "peers_dns.h"

#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* This host's addresses compared; more are not (a host has a few, its VMs' are in their
 * own namespaces). */
#define SELF_MAX 256

struct peers_dns {
    struct ev_loop *loop;
    ev_timer tick;
    ev_async wake;
    char host[PEERS_DNS_HOST_MAX + 1], port[6];
    struct fanout_peers *base; /* the static peers, a copy */
    struct fanout_peers **slot;
    bool failing; /* the last resolution failed (and said so) */
    bool busy;    /* a thread is resolving */
    pthread_t thread;
    /* The thread's outcome: written by it, read by the loop after the join. */
    int gai_err;
    const char *why;
    unsigned n, found;
    struct sockaddr_storage a[FANOUT_PEERS_MAX];
};

int peers_dns_spec(const char *spec, char host[PEERS_DNS_HOST_MAX + 1], char port[6], char *err,
                   size_t errcap)
{
    const char *colon = spec ? strrchr(spec, ':') : NULL;
    size_t hl;
    unsigned long pn = 0;

    if (!colon || colon == spec || !colon[1] || strlen(colon + 1) > 5)
        goto bad;
    hl = (size_t)(colon - spec);
    if (hl > PEERS_DNS_HOST_MAX)
        goto bad;
    for (const char *c = spec; c < colon; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') ||
              *c == '-' || *c == '.' || *c == '_'))
            goto bad;
    for (const char *c = colon + 1; *c; c++) {
        if (*c < '0' || *c > '9')
            goto bad;
        pn = pn * 10 + (unsigned long)(*c - '0');
    }
    if (pn < 1 || pn > 65535)
        goto bad;
    memcpy(host, spec, hl);
    host[hl] = '\0';
    snprintf(port, 6, "%lu", pn);
    return 0;
bad:
    snprintf(err, errcap, "peers_dns '%s': want NAME:PORT (a DNS name, a port 1-65535)",
             spec ? spec : "");
    return -EINVAL;
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                       &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
    return false;
}

unsigned peers_dns_drop_self(struct sockaddr_storage *a, unsigned n,
                             const struct sockaddr_storage *self, unsigned nself)
{
    unsigned kept = 0;

    for (unsigned i = 0; i < n; i++) {
        bool mine = false;
        for (unsigned j = 0; j < nself && !mine; j++)
            mine = same_ip(&a[i], &self[j]);
        if (!mine)
            a[kept++] = a[i];
    }
    return kept;
}

/* On the thread: the name's addresses, less this host's. Touches only the outcome. */
static void *resolve(void *arg)
{
    struct peers_dns *d = arg;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    struct sockaddr_storage self[SELF_MAX];
    struct ifaddrs *ifs = NULL;
    unsigned nself = 0;

    d->n = d->found = 0;
    d->why = NULL;
    d->gai_err = getaddrinfo(d->host, d->port, &hints, &ai);
    if (!d->gai_err) {
        for (struct addrinfo *p = ai; p; p = p->ai_next) {
            if ((p->ai_family != AF_INET && p->ai_family != AF_INET6) ||
                p->ai_addrlen > sizeof(d->a[0]))
                continue;
            d->found++;
            if (d->n < FANOUT_PEERS_MAX) {
                memset(&d->a[d->n], 0, sizeof(d->a[0]));
                memcpy(&d->a[d->n++], p->ai_addr, p->ai_addrlen);
            }
        }
        freeaddrinfo(ai);
    }
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && nself < SELF_MAX; i = i->ifa_next)
            if (i->ifa_addr &&
                (i->ifa_addr->sa_family == AF_INET || i->ifa_addr->sa_family == AF_INET6)) {
                memset(&self[nself], 0, sizeof(self[0]));
                memcpy(&self[nself++], i->ifa_addr,
                       i->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                          : sizeof(struct sockaddr_in));
            }
        freeifaddrs(ifs);
        d->n = peers_dns_drop_self(d->a, d->n, self, nself);
    } else if (!d->gai_err) {
        /* Without this host's addresses, it could count itself a peer and list its own
         * sandboxes twice: a failure, the last list stays. */
        d->why = "cannot read this host's addresses";
    }
    ev_async_send(d->loop, &d->wake);
    return NULL;
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    struct peers_dns *d = w->data;
    struct fanout_peers *next = NULL;
    unsigned dropped = 0;

    (void)loop;
    (void)revents;
    if (!d->busy)
        return;
    pthread_join(d->thread, NULL);
    d->busy = false;
    if (d->gai_err || d->why) {
        if (!d->failing)
            LOG(LOG_WARN, "fleet: peers_dns %s: %s; lists keep the %u peer(s) they had", d->host,
                d->why ? d->why : gai_strerror(d->gai_err), fanout_peers_count(*d->slot));
        d->failing = true;
        return;
    }
    if (d->failing)
        LOG(LOG_INFO, "fleet: peers_dns %s resolves again", d->host);
    d->failing = false;
    if (fanout_peers_merge(d->base, d->a, d->n, &next, &dropped)) {
        LOG(LOG_WARN, "fleet: peers_dns %s: out of memory; lists keep their peers", d->host);
        return;
    }
    dropped += d->found > FANOUT_PEERS_MAX ? d->found - FANOUT_PEERS_MAX : 0;
    if (fanout_peers_same(next, *d->slot)) {
        fanout_peers_free(next);
        return;
    }
    LOG(LOG_INFO,
        "fleet: peers_dns %s gives %u address(es) not this host's; lists include %u "
        "peer host(s)%s",
        d->host, d->n, fanout_peers_count(next),
        dropped ? " (more than 64: the rest left out)" : "");
    fanout_peers_free(*d->slot);
    *d->slot = next;
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct peers_dns *d = w->data;
    int r;

    (void)loop;
    (void)revents;
    if (d->busy)
        return;
    r = pthread_create(&d->thread, NULL, resolve, d);
    if (r) {
        if (!d->failing)
            LOG(LOG_WARN, "fleet: peers_dns %s: cannot start a resolver thread: %s", d->host,
                strerror(r));
        d->failing = true;
        return;
    }
    d->busy = true;
}

int peers_dns_start(struct ev_loop *loop, const char *spec, unsigned interval_s,
                    struct fanout_peers **slot, struct peers_dns **out, char *err, size_t errcap)
{
    struct peers_dns *d = calloc(1, sizeof(*d));
    unsigned dropped;
    int r;

    if (!d)
        return -ENOMEM;
    if ((r = peers_dns_spec(spec, d->host, d->port, err, errcap))) {
        free(d);
        return r;
    }
    if (fanout_peers_merge(*slot, NULL, 0, &d->base, &dropped)) {
        free(d);
        return -ENOMEM;
    }
    d->loop = loop;
    d->slot = slot;
    ev_async_init(&d->wake, on_wake);
    d->wake.data = d;
    ev_async_start(loop, &d->wake);
    ev_timer_init(&d->tick, on_tick, 0., interval_s ? (double)interval_s : 30.);
    d->tick.data = d;
    ev_timer_start(loop, &d->tick);
    *out = d;
    return 0;
}

void peers_dns_stop(struct peers_dns *d)
{
    if (!d)
        return;
    ev_timer_stop(d->loop, &d->tick);
    ev_async_stop(d->loop, &d->wake);
    if (d->busy)
        pthread_join(d->thread, NULL);
    fanout_peers_free(d->base);
    free(d);
}
