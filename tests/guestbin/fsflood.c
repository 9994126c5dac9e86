/*
 * fsflood.c - a flood of file events for the file-watch tests, far faster
 * than a shell loop under TCG (BusyBox forks for every touch).
 *
 *   fsflood churn DIR N   N times: create DIR/f<i%16>, write a byte, close,
 *                         unlink (create, write and remove events, no inodes left)
 *   fsflood write FILE N  N one-byte writes to FILE (what coalescing folds)
 *
 * Static, unsanitized: the guest has no libc or sanitizer runtime of ours.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    char *end, name[4096];
    unsigned long n;
    int fd;

    errno = 0;
    n = argc == 4 ? strtoul(argv[3], &end, 10) : 0;
    if (argc != 4 || errno || *end || !n) {
        fprintf(stderr, "usage: fsflood churn DIR N | fsflood write FILE N\n");
        return 2;
    }
    if (!strcmp(argv[1], "write")) {
        if ((fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
            return perror(argv[2]), 1;
        for (unsigned long i = 0; i < n; i++)
            if (pwrite(fd, "x", 1, (off_t)(i % 4096)) != 1)
                return perror("write"), 1;
        return close(fd) ? 1 : 0;
    }
    if (strcmp(argv[1], "churn"))
        return 2;
    for (unsigned long i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s/f%lu", argv[2], i % 16);
        if ((fd = open(name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
            return perror(name), 1;
        if (write(fd, "x", 1) != 1 || close(fd) || unlink(name))
            return perror(name), 1;
    }
    return 0;
}
