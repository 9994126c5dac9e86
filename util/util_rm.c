/* util_rm.c - emptying and removing a run directory (util.h). */
#include <dirent.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

void util_rm_dir(const char *dir, bool (*keep)(const char *name))
{
    DIR *d = opendir(dir);
    struct dirent *e;

    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (keep && keep(e->d_name))
            continue;
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
    if (!keep)
        rmdir(dir);
}
