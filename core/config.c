/*
 * config.c - warrend configuration: embedded defaults, file parser, flags.
 *
 * One table names every option, where it lives in struct srv_config, and
 * its default written exactly as in conf/warren.conf. cfg_defaults() feeds
 * that table through cfg_set(), so the defaults and the file share one
 * parser; tests/core/test_config.c checks the shipped file equals them.
 */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

enum opt_type {
    T_STR,
    T_UINT,
    T_SIZE,
    T_LISTEN,
    T_ACCEL,
    T_LEVEL,
    T_DIR_STATE,
    T_DIR_IMAGE,
    T_JAIL,
    T_BOOL,
    T_DIR_WEB,
    T_TMAP_NAME, /* "a=b c=d": template names to template names */
    T_TMAP_UINT  /* "a=768 b=512": template names to whole numbers >= min */
};

struct opt {
    const char *key;
    enum opt_type type;
    size_t offset;
    const char *def; /* as written in conf/warren.conf */
    unsigned long long min;
};

#define F(field) offsetof(struct srv_config, field)

/* The PATH's directories (every lookup of a command: entries and inodes) and python3's
 * start-up files, into the template's page cache and so every clone's (conf/warren.conf). */
#define WARMUP_DEFAULT                                                                             \
    "ls -l /bin /sbin /usr/bin /usr/sbin /usr/local/bin >/dev/null 2>&1; "                         \
    "python3 -c pass >/dev/null 2>&1; true"

static const struct opt opts[] = {
    {"listen", T_LISTEN, 0, "127.0.0.1:8080", 0},
    {"state_dir", T_DIR_STATE, F(state_dir), "", 0},
    {"api_key", T_STR, F(api_key), "", 0},
    {"image_dir", T_DIR_IMAGE, F(image_dir), "", 0},
    {"qemu", T_STR, F(qemu), "qemu-system-x86_64", 0},
    {"accel", T_ACCEL, F(accel), "auto", 0},
    {"tcg_translation_cache_mb", T_UINT, F(tcg_tb_mib), "128", 1},
    {"tcg_huge_pages", T_BOOL, F(tcg_huge_pages), "false", 0},
    {"log_level", T_LEVEL, F(log_level), "info", 0},
    {"max_sandboxes", T_UINT, F(max_sandboxes), "32", 1},
    {"default_memory_mb", T_UINT, F(default_memory_mb), "256", 1},
    {"min_memory_mb", T_UINT, F(min_memory_mb), "128", 1},
    {"max_memory_mb", T_UINT, F(max_memory_mb), "4096", 1},
    {"default_vcpus", T_UINT, F(default_vcpus), "1", 1},
    {"max_vcpus", T_UINT, F(max_vcpus), "4", 1},
    {"default_ttl_seconds", T_UINT, F(default_ttl_s), "300", 0},
    {"max_ttl_seconds", T_UINT, F(max_ttl_s), "86400", 1},
    {"default_idle_timeout_seconds", T_UINT, F(default_idle_s), "300", 0},
    {"boot_timeout_seconds", T_UINT, F(boot_timeout_s), "60", 1},
    {"ended_retention_seconds", T_UINT, F(ended_keep_s), "600", 0},
    {"max_json_body_bytes", T_SIZE, F(max_body_bytes), "1048576", 64},
    {"exec_max_output_bytes", T_SIZE, F(exec_max_output), "16777216", 1},
    {"console_log_bytes", T_SIZE, F(console_max_bytes), "1048576", 4096},
    {"default_template", T_STR, F(default_template), "base", 0},
    {"kernel_append", T_STR, F(kernel_append), "", 0},
    {"max_connections", T_UINT, F(max_connections), "4096", 1},
    {"max_connections_per_client", T_UINT, F(max_conn_per_client), "256", 1},
    {"header_timeout_seconds", T_UINT, F(header_timeout_s), "10", 1},
    {"stream_stall_timeout_seconds", T_UINT, F(stall_timeout_s), "60", 1},
    {"max_operations_per_sandbox", T_UINT, F(max_ops_per_sbx), "64", 1},
    {"max_operations", T_UINT, F(max_ops_total), "1024", 1},
    {"max_env_metadata_bytes", T_SIZE, F(max_env_meta_bytes), "65536", 2},
    {"memory_reserve_mb", T_UINT, F(mem_reserve_mb), "1024", 0},
    {"min_free_disk_mb", T_UINT, F(min_free_disk_mb), "1024", 0},
    {"protocol_violations_max", T_UINT, F(violations_max), "5", 1},
    {"channel_send_buffer_bytes", T_SIZE, F(chan_send_max), "8388608", 1048576},
    {"list_max_entries", T_UINT, F(list_max_entries), "10000", 1},
    {"list_max_bytes", T_SIZE, F(list_max_bytes), "4194304", 4096},
    {"qemu_log_bytes", T_SIZE, F(qemu_log_bytes), "262144", 4096},
    {"jail", T_JAIL, F(jail), "auto", 0},
    {"jail_uid_base", T_UINT, F(jail_uid_base), "200000", 1},
    {"jail_uid_count", T_UINT, F(jail_uid_count), "10000", 1},
    {"jail_cgroup", T_STR, F(jail_cgroup), "warren", 0},
    {"jail_uid_lock_dir", T_STR, F(jail_uid_lock_dir), "/run/warren/uids", 0},
    {"jail_memory_overhead_mb", T_UINT, F(jail_mem_overhead_mb), "256", 0},
    {"jail_pids_max", T_UINT, F(jail_pids_max), "512", 16},
    {"allow_tcg", T_BOOL, F(allow_tcg), "false", 0},
    {"process_ring_bytes", T_SIZE, F(process_ring_bytes), "1048576", 4096},
    {"max_processes_per_sandbox", T_UINT, F(max_procs_per_sbx), "64", 1},
    {"watch_max_per_sandbox", T_UINT, F(watch_max_per_sbx), "8", 1},
    {"watch_max_dirs", T_UINT, F(watch_max_dirs), "8192", 1},
    {"watch_coalesce_ms", T_UINT, F(watch_coalesce_ms), "100", 0},
    {"watch_line_max_bytes", T_SIZE, F(watch_line_max), "65536", 1024},
    {"upload_gzip_max_bytes", T_SIZE, F(upload_gzip_max), "1073741824", 1},
    {"allowed_origins", T_STR, F(allowed_origins), "", 0},
    {"session_max_sockets_per_sandbox", T_UINT, F(sess_max_sockets), "16", 1},
    {"session_max_requests", T_UINT, F(sess_max_requests), "64", 1},
    {"session_max_frame_bytes", T_SIZE, F(sess_max_frame), "1114112", 4096},
    {"session_send_queue_bytes", T_SIZE, F(sess_send_queue), "1048576", 65536},
    {"pty_socket_max_frame_bytes", T_SIZE, F(pty_max_frame), "65537", 16},
    {"pty_sockets_per_sandbox", T_UINT, F(pty_socks_per_sbx), "64", 1},
    {"pty_viewers_per_process", T_UINT, F(pty_viewers), "16", 1},
    {"pty_socket_input_queue", T_UINT, F(pty_ctl_queue), "64", 1},
    /* At least one guest window (1 MiB) and its frames: less would end honest sockets. */
    {"pty_socket_send_queue_bytes", T_SIZE, F(pty_send_queue), "2097152", 1179648},
    {"jupyter_kernelspecs", T_STR, F(jup_kernelspecs), "python3=code-interpreter", 0},
    {"jupyter_max_message_bytes", T_SIZE, F(jup_max_msg), "16777216", 4096},
    {"jupyter_send_queue_bytes", T_SIZE, F(jup_send_queue), "4194304", 65536},
    {"jupyter_input_queue_bytes", T_SIZE, F(jup_in_queue), "16777216", 65536},
    {"jupyter_sockets_per_kernel", T_UINT, F(jup_socks_per_kernel), "8", 1},
    {"jupyter_kernel_memory_mb", T_UINT, F(jup_memory_mb), "0", 0},
    {"run_code_max_line_bytes", T_SIZE, F(run_max_line), "16777216", 4096},
    {"run_code_max_gather_bytes", T_SIZE, F(run_max_gather), "33554432", 4096},
    {"run_code_keepalive_ms", T_UINT, F(run_keepalive_ms), "5000", 100},
    {"web_dir", T_DIR_WEB, F(web_dir), "", 0},
    {"freeze_after_ms", T_UINT, F(freeze_after_ms), "30000", 0},
    {"freeze_pageout_after_ms", T_UINT, F(freeze_pageout_after_ms), "300000", 0},
    {"pool_size", T_UINT, F(pool_size), "2", 0},
    {"pool_max_mb", T_UINT, F(pool_max_mb), "3072", 0},
    {"pool_spares", T_UINT, F(pool_spares), "1", 0},
    {"pool_spare_prefault_mb", T_UINT, F(pool_spare_prefault_mb), "12", 0},
    {"pool_template_warmup", T_STR, F(pool_template_warmup), WARMUP_DEFAULT, 0},
    {"pool_templates", T_STR, F(pool_templates), "", 0},
    {"pool_on_first_use", T_BOOL, F(pool_on_first_use), "true", 0},
    {"pool_max_templates", T_UINT, F(pool_max_templates), "4", 1},
    {"template_aliases", T_TMAP_NAME, F(template_aliases), "code-interpreter-v1=code-interpreter",
     0},
    {"template_memory_mb", T_TMAP_UINT, F(template_memory_mb), "code-interpreter=1024", 1},
    {"template_warm_timeout_seconds", T_UINT, F(template_warm_timeout_s), "600", 1},
    {"memory_overcommit_percent", T_UINT, F(mem_overcommit_pct), "100", 100},
    {"net_enabled", T_BOOL, F(net_enabled), "false", 0},
    {"net_default_internet", T_BOOL, F(net_default_internet), "true", 0},
    {"net_uplink", T_STR, F(net_uplink), "", 0},
    {"net_range", T_STR, F(net_range), "10.201.0.0/16", 0},
    {"net_dns_upstream", T_STR, F(net_dns_upstream), "", 0},
    {"net_ahead", T_UINT, F(net_ahead), "2", 0},
    {"fork_max", T_UINT, F(fork_max), "16", 1},
    {"paused_retention_s", T_UINT, F(paused_retention_s), "604800", 1},
    {"net_rate_mbit", T_UINT, F(net_rate_mbit), "0", 0},
    {"net_max_connections", T_UINT, F(net_max_connections), "0", 0},
    {"port_domain", T_STR, F(port_domain), "", 0},
    {"e2b_templates", T_STR, F(e2b_templates), "code-interpreter-v1=code-interpreter", 0},
    {"port_buffer_bytes", T_SIZE, F(port_buf_bytes), "262144", 4096},
    {"port_connections_per_sandbox", T_UINT, F(port_conns_per_sbx), "64", 1},
    {"port_connections", T_UINT, F(port_conns), "1024", 1},
    {"port_connect_timeout_ms", T_UINT, F(port_connect_ms), "5000", 100},
    {"port_idle_timeout_s", T_UINT, F(port_idle_s), "600", 1},
    {"host_id", T_STR, F(host_id), "", 0},
    {"api_key_file", T_STR, F(api_key_file), "", 0},
    {"token_secret_file", T_STR, F(token_secret_file), "", 0},
    {"fleet", T_BOOL, F(fleet), "false", 0},
    {"peers", T_STR, F(peers), "", 0},
    {"peers_dns", T_STR, F(peers_dns), "", 0},
    {"peers_dns_interval_seconds", T_UINT, F(peers_dns_period_s), "30", 1},
    {"peer_timeout_ms", T_UINT, F(peer_timeout_ms), "3000", 100},
    {"peer_answer_max_bytes", T_SIZE, F(peer_answer_max_bytes), "16777216", 4096},
    {"agent_check_port", T_UINT, F(agent_check_port), "0", 0},
    {"image_source", T_STR, F(image_source), "", 0},
    {"image_source_interval_seconds", T_UINT, F(image_source_period_s), "60", 1},
    {"image_source_max_bytes", T_SIZE, F(image_source_max_bytes), "17179869184", 1},
    {"image_source_timeout_seconds", T_UINT, F(image_source_timeout_s), "30", 1},
    {"e2b_stream_timeout_ms", T_UINT, F(e2b_stream_timeout_ms), "60000", 0},
};

static void set_err(char *err, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t cap, const char *fmt, ...)
{
    va_list ap;

    if (!err || !cap)
        return;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

static int replace_str(char **slot, const char *v)
{
    char *s = strdup(v);

    if (!s)
        return -ENOMEM;
    free(*slot);
    *slot = s;
    return 0;
}

static const char *home_dir(void)
{
    const char *h = getenv("HOME");
    struct passwd *pw;

    if (h && h[0])
        return h;
    pw = getpwuid(geteuid());
    return pw && pw->pw_dir ? pw->pw_dir : "/";
}

static int join_path(char **slot, const char *a, const char *b)
{
    char *s;

    if (asprintf(&s, "%s%s", a, b) < 0)
        return -ENOMEM;
    free(*slot);
    *slot = s;
    return 0;
}

static int default_state_dir(char **slot)
{
    const char *x = getenv("XDG_STATE_HOME");

    if (x && x[0] == '/')
        return join_path(slot, x, "/warren");
    if (geteuid() == 0)
        return replace_str(slot, "/var/lib/warren");
    return join_path(slot, home_dir(), "/.local/state/warren");
}

static int default_image_dir(char **slot)
{
    const char *x = getenv("WARREN_IMAGE_DIR");

    if (x && x[0])
        return replace_str(slot, x);
    return join_path(slot, home_dir(), "/.cache/warren/images/current");
}

static int default_web_dir(char **slot)
{
    const char *x = getenv("WARREN_WEB_DIR");

    if (x && x[0])
        return replace_str(slot, x);
    return join_path(slot, home_dir(), "/.cache/warren/npm/current/node_modules");
}

static int parse_ull(const char *v, unsigned long long max, unsigned long long *out);

/* A template name as a map of template_aliases or template_memory_mb holds it: what
 * sbx_template_name_ok accepts (letters, digits, '.', '_', '-'; not starting with '.'). */
static bool tmpl_word_ok(const char *s, size_t n)
{
    if (n == 0 || n >= 64 || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

/* Check "key=value key=value" (spaces or commas between entries): 0, or -EINVAL. */
static int tmap_check(const char *key, const char *v, bool num, unsigned long long min, char *err,
                      size_t errcap)
{
    while (*v) {
        size_t n = strcspn(v, " \t,"), k;
        const char *eq;

        if (n == 0) {
            v++;
            continue;
        }
        eq = memchr(v, '=', n);
        k = eq ? (size_t)(eq - v) : 0;
        if (!eq || !tmpl_word_ok(v, k) ||
            (num ? !(n - k - 1 > 0 && n - k - 1 < 11 && strspn(eq + 1, "0123456789") >= n - k - 1 &&
                     strtoull(eq + 1, NULL, 10) >= min)
                 : !tmpl_word_ok(eq + 1, n - k - 1))) {
            set_err(err, errcap, "%s: expected template=%s entries, got '%.*s'", key,
                    num ? "number" : "template", (int)n, v);
            return -EINVAL;
        }
        v += n;
    }
    return 0;
}

const char *cfg_tmap_get(const char *map, const char *name, char *out, size_t cap)
{
    size_t len = strlen(name);

    for (const char *v = map ? map : ""; *v;) {
        size_t n = strcspn(v, " \t,");
        const char *eq = memchr(v, '=', n);

        if (eq && (size_t)(eq - v) == len && memcmp(v, name, len) == 0 && n - len - 1 < cap) {
            memcpy(out, eq + 1, n - len - 1);
            out[n - len - 1] = '\0';
            return out;
        }
        v += n ? n : 1;
    }
    return NULL;
}

unsigned cfg_template_memory_mb(const struct srv_config *c, const char *tmpl)
{
    char v[16];
    unsigned long long n;

    if (!cfg_tmap_get(c->template_memory_mb, tmpl, v, sizeof(v)) || parse_ull(v, UINT_MAX, &n))
        return c->default_memory_mb;
    /* Within the bounds a create's own memory_mb must keep. */
    if (n < c->min_memory_mb)
        n = c->min_memory_mb;
    if (n > c->max_memory_mb)
        n = c->max_memory_mb;
    return (unsigned)n;
}

/* Decimal only: no sign, no spaces, no suffix, no overflow. */
static int parse_ull(const char *v, unsigned long long max, unsigned long long *out)
{
    unsigned long long n;
    char *end;

    if (v[0] < '0' || v[0] > '9')
        return -EINVAL;
    errno = 0;
    n = strtoull(v, &end, 10);
    if (errno || *end || n > max)
        return -EINVAL;
    *out = n;
    return 0;
}

/* ADDR:PORT with ADDR a numeric IPv4 address, [IPv6] or localhost. */
static int parse_listen(struct srv_config *c, const char *v, char *err, size_t cap)
{
    char addr[INET6_ADDRSTRLEN + 1];
    unsigned char sa[sizeof(struct in6_addr)];
    unsigned long long port;
    const char *colon, *a = v;
    size_t alen;
    bool v6 = false;

    if (v[0] == '[') {
        const char *rb = strchr(v, ']');
        if (!rb || rb[1] != ':')
            goto bad;
        a = v + 1;
        alen = (size_t)(rb - a);
        colon = rb + 1;
        v6 = true;
    } else {
        colon = strrchr(v, ':');
        if (!colon)
            goto bad;
        alen = (size_t)(colon - v);
    }
    if (alen == 0 || alen >= sizeof(addr))
        goto bad;
    memcpy(addr, a, alen);
    addr[alen] = '\0';
    if (!v6 && strcmp(addr, "localhost") == 0)
        strcpy(addr, "127.0.0.1");
    if (inet_pton(v6 ? AF_INET6 : AF_INET, addr, sa) != 1)
        goto bad;
    if (parse_ull(colon + 1, 65535, &port))
        goto bad;
    if (replace_str(&c->listen_addr, addr))
        return -ENOMEM;
    c->listen_port = (unsigned)port;
    return 0;
bad:
    set_err(err, cap,
            "listen: expected ADDR:PORT with a numeric IPv4 address, [IPv6] or "
            "localhost, got '%s'",
            v);
    return -EINVAL;
}

int cfg_set(struct srv_config *c, const char *key, const char *value, char *err, size_t errcap)
{
    const struct opt *o = NULL;
    unsigned long long n;
    enum log_level lvl;
    void *slot;

    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
        if (strcmp(opts[i].key, key) == 0) {
            o = &opts[i];
            break;
        }
    }
    if (!o) {
        set_err(err, errcap, "unknown option '%s'", key);
        return -EINVAL;
    }
    slot = (char *)c + o->offset;
    switch (o->type) {
    case T_LISTEN:
        return parse_listen(c, value, err, errcap);
    case T_STR:
        return replace_str(slot, value);
    case T_TMAP_NAME:
    case T_TMAP_UINT:
        if (tmap_check(key, value, o->type == T_TMAP_UINT, o->min, err, errcap))
            return -EINVAL;
        return replace_str(slot, value);
    case T_DIR_STATE:
    case T_DIR_IMAGE:
    case T_DIR_WEB:
        if (!value[0])
            return o->type == T_DIR_STATE   ? default_state_dir(slot)
                   : o->type == T_DIR_IMAGE ? default_image_dir(slot)
                                            : default_web_dir(slot);
        if (value[0] != '/') {
            set_err(err, errcap, "%s must be an absolute path, got '%s'", key, value);
            return -EINVAL;
        }
        return replace_str(slot, value);
    case T_ACCEL:
        if (strcmp(value, "auto") && strcmp(value, "kvm") && strcmp(value, "tcg")) {
            set_err(err, errcap, "accel must be auto, kvm or tcg, got '%s'", value);
            return -EINVAL;
        }
        return replace_str(slot, value);
    case T_JAIL:
        if (strcmp(value, "auto") && strcmp(value, "required") && strcmp(value, "off")) {
            set_err(err, errcap, "jail must be auto, required or off, got '%s'", value);
            return -EINVAL;
        }
        return replace_str(slot, value);
    case T_BOOL:
        if (strcmp(value, "true") && strcmp(value, "false")) {
            set_err(err, errcap, "%s must be true or false, got '%s'", key, value);
            return -EINVAL;
        }
        *(unsigned *)slot = strcmp(value, "true") == 0;
        return 0;
    case T_LEVEL:
        if (log_parse_level(value, &lvl)) {
            set_err(err, errcap, "log_level must be error, warn, info or debug, got '%s'", value);
            return -EINVAL;
        }
        return replace_str(slot, value);
    case T_UINT:
    case T_SIZE:
        if (parse_ull(value, o->type == T_UINT ? UINT_MAX : SIZE_MAX, &n) || n < o->min) {
            set_err(err, errcap, "%s: expected a whole number >= %llu, got '%s'", key, o->min,
                    value);
            return -EINVAL;
        }
        if (o->type == T_UINT)
            *(unsigned *)slot = (unsigned)n;
        else
            *(size_t *)slot = (size_t)n;
        return 0;
    }
    return -EINVAL;
}

int cfg_defaults(struct srv_config *c)
{
    memset(c, 0, sizeof(*c));
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
        int r = cfg_set(c, opts[i].key, opts[i].def, NULL, 0);
        if (r) {
            cfg_free(c);
            return r == -ENOMEM ? -ENOMEM : -EINVAL;
        }
    }
    c->http_timeout_s = 30;
    return 0;
}

static char *trim(char *s)
{
    char *e;

    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\n' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

int cfg_load_file(struct srv_config *c, const char *path, char *err, size_t errcap)
{
    char msg[256];
    char *line = NULL;
    size_t cap = 0;
    unsigned lineno = 0;
    ssize_t len;
    FILE *f;
    int r = 0;

    f = fopen(path, "re");
    if (!f) {
        r = -errno;
        set_err(err, errcap, "%s: %s", path, strerror(errno));
        return r;
    }
    while ((len = getline(&line, &cap, f)) >= 0) {
        char *s, *eq, *key, *val;

        lineno++;
        if (memchr(line, '\0', (size_t)len)) {
            set_err(err, errcap, "%s:%u: NUL byte in line", path, lineno);
            r = -EINVAL;
            goto out;
        }
        s = trim(line);
        if (!s[0] || s[0] == '#')
            continue;
        eq = strchr(s, '=');
        if (!eq) {
            set_err(err, errcap, "%s:%u: expected 'key = value'", path, lineno);
            r = -EINVAL;
            goto out;
        }
        *eq = '\0';
        key = trim(s);
        val = trim(eq + 1);
        r = cfg_set(c, key, val, msg, sizeof(msg));
        if (r) {
            set_err(err, errcap, "%s:%u: %s", path, lineno, r == -ENOMEM ? "out of memory" : msg);
            r = r == -ENOMEM ? -ENOMEM : -EINVAL;
            goto out;
        }
    }
    if (ferror(f)) {
        r = -EIO;
        set_err(err, errcap, "%s: read error", path);
    }
out:
    free(line);
    fclose(f);
    return r;
}

void cfg_free(struct srv_config *c)
{
    free(c->listen_addr);
    free(c->state_dir);
    free(c->api_key);
    free(c->image_dir);
    free(c->qemu);
    free(c->accel);
    free(c->log_level);
    free(c->default_template);
    free(c->kernel_append);
    free(c->pool_template_warmup);
    free(c->pool_templates);
    free(c->template_aliases);
    free(c->template_memory_mb);
    free(c->jail);
    free(c->jail_cgroup);
    free(c->jail_uid_lock_dir);
    free(c->allowed_origins);
    free(c->web_dir);
    free(c->jup_kernelspecs);
    free(c->net_uplink);
    free(c->net_range);
    free(c->net_dns_upstream);
    free(c->port_domain);
    free(c->host_id);
    free(c->peers);
    free(c->peers_dns);
    free(c->image_source);
    free(c->api_key_file);
    free(c->token_secret_file);
    free(c->e2b_templates);
    memset(c, 0, sizeof(*c));
}

bool cfg_host_id_valid(const char *id)
{
    size_t n = strlen(id);

    if (n < 1 || n > CFG_HOST_ID_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9')))
            return false;
    return true;
}

/*
 * A StatefulSet names its pods NAME-ORDINAL: the ordinal is what tells them
 * apart, so "warren-2" becomes "h2". Any other name keeps its letters and
 * digits, lowercased, cut to the limit ("Node-A.example" -> "nodeaexample").
 */
int cfg_host_id_from_name(const char *name, char out[CFG_HOST_ID_MAX + 1])
{
    const char *dash = strrchr(name, '-');
    size_t n = 0;

    if (dash && dash[1] && strspn(dash + 1, "0123456789") == strlen(dash + 1) &&
        strlen(dash + 1) < CFG_HOST_ID_MAX) {
        snprintf(out, CFG_HOST_ID_MAX + 1, "h%s", dash + 1);
        return 0;
    }
    for (; *name && n < CFG_HOST_ID_MAX; name++) {
        char ch = *name;
        if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))
            out[n++] = ch;
    }
    out[n] = '\0';
    return n ? 0 : -EINVAL;
}

int cfg_resolve_host_id(struct srv_config *c, char *err, size_t errcap)
{
    char id[CFG_HOST_ID_MAX + 1], name[256];
    const char *env = getenv("WARREN_HOST_ID");

    if (!c->host_id || !c->host_id[0]) {
        if (env && env[0]) {
            /* A valid id as it is; else a name to derive one from (a pod's name
             * passed by the downward API: "warren-2" -> "h2"). */
            if (cfg_host_id_valid(env))
                snprintf(id, sizeof(id), "%s", env);
            else if (cfg_host_id_from_name(env, id)) {
                set_err(err, errcap, "WARREN_HOST_ID '%s': no host id in it", env);
                return -EINVAL;
            }
        } else {
            if (gethostname(name, sizeof(name) - 1))
                snprintf(name, sizeof(name), "h0");
            name[sizeof(name) - 1] = '\0';
            if (cfg_host_id_from_name(name, id))
                snprintf(id, sizeof(id), "h0");
        }
        if (replace_str(&c->host_id, id))
            return -ENOMEM;
    }
    if (!cfg_host_id_valid(c->host_id)) {
        set_err(err, errcap, "host_id '%s': want 1 to %d of a-z and 0-9", c->host_id,
                CFG_HOST_ID_MAX);
        return -EINVAL;
    }
    return 0;
}
