// loongforge/memory/memory.hpp — the memory seam: what the allocator that
// serves the device reports. MLA (include/loongforge/engines/mla/mla.hpp) will
// replace the allocator through mla::install(); today PyTorch's CUDA caching
// allocator serves the device, untouched.
//
// Contract:
//  - stats() reads the allocator in use: name, device memory in use / reserved
//    / peak (caching allocator counters), and the process's peak host RSS.
//    Cheap (no device synchronisation); callable from the trainer thread.
//  - Never allocates device memory itself.
//
// Example:
//   auto s = memory::stats(device);      // s.peak_device_mb, s.allocator
#pragma once

#include <string>  // std::string

#include <c10/core/Device.h>  // c10::Device
#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::memory {

struct Stats {
  std::string allocator;         // "PyTorch CUDA caching allocator", "host malloc"
  double device_in_use_mb = 0;   // allocated by tensors now
  double device_reserved_mb = 0; // held by the allocator
  double peak_device_mb = 0;     // peak allocated since start
  double peak_host_mb = 0;       // peak resident set size of the process
};

Stats stats(c10::Device device);
nlohmann::json to_json(const Stats& s);

}  // namespace loongforge::memory
