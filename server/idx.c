/* idx.c - LMDB-backed sandbox index (see idx.h). */
#include "idx.h"

#include <errno.h>
#include <lmdb.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct idx {
    MDB_env *env;
    MDB_dbi dbi;
};

static int lerr(int rc)
{
    return rc > 0 ? -rc : rc; /* errno values and MDB_* codes (negative) both become < 0 */
}

const char *idx_strerror(int err)
{
    return mdb_strerror(err < 0 && err > -4096 ? -err : err);
}

int idx_open(const char *dir, struct idx **out)
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
    mdb_env_set_mapsize(ix->env, 256ull << 20);
    rc = mdb_env_open(ix->env, dir, MDB_NOSYNC | MDB_NOTLS, 0600);
    if (rc)
        goto fail;
    rc = mdb_txn_begin(ix->env, NULL, 0, &txn);
    if (rc)
        goto fail;
    rc = mdb_dbi_open(txn, NULL, 0, &ix->dbi);
    if (rc)
        goto fail;
    rc = mdb_txn_commit(txn);
    txn = NULL;
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

int idx_put(struct idx *ix, const char *key, const char *val, size_t len)
{
    MDB_txn *txn;
    MDB_val k = {strlen(key), (void *)key}, v = {len, (void *)val};
    int rc = mdb_txn_begin(ix->env, NULL, 0, &txn);

    if (rc)
        return lerr(rc);
    rc = mdb_put(txn, ix->dbi, &k, &v, 0);
    if (rc) {
        mdb_txn_abort(txn);
        return lerr(rc);
    }
    return lerr(mdb_txn_commit(txn));
}

int idx_del(struct idx *ix, const char *key)
{
    MDB_txn *txn;
    MDB_val k = {strlen(key), (void *)key};
    int rc = mdb_txn_begin(ix->env, NULL, 0, &txn);

    if (rc)
        return lerr(rc);
    rc = mdb_del(txn, ix->dbi, &k, NULL);
    if (rc && rc != MDB_NOTFOUND) {
        mdb_txn_abort(txn);
        return lerr(rc);
    }
    return lerr(mdb_txn_commit(txn));
}

int idx_foreach(struct idx *ix,
                int (*cb)(void *ud, const char *key, size_t klen, const char *val, size_t vlen),
                void *ud)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);

    if (rc)
        return lerr(rc);
    rc = mdb_cursor_open(txn, ix->dbi, &cur);
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
