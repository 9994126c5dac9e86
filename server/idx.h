/*
 * idx.h - the LMDB index: one record per sandbox, keyed by id, holding the
 * sandbox's JSON record. Survives restarts of warrend.
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

int idx_open(const char *dir, struct idx **out);
/* As idx_open with an initial map of map_bytes (tests use a tiny one). Writes that do
 * not fit grow the map (doubling, up to 64 GiB) and are retried; only past that do they
 * fail, with -MDB_MAP_FULL. */
int idx_open_map(const char *dir, size_t map_bytes, struct idx **out);
/* The map's current size in bytes. */
size_t idx_map_size(const struct idx *ix);
void idx_close(struct idx *ix);
int idx_put(struct idx *ix, const char *key, const char *val, size_t len);
int idx_del(struct idx *ix, const char *key); /* deleting a missing key is not an error */
/* Calls cb for every record in key order; a non-zero return from cb stops and is returned. */
int idx_foreach(struct idx *ix,
                int (*cb)(void *ud, const char *key, size_t klen, const char *val, size_t vlen),
                void *ud);
int idx_sync(struct idx *ix);
const char *idx_strerror(int err);

#endif
