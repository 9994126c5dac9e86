/*
 * test_idx_chan.c - unit tests of the LMDB index (records survive a reopen,
 * delete, iteration order) and of the host end of the guest channel (frames
 * split across reads, a hostile peer's oversized or malformed frame closes
 * the channel with a reason, a callback may free the channel).
 */
#include "chan.h"
#include "idx.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

int failures;

/* ---- index ---- */

struct seen {
    int n;
    char keys[8][32];
};

static int collect(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct seen *s = ud;
    if (s->n < 8)
        snprintf(s->keys[s->n++], sizeof(s->keys[0]), "%.*s=%.*s", (int)klen, key, (int)vlen, val);
    return 0;
}

static void test_idx(void)
{
    char dir[] = "/tmp/warren-idx-XXXXXX";
    struct idx *ix = NULL;
    struct seen s = {0};

    CHECK(mkdtemp(dir) != NULL);
    CHECK(idx_open(dir, &ix) == 0);
    CHECK(idx_put(ix, IDX_SANDBOXES, "sb-b", "2", 1) == 0);
    CHECK(idx_put(ix, IDX_SANDBOXES, "sb-a", "1", 1) == 0);
    CHECK(idx_put(ix, IDX_SANDBOXES, "sb-c", "3", 1) == 0);
    CHECK(idx_put(ix, IDX_SANDBOXES, "sb-a", "one", 3) == 0); /* overwrite */
    CHECK(idx_del(ix, IDX_SANDBOXES, "sb-c") == 0);
    CHECK(idx_del(ix, IDX_SANDBOXES, "sb-missing") == 0); /* not an error */
    /* Tables are apart: the same key in another table is another record. */
    CHECK(idx_put(ix, IDX_VMS, "sb-a", "vm", 2) == 0);
    CHECK(idx_put(ix, IDX_VMS, "vm-1", "x", 1) == 0);
    CHECK(idx_del(ix, IDX_VMS, "vm-1") == 0);
    CHECK(idx_put(ix, IDX_NTABLES, "k", "v", 1) == -EINVAL);
    idx_close(ix);

    /* A new process (here: a new open) finds exactly what was written. */
    CHECK(idx_open(dir, &ix) == 0);
    CHECK(idx_foreach(ix, IDX_SANDBOXES, collect, &s) == 0);
    CHECK(s.n == 2);
    CHECK(strcmp(s.keys[0], "sb-a=one") == 0 && strcmp(s.keys[1], "sb-b=2") == 0);
    memset(&s, 0, sizeof(s));
    CHECK(idx_foreach(ix, IDX_VMS, collect, &s) == 0);
    CHECK(s.n == 1 && strcmp(s.keys[0], "sb-a=vm") == 0);
    memset(&s, 0, sizeof(s));
    CHECK(idx_foreach(ix, IDX_TEMPLATES, collect, &s) == 0 && s.n == 0);
    CHECK(idx_foreach(ix, IDX_SNAPSHOTS, collect, &s) == 0 && s.n == 0);
    CHECK(idx_migrated(ix) == 0);
    CHECK(idx_sync(ix) == 0);
    idx_close(ix);

    /* An unusable directory is an error with a message, not a crash. */
    CHECK(idx_open("/proc/self/nonexistent/dir", &ix) < 0);
    CHECK(strlen(idx_strerror(-ENOENT)) > 0);

    {
        char p[128];
        snprintf(p, sizeof(p), "%s/data.mdb", dir);
        unlink(p);
        snprintf(p, sizeof(p), "%s/lock.mdb", dir);
        unlink(p);
        rmdir(dir);
    }
}

/* ---- channel ---- */

struct probe {
    struct chan *c;
    int frames;
    uint32_t last_type;
    uint64_t sum_n;
    int closed;
    int err;
    int free_on_frame; /* free the chan from inside the frame callback */
};

static void on_frame(void *ud, const struct proto_frame *f)
{
    struct probe *p = ud;
    p->frames++;
    p->last_type = f->type;
    if (f->type == PROTO_CREDIT)
        p->sum_n += f->v[PK_N].u;
    if (p->free_on_frame) {
        chan_free(p->c);
        p->c = NULL;
    }
}

static void on_closed(void *ud, int err, const char *why)
{
    struct probe *p = ud;
    p->closed++;
    p->err = err;
    CHECK(why && *why);
}

static const struct chan_cbs cbs = {on_frame, on_closed};

static void run_until(struct ev_loop *loop, int *flag, int want)
{
    for (int i = 0; i < 200 && *flag < want; i++)
        ev_run(loop, EVRUN_NOWAIT | EVRUN_ONCE), usleep(1000);
}

static void start(struct ev_loop *loop, struct probe *p, int sv[2])
{
    memset(p, 0, sizeof(*p));
    CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    CHECK(chan_new(loop, sv[0], &cbs, p, &p->c) == 0);
}

static void test_chan_split_reads(struct ev_loop *loop)
{
    struct probe p;
    int sv[2];
    struct proto_buf b;

    start(loop, &p, sv);
    proto_buf_init(&b);
    for (int i = 1; i <= 100; i++)
        proto_send_credit(&b, 7, (uint64_t)i);
    /* Byte by byte: every frame still arrives whole, once. */
    for (size_t i = 0; i < b.len; i++) {
        CHECK(write(sv[1], b.p + i, 1) == 1);
        if (i % 97 == 0)
            ev_run(loop, EVRUN_NOWAIT);
    }
    run_until(loop, &p.frames, 100);
    CHECK(p.frames == 100 && p.sum_n == 5050 && p.closed == 0);

    /* The other way: frames queued on the host reach the peer. */
    proto_send_end(chan_tx(p.c), 9);
    chan_flush(p.c);
    uint8_t got[64];
    CHECK(read(sv[1], got, sizeof(got)) > PROTO_HDR);

    /* The peer hangs up: closed once, with err 0. */
    close(sv[1]);
    run_until(loop, &p.closed, 1);
    CHECK(p.closed == 1 && p.err == 0);
    chan_free(p.c);
    proto_buf_free(&b);
}

static void test_chan_hostile(struct ev_loop *loop)
{
    struct probe p;
    int sv[2];

    /* A length over the cap: closed with PROTO_ETOOBIG, no frame. */
    start(loop, &p, sv);
    uint8_t big[4] = {0x10, 0, 0, 0};
    CHECK(write(sv[1], big, 4) == 4);
    run_until(loop, &p.closed, 1);
    CHECK(p.closed == 1 && p.err == PROTO_ETOOBIG && p.frames == 0);
    chan_free(p.c);
    close(sv[1]);

    /* Well framed but not msgpack of our schema: closed with a decode error. */
    start(loop, &p, sv);
    uint8_t bad[] = {0, 0, 0, 2, 0x91, 0x01};
    CHECK(write(sv[1], bad, sizeof(bad)) == (ssize_t)sizeof(bad));
    run_until(loop, &p.closed, 1);
    CHECK(p.closed == 1 && p.err == PROTO_ESCHEMA && p.frames == 0);
    chan_free(p.c);
    close(sv[1]);

    /* A callback that frees the chan: no further callback, no use after free (ASan). */
    start(loop, &p, sv);
    p.free_on_frame = 1;
    struct proto_buf b;
    proto_buf_init(&b);
    proto_send_credit(&b, 1, 1);
    proto_send_credit(&b, 1, 2);
    CHECK(write(sv[1], b.p, b.len) == (ssize_t)b.len);
    run_until(loop, &p.frames, 1);
    ev_run(loop, EVRUN_NOWAIT);
    CHECK(p.frames == 1 && p.closed == 0 && p.c == NULL);
    close(sv[1]);
    proto_buf_free(&b);
}

static int count_cb(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    (void)key;
    (void)klen;
    (void)val;
    *(unsigned *)ud += vlen == 1000;
    return 0;
}

/* A map far too small for what is written: every write still succeeds, the map grows
 * (MDB_MAP_FULL, then mdb_env_set_mapsize and a retry), and a reopen finds it all.
 * Before, the first put past 64 KiB failed with MDB_MAP_FULL. */
static void test_idx_grow(void)
{
    char dir[] = "/tmp/warren-idx-XXXXXX", key[32], val[1000], p[128];
    struct idx *ix = NULL;
    unsigned n = 0, fails = 0;
    size_t map0;

    memset(val, 'v', sizeof(val));
    CHECK(mkdtemp(dir) != NULL);
    CHECK(idx_open_map(dir, 64 * 1024, &ix) == 0);
    map0 = idx_map_size(ix);
    for (int i = 0; i < 2000; i++) {
        snprintf(key, sizeof(key), "sb-%06d", i);
        fails += idx_put(ix, IDX_SANDBOXES, key, val, sizeof(val)) != 0;
    }
    for (int i = 0; i < 2000; i += 2) {
        snprintf(key, sizeof(key), "sb-%06d", i);
        fails += idx_del(ix, IDX_SANDBOXES, key) != 0;
    }
    CHECK(fails == 0);
    CHECK(idx_map_size(ix) > map0);
    printf("idx: map grew from %zu KiB to %zu KiB for 2000 records of 1000 bytes\n", map0 >> 10,
           idx_map_size(ix) >> 10);
    idx_close(ix);
    CHECK(idx_open_map(dir, 64 * 1024, &ix) == 0);
    CHECK(idx_foreach(ix, IDX_SANDBOXES, count_cb, &n) == 0);
    CHECK(n == 1000);
    idx_close(ix);
    snprintf(p, sizeof(p), "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

/* A peer that never reads: the send buffer is capped, and the close comes from the loop,
 * never from inside chan_flush() (its caller may be in the middle of an operation). */
static void test_chan_send_cap(struct ev_loop *loop)
{
    struct probe p;
    int sv[2];
    static uint8_t junk[PROTO_MAX_DATA];
    uint64_t mark;
    int frames = 0;

    start(loop, &p, sv);
    chan_set_tx_max(p.c, 1024 * 1024);
    /* Small frames go out at once: the mark is passed. */
    proto_send_end(chan_tx(p.c), 1);
    mark = chan_tx_mark(p.c);
    chan_flush(p.c);
    CHECK(chan_tx_passed(p.c, mark));
    /* Fill the socket, then the buffer, with nobody reading sv[1]. */
    while (p.closed == 0 && frames < 1000) {
        struct proto_enc e;
        proto_enc_begin(&e, chan_tx(p.c), PROTO_DATA, 1, 3);
        proto_put_bin(&e, PK_DATA, junk, sizeof(junk));
        proto_enc_end(&e);
        mark = chan_tx_mark(p.c);
        chan_flush(p.c);
        CHECK(p.closed == 0); /* never from inside chan_flush */
        frames++;
        if (!chan_tx_passed(p.c, mark))
            ev_run(loop, EVRUN_NOWAIT);
    }
    CHECK(!chan_tx_passed(p.c, mark));
    CHECK(p.closed == 1 && p.err == CHAN_EFULL);
    /* It stopped well before the 64 MiB offered: at the cap plus what the socket holds. */
    CHECK(frames < 200);
    chan_free(p.c);
    close(sv[1]);
}

/* A sandbox record exactly as warrend wrote it before the named tables (6482031). */
#define OLD_RECORD                                                                                 \
    "{\"id\":\"sb-0011223344556677\",\"template\":\"minimal\",\"state\":\"running\","              \
    "\"reason\":\"\",\"created_ms\":1764600000000,\"expires_ms\":1764603600000,"                   \
    "\"ended_ms\":0,\"last_active_ms\":1764600001000,\"idle_s\":300,\"mem_mb\":256,"               \
    "\"vcpus\":1,\"pid\":4242,\"env\":{},\"metadata\":{\"owner\":\"alice\"},"                      \
    "\"run_dir\":\"/var/lib/warren/sandboxes/sb-0011223344556677\","                               \
    "\"disk\":\"/var/lib/warren/sandboxes/sb-0011223344556677/disk.qcow2\"}"

/* Write records into the unnamed database with LMDB itself, as the old idx.c did. */
static void write_old_layout(const char *dir, int n)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    char key[32];

    CHECK(mdb_env_create(&env) == 0);
    CHECK(mdb_env_set_mapsize(env, 1 << 20) == 0);
    CHECK(mdb_env_open(env, dir, MDB_NOSYNC | MDB_NOTLS, 0600) == 0);
    CHECK(mdb_txn_begin(env, NULL, 0, &txn) == 0);
    CHECK(mdb_dbi_open(txn, NULL, 0, &dbi) == 0);
    for (int i = 0; i < n; i++) {
        MDB_val k, v = {strlen(OLD_RECORD), (void *)OLD_RECORD};
        if (i == 0)
            snprintf(key, sizeof(key), "sb-0011223344556677");
        else
            snprintf(key, sizeof(key), "sb-%016d", i);
        k.mv_size = strlen(key);
        k.mv_data = key;
        CHECK(mdb_put(txn, dbi, &k, &v, 0) == 0);
    }
    CHECK(mdb_txn_commit(txn) == 0);
    mdb_env_sync(env, 1);
    mdb_env_close(env);
}

static int first_cb(void *ud, const char *key, size_t klen, const char *val, size_t vlen)
{
    struct seen *s = ud;
    s->n++;
    if (klen == strlen("sb-0011223344556677") && !memcmp(key, "sb-0011223344556677", klen)) {
        CHECK(vlen == strlen(OLD_RECORD) && !memcmp(val, OLD_RECORD, vlen));
        s->keys[0][0] = 'y'; /* found, byte for byte */
    }
    return 0;
}

/* An index of the old layout (one unnamed database of sandbox records) is moved into the
 * sandboxes table on open, once; the move fits a tiny map by growing it; the other tables
 * start empty; a second open moves nothing and finds the same records. */
static void test_idx_migrate(void)
{
    char dir[] = "/tmp/warren-idx-XXXXXX", p[128];
    struct idx *ix = NULL;
    struct seen s = {0};
    unsigned n = 0;
    off_t old_size = 0;

    CHECK(mkdtemp(dir) != NULL);
    write_old_layout(dir, 200); /* ~100 KiB of records: the copy needs twice that */
    {
        struct stat st;
        snprintf(p, sizeof(p), "%s/data.mdb", dir);
        CHECK(stat(p, &st) == 0);
        old_size = st.st_size;
    }
    CHECK(idx_open_map(dir, 64 * 1024, &ix) == 0);
    CHECK(idx_migrated(ix) == 200);
    printf("idx: moved 200 old records; file %lld KiB before, map %zu KiB after\n",
           (long long)old_size >> 10, idx_map_size(ix) >> 10);
    /* The copy did not fit the file's own size: the move grew the map and was retried. */
    CHECK(idx_map_size(ix) > (size_t)old_size);
    CHECK(idx_foreach(ix, IDX_SANDBOXES, first_cb, &s) == 0);
    CHECK(s.n == 200 && s.keys[0][0] == 'y');
    CHECK(idx_foreach(ix, IDX_VMS, count_cb, &n) == 0 && n == 0);
    CHECK(idx_foreach(ix, IDX_TEMPLATES, count_cb, &n) == 0 && n == 0);
    CHECK(idx_put(ix, IDX_VMS, "vm-1", "{}", 2) == 0);
    idx_close(ix);

    CHECK(idx_open_map(dir, 64 * 1024, &ix) == 0);
    CHECK(idx_migrated(ix) == 0);
    memset(&s, 0, sizeof(s));
    CHECK(idx_foreach(ix, IDX_SANDBOXES, first_cb, &s) == 0);
    CHECK(s.n == 200 && s.keys[0][0] == 'y');
    memset(&s, 0, sizeof(s));
    CHECK(idx_foreach(ix, IDX_VMS, collect, &s) == 0);
    CHECK(s.n == 1 && strcmp(s.keys[0], "vm-1={}") == 0);
    idx_close(ix);

    /* The old records are gone from the unnamed database: only the tables' names remain. */
    {
        MDB_env *env;
        MDB_txn *txn;
        MDB_dbi dbi;
        MDB_stat st;
        CHECK(mdb_env_create(&env) == 0);
        CHECK(mdb_env_set_maxdbs(env, 8) == 0);
        CHECK(mdb_env_open(env, dir, MDB_NOTLS | MDB_RDONLY, 0600) == 0);
        CHECK(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0);
        CHECK(mdb_dbi_open(txn, NULL, 0, &dbi) == 0);
        CHECK(mdb_stat(txn, dbi, &st) == 0);
        CHECK(st.ms_entries == IDX_NTABLES);
        mdb_txn_abort(txn);
        mdb_env_close(env);
    }
    snprintf(p, sizeof(p), "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

int main(void)
{
    struct ev_loop *loop = ev_default_loop(EVBACKEND_EPOLL);

    test_idx();
    test_idx_grow();
    test_idx_migrate();
    test_chan_split_reads(loop);
    test_chan_hostile(loop);
    test_chan_send_cap(loop);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("idx, chan: all checks passed\n");
    return 0;
}
