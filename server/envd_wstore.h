/*
 * envd_wstore.h - where a polling watcher of E2B's envd door (CreateWatcher,
 * GetWatcherEvents) has read to, kept on disk so that it survives a restart
 * of warrend, as the watch it reads does (a process of the sandbox, whose
 * output ring is the sandbox's).
 *
 * One small file per watcher, state_dir/envd-watchers/<sandbox>.<pid>,
 * holding the offset in decimal; replaced whole (a temporary file renamed
 * over it), so a warrend killed at any point leaves the old offset or the
 * new one, never a torn one. The offset is saved before the events it moves
 * past are answered: after a kill -9 and a restart, the next call gives the
 * events not yet given, none twice. Not fsync'd: the page cache outlives the
 * process (a crash of the host itself may give some events again).
 */
#ifndef WARREN_ENVD_WSTORE_H
#define WARREN_ENVD_WSTORE_H

#include <stdbool.h>
#include <stdint.h>

#define ENVD_WSTORE_DIR "envd-watchers"

/* 0, or a negative errno. */
int envd_wstore_save(const char *state_dir, const char *sbx, uint32_t pid, uint64_t off);
/* 0 with *off, -ENOENT when there is none, -EINVAL for a file that is not one. */
int envd_wstore_load(const char *state_dir, const char *sbx, uint32_t pid, uint64_t *off);
void envd_wstore_del(const char *state_dir, const char *sbx, uint32_t pid);
/* Remove the records of every sandbox for which live(ud, sbx) is false. */
void envd_wstore_sweep(const char *state_dir, bool (*live)(void *ud, const char *sbx), void *ud);

#endif
