/*
 * bg.c - one worker thread for disk work (see bg.h).
 *
 * Two lists under one mutex: `todo` (queued, FIFO) for the worker and
 * `finished` (work done, done() pending) for the loop, which the worker
 * signals through an ev_async. Jobs without done() are freed by the worker.
 */
#include "bg.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct job {
    struct job *next;
    void (*work)(void *);
    void (*done)(void *);
    void *arg;
};

struct bg {
    struct ev_loop *loop;
    ev_async wake;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *todo, **todo_tail;
    struct job *finished, **finished_tail;
    bool stopping;
};

static void *worker(void *p)
{
    struct bg *b = p;

    pthread_mutex_lock(&b->mu);
    for (;;) {
        struct job *j;
        while (!b->todo && !b->stopping)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->todo)
            break; /* stopping and nothing left */
        j = b->todo;
        b->todo = j->next;
        if (!b->todo)
            b->todo_tail = &b->todo;
        pthread_mutex_unlock(&b->mu);
        j->work(j->arg);
        pthread_mutex_lock(&b->mu);
        if (!j->done) {
            free(j);
            continue;
        }
        j->next = NULL;
        *b->finished_tail = j;
        b->finished_tail = &j->next;
        ev_async_send(b->loop, &b->wake);
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

/* Run done() of every finished job, on the loop thread. */
static void reap_finished(struct bg *b)
{
    struct job *list;

    pthread_mutex_lock(&b->mu);
    list = b->finished;
    b->finished = NULL;
    b->finished_tail = &b->finished;
    pthread_mutex_unlock(&b->mu);
    while (list) {
        struct job *j = list;
        list = j->next;
        j->done(j->arg);
        free(j);
    }
}

static void on_wake(struct ev_loop *loop, ev_async *w, int revents)
{
    reap_finished(w->data);
}

int bg_new(struct ev_loop *loop, struct bg **out)
{
    struct bg *b = calloc(1, sizeof(*b));
    int r;

    if (!b)
        return -ENOMEM;
    b->loop = loop;
    b->todo_tail = &b->todo;
    b->finished_tail = &b->finished;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    ev_async_init(&b->wake, on_wake);
    b->wake.data = b;
    ev_async_start(loop, &b->wake);
    /* The loop must not keep running for this watcher alone. */
    ev_unref(loop);
    r = pthread_create(&b->thread, NULL, worker, b);
    if (r != 0) {
        ev_ref(loop);
        ev_async_stop(loop, &b->wake);
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return -r;
    }
    *out = b;
    return 0;
}

int bg_run(struct bg *b, void (*work)(void *arg), void (*done)(void *arg), void *arg)
{
    struct job *j = calloc(1, sizeof(*j));

    if (!j)
        return -ENOMEM;
    j->work = work;
    j->done = done;
    j->arg = arg;
    pthread_mutex_lock(&b->mu);
    *b->todo_tail = j;
    b->todo_tail = &j->next;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

void bg_free(struct bg *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stopping = true;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    reap_finished(b);
    ev_ref(b->loop);
    ev_async_stop(b->loop, &b->wake);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}
