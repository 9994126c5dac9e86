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

bool cred_pair_named(const char *p, size_t n, const char *name)
{
    size_t nl = strlen(name);

    return n >= nl && memcmp(p, name, nl) == 0 && (n == nl || p[nl] == '=');
}
