// GCTS's factory and record (gcts.hpp): the reducer and optimizer seams as
// the config asks, and the engine's verbs, status and checkpoint state.
#include "loongforge/engines/gcts/gcts.hpp"

#include <algorithm>  // std::max

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/engines/gcts/sharded_adamw.hpp"

namespace loongforge::gcts {

namespace {

// The graph runner's view of the reducer (Note [Reduction in the graph] in src/engines/gcts/reducer.cpp).
struct ReducerInGraph final : fusion::GraphReduction {
  explicit ReducerInGraph(comm::GradientReducer& r) : reducer(r) {}
  std::string key() const override { return reducer.graph_key(); }
  void prepare() override { reducer.prepare_capture(); }
  void begin() override { reducer.begin_capture(); }
  void end() override { reducer.end_capture(); }
  void replayed() override { reducer.graph_replayed(); }
  comm::GradientReducer& reducer;
};

std::string check_strategy(const nlohmann::json& args) {
  const auto it = args.find("strategy");
  const std::string s = it != args.end() && it->is_string() ? it->get<std::string>() : std::string("(not a string)");
  if (s == "simple" || s == "hybrid") return "";
  return "strategy must be simple or hybrid, got '" + s.substr(0, 32) + "'";
}

// The sharded AdamW of gcts.shard_optimizer (Note [Gather overlap] in sharded_adamw.cpp: with
// gcts.overlap each all-gather receives about one gradient bucket).
std::unique_ptr<ShardedAdamW> make_sharded(const config::Config& cfg, const std::vector<optim::OptimizedParam>& params,
                                           comm::World* world, bool fused) {
  const int64_t world_size = world ? world->size() : 1;
  ShardedOptions so;
  so.fused = fused;
  so.overlap_gather = cfg.gcts.overlap;
  if (so.overlap_gather)  // else one all-gather of everything, after the update
    so.gather_piece_numel = std::max<int64_t>(1, static_cast<int64_t>(cfg.gcts.bucket_mb * 1e6 / 4.0) / world_size);
  return std::make_unique<ShardedAdamW>(params, optim::adamw_options(cfg), world,
                                        static_cast<int64_t>(cfg.gcts.tiny_tensor_kb * 1024.0 / 4.0), so);
}

}  // namespace

GradientPath make_gradient_path(const config::Config& cfg, const GradientInputs& in, Engine& record,
                                std::unique_ptr<optim::Optimizer> existing) {
  const auto& log = logger("trainer");
  const bool on = cfg.gcts.enable;
  if (!on && !existing)
    for (const auto& key : config::non_default_keys(cfg, "gcts"))
      LF_LOG(log, warn) << key << " has no effect: gcts.enable is false (the plain all-reduce and AdamW run); "
                        << "set gcts.enable=true or remove the key";
  const bool sharded = on && cfg.gcts.shard_optimizer;
  const bool fused = optim::use_fused(cfg, in.device);
  optim::WeightsContext weights{in.device, in.bf16, fused, sharded, in.compiled, in.world != nullptr, in.accumulation, {}};
  if (in.compiled && in.runner) weights.package_bf16 = in.runner->bf16_weights();
  const bool bf16_weights = optim::use_bf16_weights(cfg, weights);
  // The MDG: which parameters only linear layers read (bf16 working copies), backward readiness (the plan).
  const model::Mdg mdg = (bf16_weights && !existing) || on ? in.net->dependency_graph() : model::Mdg{};
  const std::vector<optim::OptimizedParam> trainable =
      existing ? std::vector<optim::OptimizedParam>{}
               : optim::trainable_params(*in.net, mdg, bf16_weights, weights.package_bf16);

  GradientPath path;
  ShardedAdamW* shard_owner = nullptr;
  if (existing) {  // the world changed (fault tolerance): a replicated optimizer's state stays where it is
    if (existing->sharded())
      throw ConfigError("gcts.shard_optimizer: a sharded optimizer cannot be kept on another world size");
    path.optimizer = std::move(existing);
  } else if (sharded) {
    auto opt = make_sharded(cfg, trainable, in.world, fused);
    shard_owner = opt.get();
    path.optimizer = std::move(opt);
  } else {
    // Note [fp32 gradients of bf16 copies] in src/optim/fused_adamw.cpp: several micro-batches or ranks sum in fp32.
    const bool fp32_copy_grads = in.world || in.accumulation > 1;
    path.optimizer = optim::make_optimizer(trainable, optim::adamw_options(cfg), fused, bf16_weights && fp32_copy_grads);
  }
  if (!on) {
    path.reducer = comm::make_plain_reducer(in.world);
    return path;
  }

  // The MDG orders the hybrid plan's buckets by backward readiness (Note [Bucket order] in plan.cpp).
  std::vector<comm::ReducedParam> reduced;
  const auto all = in.net->parameters();
  int64_t used = 0;
  for (size_t k = 0; k < all.size(); ++k) {
    const auto& p = all[k];
    if (!p.info->trainable) continue;
    reduced.push_back({p.info->name, p.info->shape, p.info->numel, p.info->role == model::ParamRole::Embodiment,
                       mdg.params[k].ready});
    used += mdg.params[k].first_use >= 0 ? 1 : 0;
  }
  LF_LOG(log, info) << "module dependency graph: " << mdg.graph_nodes << " forward-graph nodes, " << used << " of "
                    << reduced.size() << " trainable parameters read by forward (backward readiness = reverse first use)";
  // Overlap needs autograd's AccumulateGrad to run (Note [Overlap] in reducer.cpp); under CUDA graphs on NCCL the
  // reduction is captured into the last micro-batch's graph instead (Note [Reduction in the graph]).
  const bool overlap = cfg.gcts.overlap && !in.graphs && !in.compiled;
  const bool in_graph =
      cfg.gcts.overlap && in.graphs && !in.compiled && in.world && in.world->backend() == comm::Backend::Nccl;
  if (cfg.gcts.overlap && !overlap)
    LF_LOG(log, info) << "gcts.overlap: "
                      << (in_graph ? "under trainer.cuda_graphs the reduction is captured into the last micro-batch's graph"
                                   : std::string("gradients are reduced after backward under ") +
                                         (in.compiled ? "trainer.compiled_step" : "trainer.cuda_graphs") +
                                         " (replayed steps run no gradient hooks)");
  path.reducer = make_reducer(cfg, in.world, std::move(reduced), shard_owner ? &shard_owner->shard() : nullptr, overlap);
  if (in_graph) {
    path.graph_reduction = std::make_unique<ReducerInGraph>(*path.reducer);
    in.runner->set_graph_reduction(path.graph_reduction.get());
  }
  attach(record, *path.reducer, mdg.to_json());
  return path;
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "gcts";
  e.title = "GCTS";
  e.what = "gradient communication scheduling";
  e.arrives_with = "the GCTS and NCCL issue";
  e.built = kBuilt;
  e.enabled = kBuilt && cfg.gcts.enable;
  e.verbs.push_back(EngineVerb{"switch-strategy", false, check_strategy, nullptr, /*cluster=*/true});
  return e;
}

void attach(Engine& e, comm::GradientReducer& reducer, nlohmann::json mdg) {
  comm::GradientReducer* r = &reducer;
  for (auto& v : e.verbs)
    if (v.name == "switch-strategy")
      v.run = [r](const nlohmann::json& args) { return r->switch_strategy(args.at("strategy").get<std::string>()); };
  e.status = [r] { return nlohmann::json{{"strategy", r->strategy()}}; };
  e.save_state = [r, mdg = std::move(mdg)] { return nlohmann::json{{"plan", r->plan()}, {"mdg", mdg}}; };
  e.load_state = [r](const nlohmann::json& state) {
    if (!state.contains("plan") || !state.at("plan").is_object()) return;
    const std::string took = r->restore_plan(state.at("plan"));
    if (!took.empty()) LF_LOG(logger("comm"), info) << "resume: " << took;
  };
}

}  // namespace loongforge::gcts
