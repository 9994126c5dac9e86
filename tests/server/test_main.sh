#!/bin/sh
# test_main.sh WARREND CONF - warrend's main.c (built over the fake sandbox
# table as warrend_fake): flags, config precedence, the API key file, the
# "listening" line, 401/200 with the key, and a clean SIGTERM.
set -u
WARREND=$1
CONF=$2
T=$(mktemp -d /tmp/warren-main-test-XXXXXX)
PID=
fail=0
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
check() { # check DESCRIPTION COMMAND...
    d=$1
    shift
    if "$@"; then :; else
        echo "FAIL: $d" >&2
        fail=1
    fi
}

# start ARGS...: run warrend in the background, wait for its line, set URL.
start() {
    # Emptied here, not only by the redirection below: that one runs in the
    # background child, and the loop could first read the last run's line.
    : >"$T/out"
    "$WARREND" "$@" >"$T/out" 2>"$T/err" &
    PID=$!
    URL=
    for _ in $(seq 100); do
        URL=$(sed -n 's|^warrend listening on \(http://.*\)$|\1|p' "$T/out")
        [ -n "$URL" ] && return 0
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    echo "warrend did not start:" >&2
    cat "$T/err" >&2
    return 1
}

stop() {
    kill -TERM "$PID"
    for _ in $(seq 50); do
        kill -0 "$PID" 2>/dev/null || break
        sleep 0.1
    done
    wait "$PID"
    rc=$?
    PID=
    return $rc
}

check "--help" "$WARREND" --help >/dev/null
check "--version" sh -c "'$WARREND' --version | grep -q '^warrend '"
"$WARREND" --bogus >/dev/null 2>&1
check "unknown flag exits 2" [ $? -eq 2 ]
"$WARREND" --listen nonsense >/dev/null 2>"$T/err"
check "bad --listen exits 2" [ $? -eq 2 ]
check "bad --listen says why" grep -q "listen" "$T/err"
printf 'max_sandboxes = 4\nbogus_key = 1\n' >"$T/bad.conf"
"$WARREND" --config "$T/bad.conf" >/dev/null 2>"$T/err"
check "bad config exits 2" [ $? -eq 2 ]
check "bad config names FILE:LINE" grep -q "bad.conf:2: unknown option 'bogus_key'" "$T/err"
printf 'min_memory_mb = 512\n' >"$T/lim.conf"
"$WARREND" --config "$T/lim.conf" --state-dir "$T/s0" >/dev/null 2>"$T/err"
check "inconsistent limits exit 2" [ $? -eq 2 ]

# First start: creates the state dir (0700) and a 0600 key, says where.
check "start" start --config "$CONF" --state-dir "$T/state/deep" --listen 127.0.0.1:0 \
    --image-dir "$T/images"
check "state dir is 0700" [ "$(stat -c %a "$T/state/deep")" = 700 ]
check "key file is 0600" [ "$(stat -c %a "$T/state/deep/api_key")" = 600 ]
check "token secret is 0600" [ "$(stat -c %a "$T/state/deep/token_secret")" = 600 ]
check "token secret is 32 bytes" [ "$(stat -c %s "$T/state/deep/token_secret")" = 32 ]
KEY=$(cat "$T/state/deep/api_key")
check "key is 64 hex chars" sh -c "echo '$KEY' | grep -Eq '^[0-9a-f]{64}$'"
check "says where the key is" grep -q "API key: created $T/state/deep/api_key" "$T/err"
check "warns about TCG" grep -q "WARNING: TCG is a development mode" "$T/err"
check "says the image dir is missing" grep -q "image directory $T/images does not exist" "$T/err"
check "logs the listen address" grep -q "listening on 127.0.0.1:" "$T/err"
check "healthz" sh -c "curl -sf '$URL/healthz' | grep -q '\"status\":\"ok\"'"
code=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v1/sandboxes")
check "401 without key" [ "$code" = 401 ]
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$URL/v1/sandboxes")
check "200 with key" [ "$code" = 200 ]
# The same port cannot be bound twice: a clear error, exit 1.
PORT=${URL##*:}
"$WARREND" --state-dir "$T/state/deep" --listen "127.0.0.1:$PORT" >/dev/null 2>"$T/err2"
check "busy port exits 1" [ $? -eq 1 ]
check "busy port says so" grep -q "cannot listen on 127.0.0.1:$PORT" "$T/err2"
check "SIGTERM exits 0" stop

# Second start: the same key is read back; the config's key wins over it.
check "restart" start --state-dir "$T/state/deep" --listen 127.0.0.1:0 --log-level warn
check "log level warn hides info" sh -c "! grep -q 'API key' '$T/err'"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$URL/v1/sandboxes")
check "old key still works" [ "$code" = 200 ]
check "SIGINT-free stop" stop
printf 'api_key = short-key-0123456789\n' >"$T/short.conf"
"$WARREND" --config "$T/short.conf" --state-dir "$T/state/deep" --listen 127.0.0.1:0 \
    >/dev/null 2>"$T/err"
check "a configured key under 32 characters exits 2" [ $? -eq 2 ]
check "... and says so" grep -q "api_key must be at least 32 characters" "$T/err"
CKEY=configured-key-0123456789abcdefghij
printf 'api_key = %s\nlisten = 127.0.0.1:1\n' "$CKEY" >"$T/key.conf"
check "start with config key" start --config "$T/key.conf" --state-dir "$T/state/deep" \
    --listen 127.0.0.1:0
check "flag overrides file (port 1 not used)" sh -c "! echo '$URL' | grep -q ':1\$'"
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $CKEY" \
    "$URL/v1/sandboxes")
check "configured key works" [ "$code" = 200 ]
code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $KEY" "$URL/v1/sandboxes")
check "file key no longer works" [ "$code" = 401 ]
kill -INT "$PID"
wait "$PID"
check "SIGINT exits 0" [ $? -eq 0 ]
PID=

# A key file others can read, or a state dir others can write: refused with a clear
# message, exit 1 (before, a readable key file was only a warning).
chmod 644 "$T/state/deep/api_key"
"$WARREND" --state-dir "$T/state/deep" --listen 127.0.0.1:0 >/dev/null 2>"$T/err"
check "a 0644 key file exits 1" [ $? -eq 1 ]
check "... and says chmod 600" grep -q "api_key must be owned by warrend's user.*chmod 600" "$T/err"
chmod 600 "$T/state/deep/api_key"
chmod 770 "$T/state/deep"
"$WARREND" --state-dir "$T/state/deep" --listen 127.0.0.1:0 >/dev/null 2>"$T/err"
check "a group-writable state dir exits 1" [ $? -eq 1 ]
check "... and says chmod 700" grep -q "state directory .* must be owned.*chmod 700" "$T/err"
chmod 700 "$T/state/deep"
# The token secret: the same rule as the key file, and exactly 32 bytes.
chmod 644 "$T/state/deep/token_secret"
"$WARREND" --state-dir "$T/state/deep" --listen 127.0.0.1:0 >/dev/null 2>"$T/err"
check "a 0644 token secret exits 1" [ $? -eq 1 ]
check "... and says chmod 600" grep -q "token_secret must be a file owned by warrend's user.*chmod 600" "$T/err"
chmod 600 "$T/state/deep/token_secret"
cp "$T/state/deep/token_secret" "$T/secret.bak"
printf 'x' >>"$T/state/deep/token_secret"
"$WARREND" --state-dir "$T/state/deep" --listen 127.0.0.1:0 >/dev/null 2>"$T/err"
check "a 33-byte token secret exits 1" [ $? -eq 1 ]
check "... and says so" grep -q "token_secret must hold exactly 32 bytes" "$T/err"
cp "$T/secret.bak" "$T/state/deep/token_secret"
if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
    chown nobody "$T/state/deep"
    "$WARREND" --state-dir "$T/state/deep" --listen 127.0.0.1:0 >/dev/null 2>"$T/err"
    check "a state dir of another user exits 1" [ $? -eq 1 ]
    check "... and names the owner" grep -q "uid $(id -u nobody)" "$T/err"
    chown 0 "$T/state/deep"
    chown nobody "$T/state/deep/api_key"
    "$WARREND" --state-dir "$T/state/deep" --listen 127.0.0.1:0 >/dev/null 2>"$T/err"
    check "a key file of another user exits 1" [ $? -eq 1 ]
    chown 0 "$T/state/deep/api_key"
fi
check "fixed up, it starts again" start --state-dir "$T/state/deep" --listen 127.0.0.1:0
check "SIGTERM exits 0 (again)" stop

# Without lws's libev plugin (hidden in a private mount namespace, root only):
# a clear message naming the package, exit 1.
if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
    PLUGIN=$(ls /usr/lib/*/libwebsockets-evlib_ev.so 2>/dev/null | head -1)
    if [ -n "$PLUGIN" ]; then
        unshare -m sh -c "mount --bind /dev/null '$PLUGIN' && exec '$WARREND' \
            --state-dir '$T/state/deep' --listen 127.0.0.1:0" >/dev/null 2>"$T/err"
        check "missing evlib plugin exits 1" [ $? -eq 1 ]
        check "missing evlib plugin names the package" grep -q "libwebsockets-evlib-ev" "$T/err"
    fi
fi

if [ $fail = 0 ]; then echo "main: all checks passed"; fi
exit $fail
