// loongforge/trainer/state.hpp — what a checkpoint of the training loop
// holds and how a run resumes from one (docs/checkpoints.md).
//
// Contract:
//  - make_snapshot() copies model weights and optimizer state to host memory
//    (the training stall) and describes the trainer's position so that a
//    resumed run takes exactly the steps the uninterrupted run would have.
//  - resume_from() checks integrity, then compatibility (parameter names and
//    shapes, the config keys that change the math, world size) and lists
//    every difference in one CheckpointError; on success it loads weights and
//    optimizer state in place and returns the step to continue from.
//  - Trainer thread only.
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::shared_ptr
#include <string>   // std::string

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/trainer/optimizer.hpp"

namespace loongforge::trainer {

// The config keys whose values a checkpoint must share with the run that
// resumes it, and their values.
nlohmann::json compared_config(const config::Config& cfg);
// SHA-256 of parameter names, shapes and trainable flags.
std::string model_identity_hash(const model::Model& net);

struct TrainerPosition {
  int64_t step = 0;  // optimizer steps done
  int64_t epoch = 0;  // the epoch of the next step (Sampler::epoch_of_step(step))
  std::string run_id;
};

// Host copies reused by every snapshot of a run (pinned when training on a
// GPU, so device-to-host copies run at full bandwidth). Frozen parameters
// never change: they are copied once. The caller must not take a new
// snapshot while the writer still reads the previous one (Writer::wait()).
struct SnapshotBuffers {
  std::vector<at::Tensor> weights, exp_avg, exp_avg_sq;  // aligned with net.parameters() / trainable
  bool frozen_copied = false;
  std::shared_ptr<void> slab;  // one exactly-sized (pinned) allocation the tensors above view
};

// Allocates every buffer up front in one slab (page-locked when `pinned`),
// sized exactly -- the caching host allocator would round each to a power of
// two. Meant to run on a helper thread at start so the first checkpoint does
// not pay for the allocation.
void reserve_snapshot_buffers(SnapshotBuffers& buffers, const model::Model& net, bool pinned);

checkpoint::Snapshot make_snapshot(const config::Config& cfg, const model::Model& net, AdamW& optimizer,
                                   const Schedule& schedule, const TrainerPosition& pos, int64_t world_size,
                                   SnapshotBuffers& buffers);

// Loads `dir` into `net` and `optimizer`; returns the trainer_state.json.
nlohmann::json resume_from(const std::string& dir, const config::Config& cfg, model::Model& net, AdamW& optimizer,
                           int64_t world_size);

}  // namespace loongforge::trainer
