// Cross-key rules: what no single key's range can say. Each message names
// every key involved, where it was set, and a value that would work.
#include <sstream>  // std::ostringstream

#include "internal.hpp"

namespace loongforge::config::detail {

namespace {

std::string origin_of(const Config& cfg, const std::string& path) {
  auto it = cfg.origin.find(path);
  return it == cfg.origin.end() ? "default" : it->second;
}

std::string divisors_of(int64_t n) {
  std::string s;
  for (int64_t d = 1; d <= n && d <= 64; ++d)
    if (n % d == 0) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

}  // namespace

void validate(const Config& cfg, const ValidationContext& ctx, std::vector<std::string>* errors) {
  auto add = [&](const std::string& path, const std::string& msg) {
    errors->push_back(origin_of(cfg, path) + ": " + msg);
  };
  const auto& t = cfg.trainer;

  if (ctx.require_paths && cfg.model.path.empty())
    add("model.path", "model.path is required: set it to a file written by scripts/model/export.py");
  if (ctx.require_paths && cfg.data.path.empty())
    add("data.path", "data.path is required: set it to a directory written by scripts/convert_lerobot.py");

  if (cfg.dmf.enable && t.gradient_accumulation_steps % cfg.dmf.fusion_batch_size != 0) {
    add("dmf.fusion_batch_size",
        "dmf.fusion_batch_size (" + std::to_string(cfg.dmf.fusion_batch_size) +
            ") must divide trainer.gradient_accumulation_steps (" + std::to_string(t.gradient_accumulation_steps) +
            ", set at " + origin_of(cfg, "trainer.gradient_accumulation_steps") + "): use one of " +
            divisors_of(t.gradient_accumulation_steps) + ", or change gradient_accumulation_steps");
  }

  const int64_t derived = global_batch_size(cfg, ctx.world_size);
  if (t.global_batch_size != 0 && t.global_batch_size != derived) {
    add("trainer.global_batch_size",
        "trainer.global_batch_size (" + std::to_string(t.global_batch_size) +
            ") must equal micro_batch_size (" + std::to_string(t.micro_batch_size) +
            ") x gradient_accumulation_steps (" + std::to_string(t.gradient_accumulation_steps) +
            ") x world size (" + std::to_string(ctx.world_size) + ") = " + std::to_string(derived) +
            ": set it to " + std::to_string(derived) + " or 0 (derived)");
  }

  if (cfg.schedule.warmup_steps >= t.max_steps) {
    add("schedule.warmup_steps", "schedule.warmup_steps (" + std::to_string(cfg.schedule.warmup_steps) +
                                     ") must be below trainer.max_steps (" + std::to_string(t.max_steps) + ")");
  }

  if (cfg.mla.enable && ctx.device_memory_gb && cfg.mla.global_pool_gb >= *ctx.device_memory_gb) {
    std::ostringstream mem;
    mem.precision(4);
    mem << *ctx.device_memory_gb;
    add("mla.global_pool_gb", "mla.global_pool_gb (" + format_value(cfg.mla.global_pool_gb) +
                                  ") must be below the device memory (" + mem.str() +
                                  " GB) leaving room for weights and optimizer state: lower it, or set 0 (auto)");
  }

}

}  // namespace loongforge::config::detail
