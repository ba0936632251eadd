#!/usr/bin/env bash
# Installs what the build needs (Debian 12, as root), builds everything in build/ with 2 jobs, and
# runs the test suites under CTest. Exits non-zero when anything fails.
#
#   bash scripts/test.sh            # normal build in build/, then the fuzz step (below)
#   bash scripts/test.sh address    # AddressSanitizer + UBSan build in build-address/
#   bash scripts/test.sh thread     # ThreadSanitizer build in build-thread/
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
ensure_packages "${COMM_BUILD_PACKAGES[@]}" "${COMM_TEST_PACKAGES[@]}"

sanitize=${1:-}
case $sanitize in
  "") build=build ;;
  address|thread) build=build-$sanitize; ensure_packages "${COMM_SANITIZE_PACKAGES[@]}" ;;
  *) echo "usage: bash scripts/test.sh [address|thread]" >&2; exit 2 ;;
esac
jobs=${COMM_JOBS:-2}

timeout 1800 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCOMM_SANITIZE="$sanitize"
timeout 2400 cmake --build "$build" -j"$jobs"
timeout 1800 ctest --test-dir "$build" --output-on-failure --timeout 300 -j1

# The fuzz step (normal run only): a clang build with ASan + UBSan in build-fuzz/ (which is also how
# CI checks that the tree builds with clang), each libFuzzer harness fuzzed for a short time
# (COMM_FUZZ_SECONDS, default 20), failing on any crash, leak or timeout, then CTest replaying the
# seed corpora and the regression inputs. scripts/fuzz.sh runs the harnesses longer by hand.
if [[ -z $sanitize ]]; then
  timeout 900 bash scripts/fuzz.sh "${COMM_FUZZ_SECONDS:-20}"
  timeout 600 ctest --test-dir build-fuzz --output-on-failure --timeout 300 -j1
fi
