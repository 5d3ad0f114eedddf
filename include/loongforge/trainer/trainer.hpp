// loongforge/trainer/trainer.hpp — one rank's training job, in lifecycle
// phases, calling the seams that the engines replace (docs/architecture.md).
//
// Contract:
//  - open(): memory::install (before any CUDA allocation), rendezvous, the
//    control socket (up first, so `loongforge status` answers while the model
//    loads), model, data, optimizer, run directory, resume. Throws a typed
//    Error naming the key, file or rank on any problem.
//  - step(): one optimizer step through the seams:
//      data::BatchSource (K micro-batches on the device, host metadata)
//      -> comm::GradientReducer::agree_counts (the step's valid elements and embodiment slots)
//      -> fusion::StepRunner (forward + backward, loss on the device)
//      -> comm::GradientReducer::average_gradients
//      -> Optimizer::clip_grad_norm, Optimizer::step.
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
//  - One Trainer per process, on one thread (the trainer thread).
//
// Example:
//   Trainer t(cfg, comm::world_from_env());
//   return t.run();
#pragma once

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // int64_t
#include <exception>  // std::exception_ptr
#include <memory>   // std::unique_ptr
#include <set>      // std::set
#include <string>   // std::string
#include <thread>   // std::thread
#include <vector>   // std::vector

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/trainer/optimizer.hpp"
#include "loongforge/trainer/optimizer_graph.hpp"
#include "loongforge/trainer/progress.hpp"
#include "loongforge/trainer/readback.hpp"
#include "loongforge/trainer/state.hpp"

namespace loongforge::trainer {

class ControlPlane;

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

  const std::string& run_dir() const { return run_dir_; }
  const std::vector<StepRecord>& history() const { return progress_->history(); }
  // What `loongforge status` shows of the step runner and the gradient communication (null: nothing).
  nlohmann::json runner_status() const;
  nlohmann::json comm_status() const;

 private:
  using Clock = std::chrono::steady_clock;
  void resolve_device();
  bool use_bf16_weights(bool fused, bool compiled) const;
  std::string bf16_weights_note() const;
  nlohmann::json bf16_weights_summary() const;
  void open_data();
  std::string choose_resume_dir();
  void open_run_dir(const std::string& resume_dir);
  double save(int64_t steps_done);
  void collect_writes();
  void publish(const char* phase, const StepRecord* r);
  nlohmann::json data_status(const StepRecord* r) const;
  [[noreturn]] void fail_in_step(const std::exception& e, bool out_of_memory);
  void check_finite(int64_t step, double loss, double norm, bool read_late);
  StepRecord complete(Readback::Held held, Clock::time_point next_start);
  void device_exposed_comm(StepRecord& r);
  void set_step_time(StepRecord& r, double step_ms) const;
  [[noreturn]] void fail_on_data(const DataError& e);
  std::string save_after_failure(bool intact);
  std::string agree(const std::string& key, const std::string& value);

  config::Config cfg_;
  comm::WorldInfo world_info_;
  bool leader_ = true;  // rank 0 owns the run directory, metrics and checkpoints
  bool sharded_ = false;  // gcts.shard_optimizer: every rank holds (and checkpoints) its own optimizer shard
  c10::Device device_ = c10::kCPU;
  bool bf16_ = false;
  Clock::time_point t_start_;

  std::vector<Engine> engines_;
  std::unique_ptr<comm::World> world_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<model::Model> net_;
  std::unique_ptr<data::Dataset> dataset_;
  std::unique_ptr<data::BatchSource> source_;
  std::unique_ptr<fusion::StepRunner> runner_;
  std::unique_ptr<comm::GradientReducer> reducer_;
  // The reducer as the graph runner sees it (Note [Reduction in the graph] in src/comm/gcts_reducer.cpp).
  std::unique_ptr<fusion::GraphReduction> graph_reduction_;
  std::unique_ptr<Optimizer> optimizer_;
  Schedule schedule_;

  std::string run_dir_, ckpt_dir_, last_ckpt_;
  TrainerPosition pos_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<checkpoint::Writer> writer_;
  SnapshotBuffers snapshot_buffers_;
  std::thread reserver_;  // reserves snapshot_buffers_ while training starts
  std::exception_ptr reserve_error_;
  Clock::time_point last_ckpt_time_;
  int64_t failed_writes_ = 0;
  int64_t last_saved_step_ = -1;

  int64_t steps_done_ = 0, last_step_ = 0;  // this process trains steps (steps_done_, last_step_]
  bool control_stop_ = false;
  bool requeue_stop_ = false;  // the stop came from SIGUSR1 (on any rank): close() returns kExitRequeue
  double flops_per_sample_ = 0;
  int64_t tokens_per_view_ = 0;
  StepRecord record_;  // the step just taken, reported at its boundary
  // Set on the fast path (CUDA, an optimizer that skips non-finite updates on
  // the device): the step reads nothing back; records go out one boundary late.
  std::unique_ptr<Readback> readback_;
  std::unique_ptr<CommTimer> comm_timer_;  // GPUs with communication: exposed_comm_ms timed on the device
  std::unique_ptr<OptimizerGraph> optimizer_graph_;  // fast path with CUDA graphs (optimizer_graph.hpp)
  Clock::time_point step_started_;  // start of the step just taken
  int64_t frames_counted_ = 0;        // source frames_decoded at frames_counted_at_ (decoded_frames_per_s)
  int64_t bytes_counted_ = 0;         // source video_bytes_read then (read_mb_per_s)
  int64_t h2d_counted_ = 0;           // source h2d_bytes then (h2d_mb_per_s)
  int64_t readahead_counted_ = 0;     // source readahead_bytes then (readahead_mb_per_s)
  Clock::time_point frames_counted_at_ = Clock::now();
};

}  // namespace loongforge::trainer
