/*
 * web.c - the browser terminal's allow-list and its path lookup (pure; see
 * web.h). The handler that reads and answers is web_serve.c.
 */
#include "web.h"

#include <stdbool.h>
#include <string.h>

#include "api.h" /* API_ID_MAX */

#define CT_HTML "text/html; charset=utf-8"
#define CT_JS   "text/javascript; charset=utf-8"
#define CT_CSS  "text/css; charset=utf-8"

static const struct web_file page = {
    "/terminal/", WEB_EMBED, NULL, web_terminal_html, &web_terminal_html_len, CT_HTML,
};

static const struct web_file files[] = {
    {"/static/terminal.js", WEB_EMBED, NULL, web_terminal_js, &web_terminal_js_len, CT_JS},
    {"/static/xterm/xterm.js", WEB_DIR, WEB_XTERM_REL, NULL, NULL, CT_JS},
    {"/static/xterm/xterm.css", WEB_DIR, "@xterm/xterm/css/xterm.css", NULL, NULL, CT_CSS},
    {"/static/xterm/addon-fit.js", WEB_DIR, "@xterm/addon-fit/lib/addon-fit.js", NULL, NULL, CT_JS},
};

static bool id_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static bool has_prefix(const char *s, const char *pfx)
{
    return strncmp(s, pfx, strlen(pfx)) == 0;
}

int web_lookup(const char *path, const struct web_file **f)
{
    size_t len = strlen(path), n;

    *f = NULL;
    if (has_prefix(path, "/terminal/")) {
        const char *id = path + 10;
        /* One trailing slash is tolerated, as on the REST routes. */
        n = strlen(id);
        if (n && id[n - 1] == '/')
            n--;
        if (n == 0 || n > API_ID_MAX)
            return WEB_NOTFOUND;
        for (size_t i = 0; i < n; i++) {
            if (!id_char(id[i]))
                return WEB_NOTFOUND;
        }
        *f = &page;
        return WEB_FILE;
    }
    if (!has_prefix(path, "/static/") && strcmp(path, "/terminal") && strcmp(path, "/static"))
        return WEB_NONE;
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
        if (strlen(files[i].url) == len && memcmp(files[i].url, path, len) == 0) {
            *f = &files[i];
            return WEB_FILE;
        }
    }
    return WEB_NOTFOUND;
}
