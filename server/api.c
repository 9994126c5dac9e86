/*
 * api.c - pure helpers of the REST layer (see api.h).
 *
 * Everything here works on bytes the client sent, so every length is
 * checked before it is used and nothing assumes NUL-terminated input
 * except where api.h says so. No allocation outside jansson objects.
 */
#include "api.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <strings.h>

#include "util.h"

static int fail(struct api_err *e, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct api_err *e, int status, const char *code, const char *fmt, ...)
{
    va_list ap;

    e->status = status;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* ---------------------------------------------------------------- routes */

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

/* A {pid} segment (n bytes): a decimal, no sign, no leading zero, 1..API_PID_MAX. */
static bool parse_pid(const char *s, size_t n, uint32_t *pid)
{
    uint32_t v = 0;

    if (n == 0 || s[0] < '1' || s[0] > '9')
        return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint32_t)(s[i] - '0');
        if (v > API_PID_MAX)
            return false;
    }
    *pid = v;
    return true;
}

/* One segment of a path (s, n bytes) against one of a pattern (pat, pl bytes). */
static bool seg_match(const char *pat, size_t pl, const char *s, size_t n, struct api_route *r)
{
    if ((pl == 4 && memcmp(pat, "{id}", 4) == 0) || (pl == 5 && memcmp(pat, "{ctx}", 5) == 0)) {
        char *to = pl == 4 ? r->sbx : r->ctx;

        if (n == 0 || n > API_ID_MAX)
            return false;
        for (size_t i = 0; i < n; i++)
            if (!id_char(s[i]))
                return false;
        memcpy(to, s, n);
        to[n] = '\0';
        return true;
    }
    if ((pl == 5 && memcmp(pat, "{pid}", 5) == 0) || (pl == 6 && memcmp(pat, "{pid?}", 6) == 0))
        return parse_pid(s, n, &r->pid);
    return pl == n && memcmp(pat, s, n) == 0;
}

/* The path (len bytes, not NUL-terminated at len) against a row's pattern. */
static bool pattern_match(const char *pat, const char *path, size_t len, struct api_route *r)
{
    const char *s = path, *end = path + len;

    while (*pat) {
        const char *pe = strchr(pat + 1, '/'), *se;
        size_t pl = pe ? (size_t)(pe - pat - 1) : strlen(pat + 1);

        if (s == end) /* only an optional last segment may be missing */
            return pl == 6 && memcmp(pat + 1, "{pid?}", 6) == 0;
        if (*s != '/')
            return false;
        se = memchr(s + 1, '/', (size_t)(end - s - 1));
        if (!se)
            se = end;
        if (!seg_match(pat + 1, pl, s + 1, (size_t)(se - s - 1), r))
            return false;
        pat += 1 + pl;
        s = se;
    }
    return s == end;
}

#define ROW_(id, pattern, scope, ...)              [API_R_##id] = {pattern, scope, {__VA_ARGS__}},
#define VERB_(method, query, body, flags, handler) {API_##method, query, API_BODY_##body, flags},
const struct api_route_def api_routes[API_R_COUNT] = {API_ROUTE_MAP(ROW_, VERB_)};
#undef ROW_
#undef VERB_

const struct api_verb *api_route_verb(enum api_route_id id, unsigned method)
{
    if (id <= API_R_NONE || id >= API_R_COUNT)
        return NULL;
    for (size_t i = 0; i < API_VERBS_MAX && api_routes[id].verbs[i].method; i++)
        if (api_routes[id].verbs[i].method == method)
            return &api_routes[id].verbs[i];
    return NULL;
}

int api_route_match(const char *path, struct api_route *r)
{
    size_t len = strlen(path);
    bool auth, jup;

    memset(r, 0, sizeof(*r));
    /* One trailing slash is tolerated: /v1/sandboxes/ == /v1/sandboxes. */
    if (len > 1 && path[len - 1] == '/')
        len--;
    /* Anything under /v1 needs the key, even to learn that it does not exist. */
    auth = (len == 3 && memcmp(path, "/v1", 3) == 0) || strncmp(path, "/v1/", 4) == 0;
    jup = (len == 4 && memcmp(path, "/api", 4) == 0) || strncmp(path, "/api/", 5) == 0;
    auth = auth || jup;
    for (int id = API_R_NONE + 1; id < API_R_COUNT; id++) {
        if (pattern_match(api_routes[id].pattern, path, len, r)) {
            r->id = (enum api_route_id)id;
            r->auth = auth;
            r->jupyter = jup;
            for (size_t i = 0; i < API_VERBS_MAX; i++)
                r->methods |= api_routes[id].verbs[i].method;
            return 0;
        }
        /* What a row matched before it failed is not the path's. */
        memset(r, 0, sizeof(*r));
    }
    r->auth = auth;
    r->jupyter = jup;
    return -ENOENT;
}

/* ---------------------------------------------------------- query string */

void api_query_clear(struct api_query *q)
{
    json_decref(q->metadata);
    memset(q, 0, sizeof(*q));
}

static bool parse_uint(const char *s, unsigned base, unsigned long max, unsigned long *out)
{
    unsigned long n = 0;

    if (!*s)
        return false;
    for (; *s; s++) {
        unsigned d;
        if (*s < '0' || *s > '9')
            return false;
        d = (unsigned)(*s - '0');
        if (d >= base)
            return false;
        n = n * base + d;
        if (n > max)
            return false;
    }
    *out = n;
    return true;
}

int api_query_parse(const char *const *frags, size_t n, unsigned allowed, struct api_query *q,
                    struct api_err *e)
{
    static const char mdp[] = "metadata.";

    memset(q, 0, sizeof(*q));
    q->mode = 0644;
    q->depth = 1;
    for (size_t i = 0; i < n; i++) {
        const char *f = frags[i], *eq = strchr(f, '='), *v = eq ? eq + 1 : "";
        size_t nl = eq ? (size_t)(eq - f) : strlen(f);
        unsigned bit = 0;
        unsigned long num;

        if (nl == 0 && !*v)
            continue; /* "a=1&&b=2" */
        if (nl == 4 && memcmp(f, "path", 4) == 0)
            bit = API_Q_PATH;
        else if (nl == 4 && memcmp(f, "mode", 4) == 0)
            bit = API_Q_MODE;
        else if (nl == 5 && memcmp(f, "depth", 5) == 0)
            bit = API_Q_DEPTH;
        else if (nl == 9 && memcmp(f, "recursive", 9) == 0)
            bit = API_Q_RECURSIVE;
        else if (nl == 5 && memcmp(f, "state", 5) == 0)
            bit = API_Q_STATE;
        else if (nl == 6 && memcmp(f, "offset", 6) == 0)
            bit = API_Q_OFFSET;
        else if (nl == 6 && memcmp(f, "follow", 6) == 0)
            bit = API_Q_FOLLOW;
        else if (nl > sizeof(mdp) - 1 && memcmp(f, mdp, sizeof(mdp) - 1) == 0)
            bit = API_Q_METADATA;
        if (!bit || !(allowed & bit)) {
            fail(e, 400, "bad_request", "unknown query parameter '%.*s'", (int)(nl > 64 ? 64 : nl),
                 f);
            goto bad;
        }
        if (bit != API_Q_METADATA && (q->seen & bit)) {
            fail(e, 400, "bad_request", "query parameter '%.*s' given twice", (int)nl, f);
            goto bad;
        }
        q->seen |= bit;
        switch (bit) {
        case API_Q_PATH:
            q->path = v;
            break;
        case API_Q_MODE:
            if (!parse_uint(v, 8, 07777, &num)) {
                fail(e, 400, "bad_request", "mode must be octal 0..07777, e.g. 0644");
                goto bad;
            }
            q->mode = (unsigned)num;
            break;
        case API_Q_DEPTH:
            if (!parse_uint(v, 10, API_DEPTH_MAX, &num) || num < 1) {
                fail(e, 400, "bad_request", "depth must be 1..%d", API_DEPTH_MAX);
                goto bad;
            }
            q->depth = (unsigned)num;
            break;
        case API_Q_RECURSIVE:
        case API_Q_FOLLOW: {
            bool *b = bit == API_Q_RECURSIVE ? &q->recursive : &q->follow;
            if (!strcmp(v, "true") || !strcmp(v, "1"))
                *b = true;
            else if (!strcmp(v, "false") || !strcmp(v, "0"))
                *b = false;
            else {
                fail(e, 400, "bad_request", "%s must be true or false",
                     bit == API_Q_RECURSIVE ? "recursive" : "follow");
                goto bad;
            }
            break;
        }
        case API_Q_OFFSET:
            /* Offsets are byte counts of one process's output: 2^53 keeps them exact in
             * every JSON client. */
            if (!parse_uint(v, 10, (1ULL << 53), &num)) {
                fail(e, 400, "bad_request", "offset must be a byte offset 0..2^53");
                goto bad;
            }
            q->offset = num;
            break;
        case API_Q_STATE:
            if (!*v || strlen(v) > 32) {
                fail(e, 400, "bad_request", "state must be a sandbox state name");
                goto bad;
            }
            q->state = v;
            break;
        case API_Q_METADATA: {
            const char *k = f + sizeof(mdp) - 1;
            size_t kl = nl - (sizeof(mdp) - 1);
            json_t *s;
            char key[257];

            if (kl > 256 || strlen(v) > 4096) {
                fail(e, 400, "bad_request", "metadata filter key or value too long");
                goto bad;
            }
            memcpy(key, k, kl);
            key[kl] = '\0';
            if (!q->metadata && !(q->metadata = json_object())) {
                fail(e, 500, "internal", "out of memory");
                goto bad;
            }
            if (json_object_get(q->metadata, key)) {
                fail(e, 400, "bad_request", "metadata filter '%s' given twice", key);
                goto bad;
            }
            s = json_string(v);
            /* json_string and json_object_set_new both reject bytes that are not UTF-8. */
            if (!s || json_object_set_new(q->metadata, key, s)) {
                fail(e, 400, "bad_request", "metadata filter must be UTF-8 text");
                goto bad;
            }
            break;
        }
        }
    }
    return 0;
bad:
    api_query_clear(q);
    return -EINVAL;
}

json_t *api_query_args(const struct api_query *q, unsigned keys)
{
    json_t *a = json_object();
    int bad = !a;

    if (bad)
        return NULL;
    /* Checked already (api_path_check), so it is UTF-8. */
    if ((keys & API_Q_PATH) && q->path)
        bad |= json_object_set_new(a, "path", json_string(q->path));
    if (keys & API_Q_MODE)
        bad |= json_object_set_new(a, "mode", json_integer(q->mode));
    if (keys & API_Q_DEPTH)
        bad |= json_object_set_new(a, "depth", json_integer(q->depth));
    if (keys & API_Q_RECURSIVE)
        bad |= json_object_set_new(a, "recursive", json_boolean(q->recursive));
    /* Not checked for UTF-8: the filter gets the client's bytes as they are. */
    if ((keys & API_Q_STATE) && q->state)
        bad |= json_object_set_new(a, "state", json_string_nocheck(q->state));
    if ((keys & API_Q_METADATA) && q->metadata)
        bad |= json_object_set(a, "metadata", q->metadata);
    if (keys & API_Q_OFFSET)
        bad |= json_object_set_new(a, "offset", json_integer((json_int_t)q->offset));
    if (keys & API_Q_FOLLOW)
        bad |= json_object_set_new(a, "follow", json_boolean(q->follow));
    if (bad) {
        json_decref(a);
        return NULL;
    }
    return a;
}

int api_path_check(const char *what, const char *path, struct api_err *e)
{
    if (!path || !*path)
        return fail(e, 400, "bad_request", "%s is required (an absolute path)", what);
    if (path[0] != '/')
        return fail(e, 400, "bad_request", "%s must be an absolute path", what);
    if (strlen(path) > API_PATH_MAX)
        return fail(e, 400, "bad_request", "%s is longer than %d bytes", what, API_PATH_MAX);
    if (!api_utf8_valid((const unsigned char *)path, strlen(path)))
        return fail(e, 400, "bad_request", "%s must be UTF-8", what);
    return 0;
}

/* ----------------------------------------------------------------- bodies */

int api_body_parse(const char *buf, size_t n, json_t **out, struct api_err *e)
{
    json_error_t je;
    json_t *j;
    size_t i = 0;

    *out = NULL;
    while (i < n && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\r' || buf[i] == '\n'))
        i++;
    if (i == n) {
        if (!(*out = json_object()))
            return fail(e, 500, "internal", "out of memory");
        return 0;
    }
    j = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
    if (!j)
        return fail(e, 400, "bad_request", "malformed JSON body at byte %d: %s", je.position,
                    je.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return fail(e, 400, "bad_request", "the body must be a JSON object");
    }
    *out = j;
    return 0;
}

int api_rename_args(json_t *body, json_t **out, struct api_err *e)
{
    const char *from = json_string_value(json_object_get(body, "from"));
    const char *to = json_string_value(json_object_get(body, "to"));
    json_t *a;

    *out = NULL;
    if (api_path_check("from", from, e) || api_path_check("to", to, e))
        return -EINVAL;
    a = json_pack("{s:s, s:s}", "path", from, "to", to);
    if (!a)
        return fail(e, 500, "internal", "out of memory");
    *out = a;
    return 0;
}

/* ---------------------------------------------------------------- headers */

bool api_wants_ndjson(const char *accept)
{
    static const char t[] = "application/x-ndjson";

    for (const char *p = accept; p && *p; p++) {
        if (strncasecmp(p, t, sizeof(t) - 1) == 0)
            return true;
    }
    return false;
}

/* ------------------------------------------------------- UTF-8 and base64 */

/* Length of the sequence a lead byte starts, 0 if it cannot start one. */
static unsigned seq_len(unsigned char c)
{
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c < 0xe0)
        return 2;
    if (c >= 0xe0 && c < 0xf0)
        return 3;
    if (c >= 0xf0 && c < 0xf5)
        return 4;
    return 0;
}

/* Allowed range of the byte after lead c (excludes overlongs, surrogates, > U+10FFFF). */
static bool second_ok(unsigned char c, unsigned char d)
{
    unsigned char lo = 0x80, hi = 0xbf;

    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    return d >= lo && d <= hi;
}

bool api_utf8_valid(const unsigned char *p, size_t n)
{
    size_t i = 0;

    while (i < n) {
        unsigned char c = p[i];
        unsigned l;

        if (c < 0x80) {
            i++;
            continue;
        }
        l = seq_len(c);
        if (!l || n - i < l || !second_ok(c, p[i + 1]))
            return false;
        for (unsigned k = 2; k < l; k++) {
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
        }
        i += l;
    }
    return true;
}

size_t api_utf8_partial_tail(const unsigned char *p, size_t n)
{
    for (size_t t = 1; t <= 3 && t <= n; t++) {
        unsigned char c = p[n - t];
        unsigned l;

        if ((c & 0xc0) == 0x80)
            continue; /* continuation: the lead is further back */
        l = seq_len(c);
        if (l <= t)
            return 0; /* complete (or not UTF-8 at all): nothing to wait for */
        if (t >= 2 && !second_ok(c, p[n - t + 1]))
            return 0;
        return t;
    }
    return 0;
}

/* The API's base64 is standard and padded; the codec is shared with the tokens'
 * URL-safe form (util/). */
size_t api_b64_len(size_t n)
{
    return util_b64_len(UTIL_B64_STD, n);
}

void api_b64_encode(const unsigned char *in, size_t n, char *out)
{
    util_b64_encode(UTIL_B64_STD, in, n, out);
}

long api_b64_decode(const char *in, size_t n, unsigned char *out)
{
    return util_b64_decode(UTIL_B64_STD, in, n, out, n / 4 * 3);
}

/* Base64 of a ++ b where a is at most 3 bytes (the held-back bytes). */
static char *b64_two(const unsigned char *a, size_t an, const unsigned char *b, size_t bn, char *o)
{
    unsigned char tmp[6];
    size_t k = (3 - an % 3) % 3;

    if (k > bn)
        k = bn;
    memcpy(tmp, a, an);
    memcpy(tmp + an, b, k);
    api_b64_encode(tmp, an + k, o);
    o += api_b64_len(an + k);
    api_b64_encode(b + k, bn - k, o);
    return o + api_b64_len(bn - k);
}

static char *json_escape(const unsigned char *p, size_t n, char *o)
{
    static const char hex[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        unsigned char c = p[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            *o++ = (char)c;
            continue;
        }
        *o++ = '\\';
        switch (c) {
        case '"':
        case '\\':
            *o++ = (char)c;
            break;
        case '\n':
            *o++ = 'n';
            break;
        case '\r':
            *o++ = 'r';
            break;
        case '\t':
            *o++ = 't';
            break;
        case '\b':
            *o++ = 'b';
            break;
        case '\f':
            *o++ = 'f';
            break;
        default:
            *o++ = 'u';
            *o++ = '0';
            *o++ = '0';
            *o++ = hex[c >> 4];
            *o++ = hex[c & 15];
        }
    }
    return o;
}

size_t api_ndjson_max(size_t n)
{
    /* Up to two lines: held bytes that can no longer complete (a gap in offsets) are
     * flushed first as their own base64 line (< 64 + 4 bytes), then the line for p.
     * Each line's prefix + suffix < 64; escaping costs at most 6 bytes per byte (base64
     * less), and the held bytes (at most 3) may join p's line. */
    return (64 + 4) + 64 + 6 * (n + 3);
}

static char *line_start(char *o, int fd, uint64_t off, bool text)
{
    return o + sprintf(o, "{\"type\":\"%s\",\"offset\":%" PRIu64 ",\"%s\":\"",
                       fd == 1 ? "stdout" : "stderr", off, text ? "data" : "data_b64");
}

static char *line_end(char *o)
{
    memcpy(o, "\"}\n", 3);
    return o + 3;
}

size_t api_ndjson_flush(struct api_utf8_hold *h, int fd, char *out)
{
    char *o = out;

    if (!h->n)
        return 0;
    o = line_start(o, fd, h->off, false);
    api_b64_encode(h->b, h->n, o);
    o = line_end(o + api_b64_len(h->n));
    h->n = 0;
    return (size_t)(o - out);
}

size_t api_ndjson_chunk(struct api_utf8_hold *h, int fd, uint64_t off, const unsigned char *p,
                        size_t n, char *out)
{
    unsigned char head[4], tailv[6] = {0};
    size_t hn, total, tail, body, rest = 0, tv;
    uint64_t start;
    char *o = out;
    bool text = true;

    /* Held bytes belong just before off; after a gap they can never complete. */
    if (h->n && h->off + h->n != off)
        o += api_ndjson_flush(h, fd, o);
    if (!n)
        return (size_t)(o - out);
    hn = h->n;
    start = hn ? h->off : off;
    total = hn + n;

    /* The stream so far is held ++ p; its partial tail lies in its last 3 bytes. */
    tv = total < 3 ? total : 3;
    for (size_t i = 0; i < tv; i++) {
        size_t vi = total - tv + i;
        tailv[i] = vi < hn ? h->b[vi] : p[vi - hn];
    }
    tail = api_utf8_partial_tail(tailv, tv);
    body = total - tail;

    if (body == 0) {
        /* Still incomplete: hold everything (at most 3 bytes). */
        memcpy(head, h->b, hn);
        memcpy(head + hn, p, n);
        memcpy(h->b, head, total);
        h->n = (unsigned)total;
        h->off = start;
        return (size_t)(o - out);
    }
    /* Held bytes are one partial sequence from a lead byte, so a new tail
     * starts inside p, never inside them. */
    if (hn) {
        unsigned l = seq_len(h->b[0]);
        if (body < l) {
            text = false;
        } else {
            memcpy(head, h->b, hn);
            memcpy(head + hn, p, l - hn);
            text = api_utf8_valid(head, l);
            rest = l - hn;
        }
    }
    if (text)
        text = api_utf8_valid(p + rest, n - tail - rest);

    o = line_start(o, fd, start, text);
    if (text) {
        if (hn)
            o = json_escape(head, hn + rest, o);
        o = json_escape(p + rest, n - tail - rest, o);
    } else {
        o = b64_two(h->b, hn, p, n - tail, o);
    }
    o = line_end(o);

    memcpy(h->b, p + n - tail, tail);
    h->n = (unsigned)tail;
    h->off = start + body;
    return (size_t)(o - out);
}

/* ---------------------------------------------------------- processes */

int api_signal_parse(const json_t *v)
{
    static const struct {
        const char *name;
        int sig;
    } names[] = {
        {"HUP", SIGHUP},       {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"ILL", SIGILL},
        {"TRAP", SIGTRAP},     {"ABRT", SIGABRT}, {"BUS", SIGBUS},     {"FPE", SIGFPE},
        {"KILL", SIGKILL},     {"USR1", SIGUSR1}, {"SEGV", SIGSEGV},   {"USR2", SIGUSR2},
        {"PIPE", SIGPIPE},     {"ALRM", SIGALRM}, {"TERM", SIGTERM},   {"CHLD", SIGCHLD},
        {"CONT", SIGCONT},     {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},   {"TTIN", SIGTTIN},
        {"TTOU", SIGTTOU},     {"URG", SIGURG},   {"XCPU", SIGXCPU},   {"XFSZ", SIGXFSZ},
        {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},
        {"PWR", SIGPWR},       {"SYS", SIGSYS},
    };
    const char *s;

    if (json_is_integer(v)) {
        json_int_t n = json_integer_value(v);
        return n >= 1 && n <= 64 ? (int)n : -1;
    }
    if (!json_is_string(v) || json_string_length(v) > 16)
        return -1;
    s = json_string_value(v);
    if (strncasecmp(s, "SIG", 3) == 0)
        s += 3;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcasecmp(s, names[i].name) == 0)
            return names[i].sig;
    return -1;
}

int api_proc_ctl_parse(enum api_proc_action a, json_t *body, struct sbx_proc_ctl *c,
                       unsigned char **raw, struct api_err *e)
{
    static const char *const allowed[] = {
        [API_PROC_STDIN] = "data, data_b64 and eof",
        [API_PROC_SIGNAL] = "signal",
        [API_PROC_RESIZE] = "cols and rows",
    };
    json_t *d = json_object_get(body, "data"), *b = json_object_get(body, "data_b64");
    json_t *eof = json_object_get(body, "eof"), *sig = json_object_get(body, "signal");
    json_t *cols = json_object_get(body, "cols"), *rows = json_object_get(body, "rows");
    size_t known = a == API_PROC_STDIN    ? (size_t)(!!d + !!b + !!eof)
                   : a == API_PROC_SIGNAL ? (size_t) !!sig
                                          : (size_t)(!!cols + !!rows);

    memset(c, 0, sizeof(*c));
    *raw = NULL;
    if (!json_is_object(body) || json_object_size(body) != known) {
        fail(e, 400, "invalid_argument", "the body takes %s only", allowed[a]);
        return -EINVAL;
    }
    switch (a) {
    case API_PROC_STDIN:
        if ((d && !json_is_string(d)) || (b && !json_is_string(b)) || (d && b) ||
            (eof && !json_is_boolean(eof)) || (!d && !b && !json_is_true(eof))) {
            fail(e, 400, "invalid_argument",
                 "give data (text) or data_b64 (base64), and/or eof: true");
            return -EINVAL;
        }
        if (d) {
            c->data = json_string_value(d);
            c->len = json_string_length(d);
        } else if (b) {
            size_t n = json_string_length(b);
            long got = -1;
            if (n <= 4 * ((SBX_PROC_STDIN_MAX + 2) / 3) && (*raw = malloc(n / 4 * 3 + 1)))
                got = api_b64_decode(json_string_value(b), n, *raw);
            if (got < 0) {
                free(*raw);
                *raw = NULL;
                fail(e, 400, "invalid_argument", "data_b64 must be base64 of at most %d bytes",
                     SBX_PROC_STDIN_MAX);
                return -EINVAL;
            }
            c->data = *raw;
            c->len = (size_t)got;
        }
        if (c->len > SBX_PROC_STDIN_MAX) {
            fail(e, 400, "invalid_argument", "at most %d bytes of stdin per request",
                 SBX_PROC_STDIN_MAX);
            return -EINVAL;
        }
        c->eof = json_is_true(eof);
        return 0;
    case API_PROC_SIGNAL:
        if ((c->sig = api_signal_parse(sig)) < 0) {
            fail(e, 400, "invalid_argument",
                 "signal must be a number 1..64 or a name such as \"SIGTERM\"");
            return -EINVAL;
        }
        return 0;
    case API_PROC_RESIZE:
        if (!json_is_integer(cols) || !json_is_integer(rows) || json_integer_value(cols) < 1 ||
            json_integer_value(rows) < 1 || json_integer_value(cols) > API_PTY_SIZE_MAX ||
            json_integer_value(rows) > API_PTY_SIZE_MAX) {
            fail(e, 400, "invalid_argument", "cols and rows must be integers 1..%d",
                 API_PTY_SIZE_MAX);
            return -EINVAL;
        }
        c->cols = (unsigned)json_integer_value(cols);
        c->rows = (unsigned)json_integer_value(rows);
        return 0;
    }
    return -EINVAL;
}
