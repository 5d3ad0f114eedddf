// src/trainer/control_plane.hpp — what loongforge-train exposes on its
// control socket (docs/architecture.md s5) and how the trainer thread applies it.
//
// Contract:
//  - ControlPlane registers every verb with a control::Server and starts it
//    (unless control.enable=false). Read-only verbs (status) are answered on
//    the control thread from the snapshot the trainer publishes after each
//    step; everything else runs on the trainer thread in step_boundary().
//  - Cluster-wide verbs (checkpoint-now, stop, and engine verbs marked
//    `cluster` such as GCTS's switch-strategy) are published on a CommandBus with the step at which
//    every rank applies them (Note [Cluster-wide verbs]); the rank that
//    received the request answers once the action is done on it.
//  - Engine verbs come from the engines' records (common/engine.hpp): their
//    arguments are checked, then an engine that is off answers engine_off
//    naming what brings it; one that is on answers through its record.
//  - profile-step records per-phase wall times of the next steps on the
//    trainer thread (device synchronised between phases while profiling) and
//    answers with the profile and a Chrome trace. ControlPlane is the
//    trainer's PhaseRecorder (common/phases.hpp).
//  - Trainer thread only, except what the server's control thread reads
//    through publish_status() (guarded by a mutex).
//
// Note [Cluster-wide verbs]
// A rank that receives checkpoint-now/stop at the boundary after step s
// publishes {verb, args, apply_step} on the bus. With one rank apply_step = s
// (applied at once). With several, apply_step = s + 2: ranks are at most one
// step apart (every step ends in a collective), so every rank reads the
// command at a boundary <= s + 1 and applies it at boundary s + 2, before
// any rank can pass it. A rank that finds a command for a step it has already
// passed stops with a CommError naming it (it would mean the invariant broke).
#pragma once

#include <chrono>      // std::chrono::steady_clock
#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <map>         // std::map
#include <memory>      // std::unique_ptr
#include <mutex>       // std::mutex
#include <optional>    // std::optional
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/engine.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/control/server.hpp"
#include "cuda_activity.hpp"

namespace c10d {
class Store;
}

namespace loongforge::trainer {

// A cluster-wide command.
struct Command {
  std::string verb;
  nlohmann::json args = nlohmann::json::object();
  int64_t apply_step = 0;
  int64_t origin_rank = 0;
  uint64_t token = 0;  // the origin rank's handle for its waiting reply
};

// How commands reach every rank (Note [Cluster-wide verbs]).
class CommandBus {
 public:
  virtual ~CommandBus() = default;
  // Commands published so far are not returned by poll() (a rank that joins a running job).
  virtual void skip_published() {}
  // Publishes `c` (apply_step filled in) and returns it.
  virtual Command publish(Command c, int64_t steps_done) = 0;
  // Commands published since the last call, by any rank (this one included).
  virtual std::vector<Command> poll(int64_t steps_done) = 0;
  // Rank 0 writes the checkpoints (replicated state); it announces each
  // finished write so that the rank that received checkpoint-now can answer.
  virtual void announce_checkpoint(int64_t step, const nlohmann::json& result) = 0;
  virtual std::optional<nlohmann::json> checkpoint_result(int64_t step) = 0;
};

// The bus of a one-rank run: commands apply at the boundary they arrive.
std::unique_ptr<CommandBus> make_local_bus();
// The bus of a multi-rank run, over the rendezvous store (keys "lf/ctl/...").
std::unique_ptr<CommandBus> make_store_bus(c10d::Store& store);

// One timed phase of a step, for profile-step (times relative to the
// profile's start, microseconds).
struct PhaseEvent {
  std::string name;
  int64_t step = 0, micro = -1;
  double start_us = 0, dur_us = 0;
};

class ControlPlane final : public PhaseRecorder {
 public:

  struct Identity {
    int64_t rank = 0, world = 1;
    std::string device, precision, model;
    bool cuda = false;  // phases synchronise the device while profiling
  };
  // What the trainer does when a command falls due.
  struct Actions {
    bool checkpoint = false;  // write a checkpoint now (checkpoint-now)
    bool stop = false;        // checkpoint, then exit 0 (stop)
    bool requeue = false;     // the stop came from SIGUSR1: exit kExitRequeue when steps remain
    bool signal = false;      // the stop came from a signal on some rank: a preemption save (stop_signal.hpp)
    int64_t rejoin = -2;      // hot-rejoin: take back this job rank (-1: every lost rank that registered); -2: none
  };

  // `engines` must outlive the ControlPlane (their verbs are served from it).
  ControlPlane(const config::Config& cfg, Identity id, std::unique_ptr<CommandBus> bus,
               const std::vector<Engine>& engines);
  ~ControlPlane() override;

  const std::string& socket_path() const;  // "" when the control socket is off

  // Replaces the snapshot `status` answers with.
  void publish_status(nlohmann::json status);
  // `status` also holds key: read() at each request, on the control thread (for
  // what changes between steps, such as a checkpoint write's progress).
  void set_live_status(std::string key, std::function<nlohmann::json()> read);

  // At each step boundary (steps_done optimizer steps finished): runs queued
  // requests, reads the bus, returns what falls due now. stop_signal: a
  // SIGTERM/SIGINT/SIGUSR1 was seen; the first one is published on the bus
  // like `loongforge stop` (with requeue=true for SIGUSR1: requeue_signal),
  // so every rank stops at the same step and exits with the same status.
  Actions step_boundary(int64_t steps_done, bool stop_signal, bool requeue_signal = false);

  // Checkpoint bookkeeping: checkpoint-now answers when its write ends.
  void checkpoint_finished(int64_t step, const std::string& path, const std::string& error, double seconds,
                           uint64_t bytes);

  // Profiling (profile-step). A requested profile starts at the next
  // step_begins() (called first thing in every step); profiling() is true while a profile records;
  // phase() adds one event; step_done() closes a step (`data`: the data
  // source's per-step counters, kept in per_step) and answers the request
  // once its duration has passed.
  void step_begins();
  // After a regroup (fault tolerance): this rank's number and the world size from now on.
  void rank_changed(int64_t rank, int64_t world) { id_.rank = rank, id_.world = world; }
  // hot-rejoin (fault tolerance): `check` says what is wrong with a request ("" = nothing) on the receiving
  // rank; without it (fault.enable=false) the verb answers engine_off. request() publishes the verb from
  // this rank (fault.auto_rejoin), applied by every rank like the socket's.
  void set_rejoin_check(std::function<std::string(const nlohmann::json&)> check) { rejoin_check_ = std::move(check); }
  void request(const std::string& verb, const nlohmann::json& args);
  // A rank that joined a running job: the commands published before now are not for it.
  void skip_published() { bus_->skip_published(); }
  bool profiling() const { return profile_.has_value() && profile_->started; }
  void phase(const char* name, int64_t step, int64_t micro, Clock::time_point t0, Clock::time_point t1);
  void step_done(int64_t step, double step_ms, const nlohmann::json& memory,
                 const nlohmann::json& data = nlohmann::json());
  // PhaseRecorder.
  bool recording() const override { return profiling(); }
  void end_phase(const char* name, int64_t step, int64_t micro, Clock::time_point t0) override;

  // The trainer is exiting: stop requests get ok(final_state), every other
  // waiting request an error; the socket goes away.
  void shutdown(const nlohmann::json& final_state);

 private:
  void register_verbs(const std::vector<Engine>& engines);
  void answer_checkpoint_waiters_from_bus();

  Identity id_;
  std::function<std::string(const nlohmann::json&)> rejoin_check_;
  std::unique_ptr<CommandBus> bus_;
  std::unique_ptr<control::Server> server_;
  std::string socket_path_;
  std::mutex status_mu_;
  nlohmann::json status_;  // guarded by status_mu_
  std::vector<std::pair<std::string, std::function<nlohmann::json()>>> live_status_;  // guarded by status_mu_
  // Trainer-thread state.
  int64_t steps_done_ = 0;
  bool stop_published_ = false;
  std::vector<Command> due_;                                   // published, not yet applied
  uint64_t next_token_ = 1;
  std::map<uint64_t, control::Reply> origin_waiters_;          // token -> reply, until applied
  std::multimap<int64_t, control::Reply> checkpoint_waiters_;  // step -> reply, until written
  std::vector<control::Reply> stop_waiters_;
  std::map<std::string, const EngineVerb*> cluster_verbs_;  // engine verbs applied through the bus
  struct Profile {
    control::Reply reply;
    double duration_s = 1;
    int64_t max_steps = 1000;
    Clock::time_point start;
    bool started = false;
    bool kernels = false;  // also count CUDA activity (cuda_activity.hpp)
    std::vector<PhaseEvent> events;
    std::vector<nlohmann::json> steps;
    nlohmann::json cuda;   // the counts, or why there are none
  };
  CudaActivityCounter counter_;
  std::optional<Profile> profile_;  // started = false until the next step begins
};

}  // namespace loongforge::trainer
