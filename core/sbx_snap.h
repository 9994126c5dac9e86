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
 * Results are records (sbx.h: struct sbx_snap_rec, sandboxes as struct sbx_rec),
 * borrowed as sbx.h says; errors as in sbx.h.
 */
#ifndef WARREN_SBX_SNAP_H
#define WARREN_SBX_SNAP_H

#include "sbx.h"

/* A snapshot asked for: metadata (nmetadata entries) shown with it. */
struct sbx_snap_req {
    const struct sbx_kv *metadata;
    size_t nmetadata;
};

/* A fork: count sandboxes (SBX_UNSET: 1; 1..fork_max) from one snapshot of the parent. */
struct sbx_fork_req {
    int64_t count;
    bool ttl_given;      /* false: the parent's time left */
    int64_t ttl_s;       /* given: SBX_UNSET is the configured default */
    bool idle_given;     /* false: the parent's idle timeout */
    int64_t idle_s;      /* given: SBX_NOT_INT counts as 0, as it always has */
    bool metadata_given; /* false: the parent's metadata */
    const struct sbx_kv *metadata;
    size_t nmetadata;
};

/* Snapshot a sandbox: done(NULL, SBX_RES_SNAPSHOT) once the files are written and the
 * sandbox runs again. */
int sbx_snap_take(struct sbx_table *t, const char *id, const struct sbx_snap_req *req,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);
/* Every snapshot, oldest first: *n records in *out, an array the caller frees (free());
 * the records in it are borrowed. */
int sbx_snap_all(struct sbx_table *t, struct sbx_snap_rec **out, size_t *n, struct sbx_err *err);
int sbx_snap_find(struct sbx_table *t, const char *id, struct sbx_snap_rec *out,
                  struct sbx_err *err);
/* Remove a snapshot nothing depends on: its record as it was. SBX_E_SNAPSHOT_IN_USE,
 * naming what depends on it, when a live sandbox runs over its files or another
 * snapshot's disk is backed by its disk. */
int sbx_snap_drop(struct sbx_table *t, const char *id, struct sbx_snap_rec *out,
                  struct sbx_err *err);
/* Pause: memory and disk into the sandbox's own snapshot (type "pause"), then its VM
 * ends: state "paused" (in the index; its TTL stands still; paused_retention_s bounds it).
 * done(NULL, SBX_RES_SANDBOX). Already paused: 0 with *op 0 and *out its record, no
 * callback. */
int sbx_snap_pause(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
                   sbx_op_t *op, struct sbx_rec *out, struct sbx_err *err);
/* Resume a paused sandbox (a VM restored from its snapshot; its processes run on):
 * done(NULL, SBX_RES_SANDBOX) once its guest's session is up. Not paused (running,
 * frozen): 0 with *op 0 and *out its record, no callback. Starting (a resume or create
 * in progress): 0 and done(NULL, its record) once it is up. Any exec, file call or
 * socket on a paused sandbox starts the resume too (the REST routes then wait for it:
 * rest.c resume_first; uploads and sockets are answered sandbox_not_ready: retry). */
int sbx_snap_resume(struct sbx_table *t, const char *id, const struct sbx_sink *sink, void *user,
                    sbx_op_t *op, struct sbx_rec *out, struct sbx_err *err);
/* Is sandbox id paused, or starting (a resume, restore or create in progress)? A
 * request that reaches the guest may then wait for sbx_snap_resume, which answers once
 * the guest's session is up. */
bool sbx_coming_back(struct sbx_table *t, const char *id);
/* Fork: one snapshot of the sandbox (type "fork", removed by itself once its last fork
 * has ended), then req->count sandboxes created from it; the parent runs on.
 * done(NULL, SBX_RES_FORK: their records, in the order they came up, and the snapshot's
 * id) once all are up; if one fails, the others are deleted and done has its error.
 * The forks get the parent's env, metadata (unless given), idle timeout, keep_running
 * and remaining TTL (unless given). */
int sbx_snap_fork(struct sbx_table *t, const char *id, const struct sbx_fork_req *req,
                  const struct sbx_sink *sink, void *user, sbx_op_t *op, struct sbx_err *err);

#endif
