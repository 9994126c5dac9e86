/*
 * ports_head.h - the port proxy's view of a connection's first request head
 * (ports.c, docs/NETWORK.md "Inbound"): parse it, tell whether it is for a
 * sandbox port (path /v1/sandboxes/{id}/ports/{port}/... or Host
 * {port}-{id}.{port_domain}), find the credentials warrend consumes, and
 * write the head that is forwarded to the guest.
 *
 * Pure: no I/O, no allocation; the head stays the caller's and every
 * pointer in struct ports_head points into it. Fuzzed by
 * tests/fuzz/fuzz_ports.c, unit-tested by tests/server/test_ports_head.c.
 *
 * Strict where leniency lets warrend and the guest disagree on where the
 * request ends (request smuggling): CRLF line ends only, no obsolete line
 * folding, no whitespace before a header's colon, at most one
 * Content-Length and one Transfer-Encoding (which must be exactly
 * "chunked"), never both.
 */
#ifndef WARREN_PORTS_HEAD_H
#define WARREN_PORTS_HEAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PORTS_HDRS_MAX  64             /* header lines in a head */
#define PORTS_ID_MAX    64             /* = API_ID_MAX */
#define PORTS_TOKEN_Q   "warren_token" /* query parameter and cookie name */
#define PORTS_TOKEN_HDR "x-warren-token"
/* E2B's header for a sandbox's trafficAccessToken: what its users send to a port of a
 * sandbox whose traffic is not public. */
#define PORTS_E2B_TOKEN_HDR "e2b-traffic-access-token"

struct ports_span {
    const char *p; /* NULL: absent */
    size_t n;
};

struct ports_head {
    size_t len; /* bytes of the head, its final CRLFCRLF included */
    struct ports_span method, target, version;
    struct ports_span name[PORTS_HDRS_MAX], value[PORTS_HDRS_MAX];
    unsigned nhdr;
    struct ports_span host, authorization, xtoken, e2btoken, cookie;
    bool upgrade;    /* Connection names "upgrade" and an Upgrade header is present */
    bool chunked;    /* Transfer-Encoding: chunked */
    bool has_length; /* Content-Length given */
    uint64_t length; /* its value */
};

enum ports_mode {
    PORTS_NOT = 0, /* not a port request: the API's */
    PORTS_PATH,    /* /v1/sandboxes/{id}/ports/{port}/rest */
    PORTS_HOST,    /* Host: {port}-{id}.{domain} */
};

struct ports_dest {
    enum ports_mode mode;
    char sbx[PORTS_ID_MAX + 1];
    unsigned port;
    struct ports_span rest;  /* path mode: what follows .../ports/{port} before the query */
    struct ports_span query; /* the query without its '?' (absent: p NULL) */
};

/*
 * Parse the head at buf[0..n). 0: incomplete, more bytes are needed (n < max);
 * > 0: complete, its length (h filled); -E2BIG: no complete head within max
 * bytes; -EINVAL: malformed (answer 400 and close).
 */
int ports_head_parse(const char *buf, size_t n, size_t max, struct ports_head *h);

/* Could the incomplete head buf[0..n) still be a port request? false: it already
 * shows it is not (another path, host routing off), so it need not be waited for. */
bool ports_head_maybe(const char *buf, size_t n, const char *domain);

/*
 * Is h a port request? domain: port_domain ("" or NULL: host routing off).
 * PORTS_NOT, PORTS_PATH or PORTS_HOST with d filled, or -EINVAL when it
 * names the ports of a sandbox but the port or id is malformed (400), or
 * -ENOENT when the sandbox id is malformed (404).
 */
int ports_route(const struct ports_head *h, const char *domain, struct ports_dest *d);

/* The query's warren_token value into out (cap bytes with the NUL): 1, 0 when
 * absent, -1 when given twice or too long. Same for the cookie of that name. */
int ports_query_token(const struct ports_dest *d, char *out, size_t cap);
int ports_cookie_token(const struct ports_head *h, char *out, size_t cap);

/*
 * Write the head forwarded to the guest into out: the target rewritten in
 * path mode (rest, "/" when empty, and the query minus warren_token), the
 * X-Warren-Token header, the warren_token cookie (the Cookie header dropped
 * when nothing else is left in it) and an Authorization header that holds
 * key in any spelling cred_is_key accepts (cred.h) removed (key NULL: none),
 * and in path mode Expect (no "100 Continue" is asked for); Connection and
 * Keep-Alive replaced by "Connection: close" (or "Connection: Upgrade" for an upgrade request). Its
 * length, or -E2BIG (too long for cap, or more than PORTS_HDRS_MAX header lines with its
 * Connection).
 */
long ports_head_rewrite(const struct ports_head *h, const struct ports_dest *d, const char *key,
                        char *out, size_t cap);

/* The same URL as h's (path, or Host-routed), without the warren_token
 * parameter, as a path+query into out for a redirect: length, -E2BIG, or
 * -EINVAL when the target is not a plain path of this host (it starts with
 * "//", holds a '\\' or a byte outside printable ASCII): a Location made of it
 * could send the browser to another host. */
long ports_url_without_token(const struct ports_head *h, char *out, size_t cap);

#endif
