// The GradientReducers (reducer.hpp): none on one rank and the plain flat
// all-reduce (GCTS off); GCTS's strategies are in src/engines/gcts/reducer.cpp.
#include "loongforge/comm/reducer.hpp"

#include <algorithm>  // std::sort, std::unique
#include <stdexcept>  // std::invalid_argument

#include <ATen/ATen.h>  // at::full

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/comm/reducer_parts.hpp"

namespace loongforge::comm {

nlohmann::json GradientReducer::switch_strategy(const std::string&) {
  throw CommError("switch-strategy needs GCTS (gcts.enable=true); this run uses " + strategy());
}

// ---------------------------------------------------------------------------
// StepCounts: "valid;slot,slot,..." on the wire

StepCounts StepCounts::combine(const std::vector<StepCounts>& ranks) {
  StepCounts all;
  for (const auto& r : ranks) {
    all.valid += r.valid;
    all.slots.insert(all.slots.end(), r.slots.begin(), r.slots.end());
  }
  std::sort(all.slots.begin(), all.slots.end());
  all.slots.erase(std::unique(all.slots.begin(), all.slots.end()), all.slots.end());
  return all;
}

std::string StepCounts::encode() const {
  std::string s = std::to_string(valid) + ";";
  for (size_t i = 0; i < slots.size(); ++i) s += (i ? "," : "") + std::to_string(slots[i]);
  return s;
}

StepCounts StepCounts::decode(const std::string& s) {
  StepCounts c;
  const size_t semi = s.find(';');
  try {
    if (semi == std::string::npos) throw std::invalid_argument("no ';'");
    size_t used = 0;
    c.valid = std::stoll(s.substr(0, semi), &used);
    if (used != semi) throw std::invalid_argument("valid count");
    for (size_t a = semi + 1; a < s.size();) {
      const size_t b = std::min(s.find(',', a), s.size());
      c.slots.push_back(std::stoll(s.substr(a, b - a), &used));
      if (used != b - a) throw std::invalid_argument("slot");
      a = b + 1;
    }
  } catch (const std::exception&) {
    throw CommError("a rank's step counts are malformed: '" + s.substr(0, 64) + "' (expected 'valid;slot,slot')");
  }
  return c;
}

// ---------------------------------------------------------------------------
// Shared pieces (reducer_parts.hpp)

namespace detail {

double bus_factor(const std::string& collective, double n) {
  if (n <= 1) return 0.0;
  if (collective == "all-reduce") return 2.0 * (n - 1.0) / n;
  return (n - 1.0) / n;  // reduce-scatter, all-gather
}

nlohmann::json group_json(const std::string& name, const std::string& collective, double bytes, double ms,
                          int64_t calls, double n) {
  const double algbw = ms > 0 ? bytes / (ms * 1e6) : 0.0;
  return {{"name", name},       {"collective", collective}, {"bytes", bytes},
          {"time_ms", ms},      {"calls", calls},           {"algbw_gbps", algbw},
          {"busbw_gbps", algbw * bus_factor(collective, n)}};
}

StepCounts agree_counts(World& world, const StepCounts& local) {
  std::vector<StepCounts> ranks;
  for (const auto& s : world.all_gather_on_hosts(local.encode())) ranks.push_back(StepCounts::decode(s));
  return StepCounts::combine(ranks);
}

at::Tensor sum_device_scalar(World& world, const at::Tensor& scalar) {
  // Gloo reduces host tensors: the logged loss crosses to the host there.
  std::vector<at::Tensor> t = {scalar.to(world.device()).reshape({1}).clone()};
  world.allreduce_sum(t);
  return t[0].reshape({}).to(scalar.device());
}

}  // namespace detail

namespace {

class LocalReducer final : public GradientReducer {
 public:
  int64_t world_size() const override { return 1; }
  bool reduces() const override { return false; }
  StepCounts agree_counts(const StepCounts& local) override { return local; }
  void average_gradients(const std::vector<at::Tensor>&, PhaseRecorder&, int64_t) override {}
  at::Tensor sum_scalar(const at::Tensor& scalar) override { return scalar; }
  std::string strategy() const override { return "none (1 rank: no gradient communication)"; }
  nlohmann::json comm_status() const override { return nullptr; }
};

class AllReduceReducer final : public GradientReducer {
 public:
  explicit AllReduceReducer(World& world) : world_(world), sync_(world) {}
  int64_t world_size() const override { return world_.size(); }
  bool reduces() const override { return true; }  // also a one-rank World (the test hook of connect_for_training)
  StepCounts agree_counts(const StepCounts& local) override { return detail::agree_counts(world_, local); }

  void average_gradients(const std::vector<at::Tensor>& params, PhaseRecorder& phases, int64_t step) override {
    Phase p(phases, "comm/all-reduce", step + 1);
    last_ = sync_.average(params);
    step_ = step + 1;
  }

  at::Tensor sum_scalar(const at::Tensor& scalar) override { return detail::sum_device_scalar(world_, scalar); }

  std::string strategy() const override {
    return "plain (one fp32 all-reduce after backward; gcts.enable=false)";
  }

  nlohmann::json comm_status() const override {
    // One blocking all-reduce after backward: all of it is exposed.
    const auto g = detail::group_json("all-reduce", "all-reduce", last_.bytes, last_.ms, 1,
                                      static_cast<double>(world_.size()));
    return {{"world", world_.size()},     {"strategy", "plain"},       {"overlap", false},
            {"step", step_},              {"exposed_ms", last_.ms},    {"reduce_exposed_ms", last_.ms},
            {"comm_ms", last_.ms},        {"units_launched_in_backward", 0},
            {"groups", nlohmann::json::array({g})}, {"buckets", nlohmann::json::array({g})}};
  }

 private:
  World& world_;
  GradientSync sync_;
  SyncStats last_;
  int64_t step_ = 0;
};

}  // namespace

std::unique_ptr<GradientReducer> make_plain_reducer(World* world) {
  if (!world) return std::make_unique<LocalReducer>();
  return std::make_unique<AllReduceReducer>(*world);
}

}  // namespace loongforge::comm
