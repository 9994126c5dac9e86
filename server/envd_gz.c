/*
 * envd_gz.c - E2B's gzip uploads (POST /files with Content-Encoding: gzip):
 * the body is inflated as it arrives, before the multipart decoder (the
 * encoding is the whole body's), into the same upload path as a plain one.
 *
 * Memory stays bounded whatever the body inflates to: zlib makes at most
 * GZ_OUT bytes at a time, and while the sandbox is not taking them (the upload
 * has bytes pending, or its sandbox is being resumed) the rest of the
 * compressed input is held and the client's reading paused; the pump
 * (rest.c's upload_pump) drains it here when the sandbox takes more. The
 * inflated size is capped by upload_gzip_max_bytes: past it the answer is 413,
 * a corrupt or truncated body 400, and the file the upload opened is removed
 * so that no partial file is left.
 */
#include "http_int.h"
#include "gunzip.h"
#include "log.h"

#define GZ_OUT (64 * 1024) /* inflated bytes made at a time */

struct envd_gz {
    struct gunzip g;
    unsigned char *hold; /* compressed input not yet inflated (the sandbox was full) */
    size_t hold_off, hold_len, hold_cap;
    bool more; /* zlib may hold output it could not give yet */
    unsigned char out[GZ_OUT];
};

int envd_gz_new(struct pss *p)
{
    struct envd_gz *z = malloc(sizeof(*z));

    if (!z)
        return -ENOMEM;
    z->hold = NULL;
    z->hold_off = z->hold_len = z->hold_cap = 0;
    z->more = false;
    if (gunzip_init(&z->g, p->srv->cfg->upload_gzip_max)) {
        free(z);
        return -ENOMEM;
    }
    p->gz = z;
    return 0;
}

void envd_gz_free(struct pss *p)
{
    if (!p->gz)
        return;
    gunzip_free(&p->gz->g);
    free(p->gz->hold);
    free(p->gz);
    p->gz = NULL;
}

/* The upload cannot take more now: bytes wait for the sandbox, or for its resume. */
static bool blocked(const struct pss *p)
{
    return p->pend_len || http_phase_resuming(p->phase);
}

static bool answered(const struct pss *p)
{
    return p->status || !http_phase_op_live(p->phase);
}

static void gz_fail(struct pss *p, int err)
{
    char why[160];
    bool opened = http_phase_op_running(p->phase); /* the write has opened the file */

    if (err == -EFBIG)
        snprintf(why, sizeof(why), "the gzip body inflates past upload_gzip_max_bytes (%zu bytes)",
                 p->srv->cfg->upload_gzip_max);
    else
        snprintf(why, sizeof(why), "the body is not a complete gzip stream");
    LOG(LOG_INFO, "%s: gzip upload refused: %s", p->sbx, why);
    rest_upload_fail(p, err == -EFBIG ? 413 : 400, why);
    if (opened)
        envd_upload_discard(p);
}

/* Inflate in[0..n) into the upload until it is blocked. *left: the input bytes not
 * taken (held by the caller). 0, or -1 out of memory. */
static int run(struct pss *p, const unsigned char *in, size_t n, size_t *left)
{
    struct envd_gz *z = p->gz;

    *left = 0;
    for (;;) {
        size_t used, olen;
        int r = gunzip_feed(&z->g, in, n, &used, z->out, sizeof(z->out), &olen);

        in += used;
        n -= used;
        z->more = olen == sizeof(z->out);
        if (olen && rest_upload_bytes(p, z->out, olen))
            return -1;
        if (answered(p))
            return 0; /* refused midway (a bad multipart body, the sandbox's error) */
        if (r < 0) {
            gz_fail(p, r);
            return 0;
        }
        if (!n && !z->more)
            return 0;
        if (blocked(p)) {
            *left = n;
            return 0;
        }
    }
}

/* Keep in[0..n) behind what is held. 0, or -1 out of memory. */
static int hold(struct envd_gz *z, const unsigned char *in, size_t n)
{
    if (!n)
        return 0;
    if (z->hold_off + z->hold_len + n > z->hold_cap) {
        if (z->hold_len)
            memmove(z->hold, z->hold + z->hold_off, z->hold_len);
        z->hold_off = 0;
        if (z->hold_len + n > z->hold_cap) {
            unsigned char *nh = realloc(z->hold, z->hold_len + n);
            if (!nh)
                return -1;
            z->hold = nh;
            z->hold_cap = z->hold_len + n;
        }
    }
    memcpy(z->hold + z->hold_off + z->hold_len, in, n);
    z->hold_len += n;
    return 0;
}

static void pause_rx(struct pss *p)
{
    if (p->rx_paused)
        return;
    p->rx_paused = true;
    lws_rx_flow_control(p->wsi, 0);
}

bool envd_gz_held(const struct pss *p)
{
    return p->gz && (p->gz->hold_len || p->gz->more);
}

int envd_gz_bytes(struct pss *p, const unsigned char *in, size_t n)
{
    struct envd_gz *z = p->gz;
    size_t left;

    if (answered(p) || !n)
        return 0;
    if (envd_gz_held(p) || blocked(p)) {
        /* lws had more while reading was paused: behind what waits, compressed */
        if (hold(z, in, n))
            return -1;
        pause_rx(p);
        return 0;
    }
    if (run(p, in, n, &left))
        return -1;
    if (answered(p))
        return 0;
    if (left || z->more) {
        if (hold(z, in + n - left, left))
            return -1;
        pause_rx(p);
    }
    return 0;
}

void envd_gz_drain(struct pss *p)
{
    struct envd_gz *z = p->gz;
    size_t left;

    if (!envd_gz_held(p) || answered(p) || blocked(p))
        return;
    if (run(p, z->hold + z->hold_off, z->hold_len, &left)) {
        rest_upload_fail(p, 500, "out of memory inflating the upload");
        return;
    }
    z->hold_off += z->hold_len - left;
    z->hold_len = left;
    if (!left)
        z->hold_off = 0;
}

int envd_gz_end(struct pss *p)
{
    int r;

    if (envd_gz_held(p))
        return 1;
    if (p->status)
        return -1;
    if ((r = gunzip_finish(&p->gz->g))) {
        gz_fail(p, r);
        return -1;
    }
    return 0;
}
