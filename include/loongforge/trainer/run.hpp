// loongforge/trainer/run.hpp — the training entry point used by loongforge-train.
//
// Contract: run() owns the whole job for one rank: it loads the model and
// data named by the config, trains for trainer.max_steps, writes the run
// directory (metrics, checkpoints, summary) and returns the process exit code.
// Errors are thrown as typed loongforge::Error.
#pragma once

#include <cstdint>  // int64_t

#include "loongforge/config/config.hpp"

namespace loongforge::trainer {

int run(const config::Config& cfg, int64_t world_size);

}  // namespace loongforge::trainer
