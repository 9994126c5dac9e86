/*
 * sbx_snap.h - snapshots of running sandboxes: take one, list,
 * look up and delete them; sbx_create restores new sandboxes from them
 * ("snapshot_id" in place of "template").
 *
 * A snapshot is the whole VM saved while it was stopped: device state and
 * all guest RAM (vmm_save of a VM whose RAM is not a share=on file writes its
 * RAM into the stream), plus a frozen copy of the sandbox's disk overlay
 * taken while the VM stayed stopped; then the sandbox continues (its clock
 * resynced). Files, under state_dir/snapshots/<snapshot id>/:
 *   state.snap     the vmm snapshot file (header, checksum, QEMU's stream)
 *   disk.qcow2     the overlay as it was, backed by what the sandbox's was:
 *                  the template's raw base image, or the disk of the snapshot
 *                  the sandbox was restored from (that snapshot then cannot be
 *                  deleted while this one exists), or backing.qcow2
 *   backing.qcow2  for a sandbox from the warm pool only: a hard link of the
 *                  pool template's frozen overlay, which disk.qcow2 is
 *                  rewritten to name (vmm_qcow2_rebase). The pool removes its
 *                  template's files on a clean shutdown and on a rebuild; the
 *                  link keeps that inode, read-only from then on, for as long
 *                  as the snapshot lives, without copying it and without the
 *                  pool having to know which templates snapshots still need.
 *                  (The template's RAM file is not needed: the clone's private
 *                  pages and the template's went into state.snap.)
 * A new sandbox from a snapshot gets an overlay backed by its disk.qcow2 and
 * a QEMU in restore mode with anonymous RAM; vmm_restore checks the file
 * (magic, checksum, QEMU version, guest size: a corrupt or truncated file is
 * refused with snapshot_invalid, no VM runs from it); then cont, a new channel
 * session (INIT: clock, entropy, hostname; the guest keeps its background
 * processes) and a RESYNC with a new boot id.
 *
 * The record (index table snapshots) holds the parent sandbox, the parent
 * snapshot (when the sandbox itself came from one), template, mem_mb, vcpus,
 * size, created time and the identity (path, size, mtime, inode) of the
 * template's base image: a snapshot whose base image changed since is
 * refused with a clear error. Records and files survive restarts (a kill -9
 * included); files no record names (a crash mid-snapshot) are removed at
 * start.
 *
 * Results are new json_t references; errors as in sbx.h.
 */
#ifndef WARREN_SBX_SNAP_H
#define WARREN_SBX_SNAP_H

#include <jansson.h>

#include "sbx.h"

/* Snapshot a sandbox; body may hold "metadata" (an object of strings). done(NULL,
 * the snapshot's record) once the files are written and the sandbox runs again. */
int sbx_snapshot(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
                 void *user, sbx_op_t *op, struct sbx_err *err);
/* {"snapshots": [...]}, oldest first. */
int sbx_snap_list(struct sbx_table *t, json_t **out, struct sbx_err *err);
int sbx_snap_get(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
/* Remove a snapshot nothing depends on: its record as it was. SBX_E_SNAPSHOT_IN_USE,
 * naming what depends on it, when a live sandbox runs over its files or another
 * snapshot's disk is backed by its disk. */
int sbx_snap_delete(struct sbx_table *t, const char *id, json_t **out, struct sbx_err *err);
/* Pause: memory and disk into the sandbox's own snapshot (type "pause"), then its VM
 * ends: state "paused" (in the index; its TTL stands still; paused_retention_s bounds it).
 * done(NULL, its record). Already paused: 0 with *out its record, no callback. Body {}. */
int sbx_pause(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
              void *user, sbx_op_t *op, json_t **out, struct sbx_err *err);
/* Resume a paused sandbox (a VM restored from its snapshot; its processes run on):
 * done(NULL, its record) once its guest's session is up. Not paused (running, frozen): 0
 * with *out its record, no callback. Starting (a resume or create in progress): 0 and
 * done(NULL, its record) once it is up. Any exec, file call or socket on a paused
 * sandbox starts the resume too (the REST routes then wait for it: rest.c
 * resume_first; uploads and sockets are answered sandbox_not_ready: retry). */
int sbx_resume(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
               sbx_op_t *op, json_t **out, struct sbx_err *err);
/* Is sandbox id paused, or starting (a resume, restore or create in progress)? A
 * request that reaches the guest may then wait for sbx_resume, which answers once the
 * guest's session is up. */
bool sbx_coming_back(struct sbx_table *t, const char *id);
/* Fork: body {"count": N (1..fork_max, default 1), "ttl_seconds", "idle_timeout_seconds",
 * "metadata"}: one snapshot of the sandbox (type "fork", removed by itself once its
 * last fork has ended), then N sandboxes created from it; the parent runs on.
 * done(NULL, {"sandboxes": [their records], "snapshot_id"}) once all are up; if one
 * fails, the others are deleted and done has its error. The forks get the parent's
 * env, metadata (unless given), idle timeout, keep_running and remaining TTL (unless
 * given). */
int sbx_fork(struct sbx_table *t, const char *id, json_t *body, const struct sbx_sink *sink,
             void *user, sbx_op_t *op, struct sbx_err *err);

#endif
