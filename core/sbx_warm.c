/*
 * sbx_warm.c - a template's warm hook on a cold boot (docs/KERNELD.md).
 *
 * An image may hold an executable /etc/warren/warm: what it starts (a live
 * kernel, a language server) is what its sandboxes are for, so it runs before
 * a sandbox is handed out. The pool runs it in the template VM before the
 * snapshot (pool.c), so a clone has it for free; a create that boots runs it
 * here, between the guest's first HELLO and the create's answer: the sandbox
 * stays STARTING, the create waits, and a hook that fails or outlives
 * template_warm_timeout_seconds makes the sandbox dead with a reason naming
 * it. An image without the hook costs one EXEC that fails with ENOENT.
 */
#include "sbx_int.h"
#include "chan.h"
#include "log.h"
#include "proto.h"

#include <errno.h>
#include <string.h>

#define WARM_HOOK    "/etc/warren/warm"
#define WARM_SLACK_S 10 /* the host's bound past the guest's own timeout of the hook */

bool sbx_warm_start(struct sandbox *sb)
{
    const struct srv_config *c = sb->t->cfg;
    struct proto_enc e;

    if (sb->warm_done || !sb->vmr || strcmp(sb->vmr->boot, "kernel") != 0 || !sb->ch)
        return false;
    sb->warm_stream = ++sb->next_stream;
    sb->warm_nout = 0;
    sb->warm_start = sbx_now_ms();
    proto_enc_begin(&e, chan_tx(sb->ch), PROTO_EXEC, sb->warm_stream, 7); /* t, id and 5 keys */
    proto_enc_key(&e, PK_ARGV);
    msgpack_pack_array(&e.pk, 1);
    msgpack_pack_str_with_body(&e.pk, WARM_HOOK, strlen(WARM_HOOK));
    proto_enc_key(&e, PK_ENV);
    msgpack_pack_map(&e.pk, 0);
    proto_put_cstr(&e, PK_USER, "root");
    proto_put_b(&e, PK_STDIN, false);
    proto_put_u(&e, PK_TIMEOUT, (uint64_t)c->template_warm_timeout_s * 1000u);
    proto_enc_end(&e);
    chan_flush(sb->ch);
    /* The boot timer, stopped by the HELLO, now bounds the hook (on_boot_timeout). */
    ev_timer_stop(sb->t->loop, &sb->boot_timer);
    ev_timer_set(&sb->boot_timer, (double)c->template_warm_timeout_s + WARM_SLACK_S, 0);
    ev_timer_start(sb->t->loop, &sb->boot_timer);
    return true;
}

bool sbx_warm_frame(struct sandbox *sb, const struct proto_frame *f)
{
    int64_t code;
    bool timed_out;
    char why[256];

    if (!sb->warm_stream || f->id != sb->warm_stream)
        return false;
    if (f->type == PROTO_OUT && proto_has(f, PK_DATA)) {
        /* Dropped but for its first bytes (the reason of a failure), its credit given back:
         * a hook that prints a lot must not stall on the window. */
        size_t n = f->v[PK_DATA].s.len, room = sizeof(sb->warm_out) - 1 - sb->warm_nout;
        memcpy(sb->warm_out + sb->warm_nout, f->v[PK_DATA].s.p, n < room ? n : room);
        sb->warm_nout += n < room ? n : room;
        if (sb->ch && proto_send_credit(chan_tx(sb->ch), f->id, n) == 0)
            chan_flush(sb->ch);
        return true;
    }
    if (f->type != PROTO_EXIT && f->type != PROTO_ERROR)
        return true;
    code = proto_has(f, PK_CODE) ? f->v[PK_CODE].i : -1;
    timed_out = proto_has(f, PK_TIMED_OUT) && f->v[PK_TIMED_OUT].b;
    sb->warm_stream = 0;
    ev_timer_stop(sb->t->loop, &sb->boot_timer);
    /* No hook in the image (ENOENT), or not an executable one (EACCES): nothing to warm. */
    if ((f->type == PROTO_ERROR && (code == ENOENT || code == EACCES)) ||
        (f->type == PROTO_EXIT && code == 0 && !timed_out)) {
        if (f->type == PROTO_EXIT)
            LOGS(LOG_INFO, sb->id, "%s ran in %lld ms", WARM_HOOK,
                 (long long)(sbx_now_ms() - sb->warm_start));
        sb->warm_done = true;
        sbx_ready_again(sb);
        return true;
    }
    for (size_t i = 0; i < sb->warm_nout; i++) /* one line of the log and of the reason */
        if ((unsigned char)sb->warm_out[i] < 0x20 || (unsigned char)sb->warm_out[i] > 0x7e)
            sb->warm_out[i] = ' ';
    sb->warm_out[sb->warm_nout] = '\0';
    if (f->type == PROTO_ERROR)
        snprintf(why, sizeof(why), "warm_failed: %s could not start: %s", WARM_HOOK,
                 strerror((int)code));
    else if (timed_out)
        snprintf(why, sizeof(why),
                 "warm_failed: %s did not finish within template_warm_timeout_seconds = %u",
                 WARM_HOOK, sb->t->cfg->template_warm_timeout_s);
    else
        snprintf(why, sizeof(why), "warm_failed: %s exited %lld: %s", WARM_HOOK, (long long)code,
                 sb->warm_out);
    LOGS(LOG_WARN, sb->id, "%s", why);
    sbx_die(sb, why);
    return true;
}

const char *sbx_warm_timeout_reason(struct sandbox *sb)
{
    return sb->warm_stream ? "warm_failed: " WARM_HOOK " did not answer in time" : NULL;
}
