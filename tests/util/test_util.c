/*
 * test_util.c - unit tests of util/: ISO times (the formats each caller shows,
 * negative and huge times, the inputs gmtime_r fails on, short buffers),
 * base64 in both forms (0..3 bytes and more, every kind of bad input, the
 * canonical-bits rule of the URL form), DRBG seeding and run-dir removal.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "check.h"

int failures;

static int iso_is(int64_t s, int ms, const char *want)
{
    char buf[UTIL_ISO_MAX];
    size_t n = util_iso_time(s, ms, buf, sizeof(buf));

    if (n != strlen(want) || strcmp(buf, want)) {
        fprintf(stderr, "iso(%lld, %d): \"%s\", want \"%s\"\n", (long long)s, ms, buf, want);
        return 0;
    }
    return 1;
}

static int iso_ms_is(int64_t ms, const char *want)
{
    char buf[UTIL_ISO_MAX];
    size_t n = util_iso_time_ms(ms, buf, sizeof(buf));

    if (n != strlen(want) || strcmp(buf, want)) {
        fprintf(stderr, "iso_ms(%lld): \"%s\", want \"%s\"\n", (long long)ms, buf, want);
        return 0;
    }
    return 1;
}

static void test_iso(void)
{
    char buf[UTIL_ISO_MAX];
    time_t big = (time_t)INT64_MAX;
    struct tm tm;

    /* The three formats: no fraction (files, processes' mtime), .mmm, .000 (tokens). */
    CHECK(iso_is(0, -1, "1970-01-01T00:00:00Z"));
    CHECK(iso_is(1700000000, -1, "2023-11-14T22:13:20Z"));
    CHECK(iso_is(1700000000, 0, "2023-11-14T22:13:20.000Z"));
    CHECK(iso_is(1700000000, 7, "2023-11-14T22:13:20.007Z"));
    CHECK(iso_is(1700000000, 1000, "2023-11-14T22:13:20.999Z"));
    CHECK(iso_ms_is(1764612000123LL, "2025-12-01T18:00:00.123Z"));
    CHECK(iso_ms_is(0, "1970-01-01T00:00:00.000Z"));
    /* Negative times floor: no "-01" fraction. */
    CHECK(iso_ms_is(-1, "1969-12-31T23:59:59.999Z"));
    CHECK(iso_ms_is(-1000, "1969-12-31T23:59:59.000Z"));
    CHECK(iso_is(-1, -1, "1969-12-31T23:59:59Z"));

    /* gmtime_r fails for INT64_MAX (its year overflows an int): the clamp keeps us
     * away from it, and the output is the last valid time. */
    CHECK(gmtime_r(&big, &tm) == NULL);
    CHECK(iso_is(INT64_MAX, -1, "9999-12-31T23:59:59Z"));
    CHECK(iso_is(INT64_MIN, -1, "0000-01-01T00:00:00Z"));
    CHECK(iso_is(INT64_MAX, 5, "9999-12-31T23:59:59.999Z"));
    CHECK(iso_is(INT64_MIN, 5, "0000-01-01T00:00:00.000Z"));
    CHECK(iso_ms_is(INT64_MAX, "9999-12-31T23:59:59.999Z"));
    CHECK(iso_ms_is(INT64_MIN, "0000-01-01T00:00:00.000Z"));
    /* Just past the four-digit years, both ends. */
    CHECK(iso_is(UTIL_ISO_MAX_S + 1, -1, "9999-12-31T23:59:59Z"));
    CHECK(iso_is(UTIL_ISO_MAX_S, -1, "9999-12-31T23:59:59Z"));
    CHECK(iso_is(UTIL_ISO_MIN_S - 1, -1, "0000-01-01T00:00:00Z"));
    CHECK(iso_is(UTIL_ISO_MIN_S, -1, "0000-01-01T00:00:00Z"));

    /* Too small a buffer: an empty string, never an unterminated one. */
    memset(buf, 'x', sizeof(buf));
    CHECK(util_iso_time(0, -1, buf, 20) == 0 && buf[0] == '\0');
    CHECK(util_iso_time(0, -1, buf, 21) == 20);
    memset(buf, 'x', sizeof(buf));
    CHECK(util_iso_time(0, 0, buf, 24) == 0 && buf[0] == '\0');
    CHECK(util_iso_time(0, 0, buf, 25) == 24);
    CHECK(util_iso_time(0, -1, NULL, 0) == 0);
    buf[0] = 'x';
    CHECK(util_iso_time(0, -1, buf, 0) == 0 && buf[0] == 'x');
}

static void b64_round(enum util_b64 v, const char *raw, size_t n, const char *want)
{
    char enc[64];
    unsigned char dec[64];
    size_t l = util_b64_len(v, n);

    CHECK(l == strlen(want));
    CHECK(util_b64_encode(v, (const unsigned char *)raw, n, enc) == l);
    CHECK(!memcmp(enc, want, l));
    CHECK(util_b64_decode(v, want, l, dec, sizeof(dec)) == (long)n && !memcmp(dec, raw, n));
    /* Exactly n bytes of room is enough; one fewer is refused. */
    CHECK(util_b64_decode(v, want, l, dec, n) == (long)n);
    if (n)
        CHECK(util_b64_decode(v, want, l, dec, n - 1) == -1);
}

static void test_b64(void)
{
    unsigned char out[16], all[256];
    char enc[400];
    size_t l;

    /* RFC 4648's vectors, 0..6 bytes, both forms. */
    b64_round(UTIL_B64_STD, "", 0, "");
    b64_round(UTIL_B64_STD, "f", 1, "Zg==");
    b64_round(UTIL_B64_STD, "fo", 2, "Zm8=");
    b64_round(UTIL_B64_STD, "foo", 3, "Zm9v");
    b64_round(UTIL_B64_STD, "foob", 4, "Zm9vYg==");
    b64_round(UTIL_B64_STD, "foobar", 6, "Zm9vYmFy");
    b64_round(UTIL_B64_URL, "", 0, "");
    b64_round(UTIL_B64_URL, "f", 1, "Zg");
    b64_round(UTIL_B64_URL, "fo", 2, "Zm8");
    b64_round(UTIL_B64_URL, "foo", 3, "Zm9v");
    b64_round(UTIL_B64_URL, "foob", 4, "Zm9vYg");
    /* The two alphabets differ in 62 and 63 only. */
    b64_round(UTIL_B64_STD, "\xfb\xff", 2, "+/8=");
    b64_round(UTIL_B64_URL, "\xfb\xff", 2, "-_8");

    /* Every byte value, both forms. */
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    for (int v = UTIL_B64_STD; v <= UTIL_B64_URL; v++) {
        unsigned char back[256];
        l = util_b64_encode((enum util_b64)v, all, sizeof(all), enc);
        CHECK(l == util_b64_len((enum util_b64)v, sizeof(all)));
        CHECK(util_b64_decode((enum util_b64)v, enc, l, back, sizeof(back)) == 256 &&
              !memcmp(back, all, 256));
    }

    /* Bad standard input: length, padding in the wrong place, foreign characters. */
    CHECK(util_b64_decode(UTIL_B64_STD, "Zg", 2, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "Zg=", 3, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "Z===", 4, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "====", 4, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "Zg=a", 4, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "Zg==Zg==", 8, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "Z!==", 4, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "-_8=", 4, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_STD, "Zm9\0", 4, out, sizeof(out)) == -1);
    /* The standard form keeps accepting stray trailing bits, as data_b64 always has. */
    CHECK(util_b64_decode(UTIL_B64_STD, "Zh==", 4, out, sizeof(out)) == 1 && out[0] == 'f');

    /* Bad URL input: impossible length, padding, the other alphabet, stray bits. */
    CHECK(util_b64_decode(UTIL_B64_URL, "Z", 1, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_URL, "Zm9vY", 5, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_URL, "Zg==", 4, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_URL, "+/8", 3, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_URL, "Zh", 2, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_URL, "Zm9", 3, out, sizeof(out)) == -1);
    CHECK(util_b64_decode(UTIL_B64_URL, "Zm8", 3, out, sizeof(out)) == 2);
}

static void test_hex(void)
{
    unsigned char b[4];

    CHECK(util_hex_decode("00ff7Fa0", 8, b, 4) == 0);
    CHECK(b[0] == 0x00 && b[1] == 0xff && b[2] == 0x7f && b[3] == 0xa0);
    CHECK(util_hex_decode("00ff7Fa", 7, b, 4) == -EINVAL);  /* odd length */
    CHECK(util_hex_decode("00ff7Fa0", 8, b, 3) == -EINVAL); /* not 2 * n */
    CHECK(util_hex_decode("00fg7Fa0", 8, b, 4) == -EINVAL);
    CHECK(util_hex_decode("0 ff7Fa0", 8, b, 4) == -EINVAL);
}

static void test_drbg(void)
{
    mbedtls_entropy_context ent;
    mbedtls_ctr_drbg_context drbg;
    unsigned char a[32] = {0}, b[32] = {0}, zero[32] = {0};

    CHECK(util_drbg_seed(&ent, &drbg, "warren test") == 0);
    CHECK(mbedtls_ctr_drbg_random(&drbg, a, sizeof(a)) == 0);
    CHECK(mbedtls_ctr_drbg_random(&drbg, b, sizeof(b)) == 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0 && memcmp(a, zero, sizeof(a)) != 0);
    util_drbg_free(&ent, &drbg);
    CHECK(util_random_bytes("warren test", a, sizeof(a)) == 0);
    CHECK(util_random_bytes(NULL, b, sizeof(b)) == 0);
    CHECK(memcmp(a, b, sizeof(a)) != 0);
}

static void touch(const char *dir, const char *name)
{
    char p[512];
    int fd;

    snprintf(p, sizeof(p), "%s/%s", dir, name);
    fd = open(p, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    CHECK(fd >= 0);
    if (fd >= 0)
        close(fd);
}

static int exists(const char *dir, const char *name)
{
    char p[512];
    struct stat st;

    snprintf(p, sizeof(p), "%s%s%s", dir, name ? "/" : "", name ? name : "");
    return stat(p, &st) == 0;
}

static bool keep_log(const char *name)
{
    return strcmp(name, "console.log") == 0;
}

static void test_rm_dir(void)
{
    char dir[] = "/tmp/warren-test-util-XXXXXX";
    char sub[600];

    if (!mkdtemp(dir)) {
        CHECK(!"mkdtemp");
        return;
    }
    /* Kept files stay, and so does the directory. */
    touch(dir, "console.log");
    touch(dir, "disk.qcow2");
    touch(dir, ".hidden");
    util_rm_dir(dir, keep_log);
    CHECK(exists(dir, "console.log") && !exists(dir, "disk.qcow2") && !exists(dir, ".hidden"));
    CHECK(exists(dir, NULL));
    /* Without keep: everything, then the directory. */
    util_rm_dir(dir, NULL);
    CHECK(!exists(dir, NULL));
    /* A missing directory is no error. */
    util_rm_dir(dir, NULL);
    /* One level only: a subdirectory stays, and so does dir. */
    CHECK(mkdir(dir, 0700) == 0);
    snprintf(sub, sizeof(sub), "%s/sub", dir);
    CHECK(mkdir(sub, 0700) == 0);
    touch(dir, "f");
    util_rm_dir(dir, NULL);
    CHECK(exists(dir, NULL) && exists(dir, "sub") && !exists(dir, "f"));
    rmdir(sub);
    rmdir(dir);
}

int main(void)
{
    test_iso();
    test_b64();
    test_hex();
    test_drbg();
    test_rm_dir();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("util: all checks passed\n");
    return 0;
}
