#!/usr/bin/env bash
# The whole test suite, from a fresh machine of this kind: set-up (Debian
# packages, build, guest images), unit and integration tests, the same
# again under ASan+UBSan, and a short bounded run of every fuzzer.
#
#   scripts/test.sh            everything (what .ci/run calls)
#   scripts/test.sh --quick    the normal build's ctest only (skips ASan and fuzzing)
set -euo pipefail
cd "$(dirname "$0")/.."
top=$PWD
quick=0
[ "${1:-}" = "--quick" ] && quick=1

step() { printf '\n==> %s\n' "$*"; }

# Run ctest, keep its output, and add its counts to the totals printed at the end.
# ctest counts a skipped test (exit 77) as neither passed nor failed; it is
# counted here as skipped, never as passed.
passed=0
failed=0
skipped=0
summary() {
  echo "$passed passed, $failed failed, $skipped skipped"
}
run_ctest() {
  local out
  out=$(mktemp)
  set +e
  "$@" 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  set -e
  local line nskip
  line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$out" | tail -1)
  nskip=$(grep -cE '^[[:space:]]*[0-9]+ - .*\(Skipped\)$' "$out" || true)
  rm -f "$out"
  if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
    failed=$((failed + BASH_REMATCH[1]))
    passed=$((passed + BASH_REMATCH[2] - BASH_REMATCH[1] - nskip))
    skipped=$((skipped + nskip))
  fi
  if [ "$rc" != 0 ]; then
    summary
    exit "$rc"
  fi
  # Set-up builds the images and installs QEMU, so every VM test can run on
  # this machine: a skip here means a broken set-up hiding behind a green line.
  if [ "$nskip" -gt 0 ] && [ "${WARREN_ALLOW_SKIP:-0}" != 1 ]; then
    echo "error: $nskip test(s) skipped on a machine that can run them (WARREN_ALLOW_SKIP=1 to allow)" >&2
    failed=$((failed + nskip))
    skipped=$((skipped - nskip))
    summary
    exit 1
  fi
}

step "set-up: packages, build, guest images"
bash scripts/setup.sh --build-dir "$top/build"

# Two tests at a time (-j2): an integration test keeps about one core busy (one TCG
# vCPU and its daemon). Those that take both cores or share host state say so in
# their CMakeLists (PROCESSORS 2, RESOURCE_LOCK) and run alone.
step "unit and integration tests"
run_ctest ctest --test-dir "$top/build" -j2 --output-on-failure

if [ "$quick" = 1 ]; then
  summary
  exit 0
fi

step "ASan+UBSan build and tests"
# The npm packages setup.sh installed for this checkout (npm/current may be another's).
npm=$(sed -n 's/^WARREN_NPM:[A-Z]*=//p' "$top/build/CMakeCache.txt")
cmake -S . -B "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug -DWARREN_SANITIZE=ON ${npm:+-DWARREN_NPM="$npm"} >/dev/null
cmake --build "$top/build-asan" -j2 >/dev/null
# The browser terminal's test drives the same C paths as integration_ws_pty (which
# runs here) through Chromium, load_ws_smoke the same socket paths as
# integration_ws_pty and integration_ws_session, and integration_clients (the
# Python client and CLI) the same REST routes as the other integration tests:
# under ASan they would only add their minutes twice. integration_jupyter spends its
# time in the gateway clients and guest Python, over the kernel bridge whose C paths
# integration_code covers here; integration_fleet runs three daemons' plain VM
# scenarios (its C, fanout.c and agent_check.c, is the same under the main build's
# run); integration_watch's floods drive the guest builtin, whose host side
# test_ws_session's watch op, test_envd's watchers and the watch fuzzer cover.
# The two smoke benchmarks run whole daemons for their table's paths: the SDK's (its
# gzip write included) integration_envd covers here, the list's is integration_fleet's.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions="$top/tests/lsan.supp" WARREN_SANITIZED=1 \
  run_ctest ctest --test-dir "$top/build-asan" -j2 --output-on-failure -E '^(integration_terminal|load_ws_smoke|load_sdk_bench_smoke|load_list_smoke|integration_clients|integration_jupyter|integration_fleet|integration_watch)$'

step "fuzzers (15 s each, two at a time: each is one CPU-bound process)"
CC=clang cmake -S . -B "$top/build-fuzz" -DCMAKE_BUILD_TYPE=Debug -DWARREN_FUZZ=ON >/dev/null
cmake --build "$top/build-fuzz" -j2 --target fuzzers >/dev/null
run_ctest ctest --test-dir "$top/build-fuzz" -L fuzz -j2 --output-on-failure

# All three stages together (the line CI reads).
summary
