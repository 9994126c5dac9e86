/*
 * watch_ev.h - a file watch's output (the lines guest-init's --watch builtin
 * prints, guest-init/watch.h) turned into the events a client gets. The guest
 * is hostile: every line is parsed with a size cap, checked against the shapes
 * the builtin prints (a known type, known keys, strings and booleans where
 * they belong) and rebuilt from what was checked, with the stream offset of its
 * end added; anything else is dropped and counted. Pure: no I/O, no lws; fuzzed
 * (tests/fuzz/fuzz_watch.c) and unit-tested (tests/server/test_watch_ev.c).
 *
 * Ownership: the decoder owns its line buffer (at most max_line bytes, freed by
 * watch_ev_free); an event handed to the callback is borrowed for the call.
 */
#ifndef WARREN_WATCH_EV_H
#define WARREN_WATCH_EV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define WATCH_TAG_PREFIX "watch:" /* the tag of every watch's process */

struct watch_ev {
    char *buf; /* the line being collected */
    size_t len, max;
    uint64_t next;    /* stream offset of the next byte expected */
    bool skip;        /* discarding up to the next newline (after a gap, or an overlong line) */
    uint64_t dropped; /* lines refused */
};

/* One event, checked: {"type":...,...,"offset":N}. Return nonzero to stop feeding. */
typedef int watch_ev_emit(void *user, json_t *ev);

/* max_line: longest line accepted, '\n' excluded. next: the offset the stream starts at
 * (a resume's may fall inside a line: that line is refused as malformed). 0 or -ENOMEM. */
int watch_ev_init(struct watch_ev *w, size_t max_line, uint64_t next);
void watch_ev_free(struct watch_ev *w);
/* n stream bytes at offset off. Bytes before w->next are ignored (seen already); a
 * start past it is a gap: the line it cut is dropped. Returns 0, or the first nonzero
 * value emit returned (the bytes after that line are then not consumed). */
int watch_ev_feed(struct watch_ev *w, uint64_t off, const void *p, size_t n, watch_ev_emit *emit,
                  void *user);
/* The stream goes on at offset next after a gap (bytes lost from the ring). */
void watch_ev_gap(struct watch_ev *w, uint64_t next);
/* One line (without its '\n') whose end is at stream offset end: the event, or NULL if it
 * is not one the builtin prints. New reference. */
json_t *watch_ev_line(const char *line, size_t n, uint64_t end);

#endif
