/*
 * vmm_phase.h - one VM's phases as an explicit state machine.
 *
 *   BOOTING    process started (kernel or template boot, or adopted), QMP
 *              handshake and the first query-status pending
 *   WAITING    started with -incoming defer (restore mode): no guest yet,
 *              waits for vmm_restore
 *   RESTORING  vmm_restore accepted: snapshot checked, migrate-incoming
 *              sent, waiting for MIGRATION completed
 *   RUNNING    vCPUs run (query-status or RESUME said so)
 *   STOPPED    vCPUs paused (STOP, or a restore that completed paused)
 *   SAVING     vmm_save: stop + migrate to a file + the file made durable
 *   SEALED     a TEMPLATE VM after a successful save: its memory file is now
 *              what clones map, so it must never run again (no cont, no save)
 *   EXITED     the process is gone (cbs->exited ran)
 *   DETACHED   vmm_detach: the process lives on, this struct no longer watches
 *   FREED      vmm_free ran (the struct may linger until the process is reaped)
 *
 *   BOOTING   -> RUNNING, STOPPED, WAITING (adopted while waiting),
 *                SEALED (an adopted TEMPLATE VM whose save had completed)
 *   WAITING   -> RESTORING
 *   RESTORING -> STOPPED (completed, guest paused), RUNNING (RESUME),
 *                WAITING (refused before the stream reached QEMU)
 *   RUNNING   <-> STOPPED;  RUNNING, STOPPED -> SAVING -> STOPPED, SEALED
 *   every live phase -> EXITED, DETACHED;  every phase but FREED -> FREED
 *
 * vmm.c changes phases only through one function, which checks this table and
 * refuses (and writes into qemu.log) an illegal change. Callers ask the
 * predicates, never compare phases by order. Pure: unit-tested in
 * tests/vmm-driver/test_vmm_unit.c.
 */
#ifndef WARREN_VMM_PHASE_H
#define WARREN_VMM_PHASE_H

#include <stdbool.h>

enum vmm_phase {
    VMM_PH_BOOTING,
    VMM_PH_WAITING,
    VMM_PH_RESTORING,
    VMM_PH_RUNNING,
    VMM_PH_STOPPED,
    VMM_PH_SAVING,
    VMM_PH_SEALED,
    VMM_PH_EXITED,
    VMM_PH_DETACHED,
    VMM_PH_FREED,
    VMM_PH__COUNT
};

/* "booting", "waiting", ... ; "?" out of range. */
const char *vmm_phase_name(enum vmm_phase p);
/* 0 if from -> to is allowed, else -EINVAL (also out of range, and from == to). */
int vmm_phase_check(enum vmm_phase from, enum vmm_phase to);

/* The driver watches the process and may make callbacks (not exited, detached, freed). */
bool vmm_phase_live(enum vmm_phase p);
/* vmm_stop may be asked (BOOTING, RUNNING). */
bool vmm_phase_can_stop(enum vmm_phase p);
/* vmm_cont may be asked (STOPPED). */
bool vmm_phase_can_cont(enum vmm_phase p);
/* vmm_save may be asked (RUNNING, STOPPED). */
bool vmm_phase_can_save(enum vmm_phase p);
/* vmm_restore may be asked (WAITING). */
bool vmm_phase_can_restore(enum vmm_phase p);
/* The guest's vCPUs run (RUNNING). */
bool vmm_phase_guest_runs(enum vmm_phase p);

#endif
