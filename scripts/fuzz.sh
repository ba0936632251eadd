#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan, in build-fuzz/) and fuzzes each for a while.
# Exits non-zero when a harness crashes, leaks, times out or runs out of memory; the input that did
# it is saved as build-fuzz/artifacts/<harness>-crash-<hash> (or leak-, timeout-, oom-).
#
#   bash scripts/fuzz.sh                      # every harness, 300 s each
#   bash scripts/fuzz.sh 3600 fuzz_protocol   # one harness for an hour (pending ones too)
#   bash scripts/fuzz.sh seeds                # rewrite fuzz/corpus/<harness>/ from the encoders
#
# What a run finds beyond the seeds stays in build-fuzz/corpus/<harness>/ and is reused by the next
# run. A crash becomes a regression test: copy the input to fuzz/regressions/<harness>/ (CTest
# replays it), fix the bug, and keep the input.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/deps.sh
ensure_packages "${COMM_BUILD_PACKAGES[@]}" "${COMM_FUZZ_PACKAGES[@]}"

build=build-fuzz
jobs=${COMM_JOBS:-2}

configure_and_build() {
  CC=clang CXX=clang++ timeout 1200 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCOMM_BUILD_FUZZ=ON -DCOMM_BUILD_TESTS=OFF -DCOMM_BUILD_BENCH=OFF >/dev/null
  timeout 2400 cmake --build "$build" -j"$jobs"
}

# Every harness: "name max_len ci|pending" per line (fuzz/CMakeLists.txt).
harnesses() {
  cat "$build/fuzz/harnesses.txt"
}

write_seeds() {
  local name max_len status
  while read -r name max_len status; do
    rm -rf "fuzz/corpus/$name"
    mkdir -p "fuzz/corpus/$name"
    COMM_FUZZ_SEEDS="fuzz/corpus/$name" "$build/fuzz/$name"
  done < <(harnesses)
}

# Fuzzes harness $1 (max_len $2) for $3 seconds.
fuzz_one() {
  local name=$1 max_len=$2 seconds=$3
  local work="$build/corpus/$name" dict="fuzz/dict/$name.dict" extra=()
  mkdir -p "$work" "$build/artifacts"
  [[ -f $dict ]] && extra+=(-dict="$dict")
  [[ -d fuzz/regressions/$name ]] && extra+=("fuzz/regressions/$name")
  echo "== $name: ${seconds} s"
  # -timeout: one input running this long is a hang; -rss_limit_mb: memory beyond this is a bug.
  # A run ends on the first crash, leak, timeout or out-of-memory with a non-zero status.
  COMM_LOG_LEVEL=error timeout $((seconds + 120)) "$build/fuzz/$name" \
    -max_total_time="$seconds" -max_len="$max_len" -timeout=25 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$build/artifacts/$name-" \
    "$work" "fuzz/corpus/$name" "${extra[@]}" 2>"$build/artifacts/$name.log" ||
    { tail -n 60 "$build/artifacts/$name.log"; echo "== $name FAILED" >&2; return 1; }
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb' "$build/artifacts/$name.log" |
    tr '\n' ' '
  echo
}

configure_and_build
if [[ ${1:-} == seeds ]]; then
  write_seeds
  exit 0
fi
seconds=${1:-300}
shift || true
failed=0
while read -r name max_len status; do
  # Named ones run whatever their status; by default, those CI fuzzes.
  if (($# > 0)); then
    [[ " $* " == *" $name "* ]] || continue
  elif [[ $status != ci ]]; then
    echo "== $name: pending (a bug it finds is being fixed elsewhere), not fuzzed"
    continue
  fi
  fuzz_one "$name" "$max_len" "$seconds" || failed=1
done < <(harnesses)
exit $failed
