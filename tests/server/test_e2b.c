/*
 * test_e2b.c - the pure part of E2B's control plane (e2b_wire.c): which paths
 * and methods it routes, how it reads query values and metadata filters (both
 * SDKs' encodings), and its error shape.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "e2b_api.h"

int failures;

static enum e2b_route route(const char *path, unsigned method)
{
    struct e2b_match m;

    return e2b_route_match(path, method, &m) == 0 ? m.route : E2B_R_NONE;
}

static void test_routes(void)
{
    struct e2b_match m;

    CHECK(route("/sandboxes", API_POST) == E2B_R_CREATE);
    CHECK(route("/v2/sandboxes", API_POST) == E2B_R_CREATE);
    CHECK(route("/sandboxes", API_GET) == E2B_R_LIST_V1);
    CHECK(route("/v2/sandboxes", API_GET) == E2B_R_LIST);
    CHECK(route("/sandboxes/metrics", API_GET) == E2B_R_METRICS_MANY);
    CHECK(route("/sandboxes/sb-1", API_GET) == E2B_R_INFO);
    CHECK(route("/sandboxes/sb-1", API_DELETE) == E2B_R_KILL);
    CHECK(route("/sandboxes/sb-1/timeout", API_POST) == E2B_R_TIMEOUT);
    CHECK(route("/sandboxes/sb-1/pause", API_POST) == E2B_R_PAUSE);
    CHECK(route("/sandboxes/sb-1/connect", API_POST) == E2B_R_CONNECT);
    CHECK(route("/v2/sandboxes/sb-1/connect", API_POST) == E2B_R_CONNECT);
    CHECK(route("/sandboxes/sb-1/resume", API_POST) == E2B_R_RESUME);
    CHECK(route("/sandboxes/sb-1/fork", API_POST) == E2B_R_FORK);
    CHECK(route("/sandboxes/sb-1/snapshots", API_POST) == E2B_R_SNAPSHOT);
    CHECK(route("/snapshots", API_GET) == E2B_R_SNAPSHOTS);
    CHECK(route("/templates/snap-1", API_DELETE) == E2B_R_TEMPLATE_DEL);
    CHECK(route("/sandboxes/sb-1/network", API_PUT) == E2B_R_NETWORK);
    CHECK(route("/sandboxes/sb-1/metrics", API_GET) == E2B_R_METRICS);

    CHECK(e2b_route_match("/sandboxes/sb_x-9/pause", API_POST, &m) == 0);
    CHECK(strcmp(m.id, "sb_x-9") == 0 && m.body && m.disk && !m.created);
    CHECK(e2b_route_match("/v2/sandboxes", API_POST, &m) == 0 && m.body && m.created);
    CHECK(e2b_route_match("/sandboxes/sb-1", API_GET, &m) == 0 && !m.body && !strcmp(m.id, "sb-1"));

    /* wrong method on one of its paths: 405; a bad id: 404; not its path: others' */
    CHECK(e2b_route_match("/sandboxes/sb-1", API_PATCH, &m) == -ENOTSUP);
    CHECK(e2b_route_match("/sandboxes/metrics", API_DELETE, &m) == -ENOTSUP);
    CHECK(e2b_route_match("/sandboxes", API_PUT, &m) == -ENOTSUP);
    CHECK(e2b_route_match("/sandboxes/a b", API_GET, &m) == -EINVAL);
    CHECK(e2b_route_match("/sandboxes/a.b/pause", API_POST, &m) == -EINVAL);
    {
        char p[200];
        snprintf(p, sizeof(p), "/sandboxes/%065d", 1);
        CHECK(e2b_route_match(p, API_GET, &m) == -EINVAL);
        snprintf(p, sizeof(p), "/sandboxes/%064d", 1);
        CHECK(e2b_route_match(p, API_GET, &m) == 0 && strlen(m.id) == API_ID_MAX);
    }
    CHECK(e2b_route_match("/v1/sandboxes", API_GET, &m) == -ENOENT);
    CHECK(e2b_route_match("/healthz", API_GET, &m) == -ENOENT);
    CHECK(e2b_route_match("/sandboxes/", API_GET, &m) == -EINVAL);
    CHECK(e2b_route_match("/sandboxes/sb-1/unknown", API_GET, &m) == -ENOENT);
    CHECK(e2b_route_match("/sandboxesx", API_GET, &m) == -ENOENT);
    CHECK(e2b_route_match("/templates", API_GET, &m) == -ENOENT);
}

static void test_query(void)
{
    const char *f[] = {"state=running", "limit=2", "state=paused", "=x", "novalue"};
    const char *bad[] = {"state=running", "metadata=\xff"};
    json_t *o = NULL;

    CHECK(e2b_query_args(bad, 2, &o) == -EINVAL && !o);
    CHECK(e2b_query_args(f, 5, &o) == 0);

    CHECK(o && strcmp(json_string_value(json_object_get(o, "state")), "running,paused") == 0);
    CHECK(strcmp(json_string_value(json_object_get(o, "limit")), "2") == 0);
    CHECK(strcmp(json_string_value(json_object_get(o, "novalue")), "") == 0);
    CHECK(json_object_size(o) == 3);
    json_decref(o);
}

static const char *meta(json_t *o, const char *k)
{
    return json_string_value(json_object_get(o, k));
}

static void test_metadata(void)
{
    json_t *o;
    char big[64 * 8 + 16] = "";

    /* Python: urlencode({"k": "a b&c", "x": "1"}) */
    CHECK(e2b_metadata_filter("k=a+b%26c&x=1", &o) == 0);
    CHECK(o && json_object_size(o) == 2 && !strcmp(meta(o, "k"), "a b&c") &&
          !strcmp(meta(o, "x"), "1"));
    json_decref(o);
    /* JS: URLSearchParams of encodeURIComponent'd pairs */
    CHECK(e2b_metadata_filter("who=a%2520b%2526c%253Dd", &o) == 0);
    CHECK(o && !strcmp(meta(o, "who"), "a b&c=d"));
    json_decref(o);
    /* a literal % that is no escape stays */
    CHECK(e2b_metadata_filter("p=100%25", &o) == 0 && !strcmp(meta(o, "p"), "100%"));
    json_decref(o);
    CHECK(e2b_metadata_filter("", &o) == 0 && json_object_size(o) == 0);
    json_decref(o);
    CHECK(e2b_metadata_filter("a=1&&b=2", &o) == 0 && json_object_size(o) == 2);
    json_decref(o);
    CHECK(e2b_metadata_filter("novalue", &o) == -EINVAL && !o);
    CHECK(e2b_metadata_filter("=v", &o) == -EINVAL);
    CHECK(e2b_metadata_filter("k=%zz", &o) == -EINVAL);
    CHECK(e2b_metadata_filter("k=%4", &o) == -EINVAL);
    CHECK(e2b_metadata_filter("k=a%00b", &o) == -EINVAL);
    for (int i = 0; i < 65; i++)
        snprintf(big + strlen(big), sizeof(big) - strlen(big), "%sk%d=v", i ? "&" : "", i);
    CHECK(e2b_metadata_filter(big, &o) == -EINVAL);
}

static void test_error(void)
{
    json_t *w = json_pack("{s:{s:s,s:s}}", "error", "code", "sandbox_not_found", "message", "gone");
    json_t *e = e2b_error_body(404, w);

    CHECK(json_integer_value(json_object_get(e, "code")) == 404);
    CHECK(!strcmp(json_string_value(json_object_get(e, "message")), "gone"));
    json_decref(e);
    e = e2b_error_body(500, NULL);
    CHECK(json_integer_value(json_object_get(e, "code")) == 500 &&
          json_is_string(json_object_get(e, "message")));
    json_decref(e);
}

int main(void)
{
    test_routes();
    test_query();
    test_metadata();
    test_error();
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
