/*
 * web_serve.c - answer the browser terminal's static routes (web.h): the
 * compiled-in page and script, and the xterm.js files read from web_dir.
 * A file is read whole into one output buffer (capped at WEB_FILE_MAX) and
 * written from HTTP_WRITEABLE like every other answer (resp.c).
 */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_int.h"
#include "web.h"

static void unavailable(struct pss *p, const char *what, int err)
{
    char msg[200 + PATH_MAX];

    snprintf(msg, sizeof(msg),
             "the terminal page needs xterm.js: %s in web_dir %s (%s); run scripts/setup.sh or "
             "set web_dir",
             what, p->srv->cfg->web_dir, strerror(err));
    LOG(LOG_WARN, "web: %s", msg);
    resp_code(p, 503, "terminal_unavailable", msg);
}

static void answer(struct pss *p, const struct web_file *f, struct obuf *ob, size_t n)
{
    resp_q_grew(p, ob, n, 0);
    p->status = 200;
    p->kind = RESP_STATIC;
    p->ctype = f->ctype;
    p->clen = n;
    p->chunked = false;
    req_complete(p);
    resp_stall_arm(p, false); /* a client that takes nothing is dropped, as for downloads */
    resp_want_write(p);
}

/* Read web_dir/rel whole into the output queue. 0, or -errno (nothing queued). */
static int read_dir_file(struct pss *p, const char *rel, struct obuf **obp, size_t *np)
{
    char path[PATH_MAX];
    struct stat st;
    struct obuf *ob;
    size_t n = 0;
    int fd = -1, r;

    if (snprintf(path, sizeof(path), "%s/%s", p->srv->cfg->web_dir, rel) >= (int)sizeof(path))
        return -ENAMETOOLONG;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st)) {
        r = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        r = -EISDIR;
        goto out;
    }
    if (st.st_size > WEB_FILE_MAX) {
        r = -EFBIG;
        goto out;
    }
    if (!(ob = resp_q_room(p, (size_t)st.st_size + 1))) {
        r = -ENOMEM;
        goto out;
    }
    /* Up to one byte past the size stat saw: a file that grew is refused, not cut. */
    while (n <= (size_t)st.st_size) {
        ssize_t got = read(fd, OB_PAYLOAD(ob) + n, (size_t)st.st_size + 1 - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            r = -errno;
            goto fail;
        }
        if (got == 0)
            break;
        n += (size_t)got;
    }
    if (n > (size_t)st.st_size) {
        r = -EAGAIN;
        goto fail;
    }
    *obp = ob;
    *np = n;
    r = 0;
    goto out;
fail:
    resp_q_free(p);
out:
    close(fd);
    return r;
}

void web_request(struct pss *p, const struct web_file *f)
{
    struct obuf *ob = NULL;
    size_t n = 0;
    int r;

    if (p->method != API_GET) {
        resp_code(p, 405, "method_not_allowed", "method not allowed on this route");
        return;
    }
    if (f->src == WEB_EMBED) {
        /* The page without xterm.js would be blank: say why instead. */
        if (f->ctype && !strncmp(f->ctype, "text/html", 9)) {
            char path[PATH_MAX];
            snprintf(path, sizeof(path), "%s/%s", p->srv->cfg->web_dir, WEB_XTERM_REL);
            if (access(path, R_OK)) {
                unavailable(p, WEB_XTERM_REL " is missing", errno);
                return;
            }
        }
        n = *f->len;
        if (!(ob = resp_q_room(p, n ? n : 1))) {
            resp_code(p, 500, "internal", "out of memory");
            return;
        }
        memcpy(OB_PAYLOAD(ob), f->data, n);
        answer(p, f, ob, n);
        return;
    }
    r = read_dir_file(p, f->rel, &ob, &n);
    if (r == -ENOMEM) {
        resp_code(p, 500, "internal", "out of memory");
        return;
    }
    if (r) {
        char what[128];
        snprintf(what, sizeof(what), "cannot read %s", f->rel);
        unavailable(p, what, -r);
        return;
    }
    answer(p, f, ob, n);
}
