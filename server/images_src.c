/*
 * images_src.c - guest images named by content, filled from a shared source
 * (images_src.h).
 *
 * Everything that reads a file, hashes or talks HTTP runs on the pass thread or in
 * `warrend --publish-images`; the loop only starts a pass, joins it when it says it is
 * done (an ev_async, as peers_dns.c does: the join orders the thread's writes before
 * the loop's reads) and copies its outcome.
 */
#include "images_src.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <mbedtls/md.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "log.h"

#define CHUNK (1u << 16)

/* ---- names and the index ---- */

bool imgsrc_name_ok(const char *name)
{
    size_t n = strlen(name);

    if (n == 0 || n > IMGSRC_NAME_MAX || name[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

static void seterr(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void seterr(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (!err || !cap)
        return;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

int imgsrc_index_parse(const char *buf, size_t len, uint64_t max_size, struct imgsrc_entry *v,
                       size_t cap, size_t *n, char *err, size_t errcap)
{
    size_t hl = strlen(IMGSRC_INDEX_HEADER), pos, line = 1;

    *n = 0;
    if (len < hl || memcmp(buf, IMGSRC_INDEX_HEADER, hl) != 0) {
        seterr(err, errcap, "index: the first line is not \"warren-images 1\"");
        return -EINVAL;
    }
    for (pos = hl; pos < len;) {
        const char *l = buf + pos, *nl = memchr(l, '\n', len - pos), *p, *sp;
        size_t ll;
        uint64_t size = 0;
        struct imgsrc_entry *e;

        line++;
        if (!nl) {
            seterr(err, errcap, "index line %zu: no newline at its end", line);
            return -EINVAL;
        }
        ll = (size_t)(nl - l);
        if (ll + 1 > IMGSRC_LINE_MAX) {
            seterr(err, errcap, "index line %zu: longer than %u bytes", line, IMGSRC_LINE_MAX);
            return -EINVAL;
        }
        if (*n >= cap) {
            seterr(err, errcap, "index: more than %zu files", cap);
            return -EINVAL;
        }
        e = &v[*n];
        if (ll < IMGSRC_HEX_LEN + 4 || l[IMGSRC_HEX_LEN] != ' ') {
            seterr(err, errcap, "index line %zu: want \"<sha256> <size> <name>\"", line);
            return -EINVAL;
        }
        for (unsigned i = 0; i < IMGSRC_HEX_LEN; i++)
            if (!((l[i] >= '0' && l[i] <= '9') || (l[i] >= 'a' && l[i] <= 'f'))) {
                seterr(err, errcap, "index line %zu: the sha256 is not 64 lowercase hex digits",
                       line);
                return -EINVAL;
            }
        memcpy(e->sha, l, IMGSRC_HEX_LEN);
        e->sha[IMGSRC_HEX_LEN] = '\0';
        p = l + IMGSRC_HEX_LEN + 1;
        sp = memchr(p, ' ', (size_t)(nl - p));
        if (!sp || sp == p || (sp - p > 1 && *p == '0') || sp - p > 20) {
            seterr(err, errcap, "index line %zu: the size is not a number", line);
            return -EINVAL;
        }
        for (const char *c = p; c < sp; c++) {
            unsigned d = (unsigned)(*c - '0');
            if (*c < '0' || *c > '9' || size > (UINT64_MAX - d) / 10) {
                seterr(err, errcap, "index line %zu: the size is not a number", line);
                return -EINVAL;
            }
            size = size * 10 + d;
        }
        if (size > max_size) {
            seterr(err, errcap, "index line %zu: size %llu is over image_source_max_bytes (%llu)",
                   line, (unsigned long long)size, (unsigned long long)max_size);
            return -EINVAL;
        }
        e->size = size;
        if (nl - (sp + 1) > IMGSRC_NAME_MAX || nl == sp + 1) {
            seterr(err, errcap, "index line %zu: bad file name", line);
            return -EINVAL;
        }
        memcpy(e->name, sp + 1, (size_t)(nl - (sp + 1)));
        e->name[nl - (sp + 1)] = '\0';
        if (strlen(e->name) != (size_t)(nl - (sp + 1)) || !imgsrc_name_ok(e->name)) {
            seterr(err, errcap, "index line %zu: bad file name", line);
            return -EINVAL;
        }
        if (*n > 0 && strcmp(v[*n - 1].name, e->name) >= 0) {
            seterr(err, errcap, "index line %zu: '%s' is listed twice or out of order", line,
                   e->name);
            return -EINVAL;
        }
        (*n)++;
        pos += ll + 1;
    }
    return 0;
}

size_t imgsrc_index_format(const struct imgsrc_entry *v, size_t n, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "%s", IMGSRC_INDEX_HEADER);

    if (len >= cap)
        return 0;
    for (size_t i = 0; i < n; i++) {
        int k = snprintf(buf + len, cap - len, "%s %llu %s\n", v[i].sha,
                         (unsigned long long)v[i].size, v[i].name);
        if (k < 0 || (size_t)k >= cap - len)
            return 0;
        len += (size_t)k;
    }
    return len;
}

/* ---- hashing ---- */

struct hasher {
    mbedtls_md_context_t md;
};

static int hasher_init(struct hasher *h)
{
    mbedtls_md_init(&h->md);
    if (mbedtls_md_setup(&h->md, mbedtls_md_info_from_type(MBEDTLS_MD_SHA256), 0) ||
        mbedtls_md_starts(&h->md)) {
        mbedtls_md_free(&h->md);
        return -ENOMEM;
    }
    return 0;
}

static void hasher_hex(struct hasher *h, char hex[IMGSRC_HEX_LEN + 1])
{
    unsigned char d[32];

    mbedtls_md_finish(&h->md, d);
    mbedtls_md_free(&h->md);
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
}

static int hash_fd(int fd, char hex[IMGSRC_HEX_LEN + 1], uint64_t *size)
{
    struct hasher h;
    unsigned char *b = malloc(CHUNK);
    uint64_t total = 0;
    ssize_t k;

    if (!b || hasher_init(&h)) {
        free(b);
        return -ENOMEM;
    }
    while ((k = read(fd, b, CHUNK)) > 0) {
        mbedtls_md_update(&h.md, b, (size_t)k);
        total += (uint64_t)k;
    }
    free(b);
    if (k < 0) {
        int e = -errno;
        mbedtls_md_free(&h.md);
        return e;
    }
    hasher_hex(&h, hex);
    *size = total;
    return 0;
}

/* A file's hash, with what tells whether the file changed since it was taken. */
struct hc_ent {
    char name[IMGSRC_NAME_MAX + 1];
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    char sha[IMGSRC_HEX_LEN + 1];
};

/* A blob that failed its check: not fetched again (a corrupt 2 GiB blob would be read
 * every interval) until it changes (a directory source) or retry_s passed. */
struct refused {
    char sha[IMGSRC_HEX_LEN + 1];
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    time_t at;
    char why[192];
};

struct imgsrc_hcache {
    struct hc_ent v[IMGSRC_FILES_MAX];
    size_t n, next; /* next: the slot a new name takes when full */
    struct refused ref[IMGSRC_FILES_MAX];
    size_t nref, nextref;
};

struct imgsrc_hcache *imgsrc_hcache_new(void)
{
    return calloc(1, sizeof(struct imgsrc_hcache));
}

void imgsrc_hcache_free(struct imgsrc_hcache *c)
{
    free(c);
}

/* name's entry, or NULL. */
static struct hc_ent *hc_find(struct imgsrc_hcache *c, const char *name)
{
    for (size_t i = 0; i < c->n; i++)
        if (strcmp(c->v[i].name, name) == 0)
            return &c->v[i];
    return NULL;
}

/* Keep name's hash with its file's identity, in e (its entry) or a new slot (the oldest
 * when full). */
static void hc_store(struct imgsrc_hcache *c, struct hc_ent *e, const char *name,
                     const struct stat *st, const char *hex)
{
    if (!e)
        e = c->n < IMGSRC_FILES_MAX ? &c->v[c->n++] : &c->v[c->next++ % IMGSRC_FILES_MAX];
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->dev = st->st_dev;
    e->ino = st->st_ino;
    e->size = st->st_size;
    e->mtime = st->st_mtim;
    memcpy(e->sha, hex, sizeof(e->sha));
}

static bool same_file(const struct hc_ent *e, const struct stat *st)
{
    return e->dev == st->st_dev && e->ino == st->st_ino && e->size == st->st_size &&
           e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec;
}

int imgsrc_hash(struct imgsrc_hcache *c, const char *dir, const char *name,
                char hex[IMGSRC_HEX_LEN + 1], uint64_t *size)
{
    char path[4096 + IMGSRC_NAME_MAX + 2];
    struct stat st, st2;
    struct hc_ent *e;
    int fd, r;

    if (!imgsrc_name_ok(name) ||
        snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return -EINVAL;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
        return -errno;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
        close(fd);
        return -EINVAL;
    }
    e = hc_find(c, name);
    if (e && same_file(e, &st)) {
        close(fd);
        memcpy(hex, e->sha, sizeof(e->sha));
        *size = (uint64_t)st.st_size;
        return 0;
    }
    r = hash_fd(fd, hex, size);
    /* Changed while it was read: the hash is of no one file, so it is not kept. */
    if (!r &&
        (fstat(fd, &st2) || st2.st_size != st.st_size || st2.st_mtim.tv_sec != st.st_mtim.tv_sec ||
         st2.st_mtim.tv_nsec != st.st_mtim.tv_nsec || *size != (uint64_t)st.st_size))
        r = -EAGAIN;
    close(fd);
    if (r)
        return r;
    hc_store(c, e, name, &st, hex);
    return 0;
}

/* Record dir/name's hash as known (it was just checked while written). */
static void hcache_put(struct imgsrc_hcache *c, const char *dir, const char *name, const char *hex)
{
    char path[4096 + IMGSRC_NAME_MAX + 2];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (stat(path, &st) || !S_ISREG(st.st_mode))
        return;
    hc_store(c, hc_find(c, name), name, &st, hex);
}

/* ---- writing a file: holes kept, hashed on the way ---- */

struct writer {
    int fd;
    uint64_t got, limit;
    struct hasher h;
    bool over;
};

static bool all_zero(const unsigned char *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

/* Append n bytes: counted and hashed; zero blocks of 4 KiB become holes (an image is
 * mostly holes: 68 MiB of data in a 2 GiB minimal.ext4). 0, or -errno; -EFBIG past limit. */
static int writer_put(struct writer *w, const unsigned char *b, size_t n)
{
    if (n > w->limit - w->got) {
        w->over = true;
        return -EFBIG;
    }
    mbedtls_md_update(&w->h.md, b, n);
    while (n) {
        size_t k = n < 4096 ? n : 4096;
        if (all_zero(b, k)) {
            if (lseek(w->fd, (off_t)k, SEEK_CUR) < 0)
                return -errno;
        } else {
            size_t off = 0;
            while (off < k) {
                ssize_t m = write(w->fd, b + off, k - off);
                if (m < 0 && errno == EINTR)
                    continue;
                if (m <= 0)
                    return m < 0 ? -errno : -EIO;
                off += (size_t)m;
            }
        }
        b += k;
        n -= k;
        w->got += k;
    }
    return 0;
}

/* The length holes left at the end, then the bytes on disk. 0, or -errno. */
static int writer_end(struct writer *w)
{
    if (ftruncate(w->fd, (off_t)w->got) || fsync(w->fd))
        return -errno;
    return 0;
}

/* ---- reading a source: a directory or HTTP ---- */

int imgsrc_where_parse(const char *spec, struct imgsrc_where *w, char *err, size_t errcap)
{
    memset(w, 0, sizeof(*w));
    if (!spec || !*spec) {
        seterr(err, errcap, "image_source is empty");
        return -EINVAL;
    }
    if (strncmp(spec, "http://", 7) == 0) {
        const char *h = spec + 7, *slash = strchr(h, '/'), *end = slash ? slash : h + strlen(h);
        const char *colon = memchr(h, ':', (size_t)(end - h));
        const char *hend = colon ? colon : end;
        size_t pl;

        w->http = true;
        if (hend == h || (size_t)(hend - h) >= sizeof(w->host))
            goto bad;
        for (const char *c = h; c < hend; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' || *c == '_'))
                goto bad;
        memcpy(w->host, h, (size_t)(hend - h));
        if (colon) {
            unsigned long pn = 0;
            if (end - colon < 2 || end - colon > 6)
                goto bad;
            for (const char *c = colon + 1; c < end; c++) {
                if (*c < '0' || *c > '9')
                    goto bad;
                pn = pn * 10 + (unsigned long)(*c - '0');
            }
            if (pn < 1 || pn > 65535)
                goto bad;
            snprintf(w->port, sizeof(w->port), "%lu", pn);
        } else {
            snprintf(w->port, sizeof(w->port), "80");
        }
        pl = slash ? strlen(slash) : 0;
        while (pl && slash[pl - 1] == '/')
            pl--;
        if (pl >= sizeof(w->path) - 200)
            goto bad;
        for (size_t i = 0; i < pl; i++)
            if ((unsigned char)slash[i] <= ' ' || slash[i] == '?' || slash[i] == '#' ||
                (unsigned char)slash[i] >= 0x7f)
                goto bad;
        memcpy(w->path, slash ? slash : "", pl);
        w->path[pl] = '\0';
        return 0;
    }
    if (spec[0] != '/' || strlen(spec) >= sizeof(w->path) - 200)
        goto bad;
    snprintf(w->path, sizeof(w->path), "%s", spec);
    return 0;
bad:
    seterr(err, errcap,
           "image_source '%.200s': want an absolute directory or http://HOST[:PORT][/PATH]", spec);
    return -EINVAL;
}

typedef int (*sink_fn)(void *ctx, const unsigned char *b, size_t n);

/* A socket connected to the source, with timeout_s on every send and read. */
static int http_connect(const struct imgsrc_opts *o, char *err, size_t errcap)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    struct timeval tv = {.tv_sec = o->timeout_s};
    int fd = -1, r = getaddrinfo(o->where.host, o->where.port, &hints, &ai);

    if (r) {
        seterr(err, errcap, "%s: %s", o->where.host, gai_strerror(r));
        return -EHOSTUNREACH;
    }
    for (struct addrinfo *p = ai; p && fd < 0; p = p->ai_next) {
        fd = socket(p->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            continue;
        if (connect(fd, p->ai_addr, p->ai_addrlen) && errno != EINPROGRESS) {
            close(fd);
            fd = -1;
            continue;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        int soerr = 0;
        socklen_t sl = sizeof(soerr);
        if (poll(&pf, 1, (int)o->timeout_s * 1000) != 1 ||
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) || soerr) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) {
        seterr(err, errcap, "cannot connect to %s:%s", o->where.host, o->where.port);
        return -ECONNREFUSED;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    return fd;
}

#define HEAD_MAX 8192

/* GET the source's rel ("index", "blobs/..."): the body, at most max bytes, to sink.
 * 0 and *got, or -errno with err. Only a 200 with Content-Length (or a body the server
 * ends by closing) is taken; chunked answers are refused. */
static int http_get(const struct imgsrc_opts *o, const char *rel, uint64_t max, sink_fn sink,
                    void *ctx, uint64_t *got, char *err, size_t errcap)
{
    char req[4096 + 512], *head = malloc(HEAD_MAX + 1), *eoh = NULL, *p;
    unsigned char *b = malloc(CHUNK);
    size_t hl = 0, rl;
    uint64_t clen = UINT64_MAX, n = 0;
    int fd = -1, r = -EPROTO, status;
    ssize_t k;

    *got = 0;
    if (!head || !b) {
        r = -ENOMEM;
        goto out;
    }
    rl = (size_t)snprintf(req, sizeof(req),
                          "GET %s/%s HTTP/1.1\r\nHost: %s:%s\r\nUser-Agent: warrend\r\n"
                          "Accept-Encoding: identity\r\nConnection: close\r\n\r\n",
                          o->where.path, rel, o->where.host, o->where.port);
    if ((fd = http_connect(o, err, errcap)) < 0) {
        r = fd;
        goto out;
    }
    for (size_t off = 0; off < rl;) {
        k = send(fd, req + off, rl - off, MSG_NOSIGNAL);
        if (k <= 0) {
            seterr(err, errcap, "GET %s: send: %s", rel, k < 0 ? strerror(errno) : "closed");
            r = -EIO;
            goto out;
        }
        off += (size_t)k;
    }
    while (!eoh) {
        if (hl >= HEAD_MAX) {
            seterr(err, errcap, "GET %s: answer head over %u bytes", rel, HEAD_MAX);
            goto out;
        }
        k = recv(fd, head + hl, HEAD_MAX - hl, 0);
        if (k <= 0) {
            seterr(err, errcap, "GET %s: %s before the answer's head ended", rel,
                   k < 0 ? strerror(errno) : "closed");
            r = -EIO;
            goto out;
        }
        hl += (size_t)k;
        head[hl] = '\0';
        if (memchr(head, '\0', hl)) {
            seterr(err, errcap, "GET %s: a NUL in the answer's head", rel);
            goto out;
        }
        eoh = strstr(head, "\r\n\r\n");
    }
    if (sscanf(head, "HTTP/1.%*1[01] %3d", &status) != 1) {
        seterr(err, errcap, "GET %s: not an HTTP/1 answer", rel);
        goto out;
    }
    if (status != 200) {
        seterr(err, errcap, "GET %s: HTTP %d", rel, status);
        r = status == 404 ? -ENOENT : -EIO;
        goto out;
    }
    *eoh = '\0';
    for (p = strstr(head, "\r\n"); p; p = strstr(p + 2, "\r\n")) {
        const char *h = p + 2;
        if (strncasecmp(h, "Transfer-Encoding:", 18) == 0) {
            seterr(err, errcap, "GET %s: a Transfer-Encoding is not read", rel);
            goto out;
        }
        if (strncasecmp(h, "Content-Length:", 15) == 0) {
            char *end;
            unsigned long long v;
            h += 15;
            while (*h == ' ' || *h == '\t')
                h++;
            errno = 0;
            v = strtoull(h, &end, 10);
            if (errno || end == h || *h == '-' || (*end && *end != '\r' && *end != ' ')) {
                seterr(err, errcap, "GET %s: bad Content-Length", rel);
                goto out;
            }
            clen = v;
        }
    }
    if (clen != UINT64_MAX && clen > max) {
        seterr(err, errcap, "GET %s: %llu bytes, over the %llu expected", rel,
               (unsigned long long)clen, (unsigned long long)max);
        r = -EFBIG;
        goto out;
    }
    eoh += 4;
    {
        size_t rest = hl - (size_t)(eoh - head);
        if (rest) {
            if (rest > max || (clen != UINT64_MAX && rest > clen)) {
                seterr(err, errcap, "GET %s: more bytes than expected", rel);
                r = -EFBIG;
                goto out;
            }
            if ((r = sink(ctx, (unsigned char *)eoh, rest))) {
                seterr(err, errcap, "GET %s: %s", rel, strerror(-r));
                goto out;
            }
            n = rest;
        }
    }
    while (clen == UINT64_MAX || n < clen) {
        k = recv(fd, b, CHUNK, 0);
        if (k < 0) {
            seterr(err, errcap, "GET %s: %s after %llu bytes", rel,
                   errno == EAGAIN ? "timed out" : strerror(errno), (unsigned long long)n);
            r = -EIO;
            goto out;
        }
        if (k == 0) {
            if (clen == UINT64_MAX)
                break;
            seterr(err, errcap, "GET %s: closed after %llu of %llu bytes", rel,
                   (unsigned long long)n, (unsigned long long)clen);
            r = -EIO;
            goto out;
        }
        if ((uint64_t)k > max - n || (clen != UINT64_MAX && (uint64_t)k > clen - n)) {
            seterr(err, errcap, "GET %s: more bytes than expected", rel);
            r = -EFBIG;
            goto out;
        }
        if ((r = sink(ctx, b, (size_t)k))) {
            seterr(err, errcap, "GET %s: %s", rel, strerror(-r));
            goto out;
        }
        n += (uint64_t)k;
    }
    *got = n;
    r = 0;
out:
    if (fd >= 0)
        close(fd);
    free(head);
    free(b);
    return r;
}

/* Read the source's rel, at most max bytes, to sink. 0 and *got, or -errno with err. */
static int src_get(const struct imgsrc_opts *o, const char *rel, uint64_t max, sink_fn sink,
                   void *ctx, uint64_t *got, char *err, size_t errcap)
{
    char path[4096 + 256];
    unsigned char *b;
    struct stat st;
    ssize_t k;
    int fd, r = 0;

    if (o->where.http)
        return http_get(o, rel, max, sink, ctx, got, err, errcap);
    *got = 0;
    snprintf(path, sizeof(path), "%s/%s", o->where.path, rel);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        r = -errno;
        seterr(err, errcap, "%s: %s", path, strerror(errno));
        return r;
    }
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        seterr(err, errcap, "%s: not a regular file of at most %llu bytes", path,
               (unsigned long long)max);
        close(fd);
        return -EFBIG;
    }
    if (!(b = malloc(CHUNK))) {
        close(fd);
        return -ENOMEM;
    }
    while ((k = read(fd, b, CHUNK)) > 0) {
        if ((uint64_t)k > max - *got) {
            seterr(err, errcap, "%s: grew past %llu bytes", path, (unsigned long long)max);
            r = -EFBIG;
            break;
        }
        if ((r = sink(ctx, b, (size_t)k))) {
            seterr(err, errcap, "%s: %s", path, strerror(-r));
            break;
        }
        *got += (uint64_t)k;
    }
    if (k < 0) {
        r = -errno;
        seterr(err, errcap, "%s: %s", path, strerror(errno));
    }
    free(b);
    close(fd);
    return r;
}

struct membuf {
    char *b;
    size_t n, cap;
};

static int mem_sink(void *ctx, const unsigned char *b, size_t n)
{
    struct membuf *m = ctx;

    if (n > m->cap - m->n)
        return -EFBIG;
    memcpy(m->b + m->n, b, n);
    m->n += n;
    return 0;
}

static int file_sink(void *ctx, const unsigned char *b, size_t n)
{
    return writer_put(ctx, b, n);
}

/* ---- a fill ---- */

/* Fetch e's blob into image_dir and link it in under e's name once its size and hash are
 * the index's. 0, or -errno with why. */
static int install(const struct imgsrc_opts *o, const struct imgsrc_entry *e, char *why, size_t cap)
{
    char tmp[4096 + 128], dst[4096 + 128], rel[32 + IMGSRC_HEX_LEN], hex[IMGSRC_HEX_LEN + 1];
    struct writer w = {.limit = e->size};
    uint64_t got = 0;
    int r;

    snprintf(rel, sizeof(rel), "blobs/sha256-%s", e->sha);
    snprintf(dst, sizeof(dst), "%s/%s", o->image_dir, e->name);
    snprintf(tmp, sizeof(tmp), "%s/.imgsrc-%s.XXXXXX", o->image_dir, e->name);
    if ((w.fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        r = -errno;
        seterr(why, cap, "cannot create a file in %s: %s", o->image_dir, strerror(errno));
        return r;
    }
    if (hasher_init(&w.h)) {
        close(w.fd);
        unlink(tmp);
        return -ENOMEM;
    }
    r = src_get(o, rel, e->size, file_sink, &w, &got, why, cap);
    hasher_hex(&w.h, hex);
    if (!r && w.got != e->size) {
        seterr(why, cap, "blob %.12s: %llu bytes, the index says %llu", e->sha,
               (unsigned long long)w.got, (unsigned long long)e->size);
        r = -EBADMSG;
    } else if (!r && strcmp(hex, e->sha) != 0) {
        seterr(why, cap, "blob %.12s: its content's sha256 is %.12s..., not the index's", e->sha,
               hex);
        r = -EBADMSG;
    } else if (w.over) {
        seterr(why, cap, "blob %.12s: more than the index's %llu bytes", e->sha,
               (unsigned long long)e->size);
        r = -EBADMSG;
    }
    if (!r && (fchmod(w.fd, 0644) || (r = writer_end(&w)))) {
        r = r ? r : -errno;
        seterr(why, cap, "writing %s: %s", tmp, strerror(-r));
    }
    close(w.fd);
    /* link() never replaces: a file put there meanwhile stays, and is then compared. */
    if (!r && link(tmp, dst)) {
        r = -errno;
        seterr(why, cap, "cannot install %s: %s", dst, strerror(errno));
    }
    unlink(tmp);
    return r;
}

/* The blob's identity in a directory source (zeroes over HTTP: time alone decides). */
static void blob_stat(const struct imgsrc_opts *o, const char *sha, struct stat *st)
{
    char path[4096 + 128];

    memset(st, 0, sizeof(*st));
    if (o->where.http)
        return;
    snprintf(path, sizeof(path), "%s/blobs/sha256-%s", o->where.path, sha);
    if (stat(path, st))
        memset(st, 0, sizeof(*st));
}

static struct refused *refused_find(struct imgsrc_hcache *c, const char *sha)
{
    for (size_t i = 0; i < c->nref; i++)
        if (strcmp(c->ref[i].sha, sha) == 0)
            return &c->ref[i];
    return NULL;
}

/* Was this blob refused, unchanged since, and not long ago? Then why it was. */
static const char *refused_still(const struct imgsrc_opts *o, struct imgsrc_hcache *c,
                                 const char *sha)
{
    struct refused *f = refused_find(c, sha);
    struct stat st;

    if (!f)
        return NULL;
    blob_stat(o, sha, &st);
    if (st.st_dev != f->dev || st.st_ino != f->ino || st.st_size != f->size ||
        st.st_mtim.tv_sec != f->mtime.tv_sec || st.st_mtim.tv_nsec != f->mtime.tv_nsec ||
        time(NULL) - f->at >= (time_t)o->retry_s) {
        f->sha[0] = '\0'; /* tried again now */
        return NULL;
    }
    return f->why;
}

static void refused_add(struct imgsrc_hcache *c, const char *sha, const char *why,
                        const struct stat *before)
{
    struct refused *f = refused_find(c, sha);

    if (!f)
        f = refused_find(c, "");
    if (!f)
        f = c->nref < IMGSRC_FILES_MAX ? &c->ref[c->nref++]
                                       : &c->ref[c->nextref++ % IMGSRC_FILES_MAX];
    snprintf(f->sha, sizeof(f->sha), "%s", sha);
    f->dev = before->st_dev;
    f->ino = before->st_ino;
    f->size = before->st_size;
    f->mtime = before->st_mtim;
    f->at = time(NULL);
    snprintf(f->why, sizeof(f->why), "%s", why);
}

void imgsrc_fill(const struct imgsrc_opts *o, struct imgsrc_hcache *c, struct imgsrc_report *r)
{
    struct imgsrc_entry *v = calloc(IMGSRC_FILES_MAX, sizeof(*v));
    struct membuf m = {.b = malloc(IMGSRC_INDEX_MAX), .cap = IMGSRC_INDEX_MAX};
    uint64_t got;
    size_t n = 0;

    memset(r, 0, sizeof(*r));
    if (!v || !m.b) {
        seterr(r->error, sizeof(r->error), "out of memory");
        goto out;
    }
    if (src_get(o, "index", IMGSRC_INDEX_MAX, mem_sink, &m, &got, r->error, sizeof(r->error)) ||
        imgsrc_index_parse(m.b, m.n, o->max_bytes, v, IMGSRC_FILES_MAX, &n, r->error,
                           sizeof(r->error)))
        goto out;
    r->indexed = true;
    r->n = n;
    for (size_t i = 0; i < n; i++) {
        struct imgsrc_file *f = &r->files[i];
        char hex[IMGSRC_HEX_LEN + 1];
        uint64_t size;
        int h;

        f->e = v[i];
        h = imgsrc_hash(c, o->image_dir, v[i].name, hex, &size);
        const char *was;
        if (h == -ENOENT && (was = refused_still(o, c, v[i].sha))) {
            snprintf(f->why, sizeof(f->why), "%s", was);
        } else if (h == -ENOENT) {
            struct stat before;
            int k;
            blob_stat(o, v[i].sha, &before);
            if ((k = install(o, &v[i], f->why, sizeof(f->why))) == -EBADMSG)
                refused_add(c, v[i].sha, f->why, &before);
            if (k == 0) {
                /* Its hash was checked as it was written: not read a second time. */
                hcache_put(c, o->image_dir, v[i].name, v[i].sha);
                r->installed++;
                h = imgsrc_hash(c, o->image_dir, v[i].name, hex, &size);
            }
        }
        if (h == 0)
            f->state = strcmp(hex, v[i].sha) == 0 && size == v[i].size ? IMGSRC_OK : IMGSRC_DIFFERS;
        else
            f->state = IMGSRC_MISSING;
        if (f->state == IMGSRC_DIFFERS)
            seterr(f->why, sizeof(f->why),
                   "present with sha256 %.12s...: not replaced (sandboxes, pools or snapshots "
                   "may use it)",
                   hex);
        else if (f->state == IMGSRC_MISSING && !f->why[0])
            seterr(f->why, sizeof(f->why), "cannot read it: %s", strerror(-h));
        else if (f->state == IMGSRC_OK)
            f->why[0] = '\0';
    }
out:
    free(v);
    free(m.b);
}

/* ---- publishing ---- */

static int mkdir_one(const char *p)
{
    return mkdir(p, 0755) && errno != EEXIST ? -errno : 0;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct imgsrc_entry *)a)->name, ((const struct imgsrc_entry *)b)->name);
}

/* Copy image_dir/e->name to its blob, unless there; the copy's hash must still be e's. */
static int publish_blob(const char *image_dir, const char *out_dir, const struct imgsrc_entry *e,
                        char *err, size_t errcap)
{
    char src[4096 + 128], dst[4096 + 128], tmp[4096 + 128], hex[IMGSRC_HEX_LEN + 1];
    struct writer w = {.limit = UINT64_MAX};
    unsigned char *b;
    struct stat st;
    ssize_t k;
    int fd, r = 0;

    snprintf(dst, sizeof(dst), "%s/blobs/sha256-%s", out_dir, e->sha);
    if (stat(dst, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == e->size)
        return 0;
    snprintf(src, sizeof(src), "%s/%s", image_dir, e->name);
    snprintf(tmp, sizeof(tmp), "%s/blobs/.tmp-%.16s.XXXXXX", out_dir, e->sha);
    if ((fd = open(src, O_RDONLY | O_CLOEXEC)) < 0) {
        seterr(err, errcap, "%s: %s", src, strerror(errno));
        return -errno;
    }
    if ((w.fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        r = -errno;
        seterr(err, errcap, "cannot create %s: %s", tmp, strerror(errno));
        close(fd);
        return r;
    }
    if (!(b = malloc(CHUNK)) || hasher_init(&w.h)) {
        free(b);
        close(fd);
        close(w.fd);
        unlink(tmp);
        return -ENOMEM;
    }
    while ((k = read(fd, b, CHUNK)) > 0)
        if ((r = writer_put(&w, b, (size_t)k)))
            break;
    if (k < 0)
        r = -errno;
    free(b);
    close(fd);
    hasher_hex(&w.h, hex);
    if (!r && (strcmp(hex, e->sha) || w.got != e->size))
        r = -EAGAIN; /* changed while published */
    if (!r && !(r = writer_end(&w)) && (fchmod(w.fd, 0644) || rename(tmp, dst)))
        r = -errno;
    close(w.fd);
    if (r) {
        unlink(tmp);
        seterr(err, errcap, "publishing %s: %s", e->name,
               r == -EAGAIN ? "it changed while read" : strerror(-r));
    }
    return r;
}

int imgsrc_publish(const char *image_dir, const char *out_dir, unsigned *nfiles, bool *changed,
                   char *err, size_t errcap)
{
    struct imgsrc_entry *v = calloc(IMGSRC_FILES_MAX, sizeof(*v));
    struct imgsrc_hcache *c = imgsrc_hcache_new();
    char path[4096 + 64], tmp[4096 + 64], *idx = malloc(IMGSRC_INDEX_MAX), *old = NULL;
    size_t n = 0, len;
    struct dirent *de;
    DIR *d = NULL;
    int r = -ENOMEM, fd;

    *changed = false;
    *nfiles = 0;
    if (!v || !c || !idx)
        goto out;
    snprintf(path, sizeof(path), "%s/blobs", out_dir);
    if ((r = mkdir_one(out_dir)) || (r = mkdir_one(path))) {
        seterr(err, errcap, "cannot create %s: %s", path, strerror(-r));
        goto out;
    }
    if (!(d = opendir(image_dir))) {
        r = -errno;
        seterr(err, errcap, "%s: %s", image_dir, strerror(errno));
        goto out;
    }
    while ((de = readdir(d)) != NULL) {
        if (!imgsrc_name_ok(de->d_name))
            continue;
        if (n >= IMGSRC_FILES_MAX) {
            seterr(err, errcap, "%s: more than %u files", image_dir, IMGSRC_FILES_MAX);
            r = -E2BIG;
            goto out;
        }
        r = imgsrc_hash(c, image_dir, de->d_name, v[n].sha, &v[n].size);
        if (r == -EINVAL)
            continue; /* not a regular file */
        if (r) {
            seterr(err, errcap, "%s/%s: %s", image_dir, de->d_name, strerror(-r));
            goto out;
        }
        snprintf(v[n].name, sizeof(v[n].name), "%.64s", de->d_name);
        n++;
    }
    qsort(v, n, sizeof(v[0]), name_cmp);
    for (size_t i = 0; i < n; i++)
        if ((r = publish_blob(image_dir, out_dir, &v[i], err, errcap)))
            goto out;
    if (!(len = imgsrc_index_format(v, n, idx, IMGSRC_INDEX_MAX))) {
        r = -E2BIG;
        seterr(err, errcap, "the index does not fit");
        goto out;
    }
    *nfiles = (unsigned)n;
    snprintf(path, sizeof(path), "%s/index", out_dir);
    if ((old = malloc(IMGSRC_INDEX_MAX + 1)) && (fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
        ssize_t k = read(fd, old, IMGSRC_INDEX_MAX + 1);
        close(fd);
        if (k == (ssize_t)len && memcmp(old, idx, len) == 0) {
            r = 0; /* the same images: nothing changes */
            goto out;
        }
    }
    snprintf(tmp, sizeof(tmp), "%s/.index.XXXXXX", out_dir);
    if ((fd = mkostemp(tmp, O_CLOEXEC)) < 0) {
        r = -errno;
        seterr(err, errcap, "cannot create %s: %s", tmp, strerror(errno));
        goto out;
    }
    r = write(fd, idx, len) == (ssize_t)len && !fchmod(fd, 0644) && !fsync(fd) ? 0 : -EIO;
    close(fd);
    if (r || rename(tmp, path)) {
        r = r ? r : -errno;
        unlink(tmp);
        seterr(err, errcap, "cannot write %s: %s", path, strerror(-r));
        goto out;
    }
    *changed = true;
    r = 0;
out:
    if (r == -ENOMEM)
        seterr(err, errcap, "out of memory");
    if (d)
        closedir(d);
    free(v);
    free(old);
    free(idx);
    imgsrc_hcache_free(c);
    return r;
}

/* ---- warrend's side ---- */

struct images_src {
    struct ev_loop *loop;
    ev_timer tick;
    ev_async wake;
    struct imgsrc_opts o;
    char image_dir[4096];
    bool has_source, want, busy;
    pthread_t thread;
    struct imgsrc_hcache *hc; /* the thread's */
    /* The thread's outcome: written by it, read by the loop after the join. */
    struct imgsrc_report out;
    struct hc_ent out_h[IMGSRC_FILES_MAX];
    size_t out_nh;
    /* The loop's copy. */
    bool passed; /* a pass with a source ended */
    struct imgsrc_report rep;
    struct hc_ent h[IMGSRC_FILES_MAX];
    size_t nh;
};

/* On the thread: the fill (with a source), then every file of image_dir hashed. */
static void *pass(void *arg)
{
    struct images_src *s = arg;
    struct dirent *de;
    DIR *d;

    /* Hashing gigabytes must not starve the VMs' QEMUs: this thread yields to them. */
    (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
    if (s->has_source)
        imgsrc_fill(&s->o, s->hc, &s->out);
    s->out_nh = 0;
    if ((d = opendir(s->image_dir))) {
        while ((de = readdir(d)) != NULL && s->out_nh < IMGSRC_FILES_MAX) {
            struct hc_ent *l = &s->out_h[s->out_nh];
            char path[4096 + IMGSRC_NAME_MAX + 2];
            size_t len = strlen(de->d_name);
            uint64_t size;
            struct stat st;
            /* What a sandbox boots: templates, the kernel and the initramfs (image_dir
             * may hold build leftovers such as a template's tree.tar, not worth reading). */
            bool boots = (len > 5 && !strcmp(de->d_name + len - 5, ".ext4")) ||
                         !strcmp(de->d_name, "vmlinux") || !strcmp(de->d_name, "initramfs.cpio");
            if (!boots || !imgsrc_name_ok(de->d_name) ||
                imgsrc_hash(s->hc, s->image_dir, de->d_name, l->sha, &size))
                continue;
            snprintf(path, sizeof(path), "%s/%.64s", s->image_dir, de->d_name);
            if (stat(path, &st) || (uint64_t)st.st_size != size)
                continue;
            snprintf(l->name, sizeof(l->name), "%.64s", de->d_name);
            l->dev = st.st_dev;
            l->ino = st.st_ino;
            l->size = st.st_size;
            l->mtime = st.st_mtim;
            s->out_nh++;
        }
        closedir(d);
    }
    ev_async_send(s->loop, &s->wake);
    return NULL;
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    struct images_src *s = w->data;
    const struct imgsrc_report *o = &s->out;

    (void)loop;
    (void)revents;
    if (!s->busy)
        return;
    pthread_join(s->thread, NULL);
    s->busy = false;
    memcpy(s->h, s->out_h, sizeof(s->h));
    s->nh = s->out_nh;
    if (!s->has_source)
        return;
    /* Said once per change: a source that stays broken does not fill the log. */
    if (!o->indexed && (!s->passed || strcmp(o->error, s->rep.error) != 0))
        LOG(LOG_WARN, "images: source %s: %s", s->o.where.http ? "(http)" : s->o.where.path,
            o->error);
    for (size_t i = 0; i < o->n; i++) {
        const struct imgsrc_file *f = &o->files[i];
        bool same = false;
        for (size_t j = 0; j < s->rep.n; j++)
            if (strcmp(s->rep.files[j].e.name, f->e.name) == 0)
                same = s->rep.files[j].state == f->state && !strcmp(s->rep.files[j].why, f->why);
        if (!same && f->state != IMGSRC_OK)
            LOG(LOG_WARN, "images: %s (sha256 %.12s...) not installed: %s", f->e.name, f->e.sha,
                f->why);
    }
    if (o->installed)
        LOG(LOG_INFO, "images: installed %u file(s) from the source", o->installed);
    if (o->indexed && (!s->passed || images_src_lacking(s))) {
        unsigned lacking = 0;
        for (size_t i = 0; i < o->n; i++)
            lacking += o->files[i].state != IMGSRC_OK;
        if (!lacking)
            LOG(LOG_INFO, "images: all %zu file(s) of the source are here", o->n);
    }
    memcpy(&s->rep, o, sizeof(s->rep));
    s->passed = true;
}

static void start_pass(struct images_src *s)
{
    int r;

    if (s->busy)
        return;
    s->want = false;
    r = pthread_create(&s->thread, NULL, pass, s);
    if (r) {
        LOG(LOG_WARN, "images: cannot start a thread: %s", strerror(r));
        return;
    }
    s->busy = true;
}

static void on_tick(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct images_src *s = w->data;

    (void)loop;
    (void)revents;
    if (s->has_source || s->want)
        start_pass(s);
}

int images_src_start(struct ev_loop *loop, const struct srv_config *cfg, struct images_src **out,
                     char *err, size_t errcap)
{
    struct images_src *s = calloc(1, sizeof(*s));
    int r;

    if (!s)
        return -ENOMEM;
    s->has_source = cfg->image_source && cfg->image_source[0];
    if (s->has_source && (r = imgsrc_where_parse(cfg->image_source, &s->o.where, err, errcap))) {
        free(s);
        return r;
    }
    if (!(s->hc = imgsrc_hcache_new())) {
        free(s);
        return -ENOMEM;
    }
    snprintf(s->image_dir, sizeof(s->image_dir), "%s", cfg->image_dir);
    s->o.image_dir = s->image_dir;
    s->o.max_bytes = cfg->image_source_max_bytes;
    s->o.timeout_s = cfg->image_source_timeout_s;
    /* A refused blob is read again after ten intervals (at least ten minutes): a source
     * being repaired is picked up, a broken one costs little. */
    s->o.retry_s = 10 * cfg->image_source_period_s < 600 ? 600 : 10 * cfg->image_source_period_s;
    s->loop = loop;
    ev_async_init(&s->wake, on_wake);
    s->wake.data = s;
    ev_async_start(loop, &s->wake);
    ev_timer_init(&s->tick, on_tick, 0., (double)cfg->image_source_period_s);
    s->tick.data = s;
    ev_timer_start(loop, &s->tick);
    if (s->has_source)
        LOG(LOG_INFO, "images: filling %s from %s every %u s", s->image_dir, cfg->image_source,
            cfg->image_source_period_s);
    *out = s;
    return 0;
}

void images_src_stop(struct images_src *s)
{
    if (!s)
        return;
    ev_timer_stop(s->loop, &s->tick);
    ev_async_stop(s->loop, &s->wake);
    if (s->busy)
        pthread_join(s->thread, NULL);
    imgsrc_hcache_free(s->hc);
    free(s);
}

bool images_src_lacking(const struct images_src *s)
{
    if (!s || !s->has_source)
        return false;
    if (!s->passed || !s->rep.indexed)
        return true;
    for (size_t i = 0; i < s->rep.n; i++)
        if (s->rep.files[i].state != IMGSRC_OK)
            return true;
    return false;
}

void images_src_want_hashes(struct images_src *s)
{
    if (!s || s->busy)
        return;
    s->want = true;
    /* Now rather than at the next tick: the first list after a start names its hashes as
     * soon as they are read. */
    ev_feed_event(s->loop, &s->tick, EV_TIMER);
}

bool images_src_sha(const struct images_src *s, const char *name, char hex[IMGSRC_HEX_LEN + 1])
{
    char path[4096 + IMGSRC_NAME_MAX + 2];
    struct stat st;

    if (!s)
        return false;
    for (size_t i = 0; i < s->nh; i++) {
        const struct hc_ent *l = &s->h[i];
        if (strcmp(l->name, name) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", s->image_dir, name);
        if (stat(path, &st) || st.st_dev != l->dev || st.st_ino != l->ino ||
            st.st_size != l->size || st.st_mtim.tv_sec != l->mtime.tv_sec ||
            st.st_mtim.tv_nsec != l->mtime.tv_nsec)
            return false;
        memcpy(hex, l->sha, IMGSRC_HEX_LEN + 1);
        return true;
    }
    return false;
}

void *images_src_json(const struct images_src *s)
{
    json_t *o, *missing;

    if (!s || !s->has_source)
        return NULL;
    if (!(missing = json_array()))
        return NULL;
    for (size_t i = 0; s->passed && i < s->rep.n; i++) {
        const struct imgsrc_file *f = &s->rep.files[i];
        if (f->state == IMGSRC_OK)
            continue;
        json_array_append_new(missing,
                              json_pack("{s:s,s:s,s:I,s:s,s:s}", "name", f->e.name, "sha256",
                                        f->e.sha, "size", (json_int_t)f->e.size, "state",
                                        f->state == IMGSRC_DIFFERS ? "differs" : "missing", "error",
                                        f->why));
    }
    o = json_pack("{s:b,s:b,s:I,s:o}", "filled", !images_src_lacking(s), "index_read",
                  s->passed && s->rep.indexed, "listed", (json_int_t)(s->passed ? s->rep.n : 0),
                  "missing", missing);
    if (o && s->passed && !s->rep.indexed)
        json_object_set_new(o, "error", json_string(s->rep.error));
    return o;
}
