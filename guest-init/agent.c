/*
 * agent.c - the frame loop of warren-init: channel I/O, the stream table,
 * host sessions (HELLO/INIT) and dispatch to exec.c and files.c.
 *
 * One thread, one poll() per iteration: decode whole frames, let streams
 * produce output while the queue has room, write the queue as far as the
 * channel accepts it, then sweep finished streams. Nothing blocks except
 * poll() itself and, in PID 1 mode, the wait for a host to (re)connect.
 *
 * The channel is virtio-serial in the guest: while the host end is closed
 * poll() reports POLLHUP continuously, so a hang-up ends the session and
 * the agent sleeps on SIGIO (O_ASYNC) with a slow fallback timer until the
 * host opens the port again, then greets it with HELLO {id: 0}.
 */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/random.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define HUP_WAIT_MS  1000 /* fallback wake-up while the host end is closed */
#define ENTROPY_MAX  512  /* bytes of INIT entropy fed to the kernel */
#define HOSTNAME_MAX 64

void gi_log(const char *fmt, ...)
{
    char line[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "warren-init: agent: %s\n", line);
}

int64_t gi_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t gi_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

bool gi_out_full(const struct gi_agent *a)
{
    return proto_buf_pending(&a->out) >= GI_OUT_HIGH;
}

/* ---- stream table ---- */

struct gi_stream *gi_stream_find(struct gi_agent *a, uint32_t id)
{
    for (size_t i = 0; i < a->nstreams; i++) {
        struct gi_stream *s = a->streams[i];
        if (!s->done && s->id == id)
            return s;
    }
    return NULL;
}

static struct gi_stream *stream_alloc(enum gi_kind kind, uint32_t id)
{
    struct gi_stream *s = calloc(1, sizeof(*s));

    if (!s)
        return NULL;
    s->id = id;
    s->kind = kind;
    /* fds start at -1 so a stream released half-built never closes fd 0 */
    if (kind == GI_EXEC) {
        s->u.x.out[0] = s->u.x.out[1] = s->u.x.in = s->u.x.rep = -1;
        proto_buf_init(&s->u.x.inq);
    } else if (kind != GI_LIST) {
        s->u.f.fd = -1;
    }
    return s;
}

struct gi_stream *gi_stream_new(struct gi_agent *a, uint32_t id, enum gi_kind kind)
{
    struct gi_stream *s;

    if (id == 0) {
        gi_reply_error(a, id, EINVAL, "stream id 0 is reserved");
        return NULL;
    }
    if (gi_stream_find(a, id)) {
        gi_reply_error(a, id, EEXIST, "stream %u is still active", id);
        return NULL;
    }
    if (a->nstreams >= GI_MAX_STREAMS) {
        gi_reply_error(a, id, EMFILE, "too many streams");
        return NULL;
    }
    if (a->nstreams == a->cap_streams) {
        size_t cap = a->cap_streams ? 2 * a->cap_streams : 64;
        struct gi_stream **v = realloc(a->streams, cap * sizeof(*v));
        if (!v)
            goto nomem;
        a->streams = v;
        a->cap_streams = cap;
    }
    s = stream_alloc(kind, id);
    if (!s)
        goto nomem;
    a->streams[a->nstreams++] = s;
    return s;
nomem:
    gi_reply_error(a, id, ENOMEM, "out of memory");
    return NULL;
}

static void stream_free(struct gi_stream *s)
{
    if (s->kind == GI_EXEC)
        gi_exec_release(s);
    else if (s->kind != GI_ATTACH)
        gi_file_release(s);
    free(s);
}

/* Free the streams marked done; runs when no handler holds a stream pointer. */
static void sweep(struct gi_agent *a)
{
    size_t j = 0;

    for (size_t i = 0; i < a->nstreams; i++) {
        if (a->streams[i]->done)
            stream_free(a->streams[i]);
        else
            a->streams[j++] = a->streams[i];
    }
    a->nstreams = j;
    gi_proc_sweep(a);
}

void gi_orphan_add(struct gi_agent *a, pid_t pid, char *cgroup)
{
    if (pid <= 0 && (!cgroup || rmdir(cgroup) == 0 || errno == ENOENT)) {
        free(cgroup); /* nothing left to wait for */
        return;
    }
    if (a->norphans == GI_MAX_ORPHANS) {
        gi_log("too many orphans; forgetting pid %d", (int)pid);
        free(cgroup);
        return;
    }
    a->orphans[a->norphans].pid = pid;
    a->orphans[a->norphans].cgroup = cgroup;
    a->norphans++;
}

/* ---- replies ---- */

void gi_reply_error(struct gi_agent *a, uint32_t id, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (proto_send_error(&a->out, id, err, msg) != 0)
        gi_log("could not queue ERROR for %u: %s", id, msg);
}

void gi_reply_ok(struct gi_agent *a, uint32_t id)
{
    struct proto_enc e;

    if (proto_enc_begin(&e, &a->out, PROTO_RESULT, id, 2) == 0)
        proto_enc_end(&e);
}

static void send_hello(struct gi_agent *a, uint32_t id)
{
    struct proto_enc e;

    if (proto_enc_begin(&e, &a->out, PROTO_HELLO, id, 4) != 0)
        return;
    proto_put_u(&e, PK_V, PROTO_VERSION);
    proto_put_cstr(&e, PK_KERNEL, a->kernel);
    proto_enc_end(&e);
}

static void send_pong(struct gi_agent *a, uint32_t id)
{
    struct proto_enc e;

    if (proto_enc_begin(&e, &a->out, PROTO_PONG, id, 2) == 0)
        proto_enc_end(&e);
}

/* ---- sessions ---- */

/*
 * End every stream of the current host session: foreground processes are
 * killed, files closed, attach streams dropped. Background processes and
 * PTYs stay, with their rings: the next host session finds them (PLIST).
 */
static void session_end(struct gi_agent *a)
{
    gi_proc_session_end(a);
    for (size_t i = 0; i < a->nstreams; i++) {
        struct gi_stream *s = a->streams[i];
        if (s->done)
            continue;
        if (s->kind == GI_EXEC)
            gi_exec_abort(a, s);
        s->done = true;
    }
}

/* 0, or -errno (logged). */
static int set_clock(const struct proto_frame *f)
{
    struct timespec ts;
    uint64_t ns = f->v[PK_TIME_NS].u;

    ts.tv_sec = (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    if (clock_settime(CLOCK_REALTIME, &ts) != 0) {
        int r = -errno;
        gi_log("clock_settime: %s", strerror(errno));
        return r;
    }
    return 0;
}

/*
 * Clones of one snapshot share the kernel RNG state: mix in the host's
 * bytes, credit them, and force the CRNG to reseed now rather than at its
 * next scheduled reseed, before any user command can draw from it. A kernel
 * without RNDRESEEDCRNG (before 4.17: EINVAL) still gets the bytes mixed and
 * credited; its CRNG takes them at its next scheduled reseed (minutes at
 * worst), so that is logged and not an error. 0, or -errno (logged).
 */
static int add_entropy(struct gi_agent *a, const struct proto_frame *f)
{
    const struct proto_str *e = &f->v[PK_ENTROPY].s;
    size_t n = e->len < ENTROPY_MAX ? e->len : ENTROPY_MAX;
    /* rand_pool_info ends in a flexible array: give it room in an aligned buffer. */
    _Alignas(struct rand_pool_info) uint8_t raw[sizeof(struct rand_pool_info) + ENTROPY_MAX];
    struct rand_pool_info *info = (struct rand_pool_info *)raw;
    int fd, r = 0;

    if (n == 0)
        return 0;
    info->entropy_count = (int)(n * 8);
    info->buf_size = (int)n;
    memcpy(info->buf, e->p, n);
    /* Kept open: opening it cost ~1 ms a time under TCG, on every thaw's path. */
    if (a->urandom_fd < 0 && (a->urandom_fd = open("/dev/urandom", O_RDWR | O_CLOEXEC)) < 0) {
        r = -errno;
        gi_log("open /dev/urandom: %s", strerror(errno));
        return r;
    }
    fd = a->urandom_fd;
    if (ioctl(fd, RNDADDENTROPY, info) != 0) {
        r = -errno;
        gi_log("RNDADDENTROPY: %s", strerror(errno));
    }
#ifdef RNDRESEEDCRNG
    if (r == 0 && ioctl(fd, RNDRESEEDCRNG) != 0)
        gi_log("RNDRESEEDCRNG: %s (the CRNG takes the new bytes at its next reseed)",
               strerror(errno));
#endif
    return r;
}

/* 0, or -errno (logged). */
static int set_hostname(const struct proto_frame *f)
{
    const struct proto_str *h = &f->v[PK_HOSTNAME].s;

    if (h->len == 0 || h->len > HOSTNAME_MAX || memchr(h->p, '\0', h->len)) {
        gi_log("ignoring an invalid hostname");
        return -EINVAL;
    }
    if (sethostname(h->p, h->len) != 0) {
        int r = -errno;
        gi_log("sethostname: %s", strerror(errno));
        return r;
    }
    return 0;
}

/*
 * The kernel's /proc/sys/kernel/random/boot_id is read-only and fixed at
 * boot, so clones of one snapshot would all show the template's. The host's
 * id goes into opts->boot_id_file (GI_BOOT_ID_FILE: on /run, a tmpfs,
 * root's), which is bind-mounted over opts->boot_id_target (the proc file)
 * the first time: every reader of the usual path sees it from then on. Later
 * ids are written in place (same size, one write), so the mount keeps
 * pointing at the file. Code that asks the kernel some other way (a /proc
 * mounted afresh in a new mount namespace) still sees the kernel's own id.
 * 0, or -errno (logged).
 */
static int set_boot_id(struct gi_agent *a, const struct proto_frame *f)
{
    const struct proto_str *b = &f->v[PK_BOOT_ID].s;
    char line[PROTO_BOOT_ID + 1];
    int fd, r = 0;

    memcpy(line, b->p, PROTO_BOOT_ID); /* the decoder checked its length and digits */
    line[PROTO_BOOT_ID] = '\n';
    fd = open(a->opts->boot_id_file, O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
    if (fd < 0 || pwrite(fd, line, sizeof(line), 0) != (ssize_t)sizeof(line)) {
        r = -errno;
        gi_log("%s: %s", a->opts->boot_id_file, strerror(errno));
        goto out;
    }
    if (!a->boot_id_mounted) {
        if (mount(a->opts->boot_id_file, a->opts->boot_id_target, NULL, MS_BIND, NULL) != 0) {
            r = -errno;
            gi_log("bind-mount %s over %s: %s", a->opts->boot_id_file, a->opts->boot_id_target,
                   strerror(errno));
            goto out;
        }
        a->boot_id_mounted = true;
    }
out:
    if (fd >= 0)
        close(fd);
    return r;
}

/*
 * INIT starts a new host session. The old streams end first so nothing of
 * theirs runs under the new clock/RNG; the machine state (clock, RNG,
 * hostname) is only touched as PID 1: in a unit test on the host it would
 * change the host itself. HELLO {id} tells the host the guest is ready.
 */
static void handle_init(struct gi_agent *a, const struct proto_frame *f)
{
    session_end(a);
    /* Both apply to processes started from now on. */
    a->ring_cap = proto_has(f, PK_RING) ? f->v[PK_RING].u : GI_RING_DEFAULT;
    a->max_procs = proto_has(f, PK_MAX_PROCS) ? (size_t)f->v[PK_MAX_PROCS].u : GI_PROCS_DEFAULT;
    if (a->max_procs < 1)
        a->max_procs = 1;
    if (a->max_procs > GI_PROCS_MAX)
        a->max_procs = GI_PROCS_MAX;
    if (a->opts->pid1) {
        if (proto_has(f, PK_TIME_NS))
            set_clock(f);
        if (proto_has(f, PK_ENTROPY))
            add_entropy(a, f);
        if (proto_has(f, PK_HOSTNAME))
            set_hostname(f);
    }
    send_hello(a, f->id);
}

/*
 * RESYNC: the host stopped, restored or cloned this VM and says what time it
 * is, with fresh entropy, and maybe a new boot id and hostname. Unlike INIT
 * it ends no stream and touches no process: a command the host sends right
 * after it runs under the new clock and RNG (frames are handled in order).
 * Everything is applied even if one part fails; the answer names the first
 * failure. Clock, RNG and hostname are only touched as PID 1 (see
 * handle_init); the boot id goes where opts says.
 */
static void handle_resync(struct gi_agent *a, const struct proto_frame *f)
{
    int r = 0, q;
    const char *what = "";

    if (a->opts->pid1) {
        /* The decoder guarantees time_ns and entropy; boot_id and hostname are optional. */
        if ((q = set_clock(f)) && !r)
            r = q, what = "clock_settime";
        if ((q = add_entropy(a, f)) && !r)
            r = q, what = "RNDADDENTROPY";
        if (proto_has(f, PK_HOSTNAME) && (q = set_hostname(f)) && !r)
            r = q, what = "sethostname";
    }
    /* Files of its own: a unit test can point them into a private mount namespace. */
    if (proto_has(f, PK_BOOT_ID) && a->opts->boot_id_file && a->opts->boot_id_target &&
        (q = set_boot_id(a, f)) && !r)
        r = q, what = "boot_id";
    if (r)
        gi_reply_error(a, f->id, -r, "resync: %s: %s", what, strerror(-r));
    else
        gi_reply_ok(a, f->id);
}

/* ---- dispatch ---- */

static struct gi_stream *find_kind(struct gi_agent *a, uint32_t id, enum gi_kind kind)
{
    struct gi_stream *s = gi_stream_find(a, id);
    return s && s->kind == kind ? s : NULL;
}

static void handle_credit(struct gi_agent *a, const struct proto_frame *f)
{
    struct gi_stream *s = gi_stream_find(a, f->id);

    /* Credit for a stream that already ended is normal (it crossed the EXIT/END). */
    if (!s || !proto_has(f, PK_N))
        return;
    if (s->kind == GI_EXEC)
        gi_exec_credit(a, s, f->v[PK_N].u);
    else if (s->kind == GI_FREAD)
        gi_file_credit(s, f->v[PK_N].u);
    else if (s->kind == GI_ATTACH)
        gi_attach_credit(s, f->v[PK_N].u);
}

static void handle_signal(struct gi_agent *a, const struct proto_frame *f)
{
    struct gi_stream *s = find_kind(a, f->id, GI_EXEC);

    /* No reply either way: the stream's last frame is still its EXIT. */
    if (s && proto_has(f, PK_SIG))
        gi_exec_signal(a, s, (int)f->v[PK_SIG].i);
    /* On a file transfer, any signal aborts it (ERROR ECANCELED ends the stream). */
    if (!s && ((s = find_kind(a, f->id, GI_FREAD)) || (s = find_kind(a, f->id, GI_FWRITE))))
        gi_file_abort(a, s);
}

/* DATA, STDIN and END for an unknown id are dropped: the stream failed or ended. */
static void dispatch(struct gi_agent *a, const struct proto_frame *f)
{
    struct gi_stream *s;

    switch (f->type) {
    case PROTO_INIT:
        handle_init(a, f);
        break;
    case PROTO_PING:
        send_pong(a, f->id);
        break;
    case PROTO_EXEC:
        gi_exec_start(a, f);
        break;
    case PROTO_STDIN:
        if ((s = find_kind(a, f->id, GI_EXEC)))
            gi_exec_stdin(a, s, f);
        break;
    case PROTO_SIGNAL:
        handle_signal(a, f);
        break;
    case PROTO_CREDIT:
        handle_credit(a, f);
        break;
    case PROTO_FWRITE:
        gi_file_write(a, f);
        break;
    case PROTO_DATA:
        if ((s = find_kind(a, f->id, GI_FWRITE)))
            gi_file_data(a, s, f);
        break;
    case PROTO_END:
        if ((s = find_kind(a, f->id, GI_FWRITE)))
            gi_file_end(a, s);
        break;
    case PROTO_FREAD:
        gi_file_read(a, f);
        break;
    case PROTO_STAT:
        gi_file_stat(a, f);
        break;
    case PROTO_LIST:
        gi_file_list(a, f);
        break;
    case PROTO_MKDIR:
        gi_file_mkdir(a, f);
        break;
    case PROTO_REMOVE:
        gi_file_remove(a, f);
        break;
    case PROTO_RENAME:
        gi_file_rename(a, f);
        break;
    case PROTO_PONG:
        break;
    case PROTO_ATTACH:
        gi_proc_attach(a, f);
        break;
    case PROTO_DETACH:
        gi_proc_detach(a, f->id);
        break;
    case PROTO_PLIST:
        gi_proc_list(a, f);
        break;
    case PROTO_PCTL:
        gi_proc_ctl(a, f);
        break;
    case PROTO_RESYNC:
        handle_resync(a, f);
        break;
    default:
        gi_reply_error(a, f->id, EINVAL, "unexpected frame type %s", proto_type_name(f->type));
        break;
    }
}

/*
 * Decode and dispatch whole frames while the output queue has room for
 * their replies; the rest waits in the buffer (and the channel is not read
 * meanwhile), which is what pushes back on a host that floods requests.
 * Returns PROTO_ETOOBIG when the stream announced an oversized frame.
 */
static int process_input(struct gi_agent *a)
{
    size_t pos = 0;
    int r = 0;

    while (!gi_out_full(a)) {
        const uint8_t *pl;
        size_t pl_len, used;
        struct proto_frame f;
        int d;

        r = proto_frame_split(a->in + pos, a->in_len - pos, &pl, &pl_len, &used);
        if (r != 0)
            break;
        d = proto_decode(pl, pl_len, &a->zone, &f);
        if (d == 0)
            dispatch(a, &f);
        else
            gi_log("dropped a malformed frame (%zu bytes): %s", pl_len, proto_strerror(d));
        msgpack_zone_clear(&a->zone);
        pos += used;
    }
    memmove(a->in, a->in + pos, a->in_len - pos);
    a->in_len -= pos;
    return r == PROTO_ETOOBIG ? r : 0;
}

/* ---- channel ---- */

static void chan_read(struct gi_agent *a)
{
    ssize_t n;

    do
        n = read(a->fd, a->in + a->in_len, GI_IN_CAP - a->in_len);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
        if (!a->desync)
            a->in_len += (size_t)n;
    } else if (n == 0 || errno != EAGAIN) {
        a->hup = true;
    }
}

static void chan_flush(struct gi_agent *a)
{
    while (proto_buf_pending(&a->out) > 0 && !a->hup) {
        ssize_t n = write(a->fd, a->out.p + a->out.off, proto_buf_pending(&a->out));
        if (n > 0)
            proto_buf_consume(&a->out, (size_t)n);
        else if (n < 0 && errno == EINTR)
            continue;
        else if (n < 0 && errno == EAGAIN)
            break;
        else
            a->hup = true;
    }
}

static void drain_signals(struct gi_agent *a)
{
    struct signalfd_siginfo si[16];

    /* SIGIO only wakes us; SIGCHLD may stand for many children, so reap them all. */
    while (read(a->sigfd, si, sizeof(si)) > 0)
        ;
    gi_exec_reap(a);
}

static int async_notify(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0)
        return -errno;
    if (on && (fcntl(fd, F_SETOWN, getpid()) != 0 || fcntl(fd, F_SETSIG, SIGIO) != 0))
        return -errno;
    fl = on ? fl | O_ASYNC : fl & ~O_ASYNC;
    return fcntl(fd, F_SETFL, fl) == 0 ? 0 : -errno;
}

/*
 * PID 1: sleep until the host end is open (no POLLHUP). The port raises
 * SIGIO when the host connects; the timeout is only a fallback, so an idle
 * guest without a host costs one wake-up a second. Children are still
 * reaped meanwhile.
 */
static int wait_host(struct gi_agent *a)
{
    int r = async_notify(a->fd, true);

    if (r < 0)
        gi_log("O_ASYNC on the channel: %s (polling instead)", strerror(-r));
    for (;;) {
        struct pollfd p = {.fd = a->fd, .events = POLLIN};
        struct pollfd ps = {.fd = a->sigfd, .events = POLLIN};

        if (poll(&p, 1, 0) < 0 && errno != EINTR)
            return -errno;
        if (p.revents & POLLNVAL)
            return -EBADF;
        if (!(p.revents & (POLLHUP | POLLERR)))
            break;
        if (poll(&ps, 1, HUP_WAIT_MS) > 0)
            drain_signals(a);
    }
    async_notify(a->fd, false);
    return 0;
}

/* The host end is gone: buffered bytes of either direction belong to the old host. */
static void on_hangup(struct gi_agent *a)
{
    session_end(a);
    a->in_len = 0;
    proto_buf_consume(&a->out, proto_buf_pending(&a->out));
    a->hup = false;
    a->desync = false;
}

/* ---- the loop ---- */

static int reserve_poll(struct gi_agent *a, size_t n)
{
    struct pollfd *p;
    struct gi_watch *w;

    if (n <= a->pcap)
        return 0;
    p = realloc(a->pfd, n * sizeof(*p));
    if (!p)
        return -ENOMEM;
    a->pfd = p;
    w = realloc(a->watch, n * sizeof(*w));
    if (!w)
        return -ENOMEM;
    a->watch = w;
    a->pcap = n;
    return 0;
}

/* Fill the poll set; returns its size and sets *timeout (ms, -1 = none) and *hold (the
 * earliest end of a PTY's hold, gi_now_us, or 0). */
static int build_poll(struct gi_agent *a, int *timeout, int64_t *hold)
{
    int64_t now = gi_now_ms(), now_us = gi_now_us(), next = 0;
    bool full = gi_out_full(a);
    int n = 2;

    a->pfd[0] = (struct pollfd){.fd = a->fd};
    if (a->in_len < GI_IN_CAP && !full)
        a->pfd[0].events |= POLLIN;
    if (proto_buf_pending(&a->out) > 0)
        a->pfd[0].events |= POLLOUT;
    a->pfd[1] = (struct pollfd){.fd = a->sigfd, .events = POLLIN};
    *timeout = -1;
    for (size_t i = 0; i < a->nstreams; i++) {
        struct gi_stream *s = a->streams[i];
        int slot[GI_EXEC_WATCH], k;

        if (s->done)
            continue;
        if (s->kind == GI_ATTACH) {
            if (!full && gi_attach_ready(a, s))
                *timeout = 0;
            continue;
        }
        if (s->kind != GI_EXEC) {
            if (!full && gi_file_ready(s))
                *timeout = 0;
            continue;
        }
        k = gi_exec_watch(a, s, &a->pfd[n], slot);
        for (int j = 0; j < k; j++)
            a->watch[n + j] = (struct gi_watch){.s = s, .slot = slot[j]};
        n += k;
        int64_t d = gi_exec_tick(a, s, now);
        if (d && (!next || d < next))
            next = d;
    }
    /* Background processes are always read: their output goes to their rings. */
    for (size_t i = 0; i < a->nprocs; i++) {
        int64_t h;
        int slot[GI_EXEC_WATCH], k = gi_proc_watch(a, a->procs[i], &a->pfd[n], slot, now_us, &h);
        for (int j = 0; j < k; j++)
            a->watch[n + j] = (struct gi_watch){.p = a->procs[i], .slot = slot[j]};
        n += k;
        if (h && (!*hold || h < *hold))
            *hold = h;
    }
    if (next && *timeout != 0)
        *timeout = next - now > 0 ? (int)(next - now) : 0;
    return n;
}

/* One turn per stream that produces without polling (file reads, listings, attach
 * readers): fair. */
static void pump_files(struct gi_agent *a)
{
    for (size_t i = 0; i < a->nstreams && !gi_out_full(a); i++) {
        struct gi_stream *s = a->streams[i];
        if (s->done || s->kind == GI_EXEC)
            continue;
        if (s->kind == GI_ATTACH) {
            if (gi_attach_ready(a, s))
                gi_attach_pump(a, s);
        } else if (gi_file_ready(s)) {
            gi_file_pump(a, s);
        }
    }
}

static int iterate(struct gi_agent *a)
{
    int n, timeout, r;
    int64_t hold = 0, us = -1;
    struct timespec ts;
    short ev;

    r = reserve_poll(a, 2 + GI_EXEC_WATCH * (a->nstreams + a->nprocs));
    if (r < 0)
        return r;
    n = build_poll(a, &timeout, &hold);
    if (timeout >= 0)
        us = (int64_t)timeout * 1000;
    if (hold) {
        int64_t left = hold - gi_now_us();
        left = left > 0 ? left : 0;
        us = us < 0 || left < us ? left : us;
    }
    ts = (struct timespec){.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    if (ppoll(a->pfd, (nfds_t)n, us < 0 ? NULL : &ts, NULL) < 0)
        return errno == EINTR ? 0 : -errno;
    if (a->pfd[1].revents)
        drain_signals(a);
    ev = a->pfd[0].revents;
    if (ev & POLLNVAL)
        return -EBADF;
    if (ev & POLLIN)
        chan_read(a);
    else if (ev & (POLLHUP | POLLERR))
        a->hup = true;
    for (int i = 2; i < n; i++) {
        if (!a->pfd[i].revents)
            continue;
        if (a->watch[i].p)
            gi_proc_event(a, a->watch[i].p, a->watch[i].slot, a->pfd[i].revents);
        else
            gi_exec_event(a, a->watch[i].s, a->watch[i].slot, a->pfd[i].revents);
    }
    if (process_input(a) == PROTO_ETOOBIG) {
        gi_log("frame over the size cap: the channel is out of sync");
        if (!a->opts->pid1)
            return -EPROTO;
        /* No way to find the next frame boundary: wait for the host to reopen the port. */
        session_end(a);
        a->in_len = 0;
        a->desync = true;
    }
    pump_files(a);
    chan_flush(a);
    sweep(a);
    gi_exec_idle(a);
    return 0;
}

static int serve(struct gi_agent *a)
{
    int r;

    if (a->opts->pid1 && (r = wait_host(a)) < 0)
        return r;
    send_hello(a, 0);
    for (;;) {
        r = iterate(a);
        if (r < 0)
            return r;
        if (!a->hup)
            continue;
        if (!a->opts->pid1)
            return 0;
        on_hangup(a);
        sweep(a);
        r = wait_host(a);
        if (r < 0)
            return r;
        send_hello(a, 0);
    }
}

/* ---- setup ---- */

static void on_signal(int sig)
{
    (void)sig; /* never runs while blocked; a handler keeps PID 1 from discarding the signal */
}

struct saved_signals {
    sigset_t mask;
    struct sigaction pipe, chld, io;
};

/*
 * SIGCHLD and SIGIO are blocked and read from a signalfd. SIGPIPE is
 * ignored so a child closing its stdin is an EPIPE, not our death; the
 * child resets all of this before exec. The old state is always saved.
 */
static int signals_setup(struct gi_agent *a, struct saved_signals *old)
{
    struct sigaction ign = {.sa_handler = SIG_IGN}, h = {.sa_handler = on_signal};
    sigset_t mask;

    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigaddset(&mask, SIGIO);
    h.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigprocmask(SIG_BLOCK, &mask, &old->mask);
    sigaction(SIGPIPE, &ign, &old->pipe);
    sigaction(SIGCHLD, &h, &old->chld);
    sigaction(SIGIO, &h, &old->io);
    a->sigfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    return a->sigfd < 0 ? -errno : 0;
}

static void signals_restore(const struct saved_signals *old)
{
    sigaction(SIGPIPE, &old->pipe, NULL);
    sigaction(SIGCHLD, &old->chld, NULL);
    sigaction(SIGIO, &old->io, NULL);
    sigprocmask(SIG_SETMASK, &old->mask, NULL);
}

/*
 * As PID 1 the agent runs at the lowest real-time priority: a CPU hog or a
 * fork bomb (thousands of runnable tasks beside one agent) must never keep
 * it from answering the host. SCHED_RESET_ON_FORK hands every child the
 * normal policy back. The agent mostly sleeps in poll(), its work is paced
 * by the host's credit, and the kernel's RT throttling bounds it anyway.
 */
static void sched_setup(const struct gi_agent_opts *opts)
{
    struct sched_param sp = {.sched_priority = 1};

    if (opts->pid1 && sched_setscheduler(0, SCHED_RR | SCHED_RESET_ON_FORK, &sp) != 0)
        gi_log("real-time priority: %s", strerror(errno));
}

static int agent_init(struct gi_agent *a, int fd, const struct gi_agent_opts *opts)
{
    struct utsname u;
    int fl;

    memset(a, 0, sizeof(*a));
    a->fd = fd;
    a->opts = opts;
    a->sigfd = -1;
    a->urandom_fd = -1;
    a->ring_cap = GI_RING_DEFAULT;
    a->max_procs = GI_PROCS_DEFAULT;
    proto_buf_init(&a->out);
    msgpack_zone_init(&a->zone, 4096);
    a->in = malloc(GI_IN_CAP);
    a->orphans = calloc(GI_MAX_ORPHANS, sizeof(*a->orphans));
    if (!a->in || !a->orphans || reserve_poll(a, 64) != 0)
        return -ENOMEM;
    if (uname(&u) == 0)
        snprintf(a->kernel, sizeof(a->kernel), "%s", u.release);
    /* Never block on the channel, and never let a child inherit it. */
    fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
        return -errno;
    return 0;
}

static void agent_free(struct gi_agent *a)
{
    session_end(a);
    sweep(a);
    gi_proc_free_all(a); /* the agent returns: nothing it started may outlive it */
    gi_orphans_wait(a);
    free(a->streams);
    free(a->orphans);
    free(a->pfd);
    free(a->watch);
    free(a->in);
    proto_buf_free(&a->out);
    msgpack_zone_destroy(&a->zone);
    if (a->sigfd >= 0)
        close(a->sigfd);
    a->sigfd = -1;
    if (a->urandom_fd >= 0)
        close(a->urandom_fd);
    a->urandom_fd = -1;
}

int gi_agent_run(int fd, const struct gi_agent_opts *opts)
{
    struct gi_agent a;
    struct saved_signals old;
    int r;

    r = agent_init(&a, fd, opts);
    if (r < 0) {
        agent_free(&a);
        return r;
    }
    sched_setup(opts);
    /* Signals are restored only after agent_free() has reaped what it killed. */
    r = signals_setup(&a, &old);
    if (r == 0)
        r = serve(&a);
    if (r < 0)
        gi_log("stopped: %s", strerror(-r));
    agent_free(&a);
    signals_restore(&old);
    return r;
}
