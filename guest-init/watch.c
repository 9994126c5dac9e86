/*
 * watch.c - the file watcher builtin (watch.h): inotify over a directory, or
 * over a tree when recursive, one watch per directory.
 *
 * Bounds: at most max_watches directories are watched (each costs the guest
 * kernel ~1 KiB of unswappable memory; 8192 by default is ~8 MiB, a tree of
 * 100k files in directories of ~12 files, and Linux's own floor for
 * fs.inotify.max_user_watches), the rest are reported as unwatched. Memory
 * here is the table of watched directories (bounded by max_watches), the
 * coalescing slots and one read buffer: nothing grows with the number of
 * events. A flood the kernel cannot queue becomes one "lost" line; a flood of
 * lines this process prints is bounded by the process's output ring in the
 * agent, which tells a reader that fell behind how much it lost.
 *
 * Invariants: dirs[] is sorted by wd (inotify hands out increasing wds and
 * this file appends them), dead entries keep their place until compacted; a
 * directory's rel path is "" for the root, else "a/b" without a leading '/'.
 */
#include "watch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WATCH_MASK                                                                                 \
    (IN_CREATE | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |                 \
     IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW | IN_EXCL_UNLINK)
#define COALESCE_SLOTS     128
#define MOVE_PAIR_MS       5 /* how long a rename's first half waits for its second */
#define MAX_WATCHES_SYSCTL "/proc/sys/fs/inotify/max_user_watches"

struct wdir {
    int wd; /* -1: dead */
    char *rel;
};

struct slot {
    int wd; /* -1: free */
    bool pending;
    bool dir;
    int64_t last_ms;
    char name[NAME_MAX + 1];
};

struct watcher {
    int fd;
    bool recursive;
    unsigned max_watches;
    int coalesce_ms;
    char root[PATH_MAX];
    size_t root_len;
    struct wdir *dirs;
    size_t ndirs, nlive, cap;
    struct slot slots[COALESCE_SLOTS];
    /* The first half of a rename, waiting for its second. */
    bool move_pending;
    uint32_t move_cookie;
    bool move_dir;
    int64_t move_ms;
    char move_rel[PATH_MAX];
    bool root_gone;
};

static int64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ output */

/* Length of the valid UTF-8 sequence at p (n bytes left), or 0. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    size_t len;
    uint32_t cp;

    if (p[0] < 0x80)
        return 1;
    if ((p[0] & 0xe0) == 0xc0)
        len = 2, cp = p[0] & 0x1f;
    else if ((p[0] & 0xf0) == 0xe0)
        len = 3, cp = p[0] & 0x0f;
    else if ((p[0] & 0xf8) == 0xf0)
        len = 4, cp = p[0] & 0x07;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* A JSON string of s: file names are bytes, JSON is UTF-8, so a byte that is not
 * part of valid UTF-8 becomes U+FFFD (the name is then only indicative). */
static void put_str(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strlen(s);

    putchar('"');
    for (size_t i = 0; i < n;) {
        size_t l;

        if (p[i] == '"' || p[i] == '\\') {
            putchar('\\');
            putchar(p[i++]);
        } else if (p[i] < 0x20 || p[i] == 0x7f) {
            printf("\\u%04x", p[i++]);
        } else if ((l = utf8_len(p + i, n - i)) == 0) {
            fputs("\\ufffd", stdout);
            i++;
        } else {
            fwrite(p + i, 1, l, stdout);
            i += l;
        }
    }
    putchar('"');
}

static void put_abs(const struct watcher *w, const char *rel)
{
    char abs[PATH_MAX * 2 + 2];

    if (!*rel)
        snprintf(abs, sizeof(abs), "%s", w->root);
    else
        snprintf(abs, sizeof(abs), "%s%s%s", w->root, w->root_len > 1 ? "/" : "", rel);
    put_str(abs);
}

static void emit(const struct watcher *w, const char *type, const char *rel, bool dir,
                 const char *from)
{
    printf("{\"type\":\"%s\",\"name\":", type);
    put_str(rel);
    fputs(",\"path\":", stdout);
    put_abs(w, rel);
    if (dir)
        fputs(",\"dir\":true", stdout);
    if (from) {
        fputs(",\"from\":", stdout);
        put_str(from);
    }
    fputs("}\n", stdout);
}

static void emit_unwatched(const struct watcher *w, const char *rel, const char *reason)
{
    fputs("{\"type\":\"unwatched\",\"name\":", stdout);
    put_str(rel);
    fputs(",\"path\":", stdout);
    put_abs(w, rel);
    printf(",\"reason\":\"%s\"}\n", reason);
}

static void emit_error(const char *code, const char *msg, const char *path)
{
    printf("{\"type\":\"error\",\"code\":\"%s\",\"message\":", code);
    {
        char m[PATH_MAX + 128];
        snprintf(m, sizeof(m), "%s: %s", path, msg);
        put_str(m);
    }
    fputs("}\n", stdout);
    fflush(stdout);
}

/* ------------------------------------------------------------ the table of directories */

static struct wdir *dir_find(struct watcher *w, int wd)
{
    size_t lo = 0, hi = w->ndirs;

    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (w->dirs[mid].wd == wd)
            return &w->dirs[mid];
        /* Dead entries keep their old wd in rel's place: see dir_kill. */
        if ((w->dirs[mid].wd < 0 ? -w->dirs[mid].wd - 2 : w->dirs[mid].wd) < wd)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* A dead entry keeps its order as -(wd + 2) so the binary search still works. */
static void dir_kill(struct watcher *w, struct wdir *d)
{
    if (d->wd < 0)
        return;
    d->wd = -d->wd - 2;
    free(d->rel);
    d->rel = NULL;
    w->nlive--;
}

static void dir_compact(struct watcher *w)
{
    size_t j = 0;

    if (w->ndirs - w->nlive < w->ndirs / 2 + 16)
        return;
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd >= 0)
            w->dirs[j++] = w->dirs[i];
    w->ndirs = j;
}

/* Watch directory rel. 1: newly watched; 2: it already was; 0: reported unwatched (or
 * gone already). */
static int dir_add(struct watcher *w, const char *rel)
{
    char abs[PATH_MAX];
    struct wdir *d;
    int wd, n;

    n = *rel ? snprintf(abs, sizeof(abs), "%s%s%s", w->root, w->root_len > 1 ? "/" : "", rel)
             : snprintf(abs, sizeof(abs), "%s", w->root);
    if (n < 0 || (size_t)n >= sizeof(abs)) {
        emit_unwatched(w, rel, "too_long");
        return 0;
    }
    if (w->nlive >= w->max_watches) {
        emit_unwatched(w, rel, "limit");
        return 0;
    }
    wd = inotify_add_watch(w->fd, abs, WATCH_MASK);
    if (wd < 0) {
        /* Gone already (its remove is on its way) or not a directory any more. */
        if (errno != ENOENT && errno != ENOTDIR)
            emit_unwatched(w, rel, errno == ENOSPC ? "limit" : "error");
        return 0;
    }
    if ((d = dir_find(w, wd)) != NULL)
        return 2;
    dir_compact(w);
    if (w->ndirs == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 64;
        struct wdir *nd = realloc(w->dirs, cap * sizeof(*nd));
        if (!nd) {
            inotify_rm_watch(w->fd, wd);
            emit_unwatched(w, rel, "error");
            return 0;
        }
        w->dirs = nd;
        w->cap = cap;
    }
    /* wds only grow, except after 2^31 of them: keep the order anyway. */
    if (w->ndirs && (w->dirs[w->ndirs - 1].wd < 0 ? -w->dirs[w->ndirs - 1].wd - 2
                                                  : w->dirs[w->ndirs - 1].wd) > wd) {
        inotify_rm_watch(w->fd, wd);
        emit_unwatched(w, rel, "error");
        return 0;
    }
    if (!(w->dirs[w->ndirs].rel = strdup(rel))) {
        inotify_rm_watch(w->fd, wd);
        emit_unwatched(w, rel, "error");
        return 0;
    }
    w->dirs[w->ndirs++].wd = wd;
    w->nlive++;
    return 1;
}

/* Forget rel and everything under it (moved out of the tree). */
static void dir_drop_tree(struct watcher *w, const char *rel)
{
    size_t n = strlen(rel);

    for (size_t i = 0; i < w->ndirs; i++) {
        struct wdir *d = &w->dirs[i];
        if (d->wd >= 0 && strncmp(d->rel, rel, n) == 0 && (d->rel[n] == 0 || d->rel[n] == '/')) {
            inotify_rm_watch(w->fd, d->wd);
            dir_kill(w, d);
        }
    }
}

/* rel and everything under it are now under to. */
static void dir_rename_tree(struct watcher *w, const char *from, const char *to)
{
    size_t n = strlen(from);

    for (size_t i = 0; i < w->ndirs; i++) {
        struct wdir *d = &w->dirs[i];
        char *nr;
        if (d->wd < 0 || strncmp(d->rel, from, n) != 0 || (d->rel[n] != 0 && d->rel[n] != '/'))
            continue;
        if (asprintf(&nr, "%s%s", to, d->rel + n) < 0) {
            inotify_rm_watch(w->fd, d->wd);
            dir_kill(w, d);
            continue;
        }
        free(d->rel);
        d->rel = nr;
    }
}

static int join(char *out, size_t cap, const char *dir, const char *name)
{
    int n = *dir ? snprintf(out, cap, "%s/%s", dir, name) : snprintf(out, cap, "%s", name);

    return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/*
 * Watch the tree under rel (rel itself already watched). creates: report every
 * entry found as created (a directory that appeared after the watch began: what
 * it held before its own watch was added was never seen). An explicit stack of
 * paths, never recursion, and never more directories than the cap allows.
 */
static void scan(struct watcher *w, const char *rel, bool creates)
{
    char **stack = NULL;
    size_t n = 0, cap = 0, visited = 0;

    if (!(stack = malloc(sizeof(*stack))) || !(stack[0] = strdup(rel))) {
        free(stack);
        return;
    }
    n = cap = 1;
    while (n) {
        char *cur = stack[--n];
        char abs[PATH_MAX];
        DIR *dh;
        struct dirent *de;

        if (++visited > w->max_watches + 1 ||
            (*cur ? snprintf(abs, sizeof(abs), "%s%s%s", w->root, w->root_len > 1 ? "/" : "", cur)
                  : snprintf(abs, sizeof(abs), "%s", w->root)) >= (int)sizeof(abs) ||
            !(dh = opendir(abs))) {
            free(cur);
            continue;
        }
        while ((de = readdir(dh)) != NULL) {
            char child[PATH_MAX];
            bool isdir;

            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
                continue;
            if (join(child, sizeof(child), cur, de->d_name) < 0)
                continue;
            isdir = de->d_type == DT_DIR;
            if (de->d_type == DT_UNKNOWN) {
                struct stat st;
                isdir = fstatat(dirfd(dh), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                        S_ISDIR(st.st_mode);
            }
            if (creates)
                emit(w, "create", child, isdir, NULL);
            if (!isdir || !w->recursive)
                continue;
            /* A rescan (after an overflow) descends into what it already watched too. */
            if (dir_add(w, child) == 0)
                continue;
            if (n == cap) {
                char **ns = realloc(stack, cap * 2 * sizeof(*ns));
                if (!ns)
                    continue;
                stack = ns;
                cap *= 2;
            }
            if ((stack[n] = strdup(child)) != NULL)
                n++;
        }
        closedir(dh);
        free(cur);
    }
    free(stack);
}

/* ------------------------------------------------------------ coalescing */

static void slot_flush(struct watcher *w, struct slot *s)
{
    struct wdir *d;
    char rel[PATH_MAX];

    if (s->wd >= 0 && s->pending && (d = dir_find(w, s->wd)) && d->wd >= 0 &&
        join(rel, sizeof(rel), d->rel, s->name) == 0)
        emit(w, "write", rel, s->dir, NULL);
    s->pending = false;
}

/* A write to name in directory wd: out now, or folded into the one out within the window. */
static void on_write(struct watcher *w, int wd, const char *name, bool dir, const char *rel)
{
    int64_t t = now_ms();
    struct slot *s, *oldest = NULL;

    for (int i = 0; i < COALESCE_SLOTS; i++) {
        s = &w->slots[i];
        if (s->wd == wd && !strcmp(s->name, name)) {
            if (t - s->last_ms < w->coalesce_ms) {
                s->pending = true;
                return;
            }
            slot_flush(w, s);
            emit(w, "write", rel, dir, NULL);
            s->last_ms = t;
            return;
        }
        if (!oldest || s->wd < 0 || (oldest->wd >= 0 && s->last_ms < oldest->last_ms))
            oldest = s;
    }
    s = oldest;
    slot_flush(w, s);
    s->wd = wd;
    s->dir = dir;
    s->pending = false;
    s->last_ms = t;
    snprintf(s->name, sizeof(s->name), "%s", name);
    emit(w, "write", rel, dir, NULL);
}

/* A path removed or renamed away: its pending write goes out first, in order. */
static void slot_forget(struct watcher *w, int wd, const char *name)
{
    for (int i = 0; i < COALESCE_SLOTS; i++) {
        struct slot *s = &w->slots[i];
        if (s->wd == wd && !strcmp(s->name, name)) {
            slot_flush(w, s);
            s->wd = -1;
        }
    }
}

static void move_flush(struct watcher *w)
{
    if (!w->move_pending)
        return;
    w->move_pending = false;
    emit(w, "remove", w->move_rel, w->move_dir, NULL);
    if (w->move_dir)
        dir_drop_tree(w, w->move_rel);
}

/* Milliseconds until the next slot or pending move is due, or -1. Flushes those due
 * (all of them when flush_all). */
static int timers(struct watcher *w, bool flush_all)
{
    int64_t t = now_ms();
    int64_t next = -1;

    if (w->move_pending) {
        if (flush_all || t - w->move_ms >= MOVE_PAIR_MS)
            move_flush(w);
        else
            next = w->move_ms + MOVE_PAIR_MS - t;
    }
    for (int i = 0; i < COALESCE_SLOTS; i++) {
        struct slot *s = &w->slots[i];
        int64_t due;
        if (s->wd < 0 || !s->pending)
            continue;
        due = s->last_ms + w->coalesce_ms;
        if (flush_all || due <= t) {
            slot_flush(w, s);
            s->last_ms = t;
        } else if (next < 0 || due - t < next) {
            next = due - t;
        }
    }
    return next < 0 ? -1 : (int)next;
}

/* ------------------------------------------------------------ events */

static void on_event(struct watcher *w, const struct inotify_event *ev)
{
    struct wdir *d;
    char rel[PATH_MAX];
    bool isdir = ev->mask & IN_ISDIR;
    const char *name = ev->len ? ev->name : "";

    if (ev->mask & IN_Q_OVERFLOW) {
        move_flush(w);
        fputs("{\"type\":\"lost\",\"reason\":\"overflow\"}\n", stdout);
        /* Directories made during the overflow were never seen: find them now. */
        if (w->recursive)
            scan(w, "", false);
        return;
    }
    /* Before the lookup: a flushed move can drop the very directory this event is on. */
    if (w->move_pending && !((ev->mask & IN_MOVED_TO) && ev->cookie == w->move_cookie))
        move_flush(w);
    if (!(d = dir_find(w, ev->wd)))
        return;
    if (ev->mask & IN_IGNORED) {
        bool root = !*d->rel;
        dir_kill(w, d);
        if (root)
            w->root_gone = true;
        return;
    }
    if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
        /* The parent reports the others; only the root has no parent here. */
        if (!*d->rel && !w->root_gone) {
            emit(w, "remove", "", true, NULL);
            w->root_gone = true;
        }
        return;
    }
    if (!ev->len || join(rel, sizeof(rel), d->rel, name) < 0)
        return;
    if (ev->mask & IN_CREATE) {
        emit(w, "create", rel, isdir, NULL);
        if (isdir && w->recursive && dir_add(w, rel) == 1)
            scan(w, rel, true);
    } else if (ev->mask & IN_MODIFY) {
        on_write(w, ev->wd, name, isdir, rel);
    } else if (ev->mask & IN_ATTRIB) {
        emit(w, "chmod", rel, isdir, NULL);
    } else if (ev->mask & IN_DELETE) {
        slot_forget(w, ev->wd, name);
        emit(w, "remove", rel, isdir, NULL);
    } else if (ev->mask & IN_MOVED_FROM) {
        slot_forget(w, ev->wd, name);
        w->move_pending = true;
        w->move_cookie = ev->cookie;
        w->move_dir = isdir;
        w->move_ms = now_ms();
        snprintf(w->move_rel, sizeof(w->move_rel), "%s", rel);
    } else if (ev->mask & IN_MOVED_TO) {
        if (w->move_pending && ev->cookie == w->move_cookie) {
            w->move_pending = false;
            emit(w, "rename", rel, isdir, w->move_rel);
            if (isdir)
                dir_rename_tree(w, w->move_rel, rel);
        } else {
            emit(w, "create", rel, isdir, NULL);
            if (isdir && w->recursive && dir_add(w, rel) == 1)
                scan(w, rel, true);
        }
    }
}

/* Let root use as many watches as it was allowed: the kernel's default can be lower. */
static void raise_sysctl(unsigned want)
{
    char buf[32];
    ssize_t n;
    int fd = open(MAX_WATCHES_SYSCTL, O_RDWR | O_CLOEXEC);

    if (fd < 0)
        return;
    n = read(fd, buf, sizeof(buf) - 1);
    if (n > 0) {
        buf[n] = 0;
        if (strtoul(buf, NULL, 10) < want + 64) {
            int l = snprintf(buf, sizeof(buf), "%u\n", want + 64);
            if (pwrite(fd, buf, (size_t)l, 0) < 0) {
                /* Not root: the kernel's limit stands and ENOSPC says unwatched. */
            }
        }
    }
    close(fd);
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out)
{
    char *end;
    unsigned long v;

    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno || end == s || *end || *s == '-' || v < lo || v > hi)
        return -1;
    *out = (unsigned)v;
    return 0;
}

int gi_watch_main(int argc, char **argv)
{
    static char buf[64 * 1024] __attribute__((aligned(__alignof__(struct inotify_event))));
    struct watcher *w = calloc(1, sizeof(*w));
    const char *path = NULL;
    struct stat st;
    unsigned v;
    int rc = 2;

    if (!w) {
        emit_error("internal", "out of memory", "");
        return 2;
    }
    w->fd = -1;
    w->max_watches = GI_WATCH_MAX_DEFAULT;
    w->coalesce_ms = GI_WATCH_COALESCE_DEFAULT;
    for (int i = 0; i < COALESCE_SLOTS; i++)
        w->slots[i].wd = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--recursive")) {
            w->recursive = true;
        } else if (!strcmp(argv[i], "--max-watches") && i + 1 < argc &&
                   parse_uint(argv[i + 1], 1, GI_WATCH_MAX_LIMIT, &v) == 0) {
            w->max_watches = v;
            i++;
        } else if (!strcmp(argv[i], "--coalesce-ms") && i + 1 < argc &&
                   parse_uint(argv[i + 1], 0, 60000, &v) == 0) {
            w->coalesce_ms = (int)v;
            i++;
        } else if (!strcmp(argv[i], "--") && i + 2 == argc) {
            path = argv[++i];
        } else if (argv[i][0] != '-' && i + 1 == argc) {
            path = argv[i];
        } else {
            emit_error("bad_request",
                       "usage: --watch [--recursive] [--max-watches N] "
                       "[--coalesce-ms N] [--] DIR",
                       argv[i]);
            goto out;
        }
    }
    if (!path || path[0] != '/') {
        emit_error("bad_request", "the path must be absolute", path ? path : "");
        goto out;
    }
    if (!realpath(path, w->root)) {
        emit_error(errno == ENOENT || errno == ENOTDIR ? "not_found" : "bad_request",
                   strerror(errno), path);
        goto out;
    }
    w->root_len = strlen(w->root);
    if (stat(w->root, &st) < 0 || !S_ISDIR(st.st_mode)) {
        emit_error("not_a_directory", "not a directory", path);
        goto out;
    }
    raise_sysctl(w->max_watches);
    if ((w->fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK)) < 0) {
        emit_error("internal", strerror(errno), "inotify");
        goto out;
    }
    if (dir_add(w, "") != 1) {
        emit_error("internal", "the directory cannot be watched", path);
        goto out;
    }
    if (w->recursive)
        scan(w, "", false);
    fputs("{\"type\":\"ready\",\"path\":", stdout);
    put_str(w->root);
    printf(",\"recursive\":%s,\"watches\":%zu}\n", w->recursive ? "true" : "false", w->nlive);
    fflush(stdout);

    while (!w->root_gone) {
        struct pollfd pfd = {.fd = w->fd, .events = POLLIN};
        int timeout = timers(w, false);
        ssize_t n;

        fflush(stdout);
        if (poll(&pfd, 1, timeout) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        n = read(w->fd, buf, sizeof(buf));
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            break;
        }
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            on_event(w, ev);
            p += sizeof(*ev) + ev->len;
        }
    }
    timers(w, true);
    fflush(stdout);
    rc = w->root_gone ? 0 : 1;
out:
    if (w->fd >= 0)
        close(w->fd);
    for (size_t i = 0; i < w->ndirs; i++)
        free(w->dirs[i].rel);
    free(w->dirs);
    free(w);
    return rc;
}
