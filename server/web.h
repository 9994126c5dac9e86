/*
 * web.h - the browser terminal's static files, served by warrend:
 *
 *   GET /terminal/{id}             the page (web/terminal.html, compiled in)
 *   GET /static/terminal.js        its script (web/terminal.js, compiled in)
 *   GET /static/xterm/xterm.js     \
 *   GET /static/xterm/xterm.css     > read from web_dir (the npm packages
 *   GET /static/xterm/addon-fit.js /  scripts/setup.sh installs)
 *
 * A fixed allow-list, matched whole: no part of a request path is ever
 * joined to a directory, so no path can reach any other file. The page and
 * its files carry no secret (the page reads the sandbox id from its own
 * path and a token from its own query) and need no key; the WebSocket they
 * open is authorized as usual. Files are read whole with a size cap, on the
 * loop: they are small, local and off every hot path.
 *
 * web_lookup is pure (unit-tested in tests/server/test_web.c); web_request
 * answers through resp.c like any other route.
 */
#ifndef WARREN_WEB_H
#define WARREN_WEB_H

#include <stddef.h>

#define WEB_FILE_MAX (4u << 20) /* largest file served from web_dir */

enum web_src {
    WEB_EMBED, /* compiled in (web_assets.c) */
    WEB_DIR,   /* a file under web_dir */
};

struct web_file {
    const char *url;           /* the one path it answers */
    enum web_src src;          /* where its bytes come from */
    const char *rel;           /* WEB_DIR: path under web_dir */
    const unsigned char *data; /* WEB_EMBED: the bytes */
    const size_t *len;         /* WEB_EMBED: their length */
    const char *ctype;         /* Content-Type */
};

enum {
    WEB_NONE = 0,      /* not a web path: the REST router's */
    WEB_FILE = 1,      /* *f is the file to serve */
    WEB_NOTFOUND = -2, /* under /terminal/ or /static/ but not served: 404 */
};

/* Classify a decoded request path (no query). /terminal/{id} takes a sandbox id as the
 * REST routes do (1..API_ID_MAX of [A-Za-z0-9_-], one trailing slash tolerated); every
 * other web path must equal an allow-list entry exactly. */
int web_lookup(const char *path, const struct web_file **f);

/* The xterm.js file the page cannot work without, under web_dir (checked before the page
 * is served, so a missing install is a 503 that says what to do, not a blank page). */
#define WEB_XTERM_REL "@xterm/xterm/lib/xterm.js"

struct pss;
/* Answer a request web_lookup matched (rest.c calls it before the REST routes). */
void web_request(struct pss *p, const struct web_file *f);

/* web_assets.c, generated at build time from web/ (cmake/embed.cmake). */
extern const unsigned char web_terminal_html[];
extern const size_t web_terminal_html_len;
extern const unsigned char web_terminal_js[];
extern const size_t web_terminal_js_len;

#endif
