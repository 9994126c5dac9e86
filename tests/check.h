/*
 * check.h - the assertion of the C tests: report the failed condition with
 * its place, count it, and keep going so one run shows every failure.
 * Each test program defines `int failures;` once and exits non-zero if it
 * is not 0.
 */
#ifndef WARREN_TEST_CHECK_H
#define WARREN_TEST_CHECK_H

#include <stdio.h>

extern int failures;

#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);                  \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

#endif
