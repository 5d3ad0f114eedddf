// DMF's record, its resolution of the config and its step runner (dmf.hpp):
// the text slot cut to its bucket.
#include "loongforge/engines/dmf/dmf.hpp"

#include <algorithm>  // std::max
#include <deque>      // std::deque
#include <map>        // std::map
#include <mutex>      // std::mutex, std::lock_guard
#include <set>        // std::set
#include <stdexcept>  // std::logic_error
#include <utility>    // std::move, std::pair
#include <vector>     // std::vector

#include <ATen/ATen.h>  // at::Tensor

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/engines/dmf/text_buckets.hpp"

namespace loongforge::dmf {

// Note [DMF and the package]: a compiled step's package is traced for one
// batch shape, and the compiled runner refuses any other (never an eager run
// around it). So where the compiled step may run (trainer.compiled_step not
// off) each width is a package of its own, compiled into the cache (its key
// holds the width; scripts/compile_step.py --text-width), and the compiled
// runner runs each micro-batch through the package of its width (Note
// [Several packages] in src/fusion/compiled_runner.cpp). A compile takes
// minutes on a GPU (n16-1b: 290 s), so the widths there are at most
// dmf.package_buckets, 1 by default: the dataset's longest text, one
// compile. Without the compiled step the TorchScript step takes any width,
// and CUDA graphs capture one graph per width (dmf.text_buckets at most).

namespace {

constexpr size_t kTraceSteps = 256;  // debug-dmf's longest answer

// What debug-dmf shows: written on the trainer thread, read on the control thread.
class Trace {
 public:
  Trace(std::vector<int64_t> widths, int64_t slot) : widths_(std::move(widths)), slot_(slot) {}

  // One step's micro-batches, and for each micro-batch its width and whether the width was new to the run.
  void add(nlohmann::json step, const std::vector<std::pair<int64_t, bool>>& widths) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(std::move(step));
    if (steps_.size() > kTraceSteps) steps_.pop_front();
    for (const auto& [width, is_new] : widths) {
      ++runs_by_width_[width];
      new_shapes_ += is_new ? 1 : 0;
    }
  }
  // Note [DMF's shape counts]: each width is a batch shape of its own. With
  // CUDA graphs a new shape is captured (after its eager warm-up calls) and
  // every later micro-batch of that width replays the graph; with the
  // compiled step each width is a package (and, with graphs, its own
  // captures). So the share of
  // micro-batches whose width the run had already seen is the hit rate of the
  // graphs or the package (issue #46 asks at least 95% after warm-up).
  nlohmann::json shape_counts() const {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t all = 0;
    nlohmann::json by_width = nlohmann::json::object();
    for (const auto& [width, n] : runs_by_width_) all += n, by_width[std::to_string(width)] = n;
    return {{"micro_batches", all},
            {"micro_batches_by_width", by_width},
            {"new_shapes", new_shapes_},
            {"shape_reuse", all > 0 ? static_cast<double>(all - new_shapes_) / static_cast<double>(all) : 0.0}};
  }
  nlohmann::json last(size_t n) const {
    std::lock_guard<std::mutex> lock(mu_);
    nlohmann::json steps = nlohmann::json::array();
    for (size_t i = steps_.size() > n ? steps_.size() - n : 0; i < steps_.size(); ++i) steps.push_back(steps_[i]);
    return {{"buckets", widths_}, {"slot", slot_}, {"steps", steps}};
  }

 private:
  const std::vector<int64_t> widths_;
  const int64_t slot_;
  mutable std::mutex mu_;
  std::deque<nlohmann::json> steps_;
  std::map<int64_t, int64_t> runs_by_width_;  // micro-batches run at each width
  int64_t new_shapes_ = 0;                     // micro-batches whose width was new to the run
};

// The fast step's runner behind the text-slot cut (dmf.hpp).
class TextSlotRunner final : public fusion::StepRunner {
 public:
  TextSlotRunner(std::unique_ptr<fusion::StepRunner> inner, std::vector<int64_t> widths,
                 std::shared_ptr<Trace> trace)
      : inner_(std::move(inner)), widths_(std::move(widths)), trace_(std::move(trace)) {}

  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    nlohmann::json micro = nlohmann::json::array();
    std::vector<std::pair<int64_t, bool>> widths;
    for (auto& b : batches) {
      at::Tensor& tokens = b.tensors.at("text_tokens");
      at::Tensor& mask = b.tensors.at("text_mask");
      const int64_t width = text_bucket(widths_, std::max<int64_t>(b.text_len_max, 1));
      if (width < tokens.size(1)) {  // a copy: the runners' inputs stay contiguous
        tokens = tokens.narrow(1, 0, width).contiguous();
        mask = mask.narrow(1, 0, width).contiguous();
      }
      const bool new_shape = seen_.insert(tokens.size(1)).second;
      micro.push_back({{"samples", tokens.size(0)},
                       {"embodiments", b.embodiments},
                       {"text_tokens", b.text_tokens},
                       {"text_slot_tokens", tokens.size(0) * tokens.size(1)},
                       {"width", tokens.size(1)},
                       {"new_shape", new_shape}});
      widths.emplace_back(tokens.size(1), new_shape);
    }
    trace_->add({{"step", step + 1}, {"micro_batches", std::move(micro)}}, widths);
    return inner_->run(batches, weights, step, phases);
  }
  nlohmann::json status() const override { return inner_->status(); }
  bool set_graph_reduction(fusion::GraphReduction* r) override { return inner_->set_graph_reduction(r); }
  bool make_gradients(bool allowed) override { return inner_->make_gradients(allowed); }
  std::optional<double> take_graph_comm_ms(int64_t step) override { return inner_->take_graph_comm_ms(step); }
  std::vector<std::string> bf16_weights() const override { return inner_->bf16_weights(); }
  // Note [DMF's shape counts], so far in the run: metrics.jsonl's dmf_micro_batches, dmf_new_shapes and
  // dmf_shape_reuse.
  std::vector<std::pair<std::string, double>> step_scalars() const override {
    const nlohmann::json c = trace_->shape_counts();
    return {{"dmf_micro_batches", c["micro_batches"].get<double>()},
            {"dmf_new_shapes", c["new_shapes"].get<double>()},
            {"dmf_shape_reuse", c["shape_reuse"].get<double>()}};
  }

 private:
  std::unique_ptr<fusion::StepRunner> inner_;
  const std::vector<int64_t> widths_;
  std::shared_ptr<Trace> trace_;
  std::set<int64_t> seen_;  // widths run so far (each a shape of its own: a capture where graphs are on)
};

std::string debug_dmf_args(const nlohmann::json& args) {
  if (!args.is_object() || !args.contains("steps")) return "";
  const auto& s = args.at("steps");
  if (!s.is_number_integer() || s.get<int64_t>() < 1 || s.get<int64_t>() > static_cast<int64_t>(kTraceSteps))
    return "steps must be an integer in [1, " + std::to_string(kTraceSteps) + "]";
  return "";
}

}  // namespace

void resolve(const config::Config& cfg, const model::ModelInfo& info) {
  if (!cfg.dmf.enable) {
    for (const auto& key : config::non_default_keys(cfg, "dmf"))
      LF_LOG(logger("trainer"), warn) << key << " has no effect: dmf.enable is false (every micro-batch keeps the "
                                      << "whole text slot); set dmf.enable=true or remove the key";
    return;
  }
  const std::string model = "the model " + info.path + " (" + info.name + ")";
  if (!info.text_slot_cut)
    throw ConfigError("dmf.enable=true: " + model + " gives a result that depends on the width of its text slot " +
                      (info.batch_spec.contains("text_slot_cut")
                           ? std::string("(its GR00T head attends the pads of the slot; a chat-templated GR00T N1.7 "
                                         "import's head sees only the pads of its batch, as upstream's does, and "
                                         "has no such dependence)")
                           : std::string("or was exported before scripts/model/export.py recorded whether it does "
                                         "(re-export it)")) +
                      ", so DMF cannot cut it; set dmf.enable=false");
  if (info.flops_by_text_len.size() != static_cast<size_t>(info.text_slot) + 1)
    throw ConfigError("dmf.enable=true: " + model + " has no FLOPs by text width (flops.json by_text_len), which "
                      "the MFU of a cut slot needs: re-export it with scripts/model/export.py");
  if (cfg.data.max_text_len > info.text_slot)  // the FLOPs table ends at the export's slot
    throw ConfigError("dmf.enable=true: data.max_text_len is " + std::to_string(cfg.data.max_text_len) + ", more than " +
                      "the text slot of " + std::to_string(info.text_slot) + " tokens " + model +
                      " was exported with: set data.max_text_len to at most " + std::to_string(info.text_slot));
}

Plan plan(const config::Config& cfg, const std::vector<double>& text_hist, bool compiled_step) {
  Plan p;
  if (!cfg.dmf.enable) return p;
  if (!compiled_step && cfg.dmf.package_buckets != 1)
    LF_LOG(logger("trainer"), warn) << "dmf.package_buckets has no effect: the compiled step does not run "
                                    << "(trainer.compiled_step is off, or auto on the CPU), so DMF cuts to at most "
                                    << "dmf.text_buckets widths; remove the key or set trainer.compiled_step";
  const int64_t micro = cfg.trainer.micro_batch_size;
  p.buckets = choose_text_buckets(text_hist, micro, compiled_step ? cfg.dmf.package_buckets : cfg.dmf.text_buckets);
  p.whole_slot_tokens = expected_slot_tokens(text_hist, micro, {cfg.data.max_text_len});
  p.for_packages = compiled_step;
  return p;
}

std::unique_ptr<fusion::StepRunner> make_step_runner(const config::Config& cfg, model::Model& net,
                                                     const fusion::StepMode& mode, bool bf16_autocast,
                                                     c10::Device device, const Plan& plan, Engine& record) {
  std::unique_ptr<fusion::StepRunner> inner = fusion::make_step_runner(cfg, net, mode, bf16_autocast, device);
  if (!cfg.dmf.enable) return inner;
  const TextBuckets& b = plan.buckets;
  if (mode.compiled && mode.text_widths != b.widths)
    throw std::logic_error("dmf: the compiled step's packages take other text widths than DMF's: pass "
                           "plan.buckets.widths to step_mode");
  const int64_t slot = cfg.data.max_text_len;
  std::string widths;
  for (const int64_t w : b.widths) widths += (widths.empty() ? "" : ", ") + std::to_string(w);
  LF_LOG(logger("trainer"), info) << "DMF: the text slot of " << slot << " tokens is cut to " << widths
                                  << (!plan.for_packages ? " by each micro-batch's longest text"
                                      : b.widths.size() == 1 ? " (one width: the compiled step's package takes one)"
                                                             : " by each micro-batch's longest text (the compiled "
                                                               "step: a package for each width)")
                                  << "; expected text-slot tokens per micro-batch " << b.expected_slot_tokens
                                  << " instead of " << plan.whole_slot_tokens << " (" << b.expected_real_tokens
                                  << " real)";
  auto trace = std::make_shared<Trace>(b.widths, slot);
  for (auto& v : record.verbs)
    if (v.name == "debug-dmf")  // a query with its argument check since engine()
      v.run = [trace](const nlohmann::json& args) {
        return trace->last(args.is_object() && args.contains("steps") ? args.at("steps").get<size_t>() : 10);
      };
  record.status = [trace, widths = b.widths, slot, exp = b.expected_slot_tokens, whole = plan.whole_slot_tokens] {
    nlohmann::json j = {{"text_buckets", widths},
                        {"text_slot", slot},
                        {"expected_text_slot_tokens", exp},
                        {"whole_slot_tokens", whole}};
    j.update(trace->shape_counts());  // Note [DMF's shape counts]
    return j;
  };
  return std::make_unique<TextSlotRunner>(std::move(inner), b.widths, std::move(trace));
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "dmf";
  e.title = "DMF";
  e.what = "dynamic micro-batch fusion";
  e.arrives_with = "the DMF issue";
  e.built = kBuilt;
  e.enabled = kBuilt && cfg.dmf.enable;
  e.verbs.push_back(EngineVerb{"debug-dmf", true, debug_dmf_args, nullptr});
  return e;
}

}  // namespace loongforge::dmf
