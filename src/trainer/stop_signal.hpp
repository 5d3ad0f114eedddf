// src/trainer/stop_signal.hpp — the signals that stop a run cleanly. Each one
// finishes the current step, writes a checkpoint and exits; a second signal
// kills as usual. The trainer publishes the first one like `loongforge stop`,
// so every rank stops at the same step (control_plane.hpp).
//
//  - SIGTERM (kill, Slurm's preemption and time limit) and SIGINT (Ctrl-C):
//    exit 0.
//  - SIGUSR1 (Slurm's `--signal=USR1@<s>` warning before the time limit,
//    `scancel --signal=USR1`): exit kExitRequeue when steps remain, so a batch
//    script can tell "checkpointed, requeue me" from "done"
//    (scripts/slurm/*.sbatch requeue on it; docs/operations.md).
//
// The checkpoint a signal asks for is a preemption save (Note [Preemption
// saves] in src/checkpoint/writer.cpp): the fastest layout, timed from the
// signal against checkpoint.preempt_lead_s (trainer_close.cpp).
#pragma once

#include <chrono>    // std::chrono::steady_clock
#include <optional>  // std::optional

namespace loongforge::trainer {

// EX_TEMPFAIL of sysexits.h: a temporary failure; the caller is invited to
// retry (here: requeue and `--resume latest`).
inline constexpr int kExitRequeue = 75;

void install_stop_signals();
bool stop_requested();
// The first stop signal asked for a requeue (SIGUSR1).
bool requeue_requested();
// When this process received its first stop signal (steady_clock); none when it got none.
std::optional<std::chrono::steady_clock::time_point> stop_signal_time();

}  // namespace loongforge::trainer
