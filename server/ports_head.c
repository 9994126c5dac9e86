/*
 * ports_head.c - parse, route and rewrite a port request's head
 * (ports_head.h). Pure.
 */
#include "ports_head.h"
#include "cred.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* The longest method taken (HTTP's are at most 7 bytes): ports_head_parse refuses a
 * longer one and ports_head_maybe gives up past it, so a head is routed the same
 * whether it arrives whole or in pieces (fuzz_ports checks). */
#define METHOD_MAX 32

static const char path_pfx[] = "/v1/sandboxes/";

static bool tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static bool span_is(struct ports_span s, const char *lit)
{
    return s.p && s.n == strlen(lit) && strncasecmp(s.p, lit, s.n) == 0;
}

/* Does the comma-separated list s name token tok (case-insensitively)? */
static bool list_has(struct ports_span s, const char *tok)
{
    size_t tl = strlen(tok), i = 0;

    while (s.p && i < s.n) {
        size_t b, e;
        while (i < s.n && (s.p[i] == ' ' || s.p[i] == '\t' || s.p[i] == ','))
            i++;
        b = i;
        while (i < s.n && s.p[i] != ',')
            i++;
        e = i;
        while (e > b && (s.p[e - 1] == ' ' || s.p[e - 1] == '\t'))
            e--;
        if (e - b == tl && strncasecmp(s.p + b, tok, tl) == 0)
            return true;
    }
    return false;
}

/* One header field into h. -EINVAL for what is refused. */
static int header(struct ports_head *h, const char *p, size_t n, bool *conn_upgrade, bool *has_up)
{
    size_t c = 0, vb, ve;
    struct ports_span name, value;
    uint64_t v = 0;

    while (c < n && tchar((unsigned char)p[c]))
        c++;
    if (c == 0 || c >= n || p[c] != ':') /* no name, or space before the colon */
        return -EINVAL;
    vb = c + 1;
    while (vb < n && (p[vb] == ' ' || p[vb] == '\t'))
        vb++;
    ve = n;
    while (ve > vb && (p[ve - 1] == ' ' || p[ve - 1] == '\t'))
        ve--;
    for (size_t i = vb; i < ve; i++)
        if ((unsigned char)p[i] < 0x20 && p[i] != '\t')
            return -EINVAL;
    if (h->nhdr >= PORTS_HDRS_MAX)
        return -EINVAL;
    name = (struct ports_span){p, c};
    value = (struct ports_span){p + vb, ve - vb};
    h->name[h->nhdr] = name;
    h->value[h->nhdr++] = value;
    if (span_is(name, "host")) {
        if (h->host.p)
            return -EINVAL;
        h->host = value;
    } else if (span_is(name, "authorization")) {
        if (h->authorization.p)
            return -EINVAL;
        h->authorization = value;
    } else if (span_is(name, PORTS_TOKEN_HDR)) {
        if (h->xtoken.p)
            return -EINVAL;
        h->xtoken = value;
    } else if (span_is(name, PORTS_E2B_TOKEN_HDR)) {
        if (h->e2btoken.p)
            return -EINVAL;
        h->e2btoken = value;
    } else if (span_is(name, "cookie")) {
        if (h->cookie.p) /* one Cookie header (HTTP/2 splits them; HTTP/1.1 clients do not) */
            return -EINVAL;
        h->cookie = value;
    } else if (span_is(name, "connection")) {
        if (list_has(value, "upgrade"))
            *conn_upgrade = true;
    } else if (span_is(name, "upgrade")) {
        *has_up = value.n > 0;
    } else if (span_is(name, "content-length")) {
        if (h->has_length || value.n == 0 || value.n > 19)
            return -EINVAL;
        for (size_t i = 0; i < value.n; i++) {
            if (value.p[i] < '0' || value.p[i] > '9')
                return -EINVAL;
            v = v * 10 + (uint64_t)(value.p[i] - '0');
        }
        h->has_length = true;
        h->length = v;
    } else if (span_is(name, "transfer-encoding")) {
        if (h->chunked || !span_is(value, "chunked"))
            return -EINVAL;
        h->chunked = true;
    }
    return 0;
}

int ports_head_parse(const char *buf, size_t n, size_t max, struct ports_head *h)
{
    const char *end = NULL, *p, *sp1, *sp2, *eol;
    bool conn_upgrade = false, has_up = false;
    size_t lim = n < max ? n : max;
    int r;

    memset(h, 0, sizeof(*h));
    for (size_t i = 0; i + 3 < lim; i++) {
        if (buf[i] == '\r' && buf[i + 1] == '\n' && buf[i + 2] == '\r' && buf[i + 3] == '\n') {
            end = buf + i + 4;
            break;
        }
    }
    /* A NUL, a bare LF or a bare CR anywhere in what is there is refused early. */
    for (size_t i = 0; i < (end ? (size_t)(end - buf) : lim); i++)
        if (buf[i] == '\0' || (buf[i] == '\n' && (i == 0 || buf[i - 1] != '\r')) ||
            (buf[i] == '\r' && i + 1 < lim && buf[i + 1] != '\n'))
            return -EINVAL;
    if (!end)
        return n >= max ? -E2BIG : 0;
    eol = memchr(buf, '\r', (size_t)(end - buf));
    sp1 = memchr(buf, ' ', (size_t)(eol - buf));
    if (!sp1 || sp1 == buf || sp1 - buf > METHOD_MAX)
        return -EINVAL;
    sp2 = memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1));
    if (!sp2 || sp2 == sp1 + 1)
        return -EINVAL;
    h->method = (struct ports_span){buf, (size_t)(sp1 - buf)};
    h->target = (struct ports_span){sp1 + 1, (size_t)(sp2 - sp1 - 1)};
    h->version = (struct ports_span){sp2 + 1, (size_t)(eol - sp2 - 1)};
    for (size_t i = 0; i < h->method.n; i++)
        if (!tchar((unsigned char)h->method.p[i]))
            return -EINVAL;
    for (size_t i = 0; i < h->target.n; i++)
        if ((unsigned char)h->target.p[i] <= 0x20 || h->target.p[i] == 0x7f)
            return -EINVAL;
    if (h->target.p[0] != '/' ||
        !(span_is(h->version, "HTTP/1.1") || span_is(h->version, "HTTP/1.0")))
        return -EINVAL;
    for (p = eol + 2; p < end - 2; p = eol + 2) {
        eol = memchr(p, '\r', (size_t)(end - p));
        if (*p == ' ' || *p == '\t') /* obsolete line folding */
            return -EINVAL;
        if ((r = header(h, p, (size_t)(eol - p), &conn_upgrade, &has_up)) < 0)
            return r;
    }
    if (h->chunked && h->has_length)
        return -EINVAL;
    h->upgrade = conn_upgrade && has_up;
    h->len = (size_t)(end - buf);
    return (int)h->len;
}

/* Decimal 1..65535 without sign or leading zero from s[0..n): the port, or 0. */
static unsigned port_of(const char *s, size_t n)
{
    unsigned v = 0;

    if (n == 0 || n > 5 || s[0] == '0')
        return 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return 0;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    return v <= 65535 ? v : 0;
}

/* d->sbx = the n bytes at id, if they can be a sandbox id: 0, else -ENOENT. */
static int set_id(struct ports_dest *d, const char *id, size_t n)
{
    if (n == 0 || n > PORTS_ID_MAX)
        return -ENOENT;
    for (size_t i = 0; i < n; i++)
        if (!id_char(id[i]))
            return -ENOENT;
    memcpy(d->sbx, id, n);
    d->sbx[n] = '\0';
    return 0;
}

int ports_route(const struct ports_head *h, const char *domain, struct ports_dest *d)
{
    const char *t = h->target.p, *q, *id, *e;
    size_t tn = h->target.n, pl, idlen;

    memset(d, 0, sizeof(*d));
    q = memchr(t, '?', tn);
    pl = q ? (size_t)(q - t) : tn;
    if (q)
        d->query = (struct ports_span){q + 1, tn - pl - 1};
    /* Host routing first: such a connection belongs to the sandbox whatever its path. */
    if (domain && *domain && h->host.p) {
        size_t dl = strlen(domain), hn = h->host.n;
        const char *hs = h->host.p, *dash, *colon;
        /* A port after the host name (Host: 8000-id.example.com:8080) is ours, not the guest's. */
        colon = memchr(hs, ':', hn);
        if (colon)
            hn = (size_t)(colon - hs);
        if (hn > dl + 1 && hs[hn - dl - 1] == '.' && strncasecmp(hs + hn - dl, domain, dl) == 0) {
            dash = memchr(hs, '-', hn - dl - 1);
            if (!dash)
                return -EINVAL;
            id = dash + 1;
            idlen = (size_t)(hs + hn - dl - 1 - id);
            if (!(d->port = port_of(hs, (size_t)(dash - hs))))
                return -EINVAL;
            if (set_id(d, id, idlen))
                return -ENOENT;
            d->mode = PORTS_HOST;
            d->rest = (struct ports_span){t, pl};
            return PORTS_HOST;
        }
    }
    if (pl < sizeof(path_pfx) - 1 || memcmp(t, path_pfx, sizeof(path_pfx) - 1) != 0)
        return PORTS_NOT;
    id = t + sizeof(path_pfx) - 1;
    e = t + pl;
    for (idlen = 0; id + idlen < e && id[idlen] != '/'; idlen++)
        ;
    if (e - (id + idlen) < 7 || memcmp(id + idlen, "/ports/", 7) != 0)
        return PORTS_NOT; /* another route of that sandbox */
    if (set_id(d, id, idlen))
        return -ENOENT;
    {
        const char *ps = id + idlen + 7, *pe = ps;
        while (pe < e && *pe != '/')
            pe++;
        if (!(d->port = port_of(ps, (size_t)(pe - ps))))
            return -EINVAL;
        d->rest = (struct ports_span){pe, (size_t)(e - pe)};
    }
    d->mode = PORTS_PATH;
    return PORTS_PATH;
}

/* Walk the pairs of a list separated by sep ('&' query, ';' cookie): for each, its
 * bounds without surrounding spaces. */
static int find_pair(struct ports_span s, char sep, char *out, size_t cap)
{
    const size_t nl = sizeof(PORTS_TOKEN_Q) - 1;
    size_t i = 0;
    int found = 0;

    if (cap)
        out[0] = '\0';
    while (s.p && i < s.n) {
        size_t b, e;
        while (i < s.n && (s.p[i] == ' ' || s.p[i] == sep))
            i++;
        b = i;
        while (i < s.n && s.p[i] != sep)
            i++;
        e = i;
        while (e > b && s.p[e - 1] == ' ')
            e--;
        if (e > b && cred_pair_named(s.p + b, e - b, PORTS_TOKEN_Q)) {
            size_t vl = e - b > nl ? e - b - nl - 1 : 0;
            if (found++ || vl + 1 > cap)
                return -1;
            memcpy(out, s.p + b + nl + 1, vl);
            out[vl] = '\0';
        }
    }
    return found;
}

int ports_query_token(const struct ports_dest *d, char *out, size_t cap)
{
    return find_pair(d->query, '&', out, cap);
}

int ports_cookie_token(const struct ports_head *h, char *out, size_t cap)
{
    return find_pair(h->cookie, ';', out, cap);
}

struct wbuf {
    char *p;
    size_t cap, n;
    bool over;
};

static void put(struct wbuf *w, const char *s, size_t n)
{
    if (w->over || n > w->cap - w->n) {
        w->over = true;
        return;
    }
    memcpy(w->p + w->n, s, n);
    w->n += n;
}

static void puts_(struct wbuf *w, const char *s)
{
    put(w, s, strlen(s));
}

/* s (a list separated by sep) without its warren_token pairs, joined by join. */
static void put_list_without(struct wbuf *w, struct ports_span s, char sep, const char *join)
{
    size_t i = 0;
    bool first = true;

    while (s.p && i < s.n) {
        size_t b, e;
        while (i < s.n && ((sep == ';' && s.p[i] == ' ') || s.p[i] == sep))
            i++;
        b = i;
        while (i < s.n && s.p[i] != sep)
            i++;
        e = i;
        while (sep == ';' && e > b && s.p[e - 1] == ' ')
            e--;
        /* The same test as find_pair's: what is read as a token is never forwarded. */
        if (e == b || cred_pair_named(s.p + b, e - b, PORTS_TOKEN_Q))
            continue;
        if (!first)
            puts_(w, join);
        put(w, s.p + b, e - b);
        first = false;
    }
}

/* Would put_list_without write anything? */
static bool list_rest(struct ports_span s, char sep)
{
    char tmp[1];
    struct wbuf w = {tmp, 0, 0, false};

    put_list_without(&w, s, sep, "");
    return w.over;
}

static void put_target(struct wbuf *w, const struct ports_head *h, const struct ports_dest *d)
{
    if (d->mode == PORTS_PATH) {
        if (d->rest.n)
            put(w, d->rest.p, d->rest.n);
        else
            puts_(w, "/");
    } else {
        put(w, d->rest.p, d->rest.n);
    }
    (void)h;
    if (d->query.p && list_rest(d->query, '&')) {
        puts_(w, "?");
        put_list_without(w, d->query, '&', "&");
    }
}

long ports_head_rewrite(const struct ports_head *h, const struct ports_dest *d, const char *key,
                        char *out, size_t cap)
{
    struct wbuf w = {out, cap, 0, false};
    unsigned lines = 1; /* its own Connection header */

    put(&w, h->method.p, h->method.n);
    puts_(&w, " ");
    put_target(&w, h, d);
    puts_(&w, " ");
    put(&w, h->version.p, h->version.n);
    puts_(&w, "\r\n");
    for (unsigned i = 0; i < h->nhdr; i++) {
        struct ports_span nm = h->name[i];
        if (span_is(nm, PORTS_TOKEN_HDR) || span_is(nm, PORTS_E2B_TOKEN_HDR) ||
            span_is(nm, "connection") || span_is(nm, "keep-alive") ||
            span_is(nm, "proxy-connection") ||
            /* Path mode refuses interim answers (ports.c puts its policy after the one
             * status line): a guest asked for none sends a 100 only if hostile. */
            (d->mode == PORTS_PATH && span_is(nm, "expect")) ||
            (span_is(nm, "authorization") && cred_is_key(h->value[i].p, h->value[i].n, key)) ||
            (span_is(nm, "x-api-key") && cred_is_e2b_key(h->value[i].p, h->value[i].n, key)))
            continue;
        if (span_is(nm, "cookie") && !list_rest(h->value[i], ';'))
            continue;
        lines++;
        if (span_is(nm, "cookie")) {
            put(&w, nm.p, nm.n);
            puts_(&w, ": ");
            put_list_without(&w, h->value[i], ';', "; ");
            puts_(&w, "\r\n");
            continue;
        }
        put(&w, nm.p, nm.n);
        puts_(&w, ": ");
        put(&w, h->value[i].p, h->value[i].n);
        puts_(&w, "\r\n");
    }
    puts_(&w, h->upgrade ? "Connection: Upgrade\r\n\r\n" : "Connection: close\r\n\r\n");
    /* At most the header lines ports_head_parse takes: what warrend forwards, it
     * would itself accept (fuzz_ports checks). */
    return w.over || lines > PORTS_HDRS_MAX ? -E2BIG : (long)w.n;
}

long ports_url_without_token(const struct ports_head *h, char *out, size_t cap)
{
    struct wbuf w = {out, cap, 0, false};
    const char *q = memchr(h->target.p, '?', h->target.n);
    struct ports_span query = {NULL, 0};
    size_t pl = q ? (size_t)(q - h->target.p) : h->target.n;

    if (q)
        query = (struct ports_span){q + 1, h->target.n - pl - 1};
    /* The result goes into a Location header: it must stay a path of this host. A
     * second '/' or a '\' (which browsers read as '/') after the first would make it
     * "//other.host/..."; bytes outside printable ASCII are refused rather than
     * guessed at (browsers drop tabs and newlines, then read what is left). */
    if (pl == 0 || h->target.p[0] != '/' || (pl > 1 && h->target.p[1] == '/'))
        return -EINVAL;
    for (size_t i = 0; i < h->target.n; i++) {
        unsigned char c = (unsigned char)h->target.p[i];
        if (c <= 0x20 || c >= 0x7f || c == '\\')
            return -EINVAL;
    }
    put(&w, h->target.p, pl);
    if (query.p && list_rest(query, '&')) {
        puts_(&w, "?");
        put_list_without(&w, query, '&', "&");
    }
    return w.over ? -E2BIG : (long)w.n;
}

bool ports_head_maybe(const char *buf, size_t n, const char *domain)
{
    const char *sp, *t, *e = buf + n;
    size_t i;

    if (domain && *domain)
        return true; /* its Host may come in any line */
    sp = memchr(buf, ' ', n < METHOD_MAX + 1 ? n : METHOD_MAX + 1);
    if (!sp)
        return n <= METHOD_MAX;
    t = sp + 1;
    for (i = 0; i < sizeof(path_pfx) - 1; i++) {
        if (t + i >= e)
            return true;
        if (t[i] != path_pfx[i])
            return false;
    }
    for (t += i; t < e && id_char(*t); t++)
        ;
    for (i = 0; i < 7; i++) {
        if (t + i >= e)
            return true;
        if (t[i] != "/ports/"[i])
            return false;
    }
    return true;
}
