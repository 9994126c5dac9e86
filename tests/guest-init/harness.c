/* harness.c - the host side of the agent tests (see harness.h). */
#include "harness.h"
#include "agent.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int failures;
int peer_spawn_guard_ms;

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void start2(struct peer *p, int pid1, const char *cgroup_root, const char *bid_file,
                   const char *bid_target)
{
    int sv[2];

    memset(p, 0, sizeof(*p));
    for (int i = 0; i < MAX_IDS; i++)
        p->res[i].err = -1;
    proto_buf_init(&p->in);
    proto_buf_init(&p->out);
    p->cur = malloc(PROTO_MAX_FRAME);
    msgpack_zone_init(&p->zone, 4096);
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        perror("socketpair");
        exit(2);
    }
    p->agent = fork();
    if (p->agent == 0) {
        struct gi_agent_opts o = {.cgroup_root = cgroup_root,
                                  .pid1 = pid1,
                                  .boot_id_file = bid_file,
                                  .boot_id_target = bid_target,
                                  .spawn_guard_ms = peer_spawn_guard_ms};
        close(sv[0]);
        /* The agent's bind mount stays in a mount namespace of its own. */
        if (bid_file &&
            (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)) {
            perror("private mount namespace");
            exit(2);
        }
        exit(gi_agent_run(sv[1], &o) == 0 ? 0 : 1); /* exit(): leak checkers run */
    }
    close(sv[1]);
    p->fd = sv[0];
    fcntl(p->fd, F_SETFL, O_NONBLOCK);
}

static void start(struct peer *p, int pid1, const char *cgroup_root)
{
    start2(p, pid1, cgroup_root, NULL, NULL);
}

bool can_unshare_mounts(void)
{
    int st;
    pid_t pid = fork();

    if (pid == 0)
        _exit(unshare(CLONE_NEWNS) == 0 ? 0 : 1);
    return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

void peer_start_boot_id(struct peer *p, const char *file, const char *target)
{
    start2(p, 0, NULL, file, target);
}

void peer_start(struct peer *p)
{
    start(p, 0, NULL);
}

void peer_start_pid1(struct peer *p)
{
    start(p, 1, NULL);
}

void peer_start_cgroup(struct peer *p, const char *cgroup_root)
{
    start(p, 0, cgroup_root);
}

void peer_free(struct peer *p)
{
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
    for (int i = 0; i < MAX_IDS; i++) {
        for (int k = 0; k < 3; k++)
            proto_buf_free(&p->res[i].out[k]);
        proto_buf_free(&p->res[i].paths);
        proto_buf_free(&p->res[i].all);
    }
    proto_buf_free(&p->in);
    proto_buf_free(&p->out);
    free(p->cur);
    p->cur = NULL;
    msgpack_zone_destroy(&p->zone);
}

int peer_stop(struct peer *p)
{
    int st = -1;
    int64_t end = now_ms() + 5000;

    close(p->fd);
    p->fd = -1;
    while (waitpid(p->agent, &st, WNOHANG) == 0) {
        if (now_ms() > end) {
            fprintf(stderr, "agent did not stop after the peer closed\n");
            kill(p->agent, SIGKILL);
            waitpid(p->agent, &st, 0);
            failures++;
            break;
        }
        usleep(5000);
    }
    peer_free(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void peer_queue(struct peer *p, struct proto_buf *b)
{
    proto_buf_append(&p->out, b->p + b->off, proto_buf_pending(b));
    proto_buf_free(b);
}

static void copy_str(char *dst, size_t cap, const struct proto_str *s)
{
    size_t n = s->len < cap - 1 ? s->len : cap - 1;
    memcpy(dst, s->p, n);
    dst[n] = '\0';
}

static void append_out(struct peer *p, uint32_t id, int k, const struct proto_frame *f)
{
    struct res *r = &p->res[id];
    const struct proto_str *d = &f->v[PK_DATA].s;

    if (r->attach) {
        uint64_t lost = f->v[PK_LOST].u;
        if (proto_has(f, PK_LOST)) {
            if (r->lost_frames++ == 0)
                r->first_lost_off = f->v[PK_OFF].u;
            r->lost += lost;
        }
        if (f->v[PK_OFF].u != r->next_off + lost || k < 1 || k > 2)
            r->bad_off++;
        r->next_off = f->v[PK_OFF].u + d->len;
        proto_buf_append(&r->all, d->p, d->len);
    } else if (f->v[PK_OFF].u != proto_buf_pending(&r->out[k])) {
        r->bad_off++;
    }
    proto_buf_append(&r->out[k], d->p, d->len);
    if (r->auto_credit)
        send_credit(p, id, d->len);
}

static void add_entries(struct res *r, const struct proto_frame *f)
{
    const msgpack_object_array *a = f->v[PK_ENTRIES].arr;

    for (uint32_t i = 0; i < a->size; i++) {
        const msgpack_object_map *m = &a->ptr[i].via.map;
        const msgpack_object_str *path = NULL, *type = NULL;
        for (uint32_t j = 0; j < m->size; j++) {
            const msgpack_object_str *k = &m->ptr[j].key.via.str;
            if (k->size == 4 && memcmp(k->ptr, "path", 4) == 0)
                path = &m->ptr[j].val.via.str;
            if (k->size == 4 && memcmp(k->ptr, "type", 4) == 0)
                type = &m->ptr[j].val.via.str;
        }
        if (path && type) {
            proto_buf_append(&r->paths, path->ptr, path->size);
            proto_buf_append(&r->paths, " ", 1);
            proto_buf_append(&r->paths, type->ptr, type->size);
            proto_buf_append(&r->paths, "\n", 1);
        }
        r->nentries++;
    }
}

static void copy_obj_str(char *dst, size_t cap, const msgpack_object *o)
{
    size_t n = o->via.str.size < cap - 1 ? o->via.str.size : cap - 1;
    memcpy(dst, o->via.str.ptr, n);
    dst[n] = '\0';
}

static void add_procs(struct res *r, const struct proto_frame *f)
{
    const msgpack_object_array *a = f->v[PK_PROCS].arr;

    r->nprocs = 0;
    r->procs_total = a->size;
    for (uint32_t i = 0; i < a->size && i < 16; i++) {
        const msgpack_object_map *m = &a->ptr[i].via.map;
        struct pent *e = &r->procs[r->nprocs++];
        memset(e, 0, sizeof(*e));
        for (uint32_t j = 0; j < m->size; j++) {
            const msgpack_object *v = &m->ptr[j].val;
            char k[32];
            copy_obj_str(k, sizeof(k), &m->ptr[j].key);
            if (!strcmp(k, "pid"))
                e->pid = v->via.u64;
            else if (!strcmp(k, "start"))
                e->start = v->via.u64;
            else if (!strcmp(k, "end"))
                e->end = v->via.u64;
            else if (!strcmp(k, "cols"))
                e->cols = v->via.u64;
            else if (!strcmp(k, "rows"))
                e->rows = v->via.u64;
            else if (!strcmp(k, "started_ms"))
                e->started_ms = v->via.u64;
            else if (!strcmp(k, "code"))
                e->code = v->via.i64, e->has_code = true;
            else if (!strcmp(k, "sig"))
                e->sig = v->via.i64;
            else if (!strcmp(k, "running"))
                e->running = v->via.boolean;
            else if (!strcmp(k, "pty"))
                e->pty = v->via.boolean;
            else if (!strcmp(k, "stdin"))
                e->stdin_open = v->via.boolean;
            else if (!strcmp(k, "tag"))
                copy_obj_str(e->tag, sizeof(e->tag), v);
            else if (!strcmp(k, "cmd"))
                copy_obj_str(e->cmd, sizeof(e->cmd), v), e->cmd_len = v->via.str.size;
        }
    }
}

static void on_result(struct res *r, const struct proto_frame *f)
{
    r->have_result = true;
    if (proto_has(f, PK_PID))
        r->pid = f->v[PK_PID].u;
    if (proto_has(f, PK_PROCS))
        add_procs(r, f);
    r->size = f->v[PK_SIZE].u;
    r->mode = f->v[PK_MODE].u;
    r->mtime = f->v[PK_MTIME].i;
    if (proto_has(f, PK_TYPE))
        copy_str(r->type, sizeof(r->type), &f->v[PK_TYPE].s);
    if (proto_has(f, PK_NAME))
        copy_str(r->name, sizeof(r->name), &f->v[PK_NAME].s);
    if (proto_has(f, PK_ENTRIES)) {
        add_entries(r, f);
        r->nframes++;
        if (!proto_has(f, PK_EOF))
            r->bad_off++;
    }
    if (r->expect == EXPECT_RESULT || (r->expect == EXPECT_LIST && f->v[PK_EOF].b))
        r->done = true;
}

static void on_frame(struct peer *p, const struct proto_frame *f)
{
    struct res *r;

    if (f->type == PROTO_HELLO) {
        p->hello_id = f->id;
        p->hellos++;
        copy_str(p->kernel, sizeof(p->kernel), &f->v[PK_KERNEL].s);
        return;
    }
    if (f->id >= MAX_IDS) {
        fprintf(stderr, "frame for id %u out of the test range\n", f->id);
        failures++;
        return;
    }
    r = &p->res[f->id];
    if (r->done && f->type != PROTO_CREDIT) {
        fprintf(stderr, "%s frame for id %u after its last frame\n", proto_type_name(f->type),
                f->id);
        failures++;
    }
    switch (f->type) {
    case PROTO_OUT:
        append_out(p, f->id, (int)f->v[PK_FD].u, f);
        break;
    case PROTO_DATA:
        append_out(p, f->id, 0, f);
        break;
    case PROTO_EXIT:
        r->code = f->v[PK_CODE].i;
        r->sig = f->v[PK_SIG].i;
        r->timed_out = f->v[PK_TIMED_OUT].b;
        r->done = true;
        break;
    case PROTO_ERROR:
        r->error = true;
        r->err = f->v[PK_CODE].i;
        copy_str(r->msg, sizeof(r->msg), &f->v[PK_MSG].s);
        r->done = true;
        break;
    case PROTO_RESULT:
        on_result(r, f);
        break;
    case PROTO_END:
        r->done = true;
        r->ended = true;
        break;
    case PROTO_CREDIT:
        r->credit += f->v[PK_N].u;
        break;
    case PROTO_PONG:
        r->done = true;
        break;
    default:
        fprintf(stderr, "unexpected frame %s\n", proto_type_name(f->type));
        failures++;
    }
}

/* Handle one buffered frame if there is one. */
static int take_frame(struct peer *p)
{
    const uint8_t *pl;
    size_t len, used;
    struct proto_frame f;
    int r = proto_frame_split(p->in.p + p->in.off, proto_buf_pending(&p->in), &pl, &len, &used);

    if (r == PROTO_EAGAIN)
        return 0;
    if (r != 0) {
        fprintf(stderr, "bad frame from the agent: %s\n", proto_strerror(r));
        exit(2);
    }
    memcpy(p->cur, pl, len);
    proto_buf_consume(&p->in, used);
    msgpack_zone_clear(&p->zone);
    r = proto_decode(p->cur, len, &p->zone, &f);
    if (r != 0) {
        fprintf(stderr, "undecodable frame from the agent: %s\n", proto_strerror(r));
        failures++;
        return 1;
    }
    on_frame(p, &f);
    return 1;
}

static void flush_some(struct peer *p)
{
    while (proto_buf_pending(&p->out) > 0) {
        ssize_t n = write(p->fd, p->out.p + p->out.off, proto_buf_pending(&p->out));
        if (n <= 0)
            return;
        proto_buf_consume(&p->out, (size_t)n);
    }
}

int peer_step(struct peer *p, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    for (;;) {
        struct pollfd pf = {.fd = p->fd, .events = POLLIN};
        uint8_t buf[65536];
        int64_t left;
        ssize_t n;

        flush_some(p);
        if (take_frame(p))
            return 1;
        if (p->eof)
            return 0;
        left = end - now_ms();
        if (left < 0)
            return 0;
        if (proto_buf_pending(&p->out) > 0)
            pf.events |= POLLOUT;
        if (poll(&pf, 1, (int)left) <= 0)
            continue;
        n = read(p->fd, buf, sizeof(buf));
        if (n > 0)
            proto_buf_append(&p->in, buf, (size_t)n);
        else if (n == 0) {
            p->eof = true;
            return 0;
        }
    }
}

bool peer_wait(struct peer *p, uint32_t id, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    while (!p->res[id].done && !p->eof && now_ms() < end)
        peer_step(p, (int)(end - now_ms()));
    if (!p->res[id].done)
        fprintf(stderr, "timed out waiting for id %u\n", id);
    return p->res[id].done;
}

void peer_flush(struct peer *p, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    while (proto_buf_pending(&p->out) > 0 && !p->eof && now_ms() < end)
        peer_step(p, 10);
}

/* ---- senders ---- */

static void put_strv(struct proto_enc *e, enum proto_key k, const char *const *v, int step)
{
    uint32_t n = 0;

    while (v[n * step])
        n++;
    proto_enc_key(e, k);
    if (step == 1) {
        msgpack_pack_array(&e->pk, n);
        for (uint32_t i = 0; i < n; i++)
            msgpack_pack_str_with_body(&e->pk, v[i], strlen(v[i]));
    } else {
        msgpack_pack_map(&e->pk, n);
        for (uint32_t i = 0; i < n; i++) {
            msgpack_pack_str_with_body(&e->pk, v[2 * i], strlen(v[2 * i]));
            msgpack_pack_str_with_body(&e->pk, v[2 * i + 1], strlen(v[2 * i + 1]));
        }
    }
}

void send_exec(struct peer *p, uint32_t id, const struct exec_opts *o, bool auto_credit)
{
    struct proto_buf b;
    struct proto_enc e;
    uint32_t n = 3 + !!o->env + !!o->cwd + !!o->user + !!o->timeout_ms + 1 + o->bg + !!o->tag +
                 2 * (o->cols && o->rows) - (!o->cmd && !o->argv);

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_EXEC, id, n);
    if (o->cmd)
        proto_put_cstr(&e, PK_CMD, o->cmd);
    else if (o->argv)
        put_strv(&e, PK_ARGV, o->argv, 1);
    if (o->bg)
        proto_put_b(&e, PK_BG, true);
    if (o->tag)
        proto_put_cstr(&e, PK_TAG, o->tag);
    if (o->cols && o->rows) {
        proto_put_u(&e, PK_COLS, o->cols);
        proto_put_u(&e, PK_ROWS, o->rows);
    }
    if (o->env)
        put_strv(&e, PK_ENV, o->env, 2);
    if (o->cwd)
        proto_put_cstr(&e, PK_CWD, o->cwd);
    if (o->user)
        proto_put_cstr(&e, PK_USER, o->user);
    if (o->timeout_ms)
        proto_put_u(&e, PK_TIMEOUT, o->timeout_ms);
    proto_put_b(&e, PK_STDIN, o->stdin_pipe);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_EXIT;
    p->res[id].auto_credit = auto_credit;
    peer_queue(p, &b);
}

void send_simple(struct peer *p, enum proto_type t, uint32_t id, const char *path,
                 enum expect expect)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, t, id, path ? 3 : 2);
    if (path)
        proto_put_cstr(&e, PK_PATH, path);
    proto_enc_end(&e);
    p->res[id].expect = expect;
    p->res[id].auto_credit = true;
    peer_queue(p, &b);
}

void send_credit(struct peer *p, uint32_t id, uint64_t n)
{
    struct proto_buf b;

    proto_buf_init(&b);
    proto_send_credit(&b, id, n);
    peer_queue(p, &b);
}

void send_stdin(struct peer *p, uint32_t id, const void *data, size_t n, bool eof)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_STDIN, id, 2 + (n > 0) + eof);
    if (n)
        proto_put_bin(&e, PK_DATA, data, n);
    if (eof)
        proto_put_b(&e, PK_EOF, true);
    proto_enc_end(&e);
    peer_queue(p, &b);
}

void send_signal(struct peer *p, uint32_t id, int sig)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_SIGNAL, id, 3);
    proto_put_i(&e, PK_SIG, sig);
    proto_enc_end(&e);
    peer_queue(p, &b);
}

void send_list(struct peer *p, uint32_t id, const char *path, uint64_t depth)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_LIST, id, 4);
    proto_put_cstr(&e, PK_PATH, path);
    proto_put_u(&e, PK_DEPTH, depth);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_LIST;
    peer_queue(p, &b);
}

void send_fwrite(struct peer *p, uint32_t id, const char *path, int mode)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_FWRITE, id, mode >= 0 ? 4 : 3);
    proto_put_cstr(&e, PK_PATH, path);
    if (mode >= 0)
        proto_put_u(&e, PK_MODE, (uint64_t)mode);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_RESULT;
    peer_queue(p, &b);
}

void send_data(struct peer *p, uint32_t id, uint64_t off, const void *data, size_t n)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_DATA, id, 4);
    proto_put_u(&e, PK_OFF, off);
    proto_put_bin(&e, PK_DATA, data, n);
    proto_enc_end(&e);
    peer_queue(p, &b);
}

void send_end(struct peer *p, uint32_t id)
{
    struct proto_buf b;

    proto_buf_init(&b);
    proto_send_end(&b, id);
    peer_queue(p, &b);
}

void send_remove(struct peer *p, uint32_t id, const char *path, bool recursive)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_REMOVE, id, 4);
    proto_put_cstr(&e, PK_PATH, path);
    proto_put_b(&e, PK_RECURSIVE, recursive);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_RESULT;
    peer_queue(p, &b);
}

void send_rename(struct peer *p, uint32_t id, const char *from, const char *to)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_RENAME, id, 4);
    proto_put_cstr(&e, PK_PATH, from);
    proto_put_cstr(&e, PK_TO, to);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_RESULT;
    peer_queue(p, &b);
}

void send_init(struct peer *p, uint32_t id)
{
    struct proto_buf b;
    struct proto_enc e;
    uint8_t entropy[PROTO_ENTROPY] = {1, 2, 3};

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_INIT, id, 7);
    proto_put_u(&e, PK_V, PROTO_VERSION);
    proto_put_u(&e, PK_TIME_NS, 1); /* would be 1970: must not touch the host's clock */
    proto_put_bin(&e, PK_ENTROPY, entropy, sizeof(entropy));
    proto_put_cstr(&e, PK_HOSTNAME, "not-the-host");
    proto_put_u(&e, PK_MEM_MB, 256);
    proto_enc_end(&e);
    peer_queue(p, &b);
}

void send_resync(struct peer *p, uint32_t id, size_t nentropy, const char *boot_id,
                 const char *host)
{
    struct proto_buf b;
    struct proto_enc e;
    uint8_t entropy[PROTO_ENTROPY + 1] = {4, 5, 6};

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_RESYNC, id, 3 + !!nentropy + !!boot_id + !!host);
    proto_put_u(&e, PK_TIME_NS, 1); /* would be 1970: must not touch the host's clock */
    if (nentropy)
        proto_put_bin(&e, PK_ENTROPY, entropy, nentropy);
    if (boot_id)
        proto_put_cstr(&e, PK_BOOT_ID, boot_id);
    if (host)
        proto_put_cstr(&e, PK_HOSTNAME, host);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_RESULT;
    peer_queue(p, &b);
}

/* True once pid no longer exists, or is a zombie its new parent has not reaped yet. */
bool pid_gone(pid_t pid, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    for (;;) {
        char path[64], buf[512];
        FILE *f;
        bool zombie = false;

        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        f = fopen(path, "r");
        if (!f)
            return true;
        if (fgets(buf, sizeof(buf), f)) {
            char *rp = strrchr(buf, ')');
            zombie = rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
        }
        fclose(f);
        if (zombie)
            return true;
        if (now_ms() > end)
            return false;
        usleep(10000);
    }
}

void send_init2(struct peer *p, uint32_t id, uint64_t ring, uint64_t max_procs)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_INIT, id, 4 + !!ring + !!max_procs);
    proto_put_u(&e, PK_V, PROTO_VERSION);
    proto_put_cstr(&e, PK_HOSTNAME, "not-the-host");
    if (ring)
        proto_put_u(&e, PK_RING, ring);
    if (max_procs)
        proto_put_u(&e, PK_MAX_PROCS, max_procs);
    proto_enc_end(&e);
    peer_queue(p, &b);
}

uint64_t start_bg(struct peer *p, uint32_t id, const struct exec_opts *o)
{
    struct exec_opts bg = *o;

    bg.bg = true;
    send_exec(p, id, &bg, false);
    p->res[id].expect = EXPECT_RESULT;
    if (!peer_wait(p, id, 5000) || p->res[id].error) {
        fprintf(stderr, "background exec %u: %s\n", id, p->res[id].msg);
        return 0;
    }
    return p->res[id].pid;
}

void send_attach(struct peer *p, uint32_t id, uint64_t pid, uint64_t off, bool follow,
                 bool auto_credit)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_ATTACH, id, 5);
    proto_put_u(&e, PK_PID, pid);
    proto_put_u(&e, PK_OFF, off);
    proto_put_b(&e, PK_FOLLOW, follow);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_EXIT;
    p->res[id].auto_credit = auto_credit;
    p->res[id].attach = true;
    p->res[id].next_off = off;
    peer_queue(p, &b);
}

void send_detach(struct peer *p, uint32_t id)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_DETACH, id, 2);
    proto_enc_end(&e);
    peer_queue(p, &b);
}

void send_plist(struct peer *p, uint32_t id, uint64_t pid)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_PLIST, id, 2 + !!pid);
    if (pid)
        proto_put_u(&e, PK_PID, pid);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_RESULT;
    p->res[id].done = false;
    p->res[id].error = false;
    peer_queue(p, &b);
}

void send_pctl(struct peer *p, uint32_t id, uint64_t pid, const void *data, size_t n, bool eof,
               int sig, uint64_t cols, uint64_t rows)
{
    struct proto_buf b;
    struct proto_enc e;

    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_PCTL, id, 3 + !!data + eof + !!sig + !!cols + !!rows);
    proto_put_u(&e, PK_PID, pid);
    if (data)
        proto_put_bin(&e, PK_DATA, data, n);
    if (eof)
        proto_put_b(&e, PK_EOF, true);
    if (sig)
        proto_put_i(&e, PK_SIG, sig);
    if (cols)
        proto_put_u(&e, PK_COLS, cols);
    if (rows)
        proto_put_u(&e, PK_ROWS, rows);
    proto_enc_end(&e);
    p->res[id].expect = EXPECT_RESULT;
    p->res[id].done = false;
    p->res[id].error = false;
    p->res[id].err = -1;
    peer_queue(p, &b);
}
