/* vmm_phase.c - the VM phase machine's one table (see vmm_phase.h). */
#include "vmm_phase.h"

#include <errno.h>

#define F_LIVE    (1u << 0)
#define F_STOP    (1u << 1)
#define F_CONT    (1u << 2)
#define F_SAVE    (1u << 3)
#define F_RESTORE (1u << 4)
#define F_RUNS    (1u << 5)
#define TO(p)     (1u << (p))
/* Where every live phase may end. */
#define ENDS (TO(VMM_PH_EXITED) | TO(VMM_PH_DETACHED) | TO(VMM_PH_FREED))

static const struct {
    const char *name;
    unsigned flags;
    unsigned to;
} phases[VMM_PH__COUNT] = {
    [VMM_PH_BOOTING] = {"booting", F_LIVE | F_STOP,
                        TO(VMM_PH_RUNNING) | TO(VMM_PH_STOPPED) | TO(VMM_PH_WAITING) |
                            TO(VMM_PH_SEALED) | ENDS},
    [VMM_PH_WAITING] = {"waiting", F_LIVE | F_RESTORE, TO(VMM_PH_RESTORING) | ENDS},
    [VMM_PH_RESTORING] = {"restoring", F_LIVE,
                          TO(VMM_PH_STOPPED) | TO(VMM_PH_RUNNING) | TO(VMM_PH_WAITING) | ENDS},
    [VMM_PH_RUNNING] = {"running", F_LIVE | F_STOP | F_SAVE | F_RUNS,
                        TO(VMM_PH_STOPPED) | TO(VMM_PH_SAVING) | ENDS},
    [VMM_PH_STOPPED] = {"stopped", F_LIVE | F_CONT | F_SAVE,
                        TO(VMM_PH_RUNNING) | TO(VMM_PH_SAVING) | ENDS},
    [VMM_PH_SAVING] = {"saving", F_LIVE, TO(VMM_PH_STOPPED) | TO(VMM_PH_SEALED) | ENDS},
    [VMM_PH_SEALED] = {"sealed", F_LIVE, ENDS},
    [VMM_PH_EXITED] = {"exited", 0, TO(VMM_PH_FREED)},
    [VMM_PH_DETACHED] = {"detached", 0, TO(VMM_PH_FREED)},
    [VMM_PH_FREED] = {"freed", 0, 0},
};

static bool valid(enum vmm_phase p)
{
    return (unsigned)p < VMM_PH__COUNT;
}

const char *vmm_phase_name(enum vmm_phase p)
{
    return valid(p) ? phases[p].name : "?";
}

int vmm_phase_check(enum vmm_phase from, enum vmm_phase to)
{
    if (!valid(from) || !valid(to) || !(phases[from].to & TO(to)))
        return -EINVAL;
    return 0;
}

static bool has(enum vmm_phase p, unsigned f)
{
    return valid(p) && (phases[p].flags & f);
}

bool vmm_phase_live(enum vmm_phase p)
{
    return has(p, F_LIVE);
}

bool vmm_phase_can_stop(enum vmm_phase p)
{
    return has(p, F_STOP);
}

bool vmm_phase_can_cont(enum vmm_phase p)
{
    return has(p, F_CONT);
}

bool vmm_phase_can_save(enum vmm_phase p)
{
    return has(p, F_SAVE);
}

bool vmm_phase_can_restore(enum vmm_phase p)
{
    return has(p, F_RESTORE);
}

bool vmm_phase_guest_runs(enum vmm_phase p)
{
    return has(p, F_RUNS);
}
