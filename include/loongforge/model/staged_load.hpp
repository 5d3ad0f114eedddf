// A model file's tensor records staged through one reused pinned host buffer
// while it loads onto a GPU (Note [Staged model load] in staged_load.cpp).
//
// Contract
// - While a StagedLoad lives, CPU allocations of at least 1 MiB and at most
//   its slab's size are served from one pinned slab when the slab is free (a
//   record read, copied to the device and dropped before the next is read:
//   what torch::jit::load onto a device does), all others by the CPU
//   allocator that was installed before; every allocation is released by its
//   own deleter, so memory outlives the StagedLoad safely.
// - The slab holds the file's largest record (at most 2 GiB); it is released
//   (and the pinned memory returned: the host allocator's cache emptied) when
//   the StagedLoad ends and no allocation holds it.
// - Construction never throws for want of pinned memory or a GPU: it logs
//   and stages nothing (the load then goes as torch::jit::load alone).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace loongforge::model {

class StagedLoad {
 public:
  explicit StagedLoad(const std::string& path);
  ~StagedLoad();
  StagedLoad(const StagedLoad&) = delete;
  StagedLoad& operator=(const StagedLoad&) = delete;

  struct Counts {
    int64_t staged = 0, passed = 0;  // allocations served from the slab; by the previous allocator
    int64_t slab_bytes = 0;
    double slab_s = 0;  // the slab's allocation (pinning)
  };
  Counts counts() const;

  struct State;  // the slab and its counts (staged_load.cpp)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace loongforge::model
