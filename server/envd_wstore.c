/*
 * envd_wstore.c - see envd_wstore.h.
 */
#include "envd_wstore.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OFF_MAX_CHARS 24 /* 20 digits, a newline, and room to tell "too long" */

static int path_of(const char *dir, const char *sbx, uint32_t pid, const char *suffix, char *buf,
                   size_t cap)
{
    int n = snprintf(buf, cap, "%s/" ENVD_WSTORE_DIR "/%s.%" PRIu32 "%s", dir, sbx, pid, suffix);
    /* a sandbox id is [A-Za-z0-9_-]: never a path of its own */
    if (n < 0 || (size_t)n >= cap || strchr(sbx, '/') || sbx[0] == '.' || !sbx[0])
        return -ENAMETOOLONG;
    return 0;
}

int envd_wstore_save(const char *state_dir, const char *sbx, uint32_t pid, uint64_t off)
{
    char path[PATH_MAX], tmp[PATH_MAX], line[OFF_MAX_CHARS];
    int fd, n, r;

    if ((r = path_of(state_dir, sbx, pid, "", path, sizeof(path))) ||
        (r = path_of(state_dir, sbx, pid, ".tmp", tmp, sizeof(tmp))))
        return r;
    {
        char d[PATH_MAX];
        snprintf(d, sizeof(d), "%s/" ENVD_WSTORE_DIR, state_dir);
        if (mkdir(d, 0700) && errno != EEXIST)
            return -errno;
    }
    n = snprintf(line, sizeof(line), "%" PRIu64 "\n", off);
    if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
        return -errno;
    if (write(fd, line, (size_t)n) != n) {
        r = errno ? -errno : -EIO;
        close(fd);
        unlink(tmp);
        return r;
    }
    if (close(fd) || rename(tmp, path)) {
        r = -errno;
        unlink(tmp);
        return r;
    }
    return 0;
}

int envd_wstore_load(const char *state_dir, const char *sbx, uint32_t pid, uint64_t *off)
{
    char path[PATH_MAX], line[OFF_MAX_CHARS], *end;
    ssize_t n;
    int fd, r;
    unsigned long long v;

    if ((r = path_of(state_dir, sbx, pid, "", path, sizeof(path))))
        return r == -ENAMETOOLONG ? -ENOENT : r;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
        return errno == ENOENT ? -ENOENT : -EINVAL;
    n = read(fd, line, sizeof(line) - 1);
    close(fd);
    if (n < 2 || n >= (ssize_t)sizeof(line) - 1 || line[n - 1] != '\n' || line[0] < '0' ||
        line[0] > '9')
        return -EINVAL;
    line[n - 1] = '\0';
    errno = 0;
    v = strtoull(line, &end, 10);
    if (errno || *end)
        return -EINVAL;
    *off = (uint64_t)v;
    return 0;
}

void envd_wstore_del(const char *state_dir, const char *sbx, uint32_t pid)
{
    char path[PATH_MAX];

    if (!path_of(state_dir, sbx, pid, "", path, sizeof(path)))
        unlink(path);
}

void envd_wstore_sweep(const char *state_dir, bool (*live)(void *ud, const char *sbx), void *ud)
{
    char d[PATH_MAX];
    DIR *dir;
    struct dirent *de;

    snprintf(d, sizeof(d), "%s/" ENVD_WSTORE_DIR, state_dir);
    if (!(dir = opendir(d)))
        return;
    while ((de = readdir(dir))) {
        char sbx[NAME_MAX + 1], *dot;
        if (de->d_name[0] == '.')
            continue;
        snprintf(sbx, sizeof(sbx), "%s", de->d_name);
        if (!(dot = strchr(sbx, '.')))
            continue;
        *dot = '\0';
        if (!live(ud, sbx))
            unlinkat(dirfd(dir), de->d_name, 0);
    }
    closedir(dir);
}
