/*
 * Unit tests of the guest agent: gi_agent_run(pid1=0, no cgroup) in a
 * forked child over a socketpair, driven with real frames (harness.c).
 */
#include "harness.h"
#include "agent_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[64];
static pid_t main_pid;

static const char *out_str(struct peer *p, uint32_t id, int k)
{
    struct proto_buf *b = &p->res[id].out[k];
    proto_buf_append(b, "", 1); /* NUL-terminate for comparisons, then drop it again */
    b->len--;
    return (const char *)b->p + b->off;
}

static void wait_hello(struct peer *p, int n)
{
    int64_t end = now_ms() + 3000;
    while (p->hellos < n && now_ms() < end)
        peer_step(p, 100);
    CHECK(p->hellos == n);
}

static void fill_random(uint8_t *buf, size_t n, uint32_t seed)
{
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        buf[i] = (uint8_t)(x >> 16);
    }
}

static void path_in_tmp(char *dst, const char *rel)
{
    snprintf(dst, PATH_MAX, "%s/%s", tmpdir, rel);
}

/* ---- channel-level ---- */

static void test_hello_init_ping(void)
{
    struct peer p;
    struct utsname u;
    char host[256];

    peer_start(&p);
    wait_hello(&p, 1);
    CHECK(p.hello_id == 0);
    uname(&u);
    CHECK(strcmp(p.kernel, u.release) == 0);
    send_init(&p, 7);
    wait_hello(&p, 2);
    CHECK(p.hello_id == 7);
    /* not PID 1: INIT must leave the machine alone */
    gethostname(host, sizeof(host));
    CHECK(strcmp(host, "not-the-host") != 0);
    send_simple(&p, PROTO_PING, 8, NULL, EXPECT_PONG);
    CHECK(peer_wait(&p, 8, 2000));
    CHECK(peer_stop(&p) == 0);
}

static void test_bad_frames(void)
{
    struct peer p;
    struct proto_buf b;
    struct proto_enc e;
    static const uint8_t junk[] = {0, 0, 0, 3, 0xc1, 0xc1, 0xc1};

    peer_start(&p);
    wait_hello(&p, 1);
    /* malformed msgpack: dropped, the agent keeps going */
    proto_buf_init(&b);
    proto_buf_append(&b, junk, sizeof(junk));
    peer_queue(&p, &b);
    /* a guest->host type sent to the guest: ERROR EINVAL */
    proto_buf_init(&b);
    proto_enc_begin(&e, &b, PROTO_EXIT, 3, 2);
    proto_enc_end(&e);
    peer_queue(&p, &b);
    p.res[3].expect = EXPECT_RESULT;
    CHECK(peer_wait(&p, 3, 2000) && p.res[3].error && p.res[3].err == EINVAL);
    send_simple(&p, PROTO_PING, 4, NULL, EXPECT_PONG);
    CHECK(peer_wait(&p, 4, 2000));
    CHECK(peer_stop(&p) == 0);
}

/* ---- exec ---- */

static void run(struct peer *p, uint32_t id, const struct exec_opts *o)
{
    send_exec(p, id, o, true);
    CHECK(peer_wait(p, id, 5000));
}

static void test_exec_basic(void)
{
    struct peer p;

    peer_start(&p);
    wait_hello(&p, 1);

    const char *const a1[] = {"sh", "-c", "echo out; echo err >&2; exit 3", NULL};
    run(&p, 1, &(struct exec_opts){.argv = a1});
    CHECK(strcmp(out_str(&p, 1, 1), "out\n") == 0);
    CHECK(strcmp(out_str(&p, 1, 2), "err\n") == 0);
    CHECK(p.res[1].code == 3 && p.res[1].sig == 0 && !p.res[1].timed_out);

    const char *const env[] = {"FOO", "bar", "LANG", "C", NULL};
    run(&p, 2,
        &(struct exec_opts){
            .cmd = "printf %s \"$FOO:$HOME:$USER:$LANG:$PWD:$TERM\"", .env = env, .cwd = "/tmp"});
    CHECK(strcmp(out_str(&p, 2, 1), "bar:/root:root:C:/tmp:xterm") == 0);

    run(&p, 3, &(struct exec_opts){.cmd = "kill -TERM $$"});
    CHECK(p.res[3].sig == SIGTERM && p.res[3].code == 128 + SIGTERM);

    const char *const a4[] = {"/nonexistent/prog", NULL};
    run(&p, 4, &(struct exec_opts){.argv = a4});
    CHECK(p.res[4].error && p.res[4].err == ENOENT);

    CHECK(strstr(p.res[4].msg, "/nonexistent/prog") != NULL);
    run(&p, 5, &(struct exec_opts){.cmd = "true", .cwd = "/nonexistent-dir"});
    CHECK(p.res[5].error && p.res[5].err == ENOENT);
    CHECK(strstr(p.res[5].msg, "chdir /nonexistent-dir") != NULL);

    run(&p, 6, &(struct exec_opts){.cmd = "nosuchcommand_xyz 2>/dev/null"});
    CHECK(!p.res[6].error && p.res[6].code == 127);

    const char *const a7[] = {"no-such-binary-on-path", NULL};
    run(&p, 7, &(struct exec_opts){.argv = a7});
    CHECK(p.res[7].error && p.res[7].err == ENOENT);

    run(&p, 8, &(struct exec_opts){.cmd = "true", .user = "nobody"});
    CHECK(p.res[8].error && p.res[8].err == EINVAL);

    /* the child starts clean: no inherited fds (the channel!), signals, or OOM protection */
    const char *const a9[] = {"ls", "/proc/self/fd", NULL};
    run(&p, 9, &(struct exec_opts){.argv = a9});
    CHECK(strcmp(out_str(&p, 9, 1), "0\n1\n2\n3\n") == 0);
    const char *const a10[] = {"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status", NULL};
    run(&p, 10, &(struct exec_opts){.argv = a10});
    CHECK(strcmp(out_str(&p, 10, 1), "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n") ==
          0);
    const char *const a11[] = {"cat", "/proc/self/oom_score_adj", NULL};
    run(&p, 11, &(struct exec_opts){.argv = a11});
    CHECK(strcmp(out_str(&p, 11, 1), "0\n") == 0);

    /* own session and process group: pid == pgrp == sid */
    const char *const a12[] = {"cat", "/proc/self/stat", NULL};
    run(&p, 12, &(struct exec_opts){.argv = a12});
    {
        int pid = 0, pgrp = -1, sid = -2;
        const char *s = strrchr(out_str(&p, 12, 1), ')');
        sscanf(out_str(&p, 12, 1), "%d", &pid);
        CHECK(s && sscanf(s + 2, "%*c %*d %d %d", &pgrp, &sid) == 2);
        CHECK(pid == pgrp && pid == sid);
    }

    if (geteuid() == 0) {
        run(&p, 13,
            &(struct exec_opts){.cmd = "id -u; id -g; id -G; echo $HOME $USER", .user = "user"});
        CHECK(strcmp(out_str(&p, 13, 1), "1000\n1000\n1000\n/home/user user\n") == 0);
    }

    /* a duplicate active id is refused; the first stream carries on */
    send_exec(&p, 14, &(struct exec_opts){.cmd = "sleep 0.3; echo first"}, true);
    send_exec(&p, 14, &(struct exec_opts){.cmd = "echo second"}, true);
    CHECK(peer_wait(&p, 14, 3000) && p.res[14].error && p.res[14].err == EEXIST);
    p.res[14].done = false;
    CHECK(peer_wait(&p, 14, 3000) && p.res[14].code == 0);
    CHECK(strcmp(out_str(&p, 14, 1), "first\n") == 0);

    /* argv[0] without a slash is looked up in the request's PATH as execvp does: a file
     * that is not executable is passed over (EACCES if nothing else is found), and one
     * without #! is run by /bin/sh */
    {
        char dir[] = "/tmp/gi-path-XXXXXX", f[PATH_MAX], path[PATH_MAX + 32];
        const char *const files[][2] = {{"true", "0644"}, {"noexec", "0644"}, {"script", "0755"}};
        CHECK(mkdtemp(dir) != NULL);
        for (int i = 0; i < 3; i++) {
            FILE *fp;
            snprintf(f, sizeof(f), "%s/%s", dir, files[i][0]);
            fp = fopen(f, "w");
            CHECK(fp && fputs("echo script-ran \"$1\"\n", fp) >= 0 && fclose(fp) == 0);
            CHECK(chmod(f, (mode_t)strtol(files[i][1], NULL, 8)) == 0);
        }
        snprintf(path, sizeof(path), "%s:/usr/bin:/bin", dir);
        const char *const penv[] = {"PATH", path, NULL};
        const char *const a15[] = {"true", NULL}, *const a16[] = {"script", "x", NULL},
                          *const a17[] = {"noexec", NULL};
        run(&p, 15, &(struct exec_opts){.argv = a15, .env = penv});
        CHECK(!p.res[15].error && p.res[15].code == 0 && strcmp(out_str(&p, 15, 1), "") == 0);
        run(&p, 16, &(struct exec_opts){.argv = a16, .env = penv});
        CHECK(!p.res[16].error && strcmp(out_str(&p, 16, 1), "script-ran x\n") == 0);
        run(&p, 17, &(struct exec_opts){.argv = a17, .env = penv});
        CHECK(p.res[17].error && p.res[17].err == EACCES);
        const char *const a18[] = {"", NULL};
        run(&p, 18, &(struct exec_opts){.argv = a18, .env = penv});
        CHECK(p.res[18].error && p.res[18].err == ENOENT);
        for (int i = 0; i < 3; i++) {
            snprintf(f, sizeof(f), "%s/%s", dir, files[i][0]);
            unlink(f);
        }
        rmdir(dir);
    }

    /* WARREN_EXEC_ID is the stream id, whatever the request's env says */
    const char *const env19[] = {"WARREN_EXEC_ID", "7", NULL};
    run(&p, 19, &(struct exec_opts){.cmd = "printf %s \"$WARREN_EXEC_ID\"", .env = env19});
    CHECK(strcmp(out_str(&p, 19, 1), "19") == 0);

    CHECK(peer_stop(&p) == 0);
}

/*
 * The agent waits for a vfork-style child until it execs (exec.c, spawn_vm). A
 * child whose exec blocks - here the open of a file under a write lease, which
 * waits for the lease holder (45 s by default) - is killed by its start guard
 * and the agent answers again; without the guard it hung until the lease broke.
 * A missing program and an environment too big for execve report the same
 * errors as a forked child did.
 */
static void test_spawn_guard(void)
{
    char file[PATH_MAX], *big = malloc(200001);
    struct peer p;
    FILE *fp;
    int fd;

    peer_spawn_guard_ms = 300;
    peer_start(&p);
    peer_spawn_guard_ms = 0;
    wait_hello(&p, 1);
    snprintf(file, sizeof(file), "%s/leased", tmpdir);
    fp = fopen(file, "w");
    CHECK(fp && fputs("#!/bin/sh\necho ran\n", fp) >= 0 && fclose(fp) == 0);
    CHECK(chmod(file, 0755) == 0);
    signal(SIGIO, SIG_IGN); /* a lease holder hears of a break by SIGIO */
    fd = open(file, O_RDONLY | O_CLOEXEC);
    CHECK(fd >= 0 && fcntl(fd, F_SETLEASE, F_WRLCK) == 0);
    const char *const a1[] = {file, NULL};
    send_exec(&p, 1, &(struct exec_opts){.argv = a1}, true);
    /* the lease is held throughout: only the guard can end that start */
    CHECK(peer_wait(&p, 1, 10000) && !p.res[1].error && p.res[1].sig == SIGKILL);
    run(&p, 2, &(struct exec_opts){.cmd = "echo alive"});
    CHECK(strcmp(out_str(&p, 2, 1), "alive\n") == 0);
    CHECK(fcntl(fd, F_SETLEASE, F_UNLCK) == 0);
    close(fd);
    signal(SIGIO, SIG_DFL);
    run(&p, 3, &(struct exec_opts){.argv = a1});
    CHECK(!p.res[3].error && p.res[3].code == 0 && strcmp(out_str(&p, 3, 1), "ran\n") == 0);

    const char *const a4[] = {"/nonexistent/prog", NULL}, *const a5[] = {"no-such-prog", NULL};
    run(&p, 4, &(struct exec_opts){.argv = a4});
    CHECK(p.res[4].error && p.res[4].err == ENOENT &&
          strcmp(p.res[4].msg, "exec /nonexistent/prog: No such file or directory") == 0);
    run(&p, 5, &(struct exec_opts){.argv = a5});
    CHECK(p.res[5].error && p.res[5].err == ENOENT &&
          strcmp(p.res[5].msg, "exec no-such-prog: No such file or directory") == 0);

    /* one string over MAX_ARG_STRLEN (128 KiB): execve's E2BIG; 100 kB runs */
    CHECK(big != NULL);
    memset(big, 'x', 200000);
    big[200000] = '\0';
    const char *const env6[] = {"BIG", big, NULL};
    run(&p, 6, &(struct exec_opts){.cmd = "true", .env = env6});
    CHECK(p.res[6].error && p.res[6].err == E2BIG);
    big[100000] = '\0';
    run(&p, 7, &(struct exec_opts){.cmd = "printf %s \"$BIG\" | wc -c", .env = env6});
    CHECK(!p.res[7].error && strcmp(out_str(&p, 7, 1), "100000\n") == 0);

    /* a file without #! is run by /bin/sh with the argv copied behind it on the child's stack:
     * 200000 arguments need 1.6 MB; a fixed 256 KiB stack wrote below itself into the agent's
     * memory (with a guard page the child died of SIGSEGV) */
    {
        static const char *a9[200002];
        snprintf(file, sizeof(file), "%s/noshebang", tmpdir);
        fp = fopen(file, "w");
        CHECK(fp && fputs("echo $#\n", fp) >= 0 && fclose(fp) == 0);
        CHECK(chmod(file, 0755) == 0);
        a9[0] = file;
        for (int i = 1; i <= 200000; i++)
            a9[i] = "";
        run(&p, 9, &(struct exec_opts){.argv = a9});
        CHECK(!p.res[9].error && p.res[9].code == 0 && strcmp(out_str(&p, 9, 1), "200000\n") == 0);
        unlink(file);
        snprintf(file, sizeof(file), "%s/leased", tmpdir);
    }

    CHECK(peer_stop(&p) == 0);
    unlink(file);
    free(big);

    /* no room for the guard's timer (RLIMIT_SIGPENDING 0 in the agent): that start is forked
     * instead (it was an ERROR EAGAIN) */
    {
        struct rlimit old, none;
        CHECK(getrlimit(RLIMIT_SIGPENDING, &old) == 0);
        none = (struct rlimit){.rlim_cur = 0, .rlim_max = old.rlim_max};
        CHECK(setrlimit(RLIMIT_SIGPENDING, &none) == 0);
        peer_start(&p);
        CHECK(setrlimit(RLIMIT_SIGPENDING, &old) == 0);
        wait_hello(&p, 1);
        run(&p, 2, &(struct exec_opts){.cmd = "echo forked"});
        CHECK(!p.res[2].error && strcmp(out_str(&p, 2, 1), "forked\n") == 0);
        CHECK(peer_stop(&p) == 0);
    }
}

static long first_line_pid(struct peer *p, uint32_t id, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    while (!strchr(out_str(p, id, 1), '\n') && now_ms() < end)
        peer_step(p, 50);
    return strtol(out_str(p, id, 1), NULL, 10);
}

static void test_timeout_and_signal(void)
{
    struct peer p;
    int64_t t0;
    long bg;

    peer_start(&p);
    wait_hello(&p, 1);

    t0 = now_ms();
    send_exec(&p, 1,
              &(struct exec_opts){.cmd = "sleep 100 & echo $!; sleep 100", .timeout_ms = 300},
              true);
    bg = first_line_pid(&p, 1, 2000);
    CHECK(peer_wait(&p, 1, 3000));
    CHECK(p.res[1].timed_out && p.res[1].sig == SIGKILL);
    CHECK(now_ms() - t0 < 2000);
    CHECK(bg > 0 && pid_gone((pid_t)bg, 2000)); /* the grandchild died with its group */

    send_exec(&p, 2, &(struct exec_opts){.cmd = "sleep 100"}, true);
    send_signal(&p, 2, SIGTERM);
    CHECK(peer_wait(&p, 2, 3000) && p.res[2].sig == SIGTERM && !p.res[2].timed_out);

    /* a signal the shell traps is delivered, not escalated */
    send_exec(&p, 3,
              &(struct exec_opts){.cmd = "trap 'echo got; exit 5' USR1; echo ready; "
                                         "while :; do sleep 0.05; done"},
              true);
    first_line_pid(&p, 3, 2000);
    send_signal(&p, 3, SIGUSR1);
    CHECK(peer_wait(&p, 3, 3000) && p.res[3].code == 5);
    CHECK(strcmp(out_str(&p, 3, 1), "ready\ngot\n") == 0);
    CHECK(peer_stop(&p) == 0);
}

/* ---- flow control ---- */

static size_t seq_text(char *buf, size_t cap)
{
    size_t n = 0;
    for (unsigned i = 1; n < cap; i++) {
        char line[16];
        int k = snprintf(line, sizeof(line), "%u\n", i);
        size_t c = n + (size_t)k <= cap ? (size_t)k : cap - n;
        memcpy(buf + n, line, c);
        n += c;
    }
    return n;
}

/* Step until nothing new arrives for quiet_ms. */
static void settle(struct peer *p, int quiet_ms)
{
    while (peer_step(p, quiet_ms))
        ;
}

/* Wait (up to 10 s: these machines are shared) until b holds want bytes, then a quiet spell,
 * so a check for "exactly want" sees any excess too without depending on speed. */
static void await_pending(struct peer *p, const struct proto_buf *b, size_t want)
{
    int64_t end = now_ms() + 10000;

    while (proto_buf_pending(b) < want && now_ms() < end)
        peer_step(p, 50);
    settle(p, 150);
}

static void test_flow_control(void)
{
    const size_t total = 8 << 20;
    char *want = malloc(total);
    struct peer p;
    uint64_t credited = PROTO_WINDOW;
    int64_t end;

    seq_text(want, total);
    peer_start(&p);
    wait_hello(&p, 1);
    send_exec(&p, 1, &(struct exec_opts){.cmd = "seq 1 3000000 | head -c 8388608"}, false);
    await_pending(&p, &p.res[1].out[1], PROTO_WINDOW);
    /* without CREDIT the agent stops exactly at the window, the writer blocks meanwhile */
    CHECK(proto_buf_pending(&p.res[1].out[1]) == PROTO_WINDOW);
    CHECK(!p.res[1].done);
    end = now_ms() + 10000;
    while (!p.res[1].done && now_ms() < end) {
        size_t got = proto_buf_pending(&p.res[1].out[1]);
        /* like a host: hand credit back for what was consumed, in 256 KiB steps */
        if (credited - got < PROTO_WINDOW - (256 << 10)) {
            send_credit(&p, 1, PROTO_WINDOW - (credited - got));
            credited = got + PROTO_WINDOW;
        }
        peer_step(&p, 100);
    }
    CHECK(p.res[1].done && p.res[1].code == 0);
    CHECK(proto_buf_pending(&p.res[1].out[1]) == total);
    CHECK(memcmp(out_str(&p, 1, 1), want, total) == 0);
    CHECK(p.res[1].bad_off == 0);
    CHECK(proto_buf_pending(&p.res[1].out[2]) == 0);
    CHECK(peer_stop(&p) == 0);
    free(want);
}

/* Feed data as stdin under the agent's credit while reading the echo. */
static void test_stdin_cat(void)
{
    const size_t total = 3 << 20;
    uint8_t *data = malloc(total);
    struct peer p;
    size_t sent = 0;
    int64_t end = now_ms() + 10000;

    fill_random(data, total, 42);
    peer_start(&p);
    wait_hello(&p, 1);
    send_exec(&p, 1,
              &(struct exec_opts){.argv = (const char *const[]){"cat", NULL}, .stdin_pipe = true},
              true);
    while (!p.res[1].done && now_ms() < end) {
        uint64_t credit = PROTO_WINDOW + p.res[1].credit - sent;
        size_t n = total - sent < PROTO_MAX_DATA ? total - sent : PROTO_MAX_DATA;
        if (sent < total && credit >= n && proto_buf_pending(&p.out) < (256 << 10)) {
            send_stdin(&p, 1, data + sent, n, sent + n == total);
            sent += n;
            continue;
        }
        peer_step(&p, 50);
    }
    CHECK(p.res[1].done && p.res[1].code == 0);
    CHECK(proto_buf_pending(&p.res[1].out[1]) == total);
    CHECK(memcmp(out_str(&p, 1, 1), data, total) == 0);
    CHECK(p.res[1].credit == total); /* every stdin byte was credited back */

    /* stdin=false reads /dev/null */
    run(&p, 2, &(struct exec_opts){.cmd = "wc -c"});
    CHECK(atoi(out_str(&p, 2, 1)) == 0);
    /* the child closing stdin early: the agent credits the dropped bytes back */
    send_exec(&p, 3, &(struct exec_opts){.cmd = "exec 0<&-; sleep 1", .stdin_pipe = true}, true);
    peer_step(&p, 300);
    send_stdin(&p, 3, data, 1000, false);
    send_stdin(&p, 3, data, 1000, true);
    CHECK(peer_wait(&p, 3, 3000) && p.res[3].code == 0);
    settle(&p, 100);
    CHECK(p.res[3].credit == 2000);
    CHECK(peer_stop(&p) == 0);
    free(data);
}

/* ---- files ---- */

/* Upload under the agent's credit; returns the RESULT size or -errno. */
static int64_t upload(struct peer *p, uint32_t id, const char *path, int mode, const uint8_t *data,
                      size_t total)
{
    size_t sent = 0;
    int64_t end = now_ms() + 10000;

    send_fwrite(p, id, path, mode);
    while (sent < total && !p->res[id].done && now_ms() < end) {
        size_t n = total - sent < PROTO_MAX_DATA ? total - sent : PROTO_MAX_DATA;
        if (PROTO_WINDOW + p->res[id].credit - sent >= n &&
            proto_buf_pending(&p->out) < (256 << 10)) {
            send_data(p, id, sent, data + sent, n);
            sent += n;
        } else {
            peer_step(p, 50);
        }
    }
    send_end(p, id);
    if (!peer_wait(p, id, 5000))
        return -ETIMEDOUT;
    return p->res[id].error ? -p->res[id].err : (int64_t)p->res[id].size;
}

static void test_file_roundtrip(void)
{
    const size_t total = (3 << 20) + 12345;
    uint8_t *data = malloc(total);
    char path[PATH_MAX];
    struct peer p;
    struct stat st;
    int64_t end;

    fill_random(data, total, 7);
    path_in_tmp(path, "a/b/c/file.bin");
    peer_start(&p);
    wait_hello(&p, 1);
    CHECK(upload(&p, 1, path, 0600, data, total) == (int64_t)total);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600 && (size_t)st.st_size == total);

    send_simple(&p, PROTO_FREAD, 2, path, EXPECT_END);
    CHECK(peer_wait(&p, 2, 5000) && !p.res[2].error);
    CHECK(p.res[2].have_result && p.res[2].size == total && p.res[2].mode == 0600);
    CHECK(proto_buf_pending(&p.res[2].out[0]) == total && p.res[2].bad_off == 0);
    CHECK(memcmp(p.res[2].out[0].p + p.res[2].out[0].off, data, total) == 0);

    /* without credit a read stops at the window */
    send_simple(&p, PROTO_FREAD, 3, path, EXPECT_END);
    p.res[3].auto_credit = false;
    await_pending(&p, &p.res[3].out[0], PROTO_WINDOW);
    CHECK(proto_buf_pending(&p.res[3].out[0]) == PROTO_WINDOW && !p.res[3].done);
    send_credit(&p, 3, total);
    CHECK(peer_wait(&p, 3, 5000));
    CHECK(proto_buf_pending(&p.res[3].out[0]) == total);

    /* a signal aborts a stalled read: ERROR ECANCELED ends the stream, nothing follows */
    send_simple(&p, PROTO_FREAD, 8, path, EXPECT_END);
    p.res[8].auto_credit = false;
    await_pending(&p, &p.res[8].out[0], PROTO_WINDOW);
    CHECK(proto_buf_pending(&p.res[8].out[0]) == PROTO_WINDOW && !p.res[8].done);
    send_signal(&p, 8, 9);
    CHECK(peer_wait(&p, 8, 2000) && p.res[8].error && p.res[8].err == ECANCELED);

    /* a file that grows while it is read ends at the size announced in its RESULT: that
     * is the download's Content-Length, and the host treats more as a protocol violation */
    send_simple(&p, PROTO_FREAD, 9, path, EXPECT_END);
    p.res[9].auto_credit = false;
    await_pending(&p, &p.res[9].out[0], PROTO_WINDOW);
    {
        int fd = open(path, O_WRONLY | O_APPEND);
        CHECK(fd >= 0 && write(fd, data, 4096) == 4096);
        close(fd);
    }
    send_credit(&p, 9, 2 * total);
    CHECK(peer_wait(&p, 9, 5000) && !p.res[9].error && p.res[9].size == total);
    CHECK(proto_buf_pending(&p.res[9].out[0]) == total);

    /* overwrite truncates; default mode 0644 applies to new files only through fchmod */
    CHECK(upload(&p, 4, path, -1, data, 10) == 10);
    CHECK(stat(path, &st) == 0 && st.st_size == 10 && (st.st_mode & 07777) == 0644);

    /* an empty file */
    path_in_tmp(path, "empty");
    CHECK(upload(&p, 5, path, -1, data, 0) == 0);
    send_simple(&p, PROTO_FREAD, 6, path, EXPECT_END);
    CHECK(peer_wait(&p, 6, 2000) && p.res[6].have_result && p.res[6].size == 0);

    /* DATA at the wrong offset fails the stream */
    path_in_tmp(path, "ooo");
    send_fwrite(&p, 7, path, -1);
    send_data(&p, 7, 5, data, 10);
    send_end(&p, 7);
    CHECK(peer_wait(&p, 7, 2000) && p.res[7].error && p.res[7].err == EINVAL);
    end = now_ms() + 200;
    while (now_ms() < end)
        peer_step(&p, 50); /* nothing may follow the ERROR (checked by the harness) */
    CHECK(peer_stop(&p) == 0);
    free(data);
}

static bool has_line(struct peer *p, uint32_t id, const char *line)
{
    char want[PATH_MAX + 16];
    struct proto_buf *b = &p->res[id].paths;
    if (snprintf(want, sizeof(want), "%s\n", line) >= (int)sizeof(want))
        return false;
    return memmem(b->p + b->off, proto_buf_pending(b), want, strlen(want)) != NULL;
}

static void mk(const char *rel, bool dir)
{
    char path[PATH_MAX];
    path_in_tmp(path, rel);
    if (dir)
        CHECK(mkdir(path, 0755) == 0);
    else
        CHECK(close(open(path, O_WRONLY | O_CREAT, 0644)) == 0);
}

static void test_stat_list(void)
{
    char path[PATH_MAX], target[PATH_MAX], line[PATH_MAX + 16];
    struct peer p;

    mk("l", true);
    mk("l/a", false);
    mk("l/d1", true);
    mk("l/d1/b", false);
    mk("l/d1/d2", true);
    mk("l/d1/d2/c", false);
    path_in_tmp(target, "l/d1");
    path_in_tmp(path, "l/link");
    CHECK(symlink(target, path) == 0);

    peer_start(&p);
    wait_hello(&p, 1);
    path_in_tmp(path, "l/a");
    send_simple(&p, PROTO_STAT, 1, path, EXPECT_RESULT);
    CHECK(peer_wait(&p, 1, 2000) && strcmp(p.res[1].type, "file") == 0);
    CHECK(strcmp(p.res[1].name, "a") == 0 && p.res[1].mode == 0644 && p.res[1].size == 0);
    CHECK(p.res[1].mtime > 1600000000);
    path_in_tmp(path, "l/link");
    send_simple(&p, PROTO_STAT, 2, path, EXPECT_RESULT);
    CHECK(peer_wait(&p, 2, 2000) && strcmp(p.res[2].type, "symlink") == 0);
    path_in_tmp(path, "l/d1/");
    send_simple(&p, PROTO_STAT, 3, path, EXPECT_RESULT);
    CHECK(peer_wait(&p, 3, 2000) && strcmp(p.res[3].type, "dir") == 0);
    CHECK(strcmp(p.res[3].name, "d1") == 0);

    path_in_tmp(path, "l");
    for (uint32_t depth = 1; depth <= 3; depth++) {
        send_list(&p, 10 + depth, path, depth);
        CHECK(peer_wait(&p, 10 + depth, 2000) && !p.res[10 + depth].error);
    }
    CHECK(p.res[11].nentries == 3 && p.res[12].nentries == 5 && p.res[13].nentries == 6);
    snprintf(line, sizeof(line), "%s/l/link symlink", tmpdir);
    CHECK(has_line(&p, 11, line));
    snprintf(line, sizeof(line), "%s/l/d1 dir", tmpdir);
    CHECK(has_line(&p, 11, line));
    snprintf(line, sizeof(line), "%s/l/d1/d2/c file", tmpdir);
    CHECK(has_line(&p, 13, line) && !has_line(&p, 12, line));
    snprintf(line, sizeof(line), "%s/l/link/b file", tmpdir); /* symlinks are not followed */
    CHECK(!has_line(&p, 13, line));

    /* many entries: several frames, eof only on the last */
    mk("big", true);
    for (int i = 0; i < 1100; i++) {
        char rel[64];
        snprintf(rel, sizeof(rel), "big/file-with-a-longish-name-%05d", i);
        mk(rel, false);
    }
    path_in_tmp(path, "big");
    send_list(&p, 20, path, 1);
    CHECK(peer_wait(&p, 20, 5000) && p.res[20].nentries == 1100 && p.res[20].nframes >= 2);
    CHECK(p.res[20].bad_off == 0);

    /* an empty directory answers one RESULT with no entries */
    mk("emptydir", true);
    path_in_tmp(path, "emptydir");
    send_list(&p, 21, path, 1);
    CHECK(peer_wait(&p, 21, 2000) && p.res[21].nentries == 0 && p.res[21].nframes == 1);

    /* the root lists without a double slash */
    send_list(&p, 22, "/", 1);
    CHECK(peer_wait(&p, 22, 2000) && has_line(&p, 22, "/tmp dir"));
    CHECK(peer_stop(&p) == 0);
}

static void test_mkdir_remove_rename(void)
{
    char path[PATH_MAX], path2[PATH_MAX], target[PATH_MAX];
    struct peer p;
    struct stat st;

    peer_start(&p);
    wait_hello(&p, 1);
    path_in_tmp(path, "m/x/y/z");
    send_simple(&p, PROTO_MKDIR, 1, path, EXPECT_RESULT);
    CHECK(peer_wait(&p, 1, 2000) && !p.res[1].error);
    CHECK(stat(path, &st) == 0 && S_ISDIR(st.st_mode));
    send_simple(&p, PROTO_MKDIR, 2, path, EXPECT_RESULT); /* -p: existing is fine */
    CHECK(peer_wait(&p, 2, 2000) && !p.res[2].error);

    path_in_tmp(path, "m");
    send_remove(&p, 3, path, false);
    CHECK(peer_wait(&p, 3, 2000) && p.res[3].error && p.res[3].err == ENOTEMPTY);

    /* recursive remove deletes a symlink to outside, never what it points to */
    mk("outside", true);
    mk("outside/keep", false);
    path_in_tmp(target, "outside");
    path_in_tmp(path2, "m/x/escape");
    CHECK(symlink(target, path2) == 0);
    mk("m/x/file", false);
    send_remove(&p, 4, path, true);
    CHECK(peer_wait(&p, 4, 2000) && !p.res[4].error);
    CHECK(stat(path, &st) != 0 && errno == ENOENT);
    path_in_tmp(path2, "outside/keep");
    CHECK(stat(path2, &st) == 0);

    path_in_tmp(path, "outside/keep");
    path_in_tmp(path2, "outside/moved");
    send_rename(&p, 5, path, path2);
    CHECK(peer_wait(&p, 5, 2000) && !p.res[5].error);
    CHECK(stat(path2, &st) == 0 && stat(path, &st) != 0);

    send_remove(&p, 6, path2, false); /* a plain file */
    CHECK(peer_wait(&p, 6, 2000) && !p.res[6].error && stat(path2, &st) != 0);
    send_remove(&p, 7, "/", true);
    CHECK(peer_wait(&p, 7, 2000) && p.res[7].error);
    CHECK(peer_stop(&p) == 0);
}

static void expect_error(struct peer *p, uint32_t id, int err)
{
    CHECK(peer_wait(p, id, 2000));
    if (!p->res[id].error || p->res[id].err != err) {
        fprintf(stderr, "id %u: wanted errno %d, got %s %lld (%s)\n", id, err,
                p->res[id].error ? "ERROR" : "success", (long long)p->res[id].err, p->res[id].msg);
        failures++;
    }
}

static void test_file_errors(void)
{
    char path[PATH_MAX], file[PATH_MAX];
    struct peer p;

    peer_start(&p);
    wait_hello(&p, 1);
    path_in_tmp(path, "missing");
    send_simple(&p, PROTO_FREAD, 1, path, EXPECT_END);
    expect_error(&p, 1, ENOENT);
    send_simple(&p, PROTO_STAT, 2, "relative/path", EXPECT_RESULT);
    expect_error(&p, 2, EINVAL);
    send_simple(&p, PROTO_FREAD, 3, tmpdir, EXPECT_END);
    expect_error(&p, 3, EISDIR);
    send_fwrite(&p, 4, "rel.txt", -1);
    expect_error(&p, 4, EINVAL);
    send_remove(&p, 5, path, true);
    expect_error(&p, 5, ENOENT);
    path_in_tmp(file, "plain");
    mk("plain", false);
    send_list(&p, 6, file, 1);
    expect_error(&p, 6, ENOTDIR);
    send_simple(&p, PROTO_FREAD, 7, "/dev/null", EXPECT_END);
    expect_error(&p, 7, EINVAL);
    path_in_tmp(path, "plain/sub/x"); /* a parent that is a file */
    send_fwrite(&p, 8, path, -1);
    expect_error(&p, 8, ENOTDIR);
    send_simple(&p, PROTO_MKDIR, 9, file, EXPECT_RESULT);
    expect_error(&p, 9, EEXIST);
    send_rename(&p, 10, file, "relative");
    expect_error(&p, 10, EINVAL);
    send_simple(&p, PROTO_STAT, 0, path, EXPECT_RESULT);
    expect_error(&p, 0, ENOTDIR);
    CHECK(peer_stop(&p) == 0);
}

/* ENOSPC needs a tiny filesystem: a private tmpfs in a mount namespace (root only). */
static int enospc_child(void)
{
    char dir[PATH_MAX], path[PATH_MAX];
    uint8_t *data = calloc(1, 1 << 20);
    struct peer p;
    int64_t r;

    failures = 0; /* counted in this process, reported through the exit status */
    path_in_tmp(dir, "small");
    if (mkdir(dir, 0755) != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", dir, "tmpfs", 0, "size=256k") != 0)
        return 77;
    path_in_tmp(path, "small/big");
    peer_start(&p);
    wait_hello(&p, 1);
    r = upload(&p, 1, path, -1, data, 1 << 20);
    CHECK(r == -ENOSPC);
    send_simple(&p, PROTO_PING, 2, NULL, EXPECT_PONG); /* still serving */
    CHECK(peer_wait(&p, 2, 2000));
    CHECK(peer_stop(&p) == 0);
    umount(dir);
    free(data);
    return failures ? 1 : 0;
}

static void test_enospc(void)
{
    int st;
    pid_t pid = fork();

    if (pid == 0)
        _exit(enospc_child());
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77)
        fprintf(stderr, "test_enospc: skipped (needs root for a private tmpfs)\n");
    else
        CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- concurrency and sessions ---- */

static void test_many_streams(void)
{
    const int n = 64;
    const size_t fsize = 1 << 20;
    uint8_t *data = malloc(fsize);
    char path[PATH_MAX], want[64];
    struct peer p;
    int64_t t0 = now_ms();

    fill_random(data, fsize, 99);
    path_in_tmp(path, "many.bin");
    peer_start(&p);
    wait_hello(&p, 1);
    for (int i = 0; i < n; i++) {
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "echo start %d; sleep 0.3; echo end %d >&2; exit %d", i, i,
                 i % 7);
        send_exec(&p, 100 + (uint32_t)i, &(struct exec_opts){.cmd = cmd}, true);
    }
    /* a file goes up and down while they all run */
    CHECK(upload(&p, 1, path, -1, data, fsize) == (int64_t)fsize);
    send_simple(&p, PROTO_FREAD, 2, path, EXPECT_END);
    CHECK(peer_wait(&p, 2, 5000));
    CHECK(memcmp(p.res[2].out[0].p + p.res[2].out[0].off, data, fsize) == 0);
    for (int i = 0; i < n; i++) {
        uint32_t id = 100 + (uint32_t)i;
        CHECK(peer_wait(&p, id, 5000) && !p.res[id].error && p.res[id].code == i % 7);
        snprintf(want, sizeof(want), "start %d\n", i);
        CHECK(strcmp(out_str(&p, id, 1), want) == 0);
        snprintf(want, sizeof(want), "end %d\n", i);
        CHECK(strcmp(out_str(&p, id, 2), want) == 0);
    }
    fprintf(stderr, "test_many_streams: %d execs + 1 MiB up/down in %lld ms\n", n,
            (long long)(now_ms() - t0));
    CHECK(peer_stop(&p) == 0);
    free(data);
}

static void test_sessions(void)
{
    struct peer p;
    long bg, bg2;

    peer_start(&p);
    wait_hello(&p, 1);
    send_exec(&p, 1, &(struct exec_opts){.cmd = "sleep 100 & echo $!; wait"}, true);
    bg = first_line_pid(&p, 1, 2000);
    /* a new host session ends the old streams: no EXIT, processes gone */
    send_init(&p, 50);
    wait_hello(&p, 2);
    CHECK(p.hello_id == 50);
    CHECK(bg > 0 && pid_gone((pid_t)bg, 2000));
    settle(&p, 100);
    CHECK(!p.res[1].done);
    /* ids are free again in the new session */
    proto_buf_free(&p.res[1].out[1]);
    run(&p, 1, &(struct exec_opts){.cmd = "echo again"});
    CHECK(strcmp(out_str(&p, 1, 1), "again\n") == 0);

    /* the host going away kills what runs and the agent returns 0 */
    send_exec(&p, 2, &(struct exec_opts){.cmd = "sleep 100 & echo $!; wait"}, true);
    bg2 = first_line_pid(&p, 2, 2000);
    CHECK(peer_stop(&p) == 0);
    CHECK(bg2 > 0 && pid_gone((pid_t)bg2, 2000));
}

/* utime + stime of a process, in clock ticks */
static long cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    unsigned long ut = 0, st = 0;
    FILE *f;
    char *rp;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    rp = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
    fclose(f);
    if (!rp || sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (long)(ut + st);
}

/*
 * PID 1 mode: a closed host end kills the session and the agent waits for
 * a new host instead of returning, without spinning on POLLHUP. (A socket
 * cannot reopen, so the reconnect itself is covered in a real VM.)
 */
static void test_pid1_hangup(void)
{
    struct peer p;
    long bg, t0, t1;
    int st;

    peer_start_pid1(&p);
    wait_hello(&p, 1);
    send_exec(&p, 1, &(struct exec_opts){.cmd = "sleep 100 & echo $!; wait"}, true);
    bg = first_line_pid(&p, 1, 2000);
    shutdown(p.fd, SHUT_RDWR);
    CHECK(bg > 0 && pid_gone((pid_t)bg, 2000));
    t0 = cpu_ticks(p.agent);
    usleep(1500 * 1000);
    t1 = cpu_ticks(p.agent);
    CHECK(waitpid(p.agent, &st, WNOHANG) == 0); /* still there */
    CHECK(t0 >= 0 && t1 - t0 <= 5);             /* <= 50 ms of CPU in 1.5 s: no busy loop */
    kill(p.agent, SIGKILL);
    waitpid(p.agent, &st, 0);
    p.agent = 0;
    p.fd = -1;
    peer_free(&p);
}

/* A frame over the cap breaks the stream: the test-mode agent gives up with an error. */
static void test_oversized_frame(void)
{
    struct peer p;
    struct proto_buf b;
    static const uint8_t hdr[] = {0x7f, 0xff, 0xff, 0xff};

    peer_start(&p);
    wait_hello(&p, 1);
    proto_buf_init(&b);
    proto_buf_append(&b, hdr, sizeof(hdr));
    peer_queue(&p, &b);
    peer_flush(&p, 1000);
    while (!p.eof && peer_step(&p, 2000))
        ;
    CHECK(p.eof);
    CHECK(peer_stop(&p) == 1);
}

/* A writable cgroup2 directory with cgroup.kill for the test, or false. */
static bool make_test_cgroup(char *root, size_t cap)
{
    static const char *const mounts[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    char kill_file[PATH_MAX];

    for (size_t i = 0; i < sizeof(mounts) / sizeof(mounts[0]); i++) {
        snprintf(root, cap, "%s/gi-agent-test-%d", mounts[i], (int)getpid());
        if (mkdir(root, 0755) != 0)
            continue;
        if (snprintf(kill_file, sizeof(kill_file), "%s/cgroup.kill", root) <
                (int)sizeof(kill_file) &&
            access(kill_file, W_OK) == 0)
            return true;
        rmdir(root);
    }
    return false;
}

/*
 * Per-exec cgroups: the child runs in its own <root>/cg-<n> (made ahead, entered
 * through clone3(CLONE_INTO_CGROUP) where the kernel has it), a timeout kills a
 * grandchild that left the process group (setsid) through cgroup.kill, and
 * the exec's cgroup is removed once empty.
 */
static void test_cgroups(void)
{
    char root[PATH_MAX], want[PATH_MAX];
    struct peer p;
    long bg;

    if (!make_test_cgroup(root, sizeof(root))) {
        fprintf(stderr, "test_cgroups: skipped (no writable cgroup2 with cgroup.kill)\n");
        return;
    }
    peer_start_cgroup(&p, root);
    wait_hello(&p, 1);
    run(&p, 1, &(struct exec_opts){.cmd = "cat /proc/self/cgroup"});
    snprintf(want, sizeof(want), "/%s/cg-", strrchr(root, '/') + 1);
    CHECK(strstr(out_str(&p, 1, 1), want) != NULL);
    /* the next exec gets a cgroup of its own, not the previous one */
    run(&p, 4, &(struct exec_opts){.cmd = "cat /proc/self/cgroup"});
    CHECK(strstr(out_str(&p, 4, 1), want) != NULL &&
          strcmp(out_str(&p, 4, 1), out_str(&p, 1, 1)) != 0);

    send_exec(
        &p, 2,
        &(struct exec_opts){.cmd = "setsid sleep 100 & echo $!; sleep 100", .timeout_ms = 300},
        true);
    bg = first_line_pid(&p, 2, 2000);
    CHECK(peer_wait(&p, 2, 3000) && p.res[2].timed_out);
    CHECK(bg > 0 && pid_gone((pid_t)bg, 2000)); /* out of the group, not out of the cgroup */

    send_exec(&p, 3, &(struct exec_opts){.cmd = "setsid sleep 100 & echo $!; sleep 100"}, true);
    bg = first_line_pid(&p, 3, 2000);
    send_signal(&p, 3, SIGKILL);
    CHECK(peer_wait(&p, 3, 3000) && p.res[3].sig == SIGKILL);
    CHECK(bg > 0 && pid_gone((pid_t)bg, 2000));
    CHECK(peer_stop(&p) == 0);
    /* every cg-<n>, used or made ahead, was removed (after EXIT, or on the way out) */
    CHECK(rmdir(root) == 0);
}

/* ---- v2: background processes, PTYs, rings, attach ---- */

static const char *all_str(struct peer *p, uint32_t id)
{
    struct proto_buf *b = &p->res[id].all;
    proto_buf_append(b, "", 1);
    b->len--;
    return (const char *)b->p + b->off;
}

/* PLIST for pid on stream id until it has exited; returns its entry (NULL on timeout). */
static const struct pent *wait_exited(struct peer *p, uint32_t id, uint64_t pid, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    while (now_ms() < end) {
        send_plist(p, id, pid);
        if (!peer_wait(p, id, 3000) || p->res[id].error || p->res[id].nprocs != 1)
            return NULL;
        if (!p->res[id].procs[0].running)
            return &p->res[id].procs[0];
        peer_step(p, 50);
    }
    return NULL;
}

/* Step until the attach stream id holds at least want bytes (or timeout). */
static void await_all(struct peer *p, uint32_t id, size_t want, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;

    while (proto_buf_pending(&p->res[id].all) < want && !p->res[id].done && now_ms() < end)
        peer_step(p, 50);
}

/* Exchange frames for ms (settle() never ends while a live stream ticks). */
static void step_for(struct peer *p, int ms)
{
    int64_t end = now_ms() + ms;

    while (now_ms() < end)
        peer_step(p, (int)(end - now_ms()));
}

static void reset_res(struct peer *p, uint32_t id)
{
    struct res *r = &p->res[id];

    for (int k = 0; k < 3; k++)
        proto_buf_free(&r->out[k]);
    proto_buf_free(&r->all);
    proto_buf_free(&r->paths);
    memset(r, 0, sizeof(*r));
    r->err = -1;
}

static void test_bg_attach(void)
{
    struct peer p;
    const struct pent *e;
    uint64_t pid;

    peer_start(&p);
    wait_hello(&p, 1);
    pid = start_bg(&p, 1,
                   &(struct exec_opts){.cmd = "printf hello; sleep 0.3; echo err >&2; sleep 0.3; "
                                              "printf world; exit 4",
                                       .tag = "greeter"});
    CHECK(pid > 0 && !p.res[1].error);
    /* the EXEC stream ended with RESULT: nothing else arrives for it */
    e = wait_exited(&p, 2, pid, 10000);
    CHECK(e && e->code == 4 && e->sig == 0 && e->has_code);
    CHECK(e && e->start == 0 && e->end == 14 && !e->pty && !strcmp(e->tag, "greeter"));
    CHECK(e && strstr(e->cmd, "printf hello") == e->cmd && !e->stdin_open);
    /* from 0: the exact bytes in the order read, each with its fd, then EXIT */
    send_attach(&p, 3, pid, 0, true, true);
    CHECK(peer_wait(&p, 3, 5000) && !p.res[3].error && !p.res[3].ended);
    CHECK(strcmp(all_str(&p, 3), "helloerr\nworld") == 0);
    CHECK(strcmp(out_str(&p, 3, 1), "helloworld") == 0 && strcmp(out_str(&p, 3, 2), "err\n") == 0);
    CHECK(p.res[3].code == 4 && p.res[3].sig == 0 && p.res[3].bad_off == 0 && p.res[3].lost == 0);
    /* from a middle offset (inside the stderr line), follow:false on an exited process: EXIT */
    send_attach(&p, 4, pid, 7, false, true);
    CHECK(peer_wait(&p, 4, 5000) && !p.res[4].error && !p.res[4].ended);
    CHECK(strcmp(all_str(&p, 4), "r\nworld") == 0 && p.res[4].bad_off == 0);
    /* from the very end: EXIT at once */
    send_attach(&p, 5, pid, 14, true, true);
    CHECK(peer_wait(&p, 5, 5000) && p.res[5].code == 4 && proto_buf_pending(&p.res[5].all) == 0);
    /* past the end, unknown pid */
    send_attach(&p, 6, pid, 15, true, true);
    CHECK(peer_wait(&p, 6, 5000) && p.res[6].error && p.res[6].err == EINVAL);
    send_attach(&p, 7, 999999999, 0, true, true);
    CHECK(peer_wait(&p, 7, 5000) && p.res[7].error && p.res[7].err == ESRCH);
    send_plist(&p, 8, 999999999);
    CHECK(peer_wait(&p, 8, 5000) && p.res[8].error && p.res[8].err == ESRCH);
    /* a start failure is an ERROR with the errno, as for a foreground exec */
    const char *const bad[] = {"/nonexistent/prog", NULL};
    CHECK(start_bg(&p, 9, &(struct exec_opts){.argv = bad}) == 0);
    CHECK(p.res[9].error && p.res[9].err == ENOENT);
    send_plist(&p, 10, 0);
    CHECK(peer_wait(&p, 10, 5000) && p.res[10].nprocs == 1 && p.res[10].procs[0].pid == pid);
    CHECK(peer_stop(&p) == 0);
}

/* A live reader with credit, follow:false while running (END), DETACH. */
static void test_bg_follow_detach(void)
{
    struct peer p;
    uint64_t pid;

    peer_start(&p);
    wait_hello(&p, 1);
    pid = start_bg(&p, 1, &(struct exec_opts){.cmd = "while :; do echo tick; sleep 0.05; done"});
    CHECK(pid > 0);
    send_attach(&p, 2, pid, 0, true, true);
    await_all(&p, 2, 50, 10000);
    CHECK(!p.res[2].done && proto_buf_pending(&p.res[2].all) >= 50);
    send_detach(&p, 2);
    CHECK(peer_wait(&p, 2, 5000) && p.res[2].ended && p.res[2].bad_off == 0);
    CHECK(strncmp(all_str(&p, 2), "tick\ntick\n", 10) == 0);
    /* DETACH of a stream that already ended: nothing (the harness flags a frame after END) */
    send_detach(&p, 2);
    send_attach(&p, 3, pid, 5, false, true);
    CHECK(peer_wait(&p, 3, 5000) && p.res[3].ended && !p.res[3].error);
    CHECK(strncmp(all_str(&p, 3), "tick\n", 5) == 0 && p.res[3].bad_off == 0);
    /* SIGNAL on an attach stream is not a process signal */
    send_attach(&p, 4, pid, 0, true, true);
    send_signal(&p, 4, SIGKILL);
    step_for(&p, 300);
    CHECK(kill((pid_t)pid, 0) == 0);
    send_detach(&p, 4);
    CHECK(peer_wait(&p, 4, 5000) && p.res[4].ended);
    CHECK(peer_stop(&p) == 0);
    /* the agent returning (not PID 1) ends its background processes too */
    CHECK(pid_gone((pid_t)pid, 3000));
}

static size_t seq_expected(char **out, int n)
{
    size_t cap = (size_t)n * 8 + 1, len = 0;
    char *s = malloc(cap);

    for (int i = 1; i <= n; i++)
        len += (size_t)snprintf(s + len, cap - len, "%d\n", i);
    *out = s;
    return len;
}

/* A ring that wrapped: ATTACH from 0 is told exactly what was lost, then the exact tail. */
static void test_bg_ring_lost(void)
{
    struct peer p;
    const struct pent *e;
    uint64_t pid, start, end;
    char *want;
    size_t wlen = seq_expected(&want, 20000);

    peer_start(&p);
    wait_hello(&p, 1);
    send_init2(&p, 1, 4096, 0); /* never sets the clock: no time_ns */
    wait_hello(&p, 2);
    pid = start_bg(&p, 2, &(struct exec_opts){.cmd = "seq 1 20000"});
    CHECK(pid > 0);
    e = wait_exited(&p, 3, pid, 10000);
    CHECK(e && e->code == 0);
    start = e ? e->start : 0;
    end = e ? e->end : 0;
    CHECK(end == wlen && start > 0 && end - start <= 4096 && end - start >= 4096 - 64);
    send_attach(&p, 4, pid, 0, true, true);
    CHECK(peer_wait(&p, 4, 5000) && !p.res[4].error);
    CHECK(p.res[4].lost == start && p.res[4].lost_frames == 1 && p.res[4].first_lost_off == start);
    CHECK(p.res[4].bad_off == 0 && proto_buf_pending(&p.res[4].all) == end - start);
    CHECK(memcmp(p.res[4].all.p + p.res[4].all.off, want + start, end - start) == 0);
    /* from inside the kept part: no loss */
    send_attach(&p, 5, pid, start + 10, false, true);
    CHECK(peer_wait(&p, 5, 5000) && p.res[5].lost == 0 && p.res[5].bad_off == 0);
    CHECK(proto_buf_pending(&p.res[5].all) == end - start - 10);

    /* A reader without credit falls behind while the process writes 2 MB on: the process is
     * never blocked (it completes), and the reader is told exactly what it lost. */
    free(want);
    wlen = seq_expected(&want, 300000);
    pid = start_bg(&p, 6, &(struct exec_opts){.cmd = "seq 1 300000"});
    CHECK(pid > 0);
    send_attach(&p, 7, pid, 0, true, false); /* no credit returned */
    e = wait_exited(&p, 8, pid, 20000);
    CHECK(e && e->end == wlen);
    start = e ? e->start : 0;
    step_for(&p, 200);
    /* lost bytes cost no credit, so the reader may even have reached the end by now; but it
     * never received more than its window */
    CHECK(proto_buf_pending(&p.res[7].all) <= PROTO_WINDOW);
    send_credit(&p, 7, PROTO_WINDOW);
    p.res[7].auto_credit = true;
    CHECK(peer_wait(&p, 7, 5000) && p.res[7].bad_off == 0 && p.res[7].code == 0);
    {
        struct res *r = &p.res[7];
        size_t got = proto_buf_pending(&r->all);
        CHECK(r->lost > 0 && r->lost + got == wlen && got >= wlen - start);
        CHECK(got >= wlen - start && memcmp(r->all.p + r->all.off + got - (wlen - start),
                                            want + start, wlen - start) == 0);
    }
    free(want);
    CHECK(peer_stop(&p) == 0);
}

static void test_bg_stdin_signal(void)
{
    struct peer p;
    const struct pent *e;
    uint64_t pid, pid2;
    const char *const cat[] = {"cat", NULL};

    peer_start(&p);
    wait_hello(&p, 1);
    pid = start_bg(&p, 1, &(struct exec_opts){.argv = cat});
    CHECK(pid > 0);
    send_attach(&p, 2, pid, 0, true, true);
    send_pctl(&p, 3, pid, "ping\n", 5, false, 0, 0, 0);
    CHECK(peer_wait(&p, 3, 5000) && !p.res[3].error);
    await_all(&p, 2, 5, 5000);
    CHECK(strcmp(all_str(&p, 2), "ping\n") == 0);
    /* exactly one action per PCTL */
    send_pctl(&p, 4, pid, "x", 1, false, SIGTERM, 0, 0);
    CHECK(peer_wait(&p, 4, 5000) && p.res[4].error && p.res[4].err == EINVAL);
    /* resize on a pipe process */
    send_pctl(&p, 4, pid, NULL, 0, false, 0, 80, 24);
    CHECK(peer_wait(&p, 4, 5000) && p.res[4].error && p.res[4].err == EINVAL);
    send_pctl(&p, 4, pid, NULL, 0, false, SIGTERM, 0, 0);
    CHECK(peer_wait(&p, 4, 5000) && !p.res[4].error);
    CHECK(peer_wait(&p, 2, 5000) && p.res[2].code == 128 + SIGTERM && p.res[2].sig == SIGTERM);
    e = wait_exited(&p, 5, pid, 5000);
    CHECK(e && e->sig == SIGTERM && e->code == 128 + SIGTERM && !e->stdin_open);
    /* Exited but still listed: ECHILD, told apart from an unknown pid (ESRCH). */
    send_pctl(&p, 6, pid, NULL, 0, false, SIGTERM, 0, 0);
    CHECK(peer_wait(&p, 6, 5000) && p.res[6].error && p.res[6].err == ECHILD);
    send_pctl(&p, 6, pid, "x", 1, false, 0, 0, 0);
    CHECK(peer_wait(&p, 6, 5000) && p.res[6].error && p.res[6].err == EPIPE);
    send_pctl(&p, 6, 999999999, NULL, 0, false, SIGTERM, 0, 0);
    CHECK(peer_wait(&p, 6, 5000) && p.res[6].error && p.res[6].err == ESRCH);

    /* eof closes stdin: cat ends on its own with code 0 */
    pid2 = start_bg(&p, 7, &(struct exec_opts){.argv = cat});
    send_attach(&p, 8, pid2, 0, true, true);
    send_pctl(&p, 9, pid2, "abc", 3, true, 0, 0, 0);
    CHECK(peer_wait(&p, 9, 5000) && !p.res[9].error);
    CHECK(peer_wait(&p, 8, 5000) && p.res[8].code == 0 && p.res[8].sig == 0);
    CHECK(strcmp(all_str(&p, 8), "abc") == 0);
    send_pctl(&p, 9, pid2, "x", 1, false, 0, 0, 0);
    CHECK(peer_wait(&p, 9, 5000) && p.res[9].error && p.res[9].err == EPIPE);
    CHECK(peer_stop(&p) == 0);
}

static void test_pty(void)
{
    struct peer p;
    uint64_t pid;
    const char *want = "30 100\r\nxterm-256color\r\n\r\n40 120\r\n";

    peer_start(&p);
    wait_hello(&p, 1);
    pid = start_bg(&p, 1,
                   &(struct exec_opts){
                       .cmd = "stty size; echo $TERM; read x; stty size", .cols = 100, .rows = 30});
    CHECK(pid > 0);
    send_attach(&p, 2, pid, 0, true, true);
    await_all(&p, 2, 23, 5000);
    CHECK(strcmp(all_str(&p, 2), "30 100\r\nxterm-256color\r\n") == 0);
    send_pctl(&p, 3, pid, NULL, 0, false, 0, 120, 40);
    CHECK(peer_wait(&p, 3, 5000) && !p.res[3].error);
    send_pctl(&p, 4, pid, NULL, 0, false, 0, 0, 40); /* rows without cols */
    CHECK(peer_wait(&p, 4, 5000) && p.res[4].error && p.res[4].err == EINVAL);
    send_pctl(&p, 4, pid, NULL, 0, false, 0, 10001, 40);
    CHECK(peer_wait(&p, 4, 5000) && p.res[4].error && p.res[4].err == EINVAL);
    send_plist(&p, 5, pid);
    CHECK(peer_wait(&p, 5, 5000) && p.res[5].nprocs == 1 && p.res[5].procs[0].pty);
    CHECK(p.res[5].procs[0].cols == 120 && p.res[5].procs[0].rows == 40);
    send_pctl(&p, 6, pid, "\n", 1, false, 0, 0, 0);
    CHECK(peer_wait(&p, 6, 5000) && !p.res[6].error);
    CHECK(peer_wait(&p, 2, 5000) && p.res[2].code == 0 && p.res[2].bad_off == 0);
    CHECK(strcmp(all_str(&p, 2), want) == 0);
    CHECK(strlen(out_str(&p, 2, 2)) == 0); /* all PTY output is fd 1 */

    /* a login shell when no command is given; eof sends ^D and the shell exits */
    send_exec(&p, 7, &(struct exec_opts){.cols = 80, .rows = 24}, false);
    p.res[7].expect = EXPECT_RESULT;
    CHECK(peer_wait(&p, 7, 5000) && !p.res[7].error && p.res[7].pid > 0);
    pid = p.res[7].pid;
    send_attach(&p, 8, pid, 0, true, true);
    send_pctl(&p, 9, pid, "echo hi-$((6*7))\n", 17, false, 0, 0, 0);
    CHECK(peer_wait(&p, 9, 5000) && !p.res[9].error);
    {
        int64_t end = now_ms() + 5000;
        while (!strstr(all_str(&p, 8), "hi-42") && now_ms() < end)
            peer_step(&p, 50);
    }
    CHECK(strstr(all_str(&p, 8), "hi-42") != NULL);
    send_pctl(&p, 10, pid, NULL, 0, true, 0, 0, 0);
    CHECK(peer_wait(&p, 10, 5000) && !p.res[10].error);
    CHECK(peer_wait(&p, 8, 5000) && p.res[8].code == 0);
    /* a PTY needs both sizes in range */
    send_exec(&p, 11, &(struct exec_opts){.cmd = "true", .cols = 20000, .rows = 24}, false);
    p.res[11].expect = EXPECT_RESULT;
    CHECK(peer_wait(&p, 11, 5000) && p.res[11].error && p.res[11].err == EINVAL);
    CHECK(peer_stop(&p) == 0);
}

/* Attach to a new PTY running cmd and wait (10 s at most) for want bytes of 'x'. Under
 * PROTO_WINDOW no credit is returned, so nothing the peer sends wakes the agent. */
static bool pty_gets_x(struct peer *p, uint32_t id, const char *cmd, size_t want)
{
    uint64_t pid = start_bg(p, id, &(struct exec_opts){.cmd = cmd, .cols = 80, .rows = 24});
    size_t n, x = 0;
    const uint8_t *b;

    if (!pid)
        return false;
    send_attach(p, id + 1, pid, 0, true, want >= PROTO_WINDOW);
    await_all(p, id + 1, want, 10000);
    n = proto_buf_pending(&p->res[id + 1].all);
    b = p->res[id + 1].all.p + p->res[id + 1].all.off;
    for (size_t i = 0; i < n; i++)
        x += b[i] == 'x';
    send_pctl(p, id + 2, pid, NULL, 0, false, SIGKILL, 0, 0);
    return n == want && x == want;
}

/*
 * PTY output the agent holds back (proc.c, proc_read) still arrives when the program
 * goes quiet: output followed by a long sleep arrives during the sleep, from small
 * writes and from big ones (what a hold keeps is read when it ends, with no later
 * write to wake the agent), and 1 MiB arrives byte-exact.
 */
static void test_pty_batches(void)
{
    struct peer p;

    peer_start(&p);
    wait_hello(&p, 1);
    CHECK(pty_gets_x(&p, 2, "i=0; while [ $i -lt 500 ]; do printf x; i=$((i+1)); done; sleep 30",
                     500));
    CHECK(pty_gets_x(&p, 5, "head -c 100000 /dev/zero | tr '\\0' x; sleep 30", 100000));
    CHECK(pty_gets_x(&p, 8, "head -c 1048576 /dev/zero | tr '\\0' x; sleep 30", 1048576));
    CHECK(peer_stop(&p) == 0);
}

/* A PTY's hold after a read: toward GI_PTY_HOLD_BYTES a hold, at most halved or doubled
 * per read, within its bounds. */
static void test_pty_hold(void)
{
    CHECK(gi_pty_hold_next(250, GI_PTY_HOLD_BYTES) == 250);     /* on target: kept */
    CHECK(gi_pty_hold_next(400, GI_PTY_HOLD_BYTES / 2) == 800); /* half: twice as long */
    CHECK(gi_pty_hold_next(250, 1) == 500);                     /* a line: doubled at most */
    CHECK(gi_pty_hold_next(250, 0) == 500);
    CHECK(gi_pty_hold_next(GI_PTY_HOLD_MAX_US, 1) == GI_PTY_HOLD_MAX_US);
    CHECK(gi_pty_hold_next(400, 4 * GI_PTY_HOLD_BYTES) == 200); /* a full tty: halved at most */
    CHECK(gi_pty_hold_next(300, GI_PTY_HOLD_BYTES * 3 / 2) == 200);
    CHECK(gi_pty_hold_next(GI_PTY_HOLD_MIN_US, 1 << 20) == GI_PTY_HOLD_MIN_US);
    CHECK(gi_pty_hold_next(0, 1) == GI_PTY_HOLD_MIN_US); /* never 0: never a busy loop */
    CHECK(gi_pty_hold_next(INT32_MAX, 1) == GI_PTY_HOLD_MAX_US);
}

/* INIT (the resume handshake) keeps background processes, PTYs and their rings. */
static void test_init_keeps_bg(void)
{
    struct peer p;
    uint64_t pid, pty;
    const struct pent *e;
    long fg;

    peer_start(&p);
    wait_hello(&p, 1);
    pid = start_bg(&p, 1, &(struct exec_opts){.cmd = "while :; do echo tick; sleep 0.05; done"});
    pty = start_bg(&p, 2, &(struct exec_opts){.cmd = "cat", .cols = 80, .rows = 24});
    CHECK(pid > 0 && pty > 0);
    send_attach(&p, 3, pid, 0, true, true);
    await_all(&p, 3, 20, 5000);
    send_exec(&p, 4, &(struct exec_opts){.cmd = "sleep 100 & echo $!; wait"}, true);
    fg = first_line_pid(&p, 4, 2000);
    send_init2(&p, 50, 0, 0);
    wait_hello(&p, 2);
    CHECK(p.hello_id == 50);
    /* the foreground exec is gone, and the attach stream ended without a last frame */
    CHECK(fg > 0 && pid_gone((pid_t)fg, 2000));
    step_for(&p, 200);
    CHECK(!p.res[3].done && !p.res[4].done);
    send_plist(&p, 5, 0);
    CHECK(peer_wait(&p, 5, 5000) && p.res[5].nprocs == 2);
    for (size_t i = 0; i < p.res[5].nprocs; i++) {
        e = &p.res[5].procs[i];
        CHECK(e->running && (e->pid == pid || e->pid == pty));
        CHECK(e->started_ms > 0);
    }
    /* re-attach from where the old reader was: continues byte-exact, still counting */
    uint64_t was = p.res[3].next_off;
    reset_res(&p, 3);
    send_attach(&p, 3, pid, was, true, true);
    await_all(&p, 3, 50, 5000);
    CHECK(p.res[3].bad_off == 0 && p.res[3].lost == 0);
    CHECK(strncmp(all_str(&p, 3), "tick\n", 5) == 0);
    send_detach(&p, 3);
    CHECK(peer_wait(&p, 3, 5000));
    /* the PTY still echoes */
    send_attach(&p, 6, pty, 0, true, true);
    send_pctl(&p, 7, pty, "hello\n", 6, false, 0, 0, 0);
    CHECK(peer_wait(&p, 7, 5000) && !p.res[7].error);
    await_all(&p, 6, 14, 5000);
    CHECK(strcmp(all_str(&p, 6), "hello\r\nhello\r\n") == 0);
    send_pctl(&p, 8, pty, NULL, 0, false, SIGKILL, 0, 0);
    CHECK(peer_wait(&p, 8, 5000) && !p.res[8].error);
    CHECK(peer_wait(&p, 6, 5000) && p.res[6].sig == SIGKILL);
    CHECK(peer_stop(&p) == 0);
    CHECK(pid_gone((pid_t)pid, 3000));
}

/*
 * RESYNC is not INIT: a foreground exec reading stdin, its stream and a
 * background process all carry on across it, and it is answered RESULT on
 * its own id (the agent is not PID 1 here, so the host's clock, RNG and
 * hostname are left alone). A RESYNC the decoder refuses (no entropy, a bad
 * boot id) is dropped unanswered, and the agent keeps serving.
 */
static void test_resync(void)
{
    struct peer p;
    uint64_t pid;

    peer_start(&p);
    wait_hello(&p, 1);
    pid = start_bg(&p, 1, &(struct exec_opts){.cmd = "while :; do sleep 0.05; done"});
    CHECK(pid > 0);
    send_exec(&p, 2, &(struct exec_opts){.cmd = "cat", .stdin_pipe = true}, true);
    send_stdin(&p, 2, "one\n", 4, false);
    send_resync(&p, 3, PROTO_ENTROPY, "0123abcd-4567-89ef-0123-456789abcdef", "not-the-host");
    CHECK(peer_wait(&p, 3, 5000) && !p.res[3].error);
    send_resync(&p, 4, 1, NULL, NULL);
    CHECK(peer_wait(&p, 4, 5000) && !p.res[4].error);
    /* refused by the decoder: no answer, nothing else disturbed */
    send_resync(&p, 5, 0, NULL, NULL);
    send_resync(&p, 6, PROTO_ENTROPY + 1, NULL, NULL);
    send_resync(&p, 7, 8, "not-a-uuid", NULL);
    send_simple(&p, PROTO_PING, 8, NULL, EXPECT_PONG);
    CHECK(peer_wait(&p, 8, 5000));
    CHECK(!p.res[5].done && !p.res[6].done && !p.res[7].done);
    send_stdin(&p, 2, "two\n", 4, true);
    CHECK(peer_wait(&p, 2, 5000) && !p.res[2].error && p.res[2].code == 0);
    CHECK(strcmp(out_str(&p, 2, 1), "one\ntwo\n") == 0);
    send_plist(&p, 9, pid);
    CHECK(peer_wait(&p, 9, 5000) && p.res[9].nprocs == 1 && p.res[9].procs[0].running);
    CHECK(peer_stop(&p) == 0);
    CHECK(pid_gone((pid_t)pid, 3000));
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    CHECK(f && fputs(text, f) >= 0);
    if (f)
        fclose(f);
}

/*
 * RESYNC's boot id, as PID 1 applies it to /proc/sys/kernel/random/boot_id,
 * on a stand-in file in a private mount namespace: the first id is written
 * and bind-mounted over the target, the next one shows through the same
 * mount, and outside the namespace the target is untouched.
 */
static void test_resync_boot_id(void)
{
    static const char id1[] = "0123abcd-4567-89ef-0123-456789abcdef",
                      id2[] = "fedcba98-7654-4321-8765-43210fedcba9";
    char file[300], target[300], want[64];
    struct peer p;
    const char *cat[] = {"cat", target, NULL};
    FILE *f;

    if (!can_unshare_mounts()) {
        fprintf(stderr, "resync_boot_id: skipped (no private mount namespace here)\n");
        return;
    }
    snprintf(file, sizeof(file), "%s/boot_id", tmpdir);
    snprintf(target, sizeof(target), "%s/kernel_boot_id", tmpdir);
    write_file(target, "kernel\n");
    peer_start_boot_id(&p, file, target);
    wait_hello(&p, 1);
    send_resync(&p, 2, 8, id1, NULL);
    CHECK(peer_wait(&p, 2, 5000) && !p.res[2].error);
    run(&p, 3, &(struct exec_opts){.argv = cat});
    snprintf(want, sizeof(want), "%s\n", id1);
    CHECK(strcmp(out_str(&p, 3, 1), want) == 0);
    send_resync(&p, 4, 8, id2, NULL);
    CHECK(peer_wait(&p, 4, 5000) && !p.res[4].error);
    run(&p, 5, &(struct exec_opts){.argv = cat});
    snprintf(want, sizeof(want), "%s\n", id2);
    CHECK(strcmp(out_str(&p, 5, 1), want) == 0);
    CHECK(peer_stop(&p) == 0);
    /* the mount was the agent's own */
    f = fopen(target, "r");
    CHECK(f && fgets(want, sizeof(want), f) && strcmp(want, "kernel\n") == 0);
    if (f)
        fclose(f);
}

/* max_procs: the oldest exited entry is evicted; if all run, EMFILE. */
static void test_max_procs(void)
{
    struct peer p;
    uint64_t a, b, c;

    peer_start(&p);
    wait_hello(&p, 1);
    send_init2(&p, 1, 0, 2);
    wait_hello(&p, 2);
    a = start_bg(&p, 2, &(struct exec_opts){.cmd = "echo a"});
    b = start_bg(&p, 3, &(struct exec_opts){.cmd = "sleep 100"});
    CHECK(a > 0 && b > 0 && wait_exited(&p, 4, a, 5000));
    c = start_bg(&p, 5, &(struct exec_opts){.cmd = "sleep 100"});
    CHECK(c > 0);
    send_plist(&p, 6, 0);
    CHECK(peer_wait(&p, 6, 5000) && p.res[6].nprocs == 2);
    CHECK(p.res[6].procs[0].pid != a && p.res[6].procs[1].pid != a);
    send_attach(&p, 7, a, 0, true, true);
    CHECK(peer_wait(&p, 7, 5000) && p.res[7].error && p.res[7].err == ESRCH);
    CHECK(start_bg(&p, 8, &(struct exec_opts){.cmd = "sleep 100"}) == 0);
    CHECK(p.res[8].error && p.res[8].err == EMFILE);
    /* a later INIT lowers max_procs to 1: the next start evicts both exited entries */
    send_pctl(&p, 9, b, NULL, 0, false, SIGKILL, 0, 0);
    CHECK(peer_wait(&p, 9, 5000) && !p.res[9].error);
    send_pctl(&p, 9, c, NULL, 0, false, SIGKILL, 0, 0);
    CHECK(peer_wait(&p, 9, 5000) && !p.res[9].error);
    CHECK(wait_exited(&p, 10, b, 5000) && wait_exited(&p, 10, c, 5000));
    send_init2(&p, 11, 0, 1);
    wait_hello(&p, 3);
    a = start_bg(&p, 12, &(struct exec_opts){.cmd = "sleep 100"});
    CHECK(a > 0);
    send_plist(&p, 13, 0);
    CHECK(peer_wait(&p, 13, 5000) && p.res[13].nprocs == 1 && p.res[13].procs[0].pid == a);
    CHECK(peer_stop(&p) == 0);
    CHECK(pid_gone((pid_t)a, 3000) && pid_gone((pid_t)b, 3000) && pid_gone((pid_t)c, 3000));
}

/* Random sequences of v2 frames (valid and not) at live and bogus pids: the agent answers
 * every request exactly once (the harness flags frames after a stream's last one), offsets
 * stay contiguous, and it still answers PING. A sequence fuzz of the guest side. */
static void test_v2_random(void)
{
    static bool resync[MAX_IDS]; /* ids of valid RESYNCs, each must be answered RESULT */
    struct peer p;
    uint64_t pids[4];
    uint32_t x = 7;

    peer_start(&p);
    wait_hello(&p, 1);
    send_init2(&p, 1, 4096, 8);
    wait_hello(&p, 2);
    pids[0] =
        start_bg(&p, 2, &(struct exec_opts){.cmd = "while :; do echo tick; sleep 0.01; done"});
    pids[1] = start_bg(&p, 3, &(struct exec_opts){.cmd = "seq 1 2000"}); /* 8893 bytes */
    CHECK(wait_exited(&p, 5, pids[1], 5000));
    pids[2] = start_bg(&p, 4, &(struct exec_opts){.cmd = "cat", .cols = 80, .rows = 24});
    pids[3] = 999999999;
    CHECK(pids[0] && pids[1] && pids[2]);
    for (uint32_t id = 100; id < MAX_IDS - 1; id++) {
        uint64_t pid = pids[(x = x * 1103515245u + 12345u) >> 16 & 3];
        uint32_t r = (x = x * 1103515245u + 12345u) >> 8;
        switch (r % 7) {
        case 0:
        case 1:
            send_attach(&p, id, pid, (r >> 4) % 9000, r & 8, r & 16);
            break;
        case 6:
            /* RESYNC amid it all, valid (RESULT) or refused by the decoder (no answer) */
            send_resync(&p, id, (r >> 4) % (PROTO_ENTROPY + 2),
                        r & 8 ? "0123abcd-4567-89ef-0123-456789abcdef" : NULL, r & 16 ? "h" : NULL);
            resync[id] = (r >> 4) % (PROTO_ENTROPY + 2) != 0 &&
                         (r >> 4) % (PROTO_ENTROPY + 2) <= PROTO_ENTROPY;
            if (!resync[id])
                p.res[id].done = true; /* refused: nothing to wait for */
            break;
        case 2:
            send_plist(&p, id, r & 8 ? pid : 0);
            break;
        case 3:
            send_pctl(&p, id, pid, r & 8 ? "abc\n" : NULL, 4, r & 16, 0, 0, 0);
            break;
        case 4:
            /* signals that keep the processes (SIGWINCH, SIGCONT) or bad ones, or a size */
            send_pctl(&p, id, pid, NULL, 0, false, (r & 8) ? ((r >> 4) % 2 ? 28 : 18) : 0,
                      (r & 8) ? 0 : (r >> 5) % 12000, (r & 8) ? 0 : (r >> 7) % 50);
            break;
        default:
            send_detach(&p, 100 + (r >> 4) % (id - 99));
            send_credit(&p, 100 + (r >> 4) % (id - 99), r >> 12);
            p.res[id].done = true; /* nothing to wait for on this id */
            break;
        }
        if (id % 16 == 0)
            peer_step(&p, 10);
    }
    send_simple(&p, PROTO_PING, MAX_IDS - 1, NULL, EXPECT_PONG);
    CHECK(peer_wait(&p, MAX_IDS - 1, 10000));
    step_for(&p, 300);
    {
        int data = 0, ok = 0, err = 0;
        for (uint32_t id = 100; id < MAX_IDS - 1; id++) {
            CHECK(p.res[id].bad_off == 0);
            data += proto_buf_pending(&p.res[id].all) > 0;
            ok += p.res[id].have_result && !p.res[id].error;
            err += p.res[id].error;
        }
        int resynced = 0;
        for (uint32_t id = 100; id < MAX_IDS - 1; id++) {
            if (!resync[id])
                continue;
            CHECK(p.res[id].done && p.res[id].have_result && !p.res[id].error);
            resynced++;
        }
        fprintf(stderr, "v2_random: %d readers with data, %d RESULT, %d ERROR, %d resyncs\n", data,
                ok, err, resynced);
        CHECK(data > 10 && ok > 10 && err > 10 && resynced > 10);
    }
    CHECK(peer_stop(&p) == 0);
    for (int i = 0; i < 3; i++)
        CHECK(pid_gone((pid_t)pids[i], 3000));
}

/* The most entries (GI_PROCS_MAX), each with the longest tag and a command past the cut:
 * PLIST still answers in one frame. */
static void test_plist_fits(void)
{
    struct peer p;
    char tag[PROTO_TAG_MAX + 1], cmd[2100] = "";
    uint64_t pid = 0;

    peer_start(&p);
    wait_hello(&p, 1);
    send_init2(&p, 1, 0, 100000); /* clamped to GI_PROCS_MAX (128) */
    wait_hello(&p, 2);
    memset(tag, 0xc3, PROTO_TAG_MAX); /* not UTF-8 as a whole; the guest does not judge tags */
    tag[PROTO_TAG_MAX] = '\0';
    /* 11 bytes, then 2-byte characters: byte 1024 falls inside one */
    strcpy(cmd, "sleep 100 #");
    for (int i = 0; i < 1000; i++)
        strcat(cmd, "\xc3\xa9");
    for (uint32_t id = 2; id < 2 + 128; id++) {
        pid = start_bg(&p, id, &(struct exec_opts){.cmd = cmd, .tag = tag});
        CHECK(pid > 0);
    }
    CHECK(start_bg(&p, 200, &(struct exec_opts){.cmd = "true"}) == 0 && p.res[200].err == EMFILE);
    send_plist(&p, 201, 0);
    CHECK(peer_wait(&p, 201, 10000) && !p.res[201].error && p.res[201].procs_total == 128);
    send_plist(&p, 202, pid);
    CHECK(peer_wait(&p, 202, 10000) && p.res[202].nprocs == 1);
    CHECK(p.res[202].procs[0].cmd_len == 1023); /* cut before the split character */
    CHECK(peer_stop(&p) == 0);
}

static void cleanup_tmp(void)
{
    char cmd[128];

    if (getpid() != main_pid)
        return; /* a forked agent or test child exiting */
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
}

int main(int argc, char **argv)
{
    struct {
        const char *name;
        void (*fn)(void);
    } tests[] = {
        {"hello_init_ping", test_hello_init_ping},
        {"bad_frames", test_bad_frames},
        {"exec_basic", test_exec_basic},
        {"spawn_guard", test_spawn_guard},
        {"timeout_and_signal", test_timeout_and_signal},
        {"flow_control", test_flow_control},
        {"stdin_cat", test_stdin_cat},
        {"file_roundtrip", test_file_roundtrip},
        {"stat_list", test_stat_list},
        {"mkdir_remove_rename", test_mkdir_remove_rename},
        {"file_errors", test_file_errors},
        {"enospc", test_enospc},
        {"many_streams", test_many_streams},
        {"sessions", test_sessions},
        {"cgroups", test_cgroups},
        {"pid1_hangup", test_pid1_hangup},
        {"oversized_frame", test_oversized_frame},
        {"bg_attach", test_bg_attach},
        {"bg_follow_detach", test_bg_follow_detach},
        {"bg_ring_lost", test_bg_ring_lost},
        {"bg_stdin_signal", test_bg_stdin_signal},
        {"pty", test_pty},
        {"pty_hold", test_pty_hold},
        {"pty_batches", test_pty_batches},
        {"init_keeps_bg", test_init_keeps_bg},
        {"max_procs", test_max_procs},
        {"v2_random", test_v2_random},
        {"plist_fits", test_plist_fits},
        {"resync", test_resync},
        {"resync_boot_id", test_resync_boot_id},
    };

    signal(SIGPIPE, SIG_IGN);
    main_pid = getpid();
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/gi-agent-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 2;
    }
    atexit(cleanup_tmp); /* also when the harness gives up with exit(2) */
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        int before = failures;
        int64_t t0 = now_ms();

        /* an argument runs only the tests whose name contains it */
        if (argc > 1 && !strstr(tests[i].name, argv[1]))
            continue;
        tests[i].fn();
        fprintf(stderr, "%-22s %s (%lld ms)\n", tests[i].name, failures == before ? "ok" : "FAIL",
                (long long)(now_ms() - t0));
    }
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
