/*
 * test_sbx_state.c - the sandbox lifecycle table (core/sbx_state.c): the
 * allowed transitions and no others, final states stay final, the names the
 * index and GET use, and the predicates the table answers for each state.
 */
#include "sbx_state.h"
#include "check.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int failures;

static void test_transitions(void)
{
    /* allowed[from][to] */
    static const bool allowed[ST__COUNT][ST__COUNT] = {
        /* starting -> paused: a resume that failed before its guest came back. */
        [ST_STARTING] =
            {[ST_RUNNING] = true, [ST_PAUSED] = true, [ST_ENDED] = true, [ST_DEAD] = true},
        [ST_RUNNING] =
            {[ST_FROZEN] = true, [ST_PAUSED] = true, [ST_ENDED] = true, [ST_DEAD] = true},
        [ST_FROZEN] =
            {[ST_RUNNING] = true, [ST_PAUSED] = true, [ST_ENDED] = true, [ST_DEAD] = true},
        [ST_PAUSED] = {[ST_STARTING] = true, [ST_ENDED] = true, [ST_DEAD] = true},
    };
    for (int f = 0; f < ST__COUNT; f++)
        for (int t = 0; t < ST__COUNT; t++)
            CHECK((sbx_state_check((enum sbx_state)f, (enum sbx_state)t) == 0) == allowed[f][t]);
    /* Nothing goes back to starting, nothing leaves a final state. */
    CHECK(sbx_state_check(ST_RUNNING, ST_STARTING) == -EINVAL);
    CHECK(sbx_state_check(ST_ENDED, ST_RUNNING) == -EINVAL);
    CHECK(sbx_state_check(ST_DEAD, ST_ENDED) == -EINVAL);
    CHECK(sbx_state_check(ST__COUNT, ST_DEAD) == -EINVAL);
    CHECK(sbx_state_check(ST_RUNNING, ST__COUNT) == -EINVAL);
    /* A sandbox still booting is never frozen, and a frozen one never boots again. */
    CHECK(sbx_state_check(ST_STARTING, ST_FROZEN) == -EINVAL);
    CHECK(sbx_state_check(ST_FROZEN, ST_STARTING) == -EINVAL);
    CHECK(sbx_state_check(ST_ENDED, ST_FROZEN) == -EINVAL);
}

static void test_names(void)
{
    static const char *const names[] = {"starting", "running", "ended", "dead", "frozen", "paused"};
    enum sbx_state s;

    for (int i = 0; i < ST__COUNT; i++) {
        CHECK(!strcmp(sbx_state_name((enum sbx_state)i), names[i]));
        CHECK(sbx_state_parse(names[i], &s) == 0 && s == (enum sbx_state)i);
    }
    CHECK(sbx_state_parse("pause", &s) == -EINVAL);
    CHECK(sbx_state_parse("", &s) == -EINVAL);
    CHECK(!strcmp(sbx_state_name(ST__COUNT), "?"));
    /* Clients see a frozen sandbox as running; every other state by its own name. */
    CHECK(!strcmp(sbx_state_shown(ST_FROZEN), "running"));
    for (int i = 0; i < ST__COUNT; i++)
        if (i != ST_FROZEN)
            CHECK(!strcmp(sbx_state_shown((enum sbx_state)i), names[i]));
}

static void test_predicates(void)
{
    CHECK(sbx_state_live(ST_STARTING) && sbx_state_live(ST_RUNNING));
    CHECK(!sbx_state_live(ST_ENDED) && !sbx_state_live(ST_DEAD));
    CHECK(sbx_state_final(ST_ENDED) && sbx_state_final(ST_DEAD));
    CHECK(!sbx_state_final(ST_STARTING) && !sbx_state_final(ST_RUNNING));
    CHECK(sbx_state_accepts_ops(ST_RUNNING) && !sbx_state_accepts_ops(ST_STARTING));
    CHECK(!sbx_state_accepts_ops(ST_ENDED) && !sbx_state_accepts_ops(ST_DEAD));
    CHECK(sbx_state_expires(ST_RUNNING) && !sbx_state_expires(ST_STARTING));
    CHECK(!sbx_state_live(ST__COUNT) && !sbx_state_final(ST__COUNT));
    /* Frozen: holds its VM, its TTL and idle timeout run, but no op runs on it as it is. */
    CHECK(sbx_state_live(ST_FROZEN) && !sbx_state_final(ST_FROZEN));
    CHECK(sbx_state_expires(ST_FROZEN) && !sbx_state_accepts_ops(ST_FROZEN));
    for (int i = 0; i < ST__COUNT; i++)
        CHECK(sbx_state_stopped((enum sbx_state)i) == (i == ST_FROZEN));
    CHECK(!sbx_state_stopped(ST__COUNT));
    /* Paused: no VM, no quota, no TTL running, no op as it is (it is resumed first). */
    CHECK(!sbx_state_live(ST_PAUSED) && !sbx_state_final(ST_PAUSED));
    CHECK(!sbx_state_expires(ST_PAUSED) && !sbx_state_accepts_ops(ST_PAUSED));
    CHECK(!sbx_state_stopped(ST_PAUSED));
    /* Every other state is either live or final, never both. */
    for (int i = 0; i < ST__COUNT; i++)
        if (i != ST_PAUSED)
            CHECK(sbx_state_live((enum sbx_state)i) != sbx_state_final((enum sbx_state)i));
}

int main(void)
{
    test_transitions();
    test_names();
    test_predicates();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("sbx_state: all checks passed\n");
    return 0;
}
