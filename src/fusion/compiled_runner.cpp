// The compiled StepRunner: each micro-batch's forward + backward as one call
// of an AOTInductor package built by scripts/compile_step.py
// (trainer.compiled_step; step_runner.hpp, Note [Compiled step]).
//
// Note [Compiled step]
// The package is the joint forward+backward graph of the model's training
// micro-step, traced by make_fx and compiled by Inductor: its kernels fuse
// the element-wise, cast, copy and reduction work that TorchScript runs one
// kernel at a time (docs/benchmarks.md, 2026-12-01: that work is 33 of the
// 47 ms a graph-replayed n16-1b micro-step spends on the device). It takes
// the parameters and the batch as inputs and returns the loss, the valid
// count and the gradients, which are accumulated into .grad here in the
// plain runner's order. The package's manifest (its "loongforge" metadata)
// is checked against the model before the package's code is loaded.
//
// Note [Compiled step draws]
// The trainer's batch carries fm_t and fm_noise (per-sample draws at the
// sample's stream position, docs/training-semantics.md s4). What the model
// would otherwise draw in its forward from torch's default generator of the
// batch's device - fm_t / fm_noise when a batch lacks them, and the GR00T
// head's state_drop (B,) and state_noise (B, 1, w) - is drawn here with the
// same ops from that generator in the forward's order (the manifest's
// "batch" lists them in it, its "draws" holds the forms) and passed in. The
// dropout masks are drawn inside the package, from the same generator:
// scripts/compile_step.py builds with Inductor's fallback_random, so every
// random op stays ATen's (on the CPU bernoulli_ through AOTInductor's C
// shim; on a GPU ATen's native_dropout, whose Philox draws are graph-safe),
// and the manifest's "dropout" says so. Before each package call or CUDA
// graph replay the runner seeds that generator with the micro-batch's
// draw_seed, offset 0 (Note [Micro-step draws] in step_runner.cpp): the
// state draws above are drawn inside the captured region, and a replay's
// prologue (at::cuda::CUDAGraph::replay, torch 2.11) copies the generator's
// current seed and offset into the graph's Philox inputs, so a replay draws
// what an uncaptured call at that (seed, step, micro-batch, rank) draws.
// The state noise is drawn in float32 and the model casts it to the state
// token's dtype; under bf16 autocast the plain forward draws a bf16 randn
// there (ATen's CUDA normal kernel draws in float and rounds, so the values
// should be the float draw rounded: not yet checked on a GPU).
// Measured on the CPU (2026-12-05, torch 2.11, gr00t-n1.7-tiny, dropout 0.2,
// micro-batch 4; test/e2e/test_compiled_dropout.py, the masks recorded by
// test/fusion/mask_probe.cpp at the package's 24 bernoulli_ calls): one
// step's masks keep 0.79987 of 587776 elements; each step's masks are what
// torch's CPU bernoulli_ draws after manual_seed(draw_seed(...)) of that
// step, so a run resumed after step 3 draws the uninterrupted run's masks at
// steps 4-6 bit for bit; the losses of 300 steps, smoothed over 20, are
// within 0.26% of the plain runner's (per step 1e-3 apart, median: the
// package's masks are not the TorchScript forward's, other generator calls,
// so the runners agree in distribution, not value). On a GPU:
// test/fusion/test_compiled_draws.cpp and that test's replay form (label
// gpu), not yet run.
#include <optional>  // std::optional
#include <stdexcept> // std::logic_error
#include <string>    // std::string
#include <utility>   // std::move
#include <vector>    // std::vector

#include <ATen/ATen.h>  // at::rand, at::randn_like, at::_foreach_add_
#include <c10/core/GradMode.h>  // c10::NoGradGuard
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>  // AOTIModelPackageLoader
#include <torch/version.h>  // TORCH_VERSION

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "runner_common.hpp"

namespace loongforge::fusion {

namespace {

struct BatchEntry {
  std::string key;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};

at::ScalarType dtype_named(const std::string& name, const std::string& package) {
  if (name == "float32") return at::kFloat;
  if (name == "float64") return at::kDouble;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "int64") return at::kLong;
  if (name == "int32") return at::kInt;
  if (name == "bool") return at::kBool;
  if (name == "uint8") return at::kByte;
  throw ConfigError(package + ": manifest: unknown batch dtype '" + name + "'");
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

// One package: its manifest's batch and draws, its loader and (with graphs) its two CUDA graphs.
struct Package {
  std::string path;
  std::vector<BatchEntry> batch;
  int64_t text_width = -1;  // the manifest's text_tokens width (-1: the batch has none)
  std::vector<std::string> bf16_weights;
  double noise_s = 0.999, beta_alpha = 1.5, state_dropout = 0.0;
  bool fm_time_upstream = false;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
#if LOONGFORGE_WITH_CUDA_KERNELS
  struct Captured {
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    model::Batch batch;             // static copies of the batch tensors the package reads
    at::Tensor w32, w64, part;      // w (package input, float32; float64 for the step loss), loss * w
    std::vector<at::Tensor> grads;  // first: the gradients .grad takes after a replay
  };
  Captured first, accumulate;
#endif
};

// Note [Several packages]: DMF's package buckets (dmf.package_buckets > 1)
// give the runner one package per text width; each micro-batch runs the
// package of its width (a width with none is refused, naming the widths).
// Without graphs the gradients accumulate into .grad as with one package.
// With graphs one package's first-micro-batch graph makes its outputs .grad
// and the accumulating graph adds into those outputs, so an accumulating
// graph holds the address of one first graph's outputs. A step whose first
// micro-batch ran another package's first graph would then add into
// tensors that are not .grad. So with several packages every first graph
// copies its gradients into one set shared by the packages and every accumulating graph adds into
// that set: one copy of the gradients per step that one package does not pay
// (estimated, not measured: a billion trainable float32 parameters' gradients
// read and written once, 8 GB, about 2.5 ms at an H100's 3.35 TB/s). The set is allocated by
// the first (uncaptured) warm-up call, in the dtypes the package returns.
class CompiledRunner final : public StepRunner {
 public:
  CompiledRunner(model::Model& net, const std::vector<std::string>& packages, bool bf16, GraphMode graphs,
                 c10::Device device, const PackageReload& reload)
      : net_(net), bf16_(bf16) {
    if (packages.empty()) throw std::logic_error("make_compiled_runner: no package");
    if (graphs != GraphMode::off) {
#if LOONGFORGE_WITH_CUDA_KERNELS
      if (device.is_cuda()) {
        graphs_ = true, required_ = graphs == GraphMode::required;
        side_ = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
        pool_ = at::cuda::graph_pool_handle();
      }
#endif
      if (graphs == GraphMode::required && !graphs_)
        throw ConfigError("trainer.cuda_graphs=on with trainer.compiled_step needs a CUDA build and run.device=cuda; "
                          "set trainer.cuda_graphs=off or auto");
    }
    for (const auto& p : net.parameters()) (p.info->trainable ? trainable_ : frozen_).push_back(p.tensor);
    for (size_t i = 0; i < packages.size(); ++i) {
      try {
        packages_.push_back(load(packages[i], device));
      } catch (const ConfigError& e) {
        if (!reload) throw;
        packages_.push_back(load(reload(i, e), device));
      }
      Package& p = packages_.back();
      if (p.bf16_weights != packages_[0].bf16_weights)
        throw ConfigError("trainer.compiled_step: " + p.path + " takes other bf16 working copies than " +
                          packages_[0].path + ": the packages of one run must be compiled for the same ones");
      if (packages.size() > 1 && p.text_width < 0)
        throw ConfigError("trainer.compiled_step: " + p.path + " takes no text tokens, so it cannot be one of " +
                          "several packages chosen by text width");
      for (size_t j = 0; j + 1 < packages_.size(); ++j)
        if (packages_[j].text_width == p.text_width)
          throw std::logic_error("make_compiled_runner: two packages for the text width " +
                                 std::to_string(p.text_width));
    }
    if (packages_.size() > 1) {
      std::string each;
      for (const auto& p : packages_)
        each += (each.empty() ? "" : ", ") + std::to_string(p.text_width) + " tokens: " + p.path;
      LF_LOG(logger("fusion"), info) << "compiled step: a package per text width (" << each << ")";
    }
  }

  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    at::Tensor total;
    first_replayed_ = false;
    auto all = [&] {
      for (size_t i = 0; i < batches.size(); ++i) {
        const at::Tensor part =
            micro_step(batches[i].tensors, batches[i].draw_seed, weights[i], step, static_cast<int64_t>(i), phases);
        total = total.defined() ? total + part : part.clone();  // a replay rewrites `part` in place
      }
    };
#if LOONGFORGE_WITH_CUDA_KERNELS
    if (graphs_) {
      on_side_stream(*side_, all);
      return total;
    }
#endif
    all();
    return total;
  }

  std::vector<std::string> bf16_weights() const override { return packages_[0].bf16_weights; }

  nlohmann::json status() const override {
    nlohmann::json s = {{"compiled_step", packages_[0].path}, {"calls", calls_}, {"bf16_weights", bf16_weights().size()},
                        {"cuda_graphs", graphs_},    {"captures", captures_},   {"replays", replays_},
                        {"capture_failures", failures_}};
    if (packages_.size() > 1) {
      nlohmann::json each = nlohmann::json::array();
      for (const auto& p : packages_) each.push_back({{"path", p.path}, {"text_width", p.text_width}});
      s["packages"] = each;
    }
    return s;
  }

 private:
  // Reads and checks a package's manifest against the model, then loads its code.
  Package load(const std::string& package, c10::Device device) {
    Package pk;
    pk.path = package;
    const std::string rebuild = "rebuild it: python3 scripts/compile_step.py " + net_.info().path +
                                " --batch-size B --device " + std::string(device.is_cuda() ? "cuda" : "cpu") +
                                " --precision " + (bf16_ ? "bf16" : "fp32") + " --out " + package;
    nlohmann::json m;
    try {
      const auto meta = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(package, "model");
      const auto it = meta.find("loongforge");
      if (it == meta.end())
        throw ConfigError("trainer.compiled_step: " + package +
                          " is an AOTInductor package but not a LoongForge compiled step (no 'loongforge' "
                          "metadata); " + rebuild);
      m = nlohmann::json::parse(it->second);
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      throw ConfigError("trainer.compiled_step: cannot read " + package + ": " + short_libtorch_message(e.what()) +
                        "; " + rebuild);
    }
    auto mismatch = [&](const std::string& what) {
      throw ConfigError("trainer.compiled_step: " + package + " " + what + "; " + rebuild);
    };
    if (m.value("format", 0) != 1) mismatch("has manifest format " + std::to_string(m.value("format", 0)) + ", not 1");
    const std::string want_device = device.is_cuda() ? "cuda" : "cpu";
    if (m.value("device", "") != want_device)
      mismatch("was compiled for " + m.value("device", std::string("?")) + ", this run trains on " + want_device);
    const std::string want_precision = bf16_ ? "bf16" : "fp32";
    if (m.value("precision", "") != want_precision)
      mismatch("was compiled for precision " + m.value("precision", std::string("?")) + ", this run uses " +
               want_precision);
    if (m.value("model_hash", "") != net_.info().architecture_hash)
      mismatch("was compiled for model '" + m.value("model_name", std::string("?")) +
               "' with another architecture or freezing than " + net_.info().path);
    const std::string package_code = m.value("model_code", std::string());
    if (!package_code.empty() && !net_.info().code_hash.empty() && package_code != net_.info().code_hash)
      mismatch("was compiled from other model code than " + net_.info().path +
               " was exported with (scripts/model/ changed between the two)");
    if (package_code.empty() || net_.info().code_hash.empty())
      LF_LOG(logger("fusion"), warn) << "compiled step: cannot tell whether " << package << " and "
                                     << net_.info().path << " come from the same model code ("
                                     << (package_code.empty() ? "the package" : "the model file")
                                     << " predates that record); recompile the package if scripts/model/ changed";
    std::string torch_version = m.value("torch", "");
    torch_version = torch_version.substr(0, torch_version.find('+'));
    if (torch_version != TORCH_VERSION)
      mismatch("was compiled with torch " + torch_version + ", this trainer links libtorch " TORCH_VERSION);
    std::vector<std::string> trainable, frozen;
    for (const auto& p : net_.parameters()) (p.info->trainable ? trainable : frozen).push_back(p.info->name);
    if (m.value("trainable", std::vector<std::string>{}) != trainable ||
        m.value("frozen", std::vector<std::string>{}) != frozen)
      mismatch("lists other parameters than the model");
    // Trainable parameters the package takes as bf16 working copies (the optimizer makes them: optim::trainable_params).
    pk.bf16_weights = m.value("bf16_weights", std::vector<std::string>{});
    for (const auto& e : m.at("batch")) {
      pk.batch.push_back({e.at(0).get<std::string>(), dtype_named(e.at(1).get<std::string>(), package),
                          e.at(2).get<std::vector<int64_t>>()});
      if (pk.batch.back().key == "text_tokens" && pk.batch.back().shape.size() == 2)
        pk.text_width = pk.batch.back().shape[1];
    }
    // How the model's forward draws the keys it may be given (packages before "draws": n16.py's form).
    const nlohmann::json draws = m.value("draws", nlohmann::json::object());
    pk.fm_time_upstream = draws.value("fm_time", std::string("n16")) == "upstream";
    pk.noise_s = draws.value("noise_s", net_.info().config.value("noise_s", 0.999));
    pk.beta_alpha = draws.value("beta_alpha", net_.info().config.value("beta_alpha", 1.5));
    pk.state_dropout = draws.value("state_dropout", 0.0);
    try {
      pk.loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          package, "model", /*run_single_threaded=*/graphs_, /*num_runners=*/1,
          device.is_cuda() ? device.index() : c10::DeviceIndex(-1));
    } catch (const std::exception& e) {
      throw ConfigError("trainer.compiled_step: loading " + package + " failed: " + short_libtorch_message(e.what()) +
                        "; " + rebuild);
    }
    LF_LOG(logger("fusion"), info) << "compiled step: " << package << " (" << m.value("model_name", std::string("?"))
                                   << ", micro-batch "
                                   << (pk.batch.empty() || pk.batch[0].shape.empty() ? 0 : pk.batch[0].shape[0])
                                   << ", " << want_precision << (graphs_ ? ", replayed as a CUDA graph" : "") << ")";
    return pk;
  }

  // The package of the batch's text width (the only one when there is one: check_shapes refuses a mismatch).
  Package& package_for(const model::Batch& batch) {
    if (packages_.size() == 1) return packages_[0];
    const auto it = batch.find("text_tokens");
    const int64_t width = it != batch.end() && it->second.dim() == 2 ? it->second.size(1) : -1;
    for (auto& p : packages_)
      if (p.text_width == width) return p;
    std::string widths;
    for (const auto& p : packages_) widths += (widths.empty() ? "" : ", ") + std::to_string(p.text_width);
    throw DataError("trainer.compiled_step: a micro-batch's text slot is " + std::to_string(width) +
                    " tokens wide; the run's packages take " + widths + " (DMF's widths): the data changed " +
                    "under DMF's buckets, or the batch was not cut by DMF");
  }

  // One micro-batch: a replay of its package's captured call, or (warm-up, no
  // graphs, or a failed capture) a package call; shapes no package was
  // compiled for are refused (package_for, check_shapes).
  at::Tensor micro_step(const model::Batch& batch, uint64_t draw_seed, double w, int64_t step, int64_t micro,
                        PhaseRecorder& phases) {
    Package& pk = package_for(batch);
    check_shapes(pk, batch);  // a shape the package was not compiled for is refused, never run eagerly
    Phase p(phases, "forward_backward", step + 1, micro);
    fault_.maybe_raise("forward", step + 1);
    c10::NoGradGuard no_grad;
#if LOONGFORGE_WITH_CUDA_KERNELS
    // A later micro-batch's graph adds into the first graph's gradients: only
    // after a first graph was replayed for this step's first micro-batch.
    if (graphs_ && !capture_failed_ && calls_ >= kGraphWarmupCalls && (micro == 0 || first_replayed_)) {
      Package::Captured& c = micro == 0 ? pk.first : pk.accumulate;
      if (!c.graph) capture(pk, c, micro == 0, batch, step);
      if (c.graph) {
        for (auto& [key, t] : c.batch) t.copy_(batch.at(key), /*non_blocking=*/true);
        c.w32.fill_(w), c.w64.fill_(w);
        seed_draws(draw_seed, c.w32.device());  // the replay reads the generator's seed and offset
        c.graph->replay();
        ++replays_;
        if (micro == 0) {  // the first micro-batch's gradients are the graph's (Note [Several packages])
          for (size_t j = 0; j < trainable_.size(); ++j) trainable_[j].mutable_grad() = c.grads[j];
          first_replayed_ = true;
        }
        return c.part;
      }
    }
#endif
    ++calls_;
    seed_draws(draw_seed, batch.at("actions").device());
    const at::Tensor w32 = at::scalar_tensor(w, batch.at("actions").options().dtype(at::kFloat));
    std::vector<at::Tensor> out = pk.loader->run(inputs(pk, batch, w32));
#if LOONGFORGE_WITH_CUDA_KERNELS
    if (graphs_ && packages_.size() > 1 && shared_grads_.empty())  // outside any capture, as the package makes them
      for (size_t j = 0; j < trainable_.size(); ++j) shared_grads_.push_back(at::empty_like(out[2 + j]));
#endif
    for (size_t j = 0; j < trainable_.size(); ++j) {
      at::Tensor& g = trainable_[j].mutable_grad();
      if (!g.defined())
        g = std::move(out[2 + j]);
      else
        g.add_(out[2 + j]);
    }
    return out[0].to(at::kDouble) * w;
  }

#if LOONGFORGE_WITH_CUDA_KERNELS
  // Records one package call on static copies of the batch and of w (the
  // draws the batch lacks drawn inside, so each replay draws fresh ones from
  // the generator's graph-safe Philox offsets) and loss * w. first: with one
  // package its gradient outputs stay the graph's static outputs, which
  // become .grad after each replay (nothing is added or zeroed); with several
  // they are copied into the shared set, which becomes .grad (Note [Several
  // packages]). Otherwise they are added into the first graphs' gradients
  // (.grad after a first replay) in one multi-tensor add (a step of K
  // micro-batches: first, then K-1 times accumulate, in the plain runner's
  // order).
  void capture(Package& pk, Package::Captured& c, bool first, const model::Batch& batch, int64_t step) {
    for (const auto& e : pk.batch)
      if (auto it = batch.find(e.key); it != batch.end()) c.batch[e.key] = it->second.clone();
    c.w32 = at::zeros({}, batch.at("actions").options().dtype(at::kFloat));
    c.w64 = at::zeros({}, c.w32.options().dtype(at::kDouble));
    const bool shared = packages_.size() > 1;  // shared_grads_ made by the warm-up calls (micro_step)
    c.graph = capture_or_fallback(
        pool_,
        [&] {
          std::vector<at::Tensor> out = pk.loader->run(inputs(pk, c.batch, c.w32));
          const auto grads = at::TensorList(out).slice(2);
          if (first && !shared) {
            c.grads.assign(out.begin() + 2, out.end());
          } else if (first) {
            at::_foreach_copy_(shared_grads_, grads);
            c.grads = shared_grads_;
          } else {
            at::_foreach_add_(shared ? shared_grads_ : pk.first.grads, grads);
          }
          c.part = out[0].to(at::kDouble) * c.w64;
        },
        {"the compiled step", "it runs uncaptured", required_, step + 1, &failures_, ""});
    if (!c.graph) {
      capture_failed_ = true;
      for (auto& q : packages_) q.first = Package::Captured{}, q.accumulate = Package::Captured{};
      return;
    }
    ++captures_;
    LF_LOG(logger("fusion"), info) << "step " << step + 1 << ": captured the compiled step as a CUDA graph ("
                                   << (first ? "first micro-batch" : "accumulating micro-batches")
                                   << (shared ? ", text slot " + std::to_string(pk.text_width) : "") << ")";
  }
#endif

  // Throws DataError when the batch lacks the package's shapes and dtypes.
  void check_shapes(const Package& pk, const model::Batch& batch) const {
    const at::Tensor& actions = batch.at("actions");
    for (const auto& e : pk.batch) {
      at::ScalarType dtype;
      std::vector<int64_t> shape;
      if (auto it = batch.find(e.key); it != batch.end()) {
        dtype = it->second.scalar_type(), shape = it->second.sizes().vec();
      } else if (drawn_here(e.key)) {  // drawn in the package's shape, its batch dimension the batch's
        dtype = e.dtype, shape = e.shape;
        shape[0] = actions.size(0);
      } else {
        throw DataError("trainer.compiled_step: the batch has no '" + e.key + "', which " + pk.path +
                        " was compiled with");
      }
      if (dtype != e.dtype || shape != e.shape)
        throw DataError("trainer.compiled_step: batch tensor '" + e.key + "' is " + c10::toString(dtype) +
                        shape_text(shape) + ", " + pk.path + " takes " + c10::toString(e.dtype) +
                        shape_text(e.shape) + ": compile a package for this data's shapes (trainer.compiled_step=auto, "
                        "or scripts/compile_step.py with --batch-size and --action-horizon), or train with "
                        "trainer.compiled_step=off");
    }
  }

  // The keys the model's forward draws itself when the batch lacks them
  // (model/batch.py: fm_t, fm_noise; the GR00T head's head_draw_keys).
  static bool drawn_here(const std::string& key) {
    return key == "fm_t" || key == "fm_noise" || key == "state_drop" || key == "state_noise";
  }

  // The package's inputs for a matching batch: parameters, batch tensors, w.
  // The drawn keys the batch lacks are drawn here as the model's forward
  // would draw them: same ops, the default generator of the batch's device,
  // the forward's order (the manifest lists them in it; model/n16.py,
  // model/gr00t.py, model/gr00t_head.py), after the runner seeded it for this
  // micro-batch; the package then draws its dropout masks from it.
  std::vector<at::Tensor> inputs(const Package& pk, const model::Batch& batch, const at::Tensor& w32) {
    const at::Tensor& actions = batch.at("actions");
    const int64_t B = actions.size(0);
    std::vector<at::Tensor> in;
    in.reserve(trainable_.size() + frozen_.size() + pk.batch.size() + 1);
    for (const auto& t : trainable_) in.push_back(t);
    for (const auto& t : frozen_) in.push_back(t);
    for (const auto& e : pk.batch) {
      if (auto it = batch.find(e.key); it != batch.end()) {
        in.push_back(it->second);
      } else if (e.key == "fm_t") {  // u = rand([B]); b = u^(1/alpha)
        const at::Tensor b = at::rand({B}, actions.options()).pow(1.0 / pk.beta_alpha);
        in.push_back(pk.fm_time_upstream ? at::rsub(b, 1.0) * pk.noise_s : at::rsub(b, pk.noise_s) / pk.noise_s);
      } else if (e.key == "fm_noise") {
        in.push_back(at::randn_like(actions));
      } else if (e.key == "state_drop") {  // rand(B) < state_dropout, as 0/1
        in.push_back(at::rand({B}, actions.options().dtype(at::kFloat)).lt(pk.state_dropout).to(at::kFloat));
      } else {  // state_noise: randn_like(the state token (B, 1, w))
        in.push_back(at::randn({B, e.shape[1], e.shape[2]}, actions.options().dtype(at::kFloat)));
      }
    }
    in.push_back(w32);
    return in;
  }

  model::Model& net_;
  bool bf16_;
  Fault fault_;
  std::vector<Package> packages_;  // one per text width (Note [Several packages])
  std::vector<at::Tensor> trainable_, frozen_;
  int64_t calls_ = 0, captures_ = 0, replays_ = 0, failures_ = 0;
  bool graphs_ = false, required_ = false, capture_failed_ = false, first_replayed_ = false;
#if LOONGFORGE_WITH_CUDA_KERNELS
  std::optional<c10::cuda::CUDAStream> side_;
  at::cuda::MempoolId_t pool_;
  std::vector<at::Tensor> shared_grads_;  // several packages: the gradients every first graph copies into
#endif
};

}  // namespace

std::unique_ptr<StepRunner> make_compiled_runner(model::Model& net, const std::vector<std::string>& packages,
                                                 bool bf16_autocast, GraphMode graphs, c10::Device device,
                                                 const PackageReload& reload) {
  return std::make_unique<CompiledRunner>(net, packages, bf16_autocast, graphs, device, reload);
}

}  // namespace loongforge::fusion
