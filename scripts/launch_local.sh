#!/usr/bin/env bash
# Starts N local ranks of loongforge-train the way torchrun --standalone does:
# each process gets WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE,
# MASTER_ADDR=127.0.0.1 and MASTER_PORT (a free port unless MASTER_PORT is set).
#
#   bash scripts/launch_local.sh 4 --config configs/n16-tiny.yaml --set gcts.enable=true
#   LOONGFORGE_TRAIN=build/src/daemon/loongforge-train LOG_DIR=logs bash scripts/launch_local.sh 2 ...
#
# Output of rank r goes to stdout prefixed "[rank r]" (and to $LOG_DIR/rank<r>.log
# when LOG_DIR is set). SIGINT/SIGTERM are passed to every rank (they checkpoint
# and exit together). When a rank fails, the others are stopped (SIGTERM, then
# SIGKILL after 30 s) and the script exits with the first failing rank's status;
# otherwise with 0 (or 75 when the ranks asked to be requeued).
set -uo pipefail

if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: launch_local.sh N [loongforge-train arguments...]   (N: number of ranks >= 1)" >&2
  exit 2
fi
n=$1; shift
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
train=${LOONGFORGE_TRAIN:-$repo/build/src/daemon/loongforge-train}
if [ ! -x "$train" ]; then
  echo "launch_local.sh: $train is not an executable (build first, or set LOONGFORGE_TRAIN)" >&2
  exit 2
fi
port=${MASTER_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}
[ -n "${LOG_DIR:-}" ] && mkdir -p "$LOG_DIR"

pids=()
for ((r = 0; r < n; r++)); do
  (
    export WORLD_SIZE=$n RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port
    if [ -n "${LOG_DIR:-}" ]; then
      exec "$train" "$@" > >(sed -u "s/^/[rank $r] /" | tee -a "$LOG_DIR/rank$r.log") 2>&1
    else
      exec "$train" "$@" > >(sed -u "s/^/[rank $r] /") 2>&1
    fi
  ) &
  pids+=($!)
done

forward() { for p in "${pids[@]}"; do kill -"$1" "$p" 2>/dev/null; done; }
trap 'forward TERM' TERM
trap 'forward INT' INT

status=0
running=("${pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${running[@]}"
  rc=$?
  [ -z "$done_pid" ] && continue  # a trapped signal interrupted wait
  still=()
  for p in "${running[@]}"; do [ "$p" != "$done_pid" ] && still+=("$p"); done
  running=("${still[@]}")
  if [ $rc -ne 0 ] && [ $rc -ne 75 ] && [ $status -eq 0 ]; then
    status=$rc
    echo "launch_local.sh: a rank (pid $done_pid) exited with status $rc; stopping the others" >&2
    forward TERM
    ( sleep 30; forward KILL ) &
  elif [ $rc -eq 75 ] && [ $status -eq 0 ]; then
    status=75
  fi
done
exit $status
