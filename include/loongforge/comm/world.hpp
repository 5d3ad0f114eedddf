// loongforge/comm/world.hpp — the ranks of a job, the one communication
// interface every collective goes through (Gloo on CPUs, NCCL on GPUs), and
// the plain gradient path (GCTS off: one flat all-reduce after backward).
//
// Contract:
//  - Who is who comes from world_from_env() (world_info.hpp).
//  - World::connect() rendezvouses through libtorch's c10d TCPStore (rank 0
//    serves it) and opens one c10d backend behind the interface below
//    (Note [One interface, two backends]): ProcessGroupGloo for Backend::Gloo
//    (CPU tensors) or ProcessGroupNCCL for Backend::Nccl (CUDA tensors of
//    device()), each compiled in only where its headers were found. Every rank
//    must make the same collective calls in the same order (c10d's rule). A
//    peer that does not arrive within timeout_ms raises CommError naming the
//    address and rank.
//  - Collectives take tensors on device() (CPU for Gloo) and are blocking:
//    they return when the result is in place (on NCCL: ordered on the current
//    stream). The *_async forms return a Pending to wait on later, so several
//    buckets can be in flight at once.
//  - store() is the rendezvous store for small control messages (the
//    control plane's cluster-wide commands); keys under "lf/".
//    all_gather_on_hosts() exchanges small strings through it without
//    touching a device (the step's counts, so a GPU rank never waits for its
//    device to learn them).
//  - Trainer thread only.
//
// Example:
//   auto world = comm::World::connect(comm::world_from_env(), 300000, comm::Backend::Gloo);
//   comm::GradientSync sync(*world);
//   sync.average(params);      // after backward, before clipping
#pragma once

#include <atomic>      // std::atomic
#include <chrono>      // std::chrono::steady_clock
#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr, std::shared_ptr
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <c10/core/Device.h>   // c10::Device

#include "loongforge/comm/world_info.hpp"

namespace c10d {
class Store;
}

namespace loongforge::comm {

// Note [One interface, two backends]
// GCTS needs five collectives: all-reduce (sum), reduce-scatter (sum; rank r
// receives piece r), all-gather into one flat tensor, broadcast and barrier.
// c10d's Backend class declares all five and both ProcessGroupGloo and
// ProcessGroupNCCL implement them, over the same TCPStore rendezvous; so
// World holds one c10d::Backend and the rest of the code never names the
// library. The choice (libtorch's c10d NCCL process group rather than NCCL
// directly) keeps NCCL's communicator setup, stream ordering, error checking
// and timeouts as PyTorch DDP users know them, at the price of c10d's Work
// objects (a few microseconds per call, negligible next to bucket sizes of
// megabytes). ncclCommShrink/revoke (hot rejoin, not done) would need the raw
// communicator, which ProcessGroupNCCL also exposes (getCommPtr).
enum class Backend { Gloo, Nccl };
const char* backend_name(Backend b);
// Whether this binary has the backend (its headers were found at build time).
bool backend_built(Backend b);

// Note [Collective timings on the device]
// On NCCL a collective's completion callback runs when it is enqueued (c10d
// marks a CUDA future complete at once and orders streams after it), so host
// clocks time launches only. There each *_async collective gets a
// DeviceSpan: a timing event recorded on the caller's stream just before the
// launch (the NCCL stream waits for that stream, so the collective starts no
// earlier) and one recorded, after the launch, on a stream of World's own
// that waits for the collective and does nothing else: it completes when the
// collective does. done() asks without waiting; ms_from(t0) gives start and
// end in milliseconds after another span's start (so spans of one step share
// a clock). Gloo: no spans (host clocks are right there).
struct DeviceSpan {
  DeviceSpan();
  ~DeviceSpan();
  DeviceSpan(const DeviceSpan&) = delete;
  DeviceSpan& operator=(const DeviceSpan&) = delete;
  bool done() const;                                           // both events have completed
  std::pair<double, double> ms_from(const DeviceSpan& t0) const;  // (start, end); needs done() of both
  struct Events;
  std::unique_ptr<Events> events;
};

// A collective in flight (the *_async forms); wait() rethrows its failure as
// a CommError naming the rank and the collective. finished_at() is when the
// collective completed (the backend's completion callback, on its own thread;
// when that has not run yet once wait() returns, the moment wait() returned),
// for the per-bucket timings of monitor-comm and gcts.rebuild_interval;
// span() is its DeviceSpan on NCCL (null on Gloo), valid after wait() too.
// A collective launched while the current stream is being captured into a
// CUDA graph (Note [Reduction in the graph] in src/engines/gcts/reducer.cpp)
// (in_graph) has neither a span nor a completion time (it runs at each
// replay, not now), and wait() only makes the capturing stream wait for it,
// as the captured work's end.
class Pending {
 public:
  using Clock = std::chrono::steady_clock;
  Pending() = default;
  Pending(std::shared_ptr<void> work, std::string what, int64_t rank, std::shared_ptr<const DeviceSpan> span = nullptr,
          bool in_graph = false);
  void wait();
  bool valid() const { return static_cast<bool>(work_); }
  Clock::time_point finished_at() const;
  const std::shared_ptr<const DeviceSpan>& span() const { return span_; }

 private:
  std::shared_ptr<void> work_;  // holds a c10::intrusive_ptr<c10d::Work>
  std::string what_;
  int64_t rank_ = 0;
  // steady_clock nanoseconds of completion (0: not yet), written by the backend's thread
  std::shared_ptr<std::atomic<int64_t>> done_ns_;
  std::shared_ptr<const DeviceSpan> span_;
};

// Note [Regrouped worlds]
// After a rank is lost (fault tolerance, src/fault/), the survivors open a
// new World over the same rendezvous store: ranks renumbered 0..n-1 in the
// order of their old ranks, its process group's and host exchange's keys
// under the generation's own prefix (lf/ft/<generation>/), so nothing of the
// broken group is read again. The old World is given up whole: a Gloo group
// may still be waiting out a hung collective (it ends at its timeout); an
// NCCL one is abort()ed first, which ends its communicator's kernels that
// wait for a dead peer, and the new generation gets a new communicator
// (test/comm/test_nccl_gpu.cpp on one GPU; several GPUs have not run it).
//
// Note [Settling a step on NCCL]
// A Gloo collective completes on the host, so a dead or hung peer makes the
// call raise (after the timeout) before anything uses its result. An NCCL
// collective is only queued: the host runs on, and the update that follows
// would run on the device with whatever a broken all-reduce left. So with
// fault tolerance on NCCL the trainer settles each step before its update:
// settle() records an event on the current stream and polls it (and the
// process group's error state) from the host until the device has run
// everything queued so far, the step's collectives included. When the
// backend reports an error, or the event is not done within the collective
// timeout (fault.comm_timeout_s after the first step), the group is
// aborted (its kernels stop waiting for the peer) and CommError names the
// rank, the work and the cause: the update never ran, as on Gloo. The
// price is the host's lead over the device at that point (0.2% of
// gr00t-n1.7-3b's full fine-tuning throughput on an H100:
// docs/benchmarks.md). The abort ends NCCL's kernels, not other work
// queued on the device: ncclCommAbort returned only once a queued 4 s spin
// kernel had run (test_nccl_gpu, one H100), so the CommError comes after
// such work. ProcessGroupNCCL's
// own watchdog must not end the process first: connect_for_training sets
// TORCH_NCCL_ASYNC_ERROR_HANDLING=2 (clean up, keep the process) for a
// fault-tolerant job. Gloo: nothing.
class World {
 public:
  // Ignores SIGPIPE for the whole process (Note [SIGPIPE] in world.cpp: a write to a dead peer's socket
  // must fail, not end this process).
  // `may_join` (fault tolerance): when the store says the job already runs without this process (the job's
  // generation lf/ft/generation is set, or an earlier process of this rank left its heartbeat), no process
  // group is opened: joining() is true, and only the store works until regroup() makes this rank a member.
  static std::unique_ptr<World> connect(const WorldInfo& info, int64_t timeout_ms, Backend backend = Backend::Gloo,
                                        c10::Device device = c10::kCPU, bool may_join = false);
  bool joining() const { return joining_; }
  // Note [Regrouped worlds]: this rank as `rank` of `world_size` survivors, generation `generation` (>= 1).
  static std::unique_ptr<World> regroup(World& from, int64_t rank, int64_t world_size, int64_t generation,
                                        int64_t timeout_ms);
  // Ends the process group's communication at once (NCCL: ncclCommAbort through c10d, so kernels waiting
  // for a dead peer return; Gloo: nothing, its collectives end at their timeout). Only destruction and
  // regroup() may follow.
  void abort();
  // Note [Settling a step on NCCL]: returns once the device has run all work queued on the current stream;
  // CommError (the group aborted) on a backend error or after timeout_ms(). `what` names the work for the
  // message. Gloo: returns at once.
  void settle(const std::string& what);
  ~World();
  // The timeout of every later collective and host exchange (fault.comm_timeout_s after the first step).
  void set_timeout(int64_t timeout_ms);
  int64_t timeout_ms() const;
  const WorldInfo& info() const { return info_; }

  int64_t rank() const { return info_.rank; }
  int64_t size() const { return info_.world_size; }
  Backend backend() const { return backend_; }
  // Where collective tensors must live: CPU for Gloo, the rank's GPU for NCCL.
  c10::Device device() const { return device_; }
  c10d::Store& store();

  void allreduce_sum(std::vector<at::Tensor>& tensors);  // in place
  Pending allreduce_sum_async(at::Tensor tensor);
  // Sum over ranks of `inputs[r]` (one tensor per destination rank, all the
  // shape of `output`) lands in `output` on rank r.
  Pending reduce_scatter_sum_async(at::Tensor output, std::vector<at::Tensor> inputs);
  // `output` (size() x input.numel(), flat) <- every rank's `input`, in rank order.
  Pending all_gather_async(at::Tensor output, at::Tensor input);
  void broadcast(std::vector<at::Tensor>& tensors, int64_t root);
  void barrier();
  // Rank 0's `value` for `key`, on every rank (through the store; small strings).
  std::string agree(const std::string& key, const std::string& value_on_rank0);
  // Every rank's `mine`, in rank order, through the store: host to host, so
  // it never waits for device work (Note [Host exchange] in world.cpp). Every
  // rank must call it equally often; small strings (a step's counts).
  std::vector<std::string> all_gather_on_hosts(const std::string& mine);

 private:
  struct Impl;
  explicit World(WorldInfo info);
  // Launches one collective (Note [Collective timings on the device]).
  Pending launch(const char* what, const std::function<std::shared_ptr<void>()>& enqueue);
  WorldInfo info_;
  bool joining_ = false;
  Backend backend_ = Backend::Gloo;
  c10::Device device_ = c10::kCPU;
  std::unique_ptr<Impl> impl_;
};

// One bucket: every gradient flattened into one fp32 buffer, summed, divided
// by the world size, copied back (docs/training-semantics.md: gradients are
// averaged over ranks).
struct SyncStats {
  double bytes = 0, ms = 0;
};

class GradientSync {
 public:
  explicit GradientSync(World& world) : world_(world) {}
  SyncStats average(const std::vector<at::Tensor>& params);

 private:
  World& world_;
  at::Tensor flat_;  // reused bucket
};

// The trainer's World: nullptr for one rank (nothing to communicate), else
// connected over NCCL for a GPU rank and Gloo for a CPU one (Note [One
// interface, two backends]), with the rendezvous timeout of 300 s. With
// `may_join` (fault.enable) on a GPU, TORCH_NCCL_ASYNC_ERROR_HANDLING is set
// to 2 first (Note [Settling a step on NCCL]; another value set by the user
// is replaced, with a warning). Test hook:
// LOONGFORGE_TEST_ONE_RANK_WORLD=1 connects a World at one rank as well, so
// one GPU runs the multi-rank step's communication (one-rank collectives;
// test_trainer_gpu).
std::unique_ptr<World> connect_for_training(const WorldInfo& info, c10::Device device, bool may_join = false);

}  // namespace loongforge::comm
