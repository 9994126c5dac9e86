#!/bin/bash
# load/exec_rt_images.sh WARREN_INIT OUT_DIR - an image set for load/exec_rt.py: the
# current cached set (~/.cache/warren/images/current) with its initramfs's /init
# replaced by WARREN_INIT. The kernel and disks are symlinks to the cache (never
# written: sandboxes run on overlays); the cache itself is not touched.
set -euo pipefail
init=$1
out=$2
cache=${WARREN_CACHE:-${HOME:-/root}/.cache/warren}/images/current
[ -f "$init" ] || { echo "no $init" >&2; exit 1; }
if readelf -l "$init" | grep -q INTERP; then echo "$init is not static" >&2; exit 1; fi
[ "$(id -u)" = 0 ] || { echo "run as root (the cpio keeps /dev/console)" >&2; exit 1; }
mkdir -p "$out"
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
(cd "$tree" && cpio --quiet -id <"$cache/initramfs.cpio")
strip -o "$tree/init" "$init"
chmod 755 "$tree/init"
(cd "$tree" && find . -mindepth 1 | LC_ALL=C sort |
    cpio --quiet -o -H newc -R 0:0 --reproducible) >"$out/initramfs.cpio.tmp"
mv "$out/initramfs.cpio.tmp" "$out/initramfs.cpio"
for n in vmlinux minimal.ext4 base.ext4; do
    ln -sfn "$(readlink -f "$cache/$n")" "$out/$n"
done
echo "$out: $(sha256sum <"$init" | cut -c1-16)"
