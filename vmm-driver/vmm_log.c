/*
 * vmm_log.c - the bounded logs (console.log, qemu.log), written off the loop.
 *
 * File layout. Invariant: size <= cap. Before the first overflow the file is
 * the plain output. At the first overflow it becomes
 *     [0, head)                 the first head bytes of output
 *     [head, head + MARK)       "[warren: console truncated, N bytes dropped]"
 *     [head + MARK, size)       the newest output
 * and each later overflow keeps the newer half of the tail region. The
 * marker has a fixed width so it is rewritten in place; a reader (or an
 * adopting warrend) finds it at offset head.
 *
 * Threads. The loop never writes the file: vmm_log_write copies the bytes
 * into the log's queue, and one writer thread for every log of the process
 * does the pwrites and the compaction (which copies up to a quarter of the
 * cap). One mutex guards every queue, the writer's FIFO of logs with work
 * and the registry of open and closing logs (like core/bg.c). The memory a
 * log's queue holds (chunks queued or being written) never passes its
 * bound; past it the loop drops the bytes, counts them, and the writer puts
 * "[warren: N bytes of console output dropped]" in the file where they were.
 *
 * Ownership. The heap "sink" holds the queue and the file state; struct
 * vmm_log (the caller's) only points to it, so the writer never touches the
 * caller's struct. Once registered, the file state (fd, size, dropped) is
 * the writer's; the loop reads it only through vmm_log_sync, which waits
 * until the writer is done with the sink. vmm_log_close hands the sink to
 * the writer, which writes what is queued, closes the fd and frees it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vmm_int.h"

#define CHUNK (16u << 10)
/* Written chunks kept for reuse (at most 1 MiB for the process): the loop then
 * neither mallocs nor faults pages in while a guest floods. */
#define SPARE_MAX 64u

struct chunk {
    struct chunk *next;
    uint64_t gap; /* bytes dropped just before this chunk's data */
    size_t len;
    char data[CHUNK];
};

struct vmm_log_sink {
    struct vmm_log_sink *next, *prev; /* registry */
    struct vmm_log_sink *ready_next;  /* the writer's FIFO */
    /* Under w.mu. */
    struct chunk *q_head, *q_tail; /* queued; q_tail is still appended to */
    size_t mem, bound;             /* bytes of chunks held (queued or being written) */
    uint64_t gap;                  /* dropped after the last queued byte */
    uint64_t lost;                 /* dropped from the queue, in all */
    bool ready;                    /* in the FIFO: queued bytes, a gap, or closing */
    bool busy;                     /* the writer is writing what it took */
    bool closing;                  /* vmm_log_close ran: the writer frees it */
    dev_t dev;
    ino_t ino;
    /* The file: the writer's once registered. */
    int fd;
    uint64_t cap;     /* file size limit */
    uint64_t head;    /* bytes of the head region (cap / 2) */
    uint64_t size;    /* current file size */
    uint64_t dropped; /* bytes dropped by compaction so far */
    bool truncated;   /* the marker is in place */
    char what[12];    /* "console", "qemu": named in the markers */
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t work; /* to the writer: a sink is ready, or stop */
    pthread_cond_t done; /* to waiters: the writer finished a sink */
    struct vmm_log_sink *all;
    struct vmm_log_sink *ready, **ready_tail;
    struct chunk *spare;
    unsigned nspare;
    pthread_t thread;
    bool running, stopping, hold;
} w = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .work = PTHREAD_COND_INITIALIZER,
    .done = PTHREAD_COND_INITIALIZER,
    .ready_tail = &w.ready,
};

/* ---- the file (writer thread, or the loop before the sink is registered) ---- */

static void put_marker(struct vmm_log_sink *l)
{
    char m[VMM_LOG_MARK_LEN + 1];
    int n = snprintf(m, sizeof(m), "\n[warren: %s truncated, %20" PRIu64 " bytes dropped]", l->what,
                     l->dropped);

    /* Pad to the fixed width and end the line. */
    if (n < 0)
        return;
    memset(m + n, ' ', VMM_LOG_MARK_LEN - (size_t)n);
    m[VMM_LOG_MARK_LEN - 1] = '\n';
    (void)!pwrite(l->fd, m, VMM_LOG_MARK_LEN, (off_t)l->head);
}

static int copy_down(int fd, uint64_t from, uint64_t to, uint64_t n)
{
    char buf[16384];

    while (n > 0) {
        size_t chunk = n < sizeof(buf) ? (size_t)n : sizeof(buf);
        ssize_t got = pread(fd, buf, chunk, (off_t)from);
        if (got <= 0)
            return -1;
        if (pwrite(fd, buf, (size_t)got, (off_t)to) != got)
            return -1;
        from += (uint64_t)got;
        to += (uint64_t)got;
        n -= (uint64_t)got;
    }
    return 0;
}

/* The file is full (size == cap): keep the newer half of the tail region. */
static void compact(struct vmm_log_sink *l)
{
    uint64_t tail0 = l->head + VMM_LOG_MARK_LEN;
    uint64_t region, keep;

    if (!l->truncated) {
        /* First overflow: bytes [head, head + MARK) become the marker, so the
         * tail region starts where the marker ends. */
        l->truncated = true;
        l->dropped += VMM_LOG_MARK_LEN;
    }
    region = l->size - tail0;
    keep = region / 2;
    if (copy_down(l->fd, l->size - keep, tail0, keep) != 0)
        keep = 0; /* an I/O error: drop the whole tail rather than keep garbage */
    l->dropped += region - keep;
    l->size = tail0 + keep;
    (void)!ftruncate(l->fd, (off_t)l->size);
    put_marker(l);
}

static void file_append(struct vmm_log_sink *l, const char *p, size_t n)
{
    while (n > 0) {
        uint64_t room = l->cap - l->size;
        size_t chunk = n < room ? n : (size_t)room;
        ssize_t wr;

        if (chunk == 0) {
            compact(l);
            continue;
        }
        wr = pwrite(l->fd, p, chunk, (off_t)l->size);
        if (wr <= 0) {
            if (wr < 0 && errno == EINTR)
                continue;
            l->dropped += n; /* ENOSPC, EIO...: dropped, never retried */
            return;
        }
        l->size += (uint64_t)wr;
        p += wr;
        n -= (size_t)wr;
    }
}

/* Where the loop dropped bytes, a line says how many. */
static void file_gap(struct vmm_log_sink *l, uint64_t gap)
{
    char m[96];
    int n = snprintf(m, sizeof(m), "\n[warren: %" PRIu64 " bytes of %s output dropped]\n", gap,
                     l->what);

    if (n > 0 && (size_t)n < sizeof(m))
        file_append(l, m, (size_t)n);
}

/* Adopting an existing log: find the marker at offset head, if any. */
static void recover(struct vmm_log_sink *l)
{
    char m[VMM_LOG_MARK_LEN + 1], prefix[48];
    unsigned long long dropped;

    if (l->size > l->cap) {
        /* cap shrank since the file was written: restart the tail. */
        l->dropped = l->size - l->head - VMM_LOG_MARK_LEN;
        l->size = l->head + VMM_LOG_MARK_LEN;
        l->truncated = true;
        (void)!ftruncate(l->fd, (off_t)l->size);
        put_marker(l);
        return;
    }
    if (l->size < l->head + VMM_LOG_MARK_LEN)
        return;
    if (pread(l->fd, m, VMM_LOG_MARK_LEN, (off_t)l->head) != VMM_LOG_MARK_LEN)
        return;
    m[VMM_LOG_MARK_LEN] = 0;
    snprintf(prefix, sizeof(prefix), "\n[warren: %s truncated, ", l->what);
    if (strncmp(m, prefix, strlen(prefix)) != 0)
        return;
    if (sscanf(m + strlen(prefix), "%llu", &dropped) == 1) {
        l->dropped = dropped;
        l->truncated = true;
    }
}

/* ---- the writer thread ---- */

static void registry_remove(struct vmm_log_sink *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        w.all = s->next;
    if (s->next)
        s->next->prev = s->prev;
}

static void sink_free(struct vmm_log_sink *s)
{
    while (s->q_head) {
        struct chunk *c = s->q_head;
        s->q_head = c->next;
        free(c);
    }
    if (s->fd >= 0)
        close(s->fd);
    free(s);
}

static void *writer(void *arg)
{
    /* Batch: waking the writer must not preempt the loop that queued the bytes. */
    (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &(struct sched_param){0});
    pthread_mutex_lock(&w.mu);
    for (;;) {
        struct vmm_log_sink *s;
        struct chunk *list;
        uint64_t gap;

        while ((!w.ready || w.hold) && !w.stopping)
            pthread_cond_wait(&w.work, &w.mu);
        if (!w.ready)
            break; /* stopping, and every queue is written */
        s = w.ready;
        w.ready = s->ready_next;
        if (!w.ready)
            w.ready_tail = &w.ready;
        /* Take the whole queue and the drops after it: the loop appends to a
         * fresh chunk from now on, so nothing it adds can land before these. */
        s->ready = false;
        s->busy = true;
        list = s->q_head;
        s->q_head = s->q_tail = NULL;
        gap = s->gap;
        s->gap = 0;
        pthread_mutex_unlock(&w.mu);
        while (list) {
            struct chunk *c = list;
            list = c->next;
            if (c->gap)
                file_gap(s, c->gap);
            file_append(s, c->data, c->len);
            pthread_mutex_lock(&w.mu);
            s->mem -= CHUNK; /* room for the loop as soon as possible */
            if (w.nspare < SPARE_MAX) {
                c->next = w.spare;
                w.spare = c;
                w.nspare++;
                c = NULL;
            }
            pthread_mutex_unlock(&w.mu);
            free(c);
        }
        if (gap)
            file_gap(s, gap);
        pthread_mutex_lock(&w.mu);
        s->busy = false;
        /* Closed and nothing added since we took the queue (an addition, or the
         * close itself, would have made it ready again): it is ours to free. */
        if (s->closing && !s->ready) {
            registry_remove(s);
            pthread_mutex_unlock(&w.mu);
            sink_free(s);
            pthread_mutex_lock(&w.mu);
        }
        pthread_cond_broadcast(&w.done);
    }
    pthread_mutex_unlock(&w.mu);
    return NULL;
}

/* Under w.mu. The thread starts with the first log and after vmm_log_shutdown. */
static int writer_start(void)
{
    sigset_t all, old;
    int r;

    if (w.running)
        return 0;
    /* Signals stay with the loop thread (libev's handlers, ev_signal). */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    r = pthread_create(&w.thread, NULL, writer, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r != 0)
        return -r;
    w.running = true;
    return 0;
}

/* Under w.mu. */
static void mark_ready(struct vmm_log_sink *s)
{
    if (s->ready)
        return;
    s->ready = true;
    s->ready_next = NULL;
    *w.ready_tail = s;
    w.ready_tail = &s->ready_next;
    pthread_cond_signal(&w.work);
}

/* ---- the loop's side ---- */

static void tail_keep(struct vmm_log *l, const char *p, size_t n)
{
    if (n >= VMM_LOG_TAIL) {
        memcpy(l->tail, p + n - VMM_LOG_TAIL, VMM_LOG_TAIL);
        l->tail_len = VMM_LOG_TAIL;
        return;
    }
    if (l->tail_len + n > VMM_LOG_TAIL) {
        size_t cut = l->tail_len + n - VMM_LOG_TAIL;
        memmove(l->tail, l->tail + cut, l->tail_len - cut);
        l->tail_len -= cut;
    }
    memcpy(l->tail + l->tail_len, p, n);
    l->tail_len += n;
}

size_t vmm_log_tail(const struct vmm_log *l, char *buf, size_t cap)
{
    size_t n;

    if (cap == 0)
        return 0;
    n = l->tail_len < cap - 1 ? l->tail_len : cap - 1;
    memcpy(buf, l->tail + l->tail_len - n, n);
    buf[n] = 0;
    return n;
}

void vmm_log_write(struct vmm_log *l, const void *buf, size_t n)
{
    struct vmm_log_sink *s = l->s;
    const char *p = buf;

    if (n == 0)
        return;
    tail_keep(l, p, n);
    if (!s)
        return;
    pthread_mutex_lock(&w.mu);
    if (writer_start() != 0) {
        s->lost += n; /* no thread (pthread_create failed): nothing is queued */
        pthread_mutex_unlock(&w.mu);
        return;
    }
    while (n > 0) {
        struct chunk *c = s->q_tail;
        size_t k;

        /* After a gap the bytes start a new chunk, which carries the gap. */
        if (!c || c->len == CHUNK || s->gap) {
            if (s->mem + CHUNK > s->bound)
                break;
            if (w.spare) {
                c = w.spare;
                w.spare = c->next;
                w.nspare--;
            } else if (!(c = malloc(sizeof(*c)))) {
                break;
            }
            c->next = NULL;
            c->gap = s->gap;
            c->len = 0;
            s->gap = 0;
            if (s->q_tail)
                s->q_tail->next = c;
            else
                s->q_head = c;
            s->q_tail = c;
            s->mem += CHUNK;
        }
        k = n < CHUNK - c->len ? n : CHUNK - c->len;
        memcpy(c->data + c->len, p, k);
        c->len += k;
        p += k;
        n -= k;
    }
    if (n > 0) {
        s->gap += n;
        s->lost += n;
    }
    mark_ready(s);
    pthread_mutex_unlock(&w.mu);
}

/* Under w.mu: a log of this file closed a moment ago may still be draining;
 * opening the file again (appending or truncating) must come after it. */
static void wait_retired(dev_t dev, ino_t ino)
{
    for (;;) {
        bool draining = false;
        for (struct vmm_log_sink *s = w.all; s; s = s->next)
            draining |= s->closing && s->dev == dev && s->ino == ino;
        if (!draining || !w.running)
            return;
        pthread_cond_wait(&w.done, &w.mu);
    }
}

/* The last bytes of an adopted file, for vmm_log_tail. */
static void tail_seed(struct vmm_log *l, const struct vmm_log_sink *s)
{
    uint64_t n = s->size < VMM_LOG_TAIL ? s->size : VMM_LOG_TAIL;
    ssize_t got = pread(s->fd, l->tail, (size_t)n, (off_t)(s->size - n));

    l->tail_len = got > 0 ? (size_t)got : 0;
}

int vmm_log_open(struct vmm_log *l, const char *path, size_t cap, bool append)
{
    return vmm_log_open_named(l, "console", path, cap, append);
}

int vmm_log_open_named(struct vmm_log *l, const char *what, const char *path, size_t cap,
                       bool append)
{
    struct vmm_log_sink *s;
    struct stat st;
    int r;

    memset(l, 0, sizeof(*l));
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    snprintf(s->what, sizeof(s->what), "%s", what);
    s->fd = -1;
    if (cap == 0)
        cap = VMM_CONSOLE_DEFAULT;
    if (cap < VMM_CONSOLE_MIN)
        cap = VMM_CONSOLE_MIN;
    s->cap = cap;
    s->head = cap / 2;
    s->bound = cap > VMM_LOG_QUEUE_MIN ? cap : VMM_LOG_QUEUE_MIN;
    s->bound = (s->bound + CHUNK - 1) / CHUNK * CHUNK;
    pthread_mutex_lock(&w.mu);
    r = writer_start();
    if (r == 0 && lstat(path, &st) == 0)
        wait_retired(st.st_dev, st.st_ino);
    pthread_mutex_unlock(&w.mu);
    if (r != 0)
        goto fail;
    /* O_NOFOLLOW, and a regular file only: a jailed QEMU owns the run dir and
     * could leave a symlink or a FIFO here for warrend (root) to open. */
    s->fd =
        open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (append ? 0 : O_TRUNC),
             0600);
    if (s->fd < 0) {
        r = -errno;
        goto fail;
    }
    if (fstat(s->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        r = -EINVAL;
        goto fail;
    }
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    if (append) {
        s->size = (uint64_t)st.st_size;
        recover(s);
        tail_seed(l, s);
    }
    /* From here on the file state is the writer's. */
    pthread_mutex_lock(&w.mu);
    s->next = w.all;
    if (w.all)
        w.all->prev = s;
    w.all = s;
    pthread_mutex_unlock(&w.mu);
    l->s = s;
    return 0;
fail:
    sink_free(s);
    return r;
}

void vmm_log_close(struct vmm_log *l)
{
    struct vmm_log_sink *s = l->s;

    if (!s)
        return;
    l->s = NULL;
    pthread_mutex_lock(&w.mu);
    s->closing = true;
    if (writer_start() == 0) {
        mark_ready(s);
        pthread_mutex_unlock(&w.mu);
        return;
    }
    /* No writer could be started, so none ever saw this sink since the last
     * vmm_log_shutdown (which wrote every queue): it is not in the FIFO. */
    registry_remove(s);
    pthread_mutex_unlock(&w.mu);
    sink_free(s);
}

int vmm_log_sync(struct vmm_log *l, struct vmm_log_stats *st)
{
    struct vmm_log_sink *s = l->s;

    if (!s)
        return -EBADF;
    pthread_mutex_lock(&w.mu);
    while ((s->ready || s->busy) && w.running)
        pthread_cond_wait(&w.done, &w.mu);
    if (st) {
        st->size = s->size;
        st->dropped = s->dropped;
        st->lost = s->lost;
        st->truncated = s->truncated;
    }
    pthread_mutex_unlock(&w.mu);
    return 0;
}

size_t vmm_log_queued(const struct vmm_log *l)
{
    size_t n;

    if (!l->s)
        return 0;
    pthread_mutex_lock(&w.mu);
    n = l->s->mem;
    pthread_mutex_unlock(&w.mu);
    return n;
}

void vmm_log_hold(bool on)
{
    pthread_mutex_lock(&w.mu);
    w.hold = on;
    pthread_cond_signal(&w.work);
    pthread_mutex_unlock(&w.mu);
}

void vmm_log_shutdown(void)
{
    pthread_mutex_lock(&w.mu);
    if (!w.running) {
        pthread_mutex_unlock(&w.mu);
        return;
    }
    w.stopping = true;
    w.hold = false;
    pthread_cond_signal(&w.work);
    pthread_mutex_unlock(&w.mu);
    /* It writes every queue (closed logs' included) before it exits. */
    pthread_join(w.thread, NULL);
    pthread_mutex_lock(&w.mu);
    w.running = false;
    w.stopping = false;
    while (w.spare) {
        struct chunk *c = w.spare;
        w.spare = c->next;
        free(c);
    }
    w.nspare = 0;
    pthread_mutex_unlock(&w.mu);
}
