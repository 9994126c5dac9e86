/* idx.c - LMDB-backed index of sandboxes, VMs, templates and snapshots (see idx.h).
 *
 * The map is a fixed-size window over the file: a write that does not fit
 * fails with MDB_MAP_FULL. Writes then double the map (mdb_env_set_mapsize
 * is allowed here: warrend is one thread and no transaction is open between
 * calls) and try again, up to IDX_MAP_MAX. */
#include "idx.h"

#include <errno.h>
#include <stdbool.h>
#include <lmdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define IDX_MAP_DEFAULT (256ull << 20)
#define IDX_MAP_MAX     (64ull << 30)

struct idx {
    MDB_env *env;
    MDB_dbi dbi[IDX_NTABLES];
    size_t map;
    unsigned migrated;
};

static const char *const table_names[IDX_NTABLES] = {"sandboxes", "vms", "templates", "snapshots"};

const char *idx_table_name(enum idx_table tb)
{
    return (unsigned)tb < IDX_NTABLES ? table_names[tb] : "?";
}

static bool is_table_name(const MDB_val *k)
{
    for (unsigned i = 0; i < IDX_NTABLES; i++)
        if (k->mv_size == strlen(table_names[i]) && !memcmp(k->mv_data, table_names[i], k->mv_size))
            return true;
    return false;
}

static int lerr(int rc)
{
    return rc > 0 ? -rc : rc; /* errno values and MDB_* codes (negative) both become < 0 */
}

const char *idx_strerror(int err)
{
    return mdb_strerror(err < 0 && err > -4096 ? -err : err);
}

static int grow(struct idx *ix);

/*
 * In a new write transaction (*txn, left open on success for the caller to
 * commit): open (creating) every table, then move the records of the old
 * layout (any key of the unnamed database that is not a table's name) into
 * the sandboxes table. One transaction: the move is all or nothing.
 */
static int open_tables(struct idx *ix, MDB_txn **txn)
{
    MDB_dbi main_dbi;
    MDB_cursor *cur = NULL;
    MDB_val k, v;
    int rc;

    ix->migrated = 0;
    rc = mdb_txn_begin(ix->env, NULL, 0, txn);
    if (rc)
        return rc;
    for (unsigned i = 0; i < IDX_NTABLES && rc == 0; i++)
        rc = mdb_dbi_open(*txn, table_names[i], MDB_CREATE, &ix->dbi[i]);
    if (rc == 0)
        rc = mdb_dbi_open(*txn, NULL, 0, &main_dbi);
    if (rc == 0)
        rc = mdb_cursor_open(*txn, main_dbi, &cur);
    while (rc == 0 && (rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
        if (is_table_name(&k))
            continue;
        /* Put before the delete: k and v point into the page the delete changes. */
        rc = mdb_put(*txn, ix->dbi[IDX_SANDBOXES], &k, &v, 0);
        if (rc == 0)
            rc = mdb_cursor_del(cur, 0);
        ix->migrated += rc == 0;
    }
    if (cur)
        mdb_cursor_close(cur);
    if (rc == MDB_NOTFOUND)
        rc = 0;
    if (rc) {
        mdb_txn_abort(*txn);
        *txn = NULL;
    }
    return rc;
}

int idx_open(const char *dir, struct idx **out)
{
    return idx_open_map(dir, IDX_MAP_DEFAULT, out);
}

int idx_open_map(const char *dir, size_t map_bytes, struct idx **out)
{
    struct idx *ix = calloc(1, sizeof(*ix));
    MDB_txn *txn = NULL;
    int rc;

    if (!ix)
        return -ENOMEM;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        rc = -errno;
        goto fail;
    }
    rc = mdb_env_create(&ix->env);
    if (rc)
        goto fail;
    rc = mdb_env_set_mapsize(ix->env, map_bytes);
    if (rc)
        goto fail;
    rc = mdb_env_set_maxdbs(ix->env, IDX_NTABLES);
    if (rc)
        goto fail;
    rc = mdb_env_open(ix->env, dir, MDB_NOSYNC | MDB_NOTLS, 0600);
    if (rc)
        goto fail;
    {
        /* An existing file bigger than asked keeps its size: LMDB says what it is. */
        MDB_envinfo info;
        ix->map = mdb_env_info(ix->env, &info) == 0 ? info.me_mapsize : map_bytes;
    }
    for (;;) {
        rc = open_tables(ix, &txn);
        if (rc == 0) {
            rc = mdb_txn_commit(txn);
            txn = NULL;
        }
        if (rc != MDB_MAP_FULL)
            break;
        if (txn) {
            mdb_txn_abort(txn);
            txn = NULL;
        }
        ix->migrated = 0;
        if ((rc = grow(ix)) != 0)
            break;
    }
    if (rc)
        goto fail;
    *out = ix;
    return 0;
fail:
    if (txn)
        mdb_txn_abort(txn);
    if (ix->env)
        mdb_env_close(ix->env);
    free(ix);
    return lerr(rc);
}

void idx_close(struct idx *ix)
{
    if (!ix)
        return;
    mdb_env_sync(ix->env, 1);
    mdb_env_close(ix->env);
    free(ix);
}

/* Double the map after MDB_MAP_FULL: 0 to retry, or the error to return. */
static int grow(struct idx *ix)
{
    size_t want = ix->map * 2;
    int rc;

    if (ix->map >= IDX_MAP_MAX)
        return MDB_MAP_FULL;
    if (want > IDX_MAP_MAX)
        want = IDX_MAP_MAX;
    rc = mdb_env_set_mapsize(ix->env, want);
    if (rc)
        return rc;
    ix->map = want;
    return 0;
}

/* One write transaction: put (val) or delete (val NULL), grown and retried on MAP_FULL
 * (mdb_put or mdb_txn_commit can report it; either aborts the transaction). */
static int write_one(struct idx *ix, enum idx_table tb, const char *key, const char *val,
                     size_t len)
{
    MDB_val k = {strlen(key), (void *)key}, v = {len, (void *)val};
    MDB_txn *txn;
    int rc;

    if ((unsigned)tb >= IDX_NTABLES)
        return -EINVAL;
    for (;;) {
        rc = mdb_txn_begin(ix->env, NULL, 0, &txn);
        if (rc)
            return lerr(rc);
        rc = val ? mdb_put(txn, ix->dbi[tb], &k, &v, 0) : mdb_del(txn, ix->dbi[tb], &k, NULL);
        if (!val && rc == MDB_NOTFOUND)
            rc = 0;
        if (rc)
            mdb_txn_abort(txn);
        else
            rc = mdb_txn_commit(txn);
        if (rc != MDB_MAP_FULL)
            return lerr(rc);
        if ((rc = grow(ix)) != 0)
            return lerr(rc);
    }
}

int idx_put(struct idx *ix, enum idx_table tb, const char *key, const char *val, size_t len)
{
    return write_one(ix, tb, key, val ? val : "", val ? len : 0);
}

int idx_del(struct idx *ix, enum idx_table tb, const char *key)
{
    return write_one(ix, tb, key, NULL, 0);
}

size_t idx_map_size(const struct idx *ix)
{
    return ix->map;
}

unsigned idx_migrated(const struct idx *ix)
{
    return ix->migrated;
}

int idx_foreach(struct idx *ix, enum idx_table tb,
                int (*cb)(void *ud, const char *key, size_t klen, const char *val, size_t vlen),
                void *ud)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc;

    if ((unsigned)tb >= IDX_NTABLES)
        return -EINVAL;
    rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return lerr(rc);
    rc = mdb_cursor_open(txn, ix->dbi[tb], &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return lerr(rc);
    }
    while ((rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) == 0) {
        rc = cb(ud, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
        if (rc)
            break;
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return rc == MDB_NOTFOUND ? 0 : lerr(rc);
}

int idx_sync(struct idx *ix)
{
    return lerr(mdb_env_sync(ix->env, 1));
}
