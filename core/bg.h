/*
 * bg.h - work that may wait on the disk, done off the event loop.
 *
 * One worker thread runs jobs in the order they were queued (so "remove the
 * disk, keep the logs" queued before "remove the rest" runs first). A job's
 * work() runs on the worker and must touch nothing the loop owns; its done()
 * (optional) runs later on the loop thread, from an ev_async watcher.
 *
 * Ownership: arg belongs to the caller until done() runs (or, without
 * done(), until work() returns: work() then frees it if it must). The loop
 * never waits on a job, except in bg_free(), which runs every job still
 * queued (work and done) before it returns: shutdown loses no removal and
 * no index flush.
 */
#ifndef WARREN_BG_H
#define WARREN_BG_H

#include <ev.h>

struct bg;

int bg_new(struct ev_loop *loop, struct bg **out);
/* Queue a job. 0, or -ENOMEM (then nothing was queued and nothing will be called). */
int bg_run(struct bg *b, void (*work)(void *arg), void (*done)(void *arg), void *arg);
/* Finish every queued job, stop the thread, free. NULL is a no-op. */
void bg_free(struct bg *b);

#endif
