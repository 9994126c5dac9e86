/*
 * Unit test of server/envd_wstore.c: an offset saved is read back, replaced
 * whole, removed; a record that is not one (empty, not a number, too long) is
 * refused, not read as 0; ids that would be paths are refused; the sweep
 * removes the records of the sandboxes said not live and keeps the others.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "envd_wstore.h"

int failures;
#include "check.h"

static bool live_only_a(void *ud, const char *sbx)
{
    (void)ud;
    return !strcmp(sbx, "sbxA");
}

static void put(const char *dir, const char *name, const char *text)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/" ENVD_WSTORE_DIR "/%s", dir, name);
    f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

int main(void)
{
    char dir[] = "/tmp/wstore-XXXXXX";
    uint64_t off = 7;

    CHECK(mkdtemp(dir) != NULL);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == -ENOENT && off == 7);
    CHECK(envd_wstore_save(dir, "sbxA", 5, 0) == 0);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == 0 && off == 0);
    CHECK(envd_wstore_save(dir, "sbxA", 5, 18446744073709551615ULL) == 0);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == 0 && off == 18446744073709551615ULL);
    CHECK(envd_wstore_save(dir, "sbxA", 5, 4096) == 0);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == 0 && off == 4096);
    /* another pid, another sandbox: records of their own */
    CHECK(envd_wstore_save(dir, "sbxA", 6, 1) == 0);
    CHECK(envd_wstore_save(dir, "sbxB", 5, 2) == 0);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == 0 && off == 4096);
    CHECK(envd_wstore_load(dir, "sbxB", 5, &off) == 0 && off == 2);

    /* not records: empty, torn, not decimal, overflowing, too long */
    static const char *bad[] = {"",
                                "12",
                                "x1\n",
                                "-1\n",
                                "1 2\n",
                                "18446744073709551616\n",
                                "000000000000000000000000001\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        put(dir, "sbxC.9", bad[i]);
        CHECK(envd_wstore_load(dir, "sbxC", 9, &off) == -EINVAL);
    }
    envd_wstore_del(dir, "sbxC", 9);
    CHECK(envd_wstore_load(dir, "sbxC", 9, &off) == -ENOENT);

    /* an id that would be a path */
    CHECK(envd_wstore_save(dir, "../x", 1, 1) < 0);
    CHECK(envd_wstore_save(dir, "", 1, 1) < 0);
    CHECK(envd_wstore_load(dir, "../x", 1, &off) == -ENOENT);

    /* the sweep keeps the live sandbox's records only */
    envd_wstore_sweep(dir, live_only_a, NULL);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == 0 && off == 4096);
    CHECK(envd_wstore_load(dir, "sbxA", 6, &off) == 0 && off == 1);
    CHECK(envd_wstore_load(dir, "sbxB", 5, &off) == -ENOENT);

    envd_wstore_del(dir, "sbxA", 5);
    envd_wstore_del(dir, "sbxA", 6);
    CHECK(envd_wstore_load(dir, "sbxA", 5, &off) == -ENOENT);
    {
        char d[512];
        snprintf(d, sizeof(d), "%s/" ENVD_WSTORE_DIR, dir);
        CHECK(rmdir(d) == 0); /* nothing left behind, no temporary file */
        CHECK(rmdir(dir) == 0);
    }
    if (failures)
        fprintf(stderr, "%d failures\n", failures);
    return failures != 0;
}
