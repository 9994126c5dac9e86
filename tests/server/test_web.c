/*
 * Unit test of server/web.c: the browser terminal's allow-list. The files
 * it serves map to fixed names under web_dir with the right Content-Type;
 * /terminal/{id} takes only a sandbox id; and no path (traversal, encoded
 * or doubled slashes, prefixes, suffixes) reaches anything else.
 */
#include <stdio.h>
#include <string.h>

#include "web.h"

int failures;
#include "check.h"

static int look(const char *path, const struct web_file **f)
{
    return web_lookup(path, f);
}

static void expect_file(const char *path, enum web_src src, const char *rel, const char *ctype)
{
    const struct web_file *f = NULL;
    int r = look(path, &f);

    if (r != WEB_FILE || !f) {
        fprintf(stderr, "%s: expected a file, got %d\n", path, r);
        failures++;
        return;
    }
    CHECK(f->src == src);
    CHECK(!strncmp(f->ctype, ctype, strlen(ctype)));
    if (src == WEB_DIR) {
        CHECK(f->rel && !strcmp(f->rel, rel));
        /* Relative, and nothing that climbs: it is joined to web_dir. */
        CHECK(f->rel[0] != '/' && !strstr(f->rel, ".."));
    } else {
        CHECK(f->data && f->len && *f->len > 0);
    }
}

static void expect(const char *path, int want)
{
    const struct web_file *f = (const struct web_file *)1;
    int r = look(path, &f);

    if (r != want) {
        fprintf(stderr, "%s: expected %d, got %d\n", path, want, r);
        failures++;
    }
    if (r != WEB_FILE)
        CHECK(f == NULL);
}

int main(void)
{
    const struct web_file *f;

    expect_file("/terminal/sbx-0123abcd", WEB_EMBED, NULL, "text/html");
    expect_file("/terminal/A_b-9/", WEB_EMBED, NULL, "text/html");
    expect_file("/static/terminal.js", WEB_EMBED, NULL, "text/javascript");
    expect_file("/static/xterm/xterm.js", WEB_DIR, "@xterm/xterm/lib/xterm.js", "text/javascript");
    expect_file("/static/xterm/xterm.css", WEB_DIR, "@xterm/xterm/css/xterm.css", "text/css");
    expect_file("/static/xterm/addon-fit.js", WEB_DIR, "@xterm/addon-fit/lib/addon-fit.js",
                "text/javascript");

    /* The page is the compiled-in web/terminal.html, the script web/terminal.js. */
    CHECK(look("/terminal/x", &f) == WEB_FILE && strstr((const char *)f->data, "<html"));
    CHECK(strstr((const char *)f->data, "/static/xterm/xterm.js") != NULL);
    CHECK(look("/static/terminal.js", &f) == WEB_FILE &&
          strstr((const char *)f->data, "warren.pty.v1"));

    /* Not ours: left to the REST router. */
    expect("/", WEB_NONE);
    expect("/healthz", WEB_NONE);
    expect("/v1/sandboxes/x/pty", WEB_NONE);
    expect("/terminals/x", WEB_NONE);
    expect("/staticx/xterm/xterm.js", WEB_NONE);
    expect("/favicon.ico", WEB_NONE);

    /* Ours, but nothing there: 404, never a file. */
    expect("/terminal", WEB_NOTFOUND);
    expect("/terminal/", WEB_NOTFOUND);
    expect("/terminal//", WEB_NOTFOUND);
    expect("/terminal/a/b", WEB_NOTFOUND);
    expect("/terminal/../etc/passwd", WEB_NOTFOUND);
    expect("/terminal/..", WEB_NOTFOUND);
    expect("/terminal/a%2fb", WEB_NOTFOUND);
    expect("/terminal/a b", WEB_NOTFOUND);
    expect("/terminal/"
           "01234567890123456789012345678901234567890123456789012345678901234", /* 65 */
           WEB_NOTFOUND);
    expect("/static", WEB_NOTFOUND);
    expect("/static/", WEB_NOTFOUND);
    expect("/static/xterm", WEB_NOTFOUND);
    expect("/static/xterm/", WEB_NOTFOUND);
    expect("/static/xterm/../../../../etc/passwd", WEB_NOTFOUND);
    expect("/static/xterm/../xterm/xterm.js", WEB_NOTFOUND);
    expect("/static/xterm/./xterm.js", WEB_NOTFOUND);
    expect("/static/xterm//xterm.js", WEB_NOTFOUND);
    expect("/static//xterm/xterm.js", WEB_NOTFOUND);
    expect("/static/xterm/xterm.js/", WEB_NOTFOUND);
    expect("/static/xterm/xterm.js.map", WEB_NOTFOUND);
    expect("/static/xterm/xterm.jsx", WEB_NOTFOUND);
    expect("/static/xterm/XTERM.JS", WEB_NOTFOUND);
    expect("/static/xterm/%2e%2e/package.json", WEB_NOTFOUND);
    expect("/static/xterm/@xterm/xterm/lib/xterm.js", WEB_NOTFOUND);
    expect("/static/xterm/lib/xterm.js", WEB_NOTFOUND);
    expect("/static/package.json", WEB_NOTFOUND);
    expect("/static/terminal.html", WEB_NOTFOUND);
    expect("/static/xterm/xterm.js\\..\\..", WEB_NOTFOUND);

    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    else
        printf("web: all checks passed\n");
    return failures ? 1 : 0;
}
