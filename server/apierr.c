/* apierr.c - the one shape of every API error body (declared in api.h). */
#include "api.h"
#include "sbx_err.h"

#include <stdarg.h>
#include <stdio.h>

json_t *api_error(const char *code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return json_pack("{s:{s:s,s:s}}", "error", "code", code, "message", msg);
}

json_t *api_error_of(const struct sbx_err *e)
{
    return api_error(sbx_err_name(e->code), "%s", e->msg);
}
