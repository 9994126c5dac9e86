/* util_b64.c - base64 in its standard and URL-safe spellings (util.h). */
#include "util.h"

#include <errno.h>

static const char *const alphabet[] = {
    [UTIL_B64_STD] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    [UTIL_B64_URL] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
};

static bool padded(enum util_b64 v)
{
    return v == UTIL_B64_STD;
}

size_t util_b64_len(enum util_b64 v, size_t n)
{
    if (padded(v))
        return (n + 2) / 3 * 4;
    return n / 3 * 4 + (n % 3 ? n % 3 + 1 : 0);
}

size_t util_b64_encode(enum util_b64 v, const unsigned char *in, size_t n, char *out)
{
    const char *a = alphabet[v];
    size_t i = 0, o = 0;

    for (; i + 3 <= n; i += 3) {
        uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = a[x >> 18];
        out[o++] = a[(x >> 12) & 63];
        out[o++] = a[(x >> 6) & 63];
        out[o++] = a[x & 63];
    }
    if (n - i == 1) {
        uint32_t x = (uint32_t)in[i] << 16;
        out[o++] = a[x >> 18];
        out[o++] = a[(x >> 12) & 63];
        if (padded(v)) {
            out[o++] = '=';
            out[o++] = '=';
        }
    } else if (n - i == 2) {
        uint32_t x = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
        out[o++] = a[x >> 18];
        out[o++] = a[(x >> 12) & 63];
        out[o++] = a[(x >> 6) & 63];
        if (padded(v))
            out[o++] = '=';
    }
    return o;
}

static int val(enum util_b64 v, char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == alphabet[v][62])
        return 62;
    if (c == alphabet[v][63])
        return 63;
    return -1;
}

long util_b64_decode(enum util_b64 v, const char *in, size_t n, unsigned char *out, size_t cap)
{
    size_t o = 0, data = n;
    uint32_t acc = 0;
    unsigned bits = 0;

    if (padded(v)) {
        /* Whole quads; '=' only as the last one or two characters. */
        if (n % 4)
            return -1;
        if (n && in[n - 1] == '=')
            data--;
        if (n && in[n - 2] == '=')
            data--;
    } else if (n % 4 == 1) {
        return -1;
    }
    if (data / 4 * 3 + (data % 4 ? data % 4 - 1 : 0) > cap)
        return -1;
    for (size_t i = 0; i < data; i++) {
        int x = val(v, in[i]);
        if (x < 0)
            return -1;
        acc = acc << 6 | (uint32_t)x;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    /* Leftover bits must be zero in the URL form, or two strings would decode to
     * the same token. */
    if (acc && !padded(v))
        return -1;
    return (long)o;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int util_hex_decode(const char *in, size_t len, unsigned char *out, size_t n)
{
    if (len != 2 * n)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        int hi = hexval(in[2 * i]), lo = hexval(in[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}
