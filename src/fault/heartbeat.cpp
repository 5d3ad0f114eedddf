// Each rank's heartbeat through the rendezvous store (fault.hpp).
#include <chrono>  // std::chrono

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "loongforge/common/log.hpp"
#include "loongforge/fault/fault.hpp"

namespace loongforge::fault {

Options options(const config::Config& cfg) {
  Options o;
  o.comm_timeout_s = cfg.fault.comm_timeout_s;
  o.heartbeat_s = cfg.fault.heartbeat_s;
  o.heartbeat_timeout_s = cfg.fault.heartbeat_timeout_s;
  o.min_world_size = cfg.fault.min_world_size;
  return o;
}

std::string heartbeat_key(int64_t job_rank) { return "lf/ft/hb/" + std::to_string(job_rank); }

Heartbeat::Heartbeat(const comm::WorldInfo& info, int64_t job_rank, double interval_s)
    : thread_([this, info, job_rank, interval_s] { loop(info, job_rank, interval_s); }) {}

Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// Its own client of the store: a heartbeat never queues behind the trainer
// thread's calls, nor they behind it. When the store is gone (rank 0 lost),
// the beats stop with one warning; the trainer learns it from its own calls.
void Heartbeat::loop(const comm::WorldInfo& info, int64_t job_rank, double interval_s) {
  const auto interval = std::chrono::duration<double>(interval_s);
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(info.master_port);
    so.isServer = false;
    so.waitWorkers = false;
    so.timeout = std::chrono::milliseconds(30000);
    c10d::TCPStore store(info.master_addr, so);
    const std::string key = heartbeat_key(job_rank);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      const std::string v = std::to_string(beats_.load() + 1);
      lock.unlock();
      store.set(key, std::vector<uint8_t>(v.begin(), v.end()));
      beats_.fetch_add(1);
      lock.lock();
      cv_.wait_for(lock, interval, [this] { return stop_; });
    }
  } catch (const std::exception& e) {
    LF_LOG(logger("comm"), warn) << "rank " << job_rank << ": heartbeat stopped (the rendezvous store at "
                                 << info.master_addr << ":" << info.master_port << " is unreachable: " << e.what()
                                 << ")";
  }
}

}  // namespace loongforge::fault
