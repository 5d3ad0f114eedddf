// loongforge/memory/memory.hpp — the memory room: which allocator serves the
// device, and what it reports. MLA (pooled lifetimes, docs/architecture.md s4) will live
// here; today the room is its plain implementation: PyTorch's CUDA caching
// allocator, untouched.
//
// Contract:
//  - install() runs once per process, before the first CUDA allocation (the
//    trainer calls it first thing in Trainer::open). With MLA off it changes
//    nothing. It never allocates device memory itself.
//  - stats() reads the allocator in use: name, device memory in use / reserved
//    / peak (caching allocator counters), and the process's peak host RSS.
//    Cheap (no device synchronisation); callable from the trainer thread.
//  - engine() is MLA's record (common/engine.hpp): its status and the
//    `mla-stats` verb.
//
// Example:
//   memory::install(cfg, device);        // before the model loads
//   auto s = memory::stats(device);      // s.peak_device_mb, s.allocator
#pragma once

#include <string>  // std::string

#include <c10/core/Device.h>  // c10::Device
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::memory {

constexpr bool kMlaBuilt = false;  // the MLA engine is not in this build yet

struct Stats {
  std::string allocator;         // "PyTorch CUDA caching allocator", "host malloc"
  double device_in_use_mb = 0;   // allocated by tensors now
  double device_reserved_mb = 0; // held by the allocator
  double peak_device_mb = 0;     // peak allocated since start
  double peak_host_mb = 0;       // peak resident set size of the process
};

void install(const config::Config& cfg, c10::Device device);
Stats stats(c10::Device device);
nlohmann::json to_json(const Stats& s);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::memory
