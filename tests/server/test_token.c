/*
 * Unit test of server/token.c: a minted token verifies for its sandbox,
 * scopes and lifetime only; every altered, truncated, padded, oversized or
 * foreign token is refused with the reason the error message will give.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "token.h"

int failures;
#include "check.h"

static unsigned char key[TOKEN_SECRET_LEN], key2[TOKEN_SECRET_LEN];

static enum token_why verify(const char *tok, const char *sbx, unsigned need, uint64_t now)
{
    return token_verify(key, tok, strlen(tok), sbx, need, now, NULL);
}

static void test_roundtrip(void)
{
    char tok[TOKEN_STR_MAX + 1];
    struct token_claims c;

    CHECK(token_mint(key, "sbx-a", TOKEN_SCOPE_FILES | TOKEN_SCOPE_PTY, 1000, tok) == 0);
    CHECK(strlen(tok) > 0 && strlen(tok) <= TOKEN_STR_MAX);
    CHECK(strspn(tok, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") ==
          strlen(tok));
    CHECK(token_verify(key, tok, strlen(tok), "sbx-a", TOKEN_SCOPE_FILES, 999, &c) == TOKEN_OK);
    CHECK(c.expires == 1000 && c.scopes == (TOKEN_SCOPE_FILES | TOKEN_SCOPE_PTY));
    CHECK(strcmp(c.sbx, "sbx-a") == 0);
    CHECK(verify(tok, "sbx-a", TOKEN_SCOPE_PTY, 0) == TOKEN_OK);
    /* expiry: valid strictly before it */
    CHECK(verify(tok, "sbx-a", TOKEN_SCOPE_FILES, 1000) == TOKEN_EXPIRED);
    CHECK(verify(tok, "sbx-a", TOKEN_SCOPE_FILES, UINT64_MAX) == TOKEN_EXPIRED);
    /* wrong sandbox, including prefixes and extensions of its id */
    CHECK(verify(tok, "sbx-b", TOKEN_SCOPE_FILES, 1) == TOKEN_WRONG_SANDBOX);
    CHECK(verify(tok, "sbx-", TOKEN_SCOPE_FILES, 1) == TOKEN_WRONG_SANDBOX);
    CHECK(verify(tok, "sbx-aa", TOKEN_SCOPE_FILES, 1) == TOKEN_WRONG_SANDBOX);
    CHECK(verify(tok, "", TOKEN_SCOPE_FILES, 1) == TOKEN_WRONG_SANDBOX);
    /* wrong scope */
    CHECK(verify(tok, "sbx-a", TOKEN_SCOPE_SESSION, 1) == TOKEN_WRONG_SCOPE);
    CHECK(verify(tok, "sbx-a", 0, 1) == TOKEN_WRONG_SCOPE);
    /* another server's secret */
    CHECK(token_verify(key2, tok, strlen(tok), "sbx-a", TOKEN_SCOPE_FILES, 1, NULL) ==
          TOKEN_BAD_MAC);
    /* the longest id round-trips and fits TOKEN_STR_MAX */
    {
        char id[TOKEN_SBX_MAX + 1];
        memset(id, 'x', TOKEN_SBX_MAX);
        id[TOKEN_SBX_MAX] = '\0';
        CHECK(token_mint(key, id, TOKEN_SCOPE_ALL, 5, tok) == 0);
        CHECK(strlen(tok) == TOKEN_STR_MAX);
        CHECK(verify(tok, id, TOKEN_SCOPE_SESSION, 4) == TOKEN_OK);
    }
}

static void test_mint_args(void)
{
    char tok[TOKEN_STR_MAX + 1], id[TOKEN_SBX_MAX + 2];

    CHECK(token_mint(key, "", TOKEN_SCOPE_PTY, 5, tok) == -EINVAL);
    CHECK(token_mint(key, NULL, TOKEN_SCOPE_PTY, 5, tok) == -EINVAL);
    CHECK(token_mint(key, "a", 0, 5, tok) == -EINVAL);
    CHECK(token_mint(key, "a", TOKEN_SCOPE_ALL + 1, 5, tok) == -EINVAL);
    CHECK(token_scope_of("ports") == TOKEN_SCOPE_PORTS);
    memset(id, 'x', TOKEN_SBX_MAX + 1);
    id[TOKEN_SBX_MAX + 1] = '\0';
    CHECK(token_mint(key, id, TOKEN_SCOPE_PTY, 5, tok) == -EINVAL);
    CHECK(token_scope_of("pty") == TOKEN_SCOPE_PTY);
    CHECK(token_scope_of("exec") == TOKEN_SCOPE_EXEC);
    CHECK(strcmp(token_scope_name(TOKEN_SCOPE_EXEC), "exec") == 0);
    CHECK(token_scope_of("session") == TOKEN_SCOPE_SESSION);
    CHECK(token_scope_of("files") == TOKEN_SCOPE_FILES);
    CHECK(token_scope_of("Files") == 0 && token_scope_of("") == 0 && token_scope_of(NULL) == 0);
    CHECK(strcmp(token_scope_name(TOKEN_SCOPE_SESSION), "session") == 0);
    CHECK(token_scope_name(3) == NULL);
}

/* Every single-character change anywhere in the token is refused. */
static void test_tamper(void)
{
    static const char alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    char tok[TOKEN_STR_MAX + 1], t[TOKEN_STR_MAX + 2];
    size_t n;

    CHECK(token_mint(key, "sandbox-1", TOKEN_SCOPE_FILES, 100, tok) == 0);
    n = strlen(tok);
    for (size_t i = 0; i < n; i++) {
        for (size_t a = 0; a < sizeof(alpha) - 1; a++) {
            enum token_why w;
            if (alpha[a] == tok[i])
                continue;
            memcpy(t, tok, n + 1);
            t[i] = alpha[a];
            w = verify(t, "sandbox-1", TOKEN_SCOPE_FILES, 1);
            CHECK(w == TOKEN_BAD_MAC || w == TOKEN_MALFORMED);
        }
    }
    /* truncated, extended, padded, foreign characters */
    for (size_t k = 0; k < n; k++)
        CHECK(token_verify(key, tok, k, "sandbox-1", TOKEN_SCOPE_FILES, 1, NULL) != TOKEN_OK);
    memcpy(t, tok, n);
    t[n] = 'A';
    t[n + 1] = '\0';
    CHECK(verify(t, "sandbox-1", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    t[n] = '=';
    CHECK(verify(t, "sandbox-1", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    memcpy(t, tok, n + 1);
    t[3] = '+';
    CHECK(verify(t, "sandbox-1", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    t[3] = '/';
    CHECK(verify(t, "sandbox-1", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    t[3] = '\0';
    CHECK(token_verify(key, t, n, "sandbox-1", TOKEN_SCOPE_FILES, 1, NULL) == TOKEN_MALFORMED);
}

static void test_garbage(void)
{
    char big[4096];

    CHECK(verify("", "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    CHECK(verify("A", "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    CHECK(verify("not a token", "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    CHECK(verify("AQAAAAAAAAPoBAFh", "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED); /* no MAC */
    CHECK(token_verify(key, NULL, 0, "a", TOKEN_SCOPE_FILES, 1, NULL) == TOKEN_MALFORMED);
    /* oversized: refused before decoding, whatever it holds */
    memset(big, 'A', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    CHECK(verify(big, "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    big[TOKEN_STR_MAX + 1] = '\0';
    CHECK(verify(big, "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    /* a well-formed shape with a zero MAC, and a future version */
    {
        char tok[TOKEN_STR_MAX + 1];
        CHECK(token_mint(key, "a", TOKEN_SCOPE_FILES, 100, tok) == 0);
        /* version byte 1 -> 2: first character 'A' + ... changes the version */
        tok[0] = 'A';
        tok[1] = 'g'; /* first byte 0x02 */
        CHECK(verify(tok, "a", TOKEN_SCOPE_FILES, 1) == TOKEN_MALFORMED);
    }
}

static void test_origin(void)
{
    const char *list = "https://app.example.com  http://localhost:3000\thttp://[::1]:9000";

    /* no Origin: not a browser */
    CHECK(token_origin_allowed(NULL, "", "127.0.0.1:8080"));
    CHECK(token_origin_allowed("", NULL, NULL));
    /* empty list: the server's own origin only */
    CHECK(token_origin_allowed("http://127.0.0.1:8080", "", "127.0.0.1:8080"));
    CHECK(token_origin_allowed("https://Warren.Example:443", NULL, "warren.example:443"));
    CHECK(!token_origin_allowed("http://127.0.0.1:8081", "", "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://evil.example", "", "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://127.0.0.1:8080", "", NULL));
    CHECK(!token_origin_allowed("ws://127.0.0.1:8080", "", "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://127.0.0.1:8080/", "", "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://127.0.0.1:8080.evil", "", "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("null", "", "null"));
    CHECK(!token_origin_allowed("http://", "", ""));
    /* a list: whole origins, any case, any spacing */
    CHECK(token_origin_allowed("https://app.example.com", list, "127.0.0.1:8080"));
    CHECK(token_origin_allowed("HTTPS://APP.EXAMPLE.COM", list, "127.0.0.1:8080"));
    CHECK(token_origin_allowed("http://localhost:3000", list, "127.0.0.1:8080"));
    CHECK(token_origin_allowed("http://[::1]:9000", list, "127.0.0.1:8080"));
    CHECK(token_origin_allowed("http://127.0.0.1:8080", list, "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("https://app.example.co", list, "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("https://app.example.com.evil", list, "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://app.example.com", list, "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://localhost:30001", list, "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("http://localhost", list, "127.0.0.1:8080"));
    CHECK(!token_origin_allowed("null", list, "127.0.0.1:8080"));
}

/* E2B's derived tokens: fixed, per purpose and sandbox, per key; bad arguments refused. */
static void test_e2b(void)
{
    char a[TOKEN_E2B_LEN + 1], b[TOKEN_E2B_LEN + 1], id[TOKEN_SBX_MAX + 2];

    /* values computed apart (Python's hmac module), one per purpose */
    CHECK(token_e2b(key, "envd", "sbx-a", a) == 0);
    CHECK(strcmp(a, "674a8594eb5364b6d4fbed7723be1b04a269c38e70372c15f9e644a4a2943284") == 0);
    CHECK(token_e2b(key, "traffic", "sbx-a", a) == 0);
    CHECK(strcmp(a, "da26b3174a5992d24f3f0ccca409437c585d98fc95c583c56e8ee73d876054dd") == 0);
    CHECK(token_e2b(key, "envd", "sb-1", a) == 0);
    CHECK(strlen(a) == TOKEN_E2B_LEN && strspn(a, "0123456789abcdef") == TOKEN_E2B_LEN);
    CHECK(token_e2b(key, "envd", "sb-1", b) == 0 && strcmp(a, b) == 0);
    CHECK(token_e2b_check(key, "envd", "sb-1", a, strlen(a)));
    CHECK(!token_e2b_check(key, "traffic", "sb-1", a, strlen(a)));
    CHECK(!token_e2b_check(key, "envd", "sb-2", a, strlen(a)));
    CHECK(!token_e2b_check(key2, "envd", "sb-1", a, strlen(a)));
    CHECK(!token_e2b_check(key, "envd", "sb-1", a, strlen(a) - 1));
    CHECK(!token_e2b_check(key, "envd", "sb-1", NULL, 0));
    a[0] = a[0] == '0' ? '1' : '0';
    CHECK(!token_e2b_check(key, "envd", "sb-1", a, strlen(a)));
    CHECK(token_e2b(key, "traffic", "sb-1", b) == 0 && strcmp(a, b) != 0);
    /* the separator: ("envd", "x") and ("envdx", "") never meet, nor shifted splits */
    CHECK(token_e2b(key, "en", "vdsb-1", a) == 0);
    CHECK(token_e2b(key, "envd", "sb-1", b) == 0 && strcmp(a, b) != 0);
    CHECK(token_e2b(key2, "envd", "sb-1", a) == 0 && strcmp(a, b) != 0);
    CHECK(token_e2b(key, "envd", "", a) == -EINVAL && a[0] == '\0');
    CHECK(token_e2b(key, "", "sb-1", a) == -EINVAL);
    CHECK(token_e2b(key, NULL, "sb-1", a) == -EINVAL);
    CHECK(token_e2b(key, "envd", NULL, a) == -EINVAL);
    CHECK(token_e2b(NULL, "envd", "sb-1", a) == -EINVAL);
    memset(id, 'x', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    CHECK(token_e2b(key, "envd", id, a) == -EINVAL);
    id[TOKEN_SBX_MAX] = '\0';
    CHECK(token_e2b(key, "envd", id, a) == 0);
}

int main(void)
{
    for (size_t i = 0; i < TOKEN_SECRET_LEN; i++) {
        key[i] = (unsigned char)(i * 7 + 1);
        key2[i] = (unsigned char)(i * 7 + 2);
    }
    test_roundtrip();
    test_mint_args();
    test_tamper();
    test_garbage();
    test_origin();
    test_e2b();
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
