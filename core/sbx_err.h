/*
 * sbx_err.h - what went wrong, in words no transport owns.
 *
 * The sandbox core (sbx.h) reports every failure as a struct sbx_err: a code
 * and a message meant for the client. Every door shows the code by its stable
 * name (sbx_err.c's table: the "code" of a REST error body, of an agent-socket
 * error frame); what else a code means on a wire is that door's (the REST
 * door's HTTP status: server/apierr.c).
 *
 * Adding a code: append it to the enum (before SBX_E__COUNT) and give it a
 * row in sbx_err.c's table and in apierr.c's; both are checked to cover every
 * code.
 */
#ifndef WARREN_SBX_ERR_H
#define WARREN_SBX_ERR_H

enum sbx_errcode {
    SBX_OK = 0,
    /* the request itself is wrong */
    SBX_E_BAD_REQUEST,         /* malformed: not a JSON object, ... */
    SBX_E_INVALID_ARGUMENT,    /* a field has a wrong value or is unknown */
    SBX_E_UNKNOWN_TEMPLATE,    /* no such template */
    SBX_E_EXEC_FAILED,         /* the guest could not start the command */
    SBX_E_IS_A_DIRECTORY,      /* guest EISDIR */
    SBX_E_NOT_A_DIRECTORY,     /* guest ENOTDIR */
    SBX_E_TOO_MANY_SYMLINKS,   /* guest ELOOP */
    SBX_E_CROSS_DEVICE,        /* guest EXDEV */
    SBX_E_PERMISSION_DENIED,   /* guest EACCES, EPERM */
    SBX_E_READ_ONLY,           /* guest EROFS */
    SBX_E_NOT_FOUND,           /* no sandbox with that id */
    SBX_E_FILE_NOT_FOUND,      /* guest ENOENT */
    SBX_E_GONE,                /* the sandbox has ended */
    SBX_E_DEAD,                /* the sandbox died (VM crash, protocol violations) */
    SBX_E_FILE_EXISTS,         /* guest EEXIST */
    SBX_E_DIRECTORY_NOT_EMPTY, /* guest ENOTEMPTY */
    SBX_E_CONFLICT,            /* guest EBUSY */
    SBX_E_TOO_LARGE,           /* env and metadata exceed their cap */
    /* quotas: retry later or free something */
    SBX_E_TOO_MANY_SANDBOXES,
    SBX_E_TOO_MANY_OPERATIONS,
    SBX_E_MEMORY_EXHAUSTED,
    /* the server or the guest failed */
    SBX_E_INTERNAL,
    SBX_E_INDEX_WRITE_FAILED,
    SBX_E_VM_START_FAILED,
    SBX_E_GUEST_ERROR,        /* a guest errno with no code of its own */
    SBX_E_PROTOCOL_VIOLATION, /* the guest broke the channel protocol */
    SBX_E_CHANNEL_LOST,       /* the guest channel went away mid-operation */
    SBX_E_NOT_READY,          /* starting, or reconnecting to its guest: retry shortly */
    SBX_E_SHUTTING_DOWN,
    SBX_E_DISK_FULL, /* guest ENOSPC, EDQUOT */
    /* processes that belong to the sandbox */
    SBX_E_PROCESS_NOT_FOUND,  /* no such background process or PTY */
    SBX_E_PROCESS_EXITED,     /* it has exited: no signal, no stdin */
    SBX_E_STDIN_CLOSED,       /* its stdin was closed (eof) */
    SBX_E_STDIN_FULL,         /* it has not read what is queued: retry later */
    SBX_E_NOT_A_PTY,          /* resize of a process without a terminal */
    SBX_E_BAD_OFFSET,         /* an output offset past its end */
    SBX_E_TOO_MANY_PROCESSES, /* max_processes_per_sandbox running */
    /* snapshots */
    SBX_E_SNAPSHOT_NOT_FOUND, /* no snapshot with that id */
    SBX_E_SNAPSHOT_IN_USE,    /* a live sandbox or another snapshot needs its files */
    SBX_E_SNAPSHOT_INVALID,   /* its file is corrupt, truncated, or its base image changed */
    SBX_E__COUNT
};

#define SBX_ERR_MSG_MAX 512

struct sbx_err {
    enum sbx_errcode code;
    char msg[SBX_ERR_MSG_MAX]; /* for the client: no trailing newline */
};

/* Fill *e (which may be NULL: nothing is written) and return code, so a failing call
 * can end with `return sbx_err_set(err, SBX_E_..., "...")`. */
int sbx_err_set(struct sbx_err *e, enum sbx_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The stable name of a code, as clients see it ("sandbox_not_found", ...); "internal"
 * for a code out of range. */
const char *sbx_err_name(enum sbx_errcode code);

#endif
