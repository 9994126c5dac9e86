/*
 * jupyter.c - the pure parts of the kernel API door (jupyter.h): kernelspec
 * configuration, kernel ids and models, client frames checked and turned into
 * the guest's lines. No I/O but the random bytes of a new id.
 */
#include "jupyter.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static bool name_ok(const char *s, size_t n)
{
    if (n == 0 || n > JUP_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return false;
    }
    return true;
}

int jup_specs_parse(const char *conf, struct jup_spec *out, size_t max)
{
    const char *p = conf;
    size_t count = 0;

    if (!conf || !*conf)
        return -1;
    while (*p) {
        const char *end = strchr(p, ','), *eq;
        size_t len = end ? (size_t)(end - p) : strlen(p);

        while (len && *p == ' ')
            p++, len--;
        while (len && p[len - 1] == ' ')
            len--;
        eq = memchr(p, '=', len);
        if (!eq || count == max || !name_ok(p, (size_t)(eq - p)) ||
            !name_ok(eq + 1, len - (size_t)(eq + 1 - p)))
            return -1;
        for (size_t i = 0; i < count; i++)
            if (strlen(out[i].name) == (size_t)(eq - p) &&
                !memcmp(out[i].name, p, (size_t)(eq - p)))
                return -1;
        snprintf(out[count].name, sizeof(out[count].name), "%.*s", (int)(eq - p), p);
        snprintf(out[count].tmpl, sizeof(out[count].tmpl), "%.*s",
                 (int)(len - (size_t)(eq + 1 - p)), eq + 1);
        count++;
        if (!end)
            break;
        p = end + 1;
        if (!*p)
            return -1; /* a trailing comma names nothing */
    }
    return count ? (int)count : -1;
}

static bool hex_run(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return false;
    return true;
}

bool jup_id_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0, h = 0;

    if (n < JUP_UUID_LEN || n > JUP_ID_MAX)
        return false;
    for (int i = 0; i < 24; i++) {
        bool dash = i == 8 || i == 13 || i == 18 || i == 23;
        if (dash ? s[i] != '-' : !hex_run(s + i, 1))
            return false;
    }
    if (n == JUP_UUID_LEN)
        return hex_run(s + 24, 12);
    /* "<host>_<12 hex>" */
    while (24 + h < n &&
           ((s[24 + h] >= 'a' && s[24 + h] <= 'z') || (s[24 + h] >= '0' && s[24 + h] <= '9')))
        h++;
    return h >= 1 && h <= 12 && 24 + h + 1 + 12 == n && s[24 + h] == '_' &&
           hex_run(s + 24 + h + 1, 12);
}

int jup_id_new(char *out, const char *host)
{
    unsigned char r[16];
    size_t hl = host ? strlen(host) : 0;

    if (hl > 12)
        return -EINVAL;
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r))
        return -EIO;
    r[6] = (unsigned char)((r[6] & 0x0f) | 0x40);
    r[8] = (unsigned char)((r[8] & 0x3f) | 0x80);
    snprintf(out, JUP_ID_MAX + 1,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%s%s%02x%02x%02x%02x%02x%02x", r[0], r[1],
             r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], hl ? host : "", hl ? "_" : "", r[10],
             r[11], r[12], r[13], r[14], r[15]);
    return 0;
}

json_t *jup_spec_json(const struct jup_spec *s)
{
    char display[2 * JUP_NAME_MAX + 32];

    snprintf(display, sizeof(display), "%s (Warren %s)", s->name, s->tmpl);
    /* argv and env describe the kernel as the guest runs it; a gateway client shows them
     * and never runs them itself. */
    return json_pack("{s:s, s:{s:[s,s,s,s,s], s:{}, s:s, s:s, s:s, s:{s:s}}, s:{}}", "name",
                     s->name, "spec", "argv", "python3", "-m", "ipykernel_launcher", "-f",
                     "{connection_file}", "env", "display_name", display, "language", "python",
                     "interrupt_mode", "message", "metadata", "warren_template", s->tmpl,
                     "resources");
}

json_t *jup_model(const char *id, const char *spec, const char *last_activity, const char *state,
                  unsigned conns)
{
    return json_pack("{s:s, s:s, s:s, s:s, s:I}", "id", id, "name", spec, "last_activity",
                     last_activity, "execution_state", state, "connections", (json_int_t)conns);
}

const char *jup_status_state(json_t *msg)
{
    static const char *const known[] = {"starting", "idle", "busy", "restarting", "dead"};
    json_t *hdr = json_object_get(msg, "header");
    const char *ch = json_string_value(json_object_get(msg, "channel"));
    const char *t = json_string_value(json_object_get(hdr, "msg_type"));
    const char *st =
        json_string_value(json_object_get(json_object_get(msg, "content"), "execution_state"));

    if (!ch || strcmp(ch, "iopub") || !t || strcmp(t, "status") || !st)
        return NULL;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        if (!strcmp(st, known[i]))
            return known[i];
    return NULL;
}

int jup_frame_line(const char *buf, size_t len, char **out, size_t *n, const char **why)
{
    char *grown;
    json_error_t jerr;
    json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *ch;
    char *s;
    size_t sl;

    *out = NULL;
    if (!j) {
        *why = "the frame is not JSON";
        return -1;
    }
    if (!json_is_object(j) || !json_is_object(json_object_get(j, "header"))) {
        *why = "the frame is not a Jupyter message (an object with a \"header\" object)";
        goto bad;
    }
    ch = json_object_get(j, "channel");
    if (!ch || json_is_null(ch)) {
        if (json_object_set_new(j, "channel", json_string("shell")))
            goto oom;
    } else if (!json_is_string(ch) || (strcmp(json_string_value(ch), "shell") &&
                                       strcmp(json_string_value(ch), "control") &&
                                       strcmp(json_string_value(ch), "stdin"))) {
        *why = "\"channel\" must be \"shell\", \"control\" or \"stdin\"";
        goto bad;
    }
    /* Compact JSON escapes every newline inside strings: the line has just its last. */
    if (!(s = json_dumps(j, JSON_COMPACT)))
        goto oom;
    json_decref(j);
    sl = strlen(s);
    if (!(grown = realloc(s, sl + 2))) {
        free(s);
        *why = "out of memory";
        return -1;
    }
    *out = grown;
    (*out)[sl] = '\n';
    (*out)[sl + 1] = '\0';
    *n = sl + 1;
    return 0;
oom:
    *why = "out of memory";
bad:
    json_decref(j);
    return -1;
}

char *jup_notice(const char *kind, json_t *content)
{
    static unsigned long seq;
    char id[64];
    json_t *j;
    char *s;

    snprintf(id, sizeof(id), "warren-%s-%lu", kind, ++seq);
    j = json_pack("{s:{s:s,s:s,s:s,s:s,s:s}, s:{}, s:{}, s:o, s:[], s:s, s:s, s:s}", "header",
                  "msg_id", id, "msg_type", kind, "username", "warren", "session", "warren",
                  "version", "5.3", "parent_header", "metadata", "content", content, "buffers",
                  "channel", "iopub", "msg_id", id, "msg_type", kind);
    if (!j)
        return NULL;
    s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}
