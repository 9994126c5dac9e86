/*
 * test_e2b_code.c - the pure part of E2B's code interpreter door
 * (e2b_code_wire.c): its routes and context ids, and the /execute and
 * /contexts bodies as the kernel bridge's requests take them.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "e2b_code.h"

int failures;

static enum e2b_code_route route(const char *uri, unsigned method, int *status, char *ctx)
{
    char c[API_ID_MAX + 1];
    enum e2b_code_route r = e2b_code_route_of(uri, method, ctx ? ctx : c, status);

    return r;
}

static void test_routes(void)
{
    char ctx[API_ID_MAX + 1], big[300];
    int st;

    CHECK(route("/execute", API_POST, &st, NULL) == E2B_CODE_EXECUTE && st == 0);
    CHECK(route("/execute", API_GET, &st, NULL) == E2B_CODE_NONE && st == 405);
    CHECK(route("/health", API_GET, &st, NULL) == E2B_CODE_HEALTH && st == 0);
    CHECK(route("/contexts", API_GET, &st, NULL) == E2B_CODE_LIST && st == 0);
    CHECK(route("/contexts", API_POST, &st, NULL) == E2B_CODE_CREATE && st == 0);
    CHECK(route("/contexts", API_DELETE, &st, NULL) == E2B_CODE_NONE && st == 405);
    CHECK(route("/contexts/ab-12_C", API_DELETE, &st, ctx) == E2B_CODE_DELETE && st == 0 &&
          !strcmp(ctx, "ab-12_C"));
    CHECK(route("/contexts/ab/restart", API_POST, &st, ctx) == E2B_CODE_RESTART && st == 0 &&
          !strcmp(ctx, "ab"));
    CHECK(route("/contexts/ab/restart", API_GET, &st, NULL) == E2B_CODE_NONE && st == 405);
    CHECK(route("/contexts/ab/other", API_POST, &st, NULL) == E2B_CODE_NONE && st == 404);
    CHECK(route("/contexts/ab/", API_DELETE, &st, NULL) == E2B_CODE_NONE && st == 404);
    CHECK(route("/contexts/a.b", API_DELETE, &st, NULL) == E2B_CODE_BAD_ID && st == 404);
    CHECK(route("/contexts//restart", API_POST, &st, NULL) == E2B_CODE_BAD_ID && st == 404);
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    memcpy(big, "/contexts/", 10);
    CHECK(route(big, API_DELETE, &st, NULL) == E2B_CODE_BAD_ID && st == 404);
    CHECK(route("/", API_GET, &st, NULL) == E2B_CODE_NONE && st == 404);
    CHECK(route("/process.Process/Start", API_POST, &st, NULL) == E2B_CODE_NONE && st == 404);
}

static int exec(const char *js, json_t **run, char *msg)
{
    json_t *b = json_loads(js, 0, NULL);
    int st = e2b_code_exec_body(b, run, msg, 256);

    json_decref(b);
    return st;
}

static void test_exec(void)
{
    char msg[256];
    json_t *run;

    CHECK(exec("{\"code\":\"1+1\"}", &run, msg) == 0);
    CHECK(!strcmp(json_string_value(json_object_get(run, "code")), "1+1") &&
          json_object_size(run) == 1);
    json_decref(run);
    /* null is absent; unknown fields are ignored, as upstream's model does */
    CHECK(exec("{\"code\":\"x\",\"context_id\":null,\"language\":null,\"env_vars\":null,"
               "\"other\":1}",
               &run, msg) == 0 &&
          json_object_size(run) == 1);
    json_decref(run);
    CHECK(exec("{\"code\":\"x\",\"language\":\"Bash\",\"env_vars\":{\"A\":\"b\"}}", &run, msg) ==
          0);
    CHECK(!strcmp(json_string_value(json_object_get(run, "language")), "bash") &&
          !strcmp(json_string_value(json_object_get(json_object_get(run, "env"), "A")), "b"));
    json_decref(run);
    CHECK(exec("{\"code\":\"x\",\"context_id\":\"c-1\"}", &run, msg) == 0 &&
          !strcmp(json_string_value(json_object_get(run, "context_id")), "c-1"));
    json_decref(run);

    CHECK(exec("[1]", &run, msg) == 400 && !run);
    CHECK(exec("{}", &run, msg) == 400 && strstr(msg, "code"));
    CHECK(exec("{\"code\":5}", &run, msg) == 400);
    CHECK(exec("{\"code\":\"x\",\"context_id\":\"a\",\"language\":\"python\"}", &run, msg) == 400 &&
          strstr(msg, "context_id"));
    CHECK(exec("{\"code\":\"x\",\"language\":7}", &run, msg) == 400);
    CHECK(exec("{\"code\":\"x\",\"env_vars\":[1]}", &run, msg) == 400);
    CHECK(exec("{\"code\":\"x\",\"context_id\":\"../x\"}", &run, msg) == 404);
    /* a language with no kernel: upstream's failed context creation, the name shown
     * bounded and printable */
    CHECK(exec("{\"code\":\"x\",\"language\":\"r\"}", &run, msg) == 500 && strstr(msg, "\"r\""));
    CHECK(exec("{\"code\":\"x\",\"language\":\"javascript\\u0001"
               "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}",
               &run, msg) == 500 &&
          !strchr(msg, '\001') && strlen(msg) < 200);
}

static int create(const char *js, json_t **args, char *msg)
{
    json_t *b = json_loads(js, 0, NULL);
    int st = e2b_code_create_body(b, args, msg, 256);

    json_decref(b);
    return st;
}

static void test_create(void)
{
    char msg[256];
    json_t *a;

    CHECK(create("{}", &a, msg) == 0 &&
          !strcmp(json_string_value(json_object_get(a, "language")), "python") &&
          json_object_size(a) == 1);
    json_decref(a);
    CHECK(create("{\"language\":\"PYTHON\",\"cwd\":\"/tmp\"}", &a, msg) == 0 &&
          !strcmp(json_string_value(json_object_get(a, "language")), "python") &&
          !strcmp(json_string_value(json_object_get(a, "cwd")), "/tmp"));
    json_decref(a);
    CHECK(create("{\"language\":\"java\"}", &a, msg) == 500 && !a);
    CHECK(create("{\"cwd\":1}", &a, msg) == 400);
    CHECK(create("\"x\"", &a, msg) == 400);
}

int main(void)
{
    test_routes();
    test_exec();
    test_create();
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
