/*
 * test_bg.c - the disk-work thread: jobs run off the loop thread in the
 * order queued, done() runs on the loop thread, the loop does not wait for
 * the worker (a slow job does not delay a timer), and bg_free() finishes
 * everything still queued.
 */
#include "bg.h"
#include "check.h"

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NJOBS 64

int failures;

static pthread_t loop_thread;
static int order[NJOBS];
static int norder; /* written by the worker only */
static int ndone;  /* written on the loop only */
static bool off_loop = true;
static bool done_on_loop = true;
static volatile int release_slow; /* the slow job waits for this */

struct job {
    int n;
    bool slow;
};

static void work(void *arg)
{
    struct job *j = arg;

    if (pthread_equal(pthread_self(), loop_thread))
        off_loop = false;
    while (j->slow && !release_slow)
        usleep(1000);
    order[norder++] = j->n;
}

static void done(void *arg)
{
    if (!pthread_equal(pthread_self(), loop_thread))
        done_on_loop = false;
    ndone++;
}

static int timer_fired;

static void on_timer(struct ev_loop *loop, ev_timer *w, int revents)
{
    /* The slow job is still blocked: the loop ran this timer anyway. */
    timer_fired = ndone == 0;
    release_slow = 1;
}

static void on_check(struct ev_loop *loop, ev_timer *w, int revents)
{
    if (ndone == NJOBS)
        ev_break(loop, EVBREAK_ALL);
}

int main(void)
{
    struct ev_loop *loop = ev_default_loop(EVBACKEND_EPOLL);
    static struct job jobs[NJOBS];
    struct bg *b;
    ev_timer t, poll;

    loop_thread = pthread_self();
    CHECK(bg_new(loop, &b) == 0);
    for (int i = 0; i < NJOBS; i++) {
        jobs[i].n = i;
        jobs[i].slow = i == 0;
        CHECK(bg_run(b, work, done, &jobs[i]) == 0);
    }
    ev_timer_init(&t, on_timer, 0.05, 0);
    ev_timer_start(loop, &t);
    ev_timer_init(&poll, on_check, 0.01, 0.01);
    ev_timer_start(loop, &poll);
    ev_run(loop, 0);
    CHECK(timer_fired == 1);
    CHECK(ndone == NJOBS);
    CHECK(off_loop && done_on_loop);
    for (int i = 0; i < NJOBS; i++)
        CHECK(order[i] == i);
    ev_timer_stop(loop, &poll);

    /* bg_free runs what is still queued, work and done, before it returns. */
    release_slow = 0;
    norder = 0;
    ndone = 0;
    for (int i = 0; i < NJOBS; i++)
        CHECK(bg_run(b, work, i % 2 ? done : NULL, &jobs[i]) == 0);
    release_slow = 1;
    bg_free(b);
    CHECK(norder == NJOBS && ndone == NJOBS / 2);

    /* With no jobs the loop has nothing to wait for: ev_run returns at once. */
    CHECK(bg_new(loop, &b) == 0);
    ev_run(loop, 0);
    bg_free(b);
    ev_loop_destroy(loop);
    printf("test_bg: %s\n", failures ? "FAILED" : "ok");
    return failures != 0;
}
