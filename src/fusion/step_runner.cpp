// The plain StepRunner: the reference trainer's loop, micro-batch by
// micro-batch (step_runner.hpp).
#include "loongforge/fusion/step_runner.hpp"

#include <cstdlib>  // std::getenv, std::_Exit
#include <optional> // std::optional
#include <string>   // std::string
#include <utility>  // std::move

#include <mutex>    // std::lock_guard

#include <ATen/ATen.h>           // at::Tensor, at::globalContext
#include <ATen/autocast_mode.h>  // at::autocast::set_autocast_enabled
#include <c10/util/Exception.h>  // c10::OutOfMemoryError

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "runner_common.hpp"

namespace loongforge::fusion {

// Note [Micro-step draws]
// What a micro-step's forward draws itself - dropout masks, and a GR00T
// head's state_drop / state_noise when the batch lacks them - comes from
// the default generator of the batch's device, which every runner sets to
// the micro-batch's draw_seed (offset 0) just before its forward: an eager
// forward, a compiled package call, or a CUDA-graph replay (a replay reads
// the generator's seed and Philox offset then: at::cuda::CUDAGraph::replay's
// replay_prologue, so it draws what an uncaptured call would). The draws are
// then a pure function of (run.seed, step, micro-batch, rank): a resume
// reproduces them without any generator state, and the plain, graphed and
// compiled runners each draw per micro-batch, not along one stream of the
// run. A mask covers a micro-batch, not a sample: another world size or
// accumulation gives other masks of the same distribution
// (docs/training-semantics.md s4). The compiled package draws its masks
// with other generator calls than the TorchScript forward (its own order
// and ops: compiled_runner.cpp, Note [Compiled step draws]), so the two
// runners' masks are equal in distribution, not in value.
uint64_t draw_seed(uint64_t run_seed, int64_t step, int64_t micro, int64_t rank) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  constexpr uint64_t kSalt = 0x4452415753454544ull;  // "DRAWSEED"
  const uint64_t index =
      (static_cast<uint64_t>(step) * 65536 + static_cast<uint64_t>(micro)) * 65536 + static_cast<uint64_t>(rank);
  uint64_t z = (run_seed ^ kSalt) + index * kGolden + kGolden;  // SplitMix64's first output from that state
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFull;
}

void seed_draws(uint64_t seed, c10::Device device) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);  // CUDA: Philox offset 0 as well
}

// Shared runner pieces (runner_common.hpp).
AutocastScope::AutocastScope(bool enable) : on(enable) {
  if (on) {
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
}

AutocastScope::~AutocastScope() {
  if (on) {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
}

Fault::Fault() {
  const char* v = std::getenv("LOONGFORGE_TEST_FAULT");
  if (!v) return;
  const std::string s = v;
  const auto at = s.find('@');
  if (at == std::string::npos) return;
  phase = s.substr(0, at);
  step = std::stoll(s.substr(at + 1));
}

void Fault::maybe_raise(const char* where, int64_t step_1based) const {
  if (step_1based == step && phase == std::string("exit:") + where) std::_Exit(137);  // as if SIGKILLed there
  if (step_1based == step && phase == where)
    TORCH_CHECK_WITH(OutOfMemoryError, false, "injected by LOONGFORGE_TEST_FAULT: out of memory in ", where,
                     " at step ", step_1based);
}

at::Tensor eager_micro_step(model::Model& net, bool bf16, const Fault& fault, const model::Batch& batch,
                            uint64_t draw_seed, double w, int64_t step, int64_t micro, PhaseRecorder& phases) {
  at::Tensor loss;
  {
    Phase p(phases, "forward", step + 1, micro);
    fault.maybe_raise("forward", step + 1);
    seed_draws(draw_seed, batch.begin()->second.device());
    AutocastScope autocast(bf16);
    loss = net.forward(batch).at("loss");
  }
  Phase p(phases, "backward", step + 1, micro);
  fault.maybe_raise("backward", step + 1);
  (loss * w).backward();
  return loss.detach().to(at::kDouble) * w;
}

namespace {

class PlainRunner final : public StepRunner {
 public:
  PlainRunner(model::Model& net, bool bf16) : net_(net), bf16_(bf16) {}

  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    at::Tensor total;  // sum_i w_i * loss_i, float64, on the loss's device
    for (size_t i = 0; i < batches.size(); ++i) {
      const at::Tensor part = eager_micro_step(net_, bf16_, fault_, batches[i].tensors, batches[i].draw_seed,
                                               weights[i], step, static_cast<int64_t>(i), phases);
      total = total.defined() ? total + part : part;
    }
    return total;
  }

 private:
  model::Model& net_;
  bool bf16_;
  Fault fault_;
};

}  // namespace

std::unique_ptr<StepRunner> make_plain_runner(model::Model& net, bool bf16_autocast) {
  return std::make_unique<PlainRunner>(net, bf16_autocast);
}

// Note [Compiled step setting]
// trainer.compiled_step is "auto" by default: on CUDA the package of this
// model, micro-batch, precision, device, GPU architecture and working copies
// from the cache, compiled there first when it is missing (minutes, with
// progress in the log and `status`); on the CPU the TorchScript step, where a
// compile takes minutes of a small machine for a step that is not measured
// faster. "on" is the cache on any device (the CPU too); "off" (or "") the
// TorchScript step; a path names one package. Why auto is the GPU default:
// on gr00t-n1.7-3b the package with bf16 working copies trained at 1.38x the
// graphed TorchScript step, same GPU, same losses within 0.21%
// (docs/benchmarks.md, session 49). Under auto or on a compile that fails (or
// a compiler that is not found) is not fatal: the run trains on the
// TorchScript step, with CUDA graphs where they apply, after a warning that
// names the compile's log and the fix, so a model the compiler refuses
// (scripts/compile_step.py: a model file exported by other model code than the
// checkout's, a grouped model without the operator library) still trains. A
// package that cannot serve a micro-batch's shape is never run around
// eagerly: it is refused (compiled_runner.cpp), naming the setting that fixes it.
CompiledStepSetting compiled_step_setting(const config::Config& cfg, c10::Device device) {
  const std::string& v = cfg.trainer.compiled_step;
  if (v.empty() || v == "off") return CompiledStepSetting::off;
  if (v == "auto") return device.is_cuda() ? CompiledStepSetting::cache : CompiledStepSetting::off;
  return v == "on" ? CompiledStepSetting::cache : CompiledStepSetting::path;
}

PreparedPackage prepare_compiled_step(const config::Config& cfg, const model::Model& net, c10::Device device,
                                      bool bf16_autocast, const CompileProgress& progress,
                                      const std::vector<std::string>& bf16_weights, int64_t text_width) {
  const CompileTools tools = find_compile_tools();
  return prepare_package(cache_dir(cfg),
                         package_key(net, cfg.trainer.micro_batch_size, cfg.data.action_horizon,
                                     text_width > 0 ? text_width : cfg.data.max_text_len, bf16_autocast, device, tools,
                                     bf16_weights),
                         tools, progress);
}

namespace {

// StepMode::package_status of packages prepared for these widths (one: its own to_json()).
nlohmann::json packages_status(const std::vector<PreparedPackage>& prepared, const std::vector<int64_t>& text_widths) {
  if (prepared.size() == 1) return prepared[0].to_json();
  // Several (DMF's package buckets): the first's path, "compiled" when any was, the compiles' sum, and each.
  nlohmann::json each = nlohmann::json::array();
  bool any_compiled = false;
  double compile_s = 0, waited_s = 0;
  for (size_t i = 0; i < prepared.size(); ++i) {
    nlohmann::json one = prepared[i].to_json();
    one["text_width"] = text_widths.at(i);
    each.push_back(std::move(one));
    any_compiled = any_compiled || prepared[i].compiled;
    compile_s += prepared[i].compile_s, waited_s += prepared[i].waited_s;
  }
  return {{"path", prepared[0].path},   {"source", any_compiled ? "compiled" : "cache hit"},
          {"compile_s", compile_s},     {"waited_s", waited_s},
          {"text_widths", text_widths}, {"packages", each}};
}

}  // namespace

StepMode step_mode(const config::Config& cfg, const model::Model& net, c10::Device device, bool bf16_autocast,
                   const CompileProgress& progress, const std::vector<std::string>& bf16_weights,
                   const std::vector<int64_t>& text_widths) {
  StepMode m;
  m.text_widths = text_widths.empty() ? std::vector<int64_t>{cfg.data.max_text_len} : text_widths;
  m.graphs = cfg.trainer.cuda_graphs == "on" || (cfg.trainer.cuda_graphs == "auto" && device.is_cuda());
  m.graphs_required = cfg.trainer.cuda_graphs == "on";
  switch (compiled_step_setting(cfg, device)) {
    case CompiledStepSetting::off:
      break;
    case CompiledStepSetting::path: {
      const std::string package = cfg.trainer.compiled_step;
      if (m.text_widths.size() > 1)
        throw ConfigError("trainer.compiled_step names one package (" + package + "), which serves one text width, " +
                          "but DMF cuts the text slot to " + std::to_string(m.text_widths.size()) +
                          " widths (dmf.package_buckets is " + std::to_string(cfg.dmf.package_buckets) +
                          "): set dmf.package_buckets=1, or trainer.compiled_step=auto (=on on the CPU), which " +
                          "compiles a package for each width into trainer.compile_cache");
      const int64_t text_width = m.text_widths[0];
      m.compiled = true, m.packages = {package};
      // -1: unreadable (the runner says why)
      const int64_t micro = package_micro_batch(package), horizon = package_action_horizon(package),
                    width = package_text_width(package);
      const std::string fix =
          ": set trainer.compiled_step=auto (=on on the CPU), which compiles one for this run into "
          "trainer.compile_cache, or "
          "python3 scripts/compile_step.py " + net.info().path + " --batch-size " +
          std::to_string(cfg.trainer.micro_batch_size) + " --action-horizon " +
          std::to_string(cfg.data.action_horizon) + " --text-width " + std::to_string(text_width) + " --device " +
          (device.is_cuda() ? "cuda" : "cpu") +
          " --precision " + (bf16_autocast ? "bf16" : "fp32") + " --out PACKAGE.pt2 and name that";
      if (micro >= 0 && micro != cfg.trainer.micro_batch_size)
        throw ConfigError("trainer.compiled_step: " + package + " was compiled for micro-batch " +
                          std::to_string(micro) + ", this run's trainer.micro_batch_size is " +
                          std::to_string(cfg.trainer.micro_batch_size) + fix);
      if (horizon >= 0 && horizon != cfg.data.action_horizon)
        throw ConfigError("trainer.compiled_step: " + package + " was compiled for " + std::to_string(horizon) +
                          " actions per sample, this run's data.action_horizon is " +
                          std::to_string(cfg.data.action_horizon) + fix);
      if (width >= 0 && width != text_width)
        throw ConfigError("trainer.compiled_step: " + package + " was compiled for a text slot of " +
                          std::to_string(width) + " tokens, this run's batches have " + std::to_string(text_width) +
                          (text_width != cfg.data.max_text_len ? " (DMF's width)" : " (data.max_text_len)") + fix);
      m.package_status = {{"path", package}, {"source", "given"}, {"compile_s", 0.0}};
      break;
    }
    case CompiledStepSetting::cache:
      try {
        std::vector<PreparedPackage> prepared;
        for (const int64_t width : m.text_widths)  // one package per width (DMF's package buckets), in turn
          prepared.push_back(prepare_compiled_step(cfg, net, device, bf16_autocast, progress, bf16_weights, width));
        m.compiled = true, m.package_from_cache = true, m.bf16_weights = bf16_weights;
        for (const auto& p : prepared) m.packages.push_back(p.path);
        m.package_status = packages_status(prepared, m.text_widths);
      } catch (const ConfigError& e) {  // Note [Compiled step setting]: the TorchScript step, loudly
        LF_LOG(logger("fusion"), warn)
            << "compiled step: NOT USED, this run trains on the slower TorchScript step. " << e.what()
            << "\nFix the cause and prepare the package with `loongforge-train --config <this config> "
               "--compile-only`, or set trainer.compiled_step=off to train on the TorchScript step without "
               "this attempt.";
        m.package_status = {{"source", "compile failed"}, {"error", e.what()}};
      }
      break;
  }
  return m;
}

namespace {

// A runner with the compiled step's package named in its status ({"package": ...}).
class PackagedRunner final : public StepRunner {
 public:
  PackagedRunner(std::unique_ptr<StepRunner> inner, nlohmann::json package)
      : inner_(std::move(inner)), package_(std::move(package)) {}
  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    return inner_->run(batches, weights, step, phases);
  }
  nlohmann::json status() const override {
    nlohmann::json s = inner_->status();
    if (!s.is_object()) s = nlohmann::json::object();
    s["package"] = package_;
    return s;
  }
  bool set_graph_reduction(GraphReduction* r) override { return inner_->set_graph_reduction(r); }
  bool make_gradients(bool allowed) override { return inner_->make_gradients(allowed); }
  std::optional<double> take_graph_comm_ms(int64_t step) override { return inner_->take_graph_comm_ms(step); }
  std::vector<std::string> bf16_weights() const override { return inner_->bf16_weights(); }
  std::vector<std::pair<std::string, double>> step_scalars() const override { return inner_->step_scalars(); }

 private:
  std::unique_ptr<StepRunner> inner_;
  nlohmann::json package_;
};

}  // namespace

std::unique_ptr<StepRunner> with_package_status(std::unique_ptr<StepRunner> inner, nlohmann::json package) {
  return std::make_unique<PackagedRunner>(std::move(inner), std::move(package));
}

std::unique_ptr<StepRunner> make_step_runner(const config::Config& cfg, model::Model& net, const StepMode& mode,
                                             bool bf16_autocast, c10::Device device) {
  const GraphMode graphs =
      !mode.graphs ? GraphMode::off : (mode.graphs_required ? GraphMode::required : GraphMode::fallback);
  std::unique_ptr<StepRunner> runner;
  nlohmann::json package = mode.package_status;
  if (mode.compiled) {
    // A cached package whose manifest read back but whose code does not load (a damaged library inside): that
    // package once more from scratch; a second failure is the runner's error.
    PackageReload reload;
    if (mode.package_from_cache)
      reload = [&](size_t i, const ConfigError& e) {
        LF_LOG(logger("fusion"), warn) << "compiled step: the cached package " << mode.packages.at(i)
                                       << " does not load (" << e.what() << "); compiling it again";
        discard_package(mode.packages.at(i));
        const PreparedPackage p = prepare_compiled_step(cfg, net, device, bf16_autocast, nullptr, mode.bf16_weights,
                                                        mode.text_widths.at(i));
        if (mode.packages.size() == 1) {
          package = p.to_json();
        } else {  // this package's entry, and the whole's source and compile time with it
          package["packages"][i] = p.to_json(), package["packages"][i]["text_width"] = mode.text_widths.at(i);
          package["source"] = "compiled";
          package["compile_s"] = package["compile_s"].get<double>() + p.compile_s;
        }
        return p.path;
      };
    runner = make_compiled_runner(net, mode.packages, bf16_autocast, graphs, device, reload);
  } else if (mode.graphs) {
    runner = make_graph_runner(net, bf16_autocast, mode.graphs_required, device);
  } else {
    runner = make_plain_runner(net, bf16_autocast);
  }
  if (package.is_null()) return runner;
  return with_package_status(std::move(runner), std::move(package));
}

}  // namespace loongforge::fusion
