// loongforge/engines/gcts/gcts.hpp — GCTS, the gradient communication
// scheduler: one of the four engines (docs/architecture.md). It plugs into
// two seams of the trainer, the gradient reducer (comm/reducer.hpp) and the
// optimizer (optim/optimizer.hpp); make_gradient_path() is the factory the
// trainer builds both through, GCTS on or off.
//
// What it guarantees:
//  - The numbers of the plain path. `simple` and `hybrid` equal the plain
//    all-reduce in fp32 up to the collective's summation order (bitwise at 2
//    ranks; test/engines/gcts/test_gcts.py), with or without overlap; the
//    sharded AdamW equals AdamW op for op on its range (sharded_adamw.hpp).
//  - Every rank computes the same plan (a pure function of the parameters,
//    the model's backward-readiness order, the config and the world size) and
//    switches strategy at the same step boundary.
//  - The reduction overlaps backward where autograd runs gradient hooks (Note
//    [Overlap] in src/engines/gcts/reducer.cpp), or is captured into the last
//    micro-batch's CUDA graph on NCCL (Note [Reduction in the graph]).
//
// What it needs: a comm::World at several ranks (at one rank only the
// sharded optimizer gives it work), the model's dependency graph
// (model::Mdg: which parameters are ready first in backward), and the step
// runner, which captures the reduction into its graph where it can.
//
// Config: the `gcts` section of keys.def (enable, comm_strategy, bucket_mb,
// first_bucket_mb, tiny_tensor_kb, shard_optimizer, sparse_embodiment,
// reduce_dtype, overlap, rebuild_interval). With gcts.enable=false the
// factory builds the plain seams and warns about each of these keys set to a
// non-default value (Note [Keys of an engine that is off] in
// src/config/validate.cpp).
//
// Verbs (its Engine record): switch-strategy (cluster-wide: every rank at the
// same step), monitor-comm (through status's "comm"). (hot-rejoin belongs to
// fault tolerance: src/trainer/trainer_fault.cpp.) Checkpoint state: loongforge_state/gcts.json ({plan, mdg});
// with the sharded optimizer every rank's shard of the AdamW state.
//
// Pieces: plan.cpp (Note [GCTS strategies], Note [Bucket order]), reducer.cpp
// (the reducer), sharded_adamw.hpp (ZeRO-1 style AdamW), gcts.cpp (the
// factory and the record).
//
// Example:
//   Engine record = gcts::engine(cfg);
//   gcts::GradientPath g = gcts::make_gradient_path(cfg, {world.get(), &net, runner.get(), device,
//                                                          bf16, graphs, compiled, accumulation}, record);
//   // g.optimizer, g.reducer: the seams; g.graph_reduction must outlive the runner's use of it.
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include <c10/core/Device.h>  // c10::Device
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/shard.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/optim/optimizer.hpp"

namespace loongforge::gcts {

constexpr bool kBuilt = true;

// What the factory reads besides the config.
struct GradientInputs {
  comm::World* world = nullptr;  // nullptr: one rank
  model::Model* net = nullptr;
  fusion::StepRunner* runner = nullptr;  // GCTS on NCCL under CUDA graphs captures its reduction into it
  c10::Device device = c10::kCPU;
  bool bf16 = false;      // the run computes in bf16 autocast
  bool graphs = false;    // the runner replays CUDA graphs (fusion::StepMode)
  bool compiled = false;  // the runner is the compiled step
  int64_t accumulation = 1;  // micro-batches per step
};

// The two seams it builds.
struct GradientPath {
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<comm::GradientReducer> reducer;
  // Set on the runner when the reduction is captured into its graph; must
  // outlive the runner's use of it (null otherwise).
  std::unique_ptr<fusion::GraphReduction> graph_reduction;
};

// GCTS on (gcts.enable): its reducer, and its sharded AdamW with
// gcts.shard_optimizer, else the fused or plain AdamW; GCTS off: the plain
// all-reduce (comm::make_plain_reducer) and the fused or plain AdamW. Either
// way the optimizer holds bf16 working copies as precision.bf16_weights says.
// Attaches the running reducer to `record` (its verbs, status and state).
// Throws ConfigError naming the key when a setting cannot be honoured.
// `existing`: a replicated optimizer to keep, state and all, with a reducer
// for in.world (the world changed: fault tolerance); it comes back as the
// path's optimizer.
GradientPath make_gradient_path(const config::Config& cfg, const GradientInputs& in, Engine& record,
                                std::unique_ptr<optim::Optimizer> existing = nullptr);

// The GCTS reducer alone (tests, tools). `world` nullptr means one rank (only
// a sharded optimizer gives it work); `shard` is the sharded optimizer's
// target or nullptr; `overlap`: launch buckets from gradient hooks during the
// last micro-batch's backward (only where backward runs autograd's
// AccumulateGrad: not under CUDA-graph replay or the compiled runner).
std::unique_ptr<comm::GradientReducer> make_reducer(const config::Config& cfg, comm::World* world,
                                                    std::vector<comm::ReducedParam> params,
                                                    comm::ShardTarget* shard, bool overlap);

// GCTS's record (common/engine.hpp); attach() connects its verbs, status and
// checkpoint state (loongforge_state/gcts.json: {"plan": plan(), "mdg": mdg},
// the model's dependency graph as model::Mdg::to_json() gives it; on resume
// its plan goes to restore_plan()) to the running reducer, which must outlive
// the record's use.
Engine engine(const config::Config& cfg);
void attach(Engine& e, comm::GradientReducer& reducer, nlohmann::json mdg = nullptr);

}  // namespace loongforge::gcts
