/*
 * sbx_util.h - helpers of the sandbox table that other core modules (the pool)
 * may call without its internals: clocks, a file's identity, the state dir's
 * tag, template names. Pure: no table, no state kept.
 */
#ifndef WARREN_SBX_UTIL_H
#define WARREN_SBX_UTIL_H

#include <stdbool.h>
#include <stdint.h>

/* Milliseconds on CLOCK_MONOTONIC: every deadline and duration. */
int64_t sbx_now_ms(void);
/* Milliseconds on CLOCK_REALTIME: only timestamps shown to clients or saved. */
int64_t sbx_wall_ms(void);

/* The identity of a file something depends on (a template's base image). */
struct sbx_ident {
    char path[4096];
    long long size, mtime_ns, ino;
};
/* path resolved and stat'ed: 0 or -errno. */
int sbx_ident_get(struct sbx_ident *id, const char *path);
/* Whether the recorded identity was is the file's now: NULL, or what differs. */
const char *sbx_ident_differs(const struct sbx_ident *was, const struct sbx_ident *now);

/* The state dir's tag: FNV-1a of its path, 8 hex digits. It names what one warrend
 * makes outside its state dir (cgroups, network namespaces, /dev/shm files), so a
 * warrend's sweep reaches only its own. */
void sbx_state_tag(const char *state_dir, char out[9]);

/* A template's name: 1-48 of [a-z0-9_-] (its image is image_dir/<name>.ext4). */
bool sbx_template_name_ok(const char *s);

#endif
