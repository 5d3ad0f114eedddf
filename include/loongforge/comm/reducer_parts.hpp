// loongforge/comm/reducer_parts.hpp — for implementations of the reducer
// seam only (the plain reducer, src/comm/reducer.cpp, and GCTS's,
// src/engines/gcts/reducer.cpp): sums over ranks and monitor-comm's
// bandwidth fields. The trainer never includes it.
#pragma once

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // int64_t
#include <string>   // std::string

#include <ATen/core/Tensor.h>  // at::Tensor
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/world.hpp"

namespace loongforge::comm::detail {

inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// nccl-tests' bus bandwidth factors (doc/PERFORMANCE.md there): what each
// rank's link carries per byte of the collective's data. all-reduce:
// 2 (n - 1) / n; reduce-scatter and all-gather: (n - 1) / n, where bytes is
// the whole buffer (n x the piece each rank receives or sends).
double bus_factor(const std::string& collective, double n);

struct GroupStats {
  std::string collective;
  double bytes = 0, ms = 0;
  int64_t calls = 0;
};

// {name, collective, bytes, time_ms, calls, algbw_gbps = bytes / time,
// busbw_gbps = algbw x bus_factor}; GB = 1e9 bytes.
nlohmann::json group_json(const std::string& name, const std::string& collective, double bytes, double ms,
                          int64_t calls, double n);

StepCounts agree_counts(World& world, const StepCounts& local);
at::Tensor sum_device_scalar(World& world, const at::Tensor& scalar);

}  // namespace loongforge::comm::detail
