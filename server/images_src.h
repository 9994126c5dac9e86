/*
 * images_src.h - guest images named by content, filled from a shared source.
 *
 * A source is a directory or an http:// URL holding one index and the files it
 * lists as content-addressed blobs:
 *
 *   SOURCE/index                    "warren-images 1\n", then one line per file,
 *                                   "<sha256 hex> <size> <name>\n", names ascending
 *   SOURCE/blobs/sha256-<hex>       the file whose SHA-256 is <hex>
 *
 * `warrend --publish-images DIR` writes image_dir there (imgsrc_publish). A host with
 * `image_source` set reads the index at start and every interval, on a thread of its
 * own, and installs each listed file its image_dir lacks: fetched into a temporary file
 * beside it, its size and SHA-256 checked against the index, then linked in under its
 * name (never over a file already there). Integrity comes from the index's hashes: the
 * index itself must come from a place the operator trusts. A file present with other
 * content is never replaced (sandboxes, pools and snapshots may stand on it): it is
 * reported, and the host counts it as not filled.
 *
 * The same thread hashes image_dir's files (once each: cached by device, inode, size and
 * mtime) so that GET /v1/templates can name each template by content. Without a source
 * it hashes only when asked (images_src_want_hashes).
 */
#ifndef WARREN_IMAGES_SRC_H
#define WARREN_IMAGES_SRC_H

#include <ev.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define IMGSRC_NAME_MAX     64  /* a file's name: [A-Za-z0-9._-], not starting with '.' */
#define IMGSRC_FILES_MAX    64  /* files in an index, and files of image_dir hashed */
#define IMGSRC_HEX_LEN      64  /* a SHA-256 in lowercase hex */
#define IMGSRC_LINE_MAX     160 /* an index line, its newline included */
#define IMGSRC_INDEX_MAX    (16 + IMGSRC_FILES_MAX * IMGSRC_LINE_MAX)
#define IMGSRC_INDEX_HEADER "warren-images 1\n"

struct imgsrc_entry {
    char name[IMGSRC_NAME_MAX + 1];
    char sha[IMGSRC_HEX_LEN + 1];
    uint64_t size;
};

bool imgsrc_name_ok(const char *name);

/* Parse an index of len bytes (not NUL-terminated) into v[0..cap): every line checked
 * (header, 64 lowercase hex digits, a size from 0 to max_size without leading zeros, a
 * name imgsrc_name_ok, names strictly ascending so none twice, a final newline, at most
 * cap lines). 0 and *n, or -EINVAL with the first fault in err. */
int imgsrc_index_parse(const char *buf, size_t len, uint64_t max_size, struct imgsrc_entry *v,
                       size_t cap, size_t *n, char *err, size_t errcap);
/* The index of v[0..n) (sorted by name by the caller) into buf; its length, or 0 when it
 * does not fit. */
size_t imgsrc_index_format(const struct imgsrc_entry *v, size_t n, char *buf, size_t cap);

/* SHA-256 of the files of a directory, each hashed once while its device, inode, size
 * and mtime stay the same. Used by one thread at a time. */
struct imgsrc_hcache;
struct imgsrc_hcache *imgsrc_hcache_new(void);
void imgsrc_hcache_free(struct imgsrc_hcache *c);
/* dir/name's hash and size: 0, or -errno (-ENOENT: no such file; -EINVAL: not a regular
 * file). */
int imgsrc_hash(struct imgsrc_hcache *c, const char *dir, const char *name,
                char hex[IMGSRC_HEX_LEN + 1], uint64_t *size);

/* Publish every regular file of image_dir named imgsrc_name_ok into out_dir (created if
 * needed): missing blobs copied (holes kept), then the index, replaced atomically and
 * only when it differs. 0 and *changed, or -errno with err. */
int imgsrc_publish(const char *image_dir, const char *out_dir, unsigned *nfiles, bool *changed,
                   char *err, size_t errcap);

/* Where a source is. */
struct imgsrc_where {
    bool http;
    char path[4096]; /* a directory, or the URL's path without its trailing '/' */
    char host[256];
    char port[6];
};
/* "/dir" or "http://host[:port][/path]" (no user, query or fragment). 0, or -EINVAL. */
int imgsrc_where_parse(const char *spec, struct imgsrc_where *w, char *err, size_t errcap);

/* A fill's bounds. */
struct imgsrc_opts {
    struct imgsrc_where where;
    const char *image_dir;
    uint64_t max_bytes; /* a listed file's largest size */
    unsigned timeout_s; /* an HTTP connect, or read, waits no longer */
    unsigned retry_s;   /* a blob that failed its check is fetched again after this long,
                           or once it changed (a directory source) */
};

enum imgsrc_state { IMGSRC_OK, IMGSRC_MISSING, IMGSRC_DIFFERS };

/* One pass's outcome. */
struct imgsrc_report {
    bool indexed;       /* the index was read and parsed */
    char error[256];    /* when not: why */
    unsigned installed; /* files installed by this pass */
    size_t n;           /* files listed */
    struct imgsrc_file {
        struct imgsrc_entry e;
        enum imgsrc_state state;
        char why[192]; /* a missing file's last failure, else "" */
    } files[IMGSRC_FILES_MAX];
};

/* One pass: read the index, install what is missing (checked), and say what is still
 * missing or differs. Blocking: never on the event loop. */
void imgsrc_fill(const struct imgsrc_opts *o, struct imgsrc_hcache *c, struct imgsrc_report *r);

/* ---- warrend's side: the thread and what the loop reads of it ---- */

struct srv_config;
struct images_src;

/* Start: with cfg->image_source set, a pass now and every interval; without, hashes only
 * when wanted. 0 and *out, or -errno with err (a bad image_source). */
int images_src_start(struct ev_loop *loop, const struct srv_config *cfg, struct images_src **out,
                     char *err, size_t errcap);
/* Waits for a pass in flight. NULL is fine. */
void images_src_stop(struct images_src *s);

/* Is a source configured and not yet filled: no index read yet, or a listed file missing
 * or different? false without a source (and for NULL). */
bool images_src_lacking(const struct images_src *s);
/* Hash the image directory's files soon (GET /v1/templates asks). */
void images_src_want_hashes(struct images_src *s);
/* image_dir/name's SHA-256 as last hashed, if the file is still that one: true and hex.
 * false: not hashed yet (or changed since). */
bool images_src_sha(const struct images_src *s, const char *name, char hex[IMGSRC_HEX_LEN + 1]);

/* For GET /v1/health: the source, whether it was read, and the files not filled, as
 * JSON (a jansson json_t *, NULL without a source). */
void *images_src_json(const struct images_src *s);

#endif
