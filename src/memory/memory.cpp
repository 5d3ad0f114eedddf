// The memory seam's plain implementation: PyTorch's caching allocator's
// counters (memory.hpp).
#include "loongforge/memory/memory.hpp"

#include <sys/resource.h>  // getrusage

#include <utility>  // std::move

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>  // getDeviceStats
#endif

namespace loongforge::memory {

namespace {
Reporter g_reporter;                               // set once by mla::install, before other threads read it
thread_local Lifetime t_lifetime = Lifetime::kOther;
}  // namespace

LifetimeScope::LifetimeScope(Lifetime lifetime) : previous_(t_lifetime) { t_lifetime = lifetime; }
LifetimeScope::~LifetimeScope() { t_lifetime = previous_; }
Lifetime current_lifetime() { return t_lifetime; }

void set_reporter(Reporter reporter) { g_reporter = std::move(reporter); }

void step_done(int64_t step) {
  if (g_reporter.step_done) g_reporter.step_done(step);
}

Stats stats(c10::Device device) {
  Stats s;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  s.peak_host_mb = static_cast<double>(ru.ru_maxrss) / 1024.0;
  s.allocator = "host malloc";
  if (g_reporter.fill && device.is_cuda()) {
    g_reporter.fill(s);
    return s;
  }
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    using c10::CachingAllocator::StatType;
    const auto d = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto all = static_cast<size_t>(StatType::AGGREGATE);
    constexpr double kMb = 1024.0 * 1024.0;
    s.allocator = "PyTorch CUDA caching allocator";
    s.device_in_use_mb = static_cast<double>(d.allocated_bytes[all].current) / kMb;
    s.device_reserved_mb = static_cast<double>(d.reserved_bytes[all].current) / kMb;
    s.peak_device_mb = static_cast<double>(d.allocated_bytes[all].peak) / kMb;
  }
#endif
  (void)device;
  return s;
}

nlohmann::json to_json(const Stats& s) {
  nlohmann::json j = {{"allocator", s.allocator},
                      {"device_in_use_mb", s.device_in_use_mb},
                      {"device_reserved_mb", s.device_reserved_mb},
                      {"peak_device_mb", s.peak_device_mb},
                      {"peak_host_mb", s.peak_host_mb}};
  if (!s.detail.is_null()) j["detail"] = s.detail;
  return j;
}

}  // namespace loongforge::memory
