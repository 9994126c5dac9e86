/*
 * Fuzz the access-token verifier (server/token.c) with what a browser could
 * put in ?access_token=. The first input byte picks the scope asked for and
 * the rest is the token. Any token accepted must be the one canonical
 * encoding of what it claims: minting its claims again gives the same bytes.
 * Forgery is out of reach of a fuzzer, so a second pass uses a known key and
 * re-MACs the decoded payload's shape through token_mint.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "token.h"

static const unsigned char key[TOKEN_SECRET_LEN] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct token_claims c;
    char again[TOKEN_STR_MAX + 1];
    unsigned need;
    enum token_why w;

    if (size < 1)
        return 0;
    need = 1u << (data[0] % 4); /* 8 is no scope at all */
    w = token_verify(key, (const char *)data + 1, size - 1, "sbx", need, 1000, &c);
    if (w == TOKEN_OK || w == TOKEN_EXPIRED || w == TOKEN_WRONG_SANDBOX || w == TOKEN_WRONG_SCOPE) {
        /* Only a genuine MAC gets here: the claims must re-mint to the same token. */
        if (token_mint(key, c.sbx, c.scopes, c.expires, again) != 0 || strlen(again) != size - 1 ||
            memcmp(again, data + 1, size - 1) != 0)
            abort();
    }
    if (w == TOKEN_OK && (strcmp(c.sbx, "sbx") || !(c.scopes & need) || c.expires <= 1000))
        abort();
    /* A valid token for these claims, then every claim the input's bytes suggest. */
    if (size >= 10) {
        char id[TOKEN_SBX_MAX + 1];
        size_t n = (data[1] % TOKEN_SBX_MAX) + 1;
        uint64_t exp = 0;
        unsigned scopes = data[2] & TOKEN_SCOPE_ALL;
        for (int i = 0; i < 7; i++)
            exp = exp << 8 | data[3 + i];
        if (n > size - 10)
            n = size - 10;
        if (n == 0 || !scopes)
            return 0;
        memcpy(id, data + 10, n);
        id[n] = '\0';
        if (strlen(id) != n)
            return 0;
        if (token_mint(key, id, scopes, exp, again) != 0)
            abort();
        w = token_verify(key, again, strlen(again), id, scopes & -scopes, exp - 1, &c);
        if (exp && w != TOKEN_OK)
            abort();
        if (token_verify(key, again, strlen(again), id, scopes & -scopes, exp, NULL) !=
            TOKEN_EXPIRED)
            abort();
    }
    return 0;
}
