/*
 * HTTP-layer test: server/http.c on a real libev loop and a real lws
 * listener, with the fake sandbox table (fake_sbx.c) below it, driven by
 * curl processes. The loop keeps running while each curl runs; a timer
 * samples this process's VmRSS so transfers can be checked for flat memory.
 *
 * Run with lws timeouts of 2 s (cfg.http_timeout_s) and a "slow" create that
 * answers after 5 s (fake_slow_ms), so it answers well after lws's own
 * timeouts would have fired.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <ev.h>
#include <jansson.h>

#include "api.h"
#include "config.h"
#include "fake_sbx.h"
#include "http.h"
#include "log.h"
#include "sbx.h"
#include "token.h"

extern char **environ;

int failures;
#include "check.h"

/* ASan's quarantine keeps freed memory resident: RSS says nothing there. */
#if defined(__SANITIZE_ADDRESS__)
#define CHECK_RSS(c) ((void)0)
#else
#define CHECK_RSS(c) CHECK(c)
#endif

static struct ev_loop *loop;
static char base[64];
static char tmp[] = "/tmp/warren-http-test-XXXXXX";
static const char key[] = "test-key-0123456789abcdef0123456789";
static char authz[128];
static long rss_kb, rss_peak_kb;

static long vm_rss_kb(void)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "VmRSS:", 6)) {
            v = strtol(line + 6, NULL, 10);
            break;
        }
    }
    fclose(f);
    return v;
}

static void on_sample(struct ev_loop *l, ev_timer *w, int revents)
{
    rss_kb = vm_rss_kb();
    if (rss_kb > rss_peak_kb)
        rss_peak_kb = rss_kb;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* CPU time of this process (server loop + fake table), user + system. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* ---- running curl while the loop serves ---- */

struct child {
    ev_child w;
    bool done;
    int status;
};

static void on_child(struct ev_loop *l, ev_child *w, int revents)
{
    struct child *c = (struct child *)w;
    ev_child_stop(l, w);
    c->done = true;
    c->status = w->rstatus;
}

static void pump_until(bool *flag, double max_s)
{
    double end = now_s() + max_s;
    while (!*flag && now_s() < end)
        ev_run(loop, EVRUN_ONCE);
}

static void pump_for(double s)
{
    bool never = false;
    pump_until(&never, s);
}

struct resp {
    int exit;        /* curl's exit code */
    int code;        /* HTTP status of the last transfer */
    int codes[4];    /* per URL when several */
    int connects[4]; /* num_connects per URL */
    int n;
    double size_dl, size_ul, secs;
    char *body;    /* body file contents (first 1 MiB) */
    char *hdrs;    /* response headers */
    char out[256]; /* body file path */
};

static char *slurp(const char *path, size_t max)
{
    FILE *f = fopen(path, "r");
    char *b = calloc(1, max + 1);
    size_t n;

    if (!f)
        return b;
    n = fread(b, 1, max, f);
    b[n] = '\0';
    fclose(f);
    return b;
}

static void resp_free(struct resp *r)
{
    free(r->body);
    free(r->hdrs);
    memset(r, 0, sizeof(*r));
}

static pid_t spawn_curl(struct resp *r, const char *stdin_path, const char *const *args, int idx)
{
    char wpath[256], hpath[256], epath[256];
    const char *argv[64];
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int n = 0;

    snprintf(r->out, sizeof(r->out), "%s/body%d", tmp, idx);
    snprintf(wpath, sizeof(wpath), "%s/w%d", tmp, idx);
    snprintf(hpath, sizeof(hpath), "%s/h%d", tmp, idx);
    snprintf(epath, sizeof(epath), "%s/e%d", tmp, idx);
    argv[n++] = "curl";
    argv[n++] = "-sS";
    argv[n++] = "-o";
    argv[n++] = r->out;
    argv[n++] = "-D";
    argv[n++] = hpath;
    argv[n++] = "-w";
    argv[n++] = "%{http_code} %{num_connects} %{size_download} %{size_upload} %{time_total}\\n";
    while (*args && n < 62)
        argv[n++] = *args++;
    argv[n] = NULL;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, stdin_path ? stdin_path : "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, wpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, epath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (posix_spawnp(&pid, "curl", &fa, NULL, (char *const *)argv, environ)) {
        perror("posix_spawnp curl");
        exit(1);
    }
    posix_spawn_file_actions_destroy(&fa);
    return pid;
}

static void collect(struct resp *r, int idx, int status)
{
    char wpath[256], hpath[256];
    char *w, *p;

    snprintf(wpath, sizeof(wpath), "%s/w%d", tmp, idx);
    snprintf(hpath, sizeof(hpath), "%s/h%d", tmp, idx);
    r->exit = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    w = slurp(wpath, 4096);
    p = w;
    for (r->n = 0; r->n < 4 && *p; r->n++) {
        int used = 0;
        if (sscanf(p, "%d %d %lf %lf %lf%n", &r->codes[r->n], &r->connects[r->n], &r->size_dl,
                   &r->size_ul, &r->secs, &used) < 5)
            break;
        r->code = r->codes[r->n];
        p += used;
        while (*p == '\n')
            p++;
    }
    free(w);
    r->body = slurp(r->out, 1 << 20);
    r->hdrs = slurp(hpath, 1 << 16);
}

/* Run curl with args (NULL-terminated) and wait, serving meanwhile. */
static void curl_run(struct resp *r, const char *stdin_path, double max_s, ...)
{
    const char *args[48];
    struct child c = {0};
    va_list ap;
    int n = 0;
    pid_t pid;

    memset(r, 0, sizeof(*r));
    va_start(ap, max_s);
    while (n < 47 && (args[n] = va_arg(ap, const char *)))
        n++;
    va_end(ap);
    args[n] = NULL;
    pid = spawn_curl(r, stdin_path, args, 0);
    ev_child_init(&c.w, on_child, pid, 0);
    ev_child_start(loop, &c.w);
    pump_until(&c.done, max_s);
    if (!c.done) {
        fprintf(stderr, "curl did not finish in %.0f s\n", max_s);
        kill(pid, SIGKILL);
        pump_until(&c.done, 5);
        failures++;
    }
    collect(r, 0, c.status);
}

static void url(char *buf, size_t cap, const char *path)
{
    if (snprintf(buf, cap, "%s%s", base, path) >= (int)cap)
        buf[0] = '\0'; /* a test URL never gets this long; an empty one fails loudly */
}

static json_t *body_json(const struct resp *r)
{
    json_error_t e;
    json_t *j = json_loads(r->body, 0, &e);
    if (!j)
        fprintf(stderr, "body is not JSON: %s\n", r->body);
    return j;
}

static const char *err_code(const struct resp *r)
{
    static char code[64];
    json_t *j = body_json(r);
    const char *c = json_string_value(json_object_get(json_object_get(j, "error"), "code"));
    snprintf(code, sizeof(code), "%s", c ? c : "(none)");
    json_decref(j);
    return code;
}

/* ---- tests ---- */

static char sbx_id[64];
static struct http_server *srv_h;
static struct srv_config *cfgp; /* the server reads it live: tests change limits on it */
static unsigned port;

/* ---- raw sockets, for what curl will not send ---- */

/* A connection from 127.0.0.src (1: the address curl uses). */
static int raw_connect_from(unsigned src)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in b = {.sin_family = AF_INET};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    b.sin_addr.s_addr = htonl(INADDR_LOOPBACK - 1 + src);
    if (fd < 0 || bind(fd, (struct sockaddr *)&b, sizeof(b)) ||
        connect(fd, (struct sockaddr *)&a, sizeof(a))) {
        perror("connect");
        exit(1);
    }
    return fd;
}

static int raw_connect(void)
{
    return raw_connect_from(1);
}

static void raw_send(int fd, const char *s, size_t n)
{
    if (send(fd, s, n, MSG_NOSIGNAL) != (ssize_t)n)
        fprintf(stderr, "raw_send: short\n");
}

#define raw_sends(fd, s) raw_send(fd, s, strlen(s))

/* Serve and read fd until the server closes it or max_s passes. Returns bytes read into
 * out (NUL-terminated); *closed says whether EOF (or a reset) was seen. */
static size_t raw_read(int fd, char *out, size_t cap, double max_s, bool *closed)
{
    double end = now_s() + max_s;
    size_t n = 0;

    *closed = false;
    while (now_s() < end) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        ev_run(loop, EVRUN_NOWAIT);
        if (poll(&pf, 1, 5) == 1) {
            ssize_t r = recv(fd, out + n, cap - 1 - n, MSG_DONTWAIT);
            if (r <= 0 && !(r < 0 && errno == EAGAIN)) {
                *closed = true;
                break;
            }
            if (r > 0)
                n += (size_t)r;
            if (n == cap - 1)
                break;
        }
    }
    out[n] = '\0';
    return n;
}

/* Count "HTTP/1.1 " status lines in a raw answer. */
static int answers(const char *s)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, "HTTP/1.1 ")); p++)
        n += p == s || p[-1] == '\n';
    return n;
}

static void test_basics(void)
{
    struct resp r;
    char u[256], u2[256];
    json_t *j;

    /* Liveness is open; the counts and pool figures are the key holder's only. */
    url(u, sizeof(u), "/healthz");
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.exit == 0 && r.code == 200);
    j = body_json(&r);
    CHECK(!strcmp(json_string_value(json_object_get(j, "status")), "ok"));
    CHECK(json_object_size(j) == 1);
    CHECK(strstr(r.hdrs, "content-type: application/json") ||
          strstr(r.hdrs, "Content-Type: application/json"));
    json_decref(j);
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.exit == 0 && r.code == 200);
    j = body_json(&r);
    CHECK(!strcmp(json_string_value(json_object_get(j, "status")), "ok"));
    CHECK(json_integer_value(json_object_get(j, "sandboxes")) == 0);
    CHECK(json_object_get(j, "pool") != NULL);
    json_decref(j);
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", "Authorization: Bearer wrong", u, NULL);
    CHECK(r.exit == 0 && r.code == 401 && !strstr(r.body, "sandboxes"));
    resp_free(&r);

    /* 401 without or with a wrong key, as JSON. */
    url(u, sizeof(u), "/v1/sandboxes");
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "unauthorized"));
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", "Authorization: Bearer wrong", u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "unauthorized"));
    resp_free(&r);
    url(u, sizeof(u), "/v1/nope");
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 401);
    resp_free(&r);

    /* 404 and 405. */
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 404 && !strcmp(err_code(&r), "not_found"));
    resp_free(&r);
    url(u, sizeof(u), "/nope");
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 404 && !strcmp(err_code(&r), "not_found"));
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes");
    curl_run(&r, NULL, 10, "-H", authz, "-X", "DELETE", u, NULL);
    CHECK(r.code == 405 && !strcmp(err_code(&r), "method_not_allowed"));
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "-X", "PATCH", u, NULL);
    CHECK(r.code == 405);
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes/sbx-404");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 404 && !strcmp(err_code(&r), "sandbox_not_found"));
    resp_free(&r);

    /* A query that ends in '?' or '&' is an empty last parameter, not an unknown one
     * (lws 4.1.6 reports it as "/"); a real unknown one is still refused. */
    url(u, sizeof(u), "/healthz?");
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 200);
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes?state=running&");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 200);
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes?&state=running&&");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 200);
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes?/");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 200); /* indistinguishable from the empty last one: accepted */
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes?bogus=1&");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 400 && !strcmp(err_code(&r), "bad_request"));
    resp_free(&r);

    /* HTTP/1.0 gets a plain answer too. */
    url(u, sizeof(u), "/healthz");
    curl_run(&r, NULL, 10, "-0", u, NULL);
    CHECK(r.code == 200 && r.exit == 0 && strstr(r.body, "\"ok\""));
    CHECK(!strncmp(r.hdrs, "HTTP/1.0 200", 12));
    resp_free(&r);

    /* Keep-alive: two requests, one connection. */
    url(u, sizeof(u), "/healthz");
    url(u2, sizeof(u2), "/v1/sandboxes");
    curl_run(&r, NULL, 10, "-H", authz, u, "-o", "/dev/null", u2, NULL);
    CHECK(r.n == 2 && r.codes[0] == 200 && r.codes[1] == 200);
    CHECK(r.connects[0] == 1 && r.connects[1] == 0);
    resp_free(&r);
}

static void test_bodies(void)
{
    struct resp r;
    char u[256], big[256];
    json_t *j;
    FILE *f;

    url(u, sizeof(u), "/v1/sandboxes");
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"template\":", u, NULL);
    CHECK(r.code == 400 && !strcmp(err_code(&r), "bad_request"));
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "[1,2]", u, NULL);
    CHECK(r.code == 400 && !strcmp(err_code(&r), "bad_request"));
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"template\":\"bad\"}", u, NULL);
    CHECK(r.code == 400 && !strcmp(err_code(&r), "unknown_template"));
    resp_free(&r);

    /* 413: 2 MiB over the 1 MiB default, with and without Expect: 100-continue. */
    snprintf(big, sizeof(big), "%s/big.json", tmp);
    f = fopen(big, "w");
    fputc('"', f);
    for (int i = 0; i < 2 << 20; i++)
        fputc('a', f);
    fputc('"', f);
    fclose(f);
    snprintf(big, sizeof(big), "@%s/big.json", tmp);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", big, u, NULL);
    CHECK(r.code == 413 && !strcmp(err_code(&r), "body_too_large"));
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "-H", "Expect: 100-continue", "--data-binary", big, u,
             NULL);
    CHECK(r.code == 413 && !strcmp(err_code(&r), "body_too_large"));
    resp_free(&r);

    /* A create. */
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary",
             "{\"template\":\"base\",\"metadata\":{\"team\":\"infra\",\"k\":\"v w\"}}", u, NULL);
    CHECK(r.code == 201);
    j = body_json(&r);
    snprintf(sbx_id, sizeof(sbx_id), "%s", json_string_value(json_object_get(j, "id")));
    CHECK(sbx_id[0]);
    json_decref(j);
    resp_free(&r);
    /* An empty body is {} (defaults); so is a POST without any body at all. */
    curl_run(&r, NULL, 10, "-H", authz, "-X", "POST", "-H", "Content-Length: 0", u, NULL);
    CHECK(r.code == 201);
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "-X", "POST", u, NULL);
    CHECK(r.code == 201);
    resp_free(&r);
    /* A chunked JSON body is decoded (it was refused with 411 before). */
    curl_run(&r, NULL, 10, "-H", authz, "-H", "Transfer-Encoding: chunked", "--data-binary",
             "{\"template\":\"base\",\"metadata\":{\"via\":\"chunked\"}}", u, NULL);
    CHECK(r.code == 201 && strstr(r.body, "\"via\":\"chunked\""));
    resp_free(&r);
    /* Chunked past max_json_body_bytes: 413. */
    curl_run(&r, NULL, 10, "-H", authz, "-H", "Transfer-Encoding: chunked", "--data-binary", big, u,
             NULL);
    CHECK(r.code == 413 && !strcmp(err_code(&r), "body_too_large"));
    resp_free(&r);

    /* List with a metadata filter built from the query. */
    url(u, sizeof(u), "/v1/sandboxes?state=running&metadata.team=infra&metadata.k=v%20w");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 200);
    j = body_json(&r);
    CHECK(json_array_size(json_object_get(j, "sandboxes")) == 1);
    /* The filter as the door decoded it reached the table. */
    CHECK(!strcmp(fake_stats.list_state, "running"));
    CHECK(!strcmp(json_string_value(json_object_get(fake_stats.list_filter, "k")), "v w"));
    json_decref(j);
    resp_free(&r);
    url(u, sizeof(u), "/v1/sandboxes?bogus=1");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 400 && strstr(r.body, "bogus"));
    resp_free(&r);

    /* Get, timeout. */
    snprintf(big, sizeof(big), "/v1/sandboxes/%s", sbx_id);
    url(u, sizeof(u), big);
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 200 && strstr(r.body, sbx_id));
    resp_free(&r);
    snprintf(big, sizeof(big), "/v1/sandboxes/%s/timeout", sbx_id);
    url(u, sizeof(u), big);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"ttl_seconds\":600}", u, NULL);
    CHECK(r.code == 200 && strstr(r.body, "600"));
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"ttl_seconds\":\"x\"}", u, NULL);
    CHECK(r.code == 400);
    resp_free(&r);
}

static void test_slow(void)
{
    struct resp r;
    char u[256];

    /* Longer than lws's timeouts (2 s in this test): must still answer. */
    url(u, sizeof(u), "/v1/sandboxes");
    curl_run(&r, NULL, 20, "-H", authz, "--data-binary", "{\"template\":\"slow\"}", u, NULL);
    CHECK(r.code == 201 && r.secs > 4.5);
    printf("slow create answered after %.1f s\n", r.secs);
    resp_free(&r);
    /* A long exec, and meanwhile other requests are served. */
    {
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx_id);
        url(u, sizeof(u), path);
        curl_run(&r, NULL, 20, "-H", authz, "--data-binary", "{\"cmd\":\"sleep:4500\"}", u, NULL);
        CHECK(r.code == 200 && r.secs > 4.4);
        resp_free(&r);
    }
}

struct nd {
    size_t len[3];
    unsigned char *buf[3];
    size_t cap;
    int lines, b64, bad;
    json_t *exit;
};

static void nd_parse(struct nd *s, const char *path)
{
    FILE *f = fopen(path, "r");
    char *line = NULL;
    size_t lcap = 0;
    ssize_t n;

    while (f && (n = getline(&line, &lcap, f)) > 0) {
        json_t *j = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, NULL);
        const char *type = json_string_value(json_object_get(j, "type"));
        s->lines++;
        if (!j || !type) {
            s->bad++;
        } else if (!strcmp(type, "exit") || !strcmp(type, "error")) {
            json_decref(s->exit);
            s->exit = json_incref(j);
        } else {
            int fd = !strcmp(type, "stdout") ? 1 : 2;
            json_t *d = json_object_get(j, "data");
            if ((size_t)json_integer_value(json_object_get(j, "offset")) != s->len[fd])
                s->bad++;
            if (d) {
                size_t dl = json_string_length(d);
                if (s->len[fd] + dl <= s->cap)
                    memcpy(s->buf[fd] + s->len[fd], json_string_value(d), dl);
                s->len[fd] += dl;
            } else {
                const char *b = json_string_value(json_object_get(j, "data_b64"));
                unsigned char tmpb[1 << 16];
                long m = b && strlen(b) <= sizeof(tmpb) / 4 * 3 ? api_b64_decode(b, strlen(b), tmpb)
                                                                : -1;
                if (m < 0)
                    s->bad++;
                else {
                    if (s->len[fd] + (size_t)m <= s->cap)
                        memcpy(s->buf[fd] + s->len[fd], tmpb, (size_t)m);
                    s->len[fd] += (size_t)m;
                }
                s->b64++;
            }
        }
        json_decref(j);
    }
    free(line);
    if (f)
        fclose(f);
}

static void nd_free(struct nd *s)
{
    free(s->buf[1]);
    free(s->buf[2]);
    json_decref(s->exit);
}

static void test_exec(void)
{
    struct resp r;
    char u[256], path[128];
    struct nd s = {0};
    json_t *j;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx_id);
    url(u, sizeof(u), path);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"cmd\":\"echo\"}", u, NULL);
    CHECK(r.code == 200);
    j = body_json(&r);
    CHECK(json_integer_value(json_object_get(j, "exit_code")) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(j, "stdout")), "hi\n"));
    json_decref(j);
    resp_free(&r);

    /* Streamed: chunked NDJSON with UTF-8 split across events kept as text. */
    curl_run(&r, NULL, 10, "-H", authz, "-H", "Accept: application/x-ndjson", "--data-binary",
             "{\"cmd\":\"ndjson\"}", u, NULL);
    CHECK(r.code == 200);
    CHECK(strcasestr(r.hdrs, "transfer-encoding: chunked") != NULL);
    CHECK(strcasestr(r.hdrs, "content-type: application/x-ndjson") != NULL);
    s.cap = 4096;
    s.buf[1] = calloc(1, s.cap);
    s.buf[2] = calloc(1, s.cap);
    nd_parse(&s, r.out);
    CHECK(s.bad == 0);
    CHECK(s.len[1] == 21 &&
          !memcmp(s.buf[1], "hello w\xc3\xb6rld\n\xff\xfe\xf0\x9f\x98\x80!\n", 21));
    CHECK(s.len[2] == 10 && !memcmp(s.buf[2], "err\ntail\xe2\x82", 10));
    CHECK(s.b64 == 2); /* the invalid bytes, and the unfinished tail flushed at exit */
    CHECK(strstr(r.body, "\"data\":\"hello w\"") && strstr(r.body, "\"data\":\"\xc3\xb6rld\\n\""));
    CHECK(s.exit && json_integer_value(json_object_get(s.exit, "exit_code")) == 3);
    CHECK(r.body[strlen(r.body) - 1] == '\n');
    nd_free(&s);
    resp_free(&r);

    /* Error before any output: a plain JSON error with its status. */
    curl_run(&r, NULL, 10, "-H", authz, "-H", "Accept: application/x-ndjson", "--data-binary",
             "{\"cmd\":\"fail\"}", u, NULL);
    CHECK(r.code == 409 && !strcmp(err_code(&r), "sandbox_dead"));
    resp_free(&r);

    /* HTTP/1.0: no chunking, the body ends with the connection. */
    curl_run(&r, NULL, 10, "-0", "-H", authz, "-H", "Accept: application/x-ndjson", "--data-binary",
             "{\"cmd\":\"ndjson\"}", u, NULL);
    CHECK(r.code == 200 && r.exit == 0 && !strcasestr(r.hdrs, "chunked"));
    CHECK(strstr(r.body, "\"type\":\"exit\"") != NULL);
    resp_free(&r);

    /* 20 MiB of output, streamed with flow control. */
    memset(&s, 0, sizeof(s));
    {
        double t0 = now_s();
        curl_run(&r, NULL, 60, "-H", authz, "-H", "Accept: application/x-ndjson", "--data-binary",
                 "{\"cmd\":\"big:20971520\"}", u, NULL);
        double dt = now_s() - t0;
        CHECK(r.code == 200 && r.exit == 0);
        s.cap = 0;
        nd_parse(&s, r.out);
        CHECK(s.bad == 0 && s.b64 == 0 && s.len[1] == 20971520);
        CHECK(s.exit && json_is_integer(json_object_get(s.exit, "exit_code")) &&
              json_integer_value(json_object_get(s.exit, "exit_code")) == 0);
        printf("exec stream: 20 MiB stdout as NDJSON in %.2f s (%.0f MB/s), %d lines\n", dt,
               20.0 * 1.048576 / dt, s.lines);
        nd_free(&s);
        resp_free(&r);
    }
}

static bool check_pattern_file(const char *path, uint64_t want)
{
    FILE *f = fopen(path, "r");
    static unsigned char buf[1 << 20];
    uint64_t off = 0;
    size_t n;
    bool ok = f != NULL;

    while (ok && (n = fread(buf, 1, sizeof(buf), f)) > 0) {
        for (size_t i = 0; i < n; i++) {
            if (buf[i] != fake_pattern(off + i)) {
                fprintf(stderr, "%s: byte %" PRIu64 " differs\n", path, off + i);
                ok = false;
                break;
            }
        }
        off += n;
    }
    if (f)
        fclose(f);
    return ok && off == want;
}

static void test_files(void)
{
    struct resp r;
    char u[512], p[256];
    json_t *j;

#define FURL(suffix)                                                                               \
    (snprintf(p, sizeof(p), "/v1/sandboxes/%s%s", sbx_id, suffix), url(u, sizeof(u), p))
    FURL("/files?path=/small");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 200 && r.size_dl == 11);
    CHECK(strcasestr(r.hdrs, "content-length: 11") != NULL);
    CHECK(strcasestr(r.hdrs, "application/octet-stream") != NULL);
    CHECK(check_pattern_file(r.out, 11));
    resp_free(&r);
    FURL("/files?path=relative");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 400 && strstr(r.body, "absolute"));
    resp_free(&r);
    FURL("/files");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 400 && strstr(r.body, "required"));
    resp_free(&r);
    FURL("/files?path=/missing");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 404 && !strcmp(err_code(&r), "file_not_found"));
    resp_free(&r);
    /* Fails mid-way: a JSON error if the headers were not out yet, else the connection
     * closes short of its Content-Length (curl: exit 18). */
    FURL("/files?path=/dies");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK((r.code == 500 && !strcmp(err_code(&r), "internal")) ||
          (r.code == 200 && r.exit == 18 && r.size_dl < 1 << 20));
    resp_free(&r);

    /* File operations build their request from the query or body (the fake keeps the
     * last one in fake_stats) and answer with the record's JSON. */
    FURL("/files/stat?path=/etc/hostname");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    j = body_json(&r);
    CHECK(r.code == 200 && fake_stats.file_kind == SBX_FILE_STAT);
    CHECK(!strcmp(fake_stats.file_path, "/etc/hostname"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "path")), "/etc/hostname"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "type")), "file"));
    json_decref(j);
    resp_free(&r);
    FURL("/files/list?path=/tmp&depth=3");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    j = body_json(&r);
    CHECK(r.code == 200 && fake_stats.file_kind == SBX_FILE_LIST && fake_stats.file_depth == 3);
    CHECK(!strcmp(json_string_value(json_object_get(j, "path")), "/tmp"));
    CHECK(json_is_array(json_object_get(j, "entries")));
    json_decref(j);
    resp_free(&r);
    FURL("/files?path=/tmp/x&recursive=true");
    curl_run(&r, NULL, 10, "-H", authz, "-X", "DELETE", u, NULL);
    j = body_json(&r);
    CHECK(r.code == 200 && fake_stats.file_kind == SBX_FILE_REMOVE && fake_stats.file_recursive);
    CHECK(!strcmp(json_string_value(json_object_get(j, "path")), "/tmp/x"));
    json_decref(j);
    resp_free(&r);
    FURL("/files/mkdir?path=/tmp/new%20dir");
    curl_run(&r, NULL, 10, "-H", authz, "-X", "POST", u, NULL);
    j = body_json(&r);
    CHECK(r.code == 200 && fake_stats.file_kind == SBX_FILE_MKDIR);
    CHECK(!strcmp(fake_stats.file_path, "/tmp/new dir"));
    CHECK(!strcmp(json_string_value(json_object_get(j, "path")), "/tmp/new dir"));
    json_decref(j);
    resp_free(&r);
    FURL("/files/rename");
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"from\":\"/a\",\"to\":\"/b\"}", u,
             NULL);
    j = body_json(&r);
    CHECK(r.code == 200 && fake_stats.file_kind == SBX_FILE_RENAME);
    CHECK(!strcmp(fake_stats.file_path, "/a") && !strcmp(fake_stats.file_to, "/b"));
    json_decref(j);
    resp_free(&r);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"from\":\"a\",\"to\":\"/b\"}", u, NULL);
    CHECK(r.code == 400);
    resp_free(&r);
    FURL("/files/stat?path=/x&depth=2");
    curl_run(&r, NULL, 10, "-H", authz, u, NULL);
    CHECK(r.code == 400 && strstr(r.body, "depth"));
    resp_free(&r);

    /* PUT: a zero-length file, then chunked (refused). */
    {
        char empty[256];
        snprintf(empty, sizeof(empty), "%s/empty", tmp);
        close(open(empty, O_CREAT | O_WRONLY, 0600));
        FURL("/files?path=/pattern&mode=0600");
        curl_run(&r, NULL, 10, "-H", authz, "-T", empty, u, NULL);
        CHECK(r.code == 200 && fake_stats.upload_bytes == 0 && fake_stats.upload_ok);
        resp_free(&r);
        /* From a pipe curl sends chunked: decoded, content checked by the fake (it was
         * refused with 411 before). */
        curl_run(&r, empty, 10, "-H", authz, "-T", "-", u, NULL);
        CHECK(r.code == 200 && fake_stats.upload_bytes == 0 && fake_stats.upload_ok);
        resp_free(&r);
        {
            char pat[256];
            FILE *f;
            snprintf(pat, sizeof(pat), "%s/pattern3", tmp);
            f = fopen(pat, "w");
            for (uint64_t i = 0; i < 3u << 20; i++)
                fputc(fake_pattern(i), f);
            fclose(f);
            curl_run(&r, pat, 30, "-H", authz, "-T", "-", u, NULL);
            CHECK(r.code == 200 && fake_stats.upload_bytes == 3u << 20 && fake_stats.upload_ok);
            CHECK(strcasestr(r.hdrs, "connection: close") != NULL);
            resp_free(&r);
            unlink(pat);
        }
        {
            /* Refused after its first bytes, with most of the body still to come: the
             * answer arrives whole, the rest is read and dropped (no reset). */
            char big[256];
            int fd;
            snprintf(big, sizeof(big), "%s/big8", tmp);
            fd = open(big, O_CREAT | O_WRONLY | O_TRUNC, 0600);
            CHECK(fd >= 0 && ftruncate(fd, 8 << 20) == 0);
            close(fd);
            FURL("/files?path=/readonly");
            curl_run(&r, NULL, 30, "-H", authz, "-T", big, u, NULL);
            CHECK(r.code == 403 && r.exit == 0 && strstr(r.body, "read") != NULL);
            CHECK(strcasestr(r.hdrs, "connection: close") != NULL);
            resp_free(&r);
            unlink(big);
        }
        FURL("/files?path=/pattern&mode=999");
        curl_run(&r, NULL, 10, "-H", authz, "-T", empty, u, NULL);
        CHECK(r.code == 400 && strstr(r.body, "mode"));
        resp_free(&r);
    }
#undef FURL
}

static void test_transfers(void)
{
    struct resp r;
    char u[512], p[256], file[256];
    long base_kb;
    double t0, dt, cpu0;
    int fd;

    /* 200 MiB download. */
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/big200", sbx_id);
    url(u, sizeof(u), p);
    pump_for(0.2);
    base_kb = rss_peak_kb = vm_rss_kb();
    fake_stats.max_unconsumed = 0;
    t0 = now_s();
    cpu0 = cpu_s();
    curl_run(&r, NULL, 120, "-H", authz, u, NULL);
    dt = now_s() - t0;
    cpu0 = cpu_s() - cpu0;
    CHECK(r.code == 200 && r.exit == 0 && r.size_dl == 200.0 * 1048576);
    CHECK(check_pattern_file(r.out, 200ull << 20));
    unlink(r.out);
    printf("download: 200 MiB in %.2f s (%.0f MB/s), server CPU %.2f s; RSS %ld -> peak %ld "
           "KiB (+%ld); guest bytes in flight max %" PRIu64 " KiB\n",
           dt, 200 * 1.048576 / dt, cpu0, base_kb, rss_peak_kb, rss_peak_kb - base_kb,
           fake_stats.max_unconsumed / 1024);
    CHECK_RSS(rss_peak_kb - base_kb < 16 * 1024);
    resp_free(&r);

    /* 50 MiB upload of a pattern, checked byte by byte by the fake. */
    snprintf(file, sizeof(file), "%s/pattern", tmp);
    {
        FILE *f = fopen(file, "w");
        static unsigned char buf[1 << 20];
        for (uint64_t off = 0; off < 50ull << 20; off += sizeof(buf)) {
            for (size_t i = 0; i < sizeof(buf); i++)
                buf[i] = fake_pattern(off + i);
            fwrite(buf, 1, sizeof(buf), f);
        }
        fclose(f);
    }
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/pattern&mode=0644", sbx_id);
    url(u, sizeof(u), p);
    fake_stats.upload_stalls = 0;
    t0 = now_s();
    curl_run(&r, NULL, 120, "-H", authz, "-T", file, u, NULL);
    dt = now_s() - t0;
    CHECK(r.code == 200 && fake_stats.upload_bytes == 50ull << 20 && fake_stats.upload_ok);
    CHECK(strstr(r.body, "\"size\":52428800") != NULL);
    CHECK(strcasestr(r.hdrs, "100 Continue") != NULL); /* curl asked, we answered */
    printf("upload: 50 MiB pattern in %.2f s (%.0f MB/s), content verified, %u stalls\n", dt,
           50 * 1.048576 / dt, fake_stats.upload_stalls);
    CHECK(fake_stats.upload_stalls > 0); /* backpressure was exercised */
    unlink(file);
    resp_free(&r);

    /* 1 GiB upload (sparse file of zeros): RSS must stay flat. */
    snprintf(file, sizeof(file), "%s/sparse", tmp);
    fd = open(file, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 1ll << 30) == 0);
    close(fd);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/zeros", sbx_id);
    url(u, sizeof(u), p);
    pump_for(0.2);
    base_kb = rss_peak_kb = vm_rss_kb();
    fake_stats.write_calls = fake_stats.write_bytes = 0;
    t0 = now_s();
    cpu0 = cpu_s();
    curl_run(&r, NULL, 300, "-H", authz, "-T", file, u, NULL);
    dt = now_s() - t0;
    cpu0 = cpu_s() - cpu0;
    CHECK(r.code == 200 && fake_stats.upload_bytes == 1ull << 30 && fake_stats.upload_ok);
    printf("upload: 1 GiB in %.2f s (%.0f MB/s), server CPU %.2f s; RSS %ld -> peak %ld KiB "
           "(+%ld); %.1f KiB per sbx_op_write\n",
           dt, 1024 * 1.048576 / dt, cpu0, base_kb, rss_peak_kb, rss_peak_kb - base_kb,
           fake_stats.write_calls ? fake_stats.write_bytes / 1024.0 / fake_stats.write_calls : 0);
    CHECK_RSS(rss_peak_kb - base_kb < 16 * 1024);
    resp_free(&r);
    unlink(file);
}

static void test_vanish(void)
{
    struct resp r;
    char u[512], p[256], file[256];
    unsigned c0;
    int fd;

    /* A client that goes away mid-stream cancels the operation. */
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/exec", sbx_id);
    url(u, sizeof(u), p);
    c0 = fake_stats.cancels;
    curl_run(&r, NULL, 10, "--max-time", "1", "-H", authz, "-H", "Accept: application/x-ndjson",
             "--data-binary", "{\"cmd\":\"forever\"}", u, NULL);
    CHECK(r.exit == 28 && r.code == 200);
    resp_free(&r);
    pump_for(0.3);
    CHECK(fake_stats.cancels == c0 + 1);
    CHECK(fake_stats.ops_live == 0);

    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/forever", sbx_id);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "--max-time", "1", "-H", authz, u, NULL);
    CHECK(r.exit == 28);
    unlink(r.out);
    resp_free(&r);
    pump_for(0.3);
    CHECK(fake_stats.cancels == c0 + 2);
    CHECK(fake_stats.ops_live == 0);

    /* ... also while nothing is being sent (a quiet command, non-streamed). */
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/exec", sbx_id);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "--max-time", "1", "-H", authz, "--data-binary",
             "{\"cmd\":\"sleep:5000\"}", u, NULL);
    CHECK(r.exit == 28);
    resp_free(&r);
    pump_for(0.3);
    CHECK(fake_stats.cancels == c0 + 3);
    CHECK(fake_stats.ops_live == 0);
    c0++;

    /* A slow reader: the stream waits for it (flow control), then it goes. */
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/forever", sbx_id);
    url(u, sizeof(u), p);
    fake_stats.max_unconsumed = 0;
    curl_run(&r, NULL, 10, "--max-time", "2", "--limit-rate", "1M", "-H", authz, u, NULL);
    CHECK(r.exit == 28);
    printf("slow reader: %.1f MiB in 2 s at --limit-rate 1M; guest bytes in flight max %" PRIu64
           " KiB\n",
           r.size_dl / 1048576, fake_stats.max_unconsumed / 1024);
    unlink(r.out);
    resp_free(&r);
    pump_for(0.3);
    CHECK(fake_stats.cancels == c0 + 3);

    /* An upload cut short. */
    snprintf(file, sizeof(file), "%s/sparse", tmp);
    fd = open(file, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    CHECK(fd >= 0 && ftruncate(fd, 1ll << 30) == 0);
    close(fd);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/zeros", sbx_id);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "--max-time", "1", "--limit-rate", "10M", "-H", authz, "-T", file, u,
             NULL);
    CHECK(r.exit == 28);
    resp_free(&r);
    unlink(file);
    pump_for(0.3);
    CHECK(fake_stats.cancels == c0 + 4);
    CHECK(fake_stats.ops_live == 0);

    /* Concurrency: a long exec does not hold up others. */
    {
        struct resp a, b;
        struct child ca = {0}, cb = {0};
        const char *argsa[] = {"-H", authz, "--data-binary", "{\"cmd\":\"sleep:1500\"}", u, NULL};
        char hu[256];
        const char *argsb[] = {hu, NULL};
        snprintf(p, sizeof(p), "/v1/sandboxes/%s/exec", sbx_id);
        url(u, sizeof(u), p);
        url(hu, sizeof(hu), "/healthz");
        memset(&a, 0, sizeof(a));
        memset(&b, 0, sizeof(b));
        ev_child_init(&ca.w, on_child, spawn_curl(&a, NULL, argsa, 1), 0);
        ev_child_start(loop, &ca.w);
        pump_for(0.2);
        ev_child_init(&cb.w, on_child, spawn_curl(&b, NULL, argsb, 2), 0);
        ev_child_start(loop, &cb.w);
        pump_until(&cb.done, 5);
        CHECK(cb.done && !ca.done);
        pump_until(&ca.done, 5);
        collect(&a, 1, ca.status);
        collect(&b, 2, cb.status);
        CHECK(a.code == 200 && b.code == 200 && b.secs < 0.5);
        resp_free(&a);
        resp_free(&b);
    }
    CHECK(fake_stats.misuse == 0);
}

static void test_framing(void)
{
    char req[1024], out[8192];
    bool closed;
    int fd;

    /* Both Transfer-Encoding and Content-Length: 400 and closed, and the bytes smuggled
     * after the chunked end are not served as a second request. Before, Content-Length won
     * and the GET below was answered too. */
    fd = raw_connect();
    snprintf(req, sizeof(req),
             "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n%s\r\nContent-Length: 5\r\n"
             "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
             authz);
    raw_send(fd, req, strlen(req));
    raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && answers(out) == 1 && strstr(out, "HTTP/1.1 400") &&
          strstr(out, "Transfer-Encoding and Content-Length"));
    close(fd);

    /* Another coding than chunked: 501. On a GET: 400. */
    fd = raw_connect();
    snprintf(req, sizeof(req),
             "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n%s\r\nTransfer-Encoding: gzip, "
             "chunked\r\n\r\n0\r\n\r\n",
             authz);
    raw_send(fd, req, strlen(req));
    raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && strstr(out, "HTTP/1.1 501") && strstr(out, "not_implemented"));
    close(fd);
    fd = raw_connect();
    raw_sends(fd,
              "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && answers(out) == 1 && strstr(out, "HTTP/1.1 400"));
    close(fd);

    /* A chunked body sent in pieces across reads, with an extension and a trailer: one
     * answer, then the connection closes (lws would read on as body). */
    fd = raw_connect();
    snprintf(req, sizeof(req),
             "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n%s\r\nTransfer-Encoding: chunked\r\n\r\n",
             authz);
    raw_send(fd, req, strlen(req));
    {
        static const char *const parts[] = {
            "d;ext=1\r\n{\"metadata\":{", "\r\n1",         "2\r\n\"k\":\"split-",
            "body\"}}\r\n0\r\nX-T",       "railer: y\r\n", "\r\n"};
        for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
            raw_send(fd, parts[i], strlen(parts[i]));
            pump_for(0.05);
        }
    }
    raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && answers(out) == 1 && strstr(out, "HTTP/1.1 201") &&
          strstr(out, "\"k\":\"split-body\""));
    close(fd);

    /* Malformed framing (bare LF): 400 and closed. */
    fd = raw_connect();
    snprintf(req, sizeof(req),
             "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\n%s\r\nTransfer-Encoding: chunked\r\n\r\n"
             "2\n{}\r\n0\r\n\r\n",
             authz);
    raw_send(fd, req, strlen(req));
    raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && answers(out) == 1 && strstr(out, "HTTP/1.1 400") &&
          strstr(out, "malformed chunked"));
    close(fd);
    CHECK(fake_stats.misuse == 0);
}

/* Slow and idle peers (header deadline 2 s in this test) and connection caps. */
static void test_peers(void)
{
    char out[4096], u[256];
    struct resp r;
    bool closed;
    double t0;
    int fds[16], fd, n;

    /* A slow-loris peer trickling its headers is closed at the header deadline, though it
     * never stops sending (before, only lws's 30 s ah-idle default bounded it). */
    fd = raw_connect();
    t0 = now_s();
    closed = false;
    for (const char *p =
             "GET /healthz HTTP/1.1\r\nHost: slow\r\nX-A: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
         *p && !closed; p++) {
        raw_send(fd, p, 1);
        raw_read(fd, out, sizeof(out), 0.3, &closed);
    }
    CHECK(closed && now_s() - t0 < 8);
    printf("slow-loris peer closed after %.1f s (header deadline %u s)\n", now_s() - t0,
           cfgp->header_timeout_s);
    close(fd);
    /* A peer that sends nothing at all, too. */
    fd = raw_connect();
    t0 = now_s();
    raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && out[0] == '\0' && now_s() - t0 < 8);
    close(fd);

    /* Per client address: past the cap the next connection is answered 429 and closed;
     * others are served again once some close. */
    pump_for(0.3);
    cfgp->max_conn_per_client = 4;
    for (int i = 0; i < 4; i++)
        fds[i] = raw_connect();
    pump_for(0.2);
    fd = raw_connect();
    raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    n = (int)raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && n > 0 && strstr(out, "HTTP/1.1 429") && strstr(out, "too_many_connections"));
    close(fd);
    url(u, sizeof(u), "/healthz");
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 429 && !strcmp(err_code(&r), "too_many_connections"));
    resp_free(&r);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    pump_for(0.3);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 200);
    resp_free(&r);
    cfgp->max_conn_per_client = 256;

    /* In total: 503, past max_connections, for an address that holds CONN_FAIR (4)
     * already; one that holds fewer still gets in (a reserve over the cap), so a flood
     * from other addresses does not lock it out. */
    cfgp->max_connections = 3;
    for (int i = 0; i < 4; i++)
        fds[i] = raw_connect_from(2);
    pump_for(0.2);
    fd = raw_connect_from(2);
    raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    n = (int)raw_read(fd, out, sizeof(out), 10, &closed);
    CHECK(closed && n > 0 && strstr(out, "HTTP/1.1 503") && strstr(out, "too_many_connections"));
    close(fd);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 200);
    resp_free(&r);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
    pump_for(0.3);
    cfgp->max_connections = 4096;
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 200);
    resp_free(&r);

    /* Past the fds left for connections (112 here: ulimit -n at start, less the
     * sandboxes' share), 503 as well, answered by warrend itself. */
    {
        int many[112];
        for (int i = 0; i < 112; i++)
            many[i] = raw_connect_from(2 + i / 64);
        pump_for(0.3);
        fd = raw_connect_from(4);
        raw_sends(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        n = (int)raw_read(fd, out, sizeof(out), 10, &closed);
        CHECK(closed && n > 0 && strstr(out, "HTTP/1.1 503") &&
              strstr(out, "too_many_connections"));
        close(fd);
        for (int i = 0; i < 112; i++)
            close(many[i]);
        pump_for(0.3);
        curl_run(&r, NULL, 10, u, NULL);
        CHECK(r.code == 200);
        resp_free(&r);
    }

    /* Less free disk in state_dir than min_free_disk_mb: creates and uploads get 507. */
    cfgp->min_free_disk_mb = 1u << 30;
    url(u, sizeof(u), "/v1/sandboxes");
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{}", u, NULL);
    CHECK(r.code == 507 && !strcmp(err_code(&r), "insufficient_storage"));
    resp_free(&r);
    {
        char p[256];
        snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/zeros", sbx_id);
        url(u, sizeof(u), p);
    }
    curl_run(&r, NULL, 10, "-H", authz, "-X", "PUT", "--data-binary", "abc", u, NULL);
    CHECK(r.code == 507 && !strcmp(err_code(&r), "insufficient_storage"));
    resp_free(&r);
    cfgp->min_free_disk_mb = 1;
}

/* A client that stops reading a streamed answer is dropped after
 * stream_stall_timeout_seconds (4 s here) and its operation cancelled; one that reads
 * slowly but steadily is not. */
static void test_stall(void)
{
    char req[1024], path[128], out[4096];
    unsigned c0 = fake_stats.cancels;
    bool closed;
    double t0;
    int fd;

    snprintf(path, sizeof(path), "/v1/sandboxes/%s/exec", sbx_id);
    fd = raw_connect();
    {
        int small = 4096;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    }
    snprintf(req, sizeof(req),
             "POST %s HTTP/1.1\r\nHost: x\r\n%s\r\nAccept: application/x-ndjson\r\n"
             "Content-Length: 17\r\n\r\n{\"cmd\":\"forever\"}",
             path, authz);
    raw_send(fd, req, strlen(req));
    t0 = now_s();
    while (fake_stats.cancels == c0 && now_s() - t0 < 20)
        pump_for(0.1);
    printf("stalled NDJSON client dropped after %.1f s (stall timeout %u s)\n", now_s() - t0,
           cfgp->stall_timeout_s);
    CHECK(fake_stats.cancels == c0 + 1);
    pump_for(0.3);
    CHECK(fake_stats.ops_live == 0);
    raw_read(fd, out, sizeof(out), 2, &closed);
    close(fd);

    /* A download read steadily for 12 s, three times the stall timeout: not dropped. (The
     * rate must drain the kernel's socket buffers, several MiB on loopback, well within
     * the timeout: the server hears of progress only when they have room again.) */
    {
        struct resp r;
        char u[256];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/files?path=/forever", sbx_id);
        url(u, sizeof(u), path);
        c0 = fake_stats.cancels;
        curl_run(&r, NULL, 30, "--max-time", "12", "--limit-rate", "20M", "-H", authz, u, NULL);
        CHECK(r.exit == 28 && r.size_dl > 6e6); /* ended by curl's --max-time, not by us */
        unlink(r.out);
        resp_free(&r);
        pump_for(0.3);
        CHECK(fake_stats.cancels == c0 + 1 && fake_stats.ops_live == 0);
    }
}

/* Access tokens over the fake table: minted with the key, a "files" token
 * opens that sandbox's file routes only, and its refusals carry their own codes. */
static void test_tokens(void)
{
    static const unsigned char secret[TOKEN_SECRET_LEN] = {7, 7, 7};
    struct resp r;
    char u[1024], p[512], tok[TOKEN_STR_MAX + 1], other[TOKEN_STR_MAX + 1];
    json_t *j;

    http_set_token_secret(srv_h, secret, sizeof(secret));
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/tokens", sbx_id);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary",
             "{\"scope\":[\"files\"],\"ttl_seconds\":600}", u, NULL);
    CHECK(r.code == 201);
    j = json_loads(r.body ? r.body : "", 0, NULL);
    CHECK(j && json_is_string(json_object_get(j, "token")));
    snprintf(tok, sizeof(tok), "%s", j ? json_string_value(json_object_get(j, "token")) : "");
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "sandbox")), sbx_id));
    json_decref(j);
    resp_free(&r);
    /* without the key, or with a token: no minting */
    curl_run(&r, NULL, 10, "--data-binary", "{\"scope\":[\"files\"]}", u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "unauthorized"));
    resp_free(&r);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/tokens?access_token=%s", sbx_id, tok);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "--data-binary", "{\"scope\":[\"files\"]}", u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "unauthorized"));
    resp_free(&r);
    snprintf(p, sizeof(p), "/v1/sandboxes/nosuch/tokens");
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "-H", authz, "--data-binary", "{\"scope\":[\"pty\"]}", u, NULL);
    CHECK(r.code == 404 && !strcmp(err_code(&r), "sandbox_not_found"));
    resp_free(&r);

    /* the file route with the token, and the token never echoed back */
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?path=/small&access_token=%s", sbx_id, tok);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 200 && r.size_dl == 11);
    resp_free(&r);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files?access_token=%s&bogus=1", sbx_id, tok);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 400 && r.body && !strstr(r.body, tok));
    resp_free(&r);
    /* another sandbox, a route the key alone opens, the wrong scope, expired, tampered */
    snprintf(p, sizeof(p), "/v1/sandboxes/nosuch/files?path=/small&access_token=%s", tok);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 403 && !strcmp(err_code(&r), "token_wrong_sandbox"));
    resp_free(&r);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/exec?access_token=%s", sbx_id, tok);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, "--data-binary", "{\"cmd\":\"echo\"}", u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "unauthorized"));
    resp_free(&r);
    CHECK(token_mint(secret, sbx_id, TOKEN_SCOPE_PTY, (uint64_t)time(NULL) + 60, other) == 0);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files/stat?path=/small&access_token=%s", sbx_id,
             other);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 403 && !strcmp(err_code(&r), "token_wrong_scope"));
    resp_free(&r);
    CHECK(token_mint(secret, sbx_id, TOKEN_SCOPE_FILES, (uint64_t)time(NULL) - 1, other) == 0);
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files/stat?path=/small&access_token=%s", sbx_id,
             other);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "token_expired"));
    resp_free(&r);
    tok[10] = tok[10] == 'A' ? 'B' : 'A';
    snprintf(p, sizeof(p), "/v1/sandboxes/%s/files/stat?path=/small&access_token=%s", sbx_id, tok);
    url(u, sizeof(u), p);
    curl_run(&r, NULL, 10, u, NULL);
    CHECK(r.code == 401 && !strcmp(err_code(&r), "token_invalid"));
    resp_free(&r);
}

/* A PTY whose guest sends what it should not: a byte of output, then a "lost" notice,
 * over and over (notices cost no window), to a client that reads nothing. Each notice
 * and each byte after it cost the socket's queue a frame; without a cap it grew until
 * warrend ran out of memory. pty_socket_send_queue_bytes ends the socket with 1011. */
static void test_pty_queue(void)
{
    static const char why[] = "\x03\xf3output queue over pty_socket_send_queue_bytes";
    static char buf[1 << 20];
    char req[1024];
    bool closed = false, seen = false;
    size_t n, keep = 0;
    int fd = raw_connect();

    snprintf(req, sizeof(req),
             "GET /v1/sandboxes/%s/pty/%d HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
             "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
             "Sec-WebSocket-Protocol: warren.pty.v1\r\n%s\r\n\r\n",
             sbx_id, FAKE_PID_LOSSY, authz);
    raw_sends(fd, req);
    pump_for(3); /* the client reads nothing meanwhile */
    /* Then it reads what was written before the queue overflowed (megabytes: the
     * kernel's buffers took a lot), up to the close frame: 1011 and the option. */
    for (double end = now_s() + 60; !seen && !closed && now_s() < end;) {
        size_t tot;
        n = raw_read(fd, buf + keep, sizeof(buf) - keep, 20, &closed);
        tot = keep + n;
        if (tot == n)
            CHECK(!strncmp(buf, "HTTP/1.1 101 ", 13));
        seen = memmem(buf, tot, why, sizeof(why) - 1) != NULL;
        keep = tot < sizeof(why) ? tot : sizeof(why);
        memmove(buf, buf + tot - keep, keep);
    }
    CHECK(seen);
    close(fd);
    pump_for(0.2);
    CHECK(fake_stats.misuse == 0);
}

int main(void)
{
    struct srv_config cfg;
    struct sbx_table *t;
    struct http_server *h;
    ev_timer sampler;
    char err[256];
    struct rlimit nofile, nofile_saved;

    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        return 1;
    }
    log_max = LOG_WARN;
    signal(SIGPIPE, SIG_IGN);
    loop = ev_default_loop(EVBACKEND_EPOLL);
    CHECK(cfg_defaults(&cfg) == 0);
    CHECK(cfg_set(&cfg, "listen", "127.0.0.1:0", err, sizeof(err)) == 0);
    CHECK(cfg_set(&cfg, "header_timeout_seconds", "2", err, sizeof(err)) == 0);
    CHECK(cfg_set(&cfg, "stream_stall_timeout_seconds", "4", err, sizeof(err)) == 0);
    CHECK(cfg_set(&cfg, "state_dir", tmp, err, sizeof(err)) == 0);
    CHECK(cfg_set(&cfg, "min_free_disk_mb", "1", err, sizeof(err)) == 0);
    cfg.http_timeout_s = 2;
    fake_slow_ms = 5000;
    cfgp = &cfg;
    CHECK(sbx_table_new(loop, &cfg, &t) == 0);
    /* warrend leaves ulimit -n less 32 and 8 per sandbox (max_sandboxes, 32 here) to
     * connections, counted at start: with a soft limit of 400 while it starts, that is
     * 112 (see "fds left for connections" below); raised again after. */
    CHECK(getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur >= 400);
    nofile_saved = nofile;
    nofile.rlim_cur = 400;
    CHECK(setrlimit(RLIMIT_NOFILE, &nofile) == 0);
    if (http_start(loop, &cfg, t, key, &h)) {
        fprintf(stderr, "http_start failed\n");
        return 1;
    }
    CHECK(setrlimit(RLIMIT_NOFILE, &nofile_saved) == 0);
    port = http_port(h);
    srv_h = h;
    snprintf(base, sizeof(base), "http://127.0.0.1:%u", port);
    snprintf(authz, sizeof(authz), "Authorization: Bearer %s", key);
    printf("serving on %s\n", base);
    ev_timer_init(&sampler, on_sample, 0.01, 0.01);
    ev_timer_start(loop, &sampler);

    {
        /* HTTP_TEST_ONLY=name runs test_bodies (which makes the sandbox) and that one. */
        static const struct {
            const char *name;
            void (*fn)(void);
        } tests[] = {
            {"basics", test_basics},       {"exec", test_exec},          {"files", test_files},
            {"transfers", test_transfers}, {"vanish", test_vanish},      {"slow", test_slow},
            {"framing", test_framing},     {"peers", test_peers},        {"stall", test_stall},
            {"tokens", test_tokens},       {"pty_queue", test_pty_queue}};
        const char *only = getenv("HTTP_TEST_ONLY");
        if (!only)
            test_basics();
        test_bodies();
        for (size_t i = 1; i < sizeof(tests) / sizeof(tests[0]); i++)
            if (!only || !strcmp(only, tests[i].name))
                tests[i].fn();
    }

    /* Shutdown order as in main.c: HTTP first, which cancels what is in flight, then
     * the table. A long exec is running meanwhile. */
    {
        struct resp r;
        struct child c = {0};
        char u[256], p[128];
        unsigned c0 = fake_stats.cancels;
        snprintf(p, sizeof(p), "/v1/sandboxes/%s/exec", sbx_id);
        url(u, sizeof(u), p);
        const char *args[] = {"-H", authz, "--data-binary", "{\"cmd\":\"sleep:60000\"}", u, NULL};
        memset(&r, 0, sizeof(r));
        ev_child_init(&c.w, on_child, spawn_curl(&r, NULL, args, 3), 0);
        ev_child_start(loop, &c.w);
        pump_for(0.5);
        CHECK(fake_stats.ops_live == 1);
        http_stop(h);
        /* Cancelled, and draining as the real table's ops do until the guest's last
         * frame: gone a moment later. */
        CHECK(fake_stats.cancels == c0 + 1 && fake_stats.ops_live == 1);
        pump_until(&c.done, 5);
        pump_for(0.2);
        CHECK(fake_stats.ops_live == 0);
        collect(&r, 3, c.status);
        CHECK(c.done && r.exit == 52); /* curl: empty reply from server */
        resp_free(&r);
    }
    sbx_table_free(t, false);
    ev_timer_stop(loop, &sampler);
    /* No call the contract forbids, in the whole run (a call on a cancelled op, ...). */
    CHECK(fake_stats.misuse == 0);
    cfg_free(&cfg);
    {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", tmp);
        if (system(cmd))
            fprintf(stderr, "could not remove %s\n", tmp);
    }
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    else
        printf("http: all checks passed\n");
    return failures ? 1 : 0;
}
