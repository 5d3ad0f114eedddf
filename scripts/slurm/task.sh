#!/usr/bin/env bash
# scripts/slurm/task.sh — one Slurm task of a fault-tolerant job (fault.enable=true; job.sh runs it through
# srun in place of loongforge-train, docs/fault-tolerance.md):
#
#   task.sh TRAINER [ARGS...]
#
# Runs the trainer. When the trainer of a rank other than 0 ends abnormally (killed by a signal, or any
# status but 0 and 75, the requeue checkpoint), the other ranks go on without it, and this script starts
# it again with the same command and environment, up to LOONGFORGE_TASK_RESTARTS times (default 3): the
# restarted process registers in the job's store and is taken back at a step boundary (fault.auto_rejoin,
# the default, or `loongforge hot-rejoin --rank N`) with the state of its peers. A restarted process
# that the job ended without exits 0 (the job's result is the other ranks'). Rank 0 is not restarted:
# it serves the rendezvous store, and its loss ends the job.
#
# Before a restart, the job's store (MASTER_ADDR:MASTER_PORT) must still answer: when it does not, rank 0
# has ended, and the job with it; this task then ends with status 0 (rank 0's own status tells how the
# job ended, and srun reports it).
set -uo pipefail
log() { echo "[loongforge task $(date -u +%H:%M:%S)] rank ${SLURM_PROCID:-?}: $*"; }

trainer=$1
shift
max_restarts=${LOONGFORGE_TASK_RESTARTS:-3}
rank=${SLURM_PROCID:-0}
restarts=0
# SIGUSR1/SIGTERM from srun go to the trainer (job.sh's requeue; Slurm's own preemption).
child=""
forward() { [ -n "$child" ] && kill "-$1" "$child" 2>/dev/null; }
trap 'forward USR1' USR1
trap 'forward TERM' TERM

store_answers() { (exec 3<>"/dev/tcp/${MASTER_ADDR}/${MASTER_PORT}") 2>/dev/null; }

while :; do
  "$trainer" "$@" &
  child=$!
  # `wait` returns early when a trapped signal arrives; wait again until the trainer is gone.
  while kill -0 "$child" 2>/dev/null; do wait "$child"; done
  wait "$child"
  rc=$?
  child=""
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 75 ] || [ "$rank" -eq 0 ]; then exit "$rc"; fi
  what="exited with status $rc"
  [ "$rc" -gt 128 ] && what="was killed by signal $((rc - 128))"
  if [ "$restarts" -ge "$max_restarts" ]; then
    log "the trainer $what; restarted $restarts times already (LOONGFORGE_TASK_RESTARTS=$max_restarts): not again"
    exit "$rc"
  fi
  if ! store_answers; then
    log "the trainer $what, and the job's store at $MASTER_ADDR:$MASTER_PORT no longer answers (rank 0 ended): nothing to rejoin"
    exit 0
  fi
  restarts=$((restarts + 1))
  log "the trainer $what; the other ranks go on without it: starting it again to rejoin (restart $restarts of $max_restarts)"
done
