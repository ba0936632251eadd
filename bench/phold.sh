#!/usr/bin/env bash
# PHOLD on libcomm's simulation engine: committed events/s, efficiency, remote fraction and rounds
# for 1, 2 and 4 processes, remote fractions 0.1, 0.25 and 1.0, in two configurations:
#   small: ROSS's defaults, 8 LPs x 1 start event per process, end 100000;
#   large: 1024 LPs x 16 start events per process, end 200.
# Lookahead and mean are ROSS's (1 and 1: every delay is exactly 1.0). --nlp is per process, so
# the model grows with the processes, as in ROSS's scaling runs. Each point is the median of the
# rounds, whose digests must agree (the tests compare digests across layouts of one model).
#
# Processes start under mpirun (PMIx) by default, or by hand with the address bootstrap (-l hand),
# unpinned by default or pinned to cores 0 and 1 in turn (-p). Before the runs the script measures
# the VM's state: libcomm's 8-byte am_lat between cores 0 and 1 (about 0.1 us in the fast state,
# 0.3-0.6 us in the slow one).
#
#   bench/phold.sh [-r rounds] [-q] [-p] [-l mpirun|hand] [-c small,large] [-b build-dir]
#                  [-o out-dir]
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/phold.sh [options]
  -r <rounds>  runs of every point; the median is reported (default 3)
  -q           quick: 1 round, a tenth of the end times
  -p           pin process r to core r % 2 (default: unpinned)
  -l <how>     launcher for several processes: mpirun (default) or hand (address bootstrap)
  -c <list>    configurations, comma-separated: small, large (default both)
  -b <dir>     build directory holding bench/comm_phold (default: build)
  -o <dir>     where the .dat, .png and logs go (default: <build-dir>/phold)
  -h           this help
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
rounds=3
scale=1
pin=0
launcher=mpirun
configs=small,large
build="$repo/build"
out=""
while getopts "r:qpl:c:b:o:h" opt; do
  case $opt in
    r) rounds=$OPTARG ;;
    q) rounds=1; scale=10 ;;
    p) pin=1 ;;
    l) launcher=$OPTARG ;;
    c) configs=$OPTARG ;;
    b) build=$(cd "$OPTARG" && pwd) ;;
    o) out=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]{0,2}$ ]] || { echo "rounds must be 1..999" >&2; exit 2; }
[[ $launcher == mpirun || $launcher == hand ]] || { echo "launcher: mpirun or hand" >&2; exit 2; }
out=${out:-$build/phold}
mkdir -p "$out"
phold="$build/bench/comm_phold"
perftest="$build/bench/comm_perftest"
[[ -x $phold ]] || { echo "no $phold: build first" >&2; exit 1; }
if [[ $launcher == mpirun ]]; then
  command -v mpirun >/dev/null || { echo "mpirun not found (apt-get install openmpi-bin)" >&2; exit 1; }
fi
log="$out/phold.log"
: >"$log"
port=$((24000 + $$ % 2000))

# -- the VM's state ---------------------------------------------------------------------------------

# Prints libcomm's 8-byte am_lat in us between cores 0 and 1 (empty when comm_perftest is missing).
machine_latency() {
  [[ -x $perftest ]] || return 0
  port=$((port + 1))
  COMM_TLS=shm,self timeout 60 "$perftest" -c 0 -p "$port" >>"$log" 2>&1 &
  local server=$!
  sleep 0.3
  COMM_TLS=shm,self timeout 60 "$perftest" localhost -t am_lat -s 8 -n 200000 -w 20000 -c 1 \
    -p "$port" -f 2>>"$log" | awk '/^ *[0-9]/ { v = $4 } END { if (v != "") print v }'
  wait "$server" 2>/dev/null || true
}

# -- one run ----------------------------------------------------------------------------------------

# run <processes> <comm_phold arguments...>: prints the JSON line of one run.
run() {
  local np=$1
  shift
  local args=(--json --quiet --no-progress "$@")
  if [[ $np == 1 ]]; then
    if [[ $pin == 1 ]]; then taskset -c 0 "$phold" "${args[@]}"; else "$phold" "${args[@]}"; fi
  elif [[ $launcher == mpirun ]]; then
    local bind=(--bind-to none)
    [[ $pin == 1 ]] && bind=(--map-by core --bind-to core:overload-allowed)
    mpirun --allow-run-as-root --oversubscribe -np "$np" "${bind[@]}" "$phold" "${args[@]}"
  else
    port=$((port + 1))
    local pids=() r
    for ((r = 0; r < np; r++)); do
      local wrap=()
      [[ $pin == 1 ]] && wrap=(taskset -c $((r % 2)))
      COMM_BOOTSTRAP_ADDRESS=127.0.0.1:$port COMM_SIZE=$np COMM_RANK=$r \
        "${wrap[@]}" "$phold" "${args[@]}" &
      pids+=($!)
    done
    local failed=0
    for r in "${pids[@]}"; do wait "$r" || failed=1; done
    return $failed
  fi
}

# field <json> <name>: one field of a JSON line (numbers and strings without quotes).
field() { sed -E "s/.*\"$2\":\"?([^,\"}]*).*/\1/" <<<"$1"; }

# median of the arguments (numbers).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# -- the runs ---------------------------------------------------------------------------------------

state_before=$(machine_latency)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
dat="$out/phold.dat"
echo "# config remote processes events_per_s efficiency remote_fraction rounds digest" >"$dat"
printf '%-6s %6s %4s %14s %10s %9s %8s  %s\n' config remote np "events/s" efficiency remote \
  rounds digest
mismatch=0
for config in ${configs//,/ }; do
  case $config in
    small) model=(--nlp 8 --start-events 1 --end $((100000 / scale))) ;;
    large) model=(--nlp 1024 --start-events 16 --end $((200 / scale))) ;;
    *) echo "unknown configuration $config" >&2; exit 2 ;;
  esac
  for remote in 0.1 0.25 1.0; do
    for np in 1 2 4; do
      rates=()
      digest=""
      for ((i = 0; i < rounds; i++)); do
        json=$(run "$np" "${model[@]}" --remote "$remote" 2>>"$log" | tail -n 1)
        echo "$config $remote $np: $json" >>"$log"
        [[ $json == \{* ]] || { echo "run failed: $config remote $remote, $np processes (see $log)" >&2; exit 1; }
        rates+=("$(field "$json" events_per_s)")
        d=$(field "$json" digest)
        if [[ -n $digest && $d != "$digest" ]]; then
          echo "DIGEST MISMATCH: $config remote $remote, $np processes: $digest vs $d" >&2
          mismatch=1
        fi
        digest=$d
      done
      eps=$(median "${rates[@]}")
      printf '%-6s %6s %4s %14.0f %10s %9s %8s  %s\n' "$config" "$remote" "$np" "$eps" \
        "$(field "$json" efficiency)" "$(field "$json" remote)" "$(field "$json" rounds)" "$digest"
      echo "$config $remote $np $eps $(field "$json" efficiency) $(field "$json" remote)" \
        "$(field "$json" rounds) $digest" >>"$dat"
    done
  done
done
state_after=$(machine_latency)
echo
echo "launcher: $launcher, $([[ $pin == 1 ]] && echo "pinned to cores 0 and 1" || echo unpinned)," \
  "$rounds round(s) per point (median)"
echo "VM state: libcomm am_lat 8 B = ${state_before:-?} us before, ${state_after:-?} us after" \
  "(fast state about 0.1 us, slow 0.3-0.6 us)"
echo "load average: $load_before before, $(cut -d' ' -f1-3 /proc/loadavg) after"
echo "data: $dat, log: $log"
if command -v gnuplot >/dev/null; then
  gnuplot -e "datafile='$dat'; outfile='$out/phold.png'; configs='${configs//,/ }'" \
    "$here/phold_plot.gnuplot" &&
    echo "plot: $out/phold.png"
fi
exit $mismatch
