/* sbx_state.c - the sandbox lifecycle's one table (see sbx_state.h). */
#include "sbx_state.h"

#include <errno.h>
#include <string.h>

#define F_LIVE    (1u << 0)
#define F_FINAL   (1u << 1)
#define F_OPS     (1u << 2)
#define F_EXPIRES (1u << 3)
#define F_STOPPED (1u << 4)
#define TO(s)     (1u << (s))

static const struct {
    const char *name;
    unsigned flags;
    unsigned to; /* TO() of each state it may go to */
} states[ST__COUNT] = {
    [ST_STARTING] = {"starting", F_LIVE,
                     TO(ST_RUNNING) | TO(ST_PAUSED) | TO(ST_ENDED) | TO(ST_DEAD)},
    [ST_RUNNING] = {"running", F_LIVE | F_OPS | F_EXPIRES,
                    TO(ST_FROZEN) | TO(ST_PAUSED) | TO(ST_ENDED) | TO(ST_DEAD)},
    [ST_ENDED] = {"ended", F_FINAL, 0},
    [ST_DEAD] = {"dead", F_FINAL, 0},
    /* Not F_OPS: an operation thaws it first (sbx_usable), so none runs on a stopped VM. */
    [ST_FROZEN] = {"frozen", F_LIVE | F_EXPIRES | F_STOPPED,
                   TO(ST_RUNNING) | TO(ST_PAUSED) | TO(ST_ENDED) | TO(ST_DEAD)},
    /* No VM, no quota held, its TTL stands still; a resume boots nothing but restores
     * (STARTING again until the guest answers). */
    [ST_PAUSED] = {"paused", 0, TO(ST_STARTING) | TO(ST_ENDED) | TO(ST_DEAD)},
};

static bool valid(enum sbx_state s)
{
    return (unsigned)s < ST__COUNT;
}

const char *sbx_state_name(enum sbx_state s)
{
    return valid(s) ? states[s].name : "?";
}

int sbx_state_parse(const char *name, enum sbx_state *out)
{
    for (unsigned i = 0; i < ST__COUNT; i++) {
        if (strcmp(name, states[i].name) == 0) {
            *out = (enum sbx_state)i;
            return 0;
        }
    }
    return -EINVAL;
}

int sbx_state_check(enum sbx_state from, enum sbx_state to)
{
    if (!valid(from) || !valid(to) || !(states[from].to & TO(to)))
        return -EINVAL;
    return 0;
}

static bool has(enum sbx_state s, unsigned f)
{
    return valid(s) && (states[s].flags & f);
}

bool sbx_state_live(enum sbx_state s)
{
    return has(s, F_LIVE);
}

bool sbx_state_final(enum sbx_state s)
{
    return has(s, F_FINAL);
}

bool sbx_state_accepts_ops(enum sbx_state s)
{
    return has(s, F_OPS);
}

bool sbx_state_expires(enum sbx_state s)
{
    return has(s, F_EXPIRES);
}

bool sbx_state_stopped(enum sbx_state s)
{
    return has(s, F_STOPPED);
}

const char *sbx_state_shown(enum sbx_state s)
{
    return s == ST_FROZEN ? states[ST_RUNNING].name : sbx_state_name(s);
}
