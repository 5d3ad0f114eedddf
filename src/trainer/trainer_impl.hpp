// Private to the trainer room: the state of one rank's training job
// (trainer.hpp's Trainer::Impl), split over three files by lifecycle phase:
// trainer_open.cpp (open), trainer_step.cpp (step, step_boundary, status),
// trainer_close.cpp (close, run, failures).
//
// It holds one object per seam (source_, runner_, reducer_, optimizer_) and
// never the engines themselves: each seam's object comes from its engine's
// factory (adfe::make_source, dmf::make_step_runner,
// gcts::make_gradient_path), which returns the plain implementation when the
// engine is off, so no code here branches on an engine.
#pragma once

#include <atomic>     // std::atomic
#include <chrono>     // std::chrono::steady_clock
#include <cstdint>    // int64_t
#include <exception>  // std::exception_ptr
#include <map>        // std::map
#include <memory>     // std::unique_ptr
#include <string>     // std::string
#include <thread>     // std::thread
#include <utility>    // std::pair
#include <vector>     // std::vector

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/common/engine.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/threads.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/mixture.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/fault/fault.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/optim/optimizer.hpp"
#include "loongforge/optim/optimizer_graph.hpp"
#include "loongforge/trainer/progress.hpp"
#include "loongforge/trainer/readback.hpp"
#include "loongforge/trainer/state.hpp"
#include "loongforge/trainer/trainer.hpp"

namespace loongforge::trainer {

class ControlPlane;

struct Trainer::Impl {
  using Clock = std::chrono::steady_clock;

  Impl(config::Config cfg, comm::WorldInfo world);
  ~Impl();

  // ---- open (trainer_open.cpp)
  void open();
  void resolve_device();
  void open_control();
  void prepare_process();
  std::string choose_resume_dir();
  void check_preemption_lead();
  void adopt_checkpoint_batch(const std::string& resume_dir);
  // trainer.micro_batch_size: auto (trainer_micro_batch.cpp)
  bool micro_batch_unresolved() const;
  void keep_checkpoint_micro_batch(const std::string& resume_dir);  // a resume keeps the checkpoint's
  void check_micro_batch_auto() const;  // what auto cannot do (the CPU, MLA, fault.enable), before the model loads
  void resolve_micro_batch();           // after the model loads: probes the device, agrees over the ranks
  void open_model();
  void open_dataset();  // the dataset and sample_options_ but the micro-batch (auto sizes the data's memory from them)
  void open_data();     // the data source, once the micro-batch is known
  void open_fast_path(const fusion::StepMode& mode, bool made_gradients);
  void open_run_dir(const std::string& resume_dir);
  void write_working_copies() const;  // <run dir>/bf16_weights.json (scripts/compile_step.py --bf16-weights)
  void resume(const std::string& resume_dir);
  void log_run_line() const;
  void open_outputs();
  std::string agree(const std::string& key, const std::string& value);

  // ---- steps (trainer_step.cpp)
  bool more() const;
  void step();
  void step_boundary();
  double save(int64_t steps_done, bool preemption = false);
  void preemption_save(int64_t steps_done);
  void collect_writes();
  void record_progress(const StepRecord& r);
  std::string compiled_step_text() const;  // for the run line and the summary
  void publish(const char* phase, const StepRecord* r);
  nlohmann::json data_status(const StepRecord* r) const;
  void check_finite(int64_t step, double loss, double norm, bool read_late);
  StepRecord complete(Readback::Held held, Clock::time_point next_start);
  void device_exposed_comm(StepRecord& r);
  void set_step_time(StepRecord& r, double step_ms) const;

  // ---- losing a rank (trainer_fault.cpp, Note [Training on after a lost rank])
  void open_fault();
  void after_first_step();
  void settle_step(int64_t step);  // Note [Settling a step on NCCL] (world.hpp): before the update
  void recover(const CommError& error);
  void abandon_lost_peer_files(const fault::Decision& d);
  int64_t apply_decision(const fault::Decision& d, nlohmann::json& event);
  void admit(int64_t which);   // hot-rejoin applied at this boundary (-1: every lost rank that registered)
  bool wait_to_rejoin();       // a restarted rank, at the end of open(); false: the job ended without it
  void tell_waiting_ranks_the_job_ended();  // rank 0, in close()
  void poll_rejoins();         // fault.auto_rejoin, rank 0
  std::vector<int64_t> lost_ranks() const;
  std::string rejoin_problem(const nlohmann::json& args) const;
  std::string state_digest() const;
  void copy_state_from(int64_t root, nlohmann::json* sharded_steps);
  struct ShardedState {
    std::map<std::string, at::Tensor> moments;  // "<name>.exp_avg(_sq)", full per parameter
    std::map<size_t, at::Tensor> weights;        // fp32 weight by parameter index
  };
  ShardedState assemble_sharded_state(const fault::Decision& d, nlohmann::json& event);
  [[noreturn]] void stop_after_regroup(const std::string& why);
  nlohmann::json fault_status() const;
  void join_retired_worlds(bool finished_only = false);

  // ---- close and failures (trainer_close.cpp)
  int run();
  int close();
  void report_summary(int status) const;
  [[noreturn]] void fail_in_step(const std::exception& e, bool out_of_memory);
  [[noreturn]] void fail_on_data(const DataError& e);
  std::string save_after_failure(bool intact);

  config::Config cfg_;
  comm::WorldInfo world_info_;
  bool leader_ = true;  // rank 0 owns the run directory, metrics and checkpoints
  c10::Device device_ = c10::kCPU;
  bool bf16_ = false;
  Clock::time_point t_start_;

  std::vector<Engine> engines_;
  std::unique_ptr<comm::World> world_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<model::Model> net_;
  data::Mixture data_;  // data.path: one dataset, or a mixture file's
  data::SampleOptions sample_options_;  // what the data source was built with (rebuilt for another world)
  fusion::StepMode mode_;               // the step runner's mode (the gradient path is rebuilt with it)
  // The seams.
  std::unique_ptr<data::BatchSource> source_;
  std::unique_ptr<fusion::StepRunner> runner_;
  std::unique_ptr<comm::GradientReducer> reducer_;
  // Work the reducer captures into the runner's graph (gcts::GradientPath); outlives the runner's use.
  std::unique_ptr<fusion::GraphReduction> graph_reduction_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  optim::Schedule schedule_;

  std::string run_dir_, ckpt_dir_, last_ckpt_;
  TrainerPosition pos_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<checkpoint::Writer> writer_;
  std::thread reserver_;  // reserves the writer's staging while training starts
  std::exception_ptr reserve_error_;
  Clock::time_point last_ckpt_time_;
  int64_t failed_writes_ = 0;
  int64_t last_saved_step_ = -1;

  int64_t steps_done_ = 0, last_step_ = 0;  // this process trains steps (steps_done_, last_step_]
  bool control_stop_ = false;
  bool requeue_stop_ = false;  // the stop came from SIGUSR1 (on any rank): close() returns kExitRequeue
  bool preempt_stop_ = false;  // the stop came from a signal (on any rank): close() writes a preemption save
  Clock::time_point stop_applied_at_;  // when this rank applied the stop (the preemption save's clock without a signal here)
  checkpoint::WriteResult last_write_;  // rank 0: the newest finished write (collect_writes)
  double flops_per_sample_ = 0;
  int64_t tokens_per_view_ = 0;
  StepRecord record_;  // the step just taken, reported at its boundary
  nlohmann::json compiled_step_;  // the step runner's "package" (fusion::StepMode::package_status); null: off
  nlohmann::json micro_batch_choice_;  // how trainer.micro_batch_size auto was resolved; null: a number was set
  nlohmann::json micro_batch_json() const;  // for `status` and the summary
  double first_step_s_ = -1;  // seconds from the Trainer's construction to the first record of this process
  // Where that time went (Note [Time to the first step] in trainer_open.cpp), in order: each phase's seconds
  // and what the trainer thread spent in it (its CPU time, its page faults served from storage, the process's
  // storage reads).
  struct StartupPhase {
    std::string name;
    double s = 0;
    ThreadUsage use;
  };
  std::vector<StartupPhase> startup_;
  Clock::time_point startup_mark_;  // end of the last phase in startup_
  ThreadUsage startup_use_;         // the trainer thread's usage at startup_mark_
  bool marking_first_step_ = true;  // step() marks the first step's parts once
  void startup_phase(const char* name);
  void close_startup();             // at the first record: the rest of the first step, then one log line
  nlohmann::json startup_json() const;
  std::string startup_text() const;
  // Set on the fast path (CUDA, an optimizer that skips non-finite updates on
  // the device): the step reads nothing back; records go out one boundary late.
  std::unique_ptr<Readback> readback_;
  std::unique_ptr<CommTimer> comm_timer_;  // GPUs with communication: exposed_comm_ms timed on the device
  std::unique_ptr<optim::OptimizerGraph> optimizer_graph_;  // fast path with CUDA graphs (optimizer_graph.hpp)
  Clock::time_point step_started_;  // start of the step just taken
  Clock::time_point step_began_;    // start of the step being taken (a failure's time into it)
  // Fault tolerance (fault.enable): this rank's number when the job started, the generation of the
  // group (0 = as started), its members (job ranks), what happened, old worlds being torn down.
  bool fault_ = false;
  bool ended_before_rejoin_ = false;  // a restarted rank that the job ended without (run() returns 0)
  bool comm_timeout_set_ = false;
  int64_t job_rank_ = 0, job_world_ = 1, generation_ = 0;
  int64_t rejoin_requested_ = -1;  // the generation in which rank 0 last asked to take a rank back
  std::vector<int64_t> members_;
  std::unique_ptr<fault::Heartbeat> heartbeat_;
  nlohmann::json fault_events_ = nlohmann::json::array();
  // Old worlds being torn down on threads of their own (a process group may wait out a hung collective);
  // reaped once done, so kill/rejoin cycles do not pile them up.
  struct RetiredWorld {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<RetiredWorld> retired_worlds_;
  int64_t frames_counted_ = 0;        // source frames_decoded at frames_counted_at_ (decoded_frames_per_s)
  int64_t bytes_counted_ = 0;         // source video_bytes_read then (read_mb_per_s)
  int64_t h2d_counted_ = 0;           // source h2d_bytes then (h2d_mb_per_s)
  int64_t readahead_counted_ = 0;     // source readahead_bytes then (readahead_mb_per_s)
  Clock::time_point frames_counted_at_ = Clock::now();
};

}  // namespace loongforge::trainer
