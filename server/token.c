/*
 * token.c - mint and verify access tokens (token.h): HMAC-SHA256 over a small
 * versioned payload, URL-safe base64 without padding.
 *
 * The verifier parses strictly and in a fixed order: the encoding (alphabet,
 * length cap, canonical trailing bits), the version and the exact length the
 * id byte implies, then the MAC in constant time, and only then the fields.
 * So one token has exactly one spelling, and a forged token learns nothing
 * about which field it got wrong.
 */
#include <errno.h>
#include <string.h>
#include <strings.h>
#include <mbedtls/constant_time.h>
#include <mbedtls/md.h>

#include "token.h"
#include "util.h"

#define HDR_LEN (1 + 8 + 1 + 1) /* version, expiry, scopes, id length */

static const char *const scope_names[] = {"pty", "session", "files", "ports", "exec"};

unsigned token_scope_of(const char *name)
{
    for (unsigned i = 0; name && i < sizeof(scope_names) / sizeof(scope_names[0]); i++)
        if (strcmp(name, scope_names[i]) == 0)
            return 1u << i;
    return 0;
}

const char *token_scope_name(unsigned bit)
{
    for (unsigned i = 0; i < sizeof(scope_names) / sizeof(scope_names[0]); i++)
        if (bit == 1u << i)
            return scope_names[i];
    return NULL;
}

const char *token_why_str(enum token_why why)
{
    switch (why) {
    case TOKEN_OK:
        return "the access token is valid";
    case TOKEN_MALFORMED:
        return "the access token is malformed";
    case TOKEN_BAD_MAC:
        return "the access token was not issued by this server, or was altered";
    case TOKEN_EXPIRED:
        return "the access token has expired";
    case TOKEN_WRONG_SANDBOX:
        return "the access token is for another sandbox";
    case TOKEN_WRONG_SCOPE:
        return "the access token's scope does not cover this request";
    }
    return "the access token is refused";
}

static int mac(const unsigned char key[TOKEN_SECRET_LEN], const unsigned char *in, size_t n,
               unsigned char out[TOKEN_MAC_LEN])
{
    const mbedtls_md_info_t *md = mbedtls_md_info_from_type(MBEDTLS_MD_SHA256);

    if (!md || mbedtls_md_hmac(md, key, TOKEN_SECRET_LEN, in, n, out) != 0)
        return -EIO;
    return 0;
}

int token_mint(const unsigned char key[TOKEN_SECRET_LEN], const char *sbx, unsigned scopes,
               uint64_t expires, char out[TOKEN_STR_MAX + 1])
{
    unsigned char raw[TOKEN_RAW_MAX];
    size_t idlen = sbx ? strlen(sbx) : 0, n;

    out[0] = '\0';
    if (!key || idlen == 0 || idlen > TOKEN_SBX_MAX || !scopes || (scopes & ~TOKEN_SCOPE_ALL))
        return -EINVAL;
    raw[0] = TOKEN_VERSION;
    for (int i = 0; i < 8; i++)
        raw[1 + i] = (unsigned char)(expires >> (56 - 8 * i));
    raw[9] = (unsigned char)scopes;
    raw[10] = (unsigned char)idlen;
    memcpy(raw + HDR_LEN, sbx, idlen);
    n = HDR_LEN + idlen;
    if (mac(key, raw, n, raw + n))
        return -EIO;
    out[util_b64_encode(UTIL_B64_URL, raw, n + TOKEN_MAC_LEN, out)] = '\0';
    return 0;
}

enum token_why token_verify(const unsigned char key[TOKEN_SECRET_LEN], const char *tok, size_t len,
                            const char *sbx, unsigned need, uint64_t now,
                            struct token_claims *claims)
{
    unsigned char raw[TOKEN_RAW_MAX], want[TOKEN_MAC_LEN];
    size_t n, idlen;
    uint64_t exp = 0;
    unsigned scopes;
    long got;

    if (claims)
        memset(claims, 0, sizeof(*claims));
    if (!key || !tok || len > TOKEN_STR_MAX)
        return TOKEN_MALFORMED;
    got = util_b64_decode(UTIL_B64_URL, tok, len, raw, sizeof(raw));
    if (got < HDR_LEN + 1 + TOKEN_MAC_LEN || raw[0] != TOKEN_VERSION)
        return TOKEN_MALFORMED;
    idlen = raw[10];
    n = HDR_LEN + idlen;
    if (idlen == 0 || idlen > TOKEN_SBX_MAX || (size_t)got != n + TOKEN_MAC_LEN)
        return TOKEN_MALFORMED;
    if (mac(key, raw, n, want) || mbedtls_ct_memcmp(want, raw + n, TOKEN_MAC_LEN) != 0)
        return TOKEN_BAD_MAC;
    /* Authentic from here on: only a server bug could have minted bad fields. */
    scopes = raw[9];
    if (!scopes || (scopes & ~TOKEN_SCOPE_ALL) || memchr(raw + HDR_LEN, '\0', idlen))
        return TOKEN_MALFORMED;
    for (int i = 0; i < 8; i++)
        exp = exp << 8 | raw[1 + i];
    if (claims) {
        claims->expires = exp;
        claims->scopes = scopes;
        memcpy(claims->sbx, raw + HDR_LEN, idlen);
        claims->sbx[idlen] = '\0';
    }
    if (now >= exp)
        return TOKEN_EXPIRED;
    if (!sbx || strlen(sbx) != idlen || memcmp(sbx, raw + HDR_LEN, idlen) != 0)
        return TOKEN_WRONG_SANDBOX;
    if (!need || (need & ~scopes))
        return TOKEN_WRONG_SCOPE;
    return TOKEN_OK;
}

int token_e2b(const unsigned char key[TOKEN_SECRET_LEN], const char *purpose, const char *sbx,
              char out[TOKEN_E2B_LEN + 1])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char in[32 + 1 + TOKEN_SBX_MAX], m[TOKEN_MAC_LEN];
    size_t plen = purpose ? strlen(purpose) : 0, idlen = sbx ? strlen(sbx) : 0;

    out[0] = '\0';
    if (!key || plen == 0 || plen > 32 || idlen == 0 || idlen > TOKEN_SBX_MAX)
        return -EINVAL;
    /* The NUL between them keeps ("ab", "c") and ("a", "bc") apart. */
    memcpy(in, purpose, plen);
    in[plen] = '\0';
    memcpy(in + plen + 1, sbx, idlen);
    if (mac(key, in, plen + 1 + idlen, m))
        return -EIO;
    for (size_t i = 0; i < TOKEN_MAC_LEN; i++) {
        out[2 * i] = hex[m[i] >> 4];
        out[2 * i + 1] = hex[m[i] & 15];
    }
    out[TOKEN_E2B_LEN] = '\0';
    explicit_bzero(m, sizeof(m));
    return 0;
}

bool token_e2b_check(const unsigned char key[TOKEN_SECRET_LEN], const char *purpose,
                     const char *sbx, const char *tok, size_t len)
{
    char want[TOKEN_E2B_LEN + 1];
    bool ok;

    if (!tok || len != TOKEN_E2B_LEN || token_e2b(key, purpose, sbx, want))
        return false;
    ok = mbedtls_ct_memcmp(want, tok, TOKEN_E2B_LEN) == 0;
    explicit_bzero(want, sizeof(want));
    return ok;
}

bool token_origin_allowed(const char *origin, const char *allowed, const char *host)
{
    size_t olen;
    const char *auth = NULL;

    if (!origin || !*origin)
        return true;
    olen = strlen(origin);
    for (const char *a = allowed; a && *a;) {
        size_t n;
        while (*a == ' ' || *a == '\t')
            a++;
        n = strcspn(a, " \t");
        if (n && n == olen && strncasecmp(a, origin, n) == 0)
            return true;
        a += n;
    }
    if (strncasecmp(origin, "http://", 7) == 0)
        auth = origin + 7;
    else if (strncasecmp(origin, "https://", 8) == 0)
        auth = origin + 8;
    return auth && *auth && host && strcasecmp(auth, host) == 0;
}
