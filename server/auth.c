/*
 * auth.c - who may do what: the API key, or an access token (token.h) that a
 * holder of the key minted for one sandbox and some scopes; the Origin rule
 * of browser sockets; and POST /v1/sandboxes/{id}/tokens.
 *
 * Every edge (REST file routes, PTY socket, agent socket) admits through
 * http_authorize, before any state exists for the request, so a refusal is
 * an ordinary JSON error. Tokens travel in the query only (browsers cannot
 * set headers on a WebSocket); the parameter is dropped from every parsed
 * query (HTTP_TOKEN_PARAM), and nothing here logs a token.
 */
#include "cred.h"
#include "http_int.h"
#include "util.h"

#define TOKEN_TTL_DEFAULT 3600
#define TOKEN_TTL_MAX     86400

static void set_err(struct api_err *e, int status, const char *code, const char *msg)
{
    e->status = status;
    e->code = code;
    snprintf(e->msg, sizeof(e->msg), "%s", msg);
}

/* The ?access_token= of the request into buf: 1, 0 when there is none, -1 when there
 * are several or it is longer than any token. */
static int query_token(struct lws *wsi, char *buf, int cap)
{
    const size_t plen = sizeof(HTTP_TOKEN_PARAM) - 1;
    char frag[sizeof(HTTP_TOKEN_PARAM) + TOKEN_STR_MAX + 1];
    int found = 0;

    buf[0] = '\0';
    for (int i = 0; i < QUERY_FRAGS_MAX; i++) {
        int len = lws_hdr_fragment_length(wsi, WSI_TOKEN_HTTP_URI_ARGS, i);
        if (len <= 0) {
            /* An empty fragment ("a&&b") has length 0 but may have successors. */
            if (lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i) < 0)
                break;
            continue;
        }
        if ((size_t)len >= plen) {
            char head[sizeof(HTTP_TOKEN_PARAM)];
            /* Only the name is needed to tell: a long fragment of another name is fine. */
            if (len >= (int)sizeof(frag)) {
                /* lws copies whole fragments only: look at its name through a big copy. */
                char *big = malloc((size_t)len + 1);
                bool is_tok;
                if (!big ||
                    lws_hdr_copy_fragment(wsi, big, len + 1, WSI_TOKEN_HTTP_URI_ARGS, i) < 0) {
                    free(big);
                    return -1;
                }
                is_tok = strncmp(big, HTTP_TOKEN_PARAM, plen) == 0;
                explicit_bzero(big, (size_t)len);
                free(big);
                if (is_tok)
                    return -1; /* longer than any token */
                continue;
            }
            if (lws_hdr_copy_fragment(wsi, frag, (int)sizeof(frag), WSI_TOKEN_HTTP_URI_ARGS, i) < 0)
                return -1;
            memcpy(head, frag, plen);
            head[plen] = '\0';
            if (strcmp(head, HTTP_TOKEN_PARAM) == 0) {
                if (found++ || (int)strlen(frag + plen) >= cap)
                    return -1;
                memcpy(buf, frag + plen, strlen(frag + plen) + 1);
            }
        }
    }
    return found ? 1 : 0;
}

int http_authorize(struct pss *p, struct lws *wsi, const char *sbx_id, const char *scope,
                   struct api_err *e)
{
    struct http_server *srv = lws_context_user(lws_get_context(wsi));
    char authz[512], tok[TOKEN_STR_MAX + 1];
    unsigned need = scope ? token_scope_of(scope) : 0;
    enum token_why why;
    int n, t;

    n = lws_hdr_total_length(wsi, WSI_TOKEN_HTTP_AUTHORIZATION);
    if (n > 0) {
        /* The header decides alone: a wrong key is not rescued by a token. */
        if (n < (int)sizeof(authz) &&
            lws_hdr_copy(wsi, authz, sizeof(authz), WSI_TOKEN_HTTP_AUTHORIZATION) >= 0 &&
            cred_is_key(authz, strlen(authz), srv->key))
            return 0;
        set_err(e, 401, "unauthorized", "missing or wrong 'Authorization: Bearer <key>'");
        return -EACCES;
    }
    t = query_token(wsi, tok, sizeof(tok));
    if (t == 0) {
        set_err(e, 401, "unauthorized",
                need ? "missing 'Authorization: Bearer <key>' or '?access_token=<token>'"
                     : "missing or wrong 'Authorization: Bearer <key>'");
        return -EACCES;
    }
    if (!need) {
        set_err(e, 401, "unauthorized",
                "this route needs 'Authorization: Bearer <key>': an access token opens only "
                "its sandbox's file routes, PTY and agent socket, as its scope says");
        goto refused;
    }
    if (t < 0) {
        set_err(e, 401, "token_invalid", "the access_token is repeated or longer than any token");
        goto refused;
    }
    if (!srv->token_key_set) {
        set_err(e, 401, "token_invalid", "this server has no token secret: it accepts no token");
        goto refused;
    }
    why = token_verify(srv->token_key, tok, strlen(tok), sbx_id, need, (uint64_t)time(NULL), NULL);
    switch (why) {
    case TOKEN_OK:
        explicit_bzero(tok, sizeof(tok));
        if (p)
            p->by_token = true;
        return 0;
    case TOKEN_EXPIRED:
        set_err(e, 401, "token_expired", token_why_str(why));
        break;
    case TOKEN_WRONG_SANDBOX:
        set_err(e, 403, "token_wrong_sandbox", token_why_str(why));
        break;
    case TOKEN_WRONG_SCOPE:
        snprintf(e->msg, sizeof(e->msg), "the access token's scope does not include \"%s\"", scope);
        e->status = 403;
        e->code = "token_wrong_scope";
        break;
    default:
        set_err(e, 401, "token_invalid", token_why_str(why));
        break;
    }
refused:
    explicit_bzero(tok, sizeof(tok));
    return -EACCES;
}

bool http_query_frag_spurious(struct lws *wsi, int i, const char *frag)
{
    char next[2];

    return !strcmp(frag, "/") &&
           lws_hdr_copy_fragment(wsi, next, (int)sizeof(next), WSI_TOKEN_HTTP_URI_ARGS, i + 1) < 0;
}

bool http_origin_allowed(const struct http_server *srv, struct lws *wsi)
{
    char origin[512], host[512];
    int n = lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN), h;

    if (n <= 0)
        return true; /* not a browser */
    if (n >= (int)sizeof(origin) || lws_hdr_copy(wsi, origin, sizeof(origin), WSI_TOKEN_ORIGIN) < 0)
        return false;
    h = lws_hdr_total_length(wsi, WSI_TOKEN_HOST);
    if (h <= 0 || h >= (int)sizeof(host) ||
        lws_hdr_copy(wsi, host, sizeof(host), WSI_TOKEN_HOST) < 0)
        host[0] = '\0';
    return token_origin_allowed(origin, srv->cfg->allowed_origins, host[0] ? host : NULL);
}

/* Whole seconds, shown with ".000" like the sandbox's own times. */
static json_t *iso_time(uint64_t s)
{
    char buf[UTIL_ISO_MAX];

    if (!util_iso_time(s > INT64_MAX ? INT64_MAX : (int64_t)s, 0, buf, sizeof(buf)))
        return json_null();
    return json_string(buf);
}

void auth_tokens_mint(struct pss *p, json_t *body)
{
    char tok[TOKEN_STR_MAX + 1];
    json_t *v, *names;
    struct sbx_rec rec;
    struct sbx_err err;
    const char *k;
    unsigned scopes = 0;
    json_int_t ttl = TOKEN_TTL_DEFAULT;
    uint64_t exp;
    size_t i;

    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "ttl_seconds") && strcmp(k, "scope")) {
            resp_json(p, 400, api_error("invalid_argument", "unknown field '%.64s'", k));
            return;
        }
    }
    v = json_object_get(body, "ttl_seconds");
    if (v) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > TOKEN_TTL_MAX) {
            resp_json(p, 400,
                      api_error("invalid_argument", "ttl_seconds must be an integer 1..%d",
                                TOKEN_TTL_MAX));
            return;
        }
        ttl = json_integer_value(v);
    }
    v = json_object_get(body, "scope");
    if (!json_is_array(v) || json_array_size(v) == 0) {
        resp_json(p, 400,
                  api_error("invalid_argument",
                            "scope must be a non-empty array of \"pty\", \"session\", "
                            "\"files\", \"ports\", \"exec\""));
        return;
    }
    for (i = 0; i < json_array_size(v); i++) {
        unsigned bit = token_scope_of(json_string_value(json_array_get(v, i)));
        if (!bit) {
            resp_json(p, 400,
                      api_error("invalid_argument",
                                "scope[%zu] must be \"pty\", \"session\", \"files\", "
                                "\"ports\" or \"exec\"",
                                i));
            return;
        }
        scopes |= bit;
    }
    if (sbx_get(p->srv->t, p->sbx, &rec, &err)) {
        resp_sbx_err(p, &err);
        return;
    }
    if (rec.ended) {
        bool ended = !strcmp(rec.state, "ended");
        sbx_err_set(&err, ended ? SBX_E_GONE : SBX_E_DEAD,
                    "sandbox %s has %s: no token is issued for it", p->sbx,
                    ended ? "ended" : "died");
        resp_sbx_err(p, &err);
        return;
    }
    if (!p->srv->token_key_set) {
        resp_code(p, 500, "internal", "this server has no token secret");
        return;
    }
    exp = (uint64_t)time(NULL) + (uint64_t)ttl;
    if (token_mint(p->srv->token_key, p->sbx, scopes, exp, tok)) {
        resp_code(p, 500, "internal", "cannot mint the token");
        return;
    }
    names = json_array();
    for (unsigned b = 1; b & TOKEN_SCOPE_ALL; b <<= 1)
        if (scopes & b)
            json_array_append_new(names, json_string(token_scope_name(b)));
    LOG(LOG_INFO, "%s: token issued, scope 0x%x, valid %lld s", p->sbx, scopes, (long long)ttl);
    resp_json(p, 201,
              json_pack("{s:s, s:o, s:o, s:s}", "token", tok, "expires_at", iso_time(exp), "scope",
                        names, "sandbox", p->sbx));
    explicit_bzero(tok, sizeof(tok));
}
