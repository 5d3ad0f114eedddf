// loongforge-train --compile-only (run.hpp): the compiled step's package for
// this config prepared in the package cache, without training.
#include <cstdio>  // std::printf

#include <torch/cuda.h>  // torch::cuda::is_available

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/data/batch.hpp"    // data::text_length_histogram
#include "loongforge/data/dataset.hpp"  // data::Dataset
#include "loongforge/engines/dmf/dmf.hpp"
#include "loongforge/fusion/package_cache.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/optim/optimizer.hpp"
#include "loongforge/trainer/run.hpp"

namespace loongforge::trainer {

int compile_only(const config::Config& cfg, const comm::WorldInfo& world) {
  if (cfg.trainer.micro_batch_size_auto)
    throw ConfigError(cfg.origin.at("trainer.micro_batch_size") +
                      ": trainer.micro_batch_size is auto, which the trainer resolves when it starts, from probes "
                      "of the GPU (a training run compiles the package for its choice then): --compile-only "
                      "prepares one micro-batch's package, so name it: --set trainer.micro_batch_size=N");
  fusion::share_cuda_jit_cache(cfg);  // as a training run does (the compile's subprocess inherits it)
  // The device and precision as the trainer resolves them (Trainer::Impl::resolve_device).
  const bool cuda = torch::cuda::is_available();
  if (cfg.run.device == "cuda" && !cuda)
    throw ConfigError("run.device is cuda but no GPU is visible to this process: --compile-only prepares the "
                      "package on the machine (and GPU kind) that trains");
  const bool on_gpu = cfg.run.device == "cuda" || (cfg.run.device == "auto" && cuda);
  const c10::Device device = on_gpu ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world.local_rank))
                                    : c10::Device(c10::kCPU);
  const bool bf16 = on_gpu && (cfg.precision.mode == "bf16" || cfg.precision.mode == "auto");
  model::Model net = model::Model::load(cfg.model.path, device);
  // With DMF a package for each of its widths (dmf.package_buckets at most; Note [DMF and the package]).
  dmf::resolve(cfg, net.info());
  std::vector<int64_t> widths = {0};  // 0: data.max_text_len
  if (cfg.dmf.enable)
    widths = dmf::plan(cfg,
                       data::text_length_histogram(data::open_data(cfg.data.path, cfg.data.embodiment_id),
                                                   cfg.data.max_text_len),
                       /*compiled_step=*/true)
                 .buckets.widths;
  // the package a training run of this config would take: with the bf16 working copies it keeps
  const std::vector<std::string> copies =
      optim::compiled_working_copies(cfg, net, device, bf16, world.world_size > 1);
  for (size_t i = 0; i < widths.size(); ++i) {
    const fusion::PreparedPackage p =
        fusion::prepare_compiled_step(cfg, net, device, bf16, nullptr, copies, widths[i]);
    const std::string which =
        widths.size() > 1 ? " (text width " + std::to_string(widths[i]) + ", package " + std::to_string(i + 1) +
                                " of " + std::to_string(widths.size()) + ")"
                          : "";
    if (p.compiled)
      std::printf("compiled %s%s in %.0f s (log: %s)\n", p.path.c_str(), which.c_str(), p.compile_s, p.log.c_str());
    else
      std::printf("already prepared: %s%s\n", p.path.c_str(), which.c_str());
    std::fflush(stdout);
  }
  const fusion::CompiledStepSetting setting = fusion::compiled_step_setting(cfg, device);
  if (setting != fusion::CompiledStepSetting::cache)
    LF_LOG(logger("trainer"), warn) << "trainer.compiled_step is "
                                    << (cfg.trainer.compiled_step.empty() ? "\"\"" : cfg.trainer.compiled_step)
                                    << (device.is_cuda() ? "" : " on the CPU")
                                    << ": a training run with this config does not use the cache; set "
                                    << (device.is_cuda() ? "trainer.compiled_step=auto" : "trainer.compiled_step=on")
                                    << " for it to";
  return 0;
}

}  // namespace loongforge::trainer
