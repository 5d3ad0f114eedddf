// The plain GradientReducer: no communication on one rank, one flat fp32
// all-reduce after backward on several (reducer.hpp).
#include "loongforge/comm/reducer.hpp"

#include <chrono>  // std::chrono

#include <ATen/ATen.h>  // at::full

namespace loongforge::comm {

namespace {

class LocalReducer final : public GradientReducer {
 public:
  int64_t world_size() const override { return 1; }
  int64_t sum_counts(int64_t local) override { return local; }
  void average_gradients(const std::vector<at::Tensor>&, PhaseRecorder&, int64_t) override {}
  at::Tensor sum_scalar(const at::Tensor& scalar) override { return scalar; }
  std::string strategy() const override { return "none (1 rank: no gradient communication)"; }
  nlohmann::json comm_status() const override { return nullptr; }
};

class AllReduceReducer final : public GradientReducer {
 public:
  explicit AllReduceReducer(World& world) : world_(world), sync_(world) {}
  int64_t world_size() const override { return world_.size(); }

  int64_t sum_counts(int64_t local) override {
    std::vector<at::Tensor> t = {at::full({1}, local, at::TensorOptions().dtype(at::kLong))};
    world_.allreduce_sum(t);
    return t[0].item<int64_t>();
  }

  void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) override {
    Phase p(phases, "comm/all-reduce", step + 1);
    last_ = sync_.average(params);
  }

  at::Tensor sum_scalar(const at::Tensor& scalar) override {
    // Gloo reduces host tensors: the logged loss crosses to the host here.
    std::vector<at::Tensor> t = {scalar.to(at::kCPU).reshape({1}).clone()};
    world_.allreduce_sum(t);
    return t[0].reshape({}).to(scalar.device());
  }

  std::string strategy() const override {
    return "plain (one fp32 all-reduce after backward; GCTS not in this build)";
  }

  nlohmann::json comm_status() const override {
    const double gbps = last_.ms > 0 ? last_.bytes / (last_.ms * 1e6) : 0.0;
    const double n = static_cast<double>(world_.size());
    return {{"world", world_.size()},
            {"groups", nlohmann::json::array({{{"name", "all-reduce"},
                                               {"bytes", last_.bytes},
                                               {"time_ms", last_.ms},
                                               {"algbw_gbps", gbps},
                                               {"busbw_gbps", gbps * 2.0 * (n - 1.0) / n}}})}};
  }

 private:
  World& world_;
  GradientSync sync_;
  SyncStats last_;
};

std::string check_strategy(const nlohmann::json& args) {
  const auto it = args.find("strategy");
  const std::string s = it != args.end() && it->is_string() ? it->get<std::string>() : std::string("(not a string)");
  if (s == "simple" || s == "hybrid") return "";
  return "strategy must be simple or hybrid, got '" + s.substr(0, 32) + "'";
}

}  // namespace

std::unique_ptr<GradientReducer> make_plain_reducer(World* world) {
  if (!world) return std::make_unique<LocalReducer>();
  return std::make_unique<AllReduceReducer>(*world);
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "gcts";
  e.title = "GCTS";
  e.what = "gradient communication scheduling";
  e.arrives_with = "the GCTS and NCCL issue";
  e.built = kGctsBuilt;
  e.enabled = kGctsBuilt && cfg.gcts.enable;
  e.verbs.push_back(EngineVerb{"switch-strategy", false, check_strategy, nullptr});
  e.verbs.push_back(EngineVerb{"hot-rejoin", false, nullptr, nullptr});
  return e;
}

}  // namespace loongforge::comm
