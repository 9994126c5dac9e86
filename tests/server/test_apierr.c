/*
 * test_apierr.c - the REST door's one table from a core error code to its HTTP
 * status (server/apierr.c): every code has a row, and the statuses clients
 * already see stay what they were.
 */
#include "api.h"
#include "check.h"

#include <stdio.h>
#include <string.h>

int failures;

static void test_every_code(void)
{
    for (int c = 1; c < SBX_E__COUNT; c++) {
        int st = api_status_of((enum sbx_errcode)c);
        CHECK(st >= 400 && st <= 599);
    }
    /* Out of range: the safe answer. */
    CHECK(api_status_of(SBX_E__COUNT) == 500);
}

/* What the REST API answered before the codes existed: pinned. */
static void test_stable(void)
{
    static const struct {
        enum sbx_errcode c;
        int st;
    } pin[] = {
        {SBX_E_INVALID_ARGUMENT, 400},
        {SBX_E_NOT_FOUND, 404},
        {SBX_E_FILE_NOT_FOUND, 404},
        {SBX_E_GONE, 409},
        {SBX_E_DEAD, 409},
        {SBX_E_CONFLICT, 409},
        {SBX_E_TOO_LARGE, 413},
        {SBX_E_TOO_MANY_OPERATIONS, 429},
        {SBX_E_PROTOCOL_VIOLATION, 502},
        {SBX_E_CHANNEL_LOST, 502},
        {SBX_E_NOT_READY, 503},
        {SBX_E_DISK_FULL, 507},
    };
    for (size_t i = 0; i < sizeof(pin) / sizeof(pin[0]); i++)
        CHECK(api_status_of(pin[i].c) == pin[i].st);
}

int main(void)
{
    test_every_code();
    test_stable();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("apierr: all checks passed\n");
    return 0;
}
