/*
 * main.c - warrend: assemble config, API key, sandbox table and HTTP
 * server on one libev loop, and own signals and the shutdown order.
 *
 * Shutdown (SIGINT/SIGTERM): the HTTP server goes first, so every request
 * cancels its operation while the table still exists; then the table is
 * freed with kill_vms=false, leaving the VMs running for the next warrend
 * to adopt; then the loop stops.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <ev.h>

#include "agent_check.h"
#include "images_src.h"
#include "config.h"
#include "cred.h"
#include "http.h"
#include "log.h"
#include "sbx.h"
#include "token.h"
#include "util.h"
#include "vmm.h"

#ifndef WARREN_VERSION
#define WARREN_VERSION "0.1.0"
#endif

#define KEY_BYTES 32
#define KEY_MIN   32 /* characters of a configured key */

struct daemon {
    struct ev_loop *loop;
    struct sbx_table *t;
    struct http_server *h;
    struct agent_check *ac;  /* HAProxy agent check, or NULL */
    struct images_src *imgs; /* image hashes, and the fill from image_source */
    ev_signal sigint, sigterm;
};

static void usage(FILE *f)
{
    fprintf(f, "usage: warrend [--config FILE] [--listen ADDR:PORT] [--state-dir DIR]\n"
               "               [--image-dir DIR] [--log-level error|warn|info|debug]\n"
               "               [--check-config] [--publish-images DIR] [--help] [--version]\n"
               "\n"
               "Serves the Warren REST API (default http://127.0.0.1:8080). Options are read\n"
               "from the embedded defaults (= conf/warren.conf), then FILE, then the flags.\n"
               "--check-config reads and checks them, prints the host id, and exits.\n"
               "--publish-images DIR writes image_dir's files into DIR as an image source\n"
               "(DIR/index, DIR/blobs/sha256-<hex>; see image_source) and exits.\n");
}

/* mkdir -p; directories it creates get mode (0700 for state; images are world-readable
 * as images/build.sh makes them, for the jailed QEMUs). */
static int mkdir_p(const char *path, mode_t mode)
{
    char buf[4096];
    size_t n = strlen(path);

    if (n == 0 || n >= sizeof(buf))
        return -ENAMETOOLONG;
    memcpy(buf, path, n + 1);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, mode) && errno != EEXIST)
                return -errno;
            *p = c;
            if (!c)
                break;
        }
    }
    return 0;
}

/* Read a key file: one line of at least 16 printable characters, in a file only
 * warrend's user can read (0600 or stricter) and owns. Anything looser is refused:
 * whoever can read it owns every sandbox. */
static int read_key(const char *path, bool follow, char **out)
{
    char buf[512];
    struct stat st;
    ssize_t n;
    int fd, r = 0;

    fd = open(path, O_RDONLY | O_CLOEXEC | (follow ? 0 : O_NOFOLLOW));
    if (fd < 0)
        return -errno;
    if (fstat(fd, &st) != 0) {
        r = -errno;
        goto out;
    }
    if ((st.st_mode & 077) || st.st_uid != geteuid()) {
        LOG(LOG_ERR,
            "%s must be owned by warrend's user (uid %u) and readable by it alone; it is mode "
            "%04o, uid %u: chown it and chmod 600 it",
            path, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        r = -EPERM;
        goto out;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    if (n < 0) {
        r = -errno;
        goto out;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        n--;
    buf[n] = '\0';
    if (n < 16 || strcspn(buf, " \t\r\n") != (size_t)n) {
        LOG(LOG_ERR, "%s does not hold an API key (one line, 16+ characters)", path);
        r = -EINVAL;
        goto out;
    }
    if (!(*out = strdup(buf)))
        r = -ENOMEM;
out:
    close(fd);
    return r;
}

/* The configured key, else state_dir/api_key, else a new one written there. */
static int load_api_key(const struct srv_config *cfg, char **out)
{
    unsigned char raw[KEY_BYTES];
    char hex[2 * KEY_BYTES + 2], *path = NULL;
    int fd = -1, r;

    if (cfg->api_key && cfg->api_key[0]) {
        LOG(LOG_INFO, "API key: from the configuration");
        return (*out = strdup(cfg->api_key)) ? 0 : -ENOMEM;
    }
    /* A file the operator named (a mounted Secret: its files are symlinks): read, never
     * created, so every host of a fleet has the same key or none starts. */
    if (cfg->api_key_file && cfg->api_key_file[0]) {
        r = read_key(cfg->api_key_file, true, out);
        if (r)
            LOG(LOG_ERR, "api_key_file %s: %s", cfg->api_key_file, strerror(-r));
        else
            LOG(LOG_INFO, "API key: %s", cfg->api_key_file);
        return r;
    }
    if (asprintf(&path, "%s/api_key", cfg->state_dir) < 0)
        return -ENOMEM;
    r = read_key(path, false, out);
    if (r != -ENOENT) {
        if (!r)
            LOG(LOG_INFO, "API key: %s", path);
        goto out;
    }
    r = util_random_bytes("warrend api key", raw, sizeof(raw));
    if (r) {
        LOG(LOG_ERR, "cannot get random bytes for the API key (mbedTLS entropy)");
        goto out;
    }
    for (size_t i = 0; i < sizeof(raw); i++)
        sprintf(hex + 2 * i, "%02x", raw[i]);
    hex[2 * KEY_BYTES] = '\n';
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 && errno == EEXIST) {
        r = read_key(path, false, out); /* another warrend won the race */
        goto out;
    }
    if (fd < 0 || write(fd, hex, 2 * KEY_BYTES + 1) != 2 * KEY_BYTES + 1 || fsync(fd)) {
        r = -errno;
        LOG(LOG_ERR, "cannot write %s: %s", path, strerror(errno));
        if (fd >= 0)
            unlink(path);
        goto out;
    }
    hex[2 * KEY_BYTES] = '\0';
    if (!(*out = strdup(hex))) {
        r = -ENOMEM;
        goto out;
    }
    LOG(LOG_INFO, "API key: created %s (mode 0600); send it as 'Authorization: Bearer <key>'",
        path);
    r = 0;
out:
    if (fd >= 0)
        close(fd);
    free(path);
    return r;
}

/* state_dir/e2b_api_key: the key as E2B's SDKs want it (cred_e2b_key), rewritten at
 * every start so it follows the key. Best effort: the E2B door accepts that spelling
 * whether or not the file could be written. */
static void write_e2b_key(const char *state_dir, const char *key)
{
    char *path = NULL, *tmp = NULL, *e = malloc(4 + 2 * strlen(key) + 2);
    int fd = -1, n = e ? cred_e2b_key(key, e, 4 + 2 * strlen(key) + 1) : -1;

    if (n < 0 || asprintf(&path, "%s/e2b_api_key", state_dir) < 0 ||
        asprintf(&tmp, "%s/.e2b_api_key.tmp", state_dir) < 0)
        goto out;
    e[n++] = '\n';
    unlink(tmp);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0 || write(fd, e, (size_t)n) != n || fsync(fd) || rename(tmp, path)) {
        LOG(LOG_WARN, "cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        goto out;
    }
    LOG(LOG_INFO, "E2B API key: %s (send it as X-API-KEY, or E2B_API_KEY to E2B's SDKs)", path);
out:
    if (fd >= 0)
        close(fd);
    if (e)
        explicit_bzero(e, 4 + 2 * strlen(key) + 2);
    free(e);
    free(path);
    free(tmp);
}

/* state_dir/token_secret: the HMAC key of access tokens, 32 random bytes made at first
 * start. Like the API key file, it must be warrend's own and readable by nobody else
 * (whoever reads it can mint a token for any sandbox); a file of any other size is
 * refused rather than guessed at. */
static int load_token_secret(const struct srv_config *cfg, unsigned char out[TOKEN_SECRET_LEN])
{
    unsigned char extra;
    char *path = NULL;
    struct stat st;
    int fd = -1, r;
    ssize_t n;
    /* A named file (a fleet's shared Secret) is read as it is, following its symlinks,
     * and never created: a host without it must not mint tokens the others reject. */
    bool named = cfg->token_secret_file && cfg->token_secret_file[0];

    if (named ? !(path = strdup(cfg->token_secret_file))
              : asprintf(&path, "%s/token_secret", cfg->state_dir) < 0)
        return -ENOMEM;
    fd = open(path, O_RDONLY | O_CLOEXEC | (named ? 0 : O_NOFOLLOW));
    if (fd < 0 && errno == ENOENT && !named) {
        if ((r = util_random_bytes("warrend api key", out, TOKEN_SECRET_LEN))) {
            LOG(LOG_ERR, "cannot get random bytes for the token secret (mbedTLS entropy)");
            goto out;
        }
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0) {
            if (write(fd, out, TOKEN_SECRET_LEN) != TOKEN_SECRET_LEN || fsync(fd)) {
                r = errno ? -errno : -EIO;
                LOG(LOG_ERR, "cannot write %s: %s", path, strerror(-r));
                unlink(path);
                goto out;
            }
            LOG(LOG_INFO, "token secret: created %s (mode 0600)", path);
            r = 0;
            goto out;
        }
        if (errno == EEXIST) /* another warrend won the race: read its secret */
            fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    }
    if (fd < 0) {
        r = -errno;
        LOG(LOG_ERR, "cannot open %s: %s", path, strerror(errno));
        goto out;
    }
    if (fstat(fd, &st) != 0) {
        r = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || st.st_uid != geteuid()) {
        LOG(LOG_ERR,
            "%s must be a file owned by warrend's user (uid %u) and readable by it alone; it "
            "is mode %04o, uid %u: chown it and chmod 600 it",
            path, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        r = -EPERM;
        goto out;
    }
    if (named && (st.st_size == 2 * TOKEN_SECRET_LEN || st.st_size == 2 * TOKEN_SECRET_LEN + 1)) {
        /* A Secret written by hand: 64 hex digits (and a newline) rather than raw bytes. */
        char hex[2 * TOKEN_SECRET_LEN + 1];
        n = read(fd, hex, sizeof(hex));
        if (n == st.st_size && (n == 2 * TOKEN_SECRET_LEN || hex[n - 1] == '\n') &&
            util_hex_decode(hex, 2 * TOKEN_SECRET_LEN, out, TOKEN_SECRET_LEN) == 0) {
            explicit_bzero(hex, sizeof(hex));
            goto done;
        }
        explicit_bzero(hex, sizeof(hex));
        LOG(LOG_ERR, "%s must hold 32 bytes, or 64 hex digits", path);
        r = -EINVAL;
        goto out;
    }
    n = read(fd, out, TOKEN_SECRET_LEN);
    if (n != TOKEN_SECRET_LEN || st.st_size != TOKEN_SECRET_LEN || read(fd, &extra, 1) != 0) {
        LOG(LOG_ERR,
            "%s must hold exactly %d bytes; it holds %lld: remove it to have a new one made "
            "(tokens issued so far stop working)",
            path, TOKEN_SECRET_LEN, (long long)st.st_size);
        r = -EINVAL;
        goto out;
    }
done:
    LOG(LOG_INFO, "token secret: %s", path);
    r = 0;
out:
    if (r)
        explicit_bzero(out, TOKEN_SECRET_LEN);
    if (fd >= 0)
        close(fd);
    free(path);
    return r;
}

static int check_limits(const struct srv_config *c)
{
    const char *why = NULL;

    if (c->min_memory_mb > c->default_memory_mb || c->default_memory_mb > c->max_memory_mb)
        why = "need min_memory_mb <= default_memory_mb <= max_memory_mb";
    else if (c->default_vcpus > c->max_vcpus)
        why = "need default_vcpus <= max_vcpus";
    else if (c->default_ttl_s > c->max_ttl_s)
        why = "need default_ttl_seconds <= max_ttl_seconds";
    else if (c->api_key && c->api_key[0] && strlen(c->api_key) < KEY_MIN)
        why = "api_key must be at least 32 characters (leave it empty to use a generated one)";
    if (!why && c->image_source && c->image_source[0]) {
        static char werr[400];
        struct imgsrc_where *w = malloc(sizeof(*w));
        if (!w || imgsrc_where_parse(c->image_source, w, werr, sizeof(werr)))
            why = w ? werr : "out of memory";
        free(w);
    }
    if (why)
        LOG(LOG_ERR, "configuration: %s", why);
    return why ? -EINVAL : 0;
}

/* The state directory holds the API key, the index and every VM's disk: it must be
 * warrend's own and writable by nobody else, or another user could swap any of them. */
static int check_state_dir(const char *dir)
{
    struct stat st;

    if (stat(dir, &st) != 0) {
        LOG(LOG_ERR, "state directory %s: %s", dir, strerror(errno));
        return -errno;
    }
    if (st.st_uid != geteuid() || (st.st_mode & 022)) {
        LOG(LOG_ERR,
            "state directory %s must be owned by warrend's user (uid %u) and writable by it "
            "alone; it is mode %04o, uid %u: chown it and chmod 700 it",
            dir, (unsigned)geteuid(), (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid);
        return -EPERM;
    }
    return 0;
}

static bool is_loopback(const char *addr)
{
    struct in_addr a4;
    struct in6_addr a6;

    if (inet_pton(AF_INET, addr, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    return inet_pton(AF_INET6, addr, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

static void log_accel(const struct srv_config *cfg, bool *fatal, enum vmm_accel *out)
{
    char why[256] = "";
    enum vmm_accel a;

    *fatal = false;
    if (strcmp(cfg->accel, "tcg") == 0) {
        a = VMM_ACCEL_TCG;
        snprintf(why, sizeof(why), "accel = tcg in the configuration");
    } else {
        a = vmm_detect_accel(why, sizeof(why));
        if (strcmp(cfg->accel, "kvm") == 0 && a != VMM_ACCEL_KVM) {
            LOG(LOG_ERR, "accel = kvm, but KVM is not usable here: %s", why);
            *fatal = true;
            return;
        }
    }
    *out = a;
    if (a == VMM_ACCEL_KVM) {
        LOG(LOG_INFO, "accelerator: kvm (%s)", why);
        return;
    }
    LOG(LOG_INFO, "accelerator: tcg (%s)", why);
    LOG(LOG_WARN, "WARNING: TCG is a development mode: QEMU's security guarantees cover KVM "
                  "guests only; do not run untrusted code in sandboxes on this host");
}

static void raise_nofile(void)
{
    struct rlimit rl;

    /* Every connection and every VM channel is an fd: use what the hard limit allows. */
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl))
            LOG(LOG_WARN, "cannot raise the open-file limit: %s", strerror(errno));
    }
}

static void on_signal(struct ev_loop *loop, ev_signal *w, int revents)
{
    struct daemon *d = w->data;

    LOG(LOG_INFO, "signal %d: shutting down (sandboxes keep running for the next warrend)",
        w->signum);
    agent_check_stop(d->ac);
    d->ac = NULL;
    http_stop(d->h);
    d->h = NULL;
    images_src_stop(d->imgs);
    d->imgs = NULL;
    sbx_table_free(d->t, false);
    d->t = NULL;
    ev_signal_stop(loop, &d->sigint);
    ev_signal_stop(loop, &d->sigterm);
    ev_break(loop, EVBREAK_ALL);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"state-dir", required_argument, NULL, 's'},
        {"image-dir", required_argument, NULL, 'i'},
        {"log-level", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"check-config", no_argument, NULL, 't'},
        {"publish-images", required_argument, NULL, 'P'},
        {NULL, 0, NULL, 0},
    };
    /* Flags are applied after the file whatever their order on the command line. */
    const char *flag_keys[4] = {"listen", "state_dir", "image_dir", "log_level"};
    const char *flag_vals[4] = {NULL, NULL, NULL, NULL};
    const char *config_path = NULL, *publish_dir = NULL;
    struct srv_config cfg;
    struct daemon d = {0};
    char err[512], *key = NULL;
    unsigned char tok_secret[TOKEN_SECRET_LEN] = {0};
    bool fatal, check_only = false;
    struct stat st;
    int c, r, rc = 1;

    while ((c = getopt_long(argc, argv, "c:l:s:i:L:hVtP:", longopts, NULL)) != -1) {
        switch (c) {
        case 't':
            check_only = true;
            break;
        case 'P':
            publish_dir = optarg;
            break;
        case 'c':
            config_path = optarg;
            break;
        case 'l':
            flag_vals[0] = optarg;
            break;
        case 's':
            flag_vals[1] = optarg;
            break;
        case 'i':
            flag_vals[2] = optarg;
            break;
        case 'L':
            flag_vals[3] = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            printf("warrend %s\n", WARREN_VERSION);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "warrend: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }

    if (cfg_defaults(&cfg)) {
        fprintf(stderr, "warrend: out of memory\n");
        return 1;
    }
    if (config_path && cfg_load_file(&cfg, config_path, err, sizeof(err))) {
        fprintf(stderr, "warrend: %s\n", err);
        rc = 2;
        goto out;
    }
    for (int i = 0; i < 4; i++) {
        if (flag_vals[i] && cfg_set(&cfg, flag_keys[i], flag_vals[i], err, sizeof(err))) {
            fprintf(stderr, "warrend: --%s: %s\n",
                    i == 0   ? "listen"
                    : i == 1 ? "state-dir"
                    : i == 2 ? "image-dir"
                             : "log-level",
                    err);
            rc = 2;
            goto out;
        }
    }
    {
        enum log_level lvl;
        if (log_parse_level(cfg.log_level, &lvl) == 0)
            log_max = lvl;
    }
    if (cfg_resolve_host_id(&cfg, err, sizeof(err))) {
        fprintf(stderr, "warrend: %s\n", err);
        rc = 2;
        goto out;
    }
    if (check_limits(&cfg)) {
        rc = 2;
        goto out;
    }
    if (check_only) {
        printf("warrend: configuration ok (host_id %s)\n", cfg.host_id);
        rc = 0;
        goto out;
    }
    if (publish_dir) {
        unsigned nfiles;
        bool changed;
        if (publish_dir[0] != '/' ||
            imgsrc_publish(cfg.image_dir, publish_dir, &nfiles, &changed, err, sizeof(err))) {
            fprintf(stderr, "warrend: --publish-images: %s\n",
                    publish_dir[0] != '/' ? "DIR must be an absolute path" : err);
            goto out;
        }
        printf("warrend: published %u file(s) of %s to %s%s\n", nfiles, cfg.image_dir, publish_dir,
               changed ? "" : " (unchanged)");
        rc = 0;
        goto out;
    }

    signal(SIGPIPE, SIG_IGN);
    raise_nofile();

    r = mkdir_p(cfg.state_dir, 0700);
    if (r) {
        LOG(LOG_ERR, "cannot create state directory %s: %s", cfg.state_dir, strerror(-r));
        goto out;
    }
    if (check_state_dir(cfg.state_dir))
        goto out;
    LOG(LOG_INFO, "state directory: %s", cfg.state_dir);
    if (load_api_key(&cfg, &key))
        goto out;
    write_e2b_key(cfg.state_dir, key);
    if (load_token_secret(&cfg, tok_secret))
        goto out;

    {
        enum vmm_accel acc = VMM_ACCEL_TCG;
        log_accel(&cfg, &fatal, &acc);
        if (fatal)
            goto out;
        /* TCG is not a security boundary QEMU stands behind: reachable from the
         * network, untrusted code must run under KVM unless the operator says so. */
        if (acc == VMM_ACCEL_TCG && !is_loopback(cfg.listen_addr) && !cfg.allow_tcg) {
            LOG(LOG_ERR,
                "refusing to listen on non-loopback address %s with TCG: QEMU's security "
                "guarantees cover KVM guests only, so a guest escaping TCG would own this "
                "host. Use a host with KVM, listen on loopback, or set allow_tcg = true",
                cfg.listen_addr);
            rc = 2;
            goto out;
        }
    }
    /* A host that fills its images from a source may start with none: their directory
     * is made here, before the sandbox table resolves it. */
    if (cfg.image_source && cfg.image_source[0] && stat(cfg.image_dir, &st) &&
        (r = mkdir_p(cfg.image_dir, 0755)))
        LOG(LOG_WARN, "cannot create image directory %s: %s", cfg.image_dir, strerror(-r));
    if (stat(cfg.image_dir, &st) || !S_ISDIR(st.st_mode))
        LOG(LOG_WARN,
            "image directory %s does not exist yet: sandboxes cannot start until the "
            "images are built",
            cfg.image_dir);
    else
        LOG(LOG_INFO, "image directory: %s", cfg.image_dir);
    if (!is_loopback(cfg.listen_addr))
        LOG(LOG_WARN,
            "listening on non-loopback address %s as configured: the API is reachable "
            "from the network over plain HTTP, guarded by the API key only",
            cfg.listen_addr);

    d.loop = ev_default_loop(EVBACKEND_EPOLL);
    if (!d.loop) {
        LOG(LOG_ERR, "cannot create the event loop (epoll)");
        goto out;
    }
    r = sbx_table_new(d.loop, &cfg, &d.t);
    if (r) {
        LOG(LOG_ERR, "cannot open the sandbox table: %s", strerror(-r));
        goto out;
    }
    r = http_start(d.loop, &cfg, d.t, key, &d.h);
    if (r) {
        sbx_table_free(d.t, false);
        d.t = NULL;
        goto out;
    }
    http_set_token_secret(d.h, tok_secret, sizeof(tok_secret));
    if (images_src_start(d.loop, &cfg, &d.imgs, err, sizeof(err))) {
        LOG(LOG_ERR, "%s", err);
        rc = 2;
        goto out;
    }
    http_set_images(d.h, d.imgs);
    if (cfg.agent_check_port && agent_check_start(d.loop, &cfg, d.t, d.imgs, &d.ac))
        goto out;
    ev_signal_init(&d.sigint, on_signal, SIGINT);
    ev_signal_init(&d.sigterm, on_signal, SIGTERM);
    d.sigint.data = d.sigterm.data = &d;
    ev_signal_start(d.loop, &d.sigint);
    ev_signal_start(d.loop, &d.sigterm);

    {
        bool v6 = strchr(cfg.listen_addr, ':') != NULL;
        LOG(LOG_INFO, "listening on %s%s%s:%u", v6 ? "[" : "", cfg.listen_addr, v6 ? "]" : "",
            http_port(d.h));
        /* Scripts and tests wait for exactly this line on stdout. */
        printf("warrend listening on http://%s%s%s:%u\n", v6 ? "[" : "", cfg.listen_addr,
               v6 ? "]" : "", http_port(d.h));
        fflush(stdout);
    }

    ev_run(d.loop, 0);
    rc = 0;
out:
    agent_check_stop(d.ac);
    if (d.h)
        http_stop(d.h);
    images_src_stop(d.imgs);
    if (d.t)
        sbx_table_free(d.t, false);
    if (d.loop)
        ev_loop_destroy(d.loop);
    free(key);
    explicit_bzero(tok_secret, sizeof(tok_secret));
    cfg_free(&cfg);
    return rc;
}
