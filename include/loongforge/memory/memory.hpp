// loongforge/memory/memory.hpp — the memory seam: what the allocator that
// serves the device reports, and the lifetime the trainer says its
// allocations have. PyTorch's CUDA caching allocator serves the device unless
// MLA (include/loongforge/engines/mla/mla.hpp, mla.enable) replaced it through
// mla::install(), which then reports through set_reporter().
//
// Contract:
//  - stats() reads the allocator in use: name, device memory in use / reserved
//    / peak, and the process's peak host RSS; with a reporter set, the
//    reporter's numbers and its `detail` (MLA's statistics) and `scalars`
//    (its metrics.jsonl fields). Cheap (no device synchronisation); callable
//    from the trainer thread and the control thread.
//  - LifetimeScope marks what the allocations made on this thread inside it
//    live for (Lifetime::kPersistent: the whole run). Outside any scope the
//    lifetime is kOther. The caching allocator ignores it; MLA places
//    allocations by it.
//  - step_done() tells the reporter an optimizer step ended (MLA: per-step
//    allocation time, its fences, cudaMalloc calls after step 1).
//  - Never allocates device memory itself.
//
// Example:
//   { memory::LifetimeScope whole_run(memory::Lifetime::kPersistent); load_model(); }
//   auto s = memory::stats(device);      // s.peak_device_mb, s.allocator
#pragma once

#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include <c10/core/Device.h>  // c10::Device
#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::memory {

struct Stats {
  std::string allocator;         // "PyTorch CUDA caching allocator", "host malloc"
  double device_in_use_mb = 0;   // allocated by tensors now
  double device_reserved_mb = 0; // held by the allocator
  double peak_device_mb = 0;     // peak allocated since start
  double peak_host_mb = 0;       // peak resident set size of the process
  nlohmann::json detail;         // the reporter's own statistics (MLA: `loongforge mla-stats`); null without one
  std::vector<std::pair<std::string, double>> scalars;  // the reporter's metrics.jsonl fields ("mla_fragmentation")
};

Stats stats(c10::Device device);
nlohmann::json to_json(const Stats& s);

// What allocations live for (MLA's categories).
enum class Lifetime { kPersistent, kActivation, kOther };

// Sets this thread's lifetime while in scope (scopes nest).
class LifetimeScope {
 public:
  explicit LifetimeScope(Lifetime lifetime);
  ~LifetimeScope();
  LifetimeScope(const LifetimeScope&) = delete;
  LifetimeScope& operator=(const LifetimeScope&) = delete;

 private:
  Lifetime previous_;
};
Lifetime current_lifetime();  // this thread's: kOther outside any scope

// An allocator that replaced PyTorch's reports through these (set once, at
// install, before any other thread reads stats()).
struct Reporter {
  std::function<void(Stats&)> fill;          // fills allocator, device_* and detail, scalars
  std::function<void(int64_t step)> step_done;
};
void set_reporter(Reporter reporter);
// The trainer, after optimizer step `step` (1-based) ends.
void step_done(int64_t step);

}  // namespace loongforge::memory
