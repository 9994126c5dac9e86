/*
 * vmm_qmp.c - asynchronous QMP client on a connected unix socket.
 *
 * QMP answers commands in the order it receives them (we never use
 * exec-oob), so replies are matched to a FIFO of commands in flight; each
 * command also carries an "id" that the reply must echo, which turns any
 * mismatch into a clean protocol error instead of a wrong answer.
 * Asynchronous events are not replies: SHUTDOWN and STOP/RESUME are noted
 * (the SHUTDOWN reason ends up in the exit reason) and every event is handed
 * to vmm.c (vmm_qmp_event), which drives the VM's phase from them. A command
 * may carry one fd (getfd), sent with SCM_RIGHTS on its first byte.
 *
 * Commands issued before the capabilities handshake completes wait in a
 * second FIFO. Writes are attempted at once; a write watcher runs only
 * while the socket is full. A link failure drops queued commands without
 * calling them (the VM is about to exit; see vmm_qmp_lost).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <jansson.h>

#include "vmm_int.h"

struct vmm_qmp_cmd {
    struct vmm_qmp_cmd *next;
    vmm_qmp_cb cb;
    void *ud;
    unsigned long id;
    char *text; /* one JSON line, '\n' included */
    size_t len;
    int fd; /* passed with the first byte (SCM_RIGHTS), or -1; owned */
    bool had_fd;
};

static void cmd_free_list(struct vmm_qmp_cmd *c)
{
    while (c) {
        struct vmm_qmp_cmd *next = c->next;
        if (c->fd >= 0)
            close(c->fd);
        free(c->text);
        free(c);
        c = next;
    }
}

void vmm_qmp_init(struct vmm *vm, struct vmm_qmp *q)
{
    memset(q, 0, sizeof(*q));
    q->fd = -1;
    q->tx_fd = -1;
    q->wait_tail = &q->wait_head;
    q->fly_tail = &q->fly_head;
    q->next_id = 1;
    q->rw.data = vm;
    q->ww.data = vm;
}

void vmm_qmp_close(struct vmm *vm, struct vmm_qmp *q)
{
    struct ev_loop *loop = vmm_loop_of(vm);

    ev_io_stop(loop, &q->rw);
    ev_io_stop(loop, &q->ww);
    if (q->fd >= 0)
        close(q->fd);
    q->fd = -1;
    if (q->state != VMM_QMP_IDLE)
        q->state = VMM_QMP_CLOSED;
    cmd_free_list(q->wait_head);
    cmd_free_list(q->fly_head);
    q->wait_head = q->fly_head = NULL;
    q->wait_tail = &q->wait_head;
    q->fly_tail = &q->fly_head;
    if (q->tx_fd >= 0)
        close(q->tx_fd);
    q->tx_fd = -1;
    q->fd_busy = false;
    free(q->rx);
    free(q->tx);
    q->rx = q->tx = NULL;
    q->rx_len = q->rx_cap = q->tx_off = q->tx_len = q->tx_cap = 0;
}

static void fail(struct vmm *vm, struct vmm_qmp *q, const char *why)
{
    vmm_qmp_close(vm, q);
    vmm_qmp_lost(vm, why);
}

/* Write what is buffered; keep a write watcher only while the socket is full. */
/* Send n bytes with fd attached (it arrives with the first byte). */
static ssize_t send_fd(int sock, const char *buf, size_t n, int fd)
{
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = n};
    struct msghdr m = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *c;

    memset(ctl, 0, sizeof(ctl));
    c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &m, MSG_NOSIGNAL);
}

static int flush(struct vmm *vm, struct vmm_qmp *q)
{
    while (q->tx_off < q->tx_len) {
        /* Bytes before a command carrying an fd go alone, so the fd travels
         * with that command's first byte and QEMU's getfd finds it. */
        bool with_fd = q->tx_fd >= 0 && q->tx_off == q->tx_fd_off;
        size_t end = q->tx_fd >= 0 && q->tx_off < q->tx_fd_off ? q->tx_fd_off : q->tx_len;
        ssize_t w = with_fd ? send_fd(q->fd, q->tx + q->tx_off, end - q->tx_off, q->tx_fd)
                            : send(q->fd, q->tx + q->tx_off, end - q->tx_off, MSG_NOSIGNAL);
        if (w > 0 && with_fd) {
            close(q->tx_fd);
            q->tx_fd = -1;
        }
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN) {
                ev_io_start(vmm_loop_of(vm), &q->ww);
                return 0;
            }
            return -errno;
        }
        q->tx_off += (size_t)w;
    }
    q->tx_off = q->tx_len = 0;
    ev_io_stop(vmm_loop_of(vm), &q->ww);
    return 0;
}

static int tx_append(struct vmm_qmp *q, const char *s, size_t n)
{
    if (q->tx_off > 0 && q->tx_off == q->tx_len)
        q->tx_off = q->tx_len = 0;
    if (q->tx_len + n > q->tx_cap) {
        size_t cap = q->tx_cap ? q->tx_cap : 4096;
        char *t;
        while (cap < q->tx_len + n)
            cap *= 2;
        if (!(t = realloc(q->tx, cap)))
            return -ENOMEM;
        q->tx = t;
        q->tx_cap = cap;
    }
    memcpy(q->tx + q->tx_len, s, n);
    q->tx_len += n;
    return 0;
}

/* Move one command onto the wire and into the in-flight FIFO. */
static int issue(struct vmm *vm, struct vmm_qmp *q, struct vmm_qmp_cmd *c)
{
    size_t at = q->tx_off > 0 && q->tx_off == q->tx_len ? 0 : q->tx_len;
    int r;

    if (c->fd >= 0 && q->tx_fd >= 0)
        return -EBUSY; /* vmm_qmp_send_fd lets one through at a time */
    if ((r = tx_append(q, c->text, c->len)) != 0)
        return r;
    if (c->fd >= 0) {
        q->tx_fd = c->fd;
        q->tx_fd_off = at;
        c->fd = -1;
    }
    c->next = NULL;
    *q->fly_tail = c;
    q->fly_tail = &c->next;
    return 0;
}

static void on_ready(struct vmm *vm, struct vmm_qmp *q)
{
    struct vmm_qmp_cmd *c = q->wait_head;

    q->state = VMM_QMP_READY;
    q->wait_head = NULL;
    q->wait_tail = &q->wait_head;
    while (c) {
        struct vmm_qmp_cmd *next = c->next;
        if (issue(vm, q, c) != 0) {
            cmd_free_list(c);
            fail(vm, q, "out of memory queueing QMP commands");
            return;
        }
        c = next;
    }
    if (flush(vm, q) != 0)
        fail(vm, q, "QMP write failed");
}

/* Record what the exit reason needs. Returns the event name (or NULL). */
static const char *note_event(struct vmm_qmp *q, json_t *msg)
{
    const char *ev = json_string_value(json_object_get(msg, "event"));
    json_t *data = json_object_get(msg, "data");

    if (!ev)
        return NULL;
    if (strcmp(ev, "SHUTDOWN") == 0) {
        const char *why = json_string_value(json_object_get(data, "reason"));
        snprintf(q->shutdown_reason, sizeof(q->shutdown_reason), "%s", why ? why : "shutdown");
    } else if (strcmp(ev, "STOP") == 0) {
        q->stopped = true;
    } else if (strcmp(ev, "RESUME") == 0) {
        q->stopped = false;
    }
    return ev;
}

/* Handle one message. Returns false if processing must stop (link failed,
 * or the owner detached/freed the VM from inside a callback). */
static bool handle(struct vmm *vm, struct vmm_qmp *q, json_t *msg)
{
    json_t *ret, *err, *id;
    struct vmm_qmp_cmd *c;
    char *text;

    if (json_object_get(msg, "event")) {
        const char *ev = note_event(q, msg);
        json_t *data = json_object_get(msg, "data");
        if (ev && q->state == VMM_QMP_READY) {
            vmm_qmp_event(vm, ev, json_string_value(json_object_get(data, "status")));
            return vmm_live(vm) && q->state == VMM_QMP_READY;
        }
        return true;
    }
    ret = json_object_get(msg, "return");
    err = json_object_get(msg, "error");
    switch (q->state) {
    case VMM_QMP_GREETING:
        if (!json_object_get(msg, "QMP")) {
            fail(vm, q, "QMP greeting missing");
            return false;
        }
        q->state = VMM_QMP_CAPS;
        if (tx_append(q, "{\"execute\":\"qmp_capabilities\"}\n", 31) != 0 || flush(vm, q) != 0) {
            fail(vm, q, "QMP write failed");
            return false;
        }
        return true;
    case VMM_QMP_CAPS:
        if (!ret) {
            fail(vm, q, "qmp_capabilities refused");
            return false;
        }
        on_ready(vm, q);
        return q->state == VMM_QMP_READY;
    case VMM_QMP_READY:
        break;
    default:
        return false;
    }
    c = q->fly_head;
    id = json_object_get(msg, "id");
    if ((!ret && !err) || !c || !json_is_integer(id) ||
        (unsigned long)json_integer_value(id) != c->id) {
        fail(vm, q, "unexpected QMP reply");
        return false;
    }
    q->fly_head = c->next;
    if (!q->fly_head)
        q->fly_tail = &q->fly_head;
    if (c->had_fd)
        q->fd_busy = false;
    if (c->cb) {
        text = json_dumps(ret ? ret : err, JSON_COMPACT | JSON_ENCODE_ANY);
        c->cb(c->ud, ret ? 0 : -EREMOTEIO, text ? text : "null");
        free(text);
    }
    free(c->text);
    free(c);
    /* The callback may have detached or freed the VM, or closed the link. */
    return vmm_live(vm) && q->state == VMM_QMP_READY;
}

static void on_read(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;
    struct vmm_qmp *q = vmm_qmp_of(vm);
    ssize_t n;

    vmm_enter(vm);
    for (;;) {
        if (q->rx_cap - q->rx_len < 4096) {
            size_t cap = q->rx_cap ? q->rx_cap * 2 : 16384;
            char *b;
            if (cap > VMM_QMP_MAX_MSG + 4096) {
                fail(vm, q, "QMP message too large");
                goto out;
            }
            if (!(b = realloc(q->rx, cap))) {
                fail(vm, q, "out of memory reading QMP");
                goto out;
            }
            q->rx = b;
            q->rx_cap = cap;
        }
        n = read(q->fd, q->rx + q->rx_len, q->rx_cap - q->rx_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            break;
        if (n <= 0) {
            fail(vm, q, n == 0 ? "QMP socket closed" : "QMP read failed");
            goto out;
        }
        q->rx_len += (size_t)n;
        /* Take complete lines one at a time: a callback may close the link,
         * which frees rx, so nothing here outlives a handle() call. */
        for (;;) {
            char *nl = memchr(q->rx, '\n', q->rx_len);
            size_t len;
            json_t *msg;
            bool go;
            if (!nl)
                break;
            len = (size_t)(nl - q->rx) + 1;
            msg = json_loadb(q->rx, len, 0, NULL);
            memmove(q->rx, q->rx + len, q->rx_len - len);
            q->rx_len -= len;
            if (!msg || !json_is_object(msg)) {
                json_decref(msg);
                fail(vm, q, "malformed QMP message");
                goto out;
            }
            go = handle(vm, q, msg);
            json_decref(msg);
            if (!go)
                goto out;
        }
    }
out:
    vmm_leave(vm);
}

static void on_write(struct ev_loop *loop, ev_io *w, int revents)
{
    struct vmm *vm = w->data;
    struct vmm_qmp *q = vmm_qmp_of(vm);

    vmm_enter(vm);
    if (flush(vm, q) != 0)
        fail(vm, q, "QMP write failed");
    vmm_leave(vm);
}

void vmm_qmp_attach(struct vmm *vm, struct vmm_qmp *q, int fd)
{
    q->fd = fd;
    q->state = VMM_QMP_GREETING;
    ev_io_init(&q->rw, on_read, fd, EV_READ);
    ev_io_init(&q->ww, on_write, fd, EV_WRITE);
    q->rw.data = vm;
    q->ww.data = vm;
    ev_io_start(vmm_loop_of(vm), &q->rw);
}

static int send_cmd(struct vmm *vm, struct vmm_qmp *q, const char *json, int fd, bool first,
                    vmm_qmp_cb cb, void *ud)
{
    struct vmm_qmp_cmd *c = NULL;
    json_t *o;
    int r;

    /* Whatever comes now may run the guest, which writes TCG's buffer (not the
     * handshake's query-status, which comes first). */
    if (!first)
        vmm_pf_stop(vm);
    if (q->state == VMM_QMP_CLOSED)
        return -EPIPE;
    if (fd >= 0 && q->fd_busy)
        return -EBUSY;
    /* A frozen QEMU (SIGSTOP, vmm_freeze) would answer nothing: continue it. */
    if (vmm_frozen(vm) && (r = vmm_thaw(vm)) != 0)
        return r;
    o = json_loads(json, 0, NULL);
    /* exec-oob replies out of order and is not negotiated: only "execute". */
    if (!json_is_object(o) || !json_is_string(json_object_get(o, "execute")) ||
        json_object_get(o, "exec-oob")) {
        json_decref(o);
        return -EINVAL;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
        r = -ENOMEM;
        goto fail;
    }
    c->cb = cb;
    c->ud = ud;
    c->fd = -1;
    if (fd >= 0 && (c->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0) {
        r = -errno;
        goto fail;
    }
    c->had_fd = fd >= 0;
    c->id = q->next_id++;
    if (json_object_set_new(o, "id", json_integer((json_int_t)c->id)) != 0 ||
        !(c->text = json_dumps(o, JSON_COMPACT))) {
        r = -ENOMEM;
        goto fail;
    }
    c->len = strlen(c->text);
    {
        char *t = realloc(c->text, c->len + 2);
        if (!t) {
            r = -ENOMEM;
            goto fail;
        }
        c->text = t;
        c->text[c->len++] = '\n';
        c->text[c->len] = 0;
    }
    json_decref(o);
    o = NULL;
    if (c->had_fd)
        q->fd_busy = true;
    if (q->state != VMM_QMP_READY && first) {
        c->next = q->wait_head;
        q->wait_head = c;
        if (!c->next)
            q->wait_tail = &c->next;
        return 0;
    }
    if (q->state != VMM_QMP_READY) {
        *q->wait_tail = c;
        q->wait_tail = &c->next;
        return 0;
    }
    if ((r = issue(vm, q, c)) != 0)
        goto fail;
    /* A write error surfaces through the read side (EOF) and vmm_qmp_lost;
     * failing here would call nothing the caller can act on. */
    if (flush(vm, q) != 0)
        ev_io_start(vmm_loop_of(vm), &q->ww);
    return 0;
fail:
    json_decref(o);
    if (c) {
        if (c->fd >= 0)
            close(c->fd);
        if (c->had_fd)
            q->fd_busy = false;
        free(c->text);
        free(c);
    }
    return r;
}

int vmm_qmp_send(struct vmm *vm, struct vmm_qmp *q, const char *json, vmm_qmp_cb cb, void *ud)
{
    return send_cmd(vm, q, json, -1, false, cb, ud);
}

int vmm_qmp_send_first(struct vmm *vm, struct vmm_qmp *q, const char *json, vmm_qmp_cb cb, void *ud)
{
    return send_cmd(vm, q, json, -1, true, cb, ud);
}

int vmm_qmp_send_fd(struct vmm *vm, struct vmm_qmp *q, const char *json, int fd, vmm_qmp_cb cb,
                    void *ud)
{
    if (fd < 0)
        return -EBADF;
    return send_cmd(vm, q, json, fd, false, cb, ud);
}

void vmm_qmp_drain_events(struct vmm *vm, struct vmm_qmp *q)
{
    size_t start = 0;

    if (q->fd < 0)
        return;
    for (;;) {
        ssize_t n;
        if (q->rx_cap - q->rx_len < 4096) {
            size_t cap = q->rx_cap ? q->rx_cap * 2 : 16384;
            char *b;
            if (cap > VMM_QMP_MAX_MSG + 4096 || !(b = realloc(q->rx, cap)))
                break;
            q->rx = b;
            q->rx_cap = cap;
        }
        n = read(q->fd, q->rx + q->rx_len, q->rx_cap - q->rx_len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        q->rx_len += (size_t)n;
    }
    while (start < q->rx_len) {
        char *nl = memchr(q->rx + start, '\n', q->rx_len - start);
        size_t len;
        json_t *msg;
        if (!nl)
            break;
        len = (size_t)(nl - (q->rx + start)) + 1;
        msg = json_loadb(q->rx + start, len, 0, NULL);
        if (msg && json_object_get(msg, "event"))
            note_event(q, msg);
        json_decref(msg);
        start += len;
    }
    q->rx_len = 0;
}
