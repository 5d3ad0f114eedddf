// src/trainer/stop_signal.hpp — SIGTERM (Slurm preemption, kill) and SIGINT
// (Ctrl-C) finish the current step, write a checkpoint and exit 0; a second
// signal kills as usual. The trainer publishes the first one like `loongforge
// stop`, so every rank stops at the same step (control_plane.hpp).
#pragma once

namespace loongforge::trainer {

void install_stop_signals();
bool stop_requested();

}  // namespace loongforge::trainer
