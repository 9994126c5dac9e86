/* apierr.c - the one shape of every API error body, and the HTTP status of each core
 * error code (declared in api.h). */
#include "api.h"
#include "sbx_err.h"

#include <stdarg.h>
#include <stdio.h>

json_t *api_error(const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg);
}

json_t *api_error_of(const struct sbx_err *e)
{
    return api_error(sbx_err_name(e->code), "%s", e->msg);
}

/* The REST door's one table from a core error code to its HTTP status. */
static const short status[SBX_E__COUNT] = {
    [SBX_OK] = 200,
    [SBX_E_BAD_REQUEST] = 400,
    [SBX_E_INVALID_ARGUMENT] = 400,
    [SBX_E_UNKNOWN_TEMPLATE] = 400,
    [SBX_E_EXEC_FAILED] = 400,
    [SBX_E_IS_A_DIRECTORY] = 400,
    [SBX_E_NOT_A_DIRECTORY] = 400,
    [SBX_E_TOO_MANY_SYMLINKS] = 400,
    [SBX_E_CROSS_DEVICE] = 400,
    [SBX_E_PERMISSION_DENIED] = 403,
    [SBX_E_READ_ONLY] = 403,
    [SBX_E_NOT_FOUND] = 404,
    [SBX_E_FILE_NOT_FOUND] = 404,
    [SBX_E_GONE] = 409,
    [SBX_E_DEAD] = 409,
    [SBX_E_FILE_EXISTS] = 409,
    [SBX_E_DIRECTORY_NOT_EMPTY] = 409,
    [SBX_E_CONFLICT] = 409,
    [SBX_E_TOO_LARGE] = 413,
    [SBX_E_TOO_MANY_SANDBOXES] = 429,
    [SBX_E_TOO_MANY_OPERATIONS] = 429,
    [SBX_E_MEMORY_EXHAUSTED] = 429,
    [SBX_E_INTERNAL] = 500,
    [SBX_E_INDEX_WRITE_FAILED] = 500,
    [SBX_E_VM_START_FAILED] = 500,
    [SBX_E_GUEST_ERROR] = 500,
    [SBX_E_PROTOCOL_VIOLATION] = 502,
    [SBX_E_CHANNEL_LOST] = 502,
    [SBX_E_NOT_READY] = 503,
    [SBX_E_SHUTTING_DOWN] = 503,
    [SBX_E_DISK_FULL] = 507,
    [SBX_E_PROCESS_NOT_FOUND] = 404,
    [SBX_E_PROCESS_EXITED] = 409,
    [SBX_E_STDIN_CLOSED] = 409,
    [SBX_E_STDIN_FULL] = 429,
    [SBX_E_NOT_A_PTY] = 400,
    [SBX_E_BAD_OFFSET] = 400,
    [SBX_E_TOO_MANY_PROCESSES] = 429,
    [SBX_E_SNAPSHOT_NOT_FOUND] = 404,
    [SBX_E_SNAPSHOT_IN_USE] = 409,
    [SBX_E_SNAPSHOT_INVALID] = 409,
};

int api_status_of(enum sbx_errcode code)
{
    if ((unsigned)code >= SBX_E__COUNT || !status[code])
        return 500;
    return status[code];
}
