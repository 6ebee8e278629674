#!/usr/bin/env bash
# Run N JAX processes on this one machine, as if each were a host of a pod.
#
# Each process gets DEVICES fake CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count)
# and talks to the others through gloo collectives, with process 0 as the coordinator on
# 127.0.0.1:PORT. It is the cheapest way to exercise the multi-host code paths (per-process
# data shards, jax.make_array_from_process_local_data, orbax multi-process checkpoints)
# before paying for a pod. The test-suite runs this script (tests/train/launch_test.py).
#
# Usage:
#   launch/local_multiprocess.sh [-n PROCESSES] [-d DEVICES] [-p PORT] [-l LOG_DIR] [-t SECONDS] \
#       -- [trainer flags...]
# Example (2 processes x 2 devices = a 4-device mesh):
#   launch/local_multiprocess.sh -n 2 -d 2 -- \
#       --gin_file=gin_configs/runs/X.gin --model_dir=/tmp/xlm_jax_mp
#
# Every process runs   $LAUNCH_CMD [trainer flags...] --coordinator_address=127.0.0.1:PORT
#                      --num_processes=N --process_id=I
# with LAUNCH_CMD defaulting to "${PYTHON:-python3} -m xlm_jax.train" (PYTHON=.venv/bin/python:
# the environment `make install` builds with constraints/tpu.txt; override LAUNCH_CMD to run
# another program with the same three flags). Output of process I goes to LOG_DIR/process_I.log.
# The script waits for all processes; as soon as one fails the others are stopped (a dead peer
# leaves the rest blocked in a collective forever) and the script exits with the first
# failure's status, printing the end of that process's log. Ctrl-C stops all of them.
set -euo pipefail

num_processes=2
devices=2
port=""
log_dir=""
time_limit=""

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

while getopts "n:d:p:l:t:h" opt; do
  case "$opt" in
    n) num_processes="$OPTARG" ;;
    d) devices="$OPTARG" ;;
    p) port="$OPTARG" ;;
    l) log_dir="$OPTARG" ;;
    t) time_limit="$OPTARG" ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ "${1:-}" == "--" ]]; then shift; fi

for pair in "n:$num_processes" "d:$devices"; do
  if ! [[ "${pair#*:}" =~ ^[1-9][0-9]*$ ]]; then
    echo "local_multiprocess.sh: -${pair%%:*} must be a positive integer, got '${pair#*:}'" >&2
    exit 2
  fi
done

python_bin="${PYTHON:-python3}"
read -r -a launch_cmd <<< "${LAUNCH_CMD:-$python_bin -m xlm_jax.train}"

# A free TCP port for the coordinator, unless one was given.
if [[ -z "$port" ]]; then
  port="$("$python_bin" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
log_dir="${log_dir:-$(mktemp -d -t xlm_jax_multiprocess.XXXXXX)}"
mkdir -p "$log_dir"

# CPU platform, N fake devices per process, gloo for cross-process CPU collectives (the
# trainer also sets jax_cpu_collectives_implementation=gloo itself; the env var covers any
# other program started through LAUNCH_CMD).
export JAX_PLATFORMS=cpu
export JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo
export XLA_FLAGS="--xla_force_host_platform_device_count=${devices}${XLA_FLAGS_EXTRA:+ $XLA_FLAGS_EXTRA}"

pids=()
stop_all() {  # stop the processes this script started, by pid
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap 'stop_all; exit 130' INT TERM
trap 'stop_all' EXIT

echo "local_multiprocess: $num_processes processes x $devices CPU devices, coordinator 127.0.0.1:$port, logs in $log_dir"
for ((i = 0; i < num_processes; i++)); do
  cmd=("${launch_cmd[@]}" "$@" "--coordinator_address=127.0.0.1:$port"
       "--num_processes=$num_processes" "--process_id=$i")
  if [[ -n "$time_limit" ]]; then cmd=(timeout "$time_limit" "${cmd[@]}"); fi
  "${cmd[@]}" > "$log_dir/process_$i.log" 2>&1 &
  pids+=("$!")
done

# Wait for every process; on the first failure stop the others.
status=0
failed=""
remaining=$num_processes
while ((remaining > 0)); do
  finished=""
  if ((BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1))); then
    if wait -n -p finished; then rc=0; else rc=$?; fi
  else  # bash < 5.1: no -p, so the failing process is not known by pid
    if wait -n; then rc=0; else rc=$?; fi
  fi
  remaining=$((remaining - 1))
  if ((rc != 0 && status == 0)); then
    status=$rc
    for i in "${!pids[@]}"; do
      if [[ "${pids[$i]}" == "$finished" ]]; then failed=$i; fi
    done
    echo "local_multiprocess: process ${failed:-?} exited with status $rc; stopping the others" >&2
    stop_all
  fi
done
trap - EXIT

if ((status != 0)); then
  if [[ -n "$failed" ]]; then
    echo "---- last lines of $log_dir/process_$failed.log ----" >&2
    tail -n 20 "$log_dir/process_$failed.log" >&2 || true
  fi
  exit "$status"
fi
echo "local_multiprocess: all $num_processes processes finished; logs in $log_dir"
