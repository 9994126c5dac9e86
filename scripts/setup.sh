#!/bin/bash
# scripts/setup.sh - install what Warren needs, build it, build the guest images.
#
#   scripts/setup.sh [--no-images] [--build-dir DIR] [-- CMAKE_ARGS...]
#
# Idempotent and non-interactive: packages already present are not touched,
# the build is incremental, images/build.sh skips images whose inputs did
# not change, and the npm packages (NPM_PACKAGES) are installed once per
# version set into a cache outside the checkout. Installing packages and
# building images need root.
set -euo pipefail

PACKAGES="cmake gcc libc6-dev make pkg-config clang libclang-rt-14-dev
    qemu-system-x86 qemu-utils
    libwebsockets-dev libwebsockets-evlib-ev libev-dev libmbedtls-dev libmsgpack-dev
    liblmdb-dev libjansson-dev zlib1g-dev nftables dnsmasq-base
    e2fsprogs busybox-static mmdebstrap uidmap cpio xz-utils zstd
    curl python3 python3-websockets ca-certificates procps chromium
    haproxy yamllint jupyter-notebook python3-jupyter-server python3-websocket"

# From the npm registry, never committed: xterm.js and its fit addon (served by
# warrend for /terminal/{id}) and playwright-core (drives Debian's chromium in
# tests/integration/test_terminal.py), E2B's unmodified SDKs (e2b and
# @e2b/code-interpreter, driven by tests/integration/test_e2b.py against warrend's
# E2B doors), and yaml, kubernetes-models and @cdktf/hcl2json, which check the deploy
# files offline (deploy/check.sh). Exact versions: they key the cache.
NPM_PACKAGES="@xterm/xterm@6.0.0 @xterm/addon-fit@0.11.0 playwright-core@1.65.1 e2b@2.51.0
    @e2b/code-interpreter@2.8.0 yaml@2.8.1 kubernetes-models@4.5.1 @cdktf/hcl2json@0.21.0"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

top=$(cd "$(dirname "$0")/.." && pwd)
build_dir=$top/build
images=1
cmake_args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --no-images) images=0; shift ;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --build-dir=*) build_dir=${1#--build-dir=}; shift ;;
    --) shift; cmake_args=("$@"); break ;;
    -h | --help) sed -n '3,4p' "$0" | sed 's/^# *//' >&2; exit 0 ;;
    *) die "unknown argument $1" ;;
    esac
done
case "$build_dir" in /*) ;; *) build_dir=$PWD/$build_dir ;; esac

export DEBIAN_FRONTEND=noninteractive
as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

# --- packages ------------------------------------------------------------
# npm ships inside some nodejs builds (NodeSource's); Debian's comes as `npm`.
command -v npm >/dev/null 2>&1 || PACKAGES="$PACKAGES npm"
missing=()
for p in $PACKAGES; do
    if [ "$(dpkg-query -W -f '${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
        missing+=("$p")
    fi
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -qq </dev/null || die "apt-get update failed"
    as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null ||
        die "apt-get install failed"
else
    say "packages: all present"
fi

# --- npm packages ----------------------------------------------------------
# ${WARREN_CACHE}/npm/<key>/node_modules, <key> hashing the package list, and
# npm/current -> <key> switched atomically (warrend's default web_dir is
# npm/current/node_modules). Installed into a temporary directory and moved
# into place only when complete, so a failed install is never taken as done.
npm_cache=${WARREN_CACHE:-${HOME:-/root}/.cache/warren}/npm
npm_key=$(printf '%s\n' $NPM_PACKAGES | sha256sum | cut -c1-16)
mkdir -p "$npm_cache"
(
    flock 8
    if [ -d "$npm_cache/$npm_key/node_modules" ]; then
        say "npm packages: cached in $npm_cache/$npm_key"
    else
        say "npm: installing $NPM_PACKAGES"
        tmp=$(mktemp -d "$npm_cache/.tmp.XXXXXX")
        chmod 755 "$tmp" # warrend may run as another user
        trap 'rm -rf "$tmp"' EXIT
        printf '{"private": true}\n' >"$tmp/package.json"
        # --ignore-scripts: nothing runs at install (playwright-core would fetch no
        # browser anyway; Debian's chromium is the one used).
        npm install --prefix "$tmp" --no-save --no-package-lock --no-audit --no-fund \
            --ignore-scripts --loglevel=error $NPM_PACKAGES </dev/null >&2 ||
            die "npm install failed"
        rm -f "$tmp/package.json"
        mv -T "$tmp" "$npm_cache/$npm_key"
        trap - EXIT
    fi
    ln -sfn "$npm_key" "$npm_cache/.current.new"
    mv -T "$npm_cache/.current.new" "$npm_cache/current"
) 8>"$npm_cache/.lock"

# --- build -----------------------------------------------------------------
say "building in $build_dir"
mkdir -p "$build_dir"
log=$build_dir/setup-build.log
if ! { cmake -S "$top" -B "$build_dir" "${cmake_args[@]}" \
    -DWARREN_NPM="$npm_cache/$npm_key/node_modules" &&
    make -C "$build_dir" -j"$(nproc)" --no-print-directory; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "build failed (full log: $log)"
fi

# --- images ----------------------------------------------------------------
if [ $images = 1 ]; then
    # Under sudo, keep the caller's cache: warrend looks there by default.
    as_root env WARREN_CACHE="${WARREN_CACHE:-${HOME:-/root}/.cache/warren}" \
        bash "$top/images/build.sh" --build-dir "$build_dir"
fi
say "done"
