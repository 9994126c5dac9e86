/* http_phase.c - the HTTP request lifecycle's one table (see http_phase.h). */
#include "http_phase.h"

#include <errno.h>

#define F_COLLECT  (1u << 0)
#define F_OP       (1u << 1)
#define F_RESUME   (1u << 2)
#define F_COMPLETE (1u << 3)
#define F_LINGER   (1u << 4)
#define TO(ph)     (1u << (ph))

static const struct {
    const char *name;
    unsigned flags;
    unsigned to; /* TO() of each phase it may go to */
} phases[HP__COUNT] = {
    /* Errors of routing and checks are answered right here. */
    [HP_HEAD] = {"head", 0,
                 TO(HP_BODY) | TO(HP_RUN) | TO(HP_RESUMING) | TO(HP_OP) | TO(HP_COMPLETE)},
    /* Too big, out of memory, malformed chunking: answered before the body is whole. */
    [HP_BODY] = {"body", F_COLLECT, TO(HP_RUN) | TO(HP_COMPLETE)},
    [HP_RUN] = {"run", 0, TO(HP_RESUMING) | TO(HP_OP) | TO(HP_COMPLETE)},
    [HP_RESUMING] = {"resuming", F_OP | F_RESUME, TO(HP_RUN) | TO(HP_ANSWER)},
    [HP_OP] = {"op", F_OP, TO(HP_STREAM) | TO(HP_ANSWER)},
    [HP_STREAM] = {"stream", F_OP, TO(HP_ANSWER)},
    [HP_ANSWER] = {"answer", 0, TO(HP_COMPLETE)},
    [HP_COMPLETE] = {"complete", F_COMPLETE, TO(HP_LINGER)},
    /* The next request on the connection starts from a zeroed pss, not from here. */
    [HP_LINGER] = {"linger", F_COMPLETE | F_LINGER, 0},
};

static bool valid(enum http_phase ph)
{
    return (unsigned)ph < HP__COUNT;
}

const char *http_phase_name(enum http_phase ph)
{
    return valid(ph) ? phases[ph].name : "?";
}

int http_phase_check(enum http_phase from, enum http_phase to)
{
    if (!valid(from) || !valid(to) || !(phases[from].to & TO(to)))
        return -EINVAL;
    return 0;
}

static bool has(enum http_phase ph, unsigned f)
{
    return valid(ph) && (phases[ph].flags & f);
}

bool http_phase_collecting(enum http_phase ph)
{
    return has(ph, F_COLLECT);
}

bool http_phase_op_live(enum http_phase ph)
{
    return has(ph, F_OP);
}

bool http_phase_op_running(enum http_phase ph)
{
    return has(ph, F_OP) && !has(ph, F_RESUME);
}

bool http_phase_resuming(enum http_phase ph)
{
    return has(ph, F_RESUME);
}

bool http_phase_complete(enum http_phase ph)
{
    return has(ph, F_COMPLETE);
}

bool http_phase_lingering(enum http_phase ph)
{
    return has(ph, F_LINGER);
}
