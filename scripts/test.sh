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

step "set-up: packages, build, guest images"
bash scripts/setup.sh --build-dir "$top/build"

# ctest runs one test at a time: every integration test boots real VMs under
# TCG, and two cores are all this machine has.
step "unit and integration tests"
ctest --test-dir "$top/build" --output-on-failure

if [ "$quick" = 1 ]; then
  exit 0
fi

step "ASan+UBSan build and tests"
cmake -S . -B "$top/build-asan" -DCMAKE_BUILD_TYPE=Debug -DWARREN_SANITIZE=ON >/dev/null
cmake --build "$top/build-asan" -j2 >/dev/null
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  LSAN_OPTIONS=suppressions="$top/tests/lsan.supp" \
  ctest --test-dir "$top/build-asan" --output-on-failure

step "fuzzers (30 s each)"
CC=clang cmake -S . -B "$top/build-fuzz" -DCMAKE_BUILD_TYPE=Debug -DWARREN_FUZZ=ON >/dev/null
cmake --build "$top/build-fuzz" -j2 --target fuzz_api fuzz_proto >/dev/null
ctest --test-dir "$top/build-fuzz" -L fuzz --output-on-failure
