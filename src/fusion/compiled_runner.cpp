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
// plain runner's order. The flow-matching time and noise are inputs too:
// they are drawn here with the same ops, generator and order as the model's
// forward draws them, so the random stream is the plain runner's. The
// package's manifest (its "loongforge" metadata) is checked against the
// model before the package's code is loaded.
#include <string>   // std::string
#include <utility>  // std::move
#include <vector>   // std::vector

#include <ATen/ATen.h>  // at::rand, at::randn_like
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

class CompiledRunner final : public StepRunner {
 public:
  CompiledRunner(model::Model& net, const std::string& package, bool bf16, c10::Device device)
      : net_(net), package_(package), bf16_(bf16) {
    const std::string rebuild = "rebuild it: python3 scripts/compile_step.py " + net.info().path +
                                " --batch-size B --device " + std::string(device.is_cuda() ? "cuda" : "cpu") +
                                " --precision " + (bf16 ? "bf16" : "fp32") + " --out " + package;
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
    const std::string want_precision = bf16 ? "bf16" : "fp32";
    if (m.value("precision", "") != want_precision)
      mismatch("was compiled for precision " + m.value("precision", std::string("?")) + ", this run uses " +
               want_precision);
    if (m.value("model_hash", "") != net.info().architecture_hash)
      mismatch("was compiled for model '" + m.value("model_name", std::string("?")) +
               "' with another architecture or freezing than " + net.info().path);
    std::string torch_version = m.value("torch", "");
    torch_version = torch_version.substr(0, torch_version.find('+'));
    if (torch_version != TORCH_VERSION)
      mismatch("was compiled with torch " + torch_version + ", this trainer links libtorch " TORCH_VERSION);
    std::vector<std::string> trainable, frozen;
    for (const auto& p : net.parameters()) {
      (p.info->trainable ? trainable : frozen).push_back(p.info->name);
      (p.info->trainable ? trainable_ : frozen_).push_back(p.tensor);
    }
    if (m.value("trainable", std::vector<std::string>{}) != trainable ||
        m.value("frozen", std::vector<std::string>{}) != frozen)
      mismatch("lists other parameters than the model");
    for (const auto& e : m.at("batch"))
      batch_.push_back({e.at(0).get<std::string>(), dtype_named(e.at(1).get<std::string>(), package),
                        e.at(2).get<std::vector<int64_t>>()});
    noise_s_ = net.info().config.value("noise_s", 0.999);
    beta_alpha_ = net.info().config.value("beta_alpha", 1.5);
    try {
      loader_ = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
          package, "model", /*run_single_threaded=*/false, /*num_runners=*/1,
          device.is_cuda() ? device.index() : c10::DeviceIndex(-1));
    } catch (const std::exception& e) {
      throw ConfigError("trainer.compiled_step: loading " + package + " failed: " + short_libtorch_message(e.what()) +
                        "; " + rebuild);
    }
    LF_LOG(logger("fusion"), info) << "compiled step: " << package << " (" << m.value("model_name", std::string("?"))
                                   << ", micro-batch " << (batch_.empty() || batch_[0].shape.empty() ? 0 : batch_[0].shape[0])
                                   << ", " << want_precision << ")";
  }

  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    at::Tensor total;
    for (size_t i = 0; i < batches.size(); ++i) {
      const model::Batch& batch = batches[i].tensors;
      at::Tensor part;
      std::vector<at::Tensor> inputs;
      if (!inputs_for(batch, weights[i], inputs)) {
        ++fallbacks_;  // a shape the package was not compiled for (e.g. a smaller last batch)
        part = eager_micro_step(net_, bf16_, fault_, batch, weights[i], step, static_cast<int64_t>(i), phases);
      } else {
        Phase p(phases, "forward_backward", step + 1, static_cast<int64_t>(i));
        fault_.maybe_raise("forward", step + 1);
        c10::NoGradGuard no_grad;
        std::vector<at::Tensor> out = loader_->run(inputs);
        ++calls_;
        for (size_t j = 0; j < trainable_.size(); ++j) {
          at::Tensor& g = trainable_[j].mutable_grad();
          if (!g.defined())
            g = std::move(out[2 + j]);
          else
            g.add_(out[2 + j]);
        }
        part = out[0].to(at::kDouble) * weights[i];
      }
      total = total.defined() ? total + part : part;
    }
    return total;
  }

  nlohmann::json status() const override {
    return {{"compiled_step", package_}, {"calls", calls_}, {"eager_fallbacks", fallbacks_}};
  }

 private:
  // The package's inputs for this micro-batch; false (and nothing drawn)
  // when its shapes or dtypes are not the compiled ones. Draws fm_t and
  // fm_noise when the batch lacks them, exactly as the model's forward would
  // (model/n16.py), after every check, so an eager fallback draws them itself.
  bool inputs_for(const model::Batch& batch, double w, std::vector<at::Tensor>& inputs) {
    const at::Tensor& actions = batch.at("actions");
    for (const auto& e : batch_) {
      at::ScalarType dtype;
      std::vector<int64_t> shape;
      if (auto it = batch.find(e.key); it != batch.end()) {
        dtype = it->second.scalar_type(), shape = it->second.sizes().vec();
      } else if (e.key == "fm_t" || e.key == "fm_noise") {
        dtype = actions.scalar_type();
        shape = e.key == "fm_t" ? std::vector<int64_t>{actions.size(0)} : actions.sizes().vec();
      } else {
        throw DataError("trainer.compiled_step: the batch has no '" + e.key + "', which " + package_ +
                        " was compiled with");
      }
      if (dtype != e.dtype || shape != e.shape) {
        if (!warned_)
          LF_LOG(logger("fusion"), warn)
              << "compiled step: batch tensor '" << e.key << "' is " << c10::toString(dtype) << shape_text(shape)
              << ", the package takes " << c10::toString(e.dtype) << shape_text(e.shape)
              << "; such micro-batches run eagerly (counted in status as eager_fallbacks)";
        warned_ = true;
        return false;
      }
    }
    at::Tensor fm_t, fm_noise;
    if (!batch.count("fm_t") || !batch.count("fm_noise")) {
      // model/n16.py: u = rand([B]); t = (s - u^(1/alpha)) / s unless fm_t is given; then noise = randn_like(actions)
      if (auto it = batch.find("fm_t"); it != batch.end()) {
        fm_t = it->second;
      } else {
        const at::Tensor u = at::rand({actions.size(0)}, actions.options());
        fm_t = at::rsub(u.pow(1.0 / beta_alpha_), noise_s_) / noise_s_;
      }
      auto it = batch.find("fm_noise");
      fm_noise = it != batch.end() ? it->second : at::randn_like(actions);
    }
    inputs.reserve(trainable_.size() + frozen_.size() + batch_.size() + 1);
    for (const auto& t : trainable_) inputs.push_back(t);
    for (const auto& t : frozen_) inputs.push_back(t);
    for (const auto& e : batch_) {
      if (auto it = batch.find(e.key); it != batch.end())
        inputs.push_back(it->second);
      else
        inputs.push_back(e.key == "fm_t" ? fm_t : fm_noise);
    }
    inputs.push_back(at::scalar_tensor(w, actions.options().dtype(at::kFloat)));
    return true;
  }

  model::Model& net_;
  std::string package_;
  bool bf16_;
  Fault fault_;
  std::vector<BatchEntry> batch_;
  std::vector<at::Tensor> trainable_, frozen_;
  double noise_s_ = 0.999, beta_alpha_ = 1.5;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader_;
  int64_t calls_ = 0, fallbacks_ = 0;
  bool warned_ = false;
};

}  // namespace

std::unique_ptr<StepRunner> make_compiled_runner(model::Model& net, const std::string& package, bool bf16_autocast,
                                                 c10::Device device) {
  return std::make_unique<CompiledRunner>(net, package, bf16_autocast, device);
}

}  // namespace loongforge::fusion
