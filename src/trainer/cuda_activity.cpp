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
  std::map<std::string, int64_t> by_name;
  for (const auto& e : result->events()) {
    const std::string name = e.name();
    if (e.deviceType() == c10::DeviceType::CUDA) {
      if (starts_with(name, "Memcpy"))
        ++copies;
      else if (starts_with(name, "Memset"))
        ++fills;
      else
        ++kernels, ++by_name[name];
    } else if (starts_with(name, "cudaGraphLaunch") || starts_with(name, "cuGraphLaunch")) {
      ++graph_launches;
    } else if (starts_with(name, "cudaLaunch") || starts_with(name, "cuLaunch")) {
      ++launches;
    } else if (starts_with(name, "cudaMemcpy") || starts_with(name, "cudaMemset") || starts_with(name, "cuMemcpy") ||
               starts_with(name, "cuMemset")) {
      ++copy_calls;
    }
  }
  std::vector<std::pair<int64_t, std::string>> top;
  for (const auto& [name, n] : by_name) top.emplace_back(n, name);
  std::sort(top.rbegin(), top.rend());
  nlohmann::json top_json = nlohmann::json::array();
  for (size_t i = 0; i < std::min<size_t>(15, top.size()); ++i)
    top_json.push_back({{"name", top[i].second.substr(0, 160)}, {"count", top[i].first}});
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  return {{"steps", steps},
          {"kernels_per_step", static_cast<double>(kernels) / n},
          {"copies_per_step", static_cast<double>(copies) / n},
          {"fills_per_step", static_cast<double>(fills) / n},
          {"host_launches_per_step", static_cast<double>(launches) / n},
          {"graph_launches_per_step", static_cast<double>(graph_launches) / n},
          {"host_copy_calls_per_step", static_cast<double>(copy_calls) / n},
          {"totals",
           {{"kernels", kernels}, {"copies", copies}, {"fills", fills}, {"host_launches", launches},
            {"graph_launches", graph_launches}, {"host_copy_calls", copy_calls}}},
          {"top_kernels", top_json}};
}

}  // namespace loongforge::trainer
