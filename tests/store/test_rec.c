/*
 * test_rec.c - the records' on-disk form (store/): records as older warrends
 * wrote them decode and encode again to the same bytes, string maps keep
 * JSON's rules (a key's last value in its first place, UTF-8 text only), and
 * what is not a record is refused.
 */
#include "rec.h"
#include "check.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int failures;

/* Decode s, check it encodes to the same bytes; the decoded record in *r. */
static void same_bytes(const char *s, struct rec_sandbox *r)
{
    char *again;

    CHECK(rec_sandbox_decode(s, strlen(s), r) == 0);
    again = rec_sandbox_encode(r);
    CHECK(again && strcmp(again, s) == 0);
    if (again && strcmp(again, s) != 0)
        fprintf(stderr, "want %s\ngot  %s\n", s, again);
    free(again);
}

static void test_sandbox_bytes(void)
{
    static const char full[] =
        "{\"id\":\"sb-abc\",\"template\":\"base\",\"state\":\"running\",\"reason\":\"\","
        "\"created_ms\":1700000000000,\"expires_ms\":1700000300000,\"ended_ms\":0,"
        "\"last_active_ms\":1700000001000,\"idle_s\":0,\"mem_mb\":512,\"vcpus\":1,"
        "\"env\":{\"B\":\"x\\\"y\",\"A\":\"1\"},\"metadata\":{\"k\":\"v\",\"\xc3\xa9\":"
        "\"\xc3\xbc\"},"
        "\"vm_id\":\"vm-1\",\"keep_running\":true,\"public_ports\":[8080,3000],"
        "\"snapshot_id\":\"snap-1\",\"persistent\":true,\"auto_pause\":true,\"ttl_s\":300,"
        "\"paused_ms\":1700000002000}";
    static const char bare[] =
        "{\"id\":\"sb-1\",\"template\":\"minimal\",\"state\":\"ended\",\"reason\":\"deleted\","
        "\"created_ms\":1,\"expires_ms\":2,\"ended_ms\":3,\"last_active_ms\":1,\"idle_s\":60,"
        "\"mem_mb\":256,\"vcpus\":2,\"env\":{},\"metadata\":{},\"vm_id\":\"\"}";
    struct rec_sandbox r;

    same_bytes(full, &r);
    CHECK(strcmp(r.id, "sb-abc") == 0 && strcmp(r.vm_id, "vm-1") == 0);
    CHECK(r.created_ms == 1700000000000 && r.mem_mb == 512 && r.ttl_s == 300);
    CHECK(r.env.n == 2 && strcmp(r.env.v[0].key, "B") == 0 && r.env.v[0].val.n == 3);
    CHECK(rec_kv_get(&r.metadata, "k") && !rec_kv_get(&r.metadata, "K"));
    CHECK(r.npublic == 2 && r.public_ports[0] == 8080 && r.public_ports[1] == 3000);
    CHECK(r.keep_running && r.persistent && r.auto_pause && r.paused_ms == 1700000002000);
    CHECK(!r.run_dir && !r.disk && r.pid == 0);
    rec_sandbox_free(&r);

    same_bytes(bare, &r);
    CHECK(!r.snapshot_id && !r.keep_running && r.npublic == 0 && r.env.n == 0);
    rec_sandbox_free(&r);
}

static void test_sandbox_old_and_bad(void)
{
    /* An older warrend's: no vm_id, its VM's pid, run_dir and disk instead. */
    static const char old[] =
        "{\"id\":\"sb-2\",\"template\":\"base\",\"state\":\"running\",\"reason\":\"\","
        "\"created_ms\":1,\"expires_ms\":2,\"ended_ms\":0,\"last_active_ms\":1,\"idle_s\":0,"
        "\"mem_mb\":256,\"vcpus\":1,\"env\":{},\"metadata\":{\"n\":7},\"pid\":1234,"
        "\"run_dir\":\"/s/run/sb-2\",\"disk\":\"/s/run/sb-2/disk.qcow2\","
        "\"public_ports\":[0,80,70000,\"x\"]}";
    static const char *bad[] = {
        "",
        "[]",
        "{\"id\":\"sb-3\"}",
        "{\"id\":1}",
        "{\"id\":\"a\",\"template\":\"b\",\"state\":\"c\",\"reason\":\"\",\"created_ms\":\"1\","
        "\"expires_ms\":2,\"ended_ms\":0,\"last_active_ms\":1,\"idle_s\":0,\"mem_mb\":1,"
        "\"vcpus\":1,\"env\":{},\"metadata\":{}}",
    };
    struct rec_sandbox r;

    CHECK(rec_sandbox_decode(old, strlen(old), &r) == 0);
    CHECK(strcmp(r.vm_id, "") == 0 && r.pid == 1234);
    CHECK(r.run_dir && strcmp(r.run_dir, "/s/run/sb-2") == 0 && r.disk);
    CHECK(r.metadata.n == 0); /* a value that is not a string is not kept */
    CHECK(r.npublic == 1 && r.public_ports[0] == 80);
    rec_sandbox_free(&r);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(rec_sandbox_decode(bad[i], strlen(bad[i]), &r) == -EINVAL);
        CHECK(r.doc == NULL && r.env.v == NULL);
    }
}

static void test_kv(void)
{
    struct sbx_kv in[] = {
        {"a", {"1", 1}},
        {"b", {"two", 3}},
        {"a", {"3", 1}},
    };
    struct sbx_kv nul[] = {{"z", {"x\0y", 3}}};
    struct sbx_kv notutf8[] = {{"k", {"\xff", 1}}};
    struct sbx_kv badkey[] = {{"\xc3", {"v", 1}}};
    struct sbx_kv nokey[] = {{NULL, {"v", 1}}};
    struct rec_kv m = {0};

    CHECK(rec_kv_set(&m, in, 3) == 0);
    /* "a" keeps its first place and takes its last value, as a JSON object would. */
    CHECK(m.n == 2 && strcmp(m.v[0].key, "a") == 0 && strcmp(m.v[0].val.p, "3") == 0);
    CHECK(strcmp(m.v[1].key, "b") == 0 && m.v[1].val.n == 3);
    CHECK(m.stored_bytes == strlen("{\"a\":\"3\",\"b\":\"two\"}"));
    /* A refused map leaves the old one as it was. */
    CHECK(rec_kv_set(&m, notutf8, 1) == -EINVAL);
    CHECK(rec_kv_set(&m, badkey, 1) == -EINVAL);
    CHECK(rec_kv_set(&m, nokey, 1) == -EINVAL);
    CHECK(m.n == 2);
    CHECK(rec_kv_set(&m, nul, 1) == 0);
    CHECK(m.n == 1 && m.v[0].val.n == 3 && memcmp(m.v[0].val.p, "x\0y", 4) == 0);
    CHECK(m.stored_bytes == strlen("{\"z\":\"x\\u0000y\"}"));
    CHECK(rec_kv_set(&m, NULL, 0) == 0 && m.n == 0 && m.stored_bytes == 2);
    rec_kv_free(&m);
}

#define IDENT(p, s, m, i) "{\"path\":\"" p "\",\"size\":" s ",\"mtime_ns\":" m ",\"ino\":" i "}"

static void test_snapshot(void)
{
    static const char rec[] =
        "{\"id\":\"snap-1\",\"parent\":\"sb-1\",\"parent_snapshot\":\"\",\"template\":\"base\","
        "\"mem_mb\":512,\"vcpus\":1,\"size\":12345,\"created_ms\":1700000000000,"
        "\"dir\":\"/s/snapshots/snap-1\",\"base\":" IDENT(
            "/img/base.ext4", "1000", "1700000000000000000",
            "42") ","
                  "\"metadata\":{\"k\":\"v\"},\"type\":\"fork\",\"disk_backing\":\"/s/x.qcow2\","
                  "\"mem\":\"/dev/shm/"
                  "m\",\"network\":{\"internet\":false,\"allow_out\":[\"10.0.0.0/8\","
                  "\"example.com\"],\"deny_out\":[],\"rate_mbit\":5,\"max_connections\":0}}";
    static const char bad_base[] =
        "{\"id\":\"snap-2\",\"parent\":\"sb-1\",\"parent_snapshot\":\"snap-1\",\"template\":"
        "\"base\",\"mem_mb\":512,\"vcpus\":1,\"size\":1,\"created_ms\":1,\"dir\":\"/d\","
        "\"base\":{\"path\":7},\"metadata\":{},\"network\":[]}";
    struct rec_snap r;
    char *again;

    CHECK(rec_snap_decode(rec, strlen(rec), &r) == 0);
    CHECK(strcmp(r.id, "snap-1") == 0 && strcmp(r.parent_snapshot, "") == 0);
    CHECK(r.base_ok && strcmp(r.base.path, "/img/base.ext4") == 0 && r.base.ino == 42 &&
          r.base.mtime_ns == 1700000000000000000ll);
    CHECK(r.metadata.n == 1 && strcmp(r.type, "fork") == 0 && strcmp(r.mem, "/dev/shm/m") == 0);
    CHECK(r.net.kind == REC_NET_OK && r.net.req.internet == 0 && r.net.req.rate_mbit == 5);
    CHECK(r.net.req.nallow_out == 2 && strcmp(r.net.req.allow_out[1], "example.com") == 0);
    CHECK(r.net.req.ndeny_out == 0);
    /* Written back from the policy as the core keeps it: addresses, then names. */
    r.has_network = true;
    r.network = (struct sbx_net_rec){.internet = false,
                                     .allow_out = "10.0.0.0/8",
                                     .allow_names = "example.com",
                                     .deny_out = "",
                                     .deny_names = "",
                                     .rate_mbit = 5};
    again = rec_snap_encode(&r);
    CHECK(again && strcmp(again, rec) == 0);
    free(again);
    rec_snap_free(&r);

    CHECK(rec_snap_decode(bad_base, strlen(bad_base), &r) == 0);
    CHECK(!r.base_ok && r.net.kind == REC_NET_BAD && !r.type && !r.mem && !r.disk_backing);
    rec_snap_free(&r);
    CHECK(rec_snap_decode("{}", 2, &r) == -EINVAL);
}

static void test_vm(void)
{
    static const char net[] =
        "{\"id\":\"vm-1\",\"template\":\"base\",\"boot\":\"kernel\",\"run_dir\":\"/s/vms/vm-1\","
        "\"disk\":\"/s/vms/vm-1/disk.qcow2\",\"mem_mb\":512,\"vcpus\":1,\"created_ms\":5,"
        "\"pid\":99,\"sandbox\":\"sb-1\",\"net_slot\":3,\"backing\":\"/img/base.ext4\","
        "\"mem_path\":\"/dev/shm/x\",\"internet\":true,\"allow_out\":\"1.2.3.4/32\","
        "\"deny_names\":\"bad.example\",\"rate_mbit\":10,\"max_connections\":0}";
    static const char bare[] =
        "{\"id\":\"vm-2\",\"template\":\"minimal\",\"boot\":\"pool\",\"run_dir\":\"/r\","
        "\"disk\":\"/r/d\",\"mem_mb\":256,\"vcpus\":2,\"created_ms\":1,\"pid\":0,"
        "\"sandbox\":\"\"}";
    static const char *both[] = {net, bare};
    struct rec_vm r;

    for (int i = 0; i < 2; i++) {
        char *again;
        CHECK(rec_vm_decode(both[i], strlen(both[i]), &r) == 0);
        again = rec_vm_encode(&r);
        CHECK(again && strcmp(again, both[i]) == 0);
        if (i == 0)
            CHECK(r.has_net_slot && r.net_slot == 3 && r.has_network && r.network.internet &&
                  r.network.rate_mbit == 10 && !r.network.deny_out &&
                  strcmp(r.network.deny_names, "bad.example") == 0 && r.pid == 99);
        else
            CHECK(!r.has_net_slot && !r.has_network && !r.backing && r.mem_mb == 256);
        free(again);
        rec_vm_free(&r);
    }
    CHECK(rec_vm_decode("{\"id\":\"vm-3\"}", 13, &r) == -EINVAL);
}

static void test_template(void)
{
    static const char rec[] =
        "{\"template\":\"base\",\"vm_id\":\"vm-t\",\"dir\":\"/s/t\",\"snapshot\":"
        "\"/s/t/state.snap\",\"disk\":\"/s/t/disk.qcow2\",\"mem_path\":\"/dev/shm/t.mem\","
        "\"mem_mb\":512,\"vcpus\":1,\"base\":" IDENT(
            "/i/base.ext4", "1", "2",
            "3") ","
                 "\"kernel\":" IDENT("/i/vmlinuz", "4", "5", "6") ",\"initrd\":" IDENT(
                     "/i/initrd", "7", "8", "9") ","
                                                 "\"created_ms\":7,\"net\":false,\"cmdline\":{"
                                                 "\"rev\":2,\"append\":\"quiet\"},"
                                                 "\"warmup\":\"\"}";
    static const char odd[] = "{\"vm_id\":\"vm-u\",\"mem_mb\":\"x\",\"cmdline\":{\"rev\":2,"
                              "\"append\":\"\",\"more\":1},\"kernel\":{}}";
    struct rec_tpl r;
    char *again;

    CHECK(rec_tpl_decode(rec, strlen(rec), &r) == 0);
    CHECK(r.shape_ok && r.base_ok && r.kernel_ok && r.initrd_ok && r.cmdline_ok);
    CHECK(r.cmdline_rev == 2 && strcmp(r.cmdline_append, "quiet") == 0 && !r.net);
    CHECK(r.kernel.size == 4 && strcmp(r.initrd.path, "/i/initrd") == 0 && r.created_ms == 7);
    again = rec_tpl_encode(&r);
    CHECK(again && strcmp(again, rec) == 0);
    free(again);
    rec_tpl_free(&r);

    CHECK(rec_tpl_decode(odd, strlen(odd), &r) == 0);
    CHECK(!r.shape_ok && !r.base_ok && !r.kernel_ok && !r.cmdline_ok && !r.warmup && !r.tmpl);
    rec_tpl_free(&r);
    CHECK(rec_tpl_decode("[1]", 3, &r) == -EINVAL);
    CHECK(rec_tpl_decode("{", 1, &r) == -EINVAL);
}

static void test_text_member(void)
{
    char out[8];

    CHECK(rec_text_member("{\"status\":\"active\"}", "status", out, sizeof(out)) == 0);
    CHECK(strcmp(out, "active") == 0);
    CHECK(rec_text_member("{\"status\":\"completed\"}", "status", out, sizeof(out)) == -EINVAL);
    CHECK(rec_text_member("{\"status\":1}", "status", out, sizeof(out)) == -EINVAL);
    CHECK(rec_text_member("{\"status\":\"a\\u0000b\"}", "status", out, sizeof(out)) == -EINVAL);
    CHECK(rec_text_member("not json", "status", out, sizeof(out)) == -EINVAL);
    CHECK(rec_text_member(NULL, "status", out, sizeof(out)) == -EINVAL);
}

int main(void)
{
    test_sandbox_bytes();
    test_sandbox_old_and_bad();
    test_kv();
    test_snapshot();
    test_vm();
    test_template();
    test_text_member();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
