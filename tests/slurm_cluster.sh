#!/usr/bin/env bash
# A single-node Slurm for tests: slurmctld and slurmd as root, without systemd, munge or cgroups,
# with their configuration, state and logs in one temporary folder. See tests/launch.hpp for the
# C++ side.
#
#   tests/slurm_cluster.sh start DIR [OWNER_PID]   starts the daemons; prints SLURM_CONF=DIR/slurm.conf
#   tests/slurm_cluster.sh stop DIR                stops them and removes DIR
#   tests/slurm_cluster.sh run N PROGRAM [ARGS...] starts a cluster, runs srun --mpi=pmix -n N, stops
#
# start waits at most 30 s for the node to be idle, retrying with other ports when one is taken,
# and exits non-zero (with the daemons' logs on stderr) when it does not come up. It leaves a
# watchdog behind that stops the cluster when OWNER_PID (default: the caller) is gone, or after
# COMM_SLURM_LIFETIME seconds (default 1800) whatever happens. Use srun with
# SLURM_CONF=DIR/slurm.conf in the environment.
set -euo pipefail

readonly start_wait_s=30
readonly lifetime_s=${COMM_SLURM_LIFETIME:-1800}
# CPUs the node declares (config_overrides: more than the machine has), so that srun -n N starts N
# tasks at once on a small machine instead of queueing them.
readonly node_cpus=64

usage() {
  echo "usage: $0 start DIR [OWNER_PID] | stop DIR | run N PROGRAM [ARGS...]" >&2
  exit 2
}

# A port from 20000-59999 that nothing listens on (tcp), and whose successor is free too.
free_port_pair() {
  local used port
  used=$(ss -Htan 2>/dev/null | awk '{print $4}' | sed 's/.*://' | sort -u)
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 40000))
    if ! grep -qx "$port" <<<"$used" && ! grep -qx "$((port + 1))" <<<"$used"; then
      echo "$port"
      return 0
    fi
  done
  return 1
}

write_conf() {
  local dir=$1 port=$2 host
  host=$(hostname -s)
  cat >"$dir/slurm.conf" <<EOF
ClusterName=commtest
SlurmctldHost=$host
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=10
SlurmdTimeout=10
MessageTimeout=5
InactiveLimit=0
SlurmdParameters=config_overrides
KillWait=2
NodeName=$host CPUs=$node_cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# Cancels the jobs still running, stops every daemon of DIR (the process groups recorded at
# start) and waits for them a moment.
kill_daemons() {
  local dir=$1 pgid
  [[ -f $dir/pgids ]] || return 0
  SLURM_CONF=$dir/slurm.conf timeout 5 scancel --quiet --user=root >/dev/null 2>&1 || true
  for _ in $(seq 1 50); do
    [[ -z $(SLURM_CONF=$dir/slurm.conf timeout 5 squeue -h 2>/dev/null) ]] && break
    sleep 0.1
  done
  SLURM_CONF=$dir/slurm.conf timeout 5 scontrol shutdown >/dev/null 2>&1 || true
  for pgid in $(cat "$dir/pgids"); do
    for _ in $(seq 1 20); do
      kill -0 -- "-$pgid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$pgid" 2>/dev/null || true
  done
  rm -f "$dir/pgids"
}

# True once sinfo shows the node idle.
node_idle() {
  local dir=$1
  SLURM_CONF=$dir/slurm.conf timeout 5 sinfo -h -o %t 2>/dev/null | grep -q '^idle'
}

# Starts both daemons in their own process groups; true once the node is idle.
start_daemons() {
  local dir=$1 deadline
  mkdir -p "$dir/state" "$dir/spool"
  SLURM_CONF=$dir/slurm.conf setsid slurmctld -D -i -f "$dir/slurm.conf" \
    >"$dir/slurmctld.out" 2>&1 </dev/null &
  echo $! >>"$dir/pgids"
  SLURM_CONF=$dir/slurm.conf setsid slurmd -D -f "$dir/slurm.conf" \
    >"$dir/slurmd.out" 2>&1 </dev/null &
  echo $! >>"$dir/pgids"
  deadline=$((SECONDS + start_wait_s))
  while ((SECONDS < deadline)); do
    node_idle "$dir" && return 0
    for pid in $(cat "$dir/pgids"); do
      kill -0 "$pid" 2>/dev/null || return 1  # a daemon died (a port taken, a bad config)
    done
    sleep 0.2
  done
  return 1
}

# Removes DIR: all of it when it holds a cluster, else only when it is empty (never a folder given
# by mistake).
remove_dir() {
  local dir=$1
  if [[ -f $dir/slurm.conf ]]; then
    rm -rf "$dir" 2>/dev/null || { sleep 0.5; rm -rf "$dir"; }  # a daemon may write as it ends
  else
    rmdir "$dir" 2>/dev/null || true
  fi
}

# Stops the cluster of DIR once OWNER is gone or the lifetime has passed, unless stop does.
watchdog() {
  local dir=$1 owner=$2 deadline=$((SECONDS + lifetime_s))
  while kill -0 "$owner" 2>/dev/null && [[ -f $dir/pgids && ! -f $dir/stopping ]] &&
    ((SECONDS < deadline)); do
    sleep 1
  done
  [[ -f $dir/stopping ]] && return 0
  kill_daemons "$dir"
  remove_dir "$dir"
}

start() {
  local dir=$1 owner=$2 port attempt
  mkdir -p "$dir"
  for attempt in 1 2 3; do
    port=$(free_port_pair) || break
    write_conf "$dir" "$port"
    if start_daemons "$dir"; then
      setsid bash "$0" watchdog "$dir" "$owner" </dev/null >/dev/null 2>&1 &
      echo "SLURM_CONF=$dir/slurm.conf"
      return 0
    fi
    kill_daemons "$dir"
    rm -rf "$dir/state" "$dir/spool"
  done
  echo "slurm_cluster: the node did not become idle within ${start_wait_s} s" >&2
  tail -n 20 "$dir"/*.log "$dir"/*.out >&2 2>/dev/null || true
  return 1
}

stop() {
  local dir=$1
  [[ -d $dir ]] || return 0
  [[ -f $dir/slurm.conf ]] && touch "$dir/stopping"
  kill_daemons "$dir"
  remove_dir "$dir"
}

run() {
  local n=$1 rc=0
  shift
  run_dir=$(mktemp -d /tmp/comm-slurm.XXXXXX)
  trap 'stop "$run_dir"' EXIT
  trap 'exit 130' INT TERM
  start "$run_dir" $$ >/dev/null
  SLURM_CONF=$run_dir/slurm.conf srun --mpi=pmix -n "$n" "$@" || rc=$?
  return "$rc"
}

case ${1:-} in
  start) [[ $# -ge 2 ]] || usage; start "$2" "${3:-$PPID}" ;;
  stop) [[ $# -eq 2 ]] || usage; stop "$2" ;;
  run) [[ $# -ge 3 ]] || usage; shift; run "$@" ;;
  watchdog) watchdog "$2" "$3" ;;
  *) usage ;;
esac
