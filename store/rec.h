/*
 * rec.h - the on-disk form of the core's records (warren_store): what the
 * sandbox table keeps in its LMDB index, as C structs in and out. The bytes
 * are JSON objects whose keys, order and spelling older warrends wrote and
 * newer ones must read: this module is the only place that knows them, so the
 * core (core/) speaks C alone.
 *
 * Ownership: an encode borrows its struct and returns a malloc'd NUL-terminated
 * string; a decode fills its struct with strings borrowed from the decoded
 * document (rec->doc), valid until the matching *_free, and owned copies
 * where a field says so. A decode's -EINVAL means the bytes are not such a
 * record (the caller drops it and says so); -ENOMEM is out of memory.
 */
#ifndef WARREN_REC_H
#define WARREN_REC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sbx.h"
#include "sbx_util.h"

/* ---- string maps (a sandbox's env and metadata, a snapshot's metadata) ---- */

/* An owned map: each key once, in the order first given; keys and values are
 * malloc'd (values NUL-terminated after their n bytes). */
struct rec_kv {
    struct sbx_kv *v;
    size_t n;
    size_t stored_bytes; /* its size as compact JSON (what create's quota counts) */
};

/* m becomes a copy of in (m's old content freed only on success). A key given twice
 * keeps its first place and its last value, as in a JSON object. 0, -EINVAL (a key or
 * value missing or not UTF-8 text: the index keeps it as JSON text), -ENOMEM. */
int rec_kv_set(struct rec_kv *m, const struct sbx_kv *in, size_t n);
/* key's value, or NULL. */
const struct sbx_str *rec_kv_get(const struct rec_kv *m, const char *key);
void rec_kv_free(struct rec_kv *m);

/* ---- a sandbox's record (the index's sandboxes table) ---- */

struct rec_sandbox {
    const char *id, *tmpl, *state, *reason;
    const char *vm_id; /* "" none */
    int64_t created_ms, expires_ms, ended_ms, last_active_ms;
    int64_t idle_s, mem_mb, vcpus;
    struct rec_kv env, metadata; /* decode: owned by the struct until rec_sandbox_free */
    bool keep_running, persistent, auto_pause;
    uint16_t public_ports[SBX_PUBLIC_PORTS_MAX]; /* decode keeps those in 1..65535 */
    size_t npublic;
    const char *snapshot_id; /* NULL none */
    int64_t ttl_s;           /* written with auto_pause; decode: as found, 0 absent */
    int64_t paused_ms;       /* 0 none */
    /* Decode only: an older warrend's record names no VM but holds its VM's pid,
     * run_dir and disk (run_dir and disk NULL when absent, pid 0). */
    int64_t pid;
    const char *run_dir, *disk;
    void *doc;
};

char *rec_sandbox_encode(const struct rec_sandbox *r);
int rec_sandbox_decode(const char *p, size_t n, struct rec_sandbox *r);
void rec_sandbox_free(struct rec_sandbox *r);

/* ---- an egress policy, as records keep it ---- */

/* A stored "network" member, as a request would give it (the core checks it as one):
 * its lists owned by the record that decoded it (entries NULL where not strings). */
enum rec_net_kind { REC_NET_NONE, REC_NET_OK, REC_NET_BAD /* not an object */ };
struct rec_net {
    enum rec_net_kind kind;
    struct sbx_net_req req;
};

/* ---- a snapshot's record (the index's snapshots table) ---- */

struct rec_snap {
    const char *id, *parent, *parent_snapshot, *tmpl, *dir;
    int64_t mem_mb, vcpus, size, created_ms;
    /* The template's base image as it was: base_ok false when a decoded record's
     * "base" is unreadable (encode then writes {}: it matches no file). */
    struct sbx_ident base;
    bool base_ok;
    struct rec_kv metadata;         /* decode: owned until rec_snap_free */
    const char *type;               /* decode: NULL when absent or not a string */
    const char *disk_backing, *mem; /* "" or NULL: none (not written) */
    /* Encode: has_network and network; decode: net. */
    bool has_network;
    struct sbx_net_rec network;
    struct rec_net net;
    void *doc;
};

char *rec_snap_encode(const struct rec_snap *r);
int rec_snap_decode(const char *p, size_t n, struct rec_snap *r);
void rec_snap_free(struct rec_snap *r);

/* ---- a VM's record (the index's vms table) ---- */

struct rec_vm {
    const char *id, *tmpl, *boot, *run_dir, *disk;
    const char *sandbox; /* "" none */
    int64_t mem_mb, vcpus, created_ms, pid;
    bool has_net_slot; /* encode: net_slot >= 0; decode: an integer found */
    int64_t net_slot;
    const char *backing, *mem_path; /* "" or NULL: none (not written) */
    /* Networking on: its policy (lists as comma-separated text, "" or NULL: none;
     * decode: rate_mbit and max_connections 0 when absent, as older records lack them). */
    bool has_network;
    struct sbx_net_rec network;
    void *doc;
};

char *rec_vm_encode(const struct rec_vm *r);
int rec_vm_decode(const char *p, size_t n, struct rec_vm *r);
void rec_vm_free(struct rec_vm *r);

/* ---- other JSON the core reads ---- */

/* The string member key of the JSON object text json (QEMU's answers, e.g. its
 * migration status) into out (cap bytes, NUL-terminated): 0, or -EINVAL when json is
 * no object, key no string member, or its value does not fit. */
int rec_text_member(const char *json, const char *key, char *out, size_t cap);

/* ---- a warm pool's template record (the index's templates table) ---- */

struct rec_tpl {
    const char *tmpl, *vm_id, *dir, *snapshot, *disk, *mem_path; /* decode: NULL absent */
    int64_t mem_mb, vcpus, created_ms;
    struct sbx_ident base, kernel, initrd;
    bool base_ok, kernel_ok, initrd_ok; /* decode: each one readable */
    bool net;
    /* The kernel command line it booted with: {"rev","append"}. Decode: cmdline_ok
     * when the record holds exactly those two, of those types. */
    int64_t cmdline_rev;
    const char *cmdline_append;
    bool cmdline_ok;
    const char *warmup; /* decode: NULL absent or not a string */
    bool shape_ok;      /* decode: vm_id, mem_mb and vcpus readable */
    void *doc;
};

char *rec_tpl_encode(const struct rec_tpl *r);
/* Lenient: any JSON object decodes (fields absent or of another type read as NULL,
 * 0 or false, see the _ok flags); -EINVAL only for what is not an object. */
int rec_tpl_decode(const char *p, size_t n, struct rec_tpl *r);
void rec_tpl_free(struct rec_tpl *r);

#endif
