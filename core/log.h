/*
 * log.h - one logging macro for warrend. The level is checked before any
 * formatting. Lines about a sandbox name it: LOGS(level, sandbox_id, ...).
 */
#ifndef WARREN_LOG_H
#define WARREN_LOG_H

enum log_level { LOG_ERR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };
extern enum log_level log_max;

void log_emit(enum log_level lvl, const char *sbx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int log_parse_level(const char *s, enum log_level *out);

#define LOGS(lvl, sbx, ...)                                                                        \
    do {                                                                                           \
        if ((lvl) <= log_max)                                                                      \
            log_emit((lvl), (sbx), __VA_ARGS__);                                                   \
    } while (0)
#define LOG(lvl, ...) LOGS(lvl, NULL, __VA_ARGS__)

#endif
