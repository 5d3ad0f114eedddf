// loongforge/comm/world_info.hpp — which rank this process is, from the
// environment (no libtorch: loongforge-train's main reads it to validate the
// config before anything heavy loads).
//
// Contract: world_from_env() reads torchrun's RANK/WORLD_SIZE/LOCAL_RANK/
// MASTER_ADDR/MASTER_PORT, else Slurm's SLURM_PROCID/SLURM_NTASKS/
// SLURM_LOCALID (with MASTER_ADDR/MASTER_PORT), else a one-rank world. Bad
// values throw ConfigError naming the variable.
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

namespace loongforge::comm {

struct WorldInfo {
  int64_t rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int64_t master_port = 29500;
  std::string source = "single process";  // "torchrun environment" / "Slurm environment"
};

WorldInfo world_from_env();

}  // namespace loongforge::comm
