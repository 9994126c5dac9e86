/* chunked.c - decoder of HTTP/1.1 chunked request bodies (see chunked.h). */
#include "chunked.h"

#include <errno.h>

enum {
    CS_SIZE,       /* hex digits of a chunk size */
    CS_SIZE_WS,    /* blanks after the size: only before an extension */
    CS_EXT,        /* ;name=value... up to CR */
    CS_SIZE_LF,    /* LF ending the size line */
    CS_DATA,       /* chunk data */
    CS_DATA_CR,    /* CR after the data */
    CS_DATA_LF,    /* LF after the data */
    CS_TRAIL,      /* start of a trailer line, or the CR of the final empty line */
    CS_TRAIL_LINE, /* a trailer field line up to CR */
    CS_TRAIL_LF,   /* LF ending a trailer line */
    CS_FINAL_LF,   /* LF of the empty line that ends the body */
    CS_DONE,
    CS_ERR_INVAL,
    CS_ERR_BIG,
};

void chunked_init(struct chunked *c)
{
    c->state = CS_SIZE;
    c->left = 0;
    c->digits = 0;
    c->line = 0;
    c->trailer = 0;
    c->total = 0;
}

static int hexval(unsigned char b)
{
    if (b >= '0' && b <= '9')
        return b - '0';
    if (b >= 'a' && b <= 'f')
        return b - 'a' + 10;
    if (b >= 'A' && b <= 'F')
        return b - 'A' + 10;
    return -1;
}

static int fail(struct chunked *c, int err)
{
    c->state = err == -E2BIG ? CS_ERR_BIG : CS_ERR_INVAL;
    return err;
}

int chunked_decode(struct chunked *c, const unsigned char *in, size_t n, size_t *used,
                   size_t *data_off, size_t *data_len)
{
    size_t i = 0;

    *used = 0;
    *data_off = 0;
    *data_len = 0;
    if (c->state == CS_DONE)
        return CHUNKED_DONE;
    if (c->state == CS_ERR_INVAL)
        return -EINVAL;
    if (c->state == CS_ERR_BIG)
        return -E2BIG;
    while (i < n) {
        unsigned char b = in[i];

        if (c->state == CS_DATA) {
            size_t take = n - i;
            if (take > c->left)
                take = (size_t)c->left;
            *data_off = i;
            *data_len = take;
            c->left -= take;
            c->total += take;
            i += take;
            if (!c->left)
                c->state = CS_DATA_CR;
            /* One run of data per call: the caller delivers it, then calls again. */
            *used = i;
            return CHUNKED_MORE;
        }
        i++;
        switch (c->state) {
        case CS_SIZE: {
            int v = hexval(b);
            if (++c->line > CHUNKED_LINE_MAX)
                return fail(c, -E2BIG);
            if (v >= 0) {
                /* 15 hex digits: sizes below 2^60, far above any body we take. */
                if (c->digits == 15)
                    return fail(c, -E2BIG);
                if (c->digits == 0 || c->left)
                    c->digits++;
                c->left = c->left * 16 + (unsigned)v;
                break;
            }
            if (!c->digits)
                return fail(c, -EINVAL);
            if (b == ';')
                c->state = CS_EXT;
            else if (b == ' ' || b == '\t')
                c->state = CS_SIZE_WS;
            else if (b == '\r')
                c->state = CS_SIZE_LF;
            else
                return fail(c, -EINVAL);
            break;
        }
        case CS_SIZE_WS:
            if (++c->line > CHUNKED_LINE_MAX)
                return fail(c, -E2BIG);
            if (b == ';')
                c->state = CS_EXT;
            else if (b != ' ' && b != '\t')
                return fail(c, -EINVAL);
            break;
        case CS_EXT:
            if (++c->line > CHUNKED_LINE_MAX)
                return fail(c, -E2BIG);
            if (b == '\r')
                c->state = CS_SIZE_LF;
            else if (b == '\n' || b == 0 || (b < 0x20 && b != '\t') || b == 0x7f)
                return fail(c, -EINVAL);
            break;
        case CS_SIZE_LF:
            if (b != '\n')
                return fail(c, -EINVAL);
            c->line = 0;
            c->digits = 0;
            c->state = c->left ? CS_DATA : CS_TRAIL;
            break;
        case CS_DATA_CR:
            if (b != '\r')
                return fail(c, -EINVAL);
            c->state = CS_DATA_LF;
            break;
        case CS_DATA_LF:
            if (b != '\n')
                return fail(c, -EINVAL);
            c->state = CS_SIZE;
            break;
        case CS_TRAIL:
            if (b == '\r') {
                c->state = CS_FINAL_LF;
                break;
            }
            c->line = 0;
            c->state = CS_TRAIL_LINE;
            /* This byte is the trailer line's first. */
            __attribute__((fallthrough));
        case CS_TRAIL_LINE:
            if (++c->line > CHUNKED_LINE_MAX || ++c->trailer > CHUNKED_TRAILER_MAX)
                return fail(c, -E2BIG);
            if (b == '\r')
                c->state = CS_TRAIL_LF;
            else if (b == '\n' || b == 0 || (b < 0x20 && b != '\t') || b == 0x7f)
                return fail(c, -EINVAL);
            break;
        case CS_TRAIL_LF:
            if (b != '\n')
                return fail(c, -EINVAL);
            c->state = CS_TRAIL;
            break;
        case CS_FINAL_LF:
            if (b != '\n')
                return fail(c, -EINVAL);
            c->state = CS_DONE;
            *used = i;
            return CHUNKED_DONE;
        default:
            return fail(c, -EINVAL);
        }
    }
    *used = i;
    return CHUNKED_MORE;
}
