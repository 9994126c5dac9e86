/*
 * agent_check.c - HAProxy's agent check (agent_check.h).
 */
#include "agent_check.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"
#include "images_src.h"
#include "log.h"
#include "sbx.h"

struct agent_check {
    struct ev_loop *loop;
    const struct srv_config *cfg;
    struct sbx_table *t;
    const struct images_src *imgs;
    int fd;
    ev_io w;
};

void agent_check_line(const struct srv_config *cfg, unsigned live, bool lacking, char *buf,
                      size_t cap)
{
    char path[4096];
    struct stat st;
    unsigned max = cfg->max_sandboxes, pct;

    snprintf(path, sizeof(path), "%s/drain", cfg->state_dir);
    if (stat(path, &st) == 0) {
        snprintf(buf, cap, "drain\n");
        return;
    }
    pct = live >= max ? 0 : (unsigned)(((unsigned long long)(max - live) * 100) / max);
    /* A host still filling its images would fail creates of templates it lacks: it keeps
     * a share of the creates (those it has work), the others go mostly elsewhere. */
    if (lacking)
        pct /= 4;
    /* Never 0, which HAProxy takes as drain: a full host still gets the odd create, answers
     * it 503 host_full at once, and the proxy retries elsewhere; with every host full the
     * client learns it (429) instead of HAProxy's "no server". */
    if (pct == 0)
        pct = 1;
    /* "ready" takes the host out of a drain an earlier answer put it in. */
    snprintf(buf, cap, "ready up %u%%\n", pct);
}

static void on_accept(struct ev_loop *loop, ev_io *w, int revents)
{
    struct agent_check *a = w->data;
    char line[64];
    int fd;

    (void)loop;
    (void)revents;
    while ((fd = accept4(a->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        agent_check_line(a->cfg, sbx_count_live(a->t), images_src_lacking(a->imgs), line,
                         sizeof(line));
        /* One short line into an empty socket buffer: it fits, or the peer is gone. */
        (void)!send(fd, line, strlen(line), MSG_NOSIGNAL);
        close(fd);
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        LOG(LOG_WARN, "agent check: accept: %s", strerror(errno));
}

int agent_check_start(struct ev_loop *loop, const struct srv_config *cfg, struct sbx_table *t,
                      const struct images_src *imgs, struct agent_check **out)
{
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    struct agent_check *a;
    int one = 1, r;

    if (strchr(cfg->listen_addr, ':')) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons((uint16_t)cfg->agent_check_port);
        if (inet_pton(AF_INET6, cfg->listen_addr, &s6->sin6_addr) != 1)
            return -EINVAL;
        sl = sizeof(*s6);
    } else {
        struct sockaddr_in *s4 = (struct sockaddr_in *)&ss;
        s4->sin_family = AF_INET;
        s4->sin_port = htons((uint16_t)cfg->agent_check_port);
        if (inet_pton(AF_INET, cfg->listen_addr, &s4->sin_addr) != 1)
            return -EINVAL;
        sl = sizeof(*s4);
    }
    a = calloc(1, sizeof(*a));
    if (!a)
        return -ENOMEM;
    a->loop = loop;
    a->cfg = cfg;
    a->t = t;
    a->imgs = imgs;
    a->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (a->fd < 0 || setsockopt(a->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
        bind(a->fd, (struct sockaddr *)&ss, sl) || listen(a->fd, 64)) {
        r = -errno;
        LOG(LOG_ERR, "agent check: cannot listen on %s:%u: %s", cfg->listen_addr,
            cfg->agent_check_port, strerror(errno));
        if (a->fd >= 0)
            close(a->fd);
        free(a);
        return r;
    }
    ev_io_init(&a->w, on_accept, a->fd, EV_READ);
    a->w.data = a;
    ev_io_start(loop, &a->w);
    LOG(LOG_INFO, "agent check on %s:%u (host %s)", cfg->listen_addr, cfg->agent_check_port,
        cfg->host_id);
    *out = a;
    return 0;
}

void agent_check_stop(struct agent_check *a)
{
    if (!a)
        return;
    ev_io_stop(a->loop, &a->w);
    close(a->fd);
    free(a);
}
