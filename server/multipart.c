/*
 * multipart.c - one-file multipart/form-data, streamed (multipart.h).
 */
#include <errno.h>
#include <string.h>
#include <strings.h>

#include "multipart.h"

static bool bchar(char c)
{
    /* RFC 2046's bcharsnospace plus space (not last) */
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           strchr("'()+_,-./:=? ", c) != NULL;
}

int mpart_init(struct mpart *m, const char *ct)
{
    const char *p, *b;
    size_t n = 0;

    memset(m, 0, sizeof(*m));
    m->st = MPART_FAILED;
    if (!ct || strncasecmp(ct, "multipart/form-data", 19) != 0)
        return -EINVAL;
    for (p = ct + 19; (p = strchr(p, ';')); p++) {
        while (p[1] == ' ' || p[1] == '\t')
            p++;
        if (strncasecmp(p + 1, "boundary=", 9) == 0)
            break;
    }
    if (!p)
        return -EINVAL;
    b = p + 10;
    if (*b == '"') {
        b++;
        while (b[n] && b[n] != '"')
            n++;
        if (b[n] != '"')
            return -EINVAL;
    } else {
        while (b[n] && b[n] != ';' && b[n] != ' ' && b[n] != '\t')
            n++;
    }
    if (n == 0 || n > MPART_BOUNDARY_MAX || b[n - 1] == ' ')
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!bchar(b[i]))
            return -EINVAL;
    memcpy(m->delim, "\r\n--", 4);
    memcpy(m->delim + 4, b, n);
    m->dlen = 4 + n;
    m->delim[m->dlen] = '\0';
    /* fail[i]: the longest proper prefix of delim[0..i] that is also its suffix */
    m->fail[0] = 0;
    for (size_t i = 1, k = 0; i < m->dlen; i++) {
        while (k && m->delim[i] != m->delim[k])
            k = m->fail[k - 1];
        if (m->delim[i] == m->delim[k])
            k++;
        m->fail[i] = (unsigned short)k;
    }
    m->st = MPART_OPEN;
    return 0;
}

/* The opening boundary line and the part's headers are whole in m->head[0..end): check
 * them. 0 or -EINVAL. */
static int open_check(struct mpart *m, size_t end)
{
    const char *h = m->head, *line, *eol;
    size_t bl = m->dlen - 2;

    /* "--boundary" then CRLF (transport padding, spaces or tabs, allowed before it) */
    if (end < bl + 2 || memcmp(h, m->delim + 2, bl) != 0)
        return -EINVAL;
    line = h + bl;
    while (*line == ' ' || *line == '\t')
        line++;
    if (line[0] != '\r' || line[1] != '\n')
        return -EINVAL;
    for (line += 2; line < h + end; line = eol + 2) {
        eol = strstr(line, "\r\n");
        if (!eol || eol > h + end)
            return -EINVAL;
        if (eol == line)
            break;
        if (!memchr(line, ':', (size_t)(eol - line)))
            return -EINVAL;
        if (!strncasecmp(line, "content-disposition:", 20)) {
            const char *f = strstr(line, "filename=\"");
            if (f && f < eol) {
                const char *q = memchr(f + 10, '"', (size_t)(eol - f - 10));
                size_t fl = q ? (size_t)(q - f - 10) : 0;
                if (q && fl < sizeof(m->filename)) {
                    memcpy(m->filename, f + 10, fl);
                    m->filename[fl] = '\0';
                }
            }
        }
    }
    return 0;
}

int mpart_feed(struct mpart *m, const unsigned char *b, size_t n, size_t *used, unsigned char *out,
               size_t *olen)
{
    size_t i = 0;

    *olen = 0;
    *used = 0;
    while (i < n) {
        switch (m->st) {
        case MPART_OPEN: {
            size_t take = n - i, from = m->hn > 3 ? m->hn - 3 : 0, hend = 0;
            if (take > sizeof(m->head) - 1 - m->hn)
                take = sizeof(m->head) - 1 - m->hn;
            memcpy(m->head + m->hn, b + i, take);
            /* the head's end, searched in what is new (and the 3 bytes before it) */
            for (size_t j = from; j + 4 <= m->hn + take; j++) {
                if (!memcmp(m->head + j, "\r\n\r\n", 4)) {
                    hend = j + 4;
                    break;
                }
            }
            if (!hend) {
                m->hn += take;
                i += take;
                if (m->hn == sizeof(m->head) - 1) {
                    m->st = MPART_FAILED;
                    *used = i;
                    return -E2BIG;
                }
                break;
            }
            i += hend - m->hn; /* the rest of what was copied is data, taken next */
            m->hn = hend;
            m->head[hend] = '\0';
            /* a NUL in the head would hide its lines from the string functions */
            if (memchr(m->head, '\0', hend) || open_check(m, m->hn)) {
                m->st = MPART_FAILED;
                *used = i;
                return -EINVAL;
            }
            m->st = MPART_DATA;
            m->k = 0;
            break;
        }
        case MPART_DATA: {
            char c = (char)b[i++];
            size_t k = m->k;
            while (k && c != m->delim[k]) {
                size_t nk = m->fail[k - 1];
                /* delim[0..k) falls back to delim[0..nk): what falls off is data */
                memcpy(out + *olen, m->delim, k - nk);
                *olen += k - nk;
                k = nk;
            }
            if (c == m->delim[k]) {
                k++;
            } else {
                out[(*olen)++] = (unsigned char)c;
            }
            m->k = k;
            if (k == m->dlen) {
                m->st = MPART_CLOSE;
                m->cn = 0;
            }
            break;
        }
        case MPART_CLOSE:
            if (b[i++] != '-') {
                /* another part: one file per request */
                m->st = MPART_FAILED;
                *used = i;
                return -EINVAL;
            }
            if (++m->cn == 2) {
                m->st = MPART_DONE;
                *used = i;
                return MPART_END;
            }
            break;
        case MPART_DONE:
            *used = n;
            return MPART_END;
        case MPART_FAILED:
            *used = i;
            return -EINVAL;
        }
    }
    *used = i;
    return m->st == MPART_DONE ? MPART_END : MPART_MORE;
}
