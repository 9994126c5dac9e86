/*
 * files.c - file requests: streamed write (FWRITE, DATA*, END) and read
 * (FREAD -> RESULT, DATA*, END) under credit, and the one-shot STAT, LIST,
 * MKDIR, REMOVE and RENAME.
 *
 * Paths must be absolute (EINVAL otherwise). Walks (LIST, recursive
 * REMOVE) use openat() relative to the directory being walked and never
 * follow a symlink below the requested path. Disk I/O is synchronous: it
 * is local to the guest and bounded per frame, but a recursive REMOVE of a
 * huge tree holds the loop while it runs.
 *
 * A failed FWRITE (open or a write error such as ENOSPC) sends ERROR and
 * ends the stream at once; the host's remaining DATA/END for that id then
 * find no stream and are dropped.
 */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIR_MODE         0755
#define FILE_MODE        0644
#define REMOVE_MAX_DEPTH 256
#define LIST_BATCH_COUNT 1024

static int take_path(const struct proto_frame *f, enum proto_key k, char *buf)
{
    int r;

    buf[0] = '\0';
    if (!proto_has(f, k))
        return -EINVAL;
    r = proto_str_copy(&f->v[k].s, buf, PATH_MAX);
    if (r < 0)
        return r;
    return buf[0] == '/' ? 0 : -EINVAL;
}

static void reply_path_error(struct gi_agent *a, uint32_t id, int err, const char *path)
{
    if (err == EINVAL && path[0] != '/')
        gi_reply_error(a, id, err, "path must be absolute");
    else
        gi_reply_error(a, id, err, "%s: %s", path, strerror(err));
}

/* Create the directories of path[0..len) that are missing (mkdir -p); the last one gets mode. */
static int make_dirs(const char *path, size_t len, mode_t mode)
{
    char buf[PATH_MAX];
    struct stat st;

    if (len == 0 || len >= sizeof(buf))
        return len ? -ENAMETOOLONG : 0;
    memcpy(buf, path, len);
    buf[len] = '\0';
    for (size_t i = 1; i <= len; i++) {
        if (i < len && (buf[i] != '/' || buf[i - 1] == '/'))
            continue;
        buf[i] = '\0';
        if (mkdir(buf, i == len ? mode : DIR_MODE) != 0 && errno != EEXIST)
            return -errno;
        if (i < len)
            buf[i] = '/';
    }
    if (stat(buf, &st) != 0)
        return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -EEXIST;
}

static const char *type_name(mode_t m)
{
    if (S_ISREG(m))
        return "file";
    if (S_ISDIR(m))
        return "dir";
    if (S_ISLNK(m))
        return "symlink";
    return "other";
}

/* The last component of an absolute path ("/" for the root). */
static void base_name(const char *path, const char **name, size_t *len)
{
    size_t end = strlen(path), start;

    while (end > 1 && path[end - 1] == '/')
        end--;
    start = end;
    while (start > 0 && path[start - 1] != '/')
        start--;
    if (start == end) { /* the root */
        *name = "/";
        *len = 1;
        return;
    }
    *name = path + start;
    *len = end - start;
}

/* The six stat keys of STAT results and LIST entries. */
static void put_stat(struct proto_enc *e, const char *path, const struct stat *st)
{
    const char *name;
    size_t nlen;

    base_name(path, &name, &nlen);
    proto_put_cstr(e, PK_PATH, path);
    proto_put_str(e, PK_NAME, name, nlen);
    proto_put_cstr(e, PK_TYPE, type_name(st->st_mode));
    proto_put_u(e, PK_SIZE, (uint64_t)st->st_size);
    proto_put_u(e, PK_MODE, st->st_mode & 07777);
    proto_put_i(e, PK_MTIME, st->st_mtim.tv_sec);
}

static void xfer_fail(struct gi_agent *a, struct gi_stream *s, int err, const char *what)
{
    gi_reply_error(a, s->id, err, "%s: %s", what, strerror(err));
    s->done = true; /* the fd is closed by the sweep */
}

/* The host gave up on a transfer (its client went away): stop now instead of pushing the
 * rest of a file nobody reads. The ERROR is the stream's last frame. */
void gi_file_abort(struct gi_agent *a, struct gi_stream *s)
{
    if (!s->done)
        xfer_fail(a, s, ECANCELED, "transfer");
}

/* ---- FWRITE ---- */

void gi_file_write(struct gi_agent *a, const struct proto_frame *f)
{
    char path[PATH_MAX];
    mode_t mode = proto_has(f, PK_MODE) ? (mode_t)(f->v[PK_MODE].u & 07777) : FILE_MODE;
    struct gi_stream *s;
    const char *slash;
    int r, fd;

    r = take_path(f, PK_PATH, path);
    if (r < 0) {
        reply_path_error(a, f->id, -r, path);
        return;
    }
    s = gi_stream_new(a, f->id, GI_FWRITE);
    if (!s)
        return;
    slash = strrchr(path, '/');
    r = make_dirs(path, (size_t)(slash - path), DIR_MODE);
    if (r < 0) {
        gi_reply_error(a, f->id, -r, "create parents of %s: %s", path, strerror(-r));
        s->done = true;
        return;
    }
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOCTTY, mode);
    /* O_CREAT's mode is filtered by the umask and ignored for an existing file. */
    if (fd < 0 || fchmod(fd, mode) != 0) {
        r = errno;
        if (fd >= 0)
            close(fd);
        reply_path_error(a, f->id, r, path);
        s->done = true;
        return;
    }
    s->u.f.fd = fd;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

void gi_file_data(struct gi_agent *a, struct gi_stream *s, const struct proto_frame *f)
{
    struct gi_xfer *x = &s->u.f;
    const struct proto_str *d = &f->v[PK_DATA].s;
    int r;

    if (proto_has(f, PK_OFF) && f->v[PK_OFF].u != x->off) {
        xfer_fail(a, s, EINVAL, "DATA out of order");
        return;
    }
    if (!proto_has(f, PK_DATA) || d->len == 0)
        return;
    r = write_all(x->fd, d->p, d->len);
    if (r < 0) {
        xfer_fail(a, s, -r, "write");
        return;
    }
    x->off += d->len;
    proto_send_credit(&a->out, s->id, d->len);
}

void gi_file_end(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_xfer *x = &s->u.f;
    struct proto_enc e;
    int r = close(x->fd);

    x->fd = -1;
    if (r != 0) {
        xfer_fail(a, s, errno, "close");
        return;
    }
    if (proto_enc_begin(&e, &a->out, PROTO_RESULT, s->id, 3) == 0) {
        proto_put_u(&e, PK_SIZE, x->off);
        proto_enc_end(&e);
    }
    s->done = true;
}

/* ---- FREAD ---- */

static int open_regular(const char *path, struct stat *st)
{
    /* O_NONBLOCK: opening a FIFO must not hang the agent before fstat rejects it. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK), r = 0;

    if (fd < 0)
        return -errno;
    if (fstat(fd, st) != 0)
        r = -errno;
    else if (!S_ISREG(st->st_mode))
        r = S_ISDIR(st->st_mode) ? -EISDIR : -EINVAL;
    if (r < 0) {
        close(fd);
        return r;
    }
    return fd;
}

void gi_file_read(struct gi_agent *a, const struct proto_frame *f)
{
    char path[PATH_MAX];
    struct gi_stream *s;
    struct proto_enc e;
    struct stat st;
    int fd, r;

    r = take_path(f, PK_PATH, path);
    fd = r < 0 ? r : open_regular(path, &st);
    if (fd < 0) {
        reply_path_error(a, f->id, -fd, path);
        return;
    }
    s = gi_stream_new(a, f->id, GI_FREAD);
    if (!s) {
        close(fd);
        return;
    }
    s->u.f.fd = fd;
    s->u.f.credit = PROTO_WINDOW;
    s->u.f.size = (uint64_t)st.st_size;
    if (proto_enc_begin(&e, &a->out, PROTO_RESULT, f->id, 5) == 0) {
        proto_put_u(&e, PK_SIZE, (uint64_t)st.st_size);
        proto_put_u(&e, PK_MODE, st.st_mode & 07777);
        proto_put_i(&e, PK_MTIME, st.st_mtim.tv_sec);
        proto_enc_end(&e);
    }
}

void gi_file_credit(struct gi_stream *s, uint64_t n)
{
    struct gi_xfer *x = &s->u.f;

    x->credit = n > UINT64_MAX - x->credit ? UINT64_MAX : x->credit + n;
}

static void read_pump(struct gi_agent *a, struct gi_stream *s)
{
    static uint8_t buf[PROTO_MAX_DATA];
    struct gi_xfer *x = &s->u.f;
    size_t want = x->credit < sizeof(buf) ? (size_t)x->credit : sizeof(buf);
    struct proto_enc e;
    ssize_t n = 0;

    /* The host holds us to the size announced (it is the download's Content-Length): a
     * file that grew while being read ends there. */
    if (x->size - x->off < want)
        want = (size_t)(x->size - x->off);
    if (want > 0) {
        do
            n = read(x->fd, buf, want);
        while (n < 0 && errno == EINTR);
    }
    if (n < 0) {
        xfer_fail(a, s, errno, "read");
        return;
    }
    if (n == 0) {
        proto_send_end(&a->out, s->id);
        s->done = true;
        return;
    }
    if (proto_enc_begin(&e, &a->out, PROTO_DATA, s->id, 4) != 0)
        return;
    proto_put_u(&e, PK_OFF, x->off);
    proto_put_bin(&e, PK_DATA, buf, (size_t)n);
    if (proto_enc_end(&e) != 0) {
        xfer_fail(a, s, ENOMEM, "queue");
        return;
    }
    x->off += (uint64_t)n;
    x->credit -= (uint64_t)n;
}

/* ---- STAT ---- */

void gi_file_stat(struct gi_agent *a, const struct proto_frame *f)
{
    char path[PATH_MAX];
    struct proto_enc e;
    struct stat st;
    int r;

    r = take_path(f, PK_PATH, path);
    if (r == 0 && lstat(path, &st) != 0)
        r = -errno;
    if (r < 0) {
        reply_path_error(a, f->id, -r, path);
        return;
    }
    if (proto_enc_begin(&e, &a->out, PROTO_RESULT, f->id, 8) == 0) {
        put_stat(&e, path, &st);
        proto_enc_end(&e);
    }
}

/* ---- LIST ---- */

void gi_file_list(struct gi_agent *a, const struct proto_frame *f)
{
    char path[PATH_MAX];
    uint64_t depth = proto_has(f, PK_DEPTH) ? f->v[PK_DEPTH].u : 1;
    struct gi_stream *s;
    struct gi_list *l;
    size_t len;
    DIR *d;
    int r, fd;

    r = take_path(f, PK_PATH, path);
    /* The requested path itself may be a symlink to a directory; nothing below it is followed. */
    fd = r < 0 ? r : open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        reply_path_error(a, f->id, r < 0 ? -r : errno, path);
        return;
    }
    d = fdopendir(fd);
    l = calloc(1, sizeof(*l));
    s = d && l ? gi_stream_new(a, f->id, GI_LIST) : NULL;
    if (!s) {
        if (!d || !l)
            gi_reply_error(a, f->id, ENOMEM, "out of memory");
        d ? closedir(d) : close(fd);
        free(l);
        return;
    }
    len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    memcpy(l->path, path, len);
    l->path[len] = '\0';
    l->dirs[0] = d;
    l->plen[0] = len;
    l->ndirs = 1;
    l->depth = depth == 0 ? 1 : depth > GI_LIST_MAX_DEPTH ? GI_LIST_MAX_DEPTH : (int)depth;
    s->u.l = l;
}

/*
 * Next entry of the pre-order walk, its full path left in l->path. A real
 * directory (never a symlink) above the depth limit is opened and becomes
 * the top of the stack, so its entries follow it. Returns false at the end.
 */
static bool list_next(struct gi_list *l, struct stat *st)
{
    while (l->ndirs > 0) {
        int top = l->ndirs - 1;
        DIR *d = l->dirs[top];
        size_t base = l->plen[top], nlen;
        struct dirent *de = readdir(d);

        if (!de) {
            closedir(d);
            l->ndirs--;
            continue;
        }
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (l->path[base - 1] != '/')
            l->path[base++] = '/';
        nlen = strlen(de->d_name);
        if (base + nlen >= sizeof(l->path))
            continue;
        memcpy(l->path + base, de->d_name, nlen + 1);
        if (fstatat(dirfd(d), de->d_name, st, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* removed while we walk */
        if (S_ISDIR(st->st_mode) && l->ndirs < l->depth) {
            int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            DIR *c = fd >= 0 ? fdopendir(fd) : NULL;
            if (c) {
                l->dirs[l->ndirs] = c;
                l->plen[l->ndirs++] = base + nlen;
            } else if (fd >= 0) {
                close(fd);
            }
        }
        return true;
    }
    return false;
}

static int side_write(void *data, const char *p, size_t n)
{
    struct proto_enc *e = data;
    return proto_buf_append(e->buf, p, n) == 0 ? 0 : -1;
}

/* One RESULT frame of entries; the last one (eof) ends the stream. */
static void list_pump(struct gi_agent *a, struct gi_stream *s)
{
    struct gi_list *l = s->u.l;
    struct proto_buf side;
    struct proto_enc e, se = {.buf = &side};
    uint32_t count = 0;
    bool eof = false;
    struct stat st;

    /* Entries are packed aside first: the array header needs their count. */
    proto_buf_init(&side);
    msgpack_packer_init(&se.pk, &se, side_write);
    while (side.len < GI_LIST_BATCH_BYTES && count < LIST_BATCH_COUNT) {
        if (l->count >= GI_LIST_MAX_ENTRIES || !list_next(l, &st)) {
            eof = true;
            break;
        }
        msgpack_pack_map(&se.pk, 6);
        put_stat(&se, l->path, &st);
        count++;
        l->count++;
    }
    if (proto_enc_begin(&e, &a->out, PROTO_RESULT, s->id, 4) == 0) {
        proto_enc_key(&e, PK_ENTRIES);
        msgpack_pack_array(&e.pk, count);
        if (side.len && proto_buf_append(e.buf, side.p, side.len) != 0)
            e.err = -ENOMEM;
        proto_put_b(&e, PK_EOF, eof);
        if (proto_enc_end(&e) != 0)
            eof = true;
    }
    proto_buf_free(&side);
    if (eof)
        s->done = true;
}

/* ---- MKDIR, REMOVE, RENAME ---- */

void gi_file_mkdir(struct gi_agent *a, const struct proto_frame *f)
{
    char path[PATH_MAX];
    mode_t mode = proto_has(f, PK_MODE) ? (mode_t)(f->v[PK_MODE].u & 07777) : DIR_MODE;
    int r;

    r = take_path(f, PK_PATH, path);
    if (r == 0)
        r = make_dirs(path, strlen(path), mode);
    if (r < 0)
        reply_path_error(a, f->id, -r, path);
    else
        gi_reply_ok(a, f->id);
}

static int remove_tree(int dirfd, const char *name, int level);

/* Remove every entry of an open directory; passes repeat until one finds nothing,
 * because readdir may skip entries while the directory changes under it. */
static int empty_dir(DIR *d, int level)
{
    int fd = dirfd(d), r = 0;
    size_t removed;

    do {
        struct dirent *de;
        removed = 0;
        rewinddir(d);
        while (r == 0 && (de = readdir(d))) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            removed++;
            if (unlinkat(fd, de->d_name, 0) == 0 || errno == ENOENT)
                continue;
            if (errno != EISDIR && errno != EPERM)
                r = -errno;
            else
                r = remove_tree(fd, de->d_name, level + 1);
        }
    } while (r == 0 && removed > 0);
    return r;
}

/* rm -r of name under dirfd; symlinks are removed, never followed. */
static int remove_tree(int dirfd, const char *name, int level)
{
    DIR *d;
    int fd, r;

    if (level > REMOVE_MAX_DEPTH)
        return -ELOOP;
    fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    d = fdopendir(fd);
    if (!d) {
        r = -errno;
        close(fd);
        return r;
    }
    r = empty_dir(d, level);
    closedir(d);
    if (r == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        r = -errno;
    return r;
}

void gi_file_remove(struct gi_agent *a, const struct proto_frame *f)
{
    char path[PATH_MAX];
    bool recursive = proto_has(f, PK_RECURSIVE) && f->v[PK_RECURSIVE].b;
    struct stat st;
    int r;

    r = take_path(f, PK_PATH, path);
    if (r == 0 && path[strspn(path, "/")] == '\0') {
        gi_reply_error(a, f->id, EBUSY, "refusing to remove /");
        return;
    }
    if (r == 0 && lstat(path, &st) != 0)
        r = -errno;
    if (r == 0 && !S_ISDIR(st.st_mode))
        r = unlink(path) == 0 ? 0 : -errno;
    else if (r == 0 && recursive)
        r = remove_tree(AT_FDCWD, path, 0);
    else if (r == 0 && rmdir(path) != 0)
        r = errno == EEXIST ? -ENOTEMPTY : -errno;
    if (r < 0)
        reply_path_error(a, f->id, -r, path);
    else
        gi_reply_ok(a, f->id);
}

void gi_file_rename(struct gi_agent *a, const struct proto_frame *f)
{
    char from[PATH_MAX], to[PATH_MAX];
    int r;

    r = take_path(f, PK_PATH, from);
    if (r < 0) {
        reply_path_error(a, f->id, -r, from);
        return;
    }
    r = take_path(f, PK_TO, to);
    if (r == 0 && rename(from, to) != 0)
        r = -errno;
    if (r < 0)
        gi_reply_error(a, f->id, -r, "rename %s -> %s: %s", from, to, strerror(-r));
    else
        gi_reply_ok(a, f->id);
}

/* ---- streams that produce without polling ---- */

bool gi_file_ready(const struct gi_stream *s)
{
    if (s->kind == GI_FREAD)
        return s->u.f.credit > 0;
    return s->kind == GI_LIST;
}

void gi_file_pump(struct gi_agent *a, struct gi_stream *s)
{
    if (s->kind == GI_FREAD)
        read_pump(a, s);
    else if (s->kind == GI_LIST)
        list_pump(a, s);
}

void gi_file_release(struct gi_stream *s)
{
    if (s->kind == GI_LIST) {
        struct gi_list *l = s->u.l;
        for (int i = 0; l && i < l->ndirs; i++)
            closedir(l->dirs[i]);
        free(l);
        s->u.l = NULL;
    } else if (s->u.f.fd >= 0) {
        close(s->u.f.fd);
        s->u.f.fd = -1;
    }
}
