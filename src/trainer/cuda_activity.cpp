// CudaActivityCounter (cuda_activity.hpp).
#include "cuda_activity.hpp"

#include <algorithm>  // std::sort, std::min
#include <map>        // std::map
#include <set>        // std::set
#include <utility>    // std::pair
#include <vector>     // std::vector

#include <torch/csrc/autograd/profiler_kineto.h>  // enableProfiler, disableProfiler, KinetoEvent

#include "loongforge/common/log.hpp"

namespace loongforge::trainer {

namespace {
namespace prof = torch::profiler::impl;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool has(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// What a device kernel is, by its name (cuda_activity.hpp's kinds; first match wins).
const char* kind_of(const std::string& name) {
  if (has(name, "flash") || has(name, "fmha") || has(name, "attention") || has(name, "sdpa")) return "attention";
  if (has(name, "nvjet") || has(name, "gemm") || has(name, "cutlass") || has(name, "xmma") || has(name, "cublas"))
    return "gemm";
  if (starts_with(name, "triton_")) return "triton";
  if (has(name, "layer_norm") || has(name, "rms_norm") || has(name, "LayerNorm")) return "norm";
  if (has(name, "reduce") || has(name, "Reduce")) return "reduction";
  if (has(name, "copy") || has(name, "Copy")) return "copy";
  if (has(name, "elementwise") || has(name, "Elementwise") || has(name, "vectorized")) return "elementwise";
  if (has(name, "multi_tensor") || has(name, "fused_adam") || has(name, "FusedAdam")) return "optimizer";
  return "other";
}

struct Tally {
  int64_t count = 0;
  uint64_t ns = 0;
};
}  // namespace

bool CudaActivityCounter::start(std::string& why) {
  if (on_) {
    why = "already counting";
    return false;
  }
  try {
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    const std::set<prof::ActivityType> activities{prof::ActivityType::CUDA};
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  } catch (const std::exception& e) {
    why = std::string(e.what()).substr(0, std::string(e.what()).find('\n'));
    return false;
  }
  on_ = true;
  return true;
}

nlohmann::json CudaActivityCounter::stop(int64_t steps) {
  if (!on_) return nullptr;
  on_ = false;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result;
  try {
    result = torch::autograd::profiler::disableProfiler();
  } catch (const std::exception& e) {
    return {{"error", std::string(e.what()).substr(0, std::string(e.what()).find('\n'))}};
  }
  int64_t kernels = 0, copies = 0, fills = 0, launches = 0, graph_launches = 0, copy_calls = 0;
  std::map<std::string, Tally> by_name, by_kind;
  uint64_t kernel_ns = 0;
  for (const auto& e : result->events()) {
    const std::string name = e.name();
    if (e.deviceType() == c10::DeviceType::CUDA) {
      if (starts_with(name, "Memcpy"))
        ++copies;
      else if (starts_with(name, "Memset"))
        ++fills;
      else {
        ++kernels, kernel_ns += e.durationNs();
        for (Tally* t : {&by_name[name], &by_kind[kind_of(name)]}) t->count += 1, t->ns += e.durationNs();
      }
    } else if (starts_with(name, "cudaGraphLaunch") || starts_with(name, "cuGraphLaunch")) {
      ++graph_launches;
    } else if (starts_with(name, "cudaLaunch") || starts_with(name, "cuLaunch")) {
      ++launches;
    } else if (starts_with(name, "cudaMemcpy") || starts_with(name, "cudaMemset") || starts_with(name, "cuMemcpy") ||
               starts_with(name, "cuMemset")) {
      ++copy_calls;
    }
  }
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  const auto ms = [n](uint64_t ns) { return static_cast<double>(ns) / 1e6 / n; };  // per step
  // The 15 kernels of most device time, and every kind, most time first.
  const auto ranked = [](const std::map<std::string, Tally>& m) {
    std::vector<std::pair<uint64_t, std::string>> v;
    for (const auto& [name, t] : m) v.emplace_back(t.ns, name);
    std::sort(v.rbegin(), v.rend());
    return v;
  };
  nlohmann::json top_json = nlohmann::json::array(), kinds_json = nlohmann::json::array();
  const auto top = ranked(by_name);
  for (size_t i = 0; i < std::min<size_t>(15, top.size()); ++i) {
    const Tally& t = by_name.at(top[i].second);
    top_json.push_back({{"name", top[i].second.substr(0, 160)},
                        {"count", t.count},
                        {"per_step", static_cast<double>(t.count) / n},
                        {"device_ms_per_step", ms(t.ns)}});
  }
  for (const auto& [ns, kind] : ranked(by_kind))
    kinds_json.push_back({{"kind", kind},
                          {"kernels_per_step", static_cast<double>(by_kind.at(kind).count) / n},
                          {"device_ms_per_step", ms(ns)},
                          {"share", kernel_ns ? static_cast<double>(ns) / static_cast<double>(kernel_ns) : 0.0}});
  return {{"steps", steps},
          {"kernels_per_step", static_cast<double>(kernels) / n},
          {"copies_per_step", static_cast<double>(copies) / n},
          {"fills_per_step", static_cast<double>(fills) / n},
          {"host_launches_per_step", static_cast<double>(launches) / n},
          {"graph_launches_per_step", static_cast<double>(graph_launches) / n},
          {"host_copy_calls_per_step", static_cast<double>(copy_calls) / n},
          {"kernel_device_ms_per_step", ms(kernel_ns)},
          {"totals",
           {{"kernels", kernels},
            {"copies", copies},
            {"fills", fills},
            {"host_launches", launches},
            {"graph_launches", graph_launches},
            {"host_copy_calls", copy_calls}}},
          {"top_kernels", top_json},
          {"kernel_kinds", kinds_json}};
}

}  // namespace loongforge::trainer
