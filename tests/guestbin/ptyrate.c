/*
 * ptyrate.c - how fast the guest's own kernel moves bytes through a PTY.
 *
 * Uploaded into a sandbox by load/pty_out.py, which prints it beside what
 * warrend delivers over the PTY WebSocket: the ceiling a PTY socket can
 * reach in that guest, with no agent, channel or host in the path. A child
 * writes BYTES to a new PTY's slave in BLOCK-byte writes (as `dd` does);
 * this process reads the master as fast as it can and throws the bytes
 * away. MODE is the slave's output settings: `cooked` (a new PTY's
 * defaults: OPOST and ONLCR, what a shell's programs write through),
 * `noopost` (output processing off) or `raw` (cfmakeraw).
 *
 *     ptyrate MODE BYTES BLOCK  ->  "MODE BYTES READS SECONDS"
 *
 * Static, unsanitized: the guest has no libc or sanitizer runtime of ours.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void writer(int slave, long total, long block)
{
    char *b = malloc((size_t)block);
    if (!b)
        _exit(1);
    memset(b, 'x', (size_t)block);
    while (total > 0) {
        ssize_t n = write(slave, b, (size_t)(total < block ? total : block));
        if (n <= 0)
            _exit(1);
        total -= n;
    }
    _exit(0);
}

int main(int argc, char **argv)
{
    long total = argc == 4 ? atol(argv[2]) : 0, block = argc == 4 ? atol(argv[3]) : 0;
    if (argc != 4 || total <= 0 || block <= 0 || block > (1L << 24) ||
        (strcmp(argv[1], "cooked") && strcmp(argv[1], "noopost") && strcmp(argv[1], "raw"))) {
        fprintf(stderr, "usage: ptyrate cooked|noopost|raw BYTES BLOCK\n");
        return 2;
    }
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0 || grantpt(m) || unlockpt(m)) {
        perror("ptyrate: posix_openpt");
        return 1;
    }
    int s = open(ptsname(m), O_RDWR | O_NOCTTY);
    struct termios t;
    if (s < 0 || tcgetattr(s, &t)) {
        perror("ptyrate: slave");
        return 1;
    }
    if (!strcmp(argv[1], "noopost"))
        t.c_oflag &= ~(tcflag_t)OPOST;
    else if (!strcmp(argv[1], "raw"))
        cfmakeraw(&t);
    if (tcsetattr(s, TCSANOW, &t)) {
        perror("ptyrate: tcsetattr");
        return 1;
    }
    double t0 = now();
    pid_t p = fork();
    if (p < 0) {
        perror("ptyrate: fork");
        return 1;
    }
    if (p == 0) {
        close(m);
        writer(s, total, block);
    }
    close(s);
    static char buf[1 << 16];
    long got = 0, reads = 0;
    while (got < total) {
        ssize_t n = read(m, buf, sizeof buf);
        if (n <= 0)
            break;
        got += n;
        reads++;
    }
    int st = 0;
    waitpid(p, &st, 0);
    double secs = now() - t0;
    printf("%s %ld %ld %.6f\n", argv[1], got, reads, secs);
    return got == total && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
