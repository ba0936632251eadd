#!/usr/bin/env bash
# Instructions per message pair of bm_api's cases, counted by valgrind's callgrind: the low-level
# API against the C++ face on the same traffic, without the noise of timings on a shared machine
# (and on machines whose perf has no hardware counters). Each case's timed loop is dumped with its
# iteration count (bm_api's loop_cost); the last, longest run of each case is divided.
#
#   bench/bm_api_count.sh [-b build-dir] [-f benchmark-filter]
#
# Prints "case instructions-per-iteration iterations". Needs valgrind; takes about a minute. The
# default filter takes the self transport's cases: valgrind 3.19 lacks pidfd_open, without which
# the shm transport reaches no peer; what the face adds is the same on either transport.
set -euo pipefail

build=build
filter='self/8$'
while getopts "b:f:h" opt; do
  case $opt in
    b) build=$OPTARG ;;
    f) filter=$OPTARG ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done

bin=$build/bench/bm_api
[[ -x $bin ]] || { echo "no $bin: build the bm_api target" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
timeout 900 valgrind --tool=callgrind --callgrind-out-file="$out/cg.%p" \
  "$bin" --benchmark_filter="$filter" --benchmark_min_time=0.05 >"$out/log" 2>&1 ||
  { tail -20 "$out/log" >&2; exit 1; }

# Each dump: "desc: Trigger: Client Request: bm_api <case> iterations=<n>" and "totals: <Ir>".
for f in "$out"/cg.*; do
  awk '/^desc: Trigger: Client Request: bm_api /{name=$6; split($7, it, "="); n=it[2]}
       /^(totals|summary):/{ir=$2}
       END{if (name != "") print name, ir, n}' "$f"
done | awk '{if ($3 > best[$1]) {best[$1] = $3; ir[$1] = $2}}
            END{for (c in best) printf "%-28s %8.1f %8d\n", c, ir[c] / best[c], best[c]}' |
  sort
