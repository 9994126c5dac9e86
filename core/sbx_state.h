/*
 * sbx_state.h - the sandbox lifecycle as an explicit state machine.
 *
 *   STARTING --guest answered its first INIT--> RUNNING
 *   RUNNING --idle for freeze_after_ms--> FROZEN (VM stopped in place, memory kept)
 *   FROZEN --any operation, a guest channel (re)connect, a restart--> RUNNING
 *   STARTING, RUNNING, FROZEN --deleted, TTL, idle--> ENDED
 *   STARTING, RUNNING, FROZEN --VM exit, boot timeout, violations, start failure--> DEAD
 *   RUNNING, FROZEN --pause, or idle with persistent--> PAUSED (memory and disk in a
 *     snapshot, no VM: neither live nor final; its TTL stands still)
 *   PAUSED --resume, or any operation--> STARTING (a VM restored from that snapshot)
 *   PAUSED --deleted, paused_retention_s--> ENDED
 *   ENDED and DEAD are final.
 *
 * A sandbox is born STARTING (create) or in the state its index record holds
 * (restore); every later change goes through sbx_state_check (sbx.c's
 * sandbox_state_set applies it, and logs and refuses an illegal one). Code
 * asks the predicates below, never compares states by order, so adding a
 * state (paused, frozen) means a row in sbx_state.c's table and nothing else
 * unless a caller must treat it specially. Whether the guest channel is up is
 * a separate fact (struct sandbox's ch and ready), not a state here.
 *
 * Pure functions over the table: no I/O, unit-tested (tests/core/test_sbx_state.c).
 */
#ifndef WARREN_SBX_STATE_H
#define WARREN_SBX_STATE_H

#include <stdbool.h>

enum sbx_state { ST_STARTING, ST_RUNNING, ST_ENDED, ST_DEAD, ST_FROZEN, ST_PAUSED, ST__COUNT };

/* "starting", "running", "ended", "dead", "frozen", "paused" (what the index keeps); "?" out
 * of range. */
const char *sbx_state_name(enum sbx_state s);
/* The state of that name: 0 and *out, or -EINVAL. */
int sbx_state_parse(const char *name, enum sbx_state *out);
/* 0 if from -> to is an allowed transition, else -EINVAL (also for a state out of range). */
int sbx_state_check(enum sbx_state from, enum sbx_state to);

/* The sandbox holds a VM and its resources (memory quota, live count): not ended, not
 * paused. */
bool sbx_state_live(enum sbx_state s);
/* Ended or dead: no way back; its record is kept until the reaper purges it. */
bool sbx_state_final(enum sbx_state s);
/* Operations (exec, files) may run, given a guest channel that is ready. */
bool sbx_state_accepts_ops(enum sbx_state s);
/* The TTL and idle timeout count down (frozen time counts too). */
bool sbx_state_expires(enum sbx_state s);
/* The VM is stopped in place: an operation continues it first (and then it is RUNNING). */
bool sbx_state_stopped(enum sbx_state s);
/* What a client sees as the state: a frozen sandbox is "running" (it answers every request
 * as one does; GET says "frozen": true beside it). */
const char *sbx_state_shown(enum sbx_state s);

#endif
