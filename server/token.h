/*
 * token.h - access tokens for browsers: a per-sandbox capability that a
 * backend holding the API key mints (POST /v1/sandboxes/{id}/tokens) and
 * hands to a browser, which passes it as ?access_token= (browsers cannot
 * set headers on a WebSocket).
 *
 * A token is URL-safe base64 (no padding) of
 *     u8  version (TOKEN_VERSION)
 *     u64 expiry, wall-clock seconds since the epoch, big-endian
 *     u8  scopes (TOKEN_SCOPE_* bits, non-zero, no unknown bit)
 *     u8  n, the sandbox id's length (1..TOKEN_SBX_MAX)
 *     n   the sandbox id
 *     32  HMAC-SHA256 under the server's secret of every byte above
 * Nothing is stored server-side: a token is valid until it expires or the
 * secret (state_dir/token_secret) changes. Pure functions, no I/O; the
 * verifier is fuzzed (tests/fuzz/fuzz_token.c).
 */
#ifndef WARREN_TOKEN_H
#define WARREN_TOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOKEN_VERSION    1
#define TOKEN_SECRET_LEN 32 /* bytes of the HMAC key */
#define TOKEN_SBX_MAX    64 /* longest sandbox id (= API_ID_MAX) */
#define TOKEN_MAC_LEN    32
/* Longest raw token and longest encoded one (characters, without the NUL). */
#define TOKEN_RAW_MAX (1 + 8 + 1 + 1 + TOKEN_SBX_MAX + TOKEN_MAC_LEN)
#define TOKEN_STR_MAX ((TOKEN_RAW_MAX * 4 + 2) / 3)

enum token_scope {
    TOKEN_SCOPE_PTY = 1 << 0,     /* "pty": the PTY socket */
    TOKEN_SCOPE_SESSION = 1 << 1, /* "session": the agent socket */
    TOKEN_SCOPE_FILES = 1 << 2,   /* "files": the file routes */
    TOKEN_SCOPE_PORTS = 1 << 3,   /* "ports": the sandbox's ports (ports.h) */
    /* "exec": start a program. Without it a "pty" token only attaches to a PTY that
     * exists, and a "session" token's socket refuses the exec op: the other scopes
     * never run a command of the holder's choosing. */
    TOKEN_SCOPE_EXEC = 1 << 4,
    TOKEN_SCOPE_ALL = (1 << 5) - 1,
};

/* Why a token was refused, in the order they are checked: a token whose MAC is bad
 * tells nothing about its fields. */
enum token_why {
    TOKEN_OK = 0,
    TOKEN_MALFORMED,     /* not base64url, wrong length, unknown version or field value */
    TOKEN_BAD_MAC,       /* not minted with this server's secret, or altered */
    TOKEN_EXPIRED,       /* now >= its expiry */
    TOKEN_WRONG_SANDBOX, /* minted for another sandbox */
    TOKEN_WRONG_SCOPE,   /* its scopes do not include the one asked for */
};

struct token_claims {
    uint64_t expires; /* seconds since the epoch */
    unsigned scopes;  /* TOKEN_SCOPE_* */
    char sbx[TOKEN_SBX_MAX + 1];
};

/* The bit of a scope name ("pty", "session", "files", "ports", "exec"), or 0 for any other
 * string. */
unsigned token_scope_of(const char *name);
/* The name of one scope bit, or NULL. */
const char *token_scope_name(unsigned bit);
/* A short sentence for a refusal, for error messages. */
const char *token_why_str(enum token_why why);

/* Write a NUL-terminated token for sandbox sbx (1..TOKEN_SBX_MAX bytes), scopes
 * (non-zero subset of TOKEN_SCOPE_ALL) and expiry into out (TOKEN_STR_MAX + 1 bytes).
 * 0, -EINVAL for a bad argument, -EIO if mbedTLS fails. */
int token_mint(const unsigned char key[TOKEN_SECRET_LEN], const char *sbx, unsigned scopes,
               uint64_t expires, char out[TOKEN_STR_MAX + 1]);

/* Check the len bytes at tok (need not be NUL-terminated) against sandbox sbx, scope
 * need (one TOKEN_SCOPE_* bit) and the time now. TOKEN_OK, or why not. When the MAC
 * is good, *claims (may be NULL) holds what the token says, even if it is refused
 * for expiry, sandbox or scope. The MAC is compared in constant time. */
enum token_why token_verify(const unsigned char key[TOKEN_SECRET_LEN], const char *tok, size_t len,
                            const char *sbx, unsigned need, uint64_t now,
                            struct token_claims *claims);

/*
 * E2B's per-sandbox tokens (envdAccessToken, trafficAccessToken). Derived, never stored:
 * lowercase hex of HMAC-SHA256(key, purpose || '\0' || sbx), purpose "envd" or
 * "traffic". They carry no expiry: a door that accepts one must also check that the
 * sandbox is alive in the table, so a token dies with its sandbox (and a new sandbox
 * never reuses an id). Writes 64 hex digits and a NUL into out: 0, -EINVAL (a NULL or
 * empty argument, an id longer than TOKEN_SBX_MAX) or -EIO (mbedTLS failed).
 */
#define TOKEN_E2B_LEN 64
int token_e2b(const unsigned char key[TOKEN_SECRET_LEN], const char *purpose, const char *sbx,
              char out[TOKEN_E2B_LEN + 1]);
/* Is tok[0..len) the token_e2b of purpose and sbx? Compared in constant time. */
bool token_e2b_check(const unsigned char key[TOKEN_SECRET_LEN], const char *purpose,
                     const char *sbx, const char *tok, size_t len);

/*
 * Origin check of browser sockets. origin is the request's Origin header (NULL or ""
 * when absent: not a browser, allowed), allowed the configured allowed_origins
 * (space-separated origins such as "https://app.example.com http://localhost:3000",
 * compared whole and case-insensitively), host the request's Host header. An origin
 * is also allowed when it is the server's own: http:// or https:// followed by
 * exactly the Host the request was sent to (the pages warrend serves itself).
 */
bool token_origin_allowed(const char *origin, const char *allowed, const char *host);

#endif
