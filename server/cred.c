/*
 * cred.c - credential spellings (cred.h). Pure.
 */
#include "cred.h"

#include <string.h>
#include <strings.h>

/* Every byte of the key is compared whatever matched before; only the lengths
 * decide the branches. */
static bool same_key(const char *t, size_t tlen, const char *key, size_t klen)
{
    unsigned char diff = tlen != klen;

    for (size_t i = 0; i < klen; i++)
        diff |= (unsigned char)((i < tlen ? (unsigned char)t[i] : 0) ^ (unsigned char)key[i]);
    return diff == 0;
}

bool cred_is_key(const char *v, size_t n, const char *key)
{
    size_t klen = key ? strlen(key) : 0, b = 0, e = n;

    if (!v || !klen)
        return false;
    while (b < e && (v[b] == ' ' || v[b] == '\t'))
        b++;
    while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t'))
        e--;
    if (e - b >= 7 && strncasecmp(v + b, "Bearer ", 7) == 0)
        b += 7;
    else if (e - b >= 6 && strncasecmp(v + b, "token ", 6) == 0)
        b += 6;
    else
        return false;
    while (b < e && v[b] == ' ')
        b++;
    return same_key(v + b, e - b, key, klen);
}

bool cred_query_key(const char *p, size_t n, const char *key)
{
    size_t klen = key ? strlen(key) : 0;

    if (!p || !klen || !cred_pair_named(p, n, CRED_KEY_PARAM) || n == sizeof(CRED_KEY_PARAM) - 1)
        return false;
    return same_key(p + sizeof(CRED_KEY_PARAM), n - sizeof(CRED_KEY_PARAM), key, klen);
}

bool cred_pair_named(const char *p, size_t n, const char *name)
{
    size_t nl = strlen(name);

    return n >= nl && memcmp(p, name, nl) == 0 && (n == nl || p[nl] == '=');
}
