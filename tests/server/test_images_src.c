/*
 * test_images_src.c - the image source's index parser against hostile indexes (long
 * lines, bad hex, huge sizes, duplicate names), the source spec, and a fill from a
 * directory: missing files installed with their holes, a corrupt or short blob never
 * installed, a present file of other content never replaced, publishing twice the same.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "images_src.h"

int failures;

#define H1 "1111111111111111111111111111111111111111111111111111111111111111"
#define H2 "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

static int parse(const char *s, size_t *n)
{
    struct imgsrc_entry v[4];
    char err[256];
    int r = imgsrc_index_parse(s, strlen(s), 1000, v, 4, n, err, sizeof(err));

    if (r)
        CHECK(err[0] != '\0');
    return r;
}

static void test_parse(void)
{
    struct imgsrc_entry v[4];
    char err[256], big[4096], out[1024];
    size_t n = 9;

    CHECK(parse("warren-images 1\n", &n) == 0 && n == 0);
    CHECK(parse("warren-images 1\n" H1 " 10 a.ext4\n" H2 " 0 vmlinux\n", &n) == 0 && n == 2);
    CHECK(imgsrc_index_parse("warren-images 1\n" H1 " 10 a.ext4\n", 16 + 64 + 11, 1000, v, 4, &n,
                             err, sizeof(err)) == 0 &&
          n == 1 && v[0].size == 10 && !strcmp(v[0].name, "a.ext4") && !strcmp(v[0].sha, H1));
    /* The format's own output parses back to the same. */
    CHECK(imgsrc_index_format(v, 1, out, sizeof(out)) == 16 + 64 + 11);
    CHECK(imgsrc_index_format(v, 1, out, 20) == 0);

    CHECK(parse("", &n) == -EINVAL);
    CHECK(parse("warren-images 2\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 10 a\n" H1 " 10 a\n", &n) == -EINVAL); /* twice */
    CHECK(parse("warren-images 1\n" H1 " 10 b\n" H1 " 10 a\n", &n) == -EINVAL); /* order */
    CHECK(parse("warren-images 1\n" H1 " 10 a", &n) == -EINVAL);                /* no \n */
    CHECK(parse("warren-images 1\n\n", &n) == -EINVAL);                         /* empty */
    CHECK(parse("warren-images 1\n"
                "111111111111111111111111111111111111111111111111111111111111111G 1 a\n",
                &n) == -EINVAL); /* bad hex */
    CHECK(parse("warren-images 1\n"
                "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA 1 a\n",
                &n) == -EINVAL);                                     /* upper case */
    CHECK(parse("warren-images 1\n11111 1 a\n", &n) == -EINVAL);     /* short hex */
    CHECK(parse("warren-images 1\n" H1 " 1001 a\n", &n) == -EINVAL); /* over max */
    CHECK(parse("warren-images 1\n" H1 " 99999999999999999999999 a\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 18446744073709551616 a\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 010 a\n", &n) == -EINVAL); /* leading zero */
    CHECK(parse("warren-images 1\n" H1 " -1 a\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 "  1 a\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 1 ../etc/passwd\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 1 .hidden\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 1 a b\n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 1 \n", &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 1 a\r\n", &n) == -EINVAL);
    {
        const char nul[] = "warren-images 1\n" H1 " 1 a\0b\n";
        CHECK(imgsrc_index_parse(nul, sizeof(nul) - 1, 1000, v, 4, &n, err, sizeof(err)) ==
              -EINVAL);
    }
    /* A line far over the bound, and more files than room. */
    snprintf(big, sizeof(big), "warren-images 1\n" H1 " 1 ");
    memset(big + strlen(big), 'x', 3000);
    big[16 + 67 + 3000] = '\n';
    big[16 + 67 + 3001] = '\0';
    CHECK(parse(big, &n) == -EINVAL);
    CHECK(parse("warren-images 1\n" H1 " 1 a\n" H1 " 1 b\n" H1 " 1 c\n" H1 " 1 d\n" H1 " 1 e\n",
                &n) == -EINVAL);
}

static void test_where(void)
{
    struct imgsrc_where w;
    char err[256];

    CHECK(imgsrc_where_parse("/srv/images", &w, err, sizeof(err)) == 0 && !w.http &&
          !strcmp(w.path, "/srv/images"));
    CHECK(imgsrc_where_parse("http://127.0.0.1:8000/a/b/", &w, err, sizeof(err)) == 0 && w.http &&
          !strcmp(w.host, "127.0.0.1") && !strcmp(w.port, "8000") && !strcmp(w.path, "/a/b"));
    CHECK(imgsrc_where_parse("http://images.example", &w, err, sizeof(err)) == 0 &&
          !strcmp(w.port, "80") && !strcmp(w.path, ""));
    CHECK(imgsrc_where_parse("relative", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("https://x/", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("http://u@x/", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("http://x:0/", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("http://x:99999/", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("http://x/a?b", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("http://x/a b", &w, err, sizeof(err)) == -EINVAL);
    CHECK(imgsrc_where_parse("", &w, err, sizeof(err)) == -EINVAL);
}

static void put(const char *path, const char *data, size_t n, off_t hole)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    CHECK(fd >= 0);
    CHECK(write(fd, data, n) == (ssize_t)n);
    if (hole)
        CHECK(ftruncate(fd, (off_t)n + hole) == 0);
    close(fd);
}

static size_t slurp(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY);
    ssize_t k = fd >= 0 ? read(fd, buf, cap) : -1;

    if (fd >= 0)
        close(fd);
    return k < 0 ? 0 : (size_t)k;
}

static const struct imgsrc_file *file_of(const struct imgsrc_report *r, const char *name)
{
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->files[i].e.name, name))
            return &r->files[i];
    return NULL;
}

static void test_fill(void)
{
    char root[] = "/tmp/warren-imgsrc-XXXXXX", imgs[128], pub[128], dst[128], p[512], buf[512];
    char idx1[8192], idx2[8192], hex[IMGSRC_HEX_LEN + 1];
    struct imgsrc_report *r = calloc(1, sizeof(*r));
    struct imgsrc_hcache *hc = imgsrc_hcache_new();
    struct imgsrc_opts o = {.max_bytes = 1 << 30, .timeout_s = 5};
    const struct imgsrc_file *f;
    unsigned nfiles;
    bool changed;
    char err[256];
    struct stat st;
    uint64_t size;
    size_t l1, l2;

    CHECK(r && hc && mkdtemp(root));
    snprintf(imgs, sizeof(imgs), "%s/images", root);
    snprintf(pub, sizeof(pub), "%s/pub", root);
    snprintf(dst, sizeof(dst), "%s/dst", root);
    CHECK(mkdir(imgs, 0755) == 0 && mkdir(dst, 0755) == 0);
    snprintf(p, sizeof(p), "%s/vmlinux", imgs);
    put(p, "kernel", 6, 0);
    snprintf(p, sizeof(p), "%s/a.ext4", imgs);
    put(p, "disk-a", 6, 1 << 20); /* a hole of 1 MiB, kept */
    snprintf(p, sizeof(p), "%s/b.ext4", imgs);
    put(p, "disk-b", 6, 0);
    snprintf(p, sizeof(p), "%s/.hidden", imgs);
    put(p, "x", 1, 0);

    /* Published twice: the same index, untouched the second time. */
    CHECK(imgsrc_publish(imgs, pub, &nfiles, &changed, err, sizeof(err)) == 0 && changed &&
          nfiles == 3);
    snprintf(p, sizeof(p), "%s/index", pub);
    l1 = slurp(p, idx1, sizeof(idx1));
    CHECK(stat(p, &st) == 0);
    {
        struct stat st2;
        CHECK(imgsrc_publish(imgs, pub, &nfiles, &changed, err, sizeof(err)) == 0 && !changed);
        l2 = slurp(p, idx2, sizeof(idx2));
        CHECK(l1 == l2 && l1 > 0 && memcmp(idx1, idx2, l1) == 0);
        CHECK(stat(p, &st2) == 0 && st2.st_ino == st.st_ino);
    }
    CHECK(strstr(idx1, " 1048582 a.ext4\n") && strstr(idx1, " 6 vmlinux\n") &&
          !strstr(idx1, "hidden"));

    /* A fill of an empty directory: every file, with its content and hash. */
    CHECK(imgsrc_where_parse(pub, &o.where, err, sizeof(err)) == 0);
    o.image_dir = dst;
    imgsrc_fill(&o, hc, r);
    CHECK(r->indexed && r->n == 3 && r->installed == 3);
    for (size_t i = 0; i < r->n; i++)
        CHECK(r->files[i].state == IMGSRC_OK);
    snprintf(p, sizeof(p), "%s/a.ext4", dst);
    CHECK(stat(p, &st) == 0 && st.st_size == 6 + (1 << 20) && (st.st_mode & 0777) == 0644);
    CHECK(st.st_blocks * 512 < (1 << 20)); /* the hole stayed a hole */
    CHECK(imgsrc_hash(hc, dst, "a.ext4", hex, &size) == 0 && strstr(idx1, hex));

    /* Again: nothing to do. */
    imgsrc_fill(&o, hc, r);
    CHECK(r->indexed && r->installed == 0);

    /* A corrupt blob (same size, other bytes) and a short one: never installed. */
    snprintf(p, sizeof(p), "%s/b.ext4", dst);
    CHECK(unlink(p) == 0);
    CHECK((f = file_of(r, "b.ext4")) != NULL);
    snprintf(p, sizeof(p), "%s/blobs/sha256-%s", pub, f->e.sha);
    put(p, "disk-X", 6, 0);
    snprintf(buf, sizeof(buf), "%s/vmlinux", dst);
    CHECK(unlink(buf) == 0);
    CHECK((f = file_of(r, "vmlinux")) != NULL);
    snprintf(p, sizeof(p), "%s/blobs/sha256-%s", pub, f->e.sha);
    put(p, "kern", 4, 0);
    imgsrc_fill(&o, hc, r);
    CHECK(r->indexed && r->installed == 0);
    CHECK((f = file_of(r, "b.ext4")) && f->state == IMGSRC_MISSING && strstr(f->why, "sha256"));
    CHECK((f = file_of(r, "vmlinux")) && f->state == IMGSRC_MISSING && strstr(f->why, "bytes"));
    snprintf(p, sizeof(p), "%s/b.ext4", dst);
    CHECK(stat(p, &st) != 0 && errno == ENOENT);
    {
        /* No temporary file is left behind. */
        char cmd[600];
        snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A %s | grep -v '^a.ext4$')\"", dst);
        CHECK(system(cmd) == 0);
    }
    /* A blob longer than the index says is cut off, not installed. */
    snprintf(p, sizeof(p), "%s/blobs/sha256-%s", pub, f->e.sha);
    put(p, "kernel-and-more", 15, 0);
    imgsrc_fill(&o, hc, r);
    CHECK((f = file_of(r, "vmlinux")) && f->state == IMGSRC_MISSING);

    /* A refused blob is not fetched again while it is unchanged (retry_s not passed). Here
     * it is repaired in place behind the fill's back (same inode, size and mtime): still
     * not fetched, so still missing; once retry_s has passed (0 here), it is installed. */
    o.retry_s = 3600;
    CHECK((f = file_of(r, "b.ext4")) != NULL);
    snprintf(p, sizeof(p), "%s/blobs/sha256-%s", pub, f->e.sha);
    imgsrc_fill(&o, hc, r); /* refused, and remembered */
    CHECK((f = file_of(r, "b.ext4")) && f->state == IMGSRC_MISSING);
    {
        struct stat bst;
        struct timespec ts[2];
        int fd;
        CHECK(stat(p, &bst) == 0);
        ts[0] = bst.st_atim;
        ts[1] = bst.st_mtim;
        CHECK((fd = open(p, O_WRONLY)) >= 0);
        CHECK(write(fd, "disk-b", 6) == 6);
        close(fd);
        CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
    }
    imgsrc_fill(&o, hc, r);
    CHECK((f = file_of(r, "b.ext4")) && f->state == IMGSRC_MISSING && r->installed == 0);
    o.retry_s = 0;
    imgsrc_fill(&o, hc, r);
    CHECK((f = file_of(r, "b.ext4")) && f->state == IMGSRC_OK && r->installed == 1);

    /* A file present with other content is reported and never replaced. */
    snprintf(p, sizeof(p), "%s/vmlinux", dst);
    put(p, "other!", 6, 0);
    imgsrc_fill(&o, hc, r);
    CHECK((f = file_of(r, "vmlinux")) && f->state == IMGSRC_DIFFERS);
    CHECK(slurp(p, buf, sizeof(buf)) == 6 && memcmp(buf, "other!", 6) == 0);

    /* A hostile index: read, refused, nothing installed. */
    snprintf(p, sizeof(p), "%s/index", pub);
    put(p, "warren-images 1\n" H1 " 5 ../../x\n", 16 + 64 + 12, 0);
    imgsrc_fill(&o, hc, r);
    CHECK(!r->indexed && strstr(r->error, "name"));
    /* An index larger than any valid one is not read. */
    {
        char *huge = malloc(IMGSRC_INDEX_MAX + 10);
        CHECK(huge != NULL);
        memset(huge, 'a', IMGSRC_INDEX_MAX + 10);
        put(p, huge, IMGSRC_INDEX_MAX + 10, 0);
        free(huge);
        imgsrc_fill(&o, hc, r);
        CHECK(!r->indexed && r->error[0]);
    }
    /* No source at all. */
    snprintf(o.where.path, sizeof(o.where.path), "%s/nowhere", root);
    imgsrc_fill(&o, hc, r);
    CHECK(!r->indexed && r->error[0]);

    snprintf(p, sizeof(p), "rm -rf %s", root);
    CHECK(system(p) == 0);
    imgsrc_hcache_free(hc);
    free(r);
}

int main(void)
{
    test_parse();
    test_where();
    test_fill();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    return failures != 0;
}
