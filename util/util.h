/*
 * util.h - small helpers the sandbox table (warren_core) and the HTTP layer
 * (warren_http) both need, so each has one home: ISO-8601 times, base64 in
 * its two spellings, DRBG seeding, and emptying a run directory.
 *
 * Pure functions over caller-owned buffers, except util_drbg_seed (which
 * fills caller-owned mbedTLS contexts, freed with util_drbg_free) and
 * util_rm_dir (which touches the file system). Nothing here allocates.
 */
#ifndef WARREN_UTIL_H
#define WARREN_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <mbedtls/ctr_drbg.h>
#include <mbedtls/entropy.h>

/* ---- ISO-8601 UTC times ---- */

/* Enough for "YYYY-MM-DDTHH:MM:SS.mmmZ" and its NUL. */
#define UTIL_ISO_MAX 25
/* 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z: inside them every year has four
 * digits and gmtime_r cannot fail (its year is an int). */
#define UTIL_ISO_MIN_S (-62167219200LL)
#define UTIL_ISO_MAX_S (253402300799LL)

/* Seconds since the epoch as "YYYY-MM-DDTHH:MM:SSZ" (ms < 0) or
 * "YYYY-MM-DDTHH:MM:SS.mmmZ" (ms 0..999; larger is taken as 999). s is clamped to
 * UTIL_ISO_MIN_S..UTIL_ISO_MAX_S, and the fraction with it (.000 at the low end,
 * .999 at the high end), so a guest's INT64_MAX still prints a valid time.
 * Always NUL-terminated when cap > 0. Returns the length, or 0 with buf "" when
 * cap is too small or gmtime_r fails. */
size_t util_iso_time(int64_t s, int ms, char *buf, size_t cap);

/* Milliseconds since the epoch as "YYYY-MM-DDTHH:MM:SS.mmmZ" (floored, so -1 ms is
 * 1969-12-31T23:59:59.999Z). Same clamping and returns as util_iso_time. */
size_t util_iso_time_ms(int64_t ms, char *buf, size_t cap);

/* ---- base64 (RFC 4648) ---- */

enum util_b64 {
    /* §4: "+/", '='-padded. Decoding accepts non-zero trailing bits, as the API's
     * data_b64 always has. */
    UTIL_B64_STD,
    /* §5: "-_", no padding. Decoding is canonical: stray trailing bits are refused,
     * so one byte string has exactly one spelling (access tokens rely on it). */
    UTIL_B64_URL,
};

/* The encoded length of n bytes, without a NUL. */
size_t util_b64_len(enum util_b64 v, size_t n);
/* Writes util_b64_len(v, n) characters to out, no NUL. Returns that length. */
size_t util_b64_encode(enum util_b64 v, const unsigned char *in, size_t n, char *out);
/* Hex digits (either case) to bytes: in holds exactly 2 * n of them. 0, or -EINVAL for a
 * character that is not a hex digit (out is then undefined). */
int util_hex_decode(const char *in, size_t len, unsigned char *out, size_t n);
/* Decodes n characters into out (cap bytes). Returns the decoded length, or -1 for
 * bad input: a character outside the alphabet, an impossible length, misplaced or
 * missing padding (STD), a padding character (URL), stray trailing bits (URL), or a
 * result longer than cap. */
long util_b64_decode(enum util_b64 v, const char *in, size_t n, unsigned char *out, size_t cap);

/* ---- random bytes ---- */

/* Initialise ent and drbg and seed drbg from the system's entropy with the
 * personalisation string pers. 0, or -EIO (both contexts then still need
 * util_drbg_free). */
int util_drbg_seed(mbedtls_entropy_context *ent, mbedtls_ctr_drbg_context *drbg, const char *pers);
void util_drbg_free(mbedtls_entropy_context *ent, mbedtls_ctr_drbg_context *drbg);
/* n bytes from a DRBG seeded for this call only (rare secrets: keys at start-up).
 * 0 or -EIO. */
int util_random_bytes(const char *pers, unsigned char *out, size_t n);

/* ---- run directories ---- */

/* Unlink every entry of dir except those keep() accepts; with keep NULL, unlink
 * them all and then rmdir dir. One level only: the directories this
 * serves (a sandbox's run dir, a snapshot's or template's dir) hold only files,
 * and a subdirectory is left (so the final rmdir fails and dir stays). What cannot
 * be removed stays, silently: the next start's sweep retries. */
void util_rm_dir(const char *dir, bool (*keep)(const char *name));

#endif
