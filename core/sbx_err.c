/* sbx_err.c - the one table from error code to its stable name and HTTP status. */
#include "sbx_err.h"

#include <stdarg.h>
#include <stdio.h>

static const struct {
    int http_status;
    const char *name;
} table[SBX_E__COUNT] = {
    [SBX_OK] = {200, "ok"},
    [SBX_E_BAD_REQUEST] = {400, "bad_request"},
    [SBX_E_INVALID_ARGUMENT] = {400, "invalid_argument"},
    [SBX_E_UNKNOWN_TEMPLATE] = {400, "unknown_template"},
    [SBX_E_EXEC_FAILED] = {400, "exec_failed"},
    [SBX_E_IS_A_DIRECTORY] = {400, "is_a_directory"},
    [SBX_E_NOT_A_DIRECTORY] = {400, "not_a_directory"},
    [SBX_E_TOO_MANY_SYMLINKS] = {400, "too_many_symlinks"},
    [SBX_E_CROSS_DEVICE] = {400, "cross_device"},
    [SBX_E_PERMISSION_DENIED] = {403, "permission_denied"},
    [SBX_E_READ_ONLY] = {403, "read_only"},
    [SBX_E_NOT_FOUND] = {404, "sandbox_not_found"},
    [SBX_E_FILE_NOT_FOUND] = {404, "file_not_found"},
    [SBX_E_GONE] = {409, "sandbox_ended"},
    [SBX_E_DEAD] = {409, "sandbox_dead"},
    [SBX_E_FILE_EXISTS] = {409, "file_exists"},
    [SBX_E_DIRECTORY_NOT_EMPTY] = {409, "directory_not_empty"},
    [SBX_E_CONFLICT] = {409, "busy"},
    [SBX_E_TOO_LARGE] = {413, "env_metadata_too_large"},
    [SBX_E_TOO_MANY_SANDBOXES] = {429, "too_many_sandboxes"},
    [SBX_E_TOO_MANY_OPERATIONS] = {429, "too_many_operations"},
    [SBX_E_MEMORY_EXHAUSTED] = {429, "memory_exhausted"},
    [SBX_E_INTERNAL] = {500, "internal"},
    [SBX_E_INDEX_WRITE_FAILED] = {500, "index_write_failed"},
    [SBX_E_VM_START_FAILED] = {500, "vm_start_failed"},
    [SBX_E_GUEST_ERROR] = {500, "guest_error"},
    [SBX_E_PROTOCOL_VIOLATION] = {502, "protocol_violation"},
    [SBX_E_CHANNEL_LOST] = {502, "guest_channel_lost"},
    [SBX_E_NOT_READY] = {503, "sandbox_not_ready"},
    [SBX_E_SHUTTING_DOWN] = {503, "shutting_down"},
    [SBX_E_DISK_FULL] = {507, "disk_full"},
    [SBX_E_PROCESS_NOT_FOUND] = {404, "process_not_found"},
    [SBX_E_PROCESS_EXITED] = {409, "process_exited"},
    [SBX_E_STDIN_CLOSED] = {409, "stdin_closed"},
    [SBX_E_STDIN_FULL] = {429, "stdin_full"},
    [SBX_E_NOT_A_PTY] = {400, "not_a_pty"},
    [SBX_E_BAD_OFFSET] = {400, "bad_offset"},
    [SBX_E_TOO_MANY_PROCESSES] = {429, "too_many_processes"},
    [SBX_E_SNAPSHOT_NOT_FOUND] = {404, "snapshot_not_found"},
    [SBX_E_SNAPSHOT_IN_USE] = {409, "snapshot_in_use"},
    [SBX_E_SNAPSHOT_INVALID] = {409, "snapshot_invalid"},
    [SBX_E_NO_KERNEL] = {409, "no_kernel"},
    [SBX_E_KERNEL_UNAVAILABLE] = {502, "kernel_unavailable"},
    [SBX_E_CONTEXT_NOT_FOUND] = {404, "context_not_found"},
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
    if ((unsigned)code >= SBX_E__COUNT || !table[code].name)
        return "internal";
    return table[code].name;
}

int sbx_err_http_status(enum sbx_errcode code)
{
    if ((unsigned)code >= SBX_E__COUNT || !table[code].http_status)
        return 500;
    return table[code].http_status;
}
