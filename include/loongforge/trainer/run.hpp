// loongforge/trainer/run.hpp — the training entry point used by loongforge-train.
//
// Contract: run() owns the whole job for one rank (`world`, from
// comm::world_from_env()): it loads the model and data named by the config,
// trains for trainer.max_steps, writes the run directory (metrics,
// checkpoints, summary; rank 0) and returns the process exit code.
// Errors are thrown as typed loongforge::Error.
//
// compile_only() (loongforge-train --compile-only) prepares the compiled
// step's package for the config's model, micro-batch, precision and device
// in the package cache (trainer.compile_cache; fusion/package_cache.hpp):
// compiled, or found there already; prints its path and returns 0. It reads
// no data. A failed compile throws ConfigError with the compile log's tail.
#pragma once

#include "loongforge/comm/world_info.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::trainer {

int run(const config::Config& cfg, const comm::WorldInfo& world);
int compile_only(const config::Config& cfg, const comm::WorldInfo& world);

}  // namespace loongforge::trainer
