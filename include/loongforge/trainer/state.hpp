// loongforge/trainer/state.hpp — what a checkpoint of the training loop
// holds and how a run resumes from one (docs/checkpoints.md).
//
// Contract:
//  - make_snapshot() hands model weights (the optimizer's fp32 masters of
//    bf16 working copies, Optimizer::master_weight) and optimizer state to the
//    checkpoint writer, whose submit() copies them to host staging (the
//    training stall), and describes the trainer's position (step, epoch,
//    global batch, RNG states) so that a resumed run takes exactly the steps
//    the uninterrupted run would have. Each engine that is on stores its state
//    under loongforge_state/<name>.json.
//  - check_resume() reads a checkpoint's manifest before anything is built
//    and decides the gradient accumulation of this run: the global batch of
//    the checkpoint is kept on any world size whose micro-batches divide it,
//    else a CheckpointError says which world sizes work.
//  - resume_from() checks integrity, then compatibility (parameter names and
//    shapes, the config keys that change the math, the global batch) and
//    lists every difference in one CheckpointError; on success it loads
//    weights, optimizer state, RNG states and engine states in place and
//    returns trainer_state.json.
//  - Trainer thread only.
#pragma once

#include <cstdint>  // int64_t, uint64_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/optim/optimizer.hpp"

namespace loongforge::trainer {

// The config keys whose values a checkpoint must share with the run that
// resumes it, and their values.
nlohmann::json compared_config(const config::Config& cfg);
// SHA-256 of parameter names, shapes and trainable flags.
std::string model_identity_hash(const model::Model& net);

struct TrainerPosition {
  int64_t step = 0;  // optimizer steps done
  int64_t epoch = 0;
  int64_t steps_per_epoch = 1;
  int64_t global_batch = 1;  // samples per optimizer step over all ranks
  std::string run_id;
};

// Bytes of the tensors a snapshot holds (full-precision weights and the
// optimizer's state): what Writer::reserve_staging() is told at start.
uint64_t snapshot_state_bytes(const model::Model& net, const optim::Optimizer& optimizer);

// The checkpoint section's writer options; `pinned`: staging buffers are
// page-locked (training on a GPU), so device-to-host copies run at full speed.
checkpoint::WriterOptions writer_options(const config::Config& cfg, bool pinned);

// The live tensors (weights' fp32 masters, optimizer state) and the position;
// the Writer stages (copies) the tensors in submit() (Note [Bounded staging]
// in src/checkpoint/writer.cpp).
checkpoint::Snapshot make_snapshot(const config::Config& cfg, const model::Model& net, const optim::Optimizer& optimizer,
                                   const optim::Schedule& schedule, const TrainerPosition& pos, int64_t world_size,
                                   const std::vector<Engine>& engines);

// Sharded optimizer state (ShardedAdamW): what a rank other than 0 writes
// (its optimizer/rank_RRRRR.safetensors, staged for rank 0: Note [Peer files]
// in src/checkpoint/writer.cpp), and the files rank 0 waits for.
checkpoint::Snapshot make_peer_snapshot(const optim::Optimizer& optimizer, const TrainerPosition& pos, int64_t rank);
std::vector<std::string> peer_optimizer_files(int64_t world_size);

// A checkpoint's optimizer state as full per-parameter moments, from an
// unsharded or a sharded checkpoint of any world size (Note [Re-sharding] in
// state.cpp); `opt_json` is trainer_state.json's "optimizer".
std::map<std::string, at::Tensor> read_optimizer_state(const std::string& dir, const nlohmann::json& opt_json,
                                                       const model::Model& net);
// The same, reading `dir`'s trainer_state.json; `step` (optional) receives the step it was written at.
std::map<std::string, at::Tensor> read_optimizer_state(const std::string& dir, const model::Model& net,
                                                       int64_t* step = nullptr);
// trainer_state.json's optimizer record (checkpoints before the Optimizer seam kept only the step counts).
nlohmann::json optimizer_json(const nlohmann::json& trainer_state);

// The gradient accumulation that keeps the global batch of the checkpoint in
// `dir` on `world_size` ranks of cfg.trainer.micro_batch_size samples; the
// integrity of `dir` is checked first. `note` receives a line for the log
// when the accumulation changes.
int64_t check_resume(const std::string& dir, const config::Config& cfg, int64_t world_size, std::string* note);

// The micro-batch size the checkpoint in `dir` trained with (its manifest's
// trainer.micro_batch_size), which a resume with trainer.micro_batch_size
// auto keeps (Note [Micro-batch auto on resume] in trainer_micro_batch.cpp).
int64_t checkpoint_micro_batch(const std::string& dir);

// Loads `dir` into `net`, `optimizer`, the default generators and the
// engines; returns trainer_state.json. Every file is verified first; an
// unverified preemption save is checked against its CRC-32s and, with
// `seal` (rank 0), its manifest then records the SHA-256s computed in the
// same pass (Note [Preemption saves] in src/checkpoint/writer.cpp).
nlohmann::json resume_from(const std::string& dir, const config::Config& cfg, model::Model& net,
                           optim::Optimizer& optimizer, int64_t world_size, const std::vector<Engine>& engines,
                           bool seal = false);

// Seeds the default CPU (and CUDA) generators of this rank from run.seed at
// start. The draws inside a micro-step (dropout) do not continue from it:
// the runners reseed the generator per micro-batch (fusion::seed_draws);
// the flow-matching draws have their own generators.
void seed_default_generators(const config::Config& cfg, int64_t rank);

}  // namespace loongforge::trainer
