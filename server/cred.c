/*
 * cred.c - credential spellings (cred.h). Pure.
 */
#include "cred.h"

#include <string.h>
#include <strings.h>

bool cred_is_key(const char *v, size_t n, const char *key)
{
    size_t klen = key ? strlen(key) : 0, b = 0, e = n, tlen;
    unsigned char diff;

    if (!v || !klen)
        return false;
    while (b < e && (v[b] == ' ' || v[b] == '\t'))
        b++;
    while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'))
        e--;
    if (e - b < 7 || strncasecmp(v + b, "Bearer ", 7) != 0)
        return false;
    b += 7;
    while (b < e && v[b] == ' ')
        b++;
    tlen = e - b;
    /* Every byte of the key is compared whatever matched before; only the
     * lengths decide the branches. */
    diff = tlen != klen;
    for (size_t i = 0; i < klen; i++)
        diff |= (unsigned char)((i < tlen ? (unsigned char)v[b + i] : 0) ^ (unsigned char)key[i]);
    return diff == 0;
}

/* Does t[0..tlen) equal want[0..wlen)? Every byte of want is looked at whatever
 * matched before; only the lengths decide the branches. */
static bool same(const char *t, size_t tlen, const char *want, size_t wlen)
{
    unsigned char diff = tlen != wlen;

    for (size_t i = 0; i < wlen; i++)
        diff |= (unsigned char)((i < tlen ? (unsigned char)t[i] : 0) ^ (unsigned char)want[i]);
    return diff == 0;
}

bool cred_is_e2b_key(const char *v, size_t n, const char *key)
{
    static const char hex[] = "0123456789abcdef";
    size_t klen = key ? strlen(key) : 0, b = 0, e = n, tlen;
    unsigned char diff;

    if (!v || !klen)
        return false;
    while (b < e && (v[b] == ' ' || v[b] == '\t'))
        b++;
    while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'))
        e--;
    tlen = e - b;
    if (tlen != 4 + 2 * klen || memcmp(v + b, "e2b_", 4) != 0)
        return same(v + b, tlen, key, klen);
    diff = 0;
    for (size_t i = 0; i < klen; i++) {
        unsigned char c = (unsigned char)key[i];
        diff |= (unsigned char)(v[b + 4 + 2 * i] ^ hex[c >> 4]);
        diff |= (unsigned char)(v[b + 5 + 2 * i] ^ hex[c & 15]);
    }
    return diff == 0;
}

int cred_e2b_key(const char *key, char *out, size_t cap)
{
    static const char hex[] = "0123456789abcdef";
    size_t klen = key ? strlen(key) : 0;

    if (!klen || cap < 4 + 2 * klen + 1)
        return -1;
    memcpy(out, "e2b_", 4);
    for (size_t i = 0; i < klen; i++) {
        out[4 + 2 * i] = hex[(unsigned char)key[i] >> 4];
        out[5 + 2 * i] = hex[(unsigned char)key[i] & 15];
    }
    out[4 + 2 * klen] = '\0';
    return (int)(4 + 2 * klen);
}

bool cred_pair_named(const char *p, size_t n, const char *name)
{
    size_t nl = strlen(name);

    return n >= nl && memcmp(p, name, nl) == 0 && (n == nl || p[nl] == '=');
}
