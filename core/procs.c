/* procs.c - a guest's process list, checked and made records (see procs.h). */
#include "procs.h"
#include "util.h"
#include "gstream.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (why && cap) {
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return -EPROTO;
}

/* The fields of one entry, as the guest sent them. */
struct entry {
    uint64_t pid, cols, rows, start, end, started_ms;
    int64_t code, sig;
    bool pty, running, stdin_open;
    const msgpack_object *tag, *cmd;
    unsigned have;
};

enum { H_PID = 1, H_RUNNING = 2, H_START = 4, H_END = 8, H_COLS = 16, H_ROWS = 32 };

static bool key_is(const msgpack_object *k, const char *name)
{
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == strlen(name) &&
           memcmp(k->via.str.ptr, name, k->via.str.size) == 0;
}

static bool as_uint(const msgpack_object *v, uint64_t *out)
{
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *out = v->via.u64;
    return true;
}

static bool as_int(const msgpack_object *v, int64_t *out)
{
    if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = v->via.i64;
        return true;
    }
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= INT64_MAX) {
        *out = (int64_t)v->via.u64;
        return true;
    }
    return false;
}

static int parse_entry(const msgpack_object *m, struct entry *e, char *why, size_t cap)
{
    memset(e, 0, sizeof(*e));
    if (m->type != MSGPACK_OBJECT_MAP)
        return bad(why, cap, "a process entry that is not a map");
    for (uint32_t i = 0; i < m->via.map.size; i++) {
        const msgpack_object *k = &m->via.map.ptr[i].key, *v = &m->via.map.ptr[i].val;
        bool ok = true;

        if (key_is(k, "pid")) {
            ok = as_uint(v, &e->pid);
            e->have |= H_PID;
        } else if (key_is(k, "tag") || key_is(k, "cmd")) {
            ok = v->type == MSGPACK_OBJECT_STR;
            *(key_is(k, "tag") ? &e->tag : &e->cmd) = v;
        } else if (key_is(k, "pty") || key_is(k, "running") || key_is(k, "stdin")) {
            bool *b = key_is(k, "pty")       ? &e->pty
                      : key_is(k, "running") ? &e->running
                                             : &e->stdin_open;
            ok = v->type == MSGPACK_OBJECT_BOOLEAN;
            *b = ok && v->via.boolean;
            e->have |= key_is(k, "running") ? H_RUNNING : 0;
        } else if (key_is(k, "cols")) {
            ok = as_uint(v, &e->cols);
            e->have |= H_COLS;
        } else if (key_is(k, "rows")) {
            ok = as_uint(v, &e->rows);
            e->have |= H_ROWS;
        } else if (key_is(k, "start")) {
            ok = as_uint(v, &e->start);
            e->have |= H_START;
        } else if (key_is(k, "end")) {
            ok = as_uint(v, &e->end);
            e->have |= H_END;
        } else if (key_is(k, "started_ms")) {
            ok = as_uint(v, &e->started_ms);
        } else if (key_is(k, "code")) {
            ok = as_int(v, &e->code);
        } else if (key_is(k, "sig")) {
            ok = as_int(v, &e->sig);
        }
        if (!ok)
            return bad(why, cap, "process entry key '%.*s' of the wrong type",
                       (int)(k->via.str.size > 32 ? 32 : k->via.str.size), k->via.str.ptr);
    }
    if ((e->have & (H_PID | H_RUNNING | H_START | H_END)) != (H_PID | H_RUNNING | H_START | H_END))
        return bad(why, cap, "process entry without pid, running, start and end");
    if (e->pid < 1 || e->pid > PROCS_PID_MAX)
        return bad(why, cap, "process pid %" PRIu64 " outside 1..%d", e->pid, PROCS_PID_MAX);
    if (e->start > e->end || e->end > PROCS_OFF_MAX)
        return bad(why, cap, "process %" PRIu64 " output offsets %" PRIu64 "..%" PRIu64, e->pid,
                   e->start, e->end);
    if (e->pty && ((e->have & (H_COLS | H_ROWS)) != (H_COLS | H_ROWS) || e->cols < 1 ||
                   e->rows < 1 || e->cols > PROCS_SIZE_MAX || e->rows > PROCS_SIZE_MAX))
        return bad(why, cap, "PTY %" PRIu64 " without a size in 1..%d", e->pid, PROCS_SIZE_MAX);
    if (!e->running && e->sig != 0 && !gstream_sig_ok(e->sig))
        return bad(why, cap, "process %" PRIu64 " ended by signal %" PRId64, e->pid, e->sig);
    if (!e->running && (e->code < INT32_MIN || e->code > INT32_MAX))
        return bad(why, cap, "process %" PRIu64 " exit code %" PRId64, e->pid, e->code);
    if (e->tag && e->tag->via.str.size > SBX_TAG_MAX)
        return bad(why, cap, "process %" PRIu64 " tag of %" PRIu32 " bytes", e->pid,
                   e->tag->via.str.size);
    if (e->cmd && e->cmd->via.str.size > PROCS_CMD_MAX)
        return bad(why, cap, "process %" PRIu64 " command of %" PRIu32 " bytes", e->pid,
                   e->cmd->via.str.size);
    return 0;
}

static void entry_rec(const struct entry *e, struct sbx_proc_rec *r)
{
    memset(r, 0, sizeof(*r));
    r->pid = (uint32_t)e->pid;
    if (e->tag)
        r->tag = (struct sbx_str){e->tag->via.str.ptr, e->tag->via.str.size};
    if (e->cmd)
        r->cmd = (struct sbx_str){e->cmd->via.str.ptr, e->cmd->via.str.size};
    r->pty = e->pty;
    r->cols = (unsigned)e->cols;
    r->rows = (unsigned)e->rows;
    r->running = e->running;
    r->stdin_open = e->stdin_open && e->running;
    r->output_start = e->start;
    r->output_end = e->end;
    r->started_ms = e->started_ms;
    r->exit_code = e->code;
    r->signal = e->sig;
}

int procs_list(const msgpack_object_array *procs, unsigned max, struct sbx_proc_rec **out,
               size_t *n, char *why, size_t cap)
{
    struct sbx_proc_rec *v;
    struct entry e;

    *out = NULL;
    *n = 0;
    if (procs->size > max)
        return bad(why, cap, "%" PRIu32 " processes listed, at most %u exist", procs->size, max);
    if (!(v = calloc(procs->size + 1, sizeof(*v))))
        return -ENOMEM;
    for (uint32_t i = 0; i < procs->size; i++) {
        int r = parse_entry(&procs->ptr[i], &e, why, cap);
        if (r != 0) {
            free(v);
            return r;
        }
        /* A pid listed twice would make "the process with this pid" ambiguous. */
        for (uint32_t j = 0; j < i; j++) {
            if (v[j].pid == e.pid) {
                free(v);
                return bad(why, cap, "process %" PRIu64 " listed twice", e.pid);
            }
        }
        entry_rec(&e, &v[i]);
    }
    *out = v;
    *n = procs->size;
    return 0;
}
