// loongforge/trainer/trainer.hpp — one rank's training job, in lifecycle
// phases, calling the seams that the engines implement (docs/architecture.md).
//
// Contract:
//  - open(): the memory seam (MLA's install, before any CUDA allocation),
//    rendezvous, the control socket (up first, so `loongforge status` answers
//    while the model loads), model, then each seam through its engine's
//    factory: data (adfe::make_source), compute (dmf::make_step_runner),
//    gradients and update (gcts::make_gradient_path); run directory, resume.
//    Throws a typed Error naming the key, file or rank on any problem.
//  - step(): one optimizer step through the seams:
//      data::BatchSource (K micro-batches on the device, host metadata)
//      -> comm::GradientReducer::agree_counts (the step's valid elements and embodiment slots)
//      -> fusion::StepRunner (forward + backward, loss on the device)
//      -> comm::GradientReducer::average_gradients
//      -> optim::Optimizer::clip_grad_norm, optim::Optimizer::step.
//    The plain path reads the loss and the gradient norm once per step (the
//    non-finite check needs them before the update).
//  - step_boundary(): control requests, checkpoints, metrics and status.
//  - close(): the final checkpoint, a barrier with the other ranks, the
//    summary; returns the exit status (0; 4 when a checkpoint write failed;
//    75 = kExitRequeue when a SIGUSR1 stopped the run before
//    trainer.max_steps, src/trainer/stop_signal.hpp).
//  - run() = open, step/step_boundary while more(), close. A libtorch error
//    inside a step (CUDA out of memory, a kernel error) becomes a
//    TrainingError naming the step, the phase, the device memory and the keys
//    to change, after a final checkpoint when the parameters and optimizer
//    state are intact (the failure came before the update). A DataError
//    inside a step (a bad video with data.on_bad_video=error) also stops
//    after a checkpoint of the last good step, keeping its message.
//  - One Trainer per process, on one thread (the trainer thread). Its state
//    lives in Trainer::Impl (src/trainer/trainer_impl.hpp): this header
//    includes no room but the configuration and the world's identity.
//
// Example:
//   Trainer t(cfg, comm::world_from_env());
//   return t.run();
#pragma once

#include <memory>  // std::unique_ptr
#include <set>     // std::set
#include <string>  // std::string
#include <vector>  // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/comm/world_info.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/trainer/progress.hpp"  // StepRecord

namespace loongforge::trainer {

// The four engine records of this build (GCTS, MLA, ADFE, DMF), each from its
// room, and the names of those built into this binary.
std::vector<Engine> engine_records(const config::Config& cfg);
std::set<std::string> built_engines();

class Trainer {
 public:
  Trainer(config::Config cfg, comm::WorldInfo world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  int run();

  void open();
  bool more() const;  // steps left in this process and no stop requested
  void step();
  void step_boundary();
  int close();

  const std::string& run_dir() const;
  const std::vector<StepRecord>& history() const;
  // What `loongforge status` shows of the step runner and the gradient communication (null: nothing).
  nlohmann::json runner_status() const;
  nlohmann::json comm_status() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace loongforge::trainer
