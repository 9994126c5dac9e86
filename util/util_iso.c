/* util_iso.c - ISO-8601 UTC times (util.h). */
#include <stdio.h>
#include <time.h>

#include "util.h"

size_t util_iso_time(int64_t s, int ms, char *buf, size_t cap)
{
    struct tm tm;
    time_t tt;
    int n;

    if (!buf || cap == 0)
        return 0;
    buf[0] = '\0';
    if (ms > 999)
        ms = 999;
    if (s < UTIL_ISO_MIN_S) {
        s = UTIL_ISO_MIN_S;
        ms = ms < 0 ? ms : 0;
    } else if (s > UTIL_ISO_MAX_S) {
        s = UTIL_ISO_MAX_S;
        ms = ms < 0 ? ms : 999;
    }
    tt = (time_t)s;
    /* Checked although the clamp makes it unreachable: an unchecked failure once
     * left a buffer unterminated. */
    if (!gmtime_r(&tt, &tm))
        return 0;
    if (ms < 0)
        n = snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    else
        n = snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
    if (n < 0 || (size_t)n >= cap) {
        buf[0] = '\0';
        return 0;
    }
    return (size_t)n;
}

size_t util_iso_time_ms(int64_t ms, char *buf, size_t cap)
{
    /* Floored, so a negative time keeps a fraction in 0..999. */
    int64_t s = ms / 1000, f = ms % 1000;

    if (f < 0) {
        s--;
        f += 1000;
    }
    return util_iso_time(s, (int)f, buf, cap);
}
