#!/bin/bash
# images/build.sh - build Warren's guest images into a cache outside the checkout.
#
#   images/build.sh [--only minimal|base] [--build-dir DIR] [WARREN_INIT]
#
# Output: ${WARREN_CACHE:-~/.cache/warren}/images/<key>/ holding vmlinux,
# initramfs.cpio, minimal.ext4, base.ext4 and manifest; images/current points
# at it. <key> hashes every input (this script, warren-init, the kernel
# package version, the package lists), so a rerun with the same inputs does
# nothing. Each artifact is written under a temporary name and renamed, so a
# file that exists is complete; the manifest is written last.
# Runs as root: mkfs.ext4 -d must read every file of the trees and keep owners.
set -euo pipefail

# Modules warren-init loads, in dependency order (checked below).
MODULES="virtio_ring virtio virtio_mmio virtio_console virtio_blk crc16 mbcache crc32c_generic jbd2 ext4"
SUITE=bookworm
BASE_PACKAGES="bash,coreutils,python3,git,curl,ca-certificates,procps,iproute2"
MINIMAL_SIZE=2G # must hold a 1 GiB upload
BASE_SIZE=4G

say() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '3,4p' "$0" | sed 's/^# *//' >&2
    exit 2
}

only=all
build_dir=
init=
while [ $# -gt 0 ]; do
    case "$1" in
    --only) only=${2:-}; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    --build-dir) build_dir=${2:-}; shift 2 ;;
    --build-dir=*) build_dir=${1#--build-dir=}; shift ;;
    -h | --help) usage ;;
    -*) die "unknown option $1" ;;
    *) init=$1; shift ;;
    esac
done
case "$only" in all | minimal | base) ;; *) die "--only takes minimal or base" ;; esac
[ "$(id -u)" = 0 ] || die "run as root (mkfs.ext4 -d and mmdebstrap need it)"

here=$(cd "$(dirname "$0")" && pwd)
top=$(dirname "$here")
if [ -z "$init" ]; then
    for d in "$build_dir" "$top/build"; do
        if [ -n "$d" ] && [ -x "$d/guest-init/warren-init" ]; then
            init=$d/guest-init/warren-init
            break
        fi
    done
fi
[ -n "$init" ] && [ -f "$init" ] || die "warren-init not found: build it first or pass its path"
# A dynamic PID 1 would find no libc in the initramfs.
if readelf -l "$init" | grep -q INTERP; then die "$init is not linked statically"; fi

cache=${WARREN_CACHE:-${HOME:-/root}/.cache/warren}
mkdir -p "$cache/images" "$cache/debs" "$cache/tmp"

# The kernel: whatever linux-image-amd64 depends on in the host's apt.
kernel_pkg() {
    apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9].*-amd64$/ { print $2; exit }'
}
kpkg=$(kernel_pkg)
if [ -z "$kpkg" ]; then
    say "apt-get update (no kernel package known yet)"
    apt-get update -qq >/dev/null || die "apt-get update failed"
    kpkg=$(kernel_pkg)
fi
[ -n "$kpkg" ] || die "apt knows no linux-image-amd64"
kver=$(apt-cache show --no-all-versions "$kpkg" | awk '$1 == "Version:" { print $2; exit }')
deb=$cache/debs/${kpkg}_${kver}_amd64.deb

key=$(
    {
        cat "$0"
        sha256sum <"$init"
        echo "$kpkg $kver $MODULES $SUITE $BASE_PACKAGES $MINIMAL_SIZE $BASE_SIZE"
        dpkg-query -W -f '${Version}' busybox-static
    } | sha256sum | cut -c1-16
)
out=$cache/images/$key
mkdir -p "$out"

want_base=1
want_minimal=1
[ "$only" = minimal ] && want_base=0
[ "$only" = base ] && want_minimal=0
done_all() {
    for f in vmlinux initramfs.cpio; do [ -f "$out/$f" ] || return 1; done
    [ $want_minimal = 0 ] || [ -f "$out/minimal.ext4" ] || return 1
    [ $want_base = 0 ] || [ -f "$out/base.ext4" ] || return 1
}

point_current() {
    ln -sfn "$key" "$cache/images/.current.new"
    mv -T "$cache/images/.current.new" "$cache/images/current"
}

if done_all && [ -f "$out/manifest" ]; then
    point_current
    say "up to date: $out"
    exit 0
fi

work=$(mktemp -d "$cache/tmp/build.XXXXXX")
chmod 755 "$work"
cleanup() {
    # mmdebstrap's root mode may leave mounts behind if it was interrupted.
    grep -o " $work/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" || true; done || true
    rm -rf "$work"
}
trap cleanup EXIT
t0=$(date +%s)

# --- kernel and modules ------------------------------------------------
if [ ! -f "$deb" ]; then
    say "downloading $kpkg $kver"
    mkdir -p "$work/dl"
    # apt drops to _apt to download: let it write the directory.
    chown _apt "$work/dl" 2>/dev/null || true
    (cd "$work/dl" && apt-get download -qq "$kpkg=$kver") || die "apt-get download $kpkg failed"
    mv "$work/dl/"*.deb "$deb"
fi
dpkg-deb -x "$deb" "$work/k"
krel=$(ls "$work/k/lib/modules")
[ "$(echo "$krel" | wc -w)" = 1 ] || die "expected one kernel release in $deb"
mdir=$work/k/lib/modules/$krel

if [ ! -f "$out/vmlinux" ]; then
    say "vmlinux $krel"
    vmlinuz=$work/k/boot/vmlinuz-$krel
    # The bzImage holds one xz stream after its setup code; find its magic.
    off=$(LC_ALL=C grep -m1 -obUaP '\xfd7zXZ\x00' "$vmlinuz" | awk -F: 'NR == 1 { print $1 }')
    [ -n "$off" ] || die "no xz stream in $vmlinuz"
    # xz stops at the end of its stream: tail's SIGPIPE is expected.
    (set +o pipefail; tail -c +$((off + 1)) "$vmlinuz" | xz -dc --single-stream >"$work/vmlinux") ||
        die "cannot decompress $vmlinuz"
    [ "$(head -c4 "$work/vmlinux" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] ||
        die "vmlinux extracted from $vmlinuz is not ELF"
    mv "$work/vmlinux" "$out/vmlinux"
fi

if [ ! -f "$out/initramfs.cpio" ]; then
    say "initramfs.cpio"
    tree=$work/initramfs
    mkdir -p "$tree"/{dev,proc,sys,newroot,etc,lib/modules/"$krel"}
    mknod -m 600 "$tree/dev/console" c 5 1 # the kernel opens it for init's stdio
    strip -o "$tree/init" "$init"
    chmod 755 "$tree/init"
    echo "$krel" >"$tree/etc/warren-kernel"
    loaded=" "
    : >"$tree/lib/modules/load.list"
    for m in $MODULES; do
        if grep -qE "/$m\.ko(\.[a-z]+)?$" "$mdir/modules.builtin"; then
            loaded="$loaded$m "
            continue
        fi
        src=$(find "$mdir/kernel" -name "$m.ko*" | head -1)
        [ -n "$src" ] || die "module $m is neither built in nor in $kpkg"
        dst=$tree/lib/modules/$krel/$m.ko
        case "$src" in
        *.ko) cp "$src" "$dst" ;;
        *.ko.xz) xz -dc "$src" >"$dst" ;;
        *.ko.zst) zstd -qdc "$src" >"$dst" ;;
        *.ko.gz) gzip -dc "$src" >"$dst" ;;
        *) die "unknown module compression: $src" ;;
        esac
        deps=$(tr '\0' '\n' <"$dst" | sed -n 's/^depends=//p' | tr ',' ' ')
        for d in $deps; do
            case "$loaded" in *" $d "*) ;; *) die "module $m needs $d before it in MODULES" ;; esac
        done
        loaded="$loaded$m "
        echo "/lib/modules/$krel/$m.ko" >>"$tree/lib/modules/load.list"
    done
    find "$tree" -exec touch -h -d @0 {} +
    (cd "$tree" && find . -mindepth 1 | LC_ALL=C sort |
        cpio --quiet -o -H newc -R 0:0 --reproducible) >"$work/initramfs.cpio"
    mv "$work/initramfs.cpio" "$out/initramfs.cpio"
fi

# Users and groups every template shares: root, and the unprivileged `user`.
add_user() { # ROOTFS
    local r=$1
    grep -q '^user:' "$r/etc/group" 2>/dev/null || echo 'user:x:1000:' >>"$r/etc/group"
    grep -q '^user:' "$r/etc/passwd" 2>/dev/null ||
        echo 'user:x:1000:1000:user:/home/user:/bin/sh' >>"$r/etc/passwd"
    if [ -f "$r/etc/shadow" ] && ! grep -q '^user:' "$r/etc/shadow"; then
        echo 'user:*:19000:0:99999:7:::' >>"$r/etc/shadow"
    fi
    mkdir -p "$r/home/user"
    chown 1000:1000 "$r/home/user"
    chmod 755 "$r/home/user"
    echo warren >"$r/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\twarren\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
        >"$r/etc/hosts"
}

mkfs_image() { # TREE IMAGE SIZE LABEL
    rm -f "$2.tmp"
    truncate -s "$3" "$2.tmp"
    mkfs.ext4 -q -F -m 0 -L "$4" -E root_owner=0:0 -d "$1" "$2.tmp"
    mv "$2.tmp" "$2"
}

if [ $want_minimal = 1 ] && [ ! -f "$out/minimal.ext4" ]; then
    say "minimal.ext4 (busybox)"
    r=$work/minimal
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,mnt,root,tmp}
    chmod 700 "$r/root"
    chmod 1777 "$r/tmp"
    cp /bin/busybox "$r/bin/busybox"
    for a in $(busybox --list-full | grep -v '^linuxrc$'); do
        [ -e "$r/$a" ] || [ -L "$r/$a" ] || ln -s /bin/busybox "$r/$a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
    printf 'root:x:0:\ntty:x:5:\n' >"$r/etc/group"
    add_user "$r"
    mkfs_image "$r" "$out/minimal.ext4" "$MINIMAL_SIZE" warren-minimal
fi

if [ $want_base = 1 ] && [ ! -f "$out/base.ext4" ]; then
    say "base.ext4 (Debian $SUITE: $BASE_PACKAGES)"
    # Only the host's own Debian entries for $SUITE: no mirror is named here,
    # and third-party repositories of the host stay out of the image.
    : >"$work/host.list"
    : >"$work/host.sources"
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        awk -v s="$SUITE" '
            $1 != "deb" { next }
            { i = 2; if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ } }
            $(i + 1) ~ ("^" s "($|-)") { print }' "$f" >>"$work/host.list"
    done
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk -v s="$SUITE" -v RS= '
            /(^|\n)Enabled:[ \t]*no/ { next }
            {
                n = split($0, line, "\n"); keep = ""; deb = 0; out = ""
                for (j = 1; j <= n; j++) {
                    if (line[j] ~ /^Types:/ && line[j] ~ /[ \t]deb([ \t]|$)/) deb = 1
                    if (line[j] ~ /^Suites:/) {
                        m = split(line[j], w, /[ \t]+/)
                        for (k = 2; k <= m; k++) if (w[k] ~ ("^" s "($|-)")) keep = keep " " w[k]
                        line[j] = "Suites:" keep
                    }
                    if (line[j] ~ /^Types:/) line[j] = "Types: deb"
                    if (line[j] !~ /^#/) out = out line[j] "\n"
                }
                if (deb && keep != "") printf "%s\n", out
            }' "$f" >>"$work/host.sources"
    done
    mirrors=()
    [ -s "$work/host.list" ] && mirrors+=("$work/host.list")
    [ -s "$work/host.sources" ] && mirrors+=("$work/host.sources")
    [ ${#mirrors[@]} -gt 0 ] || die "the host's apt sources have no Debian $SUITE entry"

    r=$work/base
    # Docs, man pages and translations are dead weight in a sandbox image.
    mmdebstrap --quiet --variant=minbase --mode=root --include="$BASE_PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/*.log' \
        "$SUITE" "$r" "${mirrors[@]}" || die "mmdebstrap failed"
    add_user "$r"
    sed -i 's|^user:\(.*\):/bin/sh$|user:\1:/bin/bash|' "$r/etc/passwd"
    cp -a "$r/etc/skel/." "$r/home/user/"
    chown -R 1000:1000 "$r/home/user"
    mkdir -p "$r/mnt"
    mkfs_image "$r" "$out/base.ext4" "$BASE_SIZE" warren-base
fi

{
    echo "key $key"
    echo "kernel_release $krel"
    echo "kernel_package $kpkg $kver"
    echo "modules $MODULES"
    echo "warren_init_sha256 $(sha256sum <"$init" | cut -d' ' -f1)"
    for f in vmlinux initramfs.cpio minimal.ext4 base.ext4; do
        if [ -f "$out/$f" ]; then echo "file $f $(stat -c %s "$out/$f")"; fi
    done
} >"$work/manifest"
if done_all; then
    mv "$work/manifest" "$out/manifest"
fi
point_current
say "done in $(($(date +%s) - t0)) s: $out"
