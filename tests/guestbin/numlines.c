/*
 * numlines.c - print the integers FIRST..LAST, one per line, like `seq`.
 *
 * Uploaded into sandboxes by tests that need a large, checkable stream of
 * ordered lines. The guest's own seq is BusyBox's, which formats every
 * number through floating point: under TCG that costs ~8 µs a line, so
 * the 25 million lines of test_exec's 200 MiB stream took ~200 s of guest
 * CPU before a byte of it was checked. This prints the same bytes with
 * integer arithmetic only, through stdio (the same 4 KiB pipe writes).
 * Static, unsanitized: the guest has no libc or sanitizer runtime of ours.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

static int parse(const char *s, unsigned long long *out)
{
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    return (errno || end == s || *end || *s == '-') ? -1 : 0;
}

int main(int argc, char **argv)
{
    unsigned long long first, last;
    if (argc != 3 || parse(argv[1], &first) || parse(argv[2], &last)) {
        fprintf(stderr, "usage: numlines FIRST LAST (non-negative integers)\n");
        return 2;
    }
    for (unsigned long long i = first; i <= last && i >= first; i++) {
        char buf[24], *p = buf + sizeof buf;
        unsigned long long v = i;
        *--p = '\n';
        do
            *--p = (char)('0' + v % 10);
        while ((v /= 10) != 0);
        if (fwrite(p, 1, (size_t)(buf + sizeof buf - p), stdout) == 0)
            return 1;
    }
    return fflush(stdout) == 0 ? 0 : 1;
}
