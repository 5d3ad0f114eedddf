// Ranks, rendezvous and the plain gradient all-reduce (world.hpp).
#include "loongforge/comm/world.hpp"

#include <chrono>   // std::chrono
#include <cstdlib>  // std::getenv, std::strtoll

#include <ATen/ATen.h>  // at::cat, at::empty
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if LOONGFORGE_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // needs gloo's headers (Debian libgloo-dev)
using ProcessGroup = c10d::ProcessGroupGloo;
#else
#include <torch/csrc/distributed/c10d/Backend.hpp>
using ProcessGroup = c10d::Backend;
#endif

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
  if (env_int("WORLD_SIZE", w.world_size)) {
    w.source = "torchrun environment";
    if (!env_int("RANK", w.rank) && w.world_size > 1) throw ConfigError("WORLD_SIZE is set but RANK is not (set both, as torchrun does)");
    env_int("LOCAL_RANK", w.local_rank);
  } else if (env_int("SLURM_NTASKS", w.world_size)) {
    w.source = "Slurm environment";
    env_int("SLURM_PROCID", w.rank);
    env_int("SLURM_LOCALID", w.local_rank);
  }
  if (w.world_size < 1) throw ConfigError("world size 0 (WORLD_SIZE/SLURM_NTASKS must be >= 1)");
  if (w.rank >= w.world_size)
    throw ConfigError("rank " + std::to_string(w.rank) + " is not below the world size " + std::to_string(w.world_size) +
                      " (" + w.source + ")");
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) w.master_addr = a;
  if (!env_int("MASTER_PORT", w.master_port) && w.world_size > 1)
    throw ConfigError("MASTER_PORT is not set: every rank needs MASTER_ADDR and MASTER_PORT of rank 0's rendezvous store");
  if (w.master_port < 1 || w.master_port > 65535) throw ConfigError("MASTER_PORT=" + std::to_string(w.master_port) + " is not a TCP port");
  return w;
}

// ---------------------------------------------------------------------------
// World

struct World::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<ProcessGroup> pg;
};

World::World(WorldInfo info) : info_(std::move(info)), impl_(std::make_unique<Impl>()) {}
World::~World() = default;

std::unique_ptr<World> World::connect(const WorldInfo& info, int64_t timeout_ms) {
  std::unique_ptr<World> w(new World(info));
  const auto timeout = std::chrono::milliseconds(timeout_ms);
  const std::string where = info.master_addr + ":" + std::to_string(info.master_port);
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
#if !LOONGFORGE_WITH_GLOO
  throw CommError("this build has no Gloo (its headers, Debian/Ubuntu package libgloo-dev, were missing at build "
                  "time): multi-rank training is unavailable; install libgloo-dev and rebuild, or run one process");
#endif
  try {
#if LOONGFORGE_WITH_GLOO
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gloo", w->impl_->store);
    w->impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(info.rank),
                                                               static_cast<int>(info.world_size), opts);
#endif
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info.rank) + ": opening the Gloo process group failed: " + e.what());
  }
  LF_LOG(logger("comm"), info) << "rank " << info.rank << " of " << info.world_size << " joined (" << info.source
                               << ", rendezvous " << where << ", Gloo)";
  return w;
}

c10d::Store& World::store() { return *impl_->store; }

void World::allreduce_sum(std::vector<at::Tensor>& tensors) {
  try {
    impl_->pg->allreduce(tensors)->wait();
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info_.rank) + ": all-reduce failed (a peer died or hung?): " + e.what());
  }
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

}  // namespace loongforge::comm
