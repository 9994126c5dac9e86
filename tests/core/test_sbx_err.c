/*
 * test_sbx_err.c - the one table from a core error code to its stable name
 * (core/sbx_err.c): every code has a row, names are unique, and the names
 * clients already see stay what they were. The REST door's HTTP statuses are
 * tests/server/test_apierr.c's.
 */
#include "sbx_err.h"
#include "check.h"

#include <stdio.h>
#include <string.h>

int failures;

static void test_every_code(void)
{
    for (int c = 1; c < SBX_E__COUNT; c++) {
        const char *n = sbx_err_name((enum sbx_errcode)c);
        CHECK(c == SBX_E_INTERNAL || strcmp(n, "internal") != 0); /* a row, not the default */
        for (int d = 1; d < c; d++)
            CHECK(strcmp(n, sbx_err_name((enum sbx_errcode)d)) != 0);
    }
    /* Out of range: the safe answer. */
    CHECK(!strcmp(sbx_err_name(SBX_E__COUNT), "internal"));
}

/* What the REST API answered before the codes existed: pinned. */
static void test_stable(void)
{
    static const struct {
        enum sbx_errcode c;
        const char *n;
    } pin[] = {
        {SBX_E_INVALID_ARGUMENT, "invalid_argument"},
        {SBX_E_NOT_FOUND, "sandbox_not_found"},
        {SBX_E_FILE_NOT_FOUND, "file_not_found"},
        {SBX_E_GONE, "sandbox_ended"},
        {SBX_E_DEAD, "sandbox_dead"},
        {SBX_E_CONFLICT, "busy"},
        {SBX_E_TOO_LARGE, "env_metadata_too_large"},
        {SBX_E_TOO_MANY_OPERATIONS, "too_many_operations"},
        {SBX_E_PROTOCOL_VIOLATION, "protocol_violation"},
        {SBX_E_CHANNEL_LOST, "guest_channel_lost"},
        {SBX_E_NOT_READY, "sandbox_not_ready"},
        {SBX_E_DISK_FULL, "disk_full"},
    };
    for (size_t i = 0; i < sizeof(pin) / sizeof(pin[0]); i++) {
        CHECK(!strcmp(sbx_err_name(pin[i].c), pin[i].n));
    }
}

static void test_set(void)
{
    struct sbx_err e;
    char big[1000];

    CHECK(sbx_err_set(&e, SBX_E_NOT_FOUND, "no sandbox with id '%s'", "x") == SBX_E_NOT_FOUND);
    CHECK(e.code == SBX_E_NOT_FOUND && !strcmp(e.msg, "no sandbox with id 'x'"));
    CHECK(sbx_err_set(NULL, SBX_E_INTERNAL, "ignored") == SBX_E_INTERNAL);
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    sbx_err_set(&e, SBX_E_GUEST_ERROR, "%s", big);
    CHECK(strlen(e.msg) == SBX_ERR_MSG_MAX - 1);
}

int main(void)
{
    test_every_code();
    test_stable();
    test_set();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("sbx_err: all checks passed\n");
    return 0;
}
