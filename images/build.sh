#!/bin/bash
# images/build.sh - build Warren's guest images into a cache outside the checkout.
#
#   images/build.sh [--only minimal|base|code-interpreter] [--build-dir DIR] [WARREN_INIT]
#
# Layout under ${WARREN_CACHE:-~/.cache/warren}:
#   debs/linux-image-*.deb       the kernel package, kept by version
#   images/parts/<name>-<hash>   each artifact, keyed by its own inputs
#   images/<key>/                vmlinux initramfs.cpio minimal.ext4 base.ext4
#                                code-interpreter.ext4 (hard links to parts) and
#                                manifest (written last)
#   images/current -> <key>      switched atomically at the end of every run
# <key> hashes the part keys, i.e. every input: this script, warren-init, the
# kernel package version, busybox's version, the package lists and the files
# of images/code-interpreter/. Only the initramfs depends on warren-init, so
# rebuilding it does not redo the Debian tree; the code-interpreter's Debian
# tree is a part of its own (a tar, code-interpreter.tree.tar in the set), so
# changing kerneld.py only redoes its file system, not the packages. Each part is written under a temporary name and renamed: a part that
# exists is complete. Runs as root: mkfs.ext4 -d must read every file of the
# trees and keep their owners.
set -euo pipefail

# Modules warren-init loads, in dependency order (checked below).
MODULES="virtio_ring virtio virtio_mmio virtio_console virtio_blk failover net_failover virtio_net crc16 mbcache crc32c_generic jbd2 ext4"
SUITE=bookworm
BASE_PACKAGES="bash,coreutils,python3,git,curl,ca-certificates,procps,iproute2"
MINIMAL_SIZE=2G # must hold a 1 GiB upload
BASE_SIZE=4G
# The code-interpreter template: base plus a live Jupyter kernel (docs/KERNELD.md).
# python3-munkres satisfies matplotlib's fonttools' "scipy | munkres": else apt takes
# scipy, and with it pythran, gcc, g++ and boost (~700 MB the kernel never uses).
CI_PACKAGES="python3-ipykernel,python3-jupyter-client,python3-numpy,python3-pandas,python3-matplotlib,python3-munkres"
CI_SIZE=4G
KEEP=3 # image sets kept besides current; older ones are removed

say() { printf 'images: %s\n' "$*" >&2; }
die() { printf 'images: error: %s\n' "$*" >&2; exit 1; }

only=all
build_dir=
init=
while [ $# -gt 0 ]; do
    case "$1" in
    --only) only=${2:-}; shift 2 ;;
    --only=*) only=${1#--only=}; shift ;;
    --build-dir) build_dir=${2:-}; shift 2 ;;
    --build-dir=*) build_dir=${1#--build-dir=}; shift ;;
    -h | --help) sed -n '3,4p' "$0" | sed 's/^# *//' >&2; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) init=$1; shift ;;
    esac
done
case "$only" in all | minimal | base | code-interpreter) ;; *) die "--only takes minimal, base or code-interpreter" ;; esac
[ "$(id -u)" = 0 ] || die "run as root (mkfs.ext4 -d and mmdebstrap need it)"

top=$(cd "$(dirname "$0")/.." && pwd)
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
parts=$cache/images/parts
mkdir -p "$parts" "$cache/debs" "$cache/tmp"
exec 9>"$cache/images/.lock"
flock 9 # one build at a time per cache

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
krel=${kpkg#linux-image-} # Debian names the package after the release; checked below
deb=$cache/debs/${kpkg}_${kver}_amd64.deb

script_sha=$(sha256sum <"$0" | cut -c1-64)
init_sha=$(sha256sum <"$init" | cut -c1-64)
part_key() { printf '%s\n' "$script_sha" "$@" | sha256sum | cut -c1-16; }
declare -A part
part[vmlinux]=$parts/vmlinux-$(part_key "$kpkg" "$kver")
part[initramfs.cpio]=$parts/initramfs-$(part_key "$kpkg" "$kver" "$init_sha" "$MODULES")
part[minimal.ext4]=$parts/minimal-$(part_key "$(dpkg-query -W -f '${Version}' busybox-static)" \
    "$MINIMAL_SIZE")
part[base.ext4]=$parts/base-$(part_key "$SUITE" "$BASE_PACKAGES" "$BASE_SIZE")
ci_dir=$top/images/code-interpreter
ci_files_sha=$(cd "$ci_dir" && find . -type f | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-64)
part[code-interpreter.tree.tar]=$parts/code-interpreter-tree-$(part_key "$SUITE" "$BASE_PACKAGES" \
    "$CI_PACKAGES")
part[code-interpreter.ext4]=$parts/code-interpreter-$(part_key "${part[code-interpreter.tree.tar]}" \
    "$ci_files_sha" "$CI_SIZE")
SETS="vmlinux initramfs.cpio minimal.ext4 base.ext4 code-interpreter.tree.tar code-interpreter.ext4"
key=$(printf '%s\n' "${part[@]}" | sort | sha256sum | cut -c1-16)
out=$cache/images/$key

case "$only" in
all) names=$SETS ;;
code-interpreter) names="vmlinux initramfs.cpio code-interpreter.tree.tar code-interpreter.ext4" ;;
*) names="vmlinux initramfs.cpio $only.ext4" ;;
esac

work=$(mktemp -d "$cache/tmp/build.XXXXXX")
chmod 755 "$work" # apt-get download runs as _apt
cleanup() {
    # mmdebstrap's root mode may leave mounts behind if it was interrupted.
    { grep -o " $work/[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do
        umount -l "$m" || true
    done
    rm -rf "$work"
}
trap cleanup EXIT
t0=$(date +%s)

# --- kernel and modules ------------------------------------------------
kernel_tree() { # extract the package once per run, only when a part needs it
    [ -d "$work/k" ] && return
    if [ ! -f "$deb" ]; then
        say "downloading $kpkg $kver"
        (cd "$work" && apt-get download -qq "$kpkg=$kver") || die "apt-get download $kpkg failed"
        mv "$work/"*.deb "$deb"
    fi
    dpkg-deb -x "$deb" "$work/k"
    [ -d "$work/k/lib/modules/$krel" ] || die "$deb has no modules for $krel"
}

build_vmlinux() { # OUT
    kernel_tree
    local vmlinuz=$work/k/boot/vmlinuz-$krel off
    # The bzImage holds one xz stream after its setup code; find its magic.
    off=$(LC_ALL=C grep -m1 -obUaP '\xfd7zXZ\x00' "$vmlinuz" | awk -F: 'NR == 1 { print $1 }')
    [ -n "$off" ] || die "no xz stream in $vmlinuz"
    # xz stops at the end of its stream: tail's SIGPIPE is expected.
    (set +o pipefail; tail -c +$((off + 1)) "$vmlinuz" | xz -dc --single-stream >"$1") ||
        die "cannot decompress $vmlinuz"
    [ "$(head -c4 "$1" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] || die "$vmlinuz holds no ELF"
}

build_initramfs() { # OUT
    kernel_tree
    local tree=$work/initramfs mdir=$work/k/lib/modules/$krel loaded=" " m src dst d
    mkdir -p "$tree"/{dev,proc,sys,newroot,etc,lib/modules/"$krel"}
    mknod -m 600 "$tree/dev/console" c 5 1 # the kernel opens it for init's stdio
    strip -o "$tree/init" "$init"
    chmod 755 "$tree/init"
    echo "$krel" >"$tree/etc/warren-kernel"
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
        for d in $(tr '\0' '\n' <"$dst" | sed -n 's/^depends=//p' | tr ',' ' '); do
            case "$loaded" in *" $d "*) ;; *) die "module $m needs $d before it in MODULES" ;; esac
        done
        loaded="$loaded$m "
        echo "/lib/modules/$krel/$m.ko" >>"$tree/lib/modules/load.list"
    done
    find "$tree" -exec touch -h -d @0 {} +
    (cd "$tree" && find . -mindepth 1 | LC_ALL=C sort |
        cpio --quiet -o -H newc -R 0:0 --reproducible) >"$1"
}

# Users every template shares: root, and the unprivileged `user` (1000).
add_user() { # ROOTFS SHELL
    local r=$1
    grep -q '^user:' "$r/etc/group" 2>/dev/null || echo 'user:x:1000:' >>"$r/etc/group"
    grep -q '^user:' "$r/etc/passwd" 2>/dev/null ||
        echo "user:x:1000:1000:user:/home/user:$2" >>"$r/etc/passwd"
    if [ -f "$r/etc/shadow" ] && ! grep -q '^user:' "$r/etc/shadow"; then
        echo 'user:*:19000:0:99999:7:::' >>"$r/etc/shadow"
    fi
    mkdir -p "$r/home/user"
    if [ -d "$r/etc/skel" ]; then cp -a "$r/etc/skel/." "$r/home/user/"; fi
    chown -R 1000:1000 "$r/home/user"
    chmod 755 "$r/home/user"
    echo warren >"$r/etc/hostname"
    printf '127.0.0.1\tlocalhost\n127.0.1.1\twarren\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
        >"$r/etc/hosts"
}

mkfs_image() { # TREE OUT SIZE LABEL
    truncate -s "$3" "$2"
    mkfs.ext4 -q -F -m 0 -L "$4" -E root_owner=0:0 -d "$1" "$2"
}

build_minimal() { # OUT
    local r=$work/minimal a
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,run,mnt,root,tmp}
    chmod 700 "$r/root"
    chmod 1777 "$r/tmp"
    cp /bin/busybox "$r/bin/busybox"
    for a in $(busybox --list-full | grep -v '^linuxrc$'); do
        [ -e "$r/$a" ] || [ -L "$r/$a" ] || ln -s /bin/busybox "$r/$a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
    printf 'root:x:0:\ntty:x:5:\n' >"$r/etc/group"
    add_user "$r" /bin/sh
    mkfs_image "$r" "$1" "$MINIMAL_SIZE" warren-minimal
}

# The host's own Debian entries for $SUITE, as one-line and deb822 files: no
# mirror is named in this repository, and the host's third-party
# repositories stay out of the image.
host_sources() {
    local f
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
}

build_base() { # OUT
    local r=$work/base mirrors=()
    host_sources
    [ -s "$work/host.list" ] && mirrors+=("$work/host.list")
    [ -s "$work/host.sources" ] && mirrors+=("$work/host.sources")
    [ ${#mirrors[@]} -gt 0 ] || die "the host's apt sources have no Debian $SUITE entry"
    # Docs, man pages and translations are dead weight in a sandbox image.
    mmdebstrap --quiet --variant=minbase --mode=root --include="$BASE_PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/*.log' \
        "$SUITE" "$r" "${mirrors[@]}" || die "mmdebstrap failed"
    add_user "$r" /bin/bash
    mkdir -p "$r/mnt"
    mkfs_image "$r" "$1" "$BASE_SIZE" warren-base
}

# Debian's tree with the kernel's packages, as a tar (owners and modes kept): the
# slow part, redone only when the package lists change.
build_ci_tree() { # OUT
    local r=$work/ci-tree mirrors=()
    host_sources
    [ -s "$work/host.list" ] && mirrors+=("$work/host.list")
    [ -s "$work/host.sources" ] && mirrors+=("$work/host.sources")
    [ ${#mirrors[@]} -gt 0 ] || die "the host's apt sources have no Debian $SUITE entry"
    # Recommends stay out (no compilers, X, fonts beyond matplotlib's own); docs,
    # man pages and translations too. Every file gets one time in the tar so it
    # does not depend on when it was made.
    mmdebstrap --quiet --variant=minbase --mode=root --include="$BASE_PACKAGES,$CI_PACKAGES" \
        --aptopt='APT::Install-Recommends "false"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/*.bin "$1"/var/lib/apt/lists/* "$1"/var/log/*.log' \
        "$SUITE" "$r" "${mirrors[@]}" || die "mmdebstrap failed"
    add_user "$r" /bin/bash
    mkdir -p "$r/mnt"
    (cd "$r" && find . -mindepth 1 | LC_ALL=C sort |
        tar --no-recursion --numeric-owner --mtime=@0 -cf - -T -) >"$1"
    rm -rf "$r"
}

# The tree, then the bridge (kerneld.py) and the warm hook: docs/KERNELD.md.
build_ci() { # OUT
    local r=$work/ci
    mkdir -p "$r"
    tar -xpf "${part[code-interpreter.tree.tar]}" --numeric-owner -C "$r"
    install -D -m 0644 "$ci_dir/kerneld.py" "$r/usr/lib/warren/kerneld.py"
    install -D -m 0755 "$ci_dir/warm" "$r/etc/warren/warm"
    # matplotlib draws to files, never to a display; its font cache is built here
    # once so no sandbox pays for it.
    mkdir -p "$r/etc/matplotlib"
    echo 'backend: Agg' >"$r/etc/matplotlib/matplotlibrc"
    chroot "$r" env HOME=/root MPLCONFIGDIR=/var/cache/matplotlib \
        python3 -c 'import matplotlib.font_manager' || die "matplotlib does not import in the image"
    chmod -R a+rX "$r/var/cache/matplotlib"
    mkfs_image "$r" "$1" "$CI_SIZE" warren-ci
    rm -rf "$r"
}

# --- assemble ----------------------------------------------------------------
built=0
for n in $names; do
    p=${part[$n]}
    if [ ! -f "$p" ]; then
        case "$n" in
        vmlinux) say "vmlinux ($krel)"; build_vmlinux "$work/$n" ;;
        initramfs.cpio) say "initramfs.cpio (warren-init + modules)"; build_initramfs "$work/$n" ;;
        minimal.ext4) say "minimal.ext4 (busybox)"; build_minimal "$work/$n" ;;
        base.ext4) say "base.ext4 (Debian $SUITE: $BASE_PACKAGES)"; build_base "$work/$n" ;;
        code-interpreter.tree.tar) say "code-interpreter tree (+ $CI_PACKAGES)"; build_ci_tree "$work/$n" ;;
        code-interpreter.ext4) say "code-interpreter.ext4 (kerneld)"; build_ci "$work/$n" ;;
        esac
        mv "$work/$n" "$p"
        built=1
    fi
done

mkdir -p "$out"
for n in $SETS; do # --only still links what exists
    [ -f "$out/$n" ] || [ ! -f "${part[$n]}" ] || ln "${part[$n]}" "$out/$n"
done
complete=1
for n in $SETS; do
    [ -f "$out/$n" ] || complete=0
done
if [ ! -f "$out/manifest" ] || [ $built = 1 ]; then
    {
        echo "key $key"
        echo "complete $complete"
        echo "kernel_release $krel"
        echo "kernel_package $kpkg $kver"
        echo "modules $MODULES"
        echo "warren_init_sha256 $init_sha"
        for n in $SETS; do
            if [ -f "$out/$n" ]; then echo "file $n $(stat -c %s "$out/$n")"; fi
        done
    } >"$work/manifest"
    mv "$work/manifest" "$out/manifest"
fi
touch "$out"
ln -sfn "$key" "$cache/images/.current.new"
mv -T "$cache/images/.current.new" "$cache/images/current"

# Old image sets go, newest first kept; a part goes when no set links it.
ls -1dt "$cache/images/"*/ | sed 's|/$||' | grep -E '/[0-9a-f]{16}$' | grep -v "/$key\$" |
    tail -n +$((KEEP + 1)) | while read -r d; do rm -rf "$d"; done || true
find "$parts" -maxdepth 1 -type f -links 1 -delete

if [ $built = 1 ]; then
    say "done in $(($(date +%s) - t0)) s: $out"
else
    say "up to date: $out"
fi
