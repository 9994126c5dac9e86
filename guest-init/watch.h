/*
 * watch.h - "warren-init --watch": a file watcher run as an ordinary process
 * of the sandbox (through /proc/1/exe), so it is a background process like
 * any other: its stdout goes to its output ring, the host reads it from any
 * offset, and it lives until it is signalled or the sandbox ends.
 *
 *   --watch [--recursive] [--max-watches N] [--coalesce-ms N] [--] DIR
 *
 * Prints one JSON object per line on stdout (the host's parser, server/watch_ev.c,
 * takes exactly these):
 *   {"type":"ready","path":ROOT,"recursive":B,"watches":N}   once, after the first scan
 *   {"type":"error","code":"not_found"|"not_a_directory"|"bad_request"|"internal",
 *    "message":M}                                            instead of ready; exit 2
 *   {"type":T,"name":REL,"path":ABS[,"dir":true][,"from":REL]}
 *       T is create, write, remove, rename (name is the new name, from the old one;
 *       a move out of the tree is a remove, a move into it a create) or chmod
 *   {"type":"unwatched","name":REL,"path":ABS,"reason":"limit"|"too_long"|"error"}
 *       a directory whose events will not be seen
 *   {"type":"lost","reason":"overflow"}  the kernel's queue overflowed: events are gone
 * Writes of one file within the coalescing window come out as one write, and one
 * more at the end of the window if more came.
 * The watched directory itself removed or moved away: a remove of "" and exit 0.
 */
#ifndef WARREN_GI_WATCH_H
#define WARREN_GI_WATCH_H

#define GI_WATCH_MAX_DEFAULT      8192 /* directories watched (see watch.c) */
#define GI_WATCH_MAX_LIMIT        1048576
#define GI_WATCH_COALESCE_DEFAULT 100 /* ms */

/* argv[0] is "--watch". Returns the process's exit status. */
int gi_watch_main(int argc, char **argv);

#endif
