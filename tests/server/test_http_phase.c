/*
 * test_http_phase.c - one HTTP request's lifecycle table (server/http_phase.c): the
 * allowed transitions and no others, an operation live only where it can still be
 * cancelled, and the predicates resp.c and rest.c ask instead of flags.
 */
#include "http_phase.h"
#include "check.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int failures;

static void test_transitions(void)
{
    /* allowed[from][to] */
    static const bool allowed[HP__COUNT][HP__COUNT] = {
        [HP_HEAD] = {[HP_BODY] = true,
                     [HP_RUN] = true,
                     [HP_RESUMING] = true,
                     [HP_OP] = true,
                     [HP_COMPLETE] = true},
        [HP_BODY] = {[HP_RUN] = true, [HP_COMPLETE] = true},
        [HP_RUN] = {[HP_RESUMING] = true, [HP_OP] = true, [HP_COMPLETE] = true},
        [HP_RESUMING] = {[HP_RUN] = true, [HP_ANSWER] = true},
        [HP_OP] = {[HP_STREAM] = true, [HP_ANSWER] = true},
        [HP_STREAM] = {[HP_ANSWER] = true},
        [HP_ANSWER] = {[HP_COMPLETE] = true},
        [HP_COMPLETE] = {[HP_LINGER] = true},
    };
    for (int f = 0; f < HP__COUNT; f++)
        for (int t = 0; t < HP__COUNT; t++)
            CHECK((http_phase_check((enum http_phase)f, (enum http_phase)t) == 0) == allowed[f][t]);
    /* A live operation is never dropped without passing through ANSWER (where it is
     * over or cancelled). */
    CHECK(http_phase_check(HP_OP, HP_COMPLETE) == -EINVAL);
    CHECK(http_phase_check(HP_RESUMING, HP_COMPLETE) == -EINVAL);
    CHECK(http_phase_check(HP_STREAM, HP_COMPLETE) == -EINVAL);
    /* A resume streams nothing: the request runs (or is refused) first. */
    CHECK(http_phase_check(HP_RESUMING, HP_STREAM) == -EINVAL);
    /* An answered request never runs again, a lingering one only closes. */
    CHECK(http_phase_check(HP_COMPLETE, HP_OP) == -EINVAL);
    CHECK(http_phase_check(HP_LINGER, HP_COMPLETE) == -EINVAL);
    /* No phase goes to itself: a second answer is resp_json's to ignore. */
    for (int i = 0; i < HP__COUNT; i++)
        CHECK(http_phase_check((enum http_phase)i, (enum http_phase)i) == -EINVAL);
    CHECK(http_phase_check(HP__COUNT, HP_HEAD) == -EINVAL);
    CHECK(http_phase_check(HP_HEAD, HP__COUNT) == -EINVAL);
}

static void test_names(void)
{
    static const char *const names[] = {"head",   "body",   "run",      "resuming", "op",
                                        "stream", "answer", "complete", "linger"};

    for (int i = 0; i < HP__COUNT; i++)
        CHECK(!strcmp(http_phase_name((enum http_phase)i), names[i]));
    CHECK(!strcmp(http_phase_name(HP__COUNT), "?"));
}

static void test_predicates(void)
{
    /* A zeroed pss is a request whose head just arrived. */
    CHECK(HP_HEAD == 0);
    for (int i = 0; i < HP__COUNT; i++) {
        enum http_phase ph = (enum http_phase)i;

        CHECK(http_phase_collecting(ph) == (ph == HP_BODY));
        CHECK(http_phase_op_live(ph) == (ph == HP_RESUMING || ph == HP_OP || ph == HP_STREAM));
        CHECK(http_phase_op_running(ph) == (ph == HP_OP || ph == HP_STREAM));
        CHECK(http_phase_resuming(ph) == (ph == HP_RESUMING));
        CHECK(http_phase_complete(ph) == (ph == HP_COMPLETE || ph == HP_LINGER));
        CHECK(http_phase_lingering(ph) == (ph == HP_LINGER));
        /* Nothing is both live and answered. */
        CHECK(!(http_phase_op_live(ph) && http_phase_complete(ph)));
    }
    CHECK(!http_phase_op_live(HP__COUNT) && !http_phase_complete(HP__COUNT));
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
    printf("http_phase: all checks passed\n");
    return 0;
}
