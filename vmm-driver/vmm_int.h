/*
 * vmm_int.h - internals shared by the vmm-driver sources (not a public header).
 *
 * Split: vmm.c owns the process (spawn, adopt, exit, kill) and the three
 * socket connections; vmm_qmp.c is the QMP client; vmm_log.c the bounded
 * console log; vmm_argv.c builds QEMU's command line; vmm_host.c probes the
 * host; vmm_qcow2.c writes overlays. Tests include this header to reach the
 * pure parts (argv builder, console log) without a VM.
 */
#ifndef WARREN_VMM_INT_H
#define WARREN_VMM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ev.h>

#include "vmm.h"

/* Seconds QEMU gets to create its sockets (it does so before the guest runs). */
#define VMM_CONNECT_TIMEOUT 10.0
#define VMM_CONNECT_RETRY   0.005
#define VMM_CONSOLE_DEFAULT (1u << 20)
#define VMM_CONSOLE_MIN     4096u
#define VMM_QMP_MAX_MSG     (8u << 20)
#define VMM_REASON_MAX      320

/* ---- argv builder (vmm_argv.c) ---- */

/* How the guest starts. Only KERNEL exists today; snapshot clones will add a
 * mode that maps guest RAM from a /dev/shm file (memory-backend-file) and waits
 * with -incoming defer instead of booting -kernel. */
enum vmm_boot_mode { VMM_BOOT_KERNEL = 0 };

struct vmm_argv {
    char **v; /* NULL-terminated */
    size_t n, cap;
    int err; /* first allocation error, sticky */
};

/* Build QEMU's argv for cfg. cfg->accel must be KVM or TCG. 0 or -errno
 * (-EINVAL for an id or path QEMU's option parser would misread). */
int vmm_argv_build(struct vmm_argv *a, const struct vmm_config *cfg, enum vmm_boot_mode mode,
                   unsigned long tsc_khz);
void vmm_argv_free(struct vmm_argv *a);

/* The exact argv strings that identify a VM: used by the builder and by
 * vmm_adopt's /proc/<pid>/cmdline check, so they cannot drift apart. */
int vmm_argv_name(char *buf, size_t cap, const char *id);
int vmm_argv_qmp(char *buf, size_t cap, const char *run_dir);

/* 0 if id is usable (1-64 of [A-Za-z0-9_.-]), else -EINVAL. */
int vmm_id_check(const char *id);

/* ---- bounded console log (vmm_log.c) ----
 *
 * The file never exceeds cap bytes. Layout once output passes cap: the first
 * cap/2 bytes of output (boot messages), a fixed-width marker line counting
 * the bytes dropped, then the most recent output (between a quarter and a
 * half of cap). When the tail region fills, its older half is dropped by
 * copying the newer half down (non-overlapping, within the file). */
struct vmm_log {
    int fd;
    uint64_t cap;     /* file size limit */
    uint64_t head;    /* bytes of the head region (cap / 2) */
    uint64_t size;    /* current file size */
    uint64_t dropped; /* bytes dropped so far */
    bool truncated;   /* the marker is in place */
};

#define VMM_LOG_MARK_LEN 64

/* Open path (append == false truncates it). On append the state is recovered
 * from the file (marker included). Returns 0 or -errno. */
int vmm_log_open(struct vmm_log *l, const char *path, size_t cap, bool append);
/* Append bytes. Errors (ENOSPC...) count as dropped bytes; never blocks beyond
 * a regular-file write. */
void vmm_log_write(struct vmm_log *l, const void *buf, size_t n);
void vmm_log_close(struct vmm_log *l);

/* ---- QMP client (vmm_qmp.c) ---- */

struct vmm;
struct vmm_qmp_cmd;

enum vmm_qmp_state {
    VMM_QMP_IDLE = 0, /* not connected yet */
    VMM_QMP_GREETING, /* connected, waiting for the {"QMP":...} banner */
    VMM_QMP_CAPS,     /* qmp_capabilities sent */
    VMM_QMP_READY,
    VMM_QMP_CLOSED, /* lost (EOF, error, protocol violation) or shut down */
};

struct vmm_qmp {
    int fd;
    enum vmm_qmp_state state;
    ev_io rw, ww;
    char *rx;
    size_t rx_len, rx_cap;
    char *tx;
    size_t tx_off, tx_len, tx_cap;
    struct vmm_qmp_cmd *wait_head, **wait_tail; /* queued before READY */
    struct vmm_qmp_cmd *fly_head, **fly_tail;   /* sent, reply pending (in order) */
    unsigned long next_id;
    char shutdown_reason[48]; /* from the last SHUTDOWN event */
    bool stopped;             /* STOP seen without RESUME */
};

void vmm_qmp_init(struct vmm *vm, struct vmm_qmp *q);
/* Take over a connected socket; the greeting/capabilities exchange starts. */
void vmm_qmp_attach(struct vmm *vm, struct vmm_qmp *q, int fd);
/* Close the socket and drop every queued command without calling it. */
void vmm_qmp_close(struct vmm *vm, struct vmm_qmp *q);
int vmm_qmp_send(struct vmm *vm, struct vmm_qmp *q, const char *json, vmm_qmp_cb cb, void *ud);
/* The process has exited: read what is left on the socket for events only
 * (the SHUTDOWN reason), calling no command callback. */
void vmm_qmp_drain_events(struct vmm *vm, struct vmm_qmp *q);

/* ---- vmm.c services used by vmm_qmp.c ---- */

struct vmm_qmp *vmm_qmp_of(struct vmm *vm);
struct ev_loop *vmm_loop_of(struct vmm *vm);
/* The QMP link failed: kill the VM unless it exits on its own shortly. */
void vmm_qmp_lost(struct vmm *vm, const char *why);
/* Bracket every watcher callback that may call the owner: a vmm_free from
 * inside is deferred to the outermost vmm_leave (do not touch vm after it). */
void vmm_enter(struct vmm *vm);
void vmm_leave(struct vmm *vm);
/* True while callbacks may still be made (not exited, detached or freed). */
bool vmm_live(const struct vmm *vm);
const char *vmm_id_of(const struct vmm *vm);

#endif
