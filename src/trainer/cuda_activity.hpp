// CUDA activity counts over an interval (trainer room internal), for
// `loongforge profile-step --kernels`: libtorch's Kineto profiler (CUPTI)
// records the CUDA work of the whole process while it is on.
//
// Contract:
//  - start() turns the profiler on for CUDA activities (kernels, copies,
//    fills, runtime and driver API calls); false (with the reason in
//    `why`) when this build or machine cannot (no CUDA, profiler busy).
//  - stop(steps) turns it off and returns per-step means over `steps`:
//    kernels_per_step (device kernels run, those inside replayed CUDA graphs
//    included), copies_per_step and fills_per_step (device memcpy / memset),
//    host_launches_per_step (kernel launch calls the host made: cudaLaunch*,
//    cuLaunch*), graph_launches_per_step (cudaGraphLaunch calls) and
//    host_copy_calls_per_step (cudaMemcpy*/cudaMemset* calls),
//    kernel_device_ms_per_step (the kernels' summed device time), the
//    totals, `top_kernels` (the 15 kernel names of most device time: count,
//    per step, device ms per step) and `kernel_kinds` (the kernels by kind
//    of name -- attention, gemm, triton (Inductor's), norm, reduction, copy,
//    elementwise, optimizer, other -- with kernels and device ms per step
//    and their share of the kernels' device time; most time first).
//  - Trainer thread; at most one counter at a time.
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string

#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::trainer {

class CudaActivityCounter {
 public:
  bool start(std::string& why);
  nlohmann::json stop(int64_t steps);

 private:
  bool on_ = false;
};

}  // namespace loongforge::trainer
