// MLA's device allocator (room-private; mla.hpp is the room's contract): the
// pool logic of pool.hpp over cudaMalloc'd ranges, served to libtorch through
// its pluggable allocator (torch::cuda::CUDAPluggableAllocator). Built only
// with CUDA (LOONGFORGE_WITH_CUDA_KERNELS). Note [MLA's device pools] in
// device_allocator.cpp says where each allocation goes.
#pragma once

#include <cuda_runtime_api.h>  // cudaStream_t, cudaEvent_t

#include <array>          // std::array
#include <cstdint>        // uint64_t
#include <string>         // std::string
#include <functional>     // std::function
#include <map>            // std::map
#include <memory>         // std::unique_ptr
#include <mutex>          // std::mutex
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair
#include <vector>         // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/engines/mla/oom.hpp"
#include "loongforge/engines/mla/pool.hpp"
#include "virtual_range.hpp"

namespace loongforge::mla {

struct DeviceOptions {
  uint64_t persistent_bytes = 0;       // mla.persistent_gb: the persistent arena, reserved at install (0: grown)
  uint64_t activation_bytes = 0;       // mla.global_pool_gb: the activation arena, reserved at install (0: none)
  uint64_t segment_bytes = 64u << 20;  // mla.segment_mb: the unit a pool without an arena grows by
  bool virtual_memory = false;         // mla.virtual_memory: Note [Virtual pools] in device_allocator.cpp
  bool fallback_cudamalloc = false;    // mla.fallback_cudamalloc
  OomReport keys;                      // the run's keys, for the out-of-memory message
};

using MempoolKey = std::pair<uint64_t, uint64_t>;  // c10::cuda::MempoolId_t

class DeviceAllocator {
 public:
  DeviceAllocator(DeviceOptions options, int device);
  ~DeviceAllocator();  // never frees its ranges (tensors may outlive it at exit)

  // cudaMalloc's the arenas the options ask for (cudaMalloc calls counted).
  void reserve_arenas();

  // The pluggable allocator's callbacks.
  void* allocate(size_t bytes, int device, cudaStream_t stream);
  void release(void* ptr, cudaStream_t stream);
  void record_stream(void* ptr, cudaStream_t stream);
  void begin_allocate_to_pool(MempoolKey pool, std::function<bool(cudaStream_t)> filter);
  void end_allocate_to_pool(MempoolKey pool);
  void release_pool(MempoolKey pool);

  // After optimizer step `step`: the step's allocation time, fences, events polled.
  void step_done(int64_t step);

  // `loongforge mla-stats` (and status's "mla"): every pool, by category, the
  // cudaMalloc calls, allocation time per step. Thread-safe.
  nlohmann::json stats_json();
  // memory::Stats' numbers (MB): in use, reserved, peak in use.
  void totals_mb(double& in_use, double& reserved, double& peak);
  // metrics.jsonl's fields.
  std::vector<std::pair<std::string, double>> scalars();

 private:
  struct Where {
    enum Kind : uint8_t { kCategory, kGraph, kFallback } kind = kCategory;
    uint8_t category = 0;  // kCategory: the Category index
    MempoolKey graph{};    // kGraph
    uint16_t label = 0;    // kCategory, persistent: index in labels_
    uint64_t bytes = 0;    // kFallback, and persistent blocks: the block's size
  };
  struct GraphPool {
    std::unique_ptr<Pool> pool;
    std::vector<std::pair<uint64_t, uint64_t>> chunks;  // taken from chunk_source(): (addr, bytes)
    int captures = 0;       // graphs captured into it and not yet released (graphs may share an id)
    bool released = false;  // the last of them was released: chunks go back once its blocks are free
  };
  struct Event {
    cudaEvent_t event;
    Pool* pool;
  };

  Pool& pool(Category c) { return *pools_[static_cast<size_t>(c)]; }
  Category chunk_source() const;
  void* allocate_locked(size_t bytes, cudaStream_t stream);
  uint64_t allocate_in(Category c, size_t bytes, cudaStream_t stream);  // 0: none
  uint64_t allocate_in_graph(GraphPool& g, size_t bytes, cudaStream_t stream);
  bool grow(Category c, uint64_t at_least);
  // Note [Virtual pools]: backs the block [addr, addr + bytes) of `c`'s pool when it sits on a
  // virtual range (true when it does not); false when the device has no memory left.
  bool back(Category c, uint64_t addr, uint64_t bytes);
  // Gives back the memory under every free block of the virtual pools (the device idle first); whether any.
  bool reclaim();
  // Runs of blocks that are not allocated in `c`'s pool, in address order: (addr, bytes).
  std::vector<std::pair<uint64_t, uint64_t>> free_runs(Category c) const;
  // pool(c).stats(), with reserved/free/largest free counted in backed memory for a virtual pool.
  PoolStats physical_stats(Category c);
  uint64_t reserved_bytes();  // every pool's physical_stats reserved bytes, and the fallback's
  void* cuda_malloc(uint64_t bytes);  // counted; nullptr when the device is full
  [[noreturn]] void out_of_memory(Category c, bool fixed, const std::string& pool_name, const PoolStats& s,
                                  size_t bytes);
  void release_locked(void* ptr);
  void return_graph_chunks(MempoolKey key);
  EventId record_event(Pool* pool, StreamId stream);
  void poll_events();
  void synchronize_events();
  bool capturing() const { return !captures_.empty(); }
  // Note [Diagnosing the virtual pools]: throws when an allocated block of a virtual pool has a page
  // that is not backed.
  void check_backed(const char* when) const;
  std::array<uint64_t, kCategoryCount> in_use_by_category();
  void note_peak();

  DeviceOptions options_;
  int device_;
  std::mutex mutex_;
  std::array<std::unique_ptr<Pool>, kCategoryCount> pools_;
  std::array<bool, kCategoryCount> fixed_{};  // an arena of a set size: it does not grow
  std::array<std::unique_ptr<VirtualRange>, kCategoryCount> virtual_{};  // Note [Virtual pools]
  int virtual_supported_ = -1;                                           // -1: not asked yet
  bool poison_ = false, keep_pages_ = false, sync_ = false;  // Note [Diagnosing the virtual pools]: LOONGFORGE_MLA_DEBUG
  bool debug_ = false;  // any LOONGFORGE_MLA_DEBUG item: each capture's start is logged with the device's free memory
  uint64_t reclaims_ = 0, reclaimed_bytes_ = 0;
  std::unordered_map<uintptr_t, Where> where_;
  std::map<MempoolKey, GraphPool> graphs_;
  std::vector<std::pair<MempoolKey, std::function<bool(cudaStream_t)>>> captures_;
  std::vector<void*> deferred_frees_;  // frees outside the graph pools during a capture
  std::unordered_map<EventId, Event> events_;
  std::vector<cudaEvent_t> spare_events_;
  EventId next_event_ = 1;
  uint64_t graph_chunk_bytes_ = 0;
  // Persistent bytes by the label of the memory::LifetimeScope they were
  // allocated in ("model", "optimizer", ...; "" unlabelled).
  std::vector<std::string> labels_;
  std::vector<uint64_t> label_bytes_;
  uint16_t label_index(const char* label);
  std::vector<std::pair<std::string, uint64_t>> persistent_by_label() const;
  uint64_t peak_in_use_ = 0;
  // Counters.
  uint64_t cuda_malloc_calls_ = 0, cuda_malloc_calls_after_step1_ = 0, cuda_malloc_bytes_ = 0;
  uint64_t fallback_allocations_ = 0, fallback_bytes_ = 0;
  int64_t steps_done_ = 0;
  double step_alloc_ms_ = 0;               // host time in allocate/release since the last step ended
  std::vector<double> alloc_ms_per_step_;  // one per step
};

}  // namespace loongforge::mla
