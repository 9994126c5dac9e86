/*
 * test_watch.c - guest-init's --watch builtin (guest-init/watch.c) on the
 * host: gi_watch_main runs in a forked child (it needs no PID 1) with its
 * stdout on a pipe, over a temporary directory this test changes.
 */
#include "watch.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

int failures;

struct child {
    pid_t pid;
    int fd;
    char buf[1 << 16];
    size_t len;
};

static void spawn(struct child *c, const char *const *args)
{
    int p[2];
    char *argv[16];
    int n = 0;

    if (pipe(p) < 0)
        abort();
    argv[n++] = "--watch";
    while (*args && n < 15)
        argv[n++] = (char *)*args++;
    argv[n] = NULL;
    fflush(NULL);
    c->pid = fork();
    if (c->pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        close(p[1]);
        _exit(gi_watch_main(n, argv));
    }
    close(p[1]);
    c->fd = p[0];
    c->len = 0;
}

/* The next line (without '\n') into out, or false after timeout_ms or at EOF. */
static bool next_line(struct child *c, char *out, size_t cap, int timeout_ms)
{
    for (;;) {
        char *nl = memchr(c->buf, '\n', c->len);
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        ssize_t r;

        if (nl) {
            size_t n = (size_t)(nl - c->buf);
            snprintf(out, cap, "%.*s", (int)n, c->buf);
            memmove(c->buf, nl + 1, c->len - n - 1);
            c->len -= n + 1;
            return true;
        }
        if (poll(&pfd, 1, timeout_ms) <= 0)
            return false;
        r = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
        if (r <= 0)
            return false;
        c->len += (size_t)r;
    }
}

/* Lines until one contains want; how many lines contained count (may be NULL). */
static bool wait_for(struct child *c, const char *want, const char *count, int *counted)
{
    char line[8192];

    while (next_line(c, line, sizeof(line), 5000)) {
        if (count && strstr(line, count))
            (*counted)++;
        if (strstr(line, want))
            return true;
    }
    fprintf(stderr, "never saw %s\n", want);
    return false;
}

static int finish(struct child *c)
{
    int st = 0;

    kill(c->pid, SIGTERM);
    waitpid(c->pid, &st, 0);
    close(c->fd);
    return st;
}

static void sh(const char *fmt, const char *dir)
{
    char cmd[1024];

    snprintf(cmd, sizeof(cmd), fmt, dir, dir, dir, dir);
    if (system(cmd) != 0)
        fprintf(stderr, "command failed: %s\n", cmd), failures++;
}

static void test_recursive(const char *root)
{
    struct child c;
    char line[8192], want[512];
    const char *args[] = {"--recursive", "--coalesce-ms", "300", root, NULL};
    int writes = 0, unwanted = 0;

    sh("mkdir -p %s/old/deep", root);
    spawn(&c, args);
    CHECK(next_line(&c, line, sizeof(line), 5000));
    snprintf(want, sizeof(want),
             "{\"type\":\"ready\",\"path\":\"%s\",\"recursive\":true,\"watches\":3}", root);
    CHECK(!strcmp(line, want));
    sh("echo a > %s/a && chmod 600 %s/a && mv %s/a %s/b", root);
    CHECK(wait_for(&c, "{\"type\":\"create\",\"name\":\"a\"", NULL, NULL));
    CHECK(wait_for(&c, "{\"type\":\"chmod\",\"name\":\"a\"", NULL, NULL));
    snprintf(want, sizeof(want),
             "{\"type\":\"rename\",\"name\":\"b\",\"path\":\"%s/b\",\"from\":\"a\"}", root);
    CHECK(wait_for(&c, want, NULL, NULL));
    sh("rm %s/b && mkdir -p %s/n/m && echo x > %s/n/m/x", root);
    CHECK(wait_for(&c, "{\"type\":\"remove\",\"name\":\"b\"", NULL, NULL));
    CHECK(wait_for(&c, "{\"type\":\"create\",\"name\":\"n/m/x\"", NULL, NULL));
    sh("echo y > %s/old/deep/y", root);
    CHECK(wait_for(&c, "{\"type\":\"create\",\"name\":\"old/deep/y\"", NULL, NULL));
    /* A renamed directory's events carry its new name. */
    sh("mv %s/old %s/new && echo z > %s/new/deep/z", root);
    CHECK(wait_for(&c, "\"name\":\"new/deep/z\"", NULL, NULL));
    /* 2000 writes to one file inside the window: a couple of write events. */
    {
        char p[512];
        int fd;
        snprintf(p, sizeof(p), "%s/w", root);
        fd = open(p, O_WRONLY | O_CREAT, 0644);
        for (int i = 0; i < 2000; i++)
            CHECK(pwrite(fd, "x", 1, i) == 1);
        close(fd);
    }
    sh("touch %s/mark", root);
    CHECK(wait_for(&c, "\"name\":\"mark\"", "{\"type\":\"write\",\"name\":\"w\"", &writes));
    CHECK(writes >= 1 && writes <= 3);
    /* A directory moved out is a remove, and nothing in it is reported after. */
    sh("mv %s/new %s.out && touch %s.out/deep/q && touch %s/mark2", root);
    CHECK(wait_for(&c, "{\"type\":\"remove\",\"name\":\"new\"", NULL, NULL));
    CHECK(wait_for(&c, "\"name\":\"mark2\"", "deep/q", &unwanted));
    CHECK(unwanted == 0);
    sh("rm -rf %s.out", root);
    /* The root itself removed: a remove of "" and the end. */
    sh("rm -rf %s", root);
    CHECK(wait_for(&c, "{\"type\":\"remove\",\"name\":\"\"", NULL, NULL));
    {
        int st;
        CHECK(waitpid(c.pid, &st, 0) == c.pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
        close(c.fd);
    }
}

static void test_flat_and_limit(const char *root)
{
    struct child c;
    char line[8192];
    const char *flat[] = {root, NULL};
    const char *limited[] = {"--recursive", "--max-watches", "2", root, NULL};
    int seen = 0;

    sh("mkdir -p %s/d1 %s/d2 %s/d3", root);
    spawn(&c, flat);
    CHECK(next_line(&c, line, sizeof(line), 5000) && strstr(line, "\"watches\":1}"));
    sh("touch %s/d1/inner && touch %s/top", root);
    CHECK(wait_for(&c, "\"name\":\"top\"", "inner", &seen));
    CHECK(seen == 0);
    finish(&c);

    /* Three subdirectories and room for two watches: one reported unwatched. */
    spawn(&c, limited);
    seen = 0;
    while (next_line(&c, line, sizeof(line), 5000) && !strstr(line, "\"ready\""))
        if (strstr(line, "{\"type\":\"unwatched\"") && strstr(line, "\"reason\":\"limit\""))
            seen++;
    CHECK(seen == 2);
    CHECK(strstr(line, "\"watches\":2}") != NULL);
    finish(&c);
}

static void test_errors(const char *root)
{
    struct child c;
    char line[8192], p[512];
    const char *missing[] = {p, NULL};
    const char *relative[] = {"tmp", NULL};
    const char *badflag[] = {"--max-watches", "0", root, NULL};
    int st;

    snprintf(p, sizeof(p), "%s/none", root);
    spawn(&c, missing);
    CHECK(next_line(&c, line, sizeof(line), 5000) &&
          strstr(line, "{\"type\":\"error\",\"code\":\"not_found\""));
    CHECK(waitpid(c.pid, &st, 0) == c.pid && WIFEXITED(st) && WEXITSTATUS(st) == 2);
    close(c.fd);

    sh("touch %s/file", root);
    snprintf(p, sizeof(p), "%s/file", root);
    spawn(&c, missing);
    CHECK(next_line(&c, line, sizeof(line), 5000) && strstr(line, "\"code\":\"not_a_directory\""));
    CHECK(waitpid(c.pid, &st, 0) == c.pid && WEXITSTATUS(st) == 2);
    close(c.fd);

    spawn(&c, relative);
    CHECK(next_line(&c, line, sizeof(line), 5000) && strstr(line, "\"code\":\"bad_request\""));
    waitpid(c.pid, &st, 0);
    close(c.fd);
    spawn(&c, badflag);
    CHECK(next_line(&c, line, sizeof(line), 5000) && strstr(line, "\"code\":\"bad_request\""));
    waitpid(c.pid, &st, 0);
    close(c.fd);

    /* A name that is not UTF-8 and one with a quote come out as valid JSON strings. */
    {
        const char *args[] = {root, NULL};
        char odd[512];
        spawn(&c, args);
        CHECK(next_line(&c, line, sizeof(line), 5000));
        snprintf(odd, sizeof(odd), "%s/q\"\xff\x01", root);
        close(open(odd, O_WRONLY | O_CREAT, 0644));
        CHECK(wait_for(&c, "\"name\":\"q\\\"\\ufffd\\u0001\"", NULL, NULL));
        finish(&c);
    }
}

int main(void)
{
    char base[] = "/tmp/gi-watch-XXXXXX", dir[600];

    if (!mkdtemp(base))
        return 1;
    snprintf(dir, sizeof(dir), "%s/r", base);
    mkdir(dir, 0755);
    test_recursive(dir);
    snprintf(dir, sizeof(dir), "%s/f", base);
    mkdir(dir, 0755);
    test_flat_and_limit(dir);
    snprintf(dir, sizeof(dir), "%s/e", base);
    mkdir(dir, 0755);
    test_errors(dir);
    sh("rm -rf %s", base);
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures != 0;
}
