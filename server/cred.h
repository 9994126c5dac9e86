/*
 * cred.h - the one reader of warrend's credentials, for every door (the API
 * and its sockets in auth.c, the port proxy in ports.c and ports_head.c).
 *
 * What the API accepts and what the port proxy strips before forwarding must
 * be the same set of spellings: a spelling one door accepts and another does
 * not recognise reaches a guest with the key in it. So every door asks here.
 *
 * Pure: no I/O, no allocation. Unit-tested by tests/server/test_api.c,
 * fuzzed by tests/fuzz/fuzz_api.c and fuzz_ports.c.
 */
#ifndef WARREN_CRED_H
#define WARREN_CRED_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Is the Authorization header value v[0..n) the API key? The accepted
 * spelling: optional leading spaces or tabs, the scheme "Bearer" in any case,
 * one or more spaces (RFC 7235's 1*SP), exactly the key, optional trailing
 * spaces or tabs. key NULL or "": false. The key is compared in time that
 * depends on the lengths only.
 */
bool cred_is_key(const char *v, size_t n, const char *key);

/*
 * Is the X-API-KEY header value v[0..n) the API key, as E2B's SDKs send it? Two
 * spellings: the key itself, or "e2b_" followed by the lowercase hex of the key's
 * bytes (E2B's SDKs insist on that shape; cred_e2b_key writes it). Optional spaces
 * or tabs around it. Compared in time that depends on the lengths only.
 */
bool cred_is_e2b_key(const char *v, size_t n, const char *key);
/* The "e2b_<hex>" spelling of key into out (cap bytes, with its NUL): its length, or
 * -1 when it does not fit or key is empty. */
int cred_e2b_key(const char *key, char *out, size_t cap);

/* Is the pair p[0..n) of a query string or a cookie list ("name=value", or a
 * bare "name") named name? Names are compared exactly, as the doors read them. */
bool cred_pair_named(const char *p, size_t n, const char *name);

#endif
