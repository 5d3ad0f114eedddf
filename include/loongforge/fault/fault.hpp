// loongforge/fault/fault.hpp — losing a rank and training on (the `fault`
// config section; docs/fault-tolerance.md).
//
// Contract:
//  - Heartbeat: while it lives, a thread sets lf/ft/hb/<rank> (the rank's
//    number in the job as it started) to a counter every fault.heartbeat_s,
//    through a client of the rendezvous store of its own (the trainer
//    thread's store calls never wait behind it). A dead process stops
//    beating, and so does a stopped one (SIGSTOP stops every thread).
//  - regroup(): called by every surviving rank after one of its collectives
//    failed (Note [Regroup]). Every rank that reaches it in time is a member
//    of the next generation; a rank whose heartbeat stands still for
//    fault.heartbeat_timeout_s meanwhile is lost. Returns the same Decision
//    on every member; a rank left out gets a FaultError saying so. Rank 0
//    decides: it serves the rendezvous store, so the job cannot outlive it
//    (a CommError naming it when the store is gone).
//  - Trainer thread only (the Heartbeat's own thread aside).
//
// Example:
//   fault::Heartbeat beat(world_info, cfg.fault.heartbeat_s);
//   ...a step throws CommError...
//   fault::Decision d = fault::regroup(world->store(), {generation, job_rank, members, steps_done}, fault::options(cfg));
//   auto next = comm::World::regroup(*world, d.rank_of(job_rank), d.members.size(), d.generation, timeout_ms);
#pragma once

#include <atomic>              // std::atomic
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // int64_t
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread
#include <vector>              // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/comm/world_info.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/config/config.hpp"

namespace c10d {
class Store;
}

namespace loongforge::fault {

struct Options {
  double comm_timeout_s = 60, heartbeat_s = 1, heartbeat_timeout_s = 10;
  int64_t min_world_size = 1;
};
Options options(const config::Config& cfg);

class Heartbeat {
 public:
  // `job_rank`: the rank's number when the job started (its key for the whole run).
  Heartbeat(const comm::WorldInfo& info, int64_t job_rank, double interval_s);
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  int64_t beats() const { return beats_.load(); }

 private:
  void loop(const comm::WorldInfo& info, int64_t job_rank, double interval_s);
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int64_t> beats_{0};
  std::thread thread_;
};

std::string heartbeat_key(int64_t job_rank);

// Where this rank stands when it asks to regroup.
struct Standing {
  int64_t generation = 0;             // the generation that failed (0: the job as it started)
  int64_t job_rank = 0;               // this rank's number when the job started
  std::vector<int64_t> members;       // the failed generation's members (job ranks, ascending)
  int64_t steps_done = 0;             // optimizer steps this rank has applied
};

// What every member of the new generation is told (Note [Regroup]).
struct Decision {
  int64_t generation = 1;
  std::vector<int64_t> members;  // job ranks, ascending: a member's new rank is its index
  std::vector<int64_t> lost;     // job ranks of the failed generation that are not members
  std::vector<int64_t> before;   // the previous generation's members (job ranks, ascending): their ranks there
  int64_t step = 0;              // the most steps any member has applied: everyone continues from there
  int64_t source = 0;            // job rank of the member whose state everyone takes (the first with `step`)
  double waited_s = 0;           // how long rank 0 waited for the members
  int64_t rank_of(int64_t job_rank) const;  // -1: not a member
  nlohmann::json to_json() const;
  static Decision from_json(const nlohmann::json& j);
};

Decision regroup(c10d::Store& store, const Standing& me, const Options& o);

}  // namespace loongforge::fault
