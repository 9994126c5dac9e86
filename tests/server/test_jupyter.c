/*
 * The pure parts of Jupyter's kernel API door (server/jupyter.c): kernelspec
 * configuration, kernel ids, client frames checked into the guest's lines, and
 * warrend's own messages for the client.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "jupyter.h"

int failures;

static void test_specs(void)
{
    struct jup_spec s[JUP_SPECS_MAX];

    CHECK(jup_specs_parse("python3=code-interpreter", s, JUP_SPECS_MAX) == 1);
    CHECK(!strcmp(s[0].name, "python3") && !strcmp(s[0].tmpl, "code-interpreter"));
    CHECK(jup_specs_parse("python3=code-interpreter, py-base=base", s, JUP_SPECS_MAX) == 2);
    CHECK(!strcmp(s[1].name, "py-base") && !strcmp(s[1].tmpl, "base"));
    CHECK(jup_specs_parse("", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse(NULL, s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("python3", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("=base", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("a=", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("a=b,", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("a=b,a=c", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("a/b=c", s, JUP_SPECS_MAX) == -1);
    CHECK(jup_specs_parse("a=b,c=d", s, 1) == -1);
}

static void test_uuid(void)
{
    char a[JUP_ID_MAX + 1], b[JUP_ID_MAX + 1];

    CHECK(jup_id_new(a, NULL) == 0 && jup_id_new(b, "") == 0);
    CHECK(strlen(a) == JUP_UUID_LEN && jup_id_valid(a) && jup_id_valid(b) && strcmp(a, b));
    /* On a fleet's host: the last group carries the host, as the proxy routes by it. */
    CHECK(jup_id_new(a, "h12") == 0 && jup_id_valid(a) && strlen(a) == JUP_UUID_LEN + 4);
    CHECK(!strncmp(a + 24, "h12_", 4));
    CHECK(jup_id_new(a, "abcdefghijkl") == 0 && strlen(a) == JUP_ID_MAX && jup_id_valid(a));
    CHECK(jup_id_new(a, "abcdefghijklm") == -EINVAL);
    CHECK(jup_id_valid("0123abcd-0000-4000-8000-00000000ffff"));
    CHECK(jup_id_valid("0123abcd-0000-4000-8000-h0_00000000ffff"));
    CHECK(!jup_id_valid("0123abcd-0000-4000-8000-H0_00000000ffff"));
    CHECK(!jup_id_valid("0123abcd-0000-4000-8000-_00000000ffff"));
    CHECK(!jup_id_valid("0123abcd-0000-4000-8000-h0_0000000ffff"));
    CHECK(!jup_id_valid("0123abcd-0000-4000-8000-h0-00000000ffff"));
    CHECK(!jup_id_valid("0123abcd-0000-4000-8000-abcdefghijklm_00000000ffff"));
    CHECK(!jup_id_valid("0123ABCD-0000-4000-8000-00000000ffff"));
    CHECK(!jup_id_valid("0123abcd-0000-4000-8000-00000000fff"));
    CHECK(!jup_id_valid("0123abcd00000-4000-8000-00000000ffff"));
    CHECK(!jup_id_valid("sb-0123456789abcdef"));
    CHECK(!jup_id_valid(NULL));
}

static int frame(const char *in, char **out)
{
    size_t n = 0;
    const char *why = NULL;
    int rc = jup_frame_line(in, strlen(in), out, &n, &why);

    if (rc == 0) {
        CHECK(n == strlen(*out) && (*out)[n - 1] == '\n' && !memchr(*out, '\n', n - 1));
    } else {
        CHECK(why && *why && !*out);
    }
    return rc;
}

static void test_frames(void)
{
    char *l = NULL;
    json_t *j;

    CHECK(frame("{\"header\":{\"msg_type\":\"execute_request\"},\"content\":{\"code\":\"a\\nb\"}}",
                &l) == 0);
    j = json_loads(l, 0, NULL);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "channel")), "shell"));
    CHECK(
        !strcmp(json_string_value(json_object_get(json_object_get(j, "content"), "code")), "a\nb"));
    json_decref(j);
    free(l);
    CHECK(frame("{\"header\":{},\"channel\":\"control\"}", &l) == 0);
    CHECK(strstr(l, "\"control\"") != NULL);
    free(l);
    CHECK(frame("{\"header\":{},\"channel\":\"stdin\"}", &l) == 0);
    free(l);
    CHECK(frame("{\"header\":{},\"channel\":null}", &l) == 0);
    CHECK(strstr(l, "\"shell\"") != NULL);
    free(l);
    CHECK(frame("{\"header\":{},\"channel\":\"iopub\"}", &l) == -1);
    CHECK(frame("{\"header\":{},\"channel\":3}", &l) == -1);
    CHECK(frame("{\"header\":[]}", &l) == -1);
    CHECK(frame("{}", &l) == -1);
    CHECK(frame("[1]", &l) == -1);
    CHECK(frame("not json", &l) == -1);
    CHECK(frame("{\"header\":{}", &l) == -1);
    CHECK(frame("{\"header\":{},\"header\":{}}", &l) == -1);
    CHECK(frame("", &l) == -1);
}

static void test_json(void)
{
    struct jup_spec s = {"python3", "code-interpreter"};
    json_t *j = jup_spec_json(&s), *m;
    char *n;

    CHECK(j && !strcmp(json_string_value(json_object_get(j, "name")), "python3"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "spec"), "language")),
                  "python"));
    json_decref(j);
    m = jup_model("0123abcd-0000-4000-8000-00000000ffff", "python3", "2026-01-01T00:00:00.000Z",
                  "busy", 2);
    CHECK(m && json_integer_value(json_object_get(m, "connections")) == 2 &&
          !strcmp(json_string_value(json_object_get(m, "execution_state")), "busy"));
    json_decref(m);
    n = jup_notice("stream", json_pack("{s:s,s:s}", "name", "stderr", "text", "gap"));
    j = n ? json_loads(n, 0, NULL) : NULL;
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "channel")), "iopub"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(j, "header"), "msg_type")),
                  "stream"));
    CHECK(
        !strcmp(json_string_value(json_object_get(json_object_get(j, "content"), "text")), "gap"));
    json_decref(j);
    free(n);
}

/* Only an iopub status with a state Jupyter defines moves a kernel's execution_state. */
static void test_status_state(void)
{
    static const struct {
        const char *msg, *want;
    } cases[] = {
        {"{\"channel\":\"iopub\",\"header\":{\"msg_type\":\"status\"},"
         "\"content\":{\"execution_state\":\"busy\"}}",
         "busy"},
        {"{\"channel\":\"iopub\",\"header\":{\"msg_type\":\"status\"},"
         "\"content\":{\"execution_state\":\"idle\"}}",
         "idle"},
        {"{\"channel\":\"iopub\",\"header\":{\"msg_type\":\"status\"},"
         "\"content\":{\"execution_state\":\"restarting\"}}",
         "restarting"},
        {"{\"channel\":\"iopub\",\"header\":{\"msg_type\":\"status\"},"
         "\"content\":{\"execution_state\":\"<script>\"}}",
         NULL},
        {"{\"channel\":\"iopub\",\"header\":{\"msg_type\":\"status\"},"
         "\"content\":{\"execution_state\":7}}",
         NULL},
        {"{\"channel\":\"shell\",\"header\":{\"msg_type\":\"status\"},"
         "\"content\":{\"execution_state\":\"busy\"}}",
         NULL},
        {"{\"channel\":\"iopub\",\"header\":{\"msg_type\":\"stream\"},"
         "\"content\":{\"execution_state\":\"busy\"}}",
         NULL},
        {"{\"channel\":\"iopub\",\"header\":\"status\",\"content\":[]}", NULL},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *m = json_loads(cases[i].msg, 0, NULL);
        const char *st = jup_status_state(m);
        CHECK(m && (cases[i].want ? st && !strcmp(st, cases[i].want) : !st));
        json_decref(m);
    }
}

int main(void)
{
    test_specs();
    test_uuid();
    test_frames();
    test_json();
    test_status_state();
    if (failures)
        fprintf(stderr, "test_jupyter: %d failed\n", failures);
    return failures ? 1 : 0;
}
