/*
 * test_sbx_json.c - unit tests of the REST door's codec (server/sbx_json.c) for
 * snapshots, forks, pause and the pools' figures: bodies into the core's request
 * structs (sbx_snap.h), and the core's records into the exact JSON bytes clients
 * have always been sent (key order included).
 */
#include "sbx_json.h"
#include "check.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int failures;

/* The compact JSON text of o (taken), "" when o is NULL; the caller frees it. */
static char *text(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;

    json_decref(o);
    return s ? s : strdup("");
}

static bool same(json_t *o, const char *want)
{
    char *got = text(o);
    bool ok = strcmp(got, want) == 0;

    if (!ok)
        fprintf(stderr, "got  %s\nwant %s\n", got, want);
    free(got);
    return ok;
}

static json_t *body(const char *s)
{
    json_t *o = json_loads(s, JSON_DECODE_ANY, NULL);

    CHECK(o != NULL);
    return o;
}

static void test_snap_rec(void)
{
    static const struct sbx_kv meta[] = {{"owner", {"ann", 3}}, {"run", {"7", 1}}};
    struct sbx_snap_rec r = {.id = "snap-h1-0123456789abcdef",
                             .parent = "sb-h1-00000000000000aa",
                             .tmpl = "base",
                             .type = "sandbox",
                             .mem_mb = 512,
                             .vcpus = 2,
                             .size = 123456789,
                             .created_ms = 1700000000123,
                             .metadata = meta,
                             .nmetadata = 2};
    char iso[UTIL_ISO_MAX], want[1024];
    struct sbx_snap_rec two[2];

    CHECK(util_iso_time_ms(r.created_ms, iso, sizeof(iso)));
    snprintf(want, sizeof(want),
             "{\"id\":\"snap-h1-0123456789abcdef\",\"parent\":\"sb-h1-00000000000000aa\","
             "\"template\":\"base\",\"type\":\"sandbox\",\"memory_mb\":512,\"vcpus\":2,"
             "\"size_bytes\":123456789,\"created_at\":\"%s\","
             "\"metadata\":{\"owner\":\"ann\",\"run\":\"7\"},"
             "\"snapshot_id\":\"snap-h1-0123456789abcdef\",\"parent_snapshot\":null}",
             iso);
    CHECK(same(sbx_json_snap_rec(&r), want));

    /* Restored from another snapshot, with networking on: its policy, lists joined. */
    r.parent_snap = "snap-h1-00000000000000bb";
    r.nmetadata = 0;
    r.has_network = true;
    r.network = (struct sbx_net_rec){.internet = true,
                                     .allow_out = "10.0.0.0/8, 1.2.3.4",
                                     .allow_names = "example.com",
                                     .deny_out = "",
                                     .deny_names = "bad.example",
                                     .rate_mbit = 100,
                                     .max_connections = 64};
    snprintf(want, sizeof(want),
             "{\"id\":\"snap-h1-0123456789abcdef\",\"parent\":\"sb-h1-00000000000000aa\","
             "\"template\":\"base\",\"type\":\"sandbox\",\"memory_mb\":512,\"vcpus\":2,"
             "\"size_bytes\":123456789,\"created_at\":\"%s\",\"metadata\":{},"
             "\"snapshot_id\":\"snap-h1-0123456789abcdef\","
             "\"parent_snapshot\":\"snap-h1-00000000000000bb\","
             "\"network\":{\"internet\":true,\"allow_out\":[\"10.0.0.0/8\",\"1.2.3.4\","
             "\"example.com\"],\"deny_out\":[\"bad.example\"],\"rate_mbit\":100,"
             "\"max_connections\":64}}",
             iso);
    CHECK(same(sbx_json_snap_rec(&r), want));

    /* The list keeps the order it is given (the core's: oldest first). */
    two[0] = r;
    two[1] = r;
    two[0].id = "snap-a";
    two[1].id = "snap-b";
    {
        json_t *l = sbx_json_snaps(two, 2);
        json_t *a = json_object_get(l, "snapshots");
        CHECK(json_object_size(l) == 1 && json_array_size(a) == 2);
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(a, 0), "id")), "snap-a"));
        CHECK(!strcmp(json_string_value(json_object_get(json_array_get(a, 1), "snapshot_id")),
                      "snap-b"));
        json_decref(l);
    }
    CHECK(same(sbx_json_snaps(NULL, 0), "{\"snapshots\":[]}"));
}

static void test_results(void)
{
    struct sbx_rec recs[2] = {{.id = "sb-1",
                               .tmpl = "base",
                               .state = "running",
                               .source = "snapshot",
                               .snapshot_id = "snap-x"},
                              {.id = "sb-2",
                               .tmpl = "base",
                               .state = "running",
                               .source = "snapshot",
                               .snapshot_id = "snap-x"}};
    struct sbx_snap_rec snap = {
        .id = "snap-x", .parent = "sb-0", .tmpl = "base", .type = "fork", .created_ms = 1};
    struct sbx_result res = {.kind = SBX_RES_FORK,
                             .u.fork = {.v = recs, .n = 2, .snapshot_id = "snap-x"}};
    char *r0 = text(sbx_json_rec(&recs[0])), *r1 = text(sbx_json_rec(&recs[1]));
    char want[4096];
    json_t *o;

    /* A fork: its sandboxes as GET shows them, in order, then the snapshot's id. */
    snprintf(want, sizeof(want), "{\"sandboxes\":[%s,%s],\"snapshot_id\":\"snap-x\"}", r0, r1);
    CHECK(same(sbx_json_result(&res), want));
    free(r0);
    free(r1);

    /* A snapshot taken answers with its record. */
    res = (struct sbx_result){.kind = SBX_RES_SNAPSHOT, .u.snap = &snap};
    o = sbx_json_result(&res);
    CHECK(o && !strcmp(json_string_value(json_object_get(o, "type")), "fork"));
    CHECK(json_is_null(json_object_get(o, "parent_snapshot")));
    CHECK(!json_object_get(o, "network"));
    json_decref(o);
}

static void test_pools(void)
{
    struct sbx_pool_rec p = {.tmpl = "base",
                             .mem_mb = 512,
                             .vcpus = 1,
                             .state = "ready",
                             .size = 2,
                             .ready = 1,
                             .filling = true,
                             .handed_out = 5,
                             .rebuilds = 0,
                             .spare = true,
                             .spares = 1,
                             .spares_ready = 1,
                             .spares_prefaulted = 0};
    static const char pool[] =
        "{\"template\":\"base\",\"memory_mb\":512,\"vcpus\":1,\"state\":\"ready\",\"size\":2,"
        "\"ready\":1,\"filling\":true,\"handed_out\":5,\"rebuilds\":0,\"spare\":true,"
        "\"spares\":1,\"spares_ready\":1,\"spares_prefaulted\":0";
    struct sbx_pool_stats st = {0};
    struct sbx_tmpl_list *l;
    char want[2048];

    /* Off: null. */
    CHECK(same(sbx_json_pool_stats(&st), "null"));
    /* On, but no pool for the default template (yet): "off" for it. */
    st.on = true;
    st.default_tmpl = "base";
    CHECK(same(sbx_json_pool_stats(&st),
               "{\"template\":\"base\",\"state\":\"off\",\"templates\":[]}"));
    /* Its figures, then every pool's. */
    st.has_default = true;
    st.dflt = p;
    st.pools[0] = p;
    st.npools = 1;
    snprintf(want, sizeof(want), "%s,\"templates\":[%s}]}", pool, pool);
    CHECK(same(sbx_json_pool_stats(&st), want));

    l = calloc(1, sizeof(*l) + 2 * sizeof(l->v[0]));
    CHECK(l != NULL);
    if (!l)
        return;
    l->pools[0] = p;
    l->n = 2;
    snprintf(l->v[0].name, sizeof(l->v[0].name), "base");
    l->v[0].is_default = true;
    l->v[0].size_bytes = 4294967296ULL;
    l->v[0].pools = l->pools;
    l->v[0].npools = 1;
    snprintf(l->v[1].name, sizeof(l->v[1].name), "python");
    l->v[1].size_bytes = 7;
    snprintf(want, sizeof(want),
             "{\"templates\":[{\"name\":\"base\",\"default\":true,\"size_bytes\":4294967296,"
             "\"pools\":[%s}]},{\"name\":\"python\",\"default\":false,\"size_bytes\":7,"
             "\"pools\":[]}]}",
             pool);
    CHECK(same(sbx_json_templates(l), want));
    l->n = 0;
    CHECK(same(sbx_json_templates(l), "{\"templates\":[]}"));
    free(l);
}

static void test_fork_body(void)
{
    struct sbx_json_fork f;
    struct sbx_err err;
    json_t *b;

    /* Nothing given: one fork, the parent's TTL left, idle timeout and metadata. */
    b = body("{}");
    CHECK(sbx_json_fork(b, &f, &err) == 0);
    CHECK(f.req.count == SBX_UNSET && !f.req.ttl_given && !f.req.idle_given);
    CHECK(!f.req.metadata_given && f.req.nmetadata == 0);
    sbx_json_fork_free(&f);
    json_decref(b);

    b = body("{\"count\":3,\"ttl_seconds\":60,\"idle_timeout_seconds\":30,"
             "\"metadata\":{\"a\":\"b\"}}");
    CHECK(sbx_json_fork(b, &f, &err) == 0);
    CHECK(f.req.count == 3 && f.req.ttl_given && f.req.ttl_s == 60);
    CHECK(f.req.idle_given && f.req.idle_s == 30);
    CHECK(f.req.metadata_given && f.req.nmetadata == 1 && !strcmp(f.req.metadata[0].key, "a") &&
          f.req.metadata[0].val.n == 1 && !memcmp(f.req.metadata[0].val.p, "b", 1));
    sbx_json_fork_free(&f);
    json_decref(b);

    /* null: a count that is no integer (refused by the core), the configured TTL, an
     * idle timeout that is no integer, and no metadata at all (not the parent's). */
    b = body("{\"count\":null,\"ttl_seconds\":null,\"idle_timeout_seconds\":null,"
             "\"metadata\":null}");
    CHECK(sbx_json_fork(b, &f, &err) == 0);
    CHECK(f.req.count == SBX_NOT_INT && f.req.ttl_given && f.req.ttl_s == SBX_UNSET);
    CHECK(f.req.idle_given && f.req.idle_s == SBX_NOT_INT);
    CHECK(f.req.metadata_given && f.req.nmetadata == 0);
    sbx_json_fork_free(&f);
    json_decref(b);

    b = body("{\"count\":\"2\",\"ttl_seconds\":1.5}");
    CHECK(sbx_json_fork(b, &f, &err) == 0);
    CHECK(f.req.count == SBX_NOT_INT && f.req.ttl_s == SBX_NOT_INT);
    sbx_json_fork_free(&f);
    json_decref(b);

    b = body("{\"count\":1,\"color\":\"red\"}");
    CHECK(sbx_json_fork(b, &f, &err) == SBX_E_INVALID_ARGUMENT);
    CHECK(!strcmp(err.msg, "unknown field 'color'"));
    sbx_json_fork_free(&f);
    json_decref(b);

    b = body("{\"metadata\":{\"a\":1}}");
    CHECK(sbx_json_fork(b, &f, &err) == SBX_E_INVALID_ARGUMENT);
    CHECK(!strcmp(err.msg, "metadata must be an object of strings"));
    sbx_json_fork_free(&f);
    json_decref(b);

    b = body("[1]");
    CHECK(sbx_json_fork(b, &f, &err) == SBX_E_BAD_REQUEST);
    sbx_json_fork_free(&f);
    json_decref(b);
}

static void test_snap_and_pause_body(void)
{
    struct sbx_json_snap s;
    struct sbx_err err;
    json_t *b;

    b = body("{\"metadata\":{\"k\":\"v\",\"k2\":\"\"}}");
    CHECK(sbx_json_snap(b, &s, &err) == 0);
    CHECK(s.req.nmetadata == 2 && !strcmp(s.req.metadata[1].key, "k2") &&
          s.req.metadata[1].val.n == 0);
    sbx_json_snap_free(&s);
    json_decref(b);

    b = body("{}");
    CHECK(sbx_json_snap(b, &s, &err) == 0 && s.req.nmetadata == 0);
    sbx_json_snap_free(&s);
    json_decref(b);

    b = body("{\"count\":2}");
    CHECK(sbx_json_snap(b, &s, &err) == SBX_E_INVALID_ARGUMENT);
    CHECK(!strcmp(err.msg, "unknown field 'count'"));
    sbx_json_snap_free(&s);
    json_decref(b);

    b = body("{\"metadata\":[\"x\"]}");
    CHECK(sbx_json_snap(b, &s, &err) == SBX_E_INVALID_ARGUMENT);
    sbx_json_snap_free(&s);
    json_decref(b);

    /* A pause takes no fields. */
    b = body("{}");
    CHECK(sbx_json_pause(b, &err) == 0);
    json_decref(b);
    b = body("{\"now\":true}");
    CHECK(sbx_json_pause(b, &err) == SBX_E_INVALID_ARGUMENT);
    json_decref(b);
    CHECK(sbx_json_pause(NULL, &err) == SBX_E_BAD_REQUEST);
}

int main(void)
{
    test_snap_rec();
    test_results();
    test_pools();
    test_fork_body();
    test_snap_and_pause_body();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
