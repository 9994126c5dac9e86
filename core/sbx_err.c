/* sbx_err.c - the one table from error code to its stable name. */
#include "sbx_err.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const table[SBX_E__COUNT] = {
    [SBX_OK] = "ok",
    [SBX_E_BAD_REQUEST] = "bad_request",
    [SBX_E_INVALID_ARGUMENT] = "invalid_argument",
    [SBX_E_UNKNOWN_TEMPLATE] = "unknown_template",
    [SBX_E_EXEC_FAILED] = "exec_failed",
    [SBX_E_IS_A_DIRECTORY] = "is_a_directory",
    [SBX_E_NOT_A_DIRECTORY] = "not_a_directory",
    [SBX_E_TOO_MANY_SYMLINKS] = "too_many_symlinks",
    [SBX_E_CROSS_DEVICE] = "cross_device",
    [SBX_E_PERMISSION_DENIED] = "permission_denied",
    [SBX_E_READ_ONLY] = "read_only",
    [SBX_E_NOT_FOUND] = "sandbox_not_found",
    [SBX_E_FILE_NOT_FOUND] = "file_not_found",
    [SBX_E_GONE] = "sandbox_ended",
    [SBX_E_DEAD] = "sandbox_dead",
    [SBX_E_FILE_EXISTS] = "file_exists",
    [SBX_E_DIRECTORY_NOT_EMPTY] = "directory_not_empty",
    [SBX_E_CONFLICT] = "busy",
    [SBX_E_TOO_LARGE] = "env_metadata_too_large",
    [SBX_E_TOO_MANY_SANDBOXES] = "too_many_sandboxes",
    [SBX_E_TOO_MANY_OPERATIONS] = "too_many_operations",
    [SBX_E_MEMORY_EXHAUSTED] = "memory_exhausted",
    [SBX_E_INTERNAL] = "internal",
    [SBX_E_INDEX_WRITE_FAILED] = "index_write_failed",
    [SBX_E_VM_START_FAILED] = "vm_start_failed",
    [SBX_E_GUEST_ERROR] = "guest_error",
    [SBX_E_PROTOCOL_VIOLATION] = "protocol_violation",
    [SBX_E_CHANNEL_LOST] = "guest_channel_lost",
    [SBX_E_NOT_READY] = "sandbox_not_ready",
    [SBX_E_SHUTTING_DOWN] = "shutting_down",
    [SBX_E_DISK_FULL] = "disk_full",
    [SBX_E_PROCESS_NOT_FOUND] = "process_not_found",
    [SBX_E_PROCESS_EXITED] = "process_exited",
    [SBX_E_STDIN_CLOSED] = "stdin_closed",
    [SBX_E_STDIN_FULL] = "stdin_full",
    [SBX_E_NOT_A_PTY] = "not_a_pty",
    [SBX_E_BAD_OFFSET] = "bad_offset",
    [SBX_E_TOO_MANY_PROCESSES] = "too_many_processes",
    [SBX_E_SNAPSHOT_NOT_FOUND] = "snapshot_not_found",
    [SBX_E_SNAPSHOT_IN_USE] = "snapshot_in_use",
    [SBX_E_SNAPSHOT_INVALID] = "snapshot_invalid",
};

int sbx_err_set(struct sbx_err *e, enum sbx_errcode code, const char *fmt, ...)
{
    va_list ap;

    if (!e)
        return (int)code;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return (int)code;
}

const char *sbx_err_name(enum sbx_errcode code)
{
    if ((unsigned)code >= SBX_E__COUNT || !table[code])
        return "internal";
    return table[code];
}
