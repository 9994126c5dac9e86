/*
 * idx.h - the LMDB index: one named database per table (sandboxes, VMs,
 * templates, snapshots), each keyed by id and holding that object's JSON
 * record. Survives restarts of warrend.
 *
 * Layout: named databases in one environment. An index written by an older
 * warrend (one unnamed database whose records are all sandboxes) is moved
 * into the sandboxes table by idx_open, once, in one transaction: a crash
 * during the move leaves the old layout whole, and the next open moves it.
 *
 * Writes use MDB_NOSYNC: a crashed or kill -9'd warrend loses nothing (the
 * pages are in the kernel's cache); idx_sync() flushes to disk and is
 * called from the reaper. All calls return 0 or a negative error (LMDB's
 * positive codes are returned negated; idx_strerror names both kinds).
 */
#ifndef WARREN_IDX_H
#define WARREN_IDX_H

#include <stddef.h>

struct idx;

enum idx_table {
    IDX_SANDBOXES, /* sandbox id -> sandbox record (sbx.c) */
    IDX_VMS,       /* VM id -> VM record (sbx.c): pid, run dir, the sandbox it is bound to */
    IDX_TEMPLATES, /* template snapshots (not written yet) */
    IDX_SNAPSHOTS, /* sandbox snapshots (not written yet) */
    IDX_NTABLES
};

/* The table's database name ("sandboxes", "vms", ...). */
const char *idx_table_name(enum idx_table tb);

int idx_open(const char *dir, struct idx **out);
/* As idx_open with an initial map of map_bytes (tests use a tiny one). Writes that do
 * not fit grow the map (doubling, up to 64 GiB) and are retried; only past that do they
 * fail, with -MDB_MAP_FULL. */
int idx_open_map(const char *dir, size_t map_bytes, struct idx **out);
/* The map's current size in bytes. */
size_t idx_map_size(const struct idx *ix);
/* How many records idx_open moved from the old unnamed layout (0: none were there). */
unsigned idx_migrated(const struct idx *ix);
void idx_close(struct idx *ix);
int idx_put(struct idx *ix, enum idx_table tb, const char *key, const char *val, size_t len);
/* Deleting a missing key is not an error. */
int idx_del(struct idx *ix, enum idx_table tb, const char *key);
/* Calls cb for every record of the table in key order; a non-zero return from cb stops
 * and is returned. */
int idx_foreach(struct idx *ix, enum idx_table tb,
                int (*cb)(void *ud, const char *key, size_t klen, const char *val, size_t vlen),
                void *ud);
int idx_sync(struct idx *ix);
const char *idx_strerror(int err);

#endif
