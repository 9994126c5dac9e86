/*
 * test_procs.c - unit tests of core/procs.c: a guest's process list is
 * checked entry by entry (a hostile guest chooses every byte of it) and
 * shown as the JSON of docs/API.md (by the REST door's codec, server/sbx_json.c).
 */
#include "procs.h"
#include "sbx_json.h"
#include "check.h"

#include <errno.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int failures;

/* Pack {"procs": [entries...]} where each entry is given as a JSON text, and run it
 * through procs_list and the records' JSON. */
static int list(unsigned max, json_t **out, char *why, size_t cap, const char *entries_json)
{
    json_t *arr = json_loads(entries_json, 0, NULL), *v;
    msgpack_sbuffer sb;
    msgpack_packer pk;
    msgpack_unpacked u;
    size_t i;
    const char *k;
    json_t *val;
    int r;

    CHECK(arr != NULL);
    msgpack_sbuffer_init(&sb);
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, json_array_size(arr));
    json_array_foreach(arr, i, v)
    {
        if (!json_is_object(v)) {
            msgpack_pack_int(&pk, 7);
            continue;
        }
        msgpack_pack_map(&pk, json_object_size(v));
        json_object_foreach(v, k, val)
        {
            msgpack_pack_str_with_body(&pk, k, strlen(k));
            if (json_is_string(val))
                msgpack_pack_str_with_body(&pk, json_string_value(val), json_string_length(val));
            else if (json_is_boolean(val))
                json_is_true(val) ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
            else if (json_is_integer(val) && json_integer_value(val) < 0)
                msgpack_pack_int64(&pk, json_integer_value(val));
            else if (json_is_integer(val))
                msgpack_pack_uint64(&pk, (uint64_t)json_integer_value(val));
            else
                msgpack_pack_nil(&pk);
        }
    }
    msgpack_unpacked_init(&u);
    CHECK(msgpack_unpack_next(&u, sb.data, sb.size, NULL) == MSGPACK_UNPACK_SUCCESS);
    {
        struct sbx_proc_rec *recs = NULL;
        size_t n = 0;
        *out = NULL;
        r = procs_list(&u.data.via.array, max, &recs, &n, why, cap);
        if (r == 0)
            CHECK((*out = sbx_json_procs(recs, n)) != NULL);
        free(recs);
    }
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
    json_decref(arr);
    return r;
}

#define OK1 "\"pid\":12,\"running\":true,\"start\":0,\"end\":10"

static void test_good(void)
{
    json_t *o, *p;
    char why[160];

    CHECK(list(64, &o, why, sizeof(why), "[]") == 0);
    CHECK(json_array_size(json_object_get(o, "processes")) == 0);
    json_decref(o);
    CHECK(list(64, &o, why, sizeof(why),
               "[{" OK1 ",\"tag\":\"build\",\"cmd\":\"make -j4\",\"stdin\":true,"
               "\"started_ms\":1764612000123},"
               "{\"pid\":13,\"running\":false,\"start\":5,\"end\":9,\"code\":143,\"sig\":15,"
               "\"pty\":true,\"cols\":80,\"rows\":24,\"stdin\":true,\"other\":[1]}]") == 0);
    p = json_array_get(json_object_get(o, "processes"), 0);
    CHECK(json_integer_value(json_object_get(p, "pid")) == 12);
    CHECK(!strcmp(json_string_value(json_object_get(p, "tag")), "build"));
    CHECK(!strcmp(json_string_value(json_object_get(p, "cmd")), "make -j4"));
    CHECK(json_is_true(json_object_get(p, "running")) && json_is_false(json_object_get(p, "pty")));
    CHECK(json_is_true(json_object_get(p, "stdin_open")));
    CHECK(json_integer_value(json_object_get(p, "output_end")) == 10);
    CHECK(!strcmp(json_string_value(json_object_get(p, "started_at")), "2025-12-01T18:00:00.123Z"));
    CHECK(!json_object_get(p, "exit_code") && !json_object_get(p, "cols"));
    p = json_array_get(json_object_get(o, "processes"), 1);
    CHECK(json_is_null(json_object_get(p, "tag")) &&
          json_is_null(json_object_get(p, "started_at")));
    CHECK(json_integer_value(json_object_get(p, "exit_code")) == 143);
    CHECK(json_integer_value(json_object_get(p, "signal")) == 15);
    CHECK(json_integer_value(json_object_get(p, "cols")) == 80);
    CHECK(json_is_false(json_object_get(p, "stdin_open"))); /* an ended process reads nothing */
    CHECK(!json_object_get(p, "other"));
    json_decref(o);
    /* Exit without a signal: signal null. A command line of any bytes is shown. */
    CHECK(list(64, &o, why, sizeof(why),
               "[{\"pid\":1,\"running\":false,\"start\":0,\"end\":0,\"code\":0}]") == 0);
    p = json_array_get(json_object_get(o, "processes"), 0);
    CHECK(json_is_null(json_object_get(p, "signal")));
    json_decref(o);
    json_t *s = sbx_json_text("a\xff\xc3\xa9z", 5);
    CHECK(s && !strcmp(json_string_value(s), "a???z"));
    json_decref(s);
    s = sbx_json_text("\xc3\xa9", 2);
    CHECK(s && !strcmp(json_string_value(s), "\xc3\xa9"));
    json_decref(s);
}

static void refused(const char *entries, const char *what)
{
    json_t *o = (json_t *)1;
    char why[160] = "";

    CHECK(list(4, &o, why, sizeof(why), entries) == -EPROTO);
    CHECK(o == NULL);
    if (!strstr(why, what)) {
        fprintf(stderr, "  %s: why '%s', expected '%s'\n", entries, why, what);
        failures++;
    }
}

static void test_hostile(void)
{
    refused("[1]", "not a map");
    refused("[{\"running\":true,\"start\":0,\"end\":0}]", "without pid");
    refused("[{\"pid\":1,\"start\":0,\"end\":0}]", "without pid");
    refused("[{\"pid\":0,\"running\":true,\"start\":0,\"end\":0}]", "outside");
    refused("[{\"pid\":4194305,\"running\":true,\"start\":0,\"end\":0}]", "outside");
    refused("[{\"pid\":-3,\"running\":true,\"start\":0,\"end\":0}]", "wrong type");
    refused("[{\"pid\":\"7\",\"running\":true,\"start\":0,\"end\":0}]", "wrong type");
    refused("[{" OK1 ",\"tag\":5}]", "'tag' of the wrong type");
    refused("[{\"pid\":1,\"running\":true,\"start\":11,\"end\":10}]", "offsets");
    refused("[{\"pid\":1,\"running\":true,\"start\":0,\"end\":9007199254740993}]", "offsets");
    refused("[{" OK1 ",\"pty\":true}]", "without a size");
    refused("[{" OK1 ",\"pty\":true,\"cols\":0,\"rows\":5}]", "without a size");
    refused("[{" OK1 ",\"pty\":true,\"cols\":10001,\"rows\":5}]", "without a size");
    refused("[{\"pid\":1,\"running\":false,\"start\":0,\"end\":0,\"sig\":65}]", "signal 65");
    refused("[{\"pid\":1,\"running\":false,\"start\":0,\"end\":0,\"code\":4294967296}]",
            "exit code");
    refused("[{" OK1 "},{" OK1 "}]", "listed twice");
    refused("[{\"pid\":1,\"running\":true,\"start\":0,\"end\":0},{\"pid\":2,\"running\":true,"
            "\"start\":0,\"end\":0},{\"pid\":3,\"running\":true,\"start\":0,\"end\":0},"
            "{\"pid\":4,\"running\":true,\"start\":0,\"end\":0},{\"pid\":5,\"running\":true,"
            "\"start\":0,\"end\":0}]",
            "5 processes listed, at most 4");
    /* Strings past the caps. */
    char big[600];
    memset(big, 'x', sizeof(big));
    snprintf(big, sizeof(big), "[{" OK1 ",\"tag\":\"%0300d\"}]", 0);
    refused(big, "tag of 300 bytes");
}

int main(void)
{
    test_good();
    test_hostile();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("procs: all checks passed\n");
    return 0;
}
