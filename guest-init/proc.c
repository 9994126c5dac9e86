/*
 * proc.c - processes that belong to the sandbox, not to a stream (protocol
 * v2): background execs and PTYs, their output rings, ATTACH streams that
 * read a ring from an offset, and PLIST / PCTL.
 *
 * A background process is never paced by anyone: its pipes (or PTY master)
 * are read whenever they are readable, into its ring (ring.c), so a reader
 * that stops reading never stalls the process or grows memory; it falls
 * behind into the ring and is told exactly how many bytes it lost (`lost`
 * in its next OUT). Attach readers, on the other hand, obey the agent's
 * output invariant: they only produce while the queue is under GI_OUT_HIGH,
 * one frame per loop turn each (fair), within their own credit.
 *
 * INIT keeps these processes and rings (the resume handshake); only the
 * attach streams of the old session end (they are ordinary streams). The
 * process table is bounded by max_procs: a new process first evicts the
 * oldest exited entry, and is refused (EMFILE) if every entry still runs.
 */
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define WINSIZE_MAX 10000

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static struct gi_proc *proc_find(struct gi_agent *a, uint64_t pid)
{
    for (size_t i = 0; i < a->nprocs; i++) {
        struct gi_proc *p = a->procs[i];
        if (!p->gone && p->start_id == 0 && (uint64_t)p->pid == pid)
            return p;
    }
    return NULL;
}

/* Exited: reaped and every output end at EOF, so the ring is final. */
static bool proc_exited(const struct gi_proc *p)
{
    return p->reaped && p->rep < 0 && p->out[0] < 0 && p->out[1] < 0;
}

static void proc_kill(struct gi_proc *p, int sig)
{
    if (sig == SIGKILL && p->cgroup)
        gi_cg_write(p->cgroup, "cgroup.kill", "1");
    if (p->pid > 0 && kill(-p->pid, sig) != 0 && p->rep >= 0 && !p->reaped)
        kill(p->pid, sig); /* still starting: setsid() may not have run yet */
}

/* Stdin ends: the fd closes (a PTY's master stays: it is also the output). */
static void stdin_close(struct gi_proc *p)
{
    if (!p->pty)
        close_fd(&p->in);
    p->in = -1;
    p->in_closed = true;
    proto_buf_free(&p->inq);
}

/* After the last output and the reap: the cgroup goes once empty, stdin is moot. */
static void proc_maybe_done(struct gi_agent *a, struct gi_proc *p)
{
    if (!proc_exited(p))
        return;
    if (!p->in_closed)
        stdin_close(p);
    if (p->cgroup) {
        gi_orphan_add(a, 0, p->cgroup);
        p->cgroup = NULL;
    }
}

static void proc_free(struct gi_proc *p)
{
    close_fd(&p->rep);
    if (p->pty)
        p->in = -1; /* the master is out[0] */
    close_fd(&p->in);
    close_fd(&p->out[0]);
    close_fd(&p->out[1]);
    proto_buf_free(&p->inq);
    gi_ring_free(&p->ring);
    free(p->tag);
    free(p->cmd);
    free(p->cgroup);
    free(p);
}

/* Forget a process that is not done: it is killed and its pid and cgroup become orphans. */
static void proc_drop(struct gi_agent *a, struct gi_proc *p)
{
    if (!p->reaped)
        proc_kill(p, SIGKILL);
    gi_orphan_add(a, p->reaped ? 0 : p->pid, p->cgroup);
    p->cgroup = NULL;
    p->gone = true;
}

/* Room for one more entry: evict the oldest exited ones while the table is full (more than
 * one when a later INIT lowered max_procs). */
static int make_room(struct gi_agent *a)
{
    for (;;) {
        struct gi_proc *old = NULL;
        size_t live = 0;

        for (size_t i = 0; i < a->nprocs; i++) {
            struct gi_proc *p = a->procs[i];
            if (p->gone)
                continue;
            live++;
            if (proc_exited(p) && (!old || p->seq < old->seq))
                old = p;
        }
        if (live < a->max_procs)
            return 0;
        if (!old)
            return -EMFILE;
        old->gone = true;
    }
}

static int table_add(struct gi_agent *a, struct gi_proc *p)
{
    /* Evicted entries stay until the sweep, so the array may briefly hold more than
     * max_procs; it only ever grows to the most it held at once. */
    if (a->nprocs == a->cap_procs) {
        size_t cap = a->cap_procs ? 2 * a->cap_procs : 16;
        struct gi_proc **v = realloc(a->procs, cap * sizeof(*v));
        if (!v)
            return -ENOMEM;
        a->procs = v;
        a->cap_procs = cap;
    }
    a->procs[a->nprocs++] = p;
    return 0;
}

static uint64_t realtime_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A UTF-8 string cut at most at max bytes, never inside a character. */
static size_t utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xc0) == 0x80)
        max--;
    return max;
}

void gi_proc_start(struct gi_agent *a, const struct proto_frame *f)
{
    bool pty = proto_has(f, PK_COLS) || proto_has(f, PK_ROWS);
    uint64_t cols = f->v[PK_COLS].u, rows = f->v[PK_ROWS].u;
    struct gi_spawn sp;
    struct gi_proc *p;
    int r;

    if (f->id == 0) {
        gi_reply_error(a, f->id, EINVAL, "stream id 0 is reserved");
        return;
    }
    if (pty && (!proto_has(f, PK_COLS) || !proto_has(f, PK_ROWS) || cols < 1 ||
                cols > WINSIZE_MAX || rows < 1 || rows > WINSIZE_MAX)) {
        gi_reply_error(a, f->id, EINVAL, "a PTY needs cols and rows in 1..%d", WINSIZE_MAX);
        return;
    }
    if (proto_has(f, PK_TAG) &&
        (f->v[PK_TAG].s.len > PROTO_TAG_MAX || memchr(f->v[PK_TAG].s.p, 0, f->v[PK_TAG].s.len))) {
        gi_reply_error(a, f->id, EINVAL, "tag longer than %d bytes", PROTO_TAG_MAX);
        return;
    }
    r = make_room(a);
    if (r < 0) {
        gi_reply_error(a, f->id, -r, "%zu background processes are running", a->max_procs);
        return;
    }
    p = calloc(1, sizeof(*p));
    if (!p || gi_ring_init(&p->ring, a->ring_cap) != 0 ||
        (proto_has(f, PK_TAG) && !(p->tag = strndup(f->v[PK_TAG].s.p, f->v[PK_TAG].s.len)))) {
        r = -ENOMEM;
        goto fail;
    }
    p->rep = p->in = p->out[0] = p->out[1] = -1;
    proto_buf_init(&p->inq);
    p->pty = pty;
    p->cols = (uint16_t)cols;
    p->rows = (uint16_t)rows;
    r = gi_spawn(a, f, pty, p->cols, p->rows, &sp);
    if (r < 0)
        goto fail;
    p->pid = sp.pid;
    p->rep = sp.rep;
    p->out[0] = sp.out[0];
    p->out[1] = sp.out[1];
    p->in = sp.in;
    p->cgroup = sp.cgroup;
    p->cmd = sp.cmd;
    p->start_id = f->id;
    p->started_ms = realtime_ms();
    p->seq = ++a->proc_seq;
    if (table_add(a, p) != 0) {
        proc_drop(a, p);
        proc_free(p);
        gi_reply_error(a, f->id, ENOMEM, "out of memory");
    }
    return;
fail:
    gi_reply_error(a, f->id, -r, "cannot start: %s", strerror(-r));
    if (p) {
        p->rep = p->in = p->out[0] = p->out[1] = -1;
        proc_free(p);
    }
}

/* The start report: RESULT{pid} once it exec'd, else ERROR and the entry goes. */
static void proc_started(struct gi_agent *a, struct gi_proc *p)
{
    char msg[512];
    int r = gi_start_report(p->rep, msg, sizeof(msg));
    struct proto_enc e;

    if (r == 1)
        return;
    close_fd(&p->rep);
    if (r < 0) {
        if (p->start_id)
            gi_reply_error(a, p->start_id, -r, "%s", msg);
        proc_drop(a, p);
        return;
    }
    if (p->start_id && proto_enc_begin(&e, &a->out, PROTO_RESULT, p->start_id, 3) == 0) {
        proto_put_u(&e, PK_PID, (uint64_t)p->pid);
        proto_enc_end(&e);
    }
    p->start_id = 0;
    proc_maybe_done(a, p);
}

/*
 * How long to leave a PTY master unread after a read that found got bytes, the last
 * hold having been last us: scaled toward GI_PTY_HOLD_BYTES a hold (at most halved or
 * doubled per read), within [GI_PTY_HOLD_MIN_US, GI_PTY_HOLD_MAX_US]. A writer of big
 * blocks fills the tty's ~12 KiB in well under a millisecond and then waits for the
 * reader, so its holds shrink; a program writing a line at a time fills it slowly, so
 * its holds grow and each read takes more lines.
 */
int32_t gi_pty_hold_next(int32_t last, size_t got)
{
    int64_t next = got ? (int64_t)last * GI_PTY_HOLD_BYTES / (int64_t)got : 2 * (int64_t)last;

    if (next > 2 * (int64_t)last)
        next = 2 * (int64_t)last;
    if (next < last / 2)
        next = last / 2;
    if (next < GI_PTY_HOLD_MIN_US)
        next = GI_PTY_HOLD_MIN_US;
    if (next > GI_PTY_HOLD_MAX_US)
        next = GI_PTY_HOLD_MAX_US;
    return (int32_t)next;
}

/*
 * Read what the process wrote into its ring. A PTY master is then left unread for a
 * while (gi_pty_hold_next): the agent runs SCHED_RR, so every write the process makes
 * to its terminal (a line, for most programs; 2 KiB pieces of a big write) would wake
 * it at once, and each would be a read, an OUT frame and a loop turn of its own. Held,
 * the process writes on meanwhile and the next read takes all of it, in a few reads in
 * a row. A keystroke's echo after a quiet spell is read at once, and the hold starts
 * again from GI_PTY_HOLD_US: only a read that follows another's hold waits.
 */
static void proc_read(struct gi_agent *a, struct gi_proc *p, int i)
{
    static uint8_t buf[PROTO_MAX_DATA];
    size_t got = 0;
    ssize_t n;

    if (p->out[i] < 0)
        return;
    for (int k = 0; k < 16 && got < sizeof(buf); k++) {
        n = read(p->out[i], buf + got, sizeof(buf) - got);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            break;
        /* EOF, or EIO from a PTY master whose slave side is all closed */
        if (got)
            gi_ring_write(&p->ring, i + 1, buf, got);
        if (p->pty)
            stdin_close(p);
        close_fd(&p->out[i]);
        proc_maybe_done(a, p);
        return;
    }
    if (got)
        gi_ring_write(&p->ring, i + 1, buf, got);
    if (got && p->pty) {
        int64_t now = gi_now_us();

        p->hold_len = now - p->hold_us > GI_PTY_HOLD_QUIET ? GI_PTY_HOLD_US
                                                           : gi_pty_hold_next(p->hold_len, got);
        p->hold_us = now + p->hold_len;
    }
}

static void proc_write_stdin(struct gi_proc *p)
{
    while (p->in >= 0 && proto_buf_pending(&p->inq) > 0) {
        ssize_t n = write(p->in, p->inq.p + p->inq.off, proto_buf_pending(&p->inq));
        if (n > 0) {
            proto_buf_consume(&p->inq, (size_t)n);
            /* Keys typed into a PTY: their echo is read as soon as it comes, and the
             * output they cause starts from a first hold again. */
            if (p->pty)
                p->hold_us = 0;
        } else if (n < 0 && errno == EINTR)
            continue;
        else if (n < 0 && errno == EAGAIN)
            break;
        else if (p->pty)
            proto_buf_consume(&p->inq, proto_buf_pending(&p->inq)); /* its read side sees it */
        else
            stdin_close(p); /* EPIPE: nobody will read the rest */
    }
    if (p->in >= 0 && p->in_eof && proto_buf_pending(&p->inq) == 0 && !p->pty)
        stdin_close(p);
}

int gi_proc_watch(struct gi_agent *a, struct gi_proc *p, struct pollfd *pfd, int *slot,
                  int64_t now_us, int64_t *hold)
{
    int n = 0;

    (void)a;
    *hold = 0;
    if (p->gone)
        return 0;
    if (p->rep >= 0) {
        pfd[n] = (struct pollfd){.fd = p->rep, .events = POLLIN};
        slot[n++] = 3;
        return n; /* output is read once the start is settled (as for an exec) */
    }
    for (int i = 0; i < 2; i++) {
        if (i == 0 && p->pty && p->out[0] >= 0 && p->hold_us > now_us) {
            *hold = p->hold_us;
            continue;
        }
        if (p->out[i] >= 0) {
            pfd[n] = (struct pollfd){.fd = p->out[i], .events = POLLIN};
            slot[n++] = i;
        }
    }
    if (p->in >= 0 && proto_buf_pending(&p->inq) > 0) {
        pfd[n] = (struct pollfd){.fd = p->in, .events = POLLOUT};
        slot[n++] = 2;
    }
    return n;
}

void gi_proc_event(struct gi_agent *a, struct gi_proc *p, int slot, short revents)
{
    (void)revents;
    if (p->gone)
        return;
    if (slot < 2)
        proc_read(a, p, slot);
    else if (slot == 2)
        proc_write_stdin(p);
    else
        proc_started(a, p);
}

bool gi_proc_reaped(struct gi_agent *a, pid_t pid, int status)
{
    for (size_t i = 0; i < a->nprocs; i++) {
        struct gi_proc *p = a->procs[i];
        if (!p->gone && p->pid == pid && !p->reaped) {
            p->reaped = true;
            p->status = status;
            proc_maybe_done(a, p);
            return true;
        }
    }
    return false;
}

void gi_proc_reap_own(struct gi_agent *a)
{
    int st;

    for (size_t i = 0; i < a->nprocs; i++) {
        struct gi_proc *p = a->procs[i];
        if (!p->gone && !p->reaped && p->pid > 0 && waitpid(p->pid, &st, WNOHANG) == p->pid)
            gi_proc_reaped(a, p->pid, st);
    }
}

void gi_proc_session_end(struct gi_agent *a)
{
    /* A start reply belongs to the old host session: the process itself stays. */
    for (size_t i = 0; i < a->nprocs; i++)
        a->procs[i]->start_id = 0;
}

void gi_proc_kill_all(struct gi_agent *a)
{
    for (size_t i = 0; i < a->nprocs; i++)
        if (!a->procs[i]->gone)
            proc_drop(a, a->procs[i]);
}

void gi_proc_sweep(struct gi_agent *a)
{
    size_t j = 0;

    for (size_t i = 0; i < a->nprocs; i++) {
        if (a->procs[i]->gone)
            proc_free(a->procs[i]);
        else
            a->procs[j++] = a->procs[i];
    }
    a->nprocs = j;
}

void gi_proc_free_all(struct gi_agent *a)
{
    gi_proc_kill_all(a);
    gi_proc_sweep(a);
    free(a->procs);
    a->procs = NULL;
    a->cap_procs = 0;
}

/* ---- status ---- */

static void exit_status(const struct gi_proc *p, int *code, int *sig)
{
    *code = *sig = 0;
    if (WIFEXITED(p->status)) {
        *code = WEXITSTATUS(p->status);
    } else if (WIFSIGNALED(p->status)) {
        *sig = WTERMSIG(p->status);
        *code = 128 + *sig;
    }
}

static void put_entry(msgpack_packer *pk, const struct gi_proc *p)
{
    bool running = !proc_exited(p);
    size_t cmdlen = utf8_cut(p->cmd, strlen(p->cmd), PROTO_CMD_SHOWN);
    uint32_t n = 8 + !!p->tag + (p->pty ? 2 : 0) + (running ? 0 : 2);
    int code, sig;

#define KEY(s) msgpack_pack_str_with_body(pk, s, sizeof(s) - 1)
    msgpack_pack_map(pk, n);
    KEY("pid");
    msgpack_pack_uint64(pk, (uint64_t)p->pid);
    if (p->tag) {
        KEY("tag");
        msgpack_pack_str_with_body(pk, p->tag, strlen(p->tag));
    }
    KEY("cmd");
    msgpack_pack_str_with_body(pk, p->cmd, cmdlen);
    KEY("pty");
    if (p->pty)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    if (p->pty) {
        KEY("cols");
        msgpack_pack_uint64(pk, p->cols);
        KEY("rows");
        msgpack_pack_uint64(pk, p->rows);
    }
    KEY("running");
    if (running)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    if (!running) {
        exit_status(p, &code, &sig);
        KEY("code");
        msgpack_pack_int64(pk, code);
        KEY("sig");
        msgpack_pack_int64(pk, sig);
    }
    KEY("start");
    msgpack_pack_uint64(pk, p->ring.start);
    KEY("end");
    msgpack_pack_uint64(pk, p->ring.end);
    KEY("stdin");
    if (!p->in_closed)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    KEY("started_ms");
    msgpack_pack_uint64(pk, p->started_ms);
#undef KEY
}

void gi_proc_list(struct gi_agent *a, const struct proto_frame *f)
{
    struct proto_enc e;
    uint32_t n = 0;
    bool one = proto_has(f, PK_PID);

    for (size_t i = 0; i < a->nprocs; i++) {
        struct gi_proc *p = a->procs[i];
        if (!p->gone && p->start_id == 0 && (!one || (uint64_t)p->pid == f->v[PK_PID].u))
            n++;
    }
    if (one && n == 0) {
        gi_reply_error(a, f->id, ESRCH, "no process %llu", (unsigned long long)f->v[PK_PID].u);
        return;
    }
    if (proto_enc_begin(&e, &a->out, PROTO_RESULT, f->id, 3) != 0)
        return;
    proto_enc_key(&e, PK_PROCS);
    msgpack_pack_array(&e.pk, n);
    for (size_t i = 0; i < a->nprocs; i++) {
        struct gi_proc *p = a->procs[i];
        if (!p->gone && p->start_id == 0 && (!one || (uint64_t)p->pid == f->v[PK_PID].u))
            put_entry(&e.pk, p);
    }
    if (proto_enc_end(&e) != 0)
        gi_reply_error(a, f->id, ENOMEM, "process list does not fit a frame");
}

/* ---- PCTL ---- */

static void ctl_stdin(struct gi_agent *a, const struct proto_frame *f, struct gi_proc *p)
{
    const struct proto_str *d = &f->v[PK_DATA].s;
    bool eof = proto_has(f, PK_EOF) && f->v[PK_EOF].b;
    size_t len = (proto_has(f, PK_DATA) ? d->len : 0) + (eof && p->pty);

    if (p->in_closed || p->in < 0 || (p->in_eof && !p->pty)) {
        gi_reply_error(a, f->id, EPIPE, "stdin of %d is closed", (int)p->pid);
        return;
    }
    if (proto_buf_pending(&p->inq) + len > GI_STDIN_CAP) {
        gi_reply_error(a, f->id, EAGAIN, "stdin of %d is full", (int)p->pid);
        return;
    }
    if ((proto_has(f, PK_DATA) && proto_buf_append(&p->inq, d->p, d->len) != 0) ||
        (eof && p->pty && proto_buf_append(&p->inq, "\x04", 1) != 0)) {
        gi_reply_error(a, f->id, ENOMEM, "out of memory");
        return;
    }
    if (eof && !p->pty)
        p->in_eof = true;
    proc_write_stdin(p);
    gi_reply_ok(a, f->id);
}

static void ctl_resize(struct gi_agent *a, const struct proto_frame *f, struct gi_proc *p)
{
    uint64_t cols = f->v[PK_COLS].u, rows = f->v[PK_ROWS].u;
    struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};

    if (!p->pty || cols < 1 || cols > WINSIZE_MAX || rows < 1 || rows > WINSIZE_MAX) {
        gi_reply_error(a, f->id, EINVAL, "resize needs a PTY and cols, rows in 1..%d", WINSIZE_MAX);
        return;
    }
    if (p->out[0] < 0) {
        gi_reply_error(a, f->id, ECHILD, "process %d has exited", (int)p->pid);
        return;
    }
    if (ioctl(p->out[0], TIOCSWINSZ, &ws) != 0) {
        gi_reply_error(a, f->id, errno, "TIOCSWINSZ: %s", strerror(errno));
        return;
    }
    p->cols = (uint16_t)cols;
    p->rows = (uint16_t)rows;
    gi_reply_ok(a, f->id);
}

void gi_proc_ctl(struct gi_agent *a, const struct proto_frame *f)
{
    bool io = proto_has(f, PK_DATA) || proto_has(f, PK_EOF);
    bool sig = proto_has(f, PK_SIG);
    bool size = proto_has(f, PK_COLS) || proto_has(f, PK_ROWS);
    struct gi_proc *p;

    if (!proto_has(f, PK_PID) || io + sig + size != 1) {
        gi_reply_error(a, f->id, EINVAL, "PCTL needs a pid and exactly one action");
        return;
    }
    p = proc_find(a, f->v[PK_PID].u);
    if (!p) {
        gi_reply_error(a, f->id, ESRCH, "no process %llu", (unsigned long long)f->v[PK_PID].u);
        return;
    }
    if (io) {
        ctl_stdin(a, f, p);
    } else if (size) {
        ctl_resize(a, f, p);
    } else if (f->v[PK_SIG].i < 1 || f->v[PK_SIG].i > 64) {
        gi_reply_error(a, f->id, EINVAL, "signal %lld", (long long)f->v[PK_SIG].i);
    } else if (p->reaped) {
        gi_reply_error(a, f->id, ECHILD, "process %d has exited", (int)p->pid);
    } else {
        proc_kill(p, (int)f->v[PK_SIG].i);
        gi_reply_ok(a, f->id);
    }
}

/* ---- ATTACH ---- */

void gi_proc_attach(struct gi_agent *a, const struct proto_frame *f)
{
    struct gi_proc *p;
    struct gi_stream *s;
    uint64_t off = f->v[PK_OFF].u;

    if (!proto_has(f, PK_PID)) {
        gi_reply_error(a, f->id, EINVAL, "ATTACH needs a pid");
        return;
    }
    p = proc_find(a, f->v[PK_PID].u);
    if (!p) {
        gi_reply_error(a, f->id, ESRCH, "no process %llu", (unsigned long long)f->v[PK_PID].u);
        return;
    }
    if (off > p->ring.end) {
        gi_reply_error(a, f->id, EINVAL, "offset %llu is past the end (%llu)",
                       (unsigned long long)off, (unsigned long long)p->ring.end);
        return;
    }
    s = gi_stream_new(a, f->id, GI_ATTACH);
    if (!s)
        return;
    s->u.t.pid = p->pid;
    s->u.t.pos = off;
    s->u.t.credit = PROTO_WINDOW;
    s->u.t.follow = proto_has(f, PK_FOLLOW) && f->v[PK_FOLLOW].b;
}

void gi_proc_detach(struct gi_agent *a, uint32_t id)
{
    struct gi_stream *s = gi_stream_find(a, id);

    if (!s || s->kind != GI_ATTACH)
        return; /* it already ended: its last frame was sent */
    proto_send_end(&a->out, id);
    s->done = true;
}

void gi_attach_credit(struct gi_stream *s, uint64_t n)
{
    struct gi_attach *t = &s->u.t;

    t->credit = n > UINT64_MAX - t->credit ? UINT64_MAX : t->credit + n;
}

/* Something to send: bytes with credit, or the end (EXIT/END), or the process is gone. */
bool gi_attach_ready(struct gi_agent *a, const struct gi_stream *s)
{
    const struct gi_attach *t = &s->u.t;
    struct gi_proc *p = proc_find(a, (uint64_t)t->pid);

    if (!p)
        return true;
    if (t->pos < p->ring.end)
        return t->credit > 0;
    return proc_exited(p) || !t->follow;
}

void gi_attach_pump(struct gi_agent *a, struct gi_stream *s)
{
    static uint8_t buf[PROTO_MAX_DATA];
    struct gi_attach *t = &s->u.t;
    struct gi_proc *p = proc_find(a, (uint64_t)t->pid);
    struct proto_enc e;
    uint64_t lost = 0;
    size_t n = 0, max;
    int fd = 1;

    if (!p) {
        /* evicted while this reader was behind */
        gi_reply_error(a, s->id, ESRCH, "process %d is gone", (int)t->pid);
        s->done = true;
        return;
    }
    if (t->pos < p->ring.start) {
        lost = p->ring.start - t->pos;
        t->pos = p->ring.start;
    }
    max = t->credit < sizeof(buf) ? (size_t)t->credit : sizeof(buf);
    if (t->pos < p->ring.end && max > 0)
        n = gi_ring_read(&p->ring, t->pos, buf, max, &fd);
    if (n > 0) {
        /* lost always travels with data (a ring that dropped bytes holds newer ones) */
        if (proto_enc_begin(&e, &a->out, PROTO_OUT, s->id, 5 + (lost > 0)) != 0) {
            t->pos -= lost;
            return;
        }
        proto_put_u(&e, PK_FD, (uint64_t)fd);
        proto_put_u(&e, PK_OFF, t->pos);
        proto_put_bin(&e, PK_DATA, buf, n);
        if (lost > 0)
            proto_put_u(&e, PK_LOST, lost);
        if (proto_enc_end(&e) != 0) {
            t->pos -= lost; /* try again next turn */
            return;
        }
        t->pos += n;
        t->credit -= n;
        return;
    }
    t->pos -= lost; /* no credit: the loss is reported with the next data */
    if (t->pos < p->ring.end)
        return; /* no credit */
    if (proc_exited(p)) {
        int code, sig;
        exit_status(p, &code, &sig);
        if (proto_enc_begin(&e, &a->out, PROTO_EXIT, s->id, 5) != 0)
            return;
        proto_put_i(&e, PK_CODE, code);
        proto_put_i(&e, PK_SIG, sig);
        proto_put_b(&e, PK_TIMED_OUT, false);
        proto_enc_end(&e);
        s->done = true;
    } else if (!t->follow) {
        proto_send_end(&a->out, s->id);
        s->done = true;
    }
}
