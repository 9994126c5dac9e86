/*
 * vmm_int.h - internals shared by the vmm-driver sources (not a public header).
 *
 * Split: vmm.c owns the process (spawn, adopt, exit, kill) and the three
 * socket connections; vmm_qmp.c is the QMP client; vmm_log.c the bounded
 * console log; vmm_argv.c builds QEMU's command line; vmm_host.c probes the
 * host; vmm_qcow2.c writes overlays; vmm_phase.c is the phase table;
 * vmm_snap.c the snapshot file format (vmm_crc.c its CRC-32). Tests include
 * this header to reach the pure parts (argv builder, console log) without a
 * VM.
 */
#ifndef WARREN_VMM_INT_H
#define WARREN_VMM_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <ev.h>

#include "vmm.h"
#include "vmm_phase.h"

/* Seconds QEMU gets to create its sockets (it does so before the guest runs). */
#define VMM_CONNECT_TIMEOUT 10.0
#define VMM_CONNECT_RETRY   0.005
#define VMM_CONSOLE_DEFAULT (1u << 20)
#define VMM_CONSOLE_MIN     4096u
#define VMM_QMP_MAX_MSG     (8u << 20)
#define VMM_REASON_MAX      320

/* ---- argv builder (vmm_argv.c) ---- */

struct vmm_argv {
    char **v; /* NULL-terminated */
    size_t n, cap;
    int err; /* first allocation error, sticky */
};

/* Build QEMU's argv for cfg (its boot mode included). cfg->accel must be KVM or
 * TCG. 0 or -errno (-EINVAL for an id or path QEMU's option parser would
 * misread, or a mode without what it needs). */
int vmm_argv_build(struct vmm_argv *a, const struct vmm_config *cfg, unsigned long tsc_khz);
void vmm_argv_free(struct vmm_argv *a);

/* The exact argv strings that identify a VM: used by the builder and by
 * vmm_adopt's /proc/<pid>/cmdline check, so they cannot drift apart. */
int vmm_argv_name(char *buf, size_t cap, const char *id);
/* Read a small file (a /proc or cgroup entry) with one read: up to cap - 1 bytes,
 * NUL-terminated. The byte count (> 0), or -errno (-ENODATA when empty). */
ssize_t vmm_read_small(const char *path, char *buf, size_t cap);
int vmm_argv_qmp(char *buf, size_t cap, const char *run_dir);

/* 0 if id is usable (1-64 of [A-Za-z0-9_.-]), else -EINVAL. */
int vmm_id_check(const char *id);

/* ---- bounded console log (vmm_log.c) ----
 *
 * The file never exceeds cap bytes. Layout once output passes cap: the first
 * cap/2 bytes of output (boot messages), a fixed-width marker line counting
 * the bytes dropped, then the most recent output (between a quarter and a
 * half of cap). When the tail region fills, its older half is dropped by
 * copying the newer half down (non-overlapping, within the file).
 *
 * The loop never touches the file after open: vmm_log_write queues the bytes
 * and one writer thread (for every log of the process) writes and compacts.
 * A log's queue holds at most max(cap, VMM_LOG_QUEUE_MIN) bytes of memory
 * (rounded up to 16 KiB chunks; written chunks are reused, up to 1 MiB for
 * the process); bytes past it are dropped and the file gets a line
 * "[warren: N bytes of console output dropped]" where they were.
 * Lifetime: the struct is the caller's; vmm_log_close hands what is queued
 * to the writer, which writes it and closes the file later, never touching
 * the struct again (it may be freed at once). Opening the same file again
 * waits for that writer to finish with it. All calls from one thread (the
 * loop). */
struct vmm_log_sink;

#define VMM_LOG_TAIL      512
#define VMM_LOG_QUEUE_MIN (64u << 10)

struct vmm_log {
    struct vmm_log_sink *s; /* NULL once closed (or never opened) */
    size_t tail_len;
    char tail[VMM_LOG_TAIL]; /* the last bytes given to vmm_log_write, dropped ones too */
};

struct vmm_log_stats {
    uint64_t size;    /* the file's size */
    uint64_t dropped; /* bytes cut out by compaction (counted in the head marker) */
    uint64_t lost;    /* bytes dropped because the queue was full */
    bool truncated;   /* the head marker is in place */
};

#define VMM_LOG_MARK_LEN 64

/* Open path (append == false truncates it). On append the state is recovered
 * from the file (marker included) and the tail seeded from its end. Returns 0
 * or -errno (-ELOOP for a symlink, -EINVAL for a non-regular file, or a
 * pthread_create error). */
int vmm_log_open(struct vmm_log *l, const char *path, size_t cap, bool append);
/* Queue bytes: a copy into memory, no I/O, never blocks beyond the queue's
 * mutex (which the writer holds only to take a queue or return a chunk). */
void vmm_log_write(struct vmm_log *l, const void *buf, size_t n);
/* Hand what is queued to the writer and forget the file. No-op when closed. */
void vmm_log_close(struct vmm_log *l);

/* Same, with the word naming the file in the markers ("[warren: <what> truncated, ..."). */
int vmm_log_open_named(struct vmm_log *l, const char *what, const char *path, size_t cap,
                       bool append);

/* The last bytes written (up to cap - 1 of them, NUL-terminated), from memory:
 * what QEMU said last, without waiting for the writer. Valid after close too. */
size_t vmm_log_tail(const struct vmm_log *l, char *buf, size_t cap);

/* Block until every byte queued for l is in the file, then fill *st (may be
 * NULL). Waits on the disk: for tests and tools, not the loop. -EBADF if closed. */
int vmm_log_sync(struct vmm_log *l, struct vmm_log_stats *st);
/* Bytes of memory l's queue holds now (chunks queued or being written). */
size_t vmm_log_queued(const struct vmm_log *l);
/* Tests: hold the writer (it takes no queue) until vmm_log_hold(false), to fill
 * a queue on purpose. Never vmm_log_sync while held. */
void vmm_log_hold(bool on);
/* Write every queue (closed logs included), then stop the writer thread. A
 * later open or write starts it again. Blocks on the disk: for the end of the
 * process (vmm_settle_orphans calls it) and tests. */
void vmm_log_shutdown(void);

/* ---- jail (vmm_jail.c) ---- */

#include <limits.h>
#include <sys/types.h>

enum vmm_cg_mode { VMM_CG_NONE = 0, VMM_CG_V1, VMM_CG_V2 };
enum { VMM_CG_MEM = 0, VMM_CG_CPU, VMM_CG_PIDS, VMM_CG_V1_N };

/* Where the VM groups go: v2 one parent dir, v1 one per controller (memory, cpu, pids). */
struct vmm_cg_host {
    enum vmm_cg_mode mode;
    int n;
    char root[PATH_MAX];                /* v2: the hierarchy's root; v1: the sysfs dir */
    char parent[VMM_CG_V1_N][PATH_MAX]; /* <hierarchy>/<name> */
};

struct vmm_cg_limits {
    uint64_t mem_bytes;
    uint64_t cpu_quota_us, cpu_period_us;
    unsigned cpu_weight, cpu_shares, pids_max;
};

/* One VM's jail: its uid and groups. */
struct vmm_jail_vm {
    bool on;
    uid_t uid;
    int ncg;
    char cg[VMM_CG_V1_N][PATH_MAX];
    uint64_t mem_limit;
};

/* Pure parts, unit-tested: the group name "u<uid>.<id>" and its parser; the
 * limits for a VM's size; detection over a sysfs tree (a fake one in tests). */
int vmm_cg_name(char *buf, size_t cap, uid_t uid, const char *id);
int vmm_cg_parse(const char *name, uid_t *uid);
void vmm_cg_limits(unsigned mem_mb, unsigned vcpus, unsigned overhead_mb, unsigned pids_max,
                   struct vmm_cg_limits *l);
int vmm_cg_detect(const char *sysfs, const char *name, struct vmm_cg_host *h, char *why,
                  size_t cap);
int vmm_cg_group_dirs(const struct vmm_cg_host *h, uid_t uid, const char *id,
                      char dirs[][PATH_MAX]);

int vmm_jail_uid_alloc(struct vmm_jail *j, uid_t *uid);
/* -ERANGE outside the range, -EEXIST if a live VM holds it. */
int vmm_jail_uid_claim(struct vmm_jail *j, uid_t uid);
void vmm_jail_uid_release(struct vmm_jail *j, uid_t uid);
struct vmm_jail *vmm_jail_ref(struct vmm_jail *j);

/* The jail's mount plan for cfg (what the child will mount), built in the parent. */
struct vmm_jail_plan_view;
size_t vmm_jail_plan_size(void);
int vmm_jail_plan_build(const char *root, const struct vmm_config *cfg, const char *exe,
                        struct vmm_jail_plan_view *view);
/* kind: 0 dir ro, 1 file ro, 2 device, 3 dir rw, 4 symlink (src = target). */
int vmm_jail_plan_entry(const struct vmm_jail_plan_view *view, int i, int *kind, const char **src,
                        const char **dst);

/* Launch: allocate a uid, create the cgroup with its limits, chown the run dir and
 * disk. Adopt: find the uid again (the run dir's owner, checked against the
 * process) and claim it; jv->on stays false for a VM that was started unjailed. */
int vmm_jail_prepare(struct vmm_jail *j, const struct vmm_config *cfg, struct vmm_jail_vm *jv);
int vmm_jail_adopt(struct vmm_jail *j, const struct vmm_config *cfg, pid_t pid,
                   struct vmm_jail_vm *jv);
/* The fd a jailed QEMU finds its tap on (-netdev tap,fd=3). */
#define VMM_TAP_FD     3
#define VMM_TAP_FD_STR "3"
/* The fd a jailed clone finds its template's sealed RAM on (vmm_config.mem_fd). */
#define VMM_MEM_FD     4
#define VMM_MEM_FD_STR "4"

/* Fork, jail, exec argv with stdout/stderr on out_fd. Blocks only until the
 * child has exec'd (or failed: -errno, and why says at which step).
 * Networking (cfg->netns): the child enters that namespace as root, attaches
 * to its tap0 and leaves it on VMM_TAP_FD for QEMU, before dropping
 * privileges. With cfg->net_wrap too (the namespace is not set up yet), the
 * child is a fork() that first runs net_wrap (followed by /bin/true, so that
 * its final exec ends there) as root and waits for it: this returns at once,
 * and a failed set-up or jail step is the process exiting (status 127) with
 * its message in out_fd (qemu.log), as for an unjailed wrapper. */
int vmm_jail_spawn(struct vmm_jail *j, const struct vmm_jail_vm *jv, const struct vmm_config *cfg,
                   char **argv, int out_fd, pid_t *pid, char *why, size_t cap);
/* The process is gone: remove its groups (retried later if still busy), free the uid. */
void vmm_jail_release(struct vmm_jail *j, struct vmm_jail_vm *jv);
/* rmdir the groups that were still busy (an exited QEMU stays in its group
 * until it is reaped, by its parent or, for an adopted VM, by init). Returns
 * how many are still pending. */
unsigned vmm_jail_retry(struct vmm_jail *j);
/* The memory controller killed something in this VM's group. */
bool vmm_jail_oom_killed(const struct vmm_jail *j, const struct vmm_jail_vm *jv);

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
    int tx_fd;                /* fd to send with the byte at tx_fd_off (SCM_RIGHTS), or -1 */
    size_t tx_fd_off;
    bool fd_busy; /* a command carrying an fd is queued or awaiting its reply */
};

void vmm_qmp_init(struct vmm *vm, struct vmm_qmp *q);
/* Take over a connected socket; the greeting/capabilities exchange starts. */
void vmm_qmp_attach(struct vmm *vm, struct vmm_qmp *q, int fd);
/* Close the socket and drop every queued command without calling it. */
void vmm_qmp_close(struct vmm *vm, struct vmm_qmp *q);
int vmm_qmp_send(struct vmm *vm, struct vmm_qmp *q, const char *json, vmm_qmp_cb cb, void *ud);
/* Same, but ahead of every command queued before the handshake (the driver's
 * first query-status, so the phase is known before any owner's reply). */
int vmm_qmp_send_first(struct vmm *vm, struct vmm_qmp *q, const char *json, vmm_qmp_cb cb,
                       void *ud);
/* Same, passing a duplicate of fd with the command's first byte (SCM_RIGHTS), for
 * "getfd". One such command at a time: -EBUSY until its reply has arrived. */
int vmm_qmp_send_fd(struct vmm *vm, struct vmm_qmp *q, const char *json, int fd, vmm_qmp_cb cb,
                    void *ud);
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
/* An event arrived (name, and data.status for MIGRATION, else NULL). From the
 * loop, inside vmm_enter; may call the owner. */
void vmm_qmp_event(struct vmm *vm, const char *event, const char *status);
/* True while callbacks may still be made (not exited, detached or freed). */
bool vmm_live(const struct vmm *vm);
const char *vmm_id_of(const struct vmm *vm);

/* ---- qcow2 (vmm_qcow2.c) ---- */

/* Pure: is the header h (len bytes from offset 0) a qcow2 we accept as a
 * backing file? *is_qcow2 false (and 0) when the magic is not there: raw.
 * Else 0 and *vsize, or -EINVAL for a header out of bounds (version, cluster
 * bits, size, encryption, L1 size, feature bits, header length). */
int vmm_qcow2_probe(const uint8_t *h, size_t len, bool *is_qcow2, uint64_t *vsize);

#define VMM_QCOW2_NAME_MAX 1023u /* backing file name bytes */
#define VMM_QCOW2_REFS_MAX 64u   /* clusters one refcount block of ours counts */

/* Where the overlay's parts go (file offsets in bytes). */
struct vmm_qcow2_layout {
    size_t hdr_len;     /* header, extensions and backing name: cluster 0 */
    uint64_t l1_bytes;  /* the L1 table, zero, at cluster 3 */
    uint64_t nclusters; /* clusters with refcount 1: header, refcount table and block, L1 */
    uint64_t file_len;  /* the file ends after the L1 table */
};

/* Pure: the overlay's cluster 0 (header, backing-format extension, backing
 * name) for a disk of size bytes over backing (format qcow2 or raw) into out
 * (cap bytes), and its layout. 0, -EINVAL (size 0, not a multiple of 512 or
 * above 64 TiB; name empty or too long), -ENOSPC (cap). Whatever it encodes,
 * vmm_qcow2_probe accepts with the same size: an overlay can back a clone. */
int vmm_qcow2_encode(uint8_t *out, size_t cap, uint64_t size, bool qcow2_backing,
                     const char *backing, struct vmm_qcow2_layout *lay);
/* Pure: the backing file name of the qcow2 header h (len bytes from offset 0) into
 * out ("" when it has none): 0, or -EINVAL (not a qcow2 vmm_qcow2_probe accepts, or
 * a name out of bounds, holding a NUL, or longer than cap - 1). */
int vmm_qcow2_backing_name(const uint8_t *h, size_t len, char *out, size_t cap);

/* ---- snapshot files (vmm_snap.c) ---- */

#define VMM_SNAP_HDR          4096u
#define VMM_SNAP_F_SHARED_RAM 1u /* RAM not in the stream: it lives in the memory file */
#define VMM_SNAP_F_DELTA      2u /* device state, then the pages the VM owned over its RAM file */
/* With either of those: ram_crc is the CRC-32C of the whole RAM file (vmm_ram_crc). */
#define VMM_SNAP_F_RAM_CRC 4u

struct vmm_snap_info {
    uint64_t stream_len; /* everything after the header (a delta's pages included) */
    uint32_t stream_crc, mem_mb, vcpus, flags;
    uint32_t version;      /* the file's format, 2 or 3 (encode writes 3 for anything else) */
    char qemu_version[64]; /* "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)" */
    /* VMM_SNAP_F_DELTA: the device stream's length (from the header's end), the pages
     * that follow it (vmm_delta_layout) and the name of the RAM file they go over. */
    uint64_t dev_len, npages;
    char base[64];
    uint32_t ram_crc; /* VMM_SNAP_F_RAM_CRC */
};

/* Where a delta's parts lie: the page numbers (npages little-endian u32) at *idx_off,
 * the pages (4 KiB each, in that order) at *data_off, the file's end at the return. */
uint64_t vmm_delta_layout(uint64_t dev_len, uint64_t npages, uint64_t *idx_off, uint64_t *data_off);

uint32_t vmm_crc32(uint32_t crc, const void *buf, size_t n);
uint32_t vmm_crc32c(uint32_t crc, const void *buf, size_t n); /* the CPU's crc32 if it has it */
uint32_t vmm_crc32c_soft(uint32_t crc, const void *buf, size_t n); /* tables only: for tests */
/* vmm_crc32c(crc, n zero bytes), in O(log n). */
uint32_t vmm_crc32c_zeros(uint32_t crc, uint64_t n);
/* The stream checksum of a snapshot file of that version: CRC-32C from 3, CRC-32 before. */
uint32_t vmm_snap_crc(uint32_t version, uint32_t crc, const void *buf, size_t n);
/* Pure: the header for in (VMM_SNAP_HDR bytes into hdr). */
void vmm_snap_encode(uint8_t *hdr, const struct vmm_snap_info *in);
/* Pure: check a header read from a file of file_size bytes (len bytes of it in
 * buf). 0 and *out, or -EINVAL with a sentence in why. */
int vmm_snap_decode(const uint8_t *buf, size_t len, uint64_t file_size, struct vmm_snap_info *out,
                    char *why, size_t cap);
/* Pure: may a VM of this QEMU version and size restore s? 0 or -EINVAL + why. */
int vmm_snap_match(const struct vmm_snap_info *s, const char *qemu_version, unsigned mem_mb,
                   unsigned vcpus, bool shared_ram, char *why, size_t cap);
/* Blocking (a worker thread's job). QEMU has written its stream into fd after
 * the header: checksum it, write the header (info's other fields as given),
 * fsync, rename tmp to path, fsync the directory (no fsync at all unless sync). */
int vmm_snap_finalize(int fd, const char *tmp, const char *path, bool sync,
                      struct vmm_snap_info *info, char *why, size_t cap);
/* All of n bytes at off written from b (write) or read into b: 0, or -errno (-EIO for
 * a file that ends first). Blocking. */
int vmm_pio_all(int fd, void *b, size_t n, uint64_t off, bool write);
/* Blocking: decode the header of the file open on fd and check the stream's checksum. */
int vmm_snap_verify(int fd, struct vmm_snap_info *out, char *why, size_t cap);

/* ---- a delta's pages (vmm_delta.c): blocking, for the worker thread ---- */

/* QEMU (pid) has written its device state into fd after the header: end that stream
 * (an empty vmdescription section, which the loader looks for), then append the pages
 * of its guest-RAM mapping (the mapping of the file with inode ino, mem_mb long) that
 * the process owns: present and not the file's, or swapped out (/proc/pid/pagemap).
 * Sets info->dev_len and npages. 0 or -errno with why. */
int vmm_delta_write(int fd, pid_t pid, ino_t ino, unsigned mem_mb, struct vmm_snap_info *info,
                    char *why, size_t cap);
/* The start of QEMU's anonymous guest RAM (a booted VM's: one private read-write
 * mapping mem_mb long followed by a PROT_NONE guard page) in pid, or 0 if not exactly
 * one mapping looks so (then nothing is guessed). */
uintptr_t vmm_ram_anon_find(pid_t pid, unsigned mem_mb);
/* A booted VM's save as a RAM file (vmm_save_ram): QEMU (pid) has written its device
 * state into fd after the header; end it as a delta with no pages, and write every
 * non-zero page of its anonymous guest RAM into ram_path (through ram_path.tmp and a
 * rename; fsync'ed when sync) at its place, holes elsewhere. Sets info->dev_len,
 * npages (0), the delta and RAM checksum flags, ram_crc and base (ram_path's name). 0 or -errno
 * with why
 * (-ENOTSUP: no guest RAM to tell apart). */
int vmm_ram_write(int fd, pid_t pid, unsigned mem_mb, const char *ram_path, bool sync,
                  struct vmm_snap_info *info, char *why, size_t cap);
/* Blocking: the CRC-32C of a RAM file of len bytes open on fd (its holes read as
 * zeros, and cost nothing). 0, or -errno (-EIO: the file is not len bytes long). */
int vmm_ram_crc(int fd, uint64_t len, uint32_t *crc);
/* vmm_ram_crc, or the checksum this process computed before for the same file (device,
 * inode, size, mtime and ctime all unchanged): *cached says which. */
int vmm_ram_crc_once(int fd, uint64_t len, uint32_t *crc, bool *cached);
/* The same of the mem_mb MiB RAM file (inode ino) that QEMU (pid) maps, read through
 * /proc/PID/map_files (so a jailed QEMU's sealed memfd too). -ENOENT: no such mapping. */
int vmm_ram_crc_mapped(pid_t pid, ino_t ino, unsigned mem_mb, uint32_t *crc);
/* The name of the memfd vmm_mem_seal makes (shown as "/memfd:<name> (deleted)"). */
#define VMM_MEM_MEMFD_NAME "warren-template-ram"
/* The inode of pid's guest-RAM mapping (offset 0, mem_mb long) of the file path (also
 * once removed) or of a memfd warrend sealed (vmm_mem_seal), or 0 if none. */
ino_t vmm_delta_map_ino(pid_t pid, const char *path, unsigned mem_mb);
/* Pure: decode a delta's page list (n little-endian u32 at raw) into out (raw may be
 * out): each page inside the guest's total pages, strictly ascending. 0, or -EINVAL
 * with why. */
int vmm_delta_pages(const uint8_t *raw, uint64_t n, uint64_t total, uint32_t *out, char *why,
                    size_t cap);
/* The delta on fd (verified: info) written into the guest RAM of QEMU pid (its mapping
 * of inode ino), each page at its place. *touched tells whether a byte was written (a
 * failure after that leaves the VM's RAM half-made). 0 or -errno with why. */
int vmm_delta_load(int fd, const struct vmm_snap_info *info, pid_t pid, ino_t ino, bool *touched,
                   char *why, size_t cap);

/* ---- page-out of a stopped VM (vmm_pageout.c): blocking, for a worker thread ---- */

struct vmm_pageout_stats {
    uint64_t rss_before_kb, rss_after_kb, swap_before_kb, swap_after_kb; /* /proc/pid/status */
    unsigned mappings;                                                   /* advised */
    int64_t us;                                                          /* wall time */
};
/* MADV_PAGEOUT through process_madvise over each mapping of pid (checked alive
 * through pidfd once its maps are open), stopping between two mappings once *cancel
 * (read atomically) is set: 0 with why telling what moved, -ECANCELED, or -errno. */
int vmm_pageout_run(pid_t pid, int pidfd, const int *cancel, struct vmm_pageout_stats *st,
                    char *why, size_t cap);

/* ---- a waiting QEMU's TCG buffer touched ahead (vmm_prefault.c): blocking steps ---- */

struct vmm_pf {
    int mem, pagemap; /* /proc/PID/mem and pagemap, or -1 */
    uint64_t at, end; /* the part of the buffer still to go, addresses in QEMU */
    uint64_t touched; /* bytes written so far */
};
/* Find pid's translation buffer (its one large anonymous rwx mapping) and open its
 * memory, checked alive through pidfd: 0, -ENOENT (none: KVM, or bytes 0), -errno. */
int vmm_pf_open(pid_t pid, int pidfd, uint64_t bytes, struct vmm_pf *pf);
/* Write zeros into up to pages (at most 64) pages of it that pid never touched
 * (pagemap: absent): 1 if more remain, 0 once done, -errno. Only for a process
 * that writes none of them meanwhile (vmm.h vmm_prefault_tcg). */
int vmm_pf_step(struct vmm_pf *pf, unsigned pages);
void vmm_pf_close(struct vmm_pf *pf);
/* Stop vmm_prefault_tcg's slices now (vmm.c): before anything that could run the
 * guest, and when the VM goes. Idempotent. */
void vmm_pf_stop(struct vmm *vm);

#endif
