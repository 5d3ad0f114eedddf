// Building the update seam from the config (optimizer.hpp): which AdamW, which
// weights become bf16 working copies, the schedule, and what the run line says.
#include <cmath>   // std::ceil
#include <cstdio>  // std::snprintf
#include <map>     // std::map

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/optim/optimizer.hpp"

namespace loongforge::optim {

bool use_fused(const config::Config& cfg, c10::Device device) {
  return cfg.optimizer.implementation == "fused" || (cfg.optimizer.implementation == "auto" && device.is_cuda());
}

// Why a compiled package cannot take bf16 working copies in this run ("" when it can).
std::string compiled_copies_refusal(const config::Config& cfg, const WeightsContext& c) {
  if (cfg.precision.bf16_weights == "off") return "precision.bf16_weights is off";
  if (!c.device.is_cuda() || !c.bf16) return "this run does not compute in bf16 autocast on a GPU";
  if (!c.fused) return "optimizer.implementation is plain (the working copies live in the fused AdamW)";
  if (c.sharded || c.multi_rank || c.accumulation > 1)
    return "the compiled step keeps working copies only on one rank, without gradient accumulation or a sharded "
           "optimizer (their fp32 gradient sums are not built for it yet)";
  if (!LOONGFORGE_WITH_CUDA_KERNELS) return "this build has no LoongForge CUDA kernels";
  return "";
}

// A compiled package with bf16 working copies runs only with them (its inputs are bf16): the one
// case where a run that cannot keep copies is refused whatever precision.bf16_weights says.
bool package_needs_copies(const config::Config& cfg, const WeightsContext& c) {
  if (!c.compiled || c.package_bf16.empty()) return false;
  const std::string why = compiled_copies_refusal(cfg, c);
  if (!why.empty())
    throw ConfigError("trainer.compiled_step: the package takes " + std::to_string(c.package_bf16.size()) +
                      " weights as bf16 working copies (scripts/compile_step.py --bf16-weights), but " + why +
                      ": compile the package without --bf16-weights for this run");
  return true;
}

// Why this run keeps no working copies ("" when it keeps them; precision.bf16_weights=off aside).
std::string copies_refusal(const config::Config& cfg, const WeightsContext& c) {
  const std::string& mode = cfg.precision.bf16_weights;
  std::string why;
  if (!c.device.is_cuda() || !c.bf16) why = "this run does not compute in bf16 autocast on a GPU";
  else if (!c.fused && !c.sharded)
    why = "optimizer.implementation is plain (the working copies live in the fused and the sharded AdamW)";
  else if (!c.sharded && !LOONGFORGE_WITH_CUDA_KERNELS) why = "this build has no LoongForge CUDA kernels";
  else if (c.compiled)
    why = "the package of trainer.compiled_step takes fp32 weights (compile it with scripts/compile_step.py "
          "--bf16-weights FILE, FILE the bf16_weights.json a run with working copies writes in its run folder)";
  else if (mode == "auto" && (c.multi_rank || c.sharded))
    why = std::string(c.multi_rank ? "this run reduces gradients over ranks" : "gcts.shard_optimizer is on") +
          ", where auto keeps no copies yet (set precision.bf16_weights=on to keep them, with fp32 gradients)";
  return why;
}

bool use_bf16_weights(const config::Config& cfg, const WeightsContext& c) {
  if (package_needs_copies(cfg, c)) return true;
  const std::string& mode = cfg.precision.bf16_weights;
  if (mode == "off") return false;
  const std::string why = copies_refusal(cfg, c);
  if (why.empty()) return true;
  if (mode == "on") {
    const auto at = cfg.origin.find("precision.bf16_weights");
    const std::string where = at == cfg.origin.end() ? "" : " (" + at->second + ")";
    throw ConfigError("precision.bf16_weights=on" + where + ", but " + why + ": set precision.bf16_weights=auto or off");
  }
  if (c.device.is_cuda() && c.bf16)
    LF_LOG(logger("trainer"), info) << "weights stay fp32, cast by autocast in every forward "
                                    << "(precision.bf16_weights=auto): " << why;
  return false;
}

std::vector<OptimizedParam> trainable_params(model::Model& net, const model::Mdg& mdg, bool bf16_weights,
                                             const std::vector<std::string>& only) {
  const auto all = net.parameters();
  const std::vector<model::MdgParam>& reads = mdg.params;  // Note [MDG]: which parameters only linear layers read
  // A tensor held under two names (tied weights) is read through both: it stays fp32 unless both names are read
  // only by linear layers.
  std::map<const void*, bool> linear_only;
  for (size_t k = 0; bf16_weights && k < reads.size(); ++k) {
    const auto [it, fresh] = linear_only.emplace(all[k].tensor.unsafeGetTensorImpl(), reads[k].linear_only);
    if (!fresh) it->second = it->second && reads[k].linear_only;
  }
  std::map<std::string, bool> named;  // `only`: each name, and whether a trainable parameter has it
  for (const auto& n : only) named.emplace(n, false);
  std::vector<OptimizedParam> trainable;
  for (const auto& p : all) {
    if (!p.info->trainable) continue;
    const bool linear = bf16_weights && linear_only.at(p.tensor.unsafeGetTensorImpl());
    bool copy = linear;
    if (bf16_weights && !only.empty()) {
      const auto it = named.find(p.info->name);
      copy = it != named.end();
      if (copy) it->second = true;
      if (copy && !linear)
        throw ConfigError("trainer.compiled_step: the package takes '" + p.info->name +
                          "' as a bf16 working copy, but layers other than linear ones read it in " +
                          net.info().path + ": compile the package with the bf16_weights.json of a run of this model");
    }
    trainable.push_back({p.info->name, p.tensor, p.info->decay, copy});
  }
  for (const auto& [name, found] : named)
    if (!found)
      throw ConfigError("trainer.compiled_step: the package takes '" + name + "' as a bf16 working copy, but " +
                        net.info().path + " has no trainable parameter of that name");
  return trainable;
}

std::vector<std::string> compiled_working_copies(const config::Config& cfg, model::Model& net, c10::Device device,
                                                 bool bf16, bool multi_rank) {
  const WeightsContext c{device,     bf16,
                         use_fused(cfg, device), cfg.gcts.enable && cfg.gcts.shard_optimizer,
                         /*compiled=*/true,      multi_rank,
                         cfg.trainer.gradient_accumulation_steps, {}};
  if (!compiled_copies_refusal(cfg, c).empty()) return {};  // a package with copies would be refused: none
  std::vector<std::string> names;
  for (const auto& p : trainable_params(net, net.dependency_graph(), true))
    if (p.bf16_weight) names.push_back(p.name);
  return names;
}

AdamWOptions adamw_options(const config::Config& cfg) {
  AdamWOptions o;
  o.beta1 = cfg.optimizer.beta1, o.beta2 = cfg.optimizer.beta2, o.eps = cfg.optimizer.eps;
  o.weight_decay = cfg.optimizer.weight_decay;
  return o;
}

Schedule schedule(const config::Config& cfg) {
  Schedule s;
  s.peak_lr = cfg.optimizer.lr;
  s.total_steps = cfg.trainer.max_steps;
  s.warmup_steps = cfg.schedule.warmup_steps > 0
                       ? cfg.schedule.warmup_steps
                       : static_cast<int64_t>(std::ceil(cfg.schedule.warmup_ratio * cfg.trainer.max_steps));
  s.min_lr_ratio = cfg.schedule.min_lr_ratio;
  s.kind = cfg.schedule.name == "linear"     ? Schedule::Kind::Linear
           : cfg.schedule.name == "constant" ? Schedule::Kind::Constant
                                             : Schedule::Kind::Cosine;
  return s;
}

std::unique_ptr<Optimizer> make_optimizer(const std::vector<OptimizedParam>& params, const AdamWOptions& options,
                                          bool fused, bool fp32_copy_gradients) {
  if (fused)
    return std::make_unique<FusedAdamW>(params, options,
                                        fp32_copy_gradients ? CopyGradients::fp32 : CopyGradients::bf16);
  return std::make_unique<AdamW>(params, options);
}

std::string working_copies_note(const Optimizer& optimizer) {
  const Optimizer::WorkingCopies w = optimizer.working_copies();
  if (w.count == 0) return "";
  char millions[32];
  std::snprintf(millions, sizeof millions, "%.1f", static_cast<double>(w.numel) / 1e6);
  return ", " + std::to_string(w.count) + " weights read only by linear layers (" + millions +
         " M elements) as bf16 working copies of fp32 masters" +
         (w.fp32_gradients ? " (their gradients summed in fp32)" : "");
}

nlohmann::json working_copies_json(const Optimizer* optimizer) {
  if (!optimizer) return nullptr;
  const Optimizer::WorkingCopies w = optimizer->working_copies();
  if (w.count == 0) return nullptr;
  return {{"copies", w.count}, {"elements", w.numel}, {"gradients", w.fp32_gradients ? "fp32" : "bf16"}};
}

}  // namespace loongforge::optim
