#!/usr/bin/env bash
# Runs UCX's ucx_perftest and libcomm's comm_perftest alternately on this machine over the same
# transport, servers pinned to core 0 and clients to core 1, and prints the median of each over the
# rounds with their ratio. Writes the numbers to a .dat file and, when gnuplot is installed, a PNG
# (latency, tag bandwidth and RMA bandwidth against message size).
#
# Transports (-t): shm (the default: UCX_TLS=shm,self against COMM_TLS=shm,self) or tcp over
# loopback (UCX_TLS=tcp UCX_NET_DEVICES=lo against COMM_TLS=tcp COMM_TCP_DEVICE=lo; fewer
# iterations, as a round trip through the kernel costs tens of times one through shared memory).
#
# Tests: tag_lat (8 B .. 1 MiB), tag_bw (8 B .. 4 MiB; 64 KiB and up go by rendezvous), am_lat,
# put_bw and get (64 KiB, 1 MiB; UCX's ucp_put_bw and ucp_get), stream_lat (8 B, 4 KiB) and
# stream_bw (8 B .. 1 MiB; UCX's stream tests receive with ucp_stream_recv). Both tools get the same window
# (ucx_perftest's -O, comm_perftest's -W): ucx_perftest's defaults, 32 for the streaming tests and
# 1 for get (one get at a time, so get's bandwidth is size / latency of one get).
#
#   bench/compare_ucx.sh [-t shm|tcp] [-r rounds] [-n iterations] [-q] [-f filter] [-b build-dir]
#                        [-o out-dir] [-p port] [-u ucx-tls]
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: bench/compare_ucx.sh [options]
  -t <tl>      transport: shm (default) or tcp (loopback)
  -r <rounds>  rounds of every test, alternating UCX and libcomm (default 3)
  -n <iters>   iterations of every test (default: per test, 2000-10M; 0.2-2 s each)
  -q           quick: 1 round, half the default iterations (about 10 s on an idle machine)
  -f <regex>   only the tests whose "test size" matches, e.g. 'tag_lat 8$|tag_bw (65536|4194304)'
  -b <dir>     build directory holding bench/comm_perftest (default: build)
  -o <dir>     where the .dat, .png and logs go (default: <build-dir>/compare, or
               <build-dir>/compare-tcp with -t tcp)
  -p <port>    first bootstrap port; every run uses the next one (default 23000)
  -m <alloc>   libcomm's buffers: host (heap, the default) or shared (comm::mem_alloc, the
               counterpart of ucx_perftest's ucp_mem_map(ALLOCATE) buffers)
  -u <tls>     UCX_TLS of the shm runs (default shm,self; e.g. posix,self)
  -h           this help
EOF
}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
rounds=3
iters=""
scale=1
build="$repo/build"
out=""
port=23000
tl=shm
filter=""
alloc=host
ucx_shm_tls=shm,self
while getopts "t:r:n:qf:b:o:p:m:u:h" opt; do
  case $opt in
    t) tl=$OPTARG ;;
    f) filter=$OPTARG ;;
    r) rounds=$OPTARG ;;
    n) iters=$OPTARG ;;
    q) rounds=1; scale=2 ;;
    b) build=$(cd "$OPTARG" && pwd) ;;
    o) out=$OPTARG ;;
    p) port=$OPTARG ;;
    m) alloc=$OPTARG ;;
    u) ucx_shm_tls=$OPTARG ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]{0,2}$ ]] || { echo "rounds must be 1..999" >&2; exit 2; }
[[ -z $iters || $iters =~ ^[1-9][0-9]{0,9}$ ]] || { echo "bad iteration count" >&2; exit 2; }
[[ $alloc == host || $alloc == shared ]] || { echo "alloc must be host or shared" >&2; exit 2; }
[[ $ucx_shm_tls =~ ^[a-z_,]+$ ]] || { echo "bad UCX_TLS list" >&2; exit 2; }
case $tl in
  shm) ucx_env=(UCX_TLS=$ucx_shm_tls); comm_env=(COMM_TLS=shm,self); out=${out:-$build/compare} ;;
  tcp) ucx_env=(UCX_TLS=tcp UCX_NET_DEVICES=lo); comm_env=(COMM_TLS=tcp COMM_TCP_DEVICE=lo)
       out=${out:-$build/compare-tcp} ;;
  *) echo "transport must be shm or tcp" >&2; exit 2 ;;
esac
mkdir -p "$out"
ours="$build/bench/comm_perftest"
[[ -x $ours ]] || { echo "no $ours: build first (bash scripts/test.sh or cmake --build)" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest not found (apt-get install ucx-utils)" >&2; exit 1; }

# test | size | default iterations | UCX's name for it | window (-O / -W; - for ping-pongs)
# (each run takes 0.2-2 s on an idle 2-vCPU machine, long enough to ride over short noise; RMA
# runs are longer for libcomm, whose shm RMA goes through CMA while ucx_perftest's buffers are
# shared segments the peer maps)
shm_tests=(
  "tag_lat 8 1000000 tag_lat -"
  "tag_lat 4096 500000 tag_lat -"
  "tag_lat 65536 50000 tag_lat -"
  "tag_lat 1048576 4000 tag_lat -"
  "tag_bw 8 10000000 tag_bw 32"
  "tag_bw 4096 2000000 tag_bw 32"
  "tag_bw 65536 100000 tag_bw 32"
  "tag_bw 1048576 8000 tag_bw 32"
  "tag_bw 4194304 2000 tag_bw 32"
  "am_lat 8 1000000 ucp_am_lat -"
  "put_bw 65536 300000 ucp_put_bw 32"
  "put_bw 1048576 20000 ucp_put_bw 32"
  "get 65536 300000 ucp_get 1"
  "get 1048576 20000 ucp_get 1"
  "stream_lat 8 1000000 stream_lat -"
  "stream_lat 4096 500000 stream_lat -"
  "stream_bw 8 10000000 stream_bw 32"
  "stream_bw 4096 2000000 stream_bw 32"
  "stream_bw 65536 100000 stream_bw 32"
  "stream_bw 1048576 8000 stream_bw 32"
)
# Over tcp a ping-pong of 8 bytes takes ~5 us instead of ~0.3, and bandwidth is a few GB/s.
tcp_tests=(
  "tag_lat 8 200000 tag_lat -"
  "tag_lat 4096 100000 tag_lat -"
  "tag_lat 65536 20000 tag_lat -"
  "tag_lat 1048576 1000 tag_lat -"
  "tag_bw 8 2000000 tag_bw 32"
  "tag_bw 4096 400000 tag_bw 32"
  "tag_bw 65536 40000 tag_bw 32"
  "tag_bw 1048576 2000 tag_bw 32"
  "tag_bw 4194304 500 tag_bw 32"
  "am_lat 8 200000 ucp_am_lat -"
  "put_bw 65536 40000 ucp_put_bw 32"
  "put_bw 1048576 2000 ucp_put_bw 32"
  "get 65536 20000 ucp_get 1"
  "get 1048576 2000 ucp_get 1"
  "stream_lat 8 200000 stream_lat -"
  "stream_bw 8 2000000 stream_bw 32"
  "stream_bw 65536 40000 stream_bw 32"
)
if [[ $tl == tcp ]]; then tests=("${tcp_tests[@]}"); else tests=("${shm_tests[@]}"); fi
run_timeout=120
server_pid=""

# Kills the server this script started, if it still runs.
cleanup() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  server_pid=""
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

# Waits up to 5 s for a listener on TCP port $1.
wait_listen() {
  local i
  for ((i = 0; i < 100; i++)); do
    ss -Hltn "sport = :$1" 2>/dev/null | grep -q . && return 0
    sleep 0.05
  done
  return 1
}

# Waits up to 10 s for the server to exit on its own, then kills it.
reap_server() {
  local i
  for ((i = 0; i < 200; i++)); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  cleanup
}

# Prints the metric of a `Final:` row: overall latency (usec) for the ping-pong tests, overall
# message rate for 8-byte streaming tests, overall bandwidth (MB/s) for larger ones (get included).
metric() { # test size log
  local col
  case $1 in
    *_lat) col=5 ;;
    *) if (($2 <= 8)); then col=9; else col=7; fi ;;
  esac
  awk -v c="$col" '/^Final:/ { v = $c } END { if (v == "") print "NA"; else print v }' "$3"
}

# One run: lib (ucx|comm), test, size, iterations, UCX test name, window (- for none), log file.
# Sets $result to the metric (NA when the run failed). Not run in a subshell: it advances $port and
# owns $server_pid.
result=NA
run_one() {
  local lib=$1 test=$2 size=$3 n=$4 ucx_test=$5 window=$6 log=$7
  port=$((port + 1))
  local w=$(( n / 10 > 10000 ? 10000 : n / 10 ))
  local ucx_window=() our_window=()
  if [[ $window != - ]]; then ucx_window=(-O "$window"); our_window=(-W "$window"); fi
  if [[ $lib == ucx ]]; then
    env "${ucx_env[@]}" timeout "$run_timeout" taskset -c 0 ucx_perftest -p "$port" \
      >"$log.server" 2>&1 &
  else
    env "${comm_env[@]}" timeout "$run_timeout" "$ours" -p "$port" -c 0 >"$log.server" 2>&1 &
  fi
  server_pid=$!
  if ! wait_listen "$port"; then
    echo "  $lib server on port $port did not start (see $log.server)" >&2
    cleanup; result=NA; return
  fi
  if [[ $lib == ucx ]]; then
    env "${ucx_env[@]}" timeout "$run_timeout" taskset -c 1 ucx_perftest localhost -p "$port" \
      -t "$ucx_test" -s "$size" -n "$n" -w "$w" "${ucx_window[@]}" >"$log" 2>&1 || true
  else
    env "${comm_env[@]}" timeout "$run_timeout" "$ours" localhost -p "$port" -c 1 \
      -t "$test" -s "$size" -n "$n" -w "$w" -m "$alloc" "${our_window[@]}" >"$log" 2>&1 || true
  fi
  reap_server
  result=$(metric "$test" "$size" "$log")
}

# Median of the numbers given (NA ignored); NA when there are none.
median() {
  printf '%s\n' "$@" | grep -v '^NA$' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "NA";
          else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# Formats the number on stdin with printf format $1; NA stays NA.
tidy() { awk -v f="$1" '{ if ($1 == "NA") print "NA"; else printf f "\n", $1 }'; }

# The load average (1 min) from /proc/loadavg.
load1() { cut -d' ' -f1 /proc/loadavg; }

dat="$out/compare_ucx.dat"
load_start=$(load1)
{
  echo "# libcomm comm_perftest vs UCX ucx_perftest, $tl (${ucx_env[*]} vs ${comm_env[*]}),"
  echo "# cores 0/1, median of $rounds round(s), libcomm buffers: $alloc"
  echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs, load average at start $load_start"
  echo "# test size metric ucx ours ratio(ours/ucx)"
} >"$dat"
echo "load average at start: $load_start" >&2
started=$SECONDS
table=()
for spec in "${tests[@]}"; do
  read -r test size default_n ucx_test window <<<"$spec"
  [[ -z $filter || "$test $size" =~ $filter ]] || continue
  n=${iters:-$((default_n / scale))}
  ((n >= 100 || ${#iters} > 0)) || n=100
  ucx_vals=() our_vals=()
  for ((r = 1; r <= rounds; r++)); do
    log="$out/${test}_${size}_r$r"
    # Alternate which library goes first, so drift on a noisy machine hits both.
    if ((r % 2)); then order="ucx comm"; else order="comm ucx"; fi
    for lib in $order; do
      run_one "$lib" "$test" "$size" "$n" "$ucx_test" "$window" "$log.$lib.log"
      if [[ $lib == ucx ]]; then ucx_vals+=("$result"); else our_vals+=("$result"); fi
    done
    echo "  $test $size round $r/$rounds: ucx ${ucx_vals[-1]}  comm ${our_vals[-1]}" >&2
  done
  case $test in
    *_lat) unit="usec"; fmt="%.3f"; better="lower is better" ;;
    *) if ((size <= 8)); then unit="msg/s"; fmt="%.0f"; else unit="MB/s"; fmt="%.1f"; fi
       better="higher is better" ;;
  esac
  u=$(median "${ucx_vals[@]}" | tidy "$fmt")
  o=$(median "${our_vals[@]}" | tidy "$fmt")
  ratio=$(awk -v u="$u" -v o="$o" 'BEGIN { if (u == "NA" || o == "NA" || u == 0) print "NA";
                                            else printf "%.2f", o / u }')
  echo "$test $size $unit $u $o $ratio" >>"$dat"
  table+=("$(printf '%-10s %7s %-6s %12s %12s %7s  %s' "$test" "$size" "$unit" "$u" "$o" "$ratio" "$better")")
done

load_end=$(load1)
echo "# load average at end $load_end, $((SECONDS - started)) s" >>"$dat"
echo
printf '%-10s %7s %-6s %12s %12s %7s  %s\n' test size unit UCX ours ratio "(ratio = ours/UCX)"
printf '%s\n' "${table[@]}"
echo
echo "load average: $load_start at start, $load_end at end; $((SECONDS - started)) s"
echo "numbers: $dat"
if [[ -n $filter ]]; then
  echo "plot:    only for a run of every test (-f picked some)"
elif command -v gnuplot >/dev/null; then
  case $tl in shm) what="shared memory" ;; tcp) what="tcp over loopback" ;; esac
  if gnuplot -e "datafile='$dat'; outfile='$out/compare_ucx.png'; transport='$what'" \
       "$here/plot_compare.gnuplot" 2>"$out/gnuplot.log"; then
    echo "plot:    $out/compare_ucx.png"
  else
    echo "plot:    gnuplot failed (see $out/gnuplot.log)"
  fi
fi
