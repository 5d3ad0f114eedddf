// Ranks, rendezvous and the plain gradient all-reduce (world.hpp).
#include "loongforge/comm/world.hpp"

#include <netdb.h>   // getaddrinfo
#include <signal.h>  // signal, SIGPIPE

#include <chrono>   // std::chrono
#include <cstdlib>  // std::getenv, std::strtoll

#include <optional>  // std::optional

#include <ATen/ATen.h>  // at::empty
#include <ATen/core/ivalue.h>  // c10::ivalue::Future
#include <c10/core/Event.h>        // c10::Event
#include <c10/core/StreamGuard.h>  // c10::StreamGuard
#include <c10/core/impl/DeviceGuardImplInterface.h>  // c10::impl::getDeviceGuardImpl
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "backends.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"

namespace loongforge::comm {

// ---------------------------------------------------------------------------
// Environment

namespace {

bool env_int(const char* name, int64_t& out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  const long long x = std::strtoll(v, &end, 10);
  if (*end != '\0' || x < 0) throw ConfigError(std::string("environment variable ") + name + "='" + v + "' is not a non-negative integer");
  out = x;
  return true;
}

}  // namespace

WorldInfo world_from_env() {
  WorldInfo w;
  int64_t unused = 0;
  if (env_int("WORLD_SIZE", w.world_size)) {
    w.source = "torchrun environment";
    if (!env_int("RANK", w.rank) && w.world_size > 1) throw ConfigError("WORLD_SIZE is set but RANK is not (set both, as torchrun does)");
    env_int("LOCAL_RANK", w.local_rank);
  } else if (env_int("SLURM_NTASKS", w.world_size)) {
    w.source = "Slurm environment";
    if (!env_int("SLURM_PROCID", w.rank) && w.world_size > 1)
      throw ConfigError("SLURM_NTASKS is set but SLURM_PROCID is not (start the ranks with srun, which sets both)");
    env_int("SLURM_LOCALID", w.local_rank);
  } else if (env_int("RANK", unused)) {
    throw ConfigError("RANK is set but WORLD_SIZE is not (set both, as torchrun does, or neither for one process)");
  }
  if (w.world_size < 1) throw ConfigError("world size 0 (WORLD_SIZE/SLURM_NTASKS must be >= 1)");
  if (w.rank >= w.world_size)
    throw ConfigError("rank " + std::to_string(w.rank) + " is not below the world size " + std::to_string(w.world_size) +
                      " (" + w.source + ")");
  // torchrun numbers ranks node by node, so a local rank never exceeds the
  // global one (Slurm's distributions may interleave nodes: not checked there).
  if (w.source == "torchrun environment" && w.local_rank > w.rank)
    throw ConfigError("LOCAL_RANK=" + std::to_string(w.local_rank) + " is above RANK=" + std::to_string(w.rank) +
                      " (torchrun environment): local ranks count from 0 on each node and never exceed the global "
                      "rank; check the launcher");
  int64_t local_world = 0;
  if (env_int("LOCAL_WORLD_SIZE", local_world) && w.source == "torchrun environment" &&
      (w.local_rank >= local_world || local_world > w.world_size))
    throw ConfigError("LOCAL_WORLD_SIZE=" + std::to_string(local_world) + " does not fit LOCAL_RANK=" +
                      std::to_string(w.local_rank) + " and WORLD_SIZE=" + std::to_string(w.world_size) +
                      " (LOCAL_RANK < LOCAL_WORLD_SIZE <= WORLD_SIZE)");
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) w.master_addr = a;
  if (!env_int("MASTER_PORT", w.master_port) && w.world_size > 1)
    throw ConfigError("MASTER_PORT is not set: every rank needs MASTER_ADDR and MASTER_PORT of rank 0's rendezvous store");
  if (w.master_port < 1 || w.master_port > 65535) throw ConfigError("MASTER_PORT=" + std::to_string(w.master_port) + " is not a TCP port");
  if (w.world_size > 1) {
    // An unresolvable address would otherwise surface as a rendezvous timeout minutes later.
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    const int rc = getaddrinfo(w.master_addr.c_str(), nullptr, &hints, &res);
    if (res) freeaddrinfo(res);
    if (rc != 0)
      throw ConfigError("MASTER_ADDR='" + w.master_addr + "' does not resolve (" + gai_strerror(rc) +
                        "): set it to rank 0's host name or IP address");
  }
  return w;
}

// ---------------------------------------------------------------------------
// World

const char* backend_name(Backend b) { return b == Backend::Nccl ? "nccl" : "gloo"; }

bool backend_built(Backend b) {
  return b == Backend::Nccl ? LOONGFORGE_WITH_NCCL != 0 : LOONGFORGE_WITH_GLOO != 0;
}

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Pending::Clock::now().time_since_epoch()).count();
}
}  // namespace

struct DeviceSpan::Events {
  c10::Event start{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
  c10::Event end{c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT};
};
DeviceSpan::DeviceSpan() : events(std::make_unique<Events>()) {}
DeviceSpan::~DeviceSpan() = default;
bool DeviceSpan::done() const { return events->end.query() && events->start.query(); }
std::pair<double, double> DeviceSpan::ms_from(const DeviceSpan& t0) const {
  return {t0.events->start.elapsedTime(events->start), t0.events->start.elapsedTime(events->end)};
}

Pending::Pending(std::shared_ptr<void> work, std::string what, int64_t rank, std::shared_ptr<const DeviceSpan> span,
                 bool in_graph)
    : work_(std::move(work)),
      what_(std::move(what)),
      rank_(rank),
      done_ns_(std::make_shared<std::atomic<int64_t>>(0)),
      span_(std::move(span)) {
  // Captured: a CUDA future's callback would make a pool stream wait for an
  // event of the capture, joining that stream to it unjoined.
  if (in_graph) return;
  auto* w = static_cast<c10::intrusive_ptr<c10d::Work>*>(work_.get());
  try {
    auto done = done_ns_;
    (*w)->getFuture()->addCallback([done](c10::ivalue::Future&) {
      int64_t expected = 0;
      done->compare_exchange_strong(expected, now_ns());
    });
  } catch (const std::exception&) {
    // A backend without futures: finished_at() falls back to the end of wait().
  }
}

void Pending::wait() {
  if (!work_) return;
  auto* w = static_cast<c10::intrusive_ptr<c10d::Work>*>(work_.get());
  try {
    (*w)->wait();
  } catch (const std::exception& e) {
    work_.reset();
    throw CommError("rank " + std::to_string(rank_) + ": " + what_ + " failed (a peer died or hung?): " + e.what());
  }
  work_.reset();
  int64_t expected = 0;
  if (done_ns_) done_ns_->compare_exchange_strong(expected, now_ns());
}

Pending::Clock::time_point Pending::finished_at() const {
  const int64_t ns = done_ns_ ? done_ns_->load() : 0;
  return ns > 0 ? Clock::time_point(std::chrono::nanoseconds(ns)) : Clock::now();
}

namespace {
// Keeps a c10d work object alive for as long as its Pending is (any backend).
std::shared_ptr<void> hold(c10::intrusive_ptr<c10d::Work> w) {
  return std::shared_ptr<void>(new c10::intrusive_ptr<c10d::Work>(std::move(w)),
                               [](void* p) { delete static_cast<c10::intrusive_ptr<c10d::Work>*>(p); });
}
}  // namespace

struct World::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> pg;
  std::optional<c10::Stream> timing;  // NCCL: waits for each collective, then records its end
  int64_t host_calls = 0;  // all_gather_on_hosts calls so far (the same on every rank)
  std::string host_prefix = "lf/host/";  // Note [Regrouped worlds]: a generation's own keys
  std::chrono::milliseconds timeout{300000};
};

World::World(WorldInfo info) : info_(std::move(info)), impl_(std::make_unique<Impl>()) {}
World::~World() = default;

// Note [SIGPIPE]
// Gloo's TCP pairs and c10d's TCPStore write to their peers' sockets without
// MSG_NOSIGNAL: once a peer process is gone, a write to it raises SIGPIPE,
// whose default action ends this process at once, without a word (a survivor
// of comm_fault_sharded exited -13 so, instead of regrouping). Python ignores
// SIGPIPE from its start, which is why torch.distributed never meets it;
// loongforge's own sockets pass MSG_NOSIGNAL. So a process that connects a
// World ignores SIGPIPE from then on: the write fails with EPIPE, the
// collective or the store call raises, and fault tolerance sees a CommError.
std::unique_ptr<World> World::connect(const WorldInfo& info, int64_t timeout_ms, Backend backend, c10::Device device,
                                      bool may_join) {
  ::signal(SIGPIPE, SIG_IGN);  // Note [SIGPIPE]
  std::unique_ptr<World> w(new World(info));
  w->backend_ = backend;
  w->device_ = backend == Backend::Gloo ? c10::Device(c10::kCPU) : device;
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const std::string where = info.master_addr + ":" + std::to_string(info.master_port);
  // Fail before waiting minutes for peers when the backend is not in this binary.
  if (!backend_built(backend)) {
    std::string unused;
    if (backend == Backend::Gloo) detail::open_gloo(nullptr, info, timeout, &unused);
    detail::open_nccl(nullptr, info, timeout, device, &unused);
  }
  try {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(info.master_port);
    so.isServer = info.rank == 0;
    so.numWorkers = static_cast<size_t>(info.world_size);
    so.waitWorkers = true;
    so.timeout = timeout;
    w->impl_->store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, so);
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info.rank) + ": rendezvous at " + where + " failed: " + e.what() +
                    " (check MASTER_ADDR/MASTER_PORT, that the port is free on rank 0, and that all " +
                    std::to_string(info.world_size) + " ranks started)");
  }
  std::string on;
  w->impl_->timeout = timeout;
  // The keys of fault tolerance (src/fault/, src/trainer/trainer_fault.cpp): the job's current generation,
  // set once it went on without a rank, and this rank's heartbeat, set by an earlier process of this rank.
  if (may_join && (w->impl_->store->check({"lf/ft/generation"}) ||
                   w->impl_->store->check({"lf/ft/hb/" + std::to_string(info.rank)}))) {
    w->joining_ = true;
    LF_LOG(logger("comm"), info) << "rank " << info.rank << ": the job at " << where
                                 << " went on without this rank; it joins at a step boundary";
    return w;
  }
  w->impl_->pg = backend == Backend::Gloo ? detail::open_gloo(w->impl_->store, info, timeout, &on)
                                          : detail::open_nccl(w->impl_->store, info, timeout, device, &on);
  LF_LOG(logger("comm"), info) << "rank " << info.rank << " of " << info.world_size << " joined (" << info.source
                               << ", rendezvous " << where << ", " << on << ")";
  return w;
}

std::unique_ptr<World> World::regroup(World& from, int64_t rank, int64_t world_size, int64_t generation,
                                      int64_t timeout_ms) {
  WorldInfo info = from.info_;
  info.rank = rank, info.world_size = world_size;
  std::unique_ptr<World> w(new World(info));
  w->backend_ = from.backend_;
  w->device_ = from.device_;
  w->impl_->store = from.impl_->store;
  w->impl_->timeout = std::chrono::milliseconds(timeout_ms);
  const std::string prefix = "lf/ft/" + std::to_string(generation);
  w->impl_->host_prefix = prefix + "/host/";
  std::string on;
  const auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, w->impl_->store);
  w->impl_->pg = w->backend_ == Backend::Gloo
                     ? detail::open_gloo(prefixed, info, w->impl_->timeout, &on)
                     : detail::open_nccl(prefixed, info, w->impl_->timeout, w->device_, &on);
  LF_LOG(logger("comm"), info) << "rank " << rank << " of " << world_size << " (generation " << generation
                               << ", was rank " << from.info_.rank << " of " << from.info_.world_size << ", " << on
                               << ")";
  return w;
}

void World::abort() {
  if (!impl_->pg || backend_ != Backend::Nccl) return;
  try {
    impl_->pg->abort();
  } catch (const std::exception& e) {
    LF_LOG(logger("comm"), warn) << "rank " << info_.rank << ": aborting the NCCL group: " << e.what();
  }
}

// Note [Settling a step on NCCL] (world.hpp).
void World::settle(const std::string& what) {
  if (!impl_->pg || backend_ != Backend::Nccl) return;
  std::string why;
  try {
    why = detail::settle_nccl(*impl_->pg, device_, impl_->timeout);
  } catch (const std::exception& e) {
    why = std::string("waiting for the device failed: ") + e.what();
  }
  if (why.empty()) return;
  abort();
  throw CommError("rank " + std::to_string(info_.rank) + ": " + what + " did not complete: " + why +
                  " (a peer died or hung?); this rank's NCCL group was aborted");
}

void World::set_timeout(int64_t timeout_ms) {
  impl_->timeout = std::chrono::milliseconds(timeout_ms);
  impl_->pg->setTimeout(impl_->timeout);
}

int64_t World::timeout_ms() const { return impl_->timeout.count(); }

c10d::Store& World::store() { return *impl_->store; }

void World::allreduce_sum(std::vector<at::Tensor>& tensors) {
  try {
    impl_->pg->allreduce(tensors)->wait();
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info_.rank) + ": all-reduce failed (a peer died or hung?): " + e.what());
  }
}

// Note [Collective timings on the device] (world.hpp).
Pending World::launch(const char* what, const std::function<std::shared_ptr<void>()>& enqueue) {
  try {
    if (backend_ != Backend::Nccl) return Pending(enqueue(), what, info_.rank);
    // Captured into a CUDA graph: no span (its events would order streams only, Note [Reduction in the graph]).
    if (detail::stream_capturing(device_)) return Pending(enqueue(), what, info_.rank, nullptr, /*in_graph=*/true);
    const auto* guard = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
    if (!impl_->timing) impl_->timing = guard->getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    auto span = std::make_shared<DeviceSpan>();
    span->events->start.record(guard->getStream(device_));
    std::shared_ptr<void> work = enqueue();
    {
      c10::StreamGuard on_timing(*impl_->timing);
      (*static_cast<c10::intrusive_ptr<c10d::Work>*>(work.get()))->wait();  // this stream only (not the host)
      span->events->end.record(*impl_->timing);
    }
    return Pending(std::move(work), what, info_.rank, std::move(span));
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info_.rank) + ": " + what + " failed: " + e.what());
  }
}

Pending World::allreduce_sum_async(at::Tensor tensor) {
  std::vector<at::Tensor> t = {std::move(tensor)};
  return launch("all-reduce", [&] { return hold(impl_->pg->allreduce(t)); });
}

Pending World::reduce_scatter_sum_async(at::Tensor output, std::vector<at::Tensor> inputs) {
  std::vector<at::Tensor> out = {std::move(output)};
  std::vector<std::vector<at::Tensor>> in = {std::move(inputs)};
  return launch("reduce-scatter", [&] { return hold(impl_->pg->reduce_scatter(out, in)); });
}

Pending World::all_gather_async(at::Tensor output, at::Tensor input) {
  return launch("all-gather", [&] { return hold(impl_->pg->_allgather_base(output, input)); });
}

void World::broadcast(std::vector<at::Tensor>& tensors, int64_t root) {
  c10d::BroadcastOptions o;
  o.rootRank = root;
  try {
    impl_->pg->broadcast(tensors, o)->wait();
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info_.rank) + ": broadcast failed: " + e.what());
  }
}

void World::barrier() {
  try {
    impl_->pg->barrier()->wait();
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info_.rank) + ": barrier failed: " + e.what());
  }
}

std::string World::agree(const std::string& key, const std::string& value) {
  const std::string k = "lf/agree/" + key;
  if (info_.rank == 0) impl_->store->set(k, std::vector<uint8_t>(value.begin(), value.end()));
  const auto v = impl_->store->get(k);
  return std::string(v.begin(), v.end());
}

// Note [Host exchange]
// Call n: rank r sets lf/host/<n>/<r>, then reads every rank's key of call n
// (waiting for them to appear, up to the world's timeout).
// Once a rank has read all keys of call n, every rank has written call n, so
// every rank has finished reading call n - 1: its own key of call n - 1 can
// go. So the store holds at most two keys per rank. The values travel host
// to host through rank 0's store, so no device work is waited for: what
// ProcessGroupNCCL's all-reduce of a host number followed by .item() cannot
// avoid (that waits for every kernel queued before it).
std::vector<std::string> World::all_gather_on_hosts(const std::string& mine) {
  const int64_t n = impl_->host_calls++;
  auto key = [this](int64_t call, int64_t rank) {
    return impl_->host_prefix + std::to_string(call) + "/" + std::to_string(rank);
  };
  std::vector<std::string> out;
  try {
    impl_->store->set(key(n, info_.rank), std::vector<uint8_t>(mine.begin(), mine.end()));
    std::vector<std::string> keys;
    for (int64_t r = 0; r < info_.world_size; ++r) keys.push_back(key(n, r));
    impl_->store->wait(keys, impl_->timeout);
    for (const auto& v : impl_->store->multiGet(keys)) out.emplace_back(v.begin(), v.end());
    if (n > 0) impl_->store->deleteKey(key(n - 1, info_.rank));
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info_.rank) + ": exchanging the step's counts through the rendezvous store " +
                    info_.master_addr + ":" + std::to_string(info_.master_port) + " failed (call " + std::to_string(n) +
                    "; a peer died, hung or is at another step?): " + e.what());
  }
  return out;
}

// ---------------------------------------------------------------------------
// Gradient sync

SyncStats GradientSync::average(const std::vector<at::Tensor>& params) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<at::Tensor> grads;
  int64_t numel = 0;
  for (const auto& p : params) {
    // A parameter without a gradient on this rank contributes zeros, so that
    // every rank reduces the same layout.
    grads.push_back(p.grad().defined() ? p.grad() : at::Tensor());
    numel += p.numel();
  }
  if (!flat_.defined() || flat_.numel() != numel)
    flat_ = at::empty({numel}, params.front().options().dtype(at::kFloat));
  int64_t off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto dst = flat_.narrow(0, off, params[i].numel());
    if (grads[i].defined()) dst.copy_(grads[i].reshape({-1}));
    else dst.zero_();
    off += params[i].numel();
  }
  std::vector<at::Tensor> bucket = {flat_};
  world_.allreduce_sum(bucket);
  flat_.div_(static_cast<double>(world_.size()));
  off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto src = flat_.narrow(0, off, params[i].numel()).view(params[i].sizes());
    auto p = params[i];
    if (p.grad().defined()) p.mutable_grad().copy_(src);
    else p.mutable_grad() = src.to(p.dtype()).clone();
    off += params[i].numel();
  }
  SyncStats s;
  s.bytes = static_cast<double>(numel) * 4.0;
  s.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

std::unique_ptr<World> connect_for_training(const WorldInfo& info, c10::Device device, bool may_join) {
  const char* one = std::getenv("LOONGFORGE_TEST_ONE_RANK_WORLD");
  if (info.world_size <= 1 && !(one && std::string(one) == "1")) return nullptr;
  if (may_join && device.is_cuda()) {  // Note [Settling a step on NCCL]: the watchdog cleans up, the trainer goes on
    const char* key = "TORCH_NCCL_ASYNC_ERROR_HANDLING";
    const char* was = std::getenv(key);
    if (was && std::string(was) != "2")
      LF_LOG(logger("comm"), warn) << "rank " << info.rank << ": " << key << "=" << was
                                   << " would end this process when a peer is lost; fault.enable sets it to 2 "
                                   << "(abort the communicators, keep the process)";
    ::setenv(key, "2", 1);
  }
  return World::connect(info, /*timeout_ms=*/300000, device.is_cuda() ? Backend::Nccl : Backend::Gloo, device, may_join);
}

}  // namespace loongforge::comm
