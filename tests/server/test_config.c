/*
 * Unit tests of core/config.c: the shipped conf/warren.conf equals the
 * embedded defaults field by field and names every option once; the parser
 * rejects what it must, with FILE:LINE. Includes config.c to see its option
 * table.
 */
#include "../../core/config.c"

#include <stdio.h>

int failures;
#include "check.h"

static bool same_str(const char *a, const char *b)
{
    return a && b && strcmp(a, b) == 0;
}

/* Every option of the table: the value the file gave f equals the embedded default in d.
 * Driven by the table itself, so an option added there is compared with no edit here. */
static void check_same(const struct srv_config *d, const struct srv_config *f)
{
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
        const struct opt *o = &opts[i];
        const char *a = (const char *)d + o->offset, *b = (const char *)f + o->offset;
        bool same;

        switch (o->type) {
        case T_LISTEN:
            same = same_str(d->listen_addr, f->listen_addr) && d->listen_port == f->listen_port;
            break;
        case T_UINT:
            same = *(const unsigned *)a == *(const unsigned *)b;
            break;
        case T_SIZE:
            same = *(const size_t *)a == *(const size_t *)b;
            break;
        case T_BOOL:
            same = *(const unsigned *)a == *(const unsigned *)b;
            break;
        case T_STR:
        case T_JAIL:
        case T_ACCEL:
        case T_LEVEL:
        case T_DIR_STATE:
        case T_DIR_IMAGE:
        case T_DIR_WEB:
        case T_TMAP_NAME:
        case T_TMAP_UINT:
            same = same_str(*(char *const *)a, *(char *const *)b);
            break;
        default:
            fprintf(stderr, "option %s: type %d unknown to this test: add it here\n", o->key,
                    (int)o->type);
            same = false;
        }
        if (!same) {
            fprintf(stderr, "option %s: the file's value differs from the embedded default\n",
                    o->key);
            failures++;
        }
    }
}

static void test_file_equals_defaults(const char *path)
{
    struct srv_config d, f;
    char err[512] = "";
    FILE *fp;
    char line[1024];

    CHECK(cfg_defaults(&d) == 0);
    CHECK(cfg_defaults(&f) == 0);
    /* Start f from something else, so every value must come from the file. */
    CHECK(cfg_set(&f, "listen", "10.0.0.1:1", err, sizeof(err)) == 0);
    CHECK(cfg_set(&f, "max_sandboxes", "7", err, sizeof(err)) == 0);
    CHECK(cfg_set(&f, "state_dir", "/elsewhere", err, sizeof(err)) == 0);
    CHECK(cfg_set(&f, "default_template", "minimal", err, sizeof(err)) == 0);
    if (cfg_load_file(&f, path, err, sizeof(err)) != 0) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        failures++;
        return;
    }
    check_same(&d, &f);

    /* Every option appears exactly once as an active "key =" line. */
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
        size_t kl = strlen(opts[i].key);
        int seen = 0;
        fp = fopen(path, "r");
        CHECK(fp != NULL);
        if (!fp)
            return;
        while (fgets(line, sizeof(line), fp)) {
            char *s = line + strspn(line, " \t");
            if (!strncmp(s, opts[i].key, kl) && (s[kl] == ' ' || s[kl] == '='))
                seen++;
        }
        fclose(fp);
        if (seen != 1) {
            fprintf(stderr, "option %s appears %d times in %s\n", opts[i].key, seen, path);
            failures++;
        }
    }
    cfg_free(&d);
    cfg_free(&f);
}

static int load_text(const char *text, struct srv_config *c, char *err, size_t cap)
{
    char path[] = "/tmp/warren-test-conf-XXXXXX";
    int fd = mkstemp(path), r;

    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        abort();
    close(fd);
    r = cfg_load_file(c, path, err, cap);
    unlink(path);
    return r;
}

static void expect_error(const char *text, const char *needle)
{
    struct srv_config c;
    char err[512] = "";

    CHECK(cfg_defaults(&c) == 0);
    if (load_text(text, &c, err, sizeof(err)) != -EINVAL || !strstr(err, needle)) {
        fprintf(stderr, "input %s: want error with '%s', got '%s'\n", text, needle, err);
        failures++;
    }
    cfg_free(&c);
}

static void test_parser(void)
{
    struct srv_config c;
    char err[512] = "";

    expect_error("bogus = 1\n", ":1: unknown option 'bogus'");
    expect_error("# comment\n\nmax_sandboxes = abc\n", ":3: max_sandboxes");
    expect_error("max_sandboxes = -1\n", ":1:");
    expect_error("max_sandboxes = 0\n", ":1:");
    expect_error("max_sandboxes = 4294967296\n", ":1:");
    expect_error("max_sandboxes = 12 # inline comments are not comments\n", ":1:");
    expect_error("max_sandboxes\n", ":1: expected 'key = value'");
    expect_error("listen = 127.0.0.1\n", ":1: listen");
    expect_error("listen = 127.0.0.1:65536\n", ":1: listen");
    expect_error("listen = example.com:80\n", ":1: listen");
    expect_error("listen = [::1:80\n", ":1: listen");
    expect_error("state_dir = relative/dir\n", ":1: state_dir must be an absolute path");
    expect_error("accel = hvf\n", ":1: accel");
    expect_error("log_level = loud\n", ":1: log_level");

    CHECK(cfg_defaults(&c) == 0);
    CHECK(load_text("  # indented comment\n\tlisten=[::1]:9000  \r\nmax_vcpus =8\n"
                    "api_key = abc=def\nqemu =\n",
                    &c, err, sizeof(err)) == 0);
    CHECK(same_str(c.listen_addr, "::1") && c.listen_port == 9000);
    CHECK(c.max_vcpus == 8);
    CHECK(same_str(c.api_key, "abc=def"));
    CHECK(same_str(c.qemu, ""));
    CHECK(cfg_set(&c, "listen", "localhost:0", err, sizeof(err)) == 0);
    CHECK(same_str(c.listen_addr, "127.0.0.1") && c.listen_port == 0);
    CHECK(cfg_set(&c, "max_json_body_bytes", "18446744073709551615", err, sizeof(err)) == 0);
    CHECK(c.max_body_bytes == SIZE_MAX);
    CHECK(cfg_load_file(&c, "/nonexistent/warren.conf", err, sizeof(err)) == -ENOENT);
    CHECK(strstr(err, "/nonexistent/warren.conf") != NULL);
    cfg_free(&c);
}

static void test_computed_dirs(void)
{
    struct srv_config c;

    setenv("XDG_STATE_HOME", "/xdg/state", 1);
    setenv("WARREN_IMAGE_DIR", "/img/here", 1);
    CHECK(cfg_defaults(&c) == 0);
    CHECK(same_str(c.state_dir, "/xdg/state/warren"));
    CHECK(same_str(c.image_dir, "/img/here"));
    cfg_free(&c);
    unsetenv("XDG_STATE_HOME");
    unsetenv("WARREN_IMAGE_DIR");
    setenv("HOME", "/home/tester", 1);
    CHECK(cfg_defaults(&c) == 0);
    CHECK(same_str(c.state_dir,
                   geteuid() == 0 ? "/var/lib/warren" : "/home/tester/.local/state/warren"));
    CHECK(same_str(c.image_dir, "/home/tester/.cache/warren/images/current"));
    cfg_free(&c);
}

/* web_dir: where scripts/setup.sh installs the npm packages, $WARREN_WEB_DIR, or an
 * absolute path. */
static void test_web_dir(void)
{
    struct srv_config c;
    char err[256] = "";

    setenv("HOME", "/home/tester", 1);
    unsetenv("WARREN_WEB_DIR");
    CHECK(cfg_defaults(&c) == 0);
    CHECK(same_str(c.web_dir, "/home/tester/.cache/warren/npm/current/node_modules"));
    CHECK(cfg_set(&c, "web_dir", "relative/node_modules", err, sizeof(err)) == -EINVAL);
    CHECK(strstr(err, "absolute") != NULL);
    CHECK(cfg_set(&c, "web_dir", "/srv/nm", err, sizeof(err)) == 0);
    CHECK(same_str(c.web_dir, "/srv/nm"));
    cfg_free(&c);
    setenv("WARREN_WEB_DIR", "/web/here", 1);
    CHECK(cfg_defaults(&c) == 0);
    CHECK(same_str(c.web_dir, "/web/here"));
    cfg_free(&c);
    unsetenv("WARREN_WEB_DIR");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_config conf/warren.conf\n");
        return 2;
    }
    test_file_equals_defaults(argv[1]);
    test_parser();
    test_computed_dirs();
    test_web_dir();
    if (failures)
        fprintf(stderr, "%d check(s) failed\n", failures);
    else
        printf("config: all checks passed\n");
    return failures ? 1 : 0;
}
