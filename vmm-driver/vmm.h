/*
 * vmm.h - QEMU microvm control: launch, adopt after a restart, QMP, exit.
 *
 * One struct vmm is one QEMU process. The driver starts it (or re-attaches
 * to one that survived a warrend restart), connects QMP and the console,
 * and hands the connected guest-channel fd to its owner through
 * cbs->channel. It never blocks the loop: sockets are connected
 * non-blocking, retried on a timer until QEMU has created them.
 *
 * Ownership: the caller owns the struct vmm and frees it with vmm_free()
 * (which kills the process if it still runs, unless vmm_detach() was called).
 * The channel fd passed to cbs->channel belongs to the callee from then on.
 * After cbs->exited has run, no further callback is made for that vmm.
 * Callbacks are never invoked from inside the vmm_* call that caused them.
 */
#ifndef WARREN_VMM_H
#define WARREN_VMM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <ev.h>

enum vmm_accel { VMM_ACCEL_AUTO = 0, VMM_ACCEL_KVM, VMM_ACCEL_TCG };

/* Decide the accelerator: KVM when the CPU has vmx/svm and /dev/kvm answers
 * KVM_GET_API_VERSION and KVM_CREATE_VM; else TCG. why gets a one-line reason. */
enum vmm_accel vmm_detect_accel(char *why, size_t why_cap);

/* Host TSC in kHz (from /proc/cpuinfo "cpu MHz"), 0 if unknown. */
unsigned long vmm_tsc_khz(void);

struct vmm_config {
    const char *id;          /* sandbox id: names the VM and appears in its cmdline */
    const char *qemu;        /* qemu-system-x86_64 path */
    const char *kernel;      /* uncompressed vmlinux (PVH) */
    const char *initrd;      /* initramfs holding warren-init */
    const char *disk;        /* root disk (qcow2 overlay); NULL for none */
    const char *run_dir;     /* existing dir for qmp.sock, chan.sock, console.sock, console.log */
    const char *append;      /* extra kernel command line, may be NULL */
    unsigned mem_mb;
    unsigned vcpus;
    enum vmm_accel accel;    /* KVM or TCG (AUTO is resolved by the caller) */
    size_t console_max;      /* bytes of console log kept; older output is dropped */
};

struct vmm;

struct vmm_cbs {
    /* The guest channel socket is connected (fd is non-blocking, owned by callee). */
    void (*channel)(void *ud, int fd);
    /* QEMU exited (or, for an adopted VM, vanished). status is the wait status when known
     * (-1 if not), reason a short human sentence ("killed by signal 9"). */
    void (*exited)(void *ud, int status, const char *reason);
};

/* Start QEMU. On success *out is set and the process runs; 0 or -errno. */
int vmm_launch(struct ev_loop *loop, const struct vmm_config *cfg, const struct vmm_cbs *cbs,
               void *ud, struct vmm **out);

/* Re-attach to a QEMU that was started earlier by vmm_launch (same cfg->run_dir) and is
 * still running as pid. -ESRCH if it is gone or is not that VM. */
int vmm_adopt(struct ev_loop *loop, const struct vmm_config *cfg, pid_t pid,
              const struct vmm_cbs *cbs, void *ud, struct vmm **out);

pid_t vmm_pid(const struct vmm *vm);

/* Reconnect the guest channel (e.g. after the callee closed it); cbs->channel fires again. */
int vmm_channel_reconnect(struct vmm *vm);

/* Ask QEMU to quit (QMP "quit"), SIGKILL if it has not exited within grace_ms. */
void vmm_shutdown(struct vmm *vm, unsigned grace_ms);

/* SIGKILL now. cbs->exited follows from the loop. */
void vmm_kill(struct vmm *vm);

/* Stop watching without killing (warrend shutting down, VM kept for adoption). */
void vmm_detach(struct vmm *vm);

/* Free; kills a still-running, non-detached process (SIGKILL) and reaps it. */
void vmm_free(struct vmm *vm);

/* Send one QMP command (JSON text) and get the "return"/"error" JSON text back.
 * cb may be NULL. Not called if the VM exits first. */
typedef void (*vmm_qmp_cb)(void *ud, int err, const char *json);
int vmm_qmp(struct vmm *vm, const char *json, vmm_qmp_cb cb, void *ud);

/* Path of the bounded console log (run_dir/console.log). */
const char *vmm_console_path(const struct vmm *vm);

/* Create a qcow2 (v3) overlay at path backed by the raw image `backing` of
 * `size` bytes, written directly (no qemu-img spawn). 0 or -errno. */
int vmm_qcow2_create(const char *path, const char *backing, uint64_t size);

#endif
