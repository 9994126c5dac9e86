/*
 * Fuzz target: the browser terminal's path lookup (server/web.c). Whatever
 * the path, the answer is one of three, and a file is only ever served for
 * the exact URL it is listed under (or /terminal/ and a well-formed id):
 * no input reaches a file it does not name.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "web.h"

/* web.c only takes these by address; the real ones are generated from web/. */
const unsigned char web_terminal_html[] = "<html></html>";
const size_t web_terminal_html_len = sizeof(web_terminal_html) - 1;
const unsigned char web_terminal_js[] = "/* js */";
const size_t web_terminal_js_len = sizeof(web_terminal_js) - 1;

static int id_ok(const char *s, size_t n)
{
    if (n && s[n - 1] == '/')
        n--;
    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return 0;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct web_file *f;
    char *path;
    int r;

    if (size > 4096)
        return 0;
    path = malloc(size + 1);
    if (!path)
        return 0;
    memcpy(path, data, size);
    path[size] = '\0';
    r = web_lookup(path, &f);
    if (r == WEB_FILE) {
        if (!f)
            abort();
        if (!strncmp(path, "/terminal/", 10)) {
            if (!id_ok(path + 10, strlen(path + 10)) || f->src != WEB_EMBED)
                abort();
        } else if (strcmp(path, f->url) != 0) {
            abort();
        }
        if (f->src == WEB_DIR && (!f->rel || f->rel[0] == '/' || strstr(f->rel, "..")))
            abort();
    } else if (r == WEB_NONE || r == WEB_NOTFOUND) {
        if (f)
            abort();
        if (r == WEB_NONE && (!strncmp(path, "/static/", 8) || !strncmp(path, "/terminal/", 10)))
            abort();
    } else {
        abort();
    }
    free(path);
    return 0;
}
