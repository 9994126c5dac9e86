/*
 * envd.c - E2B's in-sandbox API ("envd") on warrend's own listener, so that
 * E2B's unmodified SDKs run their data-plane calls against Warren: the
 * Connect protocol with its JSON codec over HTTP/1.1 (connect.h) for the
 * process.Process and filesystem.Filesystem services, and GET/POST /files,
 * GET /health.
 *
 * A request is this door's when it carries E2b-Sandbox-Id (with
 * E2b-Sandbox-Port 49983, or 49999 for the code interpreter), or when its
 * Host is {port}-{id}.{port_domain} for one of those ports. It is admitted
 * only with the sandbox's own token (X-Access-Token: token_e2b "envd"; on
 * 49999 E2B-Traffic-Access-Token: "traffic"), and only while the sandbox is
 * alive: a token dies with its sandbox. Port 49999's own routes (/execute,
 * /contexts) are e2b_code.c's; this file admits them and collects their body.
 *
 * A codec, never a second implementation: every call is one or a few of the
 * sandbox core's operations (sbx.h), made through the small set of core_*
 * functions below, the only calls into the core (the core's result shapes are
 * read in step_done, find_proc and entry_of, its exec body built in
 * exec_body). Every process is started as the sandbox's own (background or
 * PTY), and a stream (Start, Connect) is its output followed from an offset:
 * a stream that ends, by its deadline (Connect-Timeout-Ms) or a dropped
 * client, never ends the process, which process.Connect reattaches by pid or
 * tag. WatchDir is one of the sandbox's file watches (watch.c), whose
 * lifetime is its stream's, as in E2B.
 *
 * State: struct envd_req, one per request (pss->envd), freed by
 * envd_req_end from rest_req_end. The core's sink calls back with the pss;
 * a step that finishes starts the next operation (a tag resolved to a pid,
 * then the action), so an op stays live from the first step to the answer.
 */
#include "http_int.h"
#include "sbx_json.h"
#include "connect.h"
#include "e2b_code.h"
#include "envd_wstore.h"
#include "multipart.h"
#include "ports_head.h"
#include "util.h"
#include "watch_ev.h"

#define SEL_TAG_MAX 256 /* a selector's tag (the core's own cap) */
#define KA_MIN_S    1.0 /* keepalive events at most this often */
#define KA_MAX_S    3600.0
#define ENVD_CTYPE  "application/connect+json"

enum envd_m {
    M_START,
    M_CONNECT,
    M_LIST,
    M_SEND_INPUT,
    M_SEND_SIGNAL,
    M_CLOSE_STDIN,
    M_UPDATE,
    M_STAT,
    M_MKDIR,
    M_MOVE,
    M_LISTDIR,
    M_REMOVE,
    M_WATCH,
    M_WATCHER_NEW,
    M_WATCHER_GET,
    M_WATCHER_DEL,
    M_UNIMPLEMENTED,
    M_FILES_GET,
    M_FILES_POST,
    M_CODE, /* port 49999: the code interpreter (e2b_code.c) */
};

static const struct {
    const char *path;
    enum envd_m m;
    bool stream;
} rpcs[] = {
    {"/process.Process/Start", M_START, true},
    {"/process.Process/Connect", M_CONNECT, true},
    {"/process.Process/List", M_LIST, false},
    {"/process.Process/SendInput", M_SEND_INPUT, false},
    {"/process.Process/SendSignal", M_SEND_SIGNAL, false},
    {"/process.Process/CloseStdin", M_CLOSE_STDIN, false},
    {"/process.Process/Update", M_UPDATE, false},
    {"/process.Process/StreamInput", M_UNIMPLEMENTED, true},
    {"/filesystem.Filesystem/Stat", M_STAT, false},
    {"/filesystem.Filesystem/MakeDir", M_MKDIR, false},
    {"/filesystem.Filesystem/Move", M_MOVE, false},
    {"/filesystem.Filesystem/ListDir", M_LISTDIR, false},
    {"/filesystem.Filesystem/Remove", M_REMOVE, false},
    {"/filesystem.Filesystem/WatchDir", M_WATCH, true},
    /* The polling watchers (E2B's Python SDK): a watch whose reader's offset this
     * server keeps between calls (struct envd_watcher). */
    {"/filesystem.Filesystem/CreateWatcher", M_WATCHER_NEW, false},
    {"/filesystem.Filesystem/GetWatcherEvents", M_WATCHER_GET, false},
    {"/filesystem.Filesystem/RemoveWatcher", M_WATCHER_DEL, false},
};

struct envd_req {
    struct pss *p;
    enum envd_m m;
    enum e2b_code_route code_route; /* M_CODE: its route */
    bool stream;                    /* a server stream: answered with envelopes */
    bool begun;                     /* its 200 head and first envelope are queued */
    bool pty;                       /* Start/Connect: output is a terminal's */
    bool close_stdin;               /* Start: stdin false, closed once started */
    bool empty;                     /* POST /files: an empty body (Content-Length: 0) */
    int step;
    json_t *msg; /* the request message (or a /files call's args) */
    uint32_t pid;
    bool by_tag;
    char tag[SEL_TAG_MAX + 1];
    char user[16];
    char path[API_PATH_MAX + 1], path2[API_PATH_MAX + 1];
    uint64_t out_off; /* Connect: where its output is followed from */
    struct sbx_proc_ctl ctl;
    unsigned char *raw; /* ctl.data's bytes */
    double deadline_s, ka_s;
    ev_timer deadline, keepalive;
    /* WatchDir: its watch (a process of the sandbox whose lifetime is this stream's),
     * and the decoder of its lines */
    uint32_t watch_pid;
    bool watch_ready, watch_over, ev_init;
    struct watch_ev ev;
    /* GetWatcherEvents: the events read so far, and the offset after the last one */
    json_t *events;
    uint64_t events_end;
};

/* A polling watcher: the watch process pid in sandbox sbx, read up to off. Its id is the
 * pid in decimal. There are at most watch_max_per_sbx per live sandbox: those of ended
 * sandboxes are dropped at the next CreateWatcher. off is kept on disk too
 * (envd_wstore.h): after a restart of warrend, a watcher not in memory is read back from
 * there at its next call, its watch having run on in the sandbox. */
struct envd_watcher {
    struct envd_watcher *next;
    char sbx[API_ID_MAX + 1];
    uint32_t pid;
    uint64_t off;
};

static const struct sbx_sink envd_sink;
static struct envd_watcher *watcher_of(struct pss *p, const json_t *msg);
static struct envd_watcher *watcher_find(struct http_server *srv, const char *sbx, uint32_t pid);
static void watcher_drop(struct http_server *srv, struct envd_watcher *w);
static void watcher_save(struct http_server *srv, const struct envd_watcher *w);

/* ------------------------------------------------------------ errors */

static enum connect_code code_of(enum sbx_errcode c)
{
    switch (c) {
    case SBX_E_BAD_REQUEST:
    case SBX_E_INVALID_ARGUMENT:
    case SBX_E_IS_A_DIRECTORY:
    case SBX_E_NOT_A_DIRECTORY:
    case SBX_E_TOO_MANY_SYMLINKS:
    case SBX_E_CROSS_DEVICE:
    case SBX_E_NOT_A_PTY:
    case SBX_E_BAD_OFFSET:
    case SBX_E_EXEC_FAILED:
        return CONNECT_INVALID_ARGUMENT;
    case SBX_E_PERMISSION_DENIED:
    case SBX_E_READ_ONLY:
        return CONNECT_PERMISSION_DENIED;
    case SBX_E_NOT_FOUND:
    case SBX_E_FILE_NOT_FOUND:
    case SBX_E_PROCESS_NOT_FOUND:
        return CONNECT_NOT_FOUND;
    case SBX_E_FILE_EXISTS:
        return CONNECT_ALREADY_EXISTS;
    case SBX_E_DIRECTORY_NOT_EMPTY:
    case SBX_E_PROCESS_EXITED:
    case SBX_E_STDIN_CLOSED:
        return CONNECT_FAILED_PRECONDITION;
    case SBX_E_TOO_LARGE:
    case SBX_E_TOO_MANY_SANDBOXES:
    case SBX_E_TOO_MANY_OPERATIONS:
    case SBX_E_MEMORY_EXHAUSTED:
    case SBX_E_DISK_FULL:
    case SBX_E_STDIN_FULL:
    case SBX_E_TOO_MANY_PROCESSES:
        return CONNECT_RESOURCE_EXHAUSTED;
    case SBX_E_GONE:
    case SBX_E_DEAD:
    case SBX_E_NOT_READY:
    case SBX_E_SHUTTING_DOWN:
    case SBX_E_CHANNEL_LOST:
    case SBX_E_CONFLICT:
        return CONNECT_UNAVAILABLE;
    default:
        return CONNECT_INTERNAL;
    }
}

/* ------------------------------------------------------------ answers */

/* The op (if any) is over: ANSWER. */
static void to_answer(struct pss *p)
{
    if (http_phase_op_live(p->phase))
        req_phase(p, HP_ANSWER);
}

static void timers_stop(struct pss *p)
{
    struct envd_req *e = p->envd;

    ev_timer_stop(p->srv->loop, &e->deadline);
    ev_timer_stop(p->srv->loop, &e->keepalive);
}

/* Queue one envelope: flags, then the JSON text s (n bytes); credit as for stream
 * data. 0 or -ENOMEM. */
static int env_put(struct pss *p, unsigned flags, const char *s, size_t n, size_t credit)
{
    struct obuf *ob = resp_q_room(p, CONNECT_HDR + n);

    if (!ob)
        return -ENOMEM;
    connect_env_head(OB_PAYLOAD(ob) + ob->len, flags, (uint32_t)n);
    memcpy(OB_PAYLOAD(ob) + ob->len + CONNECT_HDR, s, n);
    resp_q_grew(p, ob, CONNECT_HDR + n, credit);
    return 0;
}

/* The stream's 200 head (chunked), once. */
static void stream_begin(struct pss *p)
{
    struct envd_req *e = p->envd;

    if (e->begun)
        return;
    e->begun = true;
    p->ctype = ENVD_CTYPE;
    resp_ndjson_begin(p);
}

/* One message of the stream (takes msg). */
static void stream_msg(struct pss *p, json_t *msg)
{
    char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;

    json_decref(msg);
    stream_begin(p);
    if (!s || env_put(p, 0, s, strlen(s), 0))
        p->close_after = true;
    free(s);
    resp_stall_arm(p, false);
    resp_want_write(p);
}

/* The end envelope ({} or the error) and the end of the body. */
static void stream_end(struct pss *p, enum connect_code c, const char *msg)
{
    json_t *j = c == CONNECT_OK ? json_object()
                                : json_pack("{s:{s:s, s:s}}", "error", "code", connect_code_name(c),
                                            "message", msg ? msg : "");
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

    json_decref(j);
    timers_stop(p);
    to_answer(p);
    stream_begin(p);
    if (!s || env_put(p, CONNECT_FLAG_END, s, strlen(s), 0))
        p->close_after = true;
    free(s);
    resp_stream_close(p);
    resp_want_write(p);
}

/* A unary answer (takes msg). */
static void unary_ok(struct pss *p, json_t *msg)
{
    to_answer(p);
    resp_json(p, 200, msg ? msg : json_object());
}

static void fail(struct pss *p, enum connect_code c, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* An error answer as the call's kind takes it: the end envelope of a stream, a unary
 * Connect error, or /files' {"code":status,"message"}. */
static void fail(struct pss *p, enum connect_code c, const char *fmt, ...)
{
    char msg[SBX_ERR_MSG_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (p->envd && p->envd->stream) {
        stream_end(p, c, msg);
        return;
    }
    if (p->envd)
        timers_stop(p);
    to_answer(p);
    if (p->envd && (p->envd->m == M_FILES_GET || p->envd->m == M_FILES_POST)) {
        int st = connect_code_status(c);
        resp_json(p, st, json_pack("{s:i, s:s}", "code", st, "message", msg));
        return;
    }
    resp_json(p, connect_code_status(c),
              json_pack("{s:s, s:s}", "code", connect_code_name(c), "message", msg));
}

static void fail_sbx(struct pss *p, const struct sbx_err *err)
{
    if (p->envd && (p->envd->m == M_FILES_GET || p->envd->m == M_FILES_POST)) {
        int st = api_status_of(err->code);
        to_answer(p);
        resp_json(p, st, json_pack("{s:i, s:s}", "code", st, "message", err->msg));
        return;
    }
    fail(p, code_of(err->code), "%s", err->msg);
}

/* ------------------------------------------------ the core, in one place */

static int core_exec(struct pss *p, json_t *body, struct sbx_err *err)
{
    return sbx_json_call_exec(p->srv->t, p->sbx, body, false, &envd_sink, p, &p->op, err);
}

static int core_output(struct pss *p, uint32_t pid, uint64_t off, struct sbx_err *err)
{
    return sbx_proc_output(p->srv->t, p->sbx, pid, off, true, &envd_sink, p, &p->op, err);
}

static int core_ctl(struct pss *p, uint32_t pid, const struct sbx_proc_ctl *c, struct sbx_err *err)
{
    return sbx_proc_ctl(p->srv->t, p->sbx, pid, c, &envd_sink, p, &p->op, err);
}

static int core_list(struct pss *p, uint32_t pid, struct sbx_err *err)
{
    return sbx_proc_list(p->srv->t, p->sbx, pid, &envd_sink, p, &p->op, err);
}

/* kind: "stat", "list", "mkdir", "remove", "rename"; depth < 0, to NULL: not given. */
static int core_file(struct pss *p, const char *kind, const char *path, int depth, const char *to,
                     struct sbx_err *err)
{
    struct sbx_file_req f = {
        .kind = !strcmp(kind, "stat")     ? SBX_FILE_STAT
                : !strcmp(kind, "list")   ? SBX_FILE_LIST
                : !strcmp(kind, "mkdir")  ? SBX_FILE_MKDIR
                : !strcmp(kind, "rename") ? SBX_FILE_RENAME
                                          : SBX_FILE_REMOVE,
        .path = path,
        .to = to,
        .depth = depth >= 0 ? depth : SBX_UNSET,
        .recursive = !strcmp(kind, "remove"),
    };

    return sbx_file_op(p->srv->t, p->sbx, &f, &envd_sink, p, &p->op, err);
}

static int core_read(struct pss *p, const char *path, struct sbx_err *err)
{
    return sbx_file_read(p->srv->t, p->sbx, path, &envd_sink, p, &p->op, err);
}

static int core_write(struct pss *p, const char *path, struct sbx_err *err)
{
    return sbx_file_write(p->srv->t, p->sbx, path, 0644, &envd_sink, p, &p->op, err);
}

/* A started op: OP (from RUN), or still STREAM/OP for a later step. A failed start:
 * answered. true when started. */
static bool started(struct pss *p, int rc, const struct sbx_err *err)
{
    if (rc) {
        fail_sbx(p, err);
        return false;
    }
    if (p->phase == HP_RUN || p->phase == HP_HEAD)
        req_phase(p, HP_OP);
    return true;
}

/* ------------------------------------------------------ message shapes */

/* The core's stat record as E2B's EntryInfo. */
static json_t *entry_of(const json_t *st)
{
    const char *type = json_string_value(json_object_get(st, "type"));
    const char *mode = json_string_value(json_object_get(st, "mode"));
    const char *mtime = json_string_value(json_object_get(st, "mtime"));
    unsigned m = mode ? (unsigned)strtoul(mode, NULL, 8) & 07777 : 0;
    bool dir = type && !strcmp(type, "dir");
    char perm[11], size[24];
    json_t *o;

    perm[0] = dir ? 'd' : type && !strcmp(type, "symlink") ? 'l' : '-';
    for (int i = 0; i < 9; i++)
        perm[1 + i] = m & (0400u >> i) ? "rwxrwxrwx"[i] : '-';
    perm[10] = '\0';
    snprintf(size, sizeof(size), "%" JSON_INTEGER_FORMAT,
             json_integer_value(json_object_get(st, "size")));
    o = json_pack("{s:O?, s:s, s:O?, s:s, s:i, s:s, s:s, s:s}", "name", json_object_get(st, "name"),
                  "type",
                  dir                             ? "FILE_TYPE_DIRECTORY"
                  : type && !strcmp(type, "file") ? "FILE_TYPE_FILE"
                                                  : "FILE_TYPE_UNSPECIFIED",
                  "path", json_object_get(st, "path"), "size", size, "mode", (int)m, "permissions",
                  perm, "owner", "", "group", "");
    if (o && mtime)
        json_object_set_new(o, "modifiedTime", json_string(mtime));
    return o;
}

/* "exit status N" / "signal: killed", as Go's os.ProcessState says it (E2B shows it). */
static void exit_status(const json_t *rec, char *out, size_t cap)
{
    static const char *const names[] = {
        [1] = "hangup", [2] = "interrupt",    [3] = "quit",         [6] = "aborted",
        [9] = "killed", [13] = "broken pipe", [14] = "alarm clock", [15] = "terminated",
    };
    json_int_t sig = json_integer_value(json_object_get(rec, "signal"));

    if (sig > 0 && (size_t)sig < sizeof(names) / sizeof(names[0]) && names[sig])
        snprintf(out, cap, "signal: %s", names[sig]);
    else if (sig > 0)
        snprintf(out, cap, "signal: %d", (int)sig);
    else
        snprintf(out, cap, "exit status %d",
                 (int)json_integer_value(json_object_get(rec, "exit_code")));
}

/* path as the caller means it: absolute as it is, else under the user's home. 0, or
 * -EINVAL (answered). */
static int resolve_path(struct pss *p, const char *in, char *out)
{
    const char *home = !strcmp(p->envd->user, "root") ? "/root" : "/home/user";
    struct api_err ae;
    int n;

    if (!in || !*in) {
        fail(p, CONNECT_INVALID_ARGUMENT, "a path is required");
        return -EINVAL;
    }
    if (in[0] == '/')
        n = snprintf(out, API_PATH_MAX + 1, "%s", in);
    else if (in[0] == '~' && (in[1] == '\0' || in[1] == '/'))
        n = snprintf(out, API_PATH_MAX + 1, "%s%s", home, in + 1);
    else
        n = snprintf(out, API_PATH_MAX + 1, "%s/%s", home, in);
    if (n < 0 || n > API_PATH_MAX || api_path_check("path", out, &ae)) {
        fail(p, CONNECT_INVALID_ARGUMENT, "path: too long, or not UTF-8");
        return -EINVAL;
    }
    return 0;
}

/* The selector {"pid":N} or {"tag":"..."} of msg's "process". 0, or -EINVAL (answered). */
static int selector(struct pss *p, const json_t *msg)
{
    struct envd_req *e = p->envd;
    const json_t *sel = json_object_get(msg, "process");
    const json_t *pid = json_object_get(sel, "pid"), *tag = json_object_get(sel, "tag");

    if (json_is_integer(pid) && json_integer_value(pid) > 0 &&
        json_integer_value(pid) <= UINT32_MAX) {
        e->pid = (uint32_t)json_integer_value(pid);
        return 0;
    }
    if (json_is_string(tag) && json_string_length(tag) > 0 &&
        json_string_length(tag) <= SEL_TAG_MAX) {
        e->by_tag = true;
        memcpy(e->tag, json_string_value(tag), json_string_length(tag) + 1);
        return 0;
    }
    fail(p, CONNECT_INVALID_ARGUMENT,
         "process: a selector {\"pid\":N} or {\"tag\":\"...\"} is required");
    return -EINVAL;
}

/* ------------------------------------------------------------ processes */

/* Start's request as the core's exec body. NULL: answered. */
static json_t *exec_body(struct pss *p, const json_t *msg)
{
    struct envd_req *e = p->envd;
    const json_t *proc = json_object_get(msg, "process"), *v;
    const json_t *size = json_object_get(json_object_get(msg, "pty"), "size");
    json_t *b = json_object(), *argv = json_array();

    if (!b || !argv || !json_is_string(json_object_get(proc, "cmd")))
        goto bad;
    json_array_append(argv, json_object_get(proc, "cmd"));
    {
        size_t i;
        json_array_foreach(json_object_get(proc, "args"), i, v)
        {
            if (!json_is_string(v))
                goto bad;
            json_array_append(argv, (json_t *)v);
        }
    }
    json_object_set_new(b, "argv", argv);
    argv = NULL;
    if ((v = json_object_get(proc, "envs")) && json_object_size(v))
        json_object_set(b, "env", (json_t *)v);
    if ((v = json_object_get(proc, "cwd")) && json_is_string(v) && json_string_length(v))
        json_object_set(b, "cwd", (json_t *)v);
    json_object_set_new(b, "user", json_string(e->user));
    if ((v = json_object_get(msg, "tag")) && json_is_string(v))
        json_object_set(b, "tag", (json_t *)v);
    if (json_is_object(json_object_get(msg, "pty"))) {
        e->pty = true;
        json_object_set_new(b, "pty",
                            json_pack("{s:I, s:I}", "cols",
                                      json_integer_value(json_object_get(size, "cols"))
                                          ? json_integer_value(json_object_get(size, "cols"))
                                          : 80,
                                      "rows",
                                      json_integer_value(json_object_get(size, "rows"))
                                          ? json_integer_value(json_object_get(size, "rows"))
                                          : 24));
    } else {
        json_object_set_new(b, "background", json_true());
        /* "stdin": false closes it once the process runs (what E2B's SDKs send unless
         * asked for stdin); absent, it stays open, as for the SDKs that predate the
         * field */
        e->close_stdin = json_is_false(json_object_get(msg, "stdin"));
    }
    return b;
bad:
    json_decref(b);
    json_decref(argv);
    fail(p, CONNECT_INVALID_ARGUMENT, "process.cmd (a string) and args (strings) are required");
    return NULL;
}

/* Follow the process's output from e->out_off (the stream's last step). */
static void follow(struct pss *p)
{
    struct envd_req *e = p->envd;
    struct sbx_err err;

    e->step = 9;
    if (core_output(p, e->pid, e->out_off, &err))
        fail_sbx(p, &err);
}

static void start_event(struct pss *p)
{
    stream_msg(p, json_pack("{s:{s:{s:I}}}", "event", "start", "pid", (json_int_t)p->envd->pid));
    if (p->envd->ka_s > 0) {
        ev_timer_set(&p->envd->keepalive, p->envd->ka_s, p->envd->ka_s);
        ev_timer_start(p->srv->loop, &p->envd->keepalive);
    }
}

/* The selected process from a list ({"processes":[...]}) or one record: its object
 * (borrowed), or NULL. */
static const json_t *find_proc(struct envd_req *e, const json_t *body)
{
    const json_t *arr = json_object_get(body, "processes"), *o;
    size_t i;

    if (!arr)
        return body;
    json_array_foreach(arr, i, o)
    {
        const char *tag = json_string_value(json_object_get(o, "tag"));
        if (!json_is_true(json_object_get(o, "running")))
            continue;
        if (e->by_tag ? tag && !strcmp(tag, e->tag)
                      : (uint32_t)json_integer_value(json_object_get(o, "pid")) == e->pid)
            return o;
    }
    return NULL;
}

/* An action on one process (SendInput, SendSignal, CloseStdin, Update), its pid known. */
static void proc_action(struct pss *p)
{
    struct envd_req *e = p->envd;
    struct sbx_err err;

    e->step = 2;
    started(p, core_ctl(p, e->pid, &e->ctl, &err), &err);
}

/* Parse an action's message into e->ctl. 0, or -EINVAL (answered). */
static int ctl_of(struct pss *p, const json_t *msg)
{
    struct envd_req *e = p->envd;

    memset(&e->ctl, 0, sizeof(e->ctl));
    switch (e->m) {
    case M_SEND_INPUT: {
        const json_t *in = json_object_get(msg, "input");
        const json_t *d = json_object_get(in, "stdin");
        const char *s;
        size_t n;
        long got;
        if (!d)
            d = json_object_get(in, "pty");
        if (!json_is_string(d)) {
            fail(p, CONNECT_INVALID_ARGUMENT, "input.stdin or input.pty (base64) is required");
            return -EINVAL;
        }
        s = json_string_value(d);
        n = json_string_length(d);
        if (n > util_b64_len(UTIL_B64_STD, SBX_PROC_STDIN_MAX)) {
            fail(p, CONNECT_RESOURCE_EXHAUSTED, "at most %d bytes of input a call",
                 SBX_PROC_STDIN_MAX);
            return -EINVAL;
        }
        if (!(e->raw = malloc(n / 4 * 3 + 3))) {
            fail(p, CONNECT_INTERNAL, "out of memory");
            return -EINVAL;
        }
        got = util_b64_decode(UTIL_B64_STD, s, n, e->raw, n / 4 * 3 + 3);
        if (got < 0) {
            fail(p, CONNECT_INVALID_ARGUMENT, "input: not base64");
            return -EINVAL;
        }
        e->ctl.data = e->raw;
        e->ctl.len = (size_t)got;
        if (!got) {
            /* nothing to write: done already */
            unary_ok(p, json_object());
            return -EINVAL;
        }
        return 0;
    }
    case M_SEND_SIGNAL: {
        const json_t *s = json_object_get(msg, "signal");
        const char *n = json_string_value(s);
        if (n && !strcmp(n, "SIGNAL_SIGKILL"))
            e->ctl.sig = 9;
        else if (n && !strcmp(n, "SIGNAL_SIGTERM"))
            e->ctl.sig = 15;
        else if (n && !strncmp(n, "SIGNAL_", 7)) {
            json_t *j = json_string(n + 7);
            e->ctl.sig = api_signal_parse(j);
            json_decref(j);
        } else if (json_is_integer(s)) {
            e->ctl.sig = api_signal_parse(s);
        } else {
            e->ctl.sig = -1;
        }
        if (e->ctl.sig <= 0) {
            fail(p, CONNECT_INVALID_ARGUMENT, "signal: SIGNAL_SIGKILL, SIGNAL_SIGTERM, ...");
            return -EINVAL;
        }
        return 0;
    }
    case M_CLOSE_STDIN:
        e->ctl.eof = true;
        return 0;
    case M_UPDATE: {
        const json_t *size = json_object_get(json_object_get(msg, "pty"), "size");
        json_int_t c = json_integer_value(json_object_get(size, "cols"));
        json_int_t r = json_integer_value(json_object_get(size, "rows"));
        if (c < 1 || r < 1 || c > API_PTY_SIZE_MAX || r > API_PTY_SIZE_MAX) {
            fail(p, CONNECT_INVALID_ARGUMENT, "pty.size: cols and rows 1..%d", API_PTY_SIZE_MAX);
            return -EINVAL;
        }
        e->ctl.cols = (unsigned)c;
        e->ctl.rows = (unsigned)r;
        return 0;
    }
    default:
        return -EINVAL;
    }
}

/* ------------------------------------------------------------ the calls */

static void run_call(struct pss *p)
{
    struct envd_req *e = p->envd;
    const json_t *msg = e->msg;
    struct sbx_err err;

    switch (e->m) {
    case M_START: {
        json_t *b = exec_body(p, msg);
        int rc;
        if (!b)
            return;
        e->step = 0;
        rc = core_exec(p, b, &err);
        json_decref(b);
        started(p, rc, &err);
        return;
    }
    case M_CONNECT:
    case M_SEND_INPUT:
    case M_SEND_SIGNAL:
    case M_CLOSE_STDIN:
    case M_UPDATE:
        if (selector(p, msg))
            return;
        if (e->m != M_CONNECT && ctl_of(p, msg))
            return;
        /* A tag, and Connect's offset, are found in the process table first. */
        if (e->by_tag || e->m == M_CONNECT) {
            e->step = 1;
            started(p, core_list(p, e->by_tag ? 0 : e->pid, &err), &err);
            return;
        }
        proc_action(p);
        return;
    case M_LIST:
        e->step = 0;
        started(p, core_list(p, 0, &err), &err);
        return;
    case M_STAT:
    case M_LISTDIR:
    case M_REMOVE:
    case M_MKDIR: {
        int depth = -1;
        if (resolve_path(p, json_string_value(json_object_get(msg, "path")), e->path))
            return;
        if (e->m == M_LISTDIR) {
            json_int_t d = json_integer_value(json_object_get(msg, "depth"));
            depth = d < 1 ? 1 : d > 10 ? 10 : (int)d;
        }
        e->step = 0;
        started(p,
                core_file(p,
                          e->m == M_LISTDIR  ? "list"
                          : e->m == M_REMOVE ? "remove"
                                             : "stat",
                          e->path, depth, NULL, &err),
                &err);
        return;
    }
    case M_WATCHER_GET:
    case M_WATCHER_DEL: {
        struct envd_watcher *w = watcher_of(p, msg);
        if (!w)
            return;
        e->watch_pid = w->pid;
        e->watch_over = true; /* the watch outlives this call (RemoveWatcher stops it) */
        if (e->m == M_WATCHER_DEL) {
            watcher_drop(p->srv, w);
            e->step = 0;
            memset(&e->ctl, 0, sizeof(e->ctl));
            e->ctl.sig = 15;
            started(p, core_ctl(p, e->watch_pid, &e->ctl, &err), &err);
            return;
        }
        if (!(e->events = json_array()) ||
            watch_ev_init(&e->ev, p->srv->cfg->watch_line_max, w->off)) {
            fail(p, CONNECT_INTERNAL, "out of memory");
            return;
        }
        e->ev_init = true;
        e->events_end = w->off;
        e->step = 0;
        started(
            p,
            sbx_proc_output(p->srv->t, p->sbx, w->pid, w->off, false, &envd_sink, p, &p->op, &err),
            &err);
        return;
    }
    case M_WATCH:
    case M_WATCHER_NEW:
        if (resolve_path(p, json_string_value(json_object_get(msg, "path")), e->path))
            return;
        /* count the watches running first: they are capped per sandbox */
        e->step = 0;
        started(p, core_list(p, 0, &err), &err);
        return;
    case M_MOVE:
        if (resolve_path(p, json_string_value(json_object_get(msg, "source")), e->path) ||
            resolve_path(p, json_string_value(json_object_get(msg, "destination")), e->path2))
            return;
        e->step = 0;
        started(p, core_file(p, "rename", e->path, -1, e->path2, &err), &err);
        return;
    case M_FILES_GET:
        e->step = 0;
        started(p, core_read(p, e->path, &err), &err);
        return;
    case M_FILES_POST:
        e->step = 0;
        if (core_write(p, e->path, &err)) {
            fail_sbx(p, &err);
            return;
        }
        rest_upload_started(p, e->empty);
        return;
    case M_UNIMPLEMENTED:
    case M_CODE: /* e2b_code.c's, never here */
        fail(p, CONNECT_UNIMPLEMENTED, "not served by this server yet");
        return;
    }
}

/* The call's answer: the entry of a stat's body (taken). */
static void answer_entry(struct pss *p, json_t *body)
{
    unary_ok(p, json_pack("{s:o}", "entry", entry_of(body)));
    json_decref(body);
}

/* This step's body is not needed (taken): stat path as the next step, for the entry of
 * the answer. */
static void then_stat(struct pss *p, json_t *body, int step, const char *path)
{
    struct sbx_err err;

    json_decref(body);
    p->envd->step = step;
    if (core_file(p, "stat", path, -1, NULL, &err))
        fail_sbx(p, &err);
}

/* An operation of the call is done (err, or its body). */
static void step_done(struct pss *p, const struct sbx_err *err, json_t *body)
{
    struct envd_req *e = p->envd;
    struct sbx_err e2;

    switch (e->m) {
    case M_START:
        if (err && e->step == 1) {
            /* stdin could not be closed: the process is gone already, or closed it */
            err = NULL;
        }
        if (err)
            break;
        if (e->step == 0) {
            e->pid = (uint32_t)json_integer_value(json_object_get(body, "pid"));
            start_event(p);
            e->out_off = 0;
            if (e->close_stdin) {
                e->step = 1;
                memset(&e->ctl, 0, sizeof(e->ctl));
                e->ctl.eof = true;
                if (core_ctl(p, e->pid, &e->ctl, &e2))
                    fail_sbx(p, &e2);
            } else {
                follow(p);
            }
        } else if (e->step == 1) {
            follow(p);
        } else {
            goto ended;
        }
        json_decref(body);
        return;
    case M_CONNECT:
        if (err)
            break;
        if (e->step == 1) {
            const json_t *o = find_proc(e, body);
            if (!o) {
                json_decref(body);
                fail(p, CONNECT_NOT_FOUND, "no running process with that %s",
                     e->by_tag ? "tag" : "pid");
                return;
            }
            e->pid = (uint32_t)json_integer_value(json_object_get(o, "pid"));
            e->pty = json_is_true(json_object_get(o, "pty"));
            /* E2B's Connect sends output from now on, never replays it */
            e->out_off = (uint64_t)json_integer_value(json_object_get(o, "output_end"));
            json_decref(body);
            start_event(p);
            follow(p);
            return;
        }
        goto ended;
    case M_SEND_INPUT:
    case M_SEND_SIGNAL:
    case M_CLOSE_STDIN:
    case M_UPDATE:
        if (err)
            break;
        if (e->step == 1) {
            const json_t *o = find_proc(e, body);
            if (!o) {
                json_decref(body);
                fail(p, CONNECT_NOT_FOUND, "no running process with that %s",
                     e->by_tag ? "tag" : "pid");
                return;
            }
            e->pid = (uint32_t)json_integer_value(json_object_get(o, "pid"));
            json_decref(body);
            proc_action(p);
            return;
        }
        json_decref(body);
        unary_ok(p, json_object());
        return;
    case M_LIST: {
        json_t *out;
        const json_t *o;
        size_t i;
        if (err)
            break;
        out = json_array();
        /* Only what runs: E2B lists live processes; exited ones stay reachable by pid. */
        json_array_foreach(json_object_get(body, "processes"), i, o)
        {
            json_t *pi;
            if (!json_is_true(json_object_get(o, "running")) || watch_proc_is((json_t *)o))
                continue; /* a WatchDir's watch is not a command */
            pi = json_pack("{s:{s:O, s:[], s:{}}, s:O}", "config", "cmd", json_object_get(o, "cmd"),
                           "args", "envs", "pid", json_object_get(o, "pid"));
            if (pi && json_is_string(json_object_get(o, "tag")))
                json_object_set(pi, "tag", json_object_get(o, "tag"));
            if (pi)
                json_array_append_new(out, pi);
        }
        json_decref(body);
        unary_ok(p, json_pack("{s:o}", "processes", out));
        return;
    }
    case M_STAT:
        if (err)
            break;
        answer_entry(p, body);
        return;
    case M_LISTDIR: {
        json_t *out;
        const json_t *o;
        size_t i;
        if (err)
            break;
        out = json_array();
        json_array_foreach(json_object_get(body, "entries"), i, o)
            json_array_append_new(out, entry_of(o));
        json_decref(body);
        unary_ok(p, json_pack("{s:o}", "entries", out));
        return;
    }
    case M_REMOVE:
        if (err)
            break;
        json_decref(body);
        unary_ok(p, json_object());
        return;
    case M_MKDIR:
        /* stat: it must not exist; mkdir; stat again for its entry */
        if (e->step == 0) {
            if (!err) {
                json_decref(body);
                fail(p, CONNECT_ALREADY_EXISTS, "%s already exists", e->path);
                return;
            }
            if (err->code != SBX_E_FILE_NOT_FOUND)
                break;
            e->step = 1;
            if (core_file(p, "mkdir", e->path, -1, NULL, &e2))
                fail_sbx(p, &e2);
            return;
        }
        if (err)
            break;
        if (e->step == 1) {
            then_stat(p, body, 2, e->path);
            return;
        }
        answer_entry(p, body);
        return;
    case M_MOVE:
        if (err)
            break;
        if (e->step == 0) {
            then_stat(p, body, 1, e->path2);
            return;
        }
        answer_entry(p, body);
        return;
    case M_WATCHER_GET:
        if (err && (err->code == SBX_E_PROCESS_NOT_FOUND || err->code == SBX_E_BAD_OFFSET)) {
            /* the watch is gone (its process, or its output) */
            struct envd_watcher *w = watcher_find(p->srv, p->sbx, e->watch_pid);
            if (w)
                watcher_drop(p->srv, w);
            json_decref(body);
            fail(p, CONNECT_NOT_FOUND, "watcher %" PRIu32 " has ended", e->watch_pid);
            return;
        }
        if (err)
            break;
        {
            struct envd_watcher *w = watcher_find(p->srv, p->sbx, e->watch_pid);
            bool ended = json_is_string(json_object_get(body, "type")) &&
                         !strcmp(json_string_value(json_object_get(body, "type")), "exit");
            if (w && ended) {
                watcher_drop(p->srv, w); /* this answer has its last events */
            } else if (w && w->off != e->events_end) {
                w->off = e->events_end;
                watcher_save(p->srv, w); /* before the answer gives the events */
            }
        }
        json_decref(body);
        unary_ok(p, json_pack("{s:O}", "events", e->events));
        return;
    case M_WATCHER_DEL:
        /* the watcher is forgotten already; its process may have ended by itself */
        if (err && err->code != SBX_E_PROCESS_NOT_FOUND)
            break;
        json_decref(body);
        unary_ok(p, json_object());
        return;
    case M_WATCH:
    case M_WATCHER_NEW:
        if (err)
            break;
        if (e->step == 0) {
            json_t *b;
            int rc;
            if (watch_running(body) >= p->srv->cfg->watch_max_per_sbx) {
                json_decref(body);
                fail(p, CONNECT_RESOURCE_EXHAUSTED, "%u file watches run in this sandbox already",
                     p->srv->cfg->watch_max_per_sbx);
                return;
            }
            json_decref(body);
            b = watch_exec_body(p->srv->cfg, e->path,
                                json_is_true(json_object_get(e->msg, "recursive")));
            if (!b) {
                fail(p, CONNECT_INTERNAL, "out of memory");
                return;
            }
            e->step = 1;
            rc = core_exec(p, b, &e2);
            json_decref(b);
            if (rc)
                fail_sbx(p, &e2);
            return;
        }
        if (e->step == 1) {
            e->watch_pid = (uint32_t)json_integer_value(json_object_get(body, "pid"));
            json_decref(body);
            if (watch_ev_init(&e->ev, p->srv->cfg->watch_line_max, 0)) {
                fail(p, CONNECT_INTERNAL, "out of memory");
                return;
            }
            e->ev_init = true;
            e->step = 9;
            if (core_output(p, e->watch_pid, 0, &e2))
                fail_sbx(p, &e2);
            return;
        }
        /* the watch's process ended: so does the stream */
        json_decref(body);
        e->watch_over = true;
        if (e->m == M_WATCHER_NEW)
            fail(p, CONNECT_INTERNAL, "the watch ended before it started");
        else if (!e->watch_ready)
            fail(p, CONNECT_INTERNAL, "the watch ended before it started");
        else
            stream_end(p, CONNECT_OK, NULL);
        return;
    case M_FILES_GET:
        goto download_end;
    case M_FILES_POST: {
        const char *slash;
        if (err)
            break;
        json_decref(body);
        slash = strrchr(e->path, '/');
        to_answer(p);
        resp_json(p, 200,
                  json_pack("[{s:s, s:s, s:s}]", "name", slash ? slash + 1 : e->path, "type",
                            "file", "path", e->path));
        return;
    }
    case M_UNIMPLEMENTED:
    case M_CODE:
        break;
    }
    json_decref(body);
    if (err)
        fail_sbx(p, err);
    else
        fail(p, CONNECT_INTERNAL, "unexpected answer");
    return;

ended:
    /* The output stream's end: the exit record, or its error. */
    if (err) {
        json_decref(body);
        fail_sbx(p, err);
        return;
    }
    if (json_is_string(json_object_get(body, "type")) &&
        !strcmp(json_string_value(json_object_get(body, "type")), "exit")) {
        char st[64];
        exit_status(body, st, sizeof(st));
        stream_msg(p, json_pack("{s:{s:{s:I, s:b, s:s}}}", "event", "end", "exitCode",
                                json_integer_value(json_object_get(body, "exit_code")), "exited", 1,
                                "status", st));
    }
    json_decref(body);
    stream_end(p, CONNECT_OK, NULL);
    return;

download_end:
    if (err && (p->kind == RESP_NONE)) {
        json_decref(body);
        fail_sbx(p, err);
        return;
    }
    json_decref(body);
    to_answer(p);
    if (p->kind != RESP_DOWNLOAD) {
        resp_json(p, 500,
                  json_pack("{s:i, s:s}", "code", 500, "message",
                            "the download ended before it started"));
        return;
    }
    if (err || p->dl_queued != p->clen) {
        LOG(LOG_WARN, "%s: envd download ended after %" PRIu64 " of %" PRIu64 " bytes", p->sbx,
            p->dl_queued, p->clen);
        p->close_after = true;
    }
    req_complete(p);
    resp_want_write(p);
}

/* ------------------------------------------------------------ file watches */

/* E2B's name for one of the watch's event types, or NULL for a line it has none for
 * (ready, lost, unwatched). */
static const char *event_type(const char *t)
{
    static const char *const map[][2] = {
        {"create", "EVENT_TYPE_CREATE"}, {"write", "EVENT_TYPE_WRITE"},
        {"remove", "EVENT_TYPE_REMOVE"}, {"rename", "EVENT_TYPE_RENAME"},
        {"chmod", "EVENT_TYPE_CHMOD"},
    };

    for (size_t i = 0; t && i < sizeof(map) / sizeof(map[0]); i++)
        if (!strcmp(t, map[i][0]))
            return map[i][1];
    return NULL;
}

static void fs_event(struct pss *p, const char *name, const char *type)
{
    if (p->envd->m == M_WATCHER_GET)
        json_array_append_new(p->envd->events, json_pack("{s:s, s:s}", "name", name, "type", type));
    else
        stream_msg(p, json_pack("{s:{s:s, s:s}}", "filesystem", "name", name, "type", type));
}

/* ------------------------------------------------------------ polling watchers */

static struct envd_watcher *watcher_find(struct http_server *srv, const char *sbx, uint32_t pid)
{
    for (struct envd_watcher *w = srv->watchers; w; w = w->next)
        if (w->pid == pid && !strcmp(w->sbx, sbx))
            return w;
    return NULL;
}

static void watcher_drop(struct http_server *srv, struct envd_watcher *w)
{
    envd_wstore_del(srv->cfg->state_dir, w->sbx, w->pid);
    for (struct envd_watcher **pp = &srv->watchers; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            free(w);
            return;
        }
}

/* Its offset on disk, before an answer moves past it. A failure is logged: the watcher
 * goes on from memory, and only a restart would give its events again. */
static void watcher_save(struct http_server *srv, const struct envd_watcher *w)
{
    int r = envd_wstore_save(srv->cfg->state_dir, w->sbx, w->pid, w->off);

    if (r)
        LOG(LOG_WARN, "%s: polling watcher %" PRIu32 ": its offset is not saved: %s", w->sbx,
            w->pid, strerror(-r));
}

/* A watcher a previous warrend made (its record on disk), back in memory; NULL if none. */
static struct envd_watcher *watcher_load(struct http_server *srv, const char *sbx, uint32_t pid)
{
    struct envd_watcher *w;
    uint64_t off;
    int r = envd_wstore_load(srv->cfg->state_dir, sbx, pid, &off);

    if (r) {
        if (r != -ENOENT)
            LOG(LOG_WARN, "%s: polling watcher %" PRIu32 ": its record is unreadable", sbx, pid);
        return NULL;
    }
    if (!(w = calloc(1, sizeof(*w))))
        return NULL;
    snprintf(w->sbx, sizeof(w->sbx), "%s", sbx);
    w->pid = pid;
    w->off = off;
    w->next = srv->watchers;
    srv->watchers = w;
    return w;
}

static bool sbx_live(void *ud, const char *sbx)
{
    struct http_server *srv = ud;
    struct sbx_rec rec;
    struct sbx_err err;

    return !sbx_get(srv->t, sbx, &rec, &err);
}

void envd_watchers_free(struct http_server *srv)
{
    while (srv->watchers) {
        struct envd_watcher *w = srv->watchers;
        srv->watchers = w->next;
        free(w);
    }
}

/* The watcher msg names ({"watcherId": "<pid>"}) in this sandbox, or answered (NULL). */
static struct envd_watcher *watcher_of(struct pss *p, const json_t *msg)
{
    const char *id = json_string_value(json_object_get(msg, "watcherId"));
    struct envd_watcher *w = NULL;
    char *end;
    unsigned long v;

    if (!id || !*id || strlen(id) > 10 || *id < '1' || *id > '9') {
        fail(p, CONNECT_INVALID_ARGUMENT, "watcherId must be the id CreateWatcher gave");
        return NULL;
    }
    v = strtoul(id, &end, 10);
    if (!*end && v <= UINT32_MAX && !(w = watcher_find(p->srv, p->sbx, (uint32_t)v)))
        w = watcher_load(p->srv, p->sbx, (uint32_t)v); /* made before a restart */
    if (!w)
        fail(p, CONNECT_NOT_FOUND, "no watcher %s in this sandbox", id);
    return w;
}

/* The watch of a CreateWatcher is ready: it runs on after this call, its events read
 * from off by GetWatcherEvents. Watchers of sandboxes that ended are dropped first. */
static int watcher_add(struct pss *p, uint64_t off)
{
    struct envd_watcher **pp = &p->srv->watchers, *w;
    struct sbx_rec rec;
    struct sbx_err err;

    while ((w = *pp)) {
        if (strcmp(w->sbx, p->sbx) && sbx_get(p->srv->t, w->sbx, &rec, &err)) {
            *pp = w->next;
            free(w);
        } else {
            pp = &w->next;
        }
    }
    /* and the records on disk of ended sandboxes, those no call read back included */
    envd_wstore_sweep(p->srv->cfg->state_dir, sbx_live, p->srv);
    if (!(w = calloc(1, sizeof(*w))))
        return -1;
    snprintf(w->sbx, sizeof(w->sbx), "%s", p->sbx);
    w->pid = p->envd->watch_pid;
    w->off = off;
    w->next = p->srv->watchers;
    p->srv->watchers = w;
    watcher_save(p->srv, w);
    return 0;
}

/* One checked line of the watch (watch_ev.h): E2B's frames. */
static int watch_event(void *user, json_t *ev)
{
    struct pss *p = user;
    struct envd_req *e = p->envd;
    const char *type = json_string_value(json_object_get(ev, "type"));
    const char *name = json_string_value(json_object_get(ev, "name"));
    const char *et = event_type(type);

    if (!type || !http_phase_op_live(p->phase))
        return 1;
    if (e->m == M_WATCHER_GET) {
        /* stored on, in the answer, up to the end of the last line taken */
        json_int_t end = json_integer_value(json_object_get(ev, "offset"));
        if (end > 0 && (uint64_t)end > e->events_end)
            e->events_end = (uint64_t)end;
    } else if (e->m == M_WATCHER_NEW && !strcmp(type, "ready")) {
        json_int_t end = json_integer_value(json_object_get(ev, "offset"));
        char id[16];
        sbx_op_cancel(p->srv->t, p->op);
        if (watcher_add(p, end > 0 ? (uint64_t)end : 0)) {
            fail(p, CONNECT_INTERNAL, "out of memory");
            return 1;
        }
        e->watch_over = true; /* it outlives this call */
        snprintf(id, sizeof(id), "%" PRIu32, e->watch_pid);
        unary_ok(p, json_pack("{s:s}", "watcherId", id));
        return 1;
    }
    if (e->m != M_WATCHER_GET && !e->watch_ready) {
        if (!strcmp(type, "error")) {
            const char *code = json_string_value(json_object_get(ev, "code"));
            const char *msg = json_string_value(json_object_get(ev, "message"));
            sbx_op_cancel(p->srv->t, p->op);
            fail(p,
                 code && !strcmp(code, "not_found")         ? CONNECT_NOT_FOUND
                 : code && !strcmp(code, "not_a_directory") ? CONNECT_INVALID_ARGUMENT
                 : code && !strcmp(code, "internal")        ? CONNECT_INTERNAL
                                                            : CONNECT_INVALID_ARGUMENT,
                 "%s", msg ? msg : "the path cannot be watched");
            return 1;
        }
        if (strcmp(type, "ready"))
            return 0;
        /* E2B's SDKs wait for this first frame before they call the watch started */
        e->watch_ready = true;
        stream_msg(p, json_pack("{s:{}}", "start"));
        if (e->ka_s > 0) {
            ev_timer_set(&e->keepalive, e->ka_s, e->ka_s);
            ev_timer_start(p->srv->loop, &e->keepalive);
        }
        return 0;
    }
    if (!et || !name)
        return 0;
    if (!strcmp(type, "rename")) {
        /* E2B says a move within the tree as the old name renamed, the new one created */
        const char *from = json_string_value(json_object_get(ev, "from"));
        if (from)
            fs_event(p, from, et);
        fs_event(p, name, "EVENT_TYPE_CREATE");
        return 0;
    }
    fs_event(p, name, et);
    return 0;
}

static void watch_noop_done_json(void *user, const struct sbx_err *err, json_t *body)
{
    (void)user;
    (void)err;
    json_decref(body);
}
SBX_JSON_DONE(watch_noop_done, watch_noop_done_json)

static const struct sbx_sink watch_end_sink = {.done = watch_noop_done};

/* A WatchDir stream is over: so is its watch (E2B's watch lives as long as its stream).
 * Fire and forget: nothing waits for the answer. */
static void watch_stop(struct pss *p)
{
    struct envd_req *e = p->envd;
    struct sbx_proc_ctl c = {.sig = 15};
    struct sbx_err err;
    sbx_op_t op;

    if (!e->watch_pid || e->watch_over)
        return;
    e->watch_over = true;
    if (sbx_proc_ctl(p->srv->t, p->sbx, e->watch_pid, &c, &watch_end_sink, NULL, &op, &err))
        LOG(LOG_DEBUG, "%s: the watch %u of an ended WatchDir: %s", p->sbx, e->watch_pid, err.msg);
}

/* A refused upload opened its file: remove it. Fire and forget, sent after the write's
 * abort on the same channel, so the guest ends the write first; the client's next call
 * comes after it too. */
void envd_upload_discard(struct pss *p)
{
    struct sbx_file_req f = {
        .kind = SBX_FILE_REMOVE, .path = p->envd ? p->envd->path : "", .depth = SBX_UNSET};
    struct sbx_err err;
    sbx_op_t op;

    if (!p->envd || p->envd->m != M_FILES_POST || !p->envd->path[0])
        return;
    if (sbx_file_op(p->srv->t, p->sbx, &f, &watch_end_sink, NULL, &op, &err))
        LOG(LOG_WARN, "%s: the partial upload %s is left: %s", p->sbx, f.path, err.msg);
}

/* ------------------------------------------------------------ the sink */

static void e_done_json(void *user, const struct sbx_err *err, json_t *body)
{
    struct pss *p = user;

    if (!p->envd || !http_phase_op_live(p->phase)) {
        json_decref(body);
        return;
    }
    step_done(p, err, body);
    /* an upload answered early leaves its pending bytes unused */
    if (!http_phase_op_live(p->phase)) {
        free(p->pend);
        p->pend = NULL;
        p->pend_len = p->pend_off = p->pend_cap = 0;
    }
    resp_want_write(p);
}
SBX_JSON_DONE(e_done, e_done_json)

static void e_head(void *user, uint64_t size)
{
    struct pss *p = user;

    if (!p->envd || p->envd->m != M_FILES_GET || !http_phase_op_live(p->phase) ||
        p->kind != RESP_NONE)
        return;
    resp_download_begin(p, size);
}

static void e_data(void *user, int fd, uint64_t off, const void *ptr, size_t n)
{
    struct pss *p = user;
    struct envd_req *e = p->envd;
    struct obuf *ob;

    if (!e || !http_phase_op_live(p->phase) || !n)
        return;
    if (e->m == M_FILES_GET) {
        size_t take = n;
        if (p->kind != RESP_DOWNLOAD)
            return;
        if (p->dl_queued + take > p->clen) {
            take = (size_t)(p->clen - p->dl_queued);
            p->close_after = true;
        }
        if (take) {
            if (!(ob = resp_q_room(p, take)))
                goto oom;
            memcpy(OB_PAYLOAD(ob) + ob->len, ptr, take);
            resp_q_grew(p, ob, take, n);
            p->dl_queued += take;
        }
    } else if (e->m == M_WATCHER_NEW || e->m == M_WATCHER_GET) {
        if (!e->ev_init)
            return;
        watch_ev_feed(&e->ev, off, ptr, n, watch_event, p);
        if (http_phase_op_live(p->phase))
            sbx_op_consumed(p->srv->t, p->op, n);
        return;
    } else if (e->m == M_WATCH) {
        if (!e->ev_init)
            return;
        /* the bytes are consumed here: their credit rides on what they became */
        watch_ev_feed(&e->ev, off, ptr, n, watch_event, p);
        if (!http_phase_op_live(p->phase))
            return; /* the watch failed, answered */
        if (resp_ndjson_append(p, NULL, 0, n))
            goto oom;
    } else if (e->stream && (fd == 1 || fd == 2)) {
        static const char pre[] = "{\"event\":{\"data\":{\"";
        const char *key = e->pty ? "pty" : fd == 2 ? "stderr" : "stdout";
        size_t b64 = util_b64_len(UTIL_B64_STD, n);
        size_t js = sizeof(pre) - 1 + strlen(key) + 3 + b64 + 4, w;
        unsigned char *q;
        stream_begin(p);
        if (!(ob = resp_q_room(p, CONNECT_HDR + js)))
            goto oom;
        q = OB_PAYLOAD(ob) + ob->len;
        connect_env_head(q, 0, (uint32_t)js);
        w = CONNECT_HDR;
        memcpy(q + w, pre, sizeof(pre) - 1);
        w += sizeof(pre) - 1;
        memcpy(q + w, key, strlen(key));
        w += strlen(key);
        memcpy(q + w, "\":\"", 3);
        w += 3;
        w += util_b64_encode(UTIL_B64_STD, ptr, n, (char *)q + w);
        memcpy(q + w, "\"}}}", 4);
        w += 4;
        resp_q_grew(p, ob, w, n);
    } else {
        return;
    }
    resp_stall_arm(p, false);
    resp_want_write(p);
    return;
oom:
    LOG(LOG_ERR, "%s: out of memory queueing envd output: closing the request", p->sbx);
    p->close_after = true;
    to_answer(p);
    timers_stop(p);
    req_complete(p);
    sbx_op_cancel(p->srv->t, p->op);
    resp_want_write(p);
}

/* Bytes a slow reader lost in the ring: E2B's stream has no word for it; the output
 * goes on from where the ring still has it. */
static void e_lost(void *user, uint64_t off, uint64_t n)
{
    struct pss *p = user;

    if (p->envd && p->envd->ev_init)
        watch_ev_gap(&p->envd->ev, off + n);
    if (p->envd && n)
        LOG(LOG_DEBUG, "%s: envd stream of pid %u lost %" PRIu64 " bytes at %" PRIu64, p->sbx,
            p->envd->pid, n, off);
}

static const struct sbx_sink envd_sink = {
    .done = e_done,
    .head = e_head,
    .data = e_data,
    .writable = rest_upload_writable,
    .lost = e_lost,
};

/* ------------------------------------------------------------ timers */

/* The stream's deadline: it ends with deadline_exceeded; its process runs on. */
static void on_deadline(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct envd_req *e = (struct envd_req *)((char *)w - offsetof(struct envd_req, deadline));
    struct pss *p = e->p;

    (void)loop;
    (void)revents;
    if (http_phase_complete(p->phase))
        return;
    if (http_phase_op_live(p->phase)) {
        req_phase(p, HP_ANSWER);
        sbx_op_cancel(p->srv->t, p->op);
    }
    stream_end(p, CONNECT_DEADLINE_EXCEEDED,
               "the stream's deadline passed (Connect-Timeout-Ms); the process keeps running: "
               "reattach with process.Connect");
}

static void on_keepalive(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct envd_req *e = (struct envd_req *)((char *)w - offsetof(struct envd_req, keepalive));
    struct pss *p = e->p;

    (void)loop;
    (void)revents;
    /* only while nothing waits: a client that reads nothing gets nothing more */
    if (!e->begun || http_phase_complete(p->phase) || p->qh)
        return;
    stream_msg(p, json_pack("{s:{s:{}}}", "event", "keepalive"));
}

/* ------------------------------------------------------------ the head */

/* A custom header's value into buf: its length, 0 when absent, -1 when too long. */
static int custom(struct lws *wsi, const char *name, char *buf, int cap)
{
    int n = lws_hdr_custom_length(wsi, name, (int)strlen(name));

    buf[0] = '\0';
    if (n <= 0)
        return 0;
    if (n >= cap || lws_hdr_custom_copy(wsi, buf, cap, name, (int)strlen(name)) < 0)
        return -1;
    return n;
}

/* The user a call runs as: "Authorization: Basic base64(user:)" as the SDK sends it when
 * given one; root otherwise (Warren's default). 0, or -EINVAL for a malformed one. */
static int user_of(struct pss *p)
{
    char a[256], dec[192], *colon;
    long n;

    snprintf(p->envd->user, sizeof(p->envd->user), "root");
    if (http_hdr(p->wsi, WSI_TOKEN_HTTP_AUTHORIZATION, a, sizeof(a)) <= 0)
        return 0;
    if (strncasecmp(a, "Basic ", 6))
        return 0;
    n = util_b64_decode(UTIL_B64_STD, a + 6, strlen(a + 6), (unsigned char *)dec, sizeof(dec) - 1);
    if (n < 0)
        return -EINVAL;
    dec[n] = '\0';
    if ((colon = strchr(dec, ':')))
        *colon = '\0';
    if (!dec[0])
        return 0;
    if (strlen(dec) >= sizeof(p->envd->user))
        return -EINVAL;
    memcpy(p->envd->user, dec, strlen(dec) + 1);
    return 0;
}

/* The /files query: path (required) and username. 0, or -EINVAL (answered). */
static int files_query(struct pss *p)
{
    char frag[QUERY_STORE], path[API_PATH_MAX + 1] = "";
    bool have = false;

    for (int i = 0; i < QUERY_FRAGS_MAX; i++) {
        int len =
            lws_hdr_copy_fragment(p->wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i);
        if (len < 0)
            break;
        if (!strncmp(frag, "path=", 5)) {
            if (strlen(frag + 5) > API_PATH_MAX) {
                fail(p, CONNECT_INVALID_ARGUMENT, "path too long");
                return -EINVAL;
            }
            snprintf(path, sizeof(path), "%s", frag + 5);
            have = true;
        } else if (!strncmp(frag, "username=", 9) && frag[9]) {
            if (strlen(frag + 9) >= sizeof(p->envd->user)) {
                fail(p, CONNECT_INVALID_ARGUMENT, "username too long");
                return -EINVAL;
            }
            snprintf(p->envd->user, sizeof(p->envd->user), "%s", frag + 9);
        }
    }
    if (!have) {
        fail(p, CONNECT_INVALID_ARGUMENT, "the path query parameter is required");
        return -EINVAL;
    }
    return resolve_path(p, path, p->envd->path);
}

/* Which sandbox and port: from E2b-Sandbox-Id/-Port, else from a Host of port_domain.
 * 1 found (sbx, *port), 0 not the door's, -1 answered. */
static int target(struct pss *p, const char *uri, char sbx[API_ID_MAX + 1], unsigned *port)
{
    char id[API_ID_MAX + 2], pt[16];
    int n = custom(p->wsi, "e2b-sandbox-id:", id, sizeof(id));

    if (n < 0) {
        p->close_after = true;
        resp_code(p, 400, "bad_request", "E2b-Sandbox-Id is longer than a sandbox id");
        return -1;
    }
    if (n > 0) {
        char *end;
        unsigned long v;
        memcpy(sbx, id, (size_t)n + 1);
        n = custom(p->wsi, "e2b-sandbox-port:", pt, sizeof(pt));
        if (n == 0) {
            *port = ENVD_PORT;
            return 1;
        }
        v = n > 0 ? strtoul(pt, &end, 10) : 0;
        if (n < 0 || *end || (v != ENVD_PORT && v != ENVD_CI_PORT)) {
            resp_code(p, 400, "bad_request",
                      "E2b-Sandbox-Port must be 49983 (envd) or 49999 (code interpreter); other "
                      "ports are reached through /v1/sandboxes/{id}/ports/{port}/ or by Host");
            return -1;
        }
        *port = (unsigned)v;
        return 1;
    }
    {
        struct ports_head h;
        struct ports_dest d;
        char host[256];
        const char *dom = p->srv->cfg->port_domain;

        if (!dom || !*dom || http_hdr(p->wsi, WSI_TOKEN_HOST, host, sizeof(host)) <= 0)
            return 0;
        memset(&h, 0, sizeof(h));
        h.target = (struct ports_span){uri, strlen(uri)};
        h.host = (struct ports_span){host, strlen(host)};
        if (ports_route(&h, dom, &d) != PORTS_HOST ||
            (d.port != ENVD_PORT && d.port != ENVD_CI_PORT))
            return 0;
        memcpy(sbx, d.sbx, sizeof(d.sbx));
        *port = d.port;
        return 1;
    }
}

/* The sandbox's own token, and the sandbox alive. 0, or -1 answered. */
static int admit(struct pss *p, const char *sbx, unsigned port)
{
    const char *purpose = port == ENVD_PORT ? "envd" : "traffic";
    const char *hname = port == ENVD_PORT ? "x-access-token:" : "e2b-traffic-access-token:";
    char got[TOKEN_E2B_LEN + 2];
    struct api_err ae;
    int n;

    if (!p->srv->token_key_set) {
        resp_code(p, 503, "not_ready", "the server's token secret is not loaded yet");
        return -1;
    }
    n = custom(p->wsi, hname, got, sizeof(got));
    if (!token_e2b_check(p->srv->token_key, purpose, sbx, got, n > 0 ? (size_t)n : 0)) {
        resp_json(p, 401,
                  json_pack("{s:s, s:s}", "code", "unauthenticated", "message",
                            port == ENVD_PORT
                                ? "X-Access-Token must be this sandbox's envdAccessToken"
                                : "E2B-Traffic-Access-Token must be this sandbox's "
                                  "trafficAccessToken"));
        return -1;
    }
    if (http_ws_sandbox_open(p->srv, sbx, &ae)) {
        resp_json(p, ae.status == 404 ? 404 : 502,
                  json_pack("{s:s, s:s}", "code", ae.status == 404 ? "not_found" : "unavailable",
                            "message", ae.msg));
        return -1;
    }
    return 0;
}

int envd_request(struct pss *p, const char *uri, int has_cl, uint64_t cl)
{
    char sbx[API_ID_MAX + 1], ct[256], v[32];
    struct envd_req *e;
    unsigned port = 0;
    size_t i;
    int r = target(p, uri, sbx, &port);

    if (r <= 0)
        return r < 0;
    if (admit(p, sbx, port))
        return 1;
    memcpy(p->sbx, sbx, sizeof(p->sbx));
    if (!(e = calloc(1, sizeof(*e)))) {
        resp_code(p, 500, "internal", "out of memory");
        return 1;
    }
    e->p = p;
    ev_init(&e->deadline, on_deadline);
    ev_init(&e->keepalive, on_keepalive);
    p->envd = e;
    if (port == ENVD_CI_PORT) {
        /* The code interpreter: its own routes, over the kernel bridge. */
        e->m = M_CODE;
        /* the route is stored first: a request without a body runs at once */
        e2b_code_request(p, uri, has_cl, cl, &e->code_route);
        return 1;
    }
    if (user_of(p)) {
        e->m = M_FILES_GET; /* answered as HTTP */
        fail(p, CONNECT_INVALID_ARGUMENT, "malformed Authorization: Basic header");
        return 1;
    }

    if (!strcmp(uri, "/health")) {
        if (p->method != API_GET) {
            resp_code(p, 405, "method_not_allowed", "GET /health");
            return 1;
        }
        resp_json(p, 204, NULL);
        return 1;
    }
    if (!strcmp(uri, "/files")) {
        e->m = p->method == API_POST ? M_FILES_POST : M_FILES_GET;
        if (p->method != API_GET && p->method != API_POST) {
            resp_code(p, 405, "method_not_allowed", "GET or POST /files");
            return 1;
        }
        if (files_query(p))
            return 1;
        e->msg = json_pack("{s:s}", "path", e->path);
        if (e->m == M_FILES_POST) {
            r = http_hdr(p->wsi, WSI_TOKEN_HTTP_CONTENT_ENCODING, v, sizeof(v));
            if (r != 0 && (r < 0 || (strcasecmp(v, "identity") && strcasecmp(v, "gzip")))) {
                p->close_after = true;
                resp_json(p, 415,
                          json_pack("{s:i, s:s}", "code", 415, "message",
                                    "Content-Encoding must be gzip or identity (one coding)"));
                return 1;
            }
            if (r > 0 && !strcasecmp(v, "gzip")) {
                if (has_cl && cl == 0) {
                    fail(p, CONNECT_INVALID_ARGUMENT, "an empty body is not a gzip stream");
                    return 1;
                }
                if (envd_gz_new(p)) {
                    fail(p, CONNECT_INTERNAL, "out of memory");
                    return 1;
                }
            }
            if (http_hdr(p->wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, ct, sizeof(ct)) > 0 &&
                !strncasecmp(ct, "multipart/", 10)) {
                if (!(p->mp = malloc(sizeof(*p->mp)))) {
                    fail(p, CONNECT_INTERNAL, "out of memory");
                    return 1;
                }
                if (mpart_init(p->mp, ct)) {
                    fail(p, CONNECT_INVALID_ARGUMENT,
                         "Content-Type: multipart/form-data needs a valid boundary");
                    return 1;
                }
            }
            if (!has_cl && !p->te_chunked) {
                fail(p, CONNECT_INVALID_ARGUMENT,
                     "an upload needs a Content-Length or Transfer-Encoding: chunked");
                return 1;
            }
            if (has_cl && cl == 0 && p->mp) {
                fail(p, CONNECT_INVALID_ARGUMENT, "a multipart upload without a body");
                return 1;
            }
            e->empty = has_cl && cl == 0;
            p->upload = true;
        }
        if (!e->msg) {
            fail(p, CONNECT_INTERNAL, "out of memory");
            return 1;
        }
        envd_run(p, e->msg);
        return 1;
    }

    for (i = 0; i < sizeof(rpcs) / sizeof(rpcs[0]); i++)
        if (!strcmp(uri, rpcs[i].path))
            break;
    if (i == sizeof(rpcs) / sizeof(rpcs[0])) {
        e->m = M_UNIMPLEMENTED;
        fail(p, CONNECT_NOT_FOUND, "no such envd route");
        return 1;
    }
    e->m = rpcs[i].m;
    if (p->method != API_POST) {
        p->close_after = true;
        resp_code(p, 405, "method_not_allowed", "Connect calls are POSTs");
        return 1;
    }
    /* the stream framing must be what the call is (a unary call with connect+json, or
     * a stream with plain JSON, would be read wrong) */
    if (http_hdr(p->wsi, WSI_TOKEN_HTTP_CONTENT_TYPE, ct, sizeof(ct)) <= 0 ||
        strncasecmp(ct, rpcs[i].stream ? ENVD_CTYPE : "application/json",
                    strlen(rpcs[i].stream ? ENVD_CTYPE : "application/json"))) {
        p->close_after = true;
        resp_json(p, 415,
                  json_pack("{s:s, s:s}", "code", "invalid_argument", "message",
                            rpcs[i].stream ? "Content-Type must be application/connect+json"
                                           : "Content-Type must be application/json"));
        return 1;
    }
    e->stream = rpcs[i].stream;
    if (e->stream) {
        uint64_t ms = p->srv->cfg->e2b_stream_timeout_ms;
        r = custom(p->wsi, "connect-timeout-ms:", v, sizeof(v));
        if (r < 0 || (r > 0 && connect_timeout_parse(v, (size_t)r, &ms))) {
            fail(p, CONNECT_INVALID_ARGUMENT, "Connect-Timeout-Ms: 1 to 10 digits");
            return 1;
        }
        e->deadline_s = (double)ms / 1000.0;
        r = custom(p->wsi, "keepalive-ping-interval:", v, sizeof(v));
        if (r > 0 && r <= 9 && strspn(v, "0123456789") == (size_t)r) {
            /* whole seconds only: a float from a client could be NaN or infinite */
            double s = (double)strtoul(v, NULL, 10);
            e->ka_s = s < KA_MIN_S ? KA_MIN_S : s > KA_MAX_S ? KA_MAX_S : s;
        }
    }
    rest_want_body(p, has_cl, cl);
    return 1;
}

void envd_body(struct pss *p)
{
    struct envd_req *e = p->envd;
    const unsigned char *b = (const unsigned char *)(p->body ? p->body : "");
    json_t *msg;
    json_error_t je;

    if (e->m == M_CODE) {
        e2b_code_body(p);
        return;
    }
    if (e->stream) {
        struct connect_rd rd;
        size_t used;
        int r;
        connect_rd_init(&rd, p->srv->cfg->max_body_bytes);
        r = connect_rd_feed(&rd, b, p->body_len, &used);
        if (r != CONNECT_RD_MSG || used != p->body_len || rd.flags) {
            connect_rd_free(&rd);
            fail(p, CONNECT_INVALID_ARGUMENT,
                 r == -EINVAL ? "a compressed envelope, or unknown flags"
                 : r < 0      ? "envelope too long"
                              : "the request must be exactly one envelope");
            return;
        }
        msg = json_loadb((const char *)rd.buf, rd.len, JSON_REJECT_DUPLICATES, &je);
        connect_rd_free(&rd);
    } else {
        msg = json_loadb(p->body_len ? (const char *)b : "{}", p->body_len ? p->body_len : 2,
                         JSON_REJECT_DUPLICATES, &je);
    }
    if (!json_is_object(msg)) {
        json_decref(msg);
        fail(p, CONNECT_INVALID_ARGUMENT, "the message must be one JSON object");
        return;
    }
    free(p->body);
    p->body = NULL;
    e->msg = msg;
    envd_run(p, msg);
}

void envd_run(struct pss *p, json_t *args)
{
    struct envd_req *e = p->envd;

    if (args != e->msg) { /* after a resume: the same message, held */
        json_incref(args);
        json_decref(e->msg);
        e->msg = args;
    }
    if (e->m != M_UNIMPLEMENTED && rest_resume_first(p, e->msg))
        return;
    if (e->stream && e->deadline_s > 0 && !ev_is_active(&e->deadline)) {
        ev_timer_set(&e->deadline, e->deadline_s, 0);
        ev_timer_start(p->srv->loop, &e->deadline);
    }
    if (e->m == M_CODE) {
        e2b_code_run(p, e->code_route, e->msg);
        return;
    }
    run_call(p);
}

void envd_req_end(struct pss *p)
{
    struct envd_req *e = p->envd;

    if (!e)
        return;
    if (e->m == M_CODE)
        e2b_code_end(p);
    timers_stop(p);
    watch_stop(p);
    envd_gz_free(p);
    if (e->ev_init)
        watch_ev_free(&e->ev);
    json_decref(e->msg);
    json_decref(e->events);
    free(e->raw);
    free(e);
    p->envd = NULL;
}
