// loongforge/comm/world.hpp — the ranks of a job and the plain gradient path
// (GCTS off: one flat all-reduce after backward).
//
// Contract:
//  - Who is who comes from world_from_env() (world_info.hpp).
//  - World::connect() rendezvouses through libtorch's c10d TCPStore (rank 0
//    serves it) and opens a Gloo process group (CPU tensors; CUDA tensors are
//    staged through the host by Gloo). Every rank must make the same
//    collective calls in the same order (c10d's rule). A peer that does not
//    arrive within timeout_ms raises CommError naming the address and rank.
//  - store() is the rendezvous store for small control messages (the
//    control plane's cluster-wide commands); keys under "lf/".
//  - Trainer thread only.
//
// Example:
//   auto world = comm::World::connect(comm::world_from_env(), 300000);
//   comm::GradientSync sync(*world);
//   sync.average(params);      // after backward, before clipping
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr, std::shared_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

#include "loongforge/comm/world_info.hpp"

namespace c10d {
class Store;
}

namespace loongforge::comm {



class World {
 public:
  static std::unique_ptr<World> connect(const WorldInfo& info, int64_t timeout_ms);
  ~World();

  int64_t rank() const { return info_.rank; }
  int64_t size() const { return info_.world_size; }
  c10d::Store& store();

  void allreduce_sum(std::vector<at::Tensor>& tensors);  // in place
  void broadcast(std::vector<at::Tensor>& tensors, int64_t root);
  void barrier();
  // Rank 0's `value` for `key`, on every rank (through the store; small strings).
  std::string agree(const std::string& key, const std::string& value_on_rank0);

 private:
  struct Impl;
  explicit World(WorldInfo info);
  WorldInfo info_;
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

}  // namespace loongforge::comm
