#!/usr/bin/env bash
# deploy/check.sh - check every deploy file with what works offline: yamllint,
# the Kubernetes schemas and Warren's own needs (check.mjs), warrend's parser on
# each embedded warren.conf, and HAProxy's parser on a generated haproxy.cfg.
#
#   deploy/check.sh WARREND NODE_MODULES
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
warrend=$1
export NODE_MODULES=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

yamllint -s -c "$here/.yamllint" "$here/kubernetes"
echo "ok yamllint"
node "$here/check.mjs" "$tmp" "$here"/kubernetes/*.yaml "$here"/nomad/*.hcl
n=0
for conf in "$tmp"/*.conf; do
    # The files a conf names live on the cluster: stand-ins let warrend parse it here.
    sed -e "s|/etc/warren/secret/|$tmp/secret/|; s|/tmp/secrets/|$tmp/secret/|" \
        -e "s|^state_dir = .*|state_dir = $tmp/state|; s|^image_dir = .*|image_dir = $tmp|" \
        "$conf" >"$conf.local"
    WARREN_HOST_ID=warren-$n "$warrend" --check-config -c "$conf.local"
    n=$((n + 1))
done
[ "$n" -ge 2 ] || { echo "FAIL: expected a warren.conf in the StatefulSet's ConfigMap and the Nomad job"; exit 1; }
python3 "$here/haproxy/warren-haproxy.py" --bind 127.0.0.1:18080 --domain sbx.example.com \
    --host h0=10.0.0.10:8080 --host h1=10.0.0.11:8080 --host h2=10.0.0.12:8080 >"$tmp/haproxy.cfg"
haproxy -c -q -f "$tmp/haproxy.cfg"
echo "ok haproxy -c on a generated haproxy.cfg"
