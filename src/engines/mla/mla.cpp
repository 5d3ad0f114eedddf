// MLA's record and its installation through the memory seam (mla.hpp).
#include "loongforge/engines/mla/mla.hpp"

#include <memory>  // std::shared_ptr
#include <string>  // std::string

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/memory/memory.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>  // createCustomAllocator, changeCurrentAllocator

#include "device_allocator.hpp"
#endif

namespace loongforge::mla {

namespace {

// In every binary (its keys and verb are the same everywhere; a build without
// CUDA kernels refuses mla.enable=true at install, naming why).
constexpr bool kBuilt = true;
#if LOONGFORGE_WITH_CUDA_KERNELS
// The allocator install() put in place; lives to the end of the process
// (tensors freed at exit still come back to it).
std::shared_ptr<DeviceAllocator> g_allocator;
#endif

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

void install(const config::Config& cfg, c10::Device device) {
  if (!cfg.mla.enable) {
    for (const auto& key : config::non_default_keys(cfg, "mla"))
      LF_LOG(logger("mla"), warn) << key << " has no effect: mla.enable is false (PyTorch's caching allocator "
                                  << "serves the device); set mla.enable=true or remove the key";
    return;
  }
  if (!device.is_cuda())
    throw ConfigError("mla.enable=true: MLA manages CUDA memory and this run is on the CPU (run.device=" +
                      cfg.run.device + "); set mla.enable=false or train on a GPU");
#if !LOONGFORGE_WITH_CUDA_KERNELS
  throw ConfigError(
      "mla.enable=true: this loongforge-train was built without CUDA kernels (LOONGFORGE_CUDA=OFF, "
      "or no nvcc at configure time), so it has no MLA device allocator; set mla.enable=false or "
      "rebuild with CUDA (bash scripts/setup.sh on a machine with the CUDA toolkit)");
#else
  DeviceOptions o;
  o.persistent_bytes = static_cast<uint64_t>(cfg.mla.persistent_gb * kGiB);
  o.activation_bytes = static_cast<uint64_t>(cfg.mla.global_pool_gb * kGiB);
  o.segment_bytes = static_cast<uint64_t>(cfg.mla.segment_mb) << 20;
  o.fallback_cudamalloc = cfg.mla.fallback_cudamalloc;
  o.virtual_memory = cfg.mla.virtual_memory;
  o.keys.micro_batch_size = cfg.trainer.micro_batch_size;
  o.keys.gradient_accumulation_steps = cfg.trainer.gradient_accumulation_steps;
  o.keys.precision_mode = cfg.precision.mode == "auto" ? "bf16" : cfg.precision.mode;  // auto: bf16 on GPUs
  o.keys.global_pool_gb = cfg.mla.global_pool_gb;
  o.keys.fallback_cudamalloc = cfg.mla.fallback_cudamalloc;
  auto a = std::make_shared<DeviceAllocator>(o, device.has_index() ? device.index() : 0);

  namespace plug = torch::cuda::CUDAPluggableAllocator;
  auto custom = plug::createCustomAllocator(
      [a](size_t bytes, int dev, cudaStream_t stream) { return a->allocate(bytes, dev, stream); },
      [a](void* ptr, size_t, int, cudaStream_t stream) { a->release(ptr, stream); });
  auto* p = static_cast<plug::CUDAPluggableAllocator*>(custom.get());
  p->set_record_stream_fn([a](void* ptr, cudaStream_t stream) { a->record_stream(ptr, stream); });
  p->set_begin_allocate_to_pool([a](int, c10::cuda::MempoolId_t id, std::function<bool(cudaStream_t)> filter) {
    a->begin_allocate_to_pool({id.first, id.second}, std::move(filter));
  });
  p->set_end_allocate_to_pool_fn([a](int, c10::cuda::MempoolId_t id) {
    a->end_allocate_to_pool({id.first, id.second});
  });
  p->set_release_pool([a](int, c10::cuda::MempoolId_t id) { a->release_pool({id.first, id.second}); });
  try {
    plug::changeCurrentAllocator(custom);
  } catch (const c10::Error& e) {
    throw ConfigError(std::string("mla.enable=true: libtorch's CUDA allocator was already in use before MLA could "
                                  "replace it (") +
                      short_libtorch_message(e.what()) + ")");
  }
  a->reserve_arenas();
  memory::set_reporter({[a](memory::Stats& s) {
                          s.allocator = "MLA (memory lifecycle arranger)";
                          a->totals_mb(s.device_in_use_mb, s.device_reserved_mb, s.peak_device_mb);
                          s.detail = a->stats_json();
                          s.scalars = a->scalars();
                        },
                        [a](int64_t step) { a->step_done(step); }});
  g_allocator = a;
  LF_LOG(logger("mla"), info) << "MLA serves device " << device.str() << " (persistent arena "
                              << (o.persistent_bytes ? format_bytes(o.persistent_bytes)
                                                     : std::string("grown as needed"))
                              << ", activation arena "
                              << (o.activation_bytes ? format_bytes(o.activation_bytes) : std::string("none"))
                              << (cfg.mla.virtual_memory ? std::string(", the others on virtual ranges)")
                                                         : ", ranges of " + std::to_string(cfg.mla.segment_mb) + " MiB)");
#endif
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "mla";
  e.title = "MLA";
  e.what = "memory lifecycle arranger (pooled CUDA allocator)";
  e.arrives_with = "the MLA issue";
  e.built = kBuilt;
  e.enabled = kBuilt && cfg.mla.enable;
  EngineVerb stats{"mla-stats", /*query=*/true, nullptr, nullptr};
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (auto a = g_allocator) {
    stats.run = [a](const nlohmann::json&) { return a->stats_json(); };
    e.status = [a] { return a->stats_json(); };
  }
#endif
  e.verbs.push_back(stats);
  return e;
}

}  // namespace loongforge::mla
