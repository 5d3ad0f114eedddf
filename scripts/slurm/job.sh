#!/usr/bin/env bash
# scripts/slurm/job.sh — the body of single-node.sbatch and multi-node.sbatch:
# runs one loongforge-train per Slurm task (srun), rendezvous from SLURM_*,
# and turns the time-limit warning into checkpoint, exit and requeue.
#
#   sbatch scripts/slurm/single-node.sbatch --config configs/n16.yaml [--set key=value ...]
#
# The sbatch scripts exec this file from the repository they were submitted
# in (LOONGFORGE_HOME, default SLURM_SUBMIT_DIR). Arguments go to
# loongforge-train, after `--resume latest` (a first start finds no
# checkpoint and starts fresh; a requeued one continues from the newest).
#
# Ranks: srun starts SLURM_NTASKS tasks; each reads SLURM_PROCID (rank),
# SLURM_NTASKS (world size) and SLURM_LOCALID (its GPU: cuda:<SLURM_LOCALID>,
# so every task must see all GPUs of its node: no --gpus-per-task, no
# per-task GPU binding). WORLD_SIZE/RANK/LOCAL_RANK are unset here because
# loongforge-train prefers them over SLURM_* (src/comm/world.cpp).
#
# Preemption and the time limit (docs/operations.md s3):
#  - `#SBATCH --signal=B:USR1@120` makes Slurm send SIGUSR1 to this shell
#    120 s before the time limit; the trap forwards it to srun, which forwards
#    it to every task. loongforge-train finishes its step, writes a
#    preemption save and exits 75 (src/trainer/stop_signal.hpp) when steps
#    remain; it logs the save's time against checkpoint.preempt_lead_s (keep
#    it equal to the --signal lead), and a requeued job whose last save did
#    not fit refuses to start (docs/operations.md s3).
#  - srun's status 75 (also after `scancel --signal=USR1 <job>`) makes this
#    script requeue the job (`scontrol requeue`; the job needs --requeue) up
#    to LOONGFORGE_MAX_REQUEUES times (default 20); the requeued job
#    resumes from the newest checkpoint.
#  - Slurm's own preemption (PreemptMode=REQUEUE) sends SIGTERM: the trainer
#    checkpoints and exits 0, and Slurm requeues the job itself.
#
# A lost task (docs/fault-tolerance.md): without fault.enable, srun ends the
# whole step when one task fails (--kill-on-bad-exit=1), and the job fails.
# With fault.enable=true in the config or a --set, the other ranks train on
# without it: srun keeps them (--kill-on-bad-exit=0), each task runs through
# scripts/slurm/task.sh, which starts a failed trainer of a rank other than 0
# again (LOONGFORGE_TASK_RESTARTS times, default 3), and the restarted
# process is taken back at a step boundary (fault.auto_rejoin, or
# `loongforge hot-rejoin --rank N`); the job completes at its full size.
#
# Environment: LOONGFORGE_HOME (the repository; default SLURM_SUBMIT_DIR),
# LOONGFORGE_TRAIN (the binary; default $LOONGFORGE_HOME/build/src/daemon/loongforge-train),
# MASTER_ADDR (default: the first host of the allocation), MASTER_PORT
# (default: 20000 + SLURM_JOB_ID % 20000), LOONGFORGE_MAX_REQUEUES,
# LOONGFORGE_SRUN_ARGS (extra srun options, e.g. "--cpu-bind=none"),
# LOONGFORGE_TASK_RESTARTS (fault-tolerant jobs: restarts of a failed task).
set -uo pipefail

log() { echo "[loongforge job $(date -u +%H:%M:%S)] $*"; }
die() { echo "[loongforge job] error: $*" >&2; exit 2; }

[ -n "${SLURM_JOB_ID:-}" ] || die "SLURM_JOB_ID is not set: this script runs inside a Slurm batch job (submit scripts/slurm/*.sbatch with sbatch)"
repo=${LOONGFORGE_HOME:-${SLURM_SUBMIT_DIR:-}}
[ -n "$repo" ] || die "neither LOONGFORGE_HOME nor SLURM_SUBMIT_DIR is set: set LOONGFORGE_HOME to the repository"
train=${LOONGFORGE_TRAIN:-$repo/build/src/daemon/loongforge-train}
[ -x "$train" ] || die "LOONGFORGE_TRAIN=$train is not an executable file: build it (bash scripts/setup.sh) or point LOONGFORGE_TRAIN/LOONGFORGE_HOME at it"
command -v scontrol >/dev/null || die "scontrol is not on PATH on the batch host"

# ---------------------------------------------------------------------------
# Rendezvous: rank 0 serves the c10d store on the first host of the allocation.
first_host=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
[ -n "$first_host" ] || die "scontrol show hostnames '$SLURM_JOB_NODELIST' printed no host"
# The address Slurm itself reaches that node on (its NodeAddr; the name when none is set).
first_addr=$(scontrol show node "$first_host" 2>/dev/null | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | head -n1)
export MASTER_ADDR=${MASTER_ADDR:-${first_addr:-$first_host}}
export MASTER_PORT=${MASTER_PORT:-$(( 20000 + SLURM_JOB_ID % 20000 ))}
unset WORLD_SIZE RANK LOCAL_RANK  # each task's SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID decide

# ---------------------------------------------------------------------------
# Communication environment. CPU ranks talk through Gloo over TCP, GPU ranks
# through NCCL (comm::World), which reads the NCCL_* variables below (several
# NCCL ranks have not run on real GPUs yet). Each keeps a value already set in
# the submitting environment (sbatch --export).
#
# Gloo picks its interface from GLOO_SOCKET_IFNAME (comma-separated names),
# else the local address of the route to MASTER_ADDR (src/comm/world.cpp).
# On hosts with several networks name the fast one, e.g. GLOO_SOCKET_IFNAME=ib0.
: "${NCCL_DEBUG:=WARN}"            # WARN: errors and warnings only; INFO to see the chosen transports and interfaces
: "${NCCL_IB_DISABLE:=0}"          # 0: use InfiniBand/RoCE verbs between nodes (1 falls back to TCP sockets)
: "${NCCL_IB_TIMEOUT:=22}"         # InfiniBand verbs timeout, 4.096 us * 2^22 ~ 17 s per retry: rides out a fabric hiccup
: "${NCCL_IB_RETRY_CNT:=7}"        # InfiniBand retries before a transfer fails (7: NCCL's default and the verbs maximum; stated so it is not lowered by accident)
: "${NCCL_NVLS_ENABLE:=0}"         # 0: no NVLink SHARP / multicast objects (needs IMEX/fabric manager rights that shared or MIG'd machines lack)
: "${TORCH_NCCL_ASYNC_ERROR_HANDLING:=1}"  # libtorch's NCCL process group: a failed or timed-out collective ends the process instead of hanging it
export NCCL_DEBUG NCCL_IB_DISABLE NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_NVLS_ENABLE TORCH_NCCL_ASYNC_ERROR_HANDLING
# NCCL_SOCKET_IFNAME (bootstrap interface; NCCL's default skips lo and docker*) and
# NCCL_IB_HCA (which HCAs) are site-specific: multi-node.sbatch shows where to set them.
# c10d's rendezvous store and Gloo wait 300 s for every rank (src/trainer/trainer_open.cpp);
# a rank that does not arrive in that time fails the job with an error naming MASTER_ADDR:MASTER_PORT.

# ---------------------------------------------------------------------------
# Train. srun runs in the background so that this shell can take SIGUSR1.
max_requeues=${LOONGFORGE_MAX_REQUEUES:-20}
restarts=${SLURM_RESTART_COUNT:-0}
log "job $SLURM_JOB_ID (restart $restarts): ${SLURM_NTASKS:-?} task(s) on ${SLURM_JOB_NUM_NODES:-?} node(s) ($SLURM_JOB_NODELIST), rendezvous $MASTER_ADDR:$MASTER_PORT, $train"

srun_pid=""
signalled=0
on_usr1() {
  signalled=1
  log "SIGUSR1 (time limit near, or scancel --signal=USR1): every rank checkpoints and exits"
  [ -n "$srun_pid" ] && kill -USR1 "$srun_pid" 2>/dev/null
}
trap on_usr1 USR1

# fault.enable as the trainer resolves it (config file and --set), read from --print-config's fault: section.
fault=$("$train" --resume latest "$@" --print-config 2>/dev/null |
        awk '/^[a-z_]+:/ { section = $1 } section == "fault:" && $1 == "enable:" { print $2; exit }')
if [ "$fault" = true ]; then
  log "fault.enable=true: a failed task does not end the job; ranks other than 0 are started again to rejoin (scripts/slurm/task.sh, at most ${LOONGFORGE_TASK_RESTARTS:-3} restarts each)"
  task=(--kill-on-bad-exit=0 bash "$repo/scripts/slurm/task.sh" "$train")
else
  task=(--kill-on-bad-exit=1 "$train")
fi
# shellcheck disable=SC2086  # LOONGFORGE_SRUN_ARGS is a list of options
srun ${LOONGFORGE_SRUN_ARGS:-} "${task[@]}" --resume latest "$@" &
srun_pid=$!
[ "$signalled" -eq 1 ] && kill -USR1 "$srun_pid" 2>/dev/null  # the warning came before srun started
# `wait` returns early when a trapped signal arrives; wait again until srun is gone.
while kill -0 "$srun_pid" 2>/dev/null; do wait "$srun_pid"; done
wait "$srun_pid"
rc=$?

if [ "$rc" -eq 75 ]; then
  if [ "$restarts" -ge "$max_requeues" ]; then
    log "the trainer checkpointed for a requeue, but the job was requeued $restarts times already (LOONGFORGE_MAX_REQUEUES=$max_requeues): not requeueing"
    exit 75
  fi
  log "the trainer checkpointed for a requeue (exit 75): scontrol requeue $SLURM_JOB_ID; it resumes with --resume latest"
  scontrol requeue "$SLURM_JOB_ID" || { log "scontrol requeue failed (was the job submitted with --requeue?)"; exit 75; }
  exit 0
fi
[ "$signalled" -eq 1 ] && log "SIGUSR1 came, but the run finished (exit $rc)"
log "training ended with exit status $rc"
exit "$rc"
