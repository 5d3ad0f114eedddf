// Loading the exported TorchScript model, checking its metadata, running it.
// Everything that touches torch::jit lives in this file and mdg.cpp.
#include "loongforge/common/sha256.hpp"
#include "loongforge/model/model.hpp"

#include <chrono>    // std::chrono::steady_clock
#include <fstream>   // std::ifstream
#include <optional>  // std::optional

#include <torch/csrc/jit/runtime/graph_executor.h>  // torch::jit::setGraphExecutorOptimize
#include <torch/script.h>                            // torch::jit::load, torch::jit::Module

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/ops/ops.hpp"
#include "model_impl.hpp"
#include "loongforge/model/staged_load.hpp"

namespace loongforge::model {

namespace {

constexpr const char* kExtraFiles[] = {"loongforge/config.json", "loongforge/params.json", "loongforge/flops.json",
                                       "loongforge/counts.json", "loongforge/batch_spec.json"};

ParamRole parse_role(const std::string& s, const std::string& path, const std::string& param) {
  if (s == "vision") return ParamRole::Vision;
  if (s == "llm") return ParamRole::Llm;
  if (s == "action") return ParamRole::Action;
  if (s == "embodiment") return ParamRole::Embodiment;
  if (s == "small") return ParamRole::Small;
  throw ModelError(path + ": params.json: parameter '" + param + "' has unknown role '" + s +
                   "' (expected vision, llm, action, embodiment or small): re-export with scripts/model/export.py");
}

nlohmann::json parse_json(const std::string& text, const std::string& path, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(path + ": extra file " + file + " is not valid JSON (" + e.what() +
                     "): re-export with scripts/model/export.py");
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

const char* role_name(ParamRole role) {
  switch (role) {
    case ParamRole::Vision: return "vision";
    case ParamRole::Llm: return "llm";
    case ParamRole::Action: return "action";
    case ParamRole::Embodiment: return "embodiment";
    case ParamRole::Small: return "small";
  }
  return "?";
}


Model::Model(std::unique_ptr<Impl> impl, ModelInfo info) : impl_(std::move(impl)), info_(std::move(info)) {}
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

Model Model::load(const std::string& path, c10::Device device) {
  if (!std::ifstream(path).good()) {
    throw ModelError("cannot read model file '" + path +
                     "': export one with `scripts/model/export.py --config n16-tiny --out " + path + "`");
  }
  torch::jit::setGraphExecutorOptimize(false);  // see the contract in model.hpp
  ops::ensure_registered();  // model files may call loongforge:: operators (category_linear)
  torch::jit::ExtraFilesMap extra;
  for (const char* name : kExtraFiles) extra[name] = "";
  extra["loongforge/code.json"] = "";  // optional: files exported before it existed lack it
  auto impl = std::make_unique<Impl>();
  try {
    // Onto a GPU the records pass through one reused pinned buffer (Note [Staged model load]).
    std::optional<StagedLoad> staged;
    if (device.is_cuda()) staged.emplace(path);
    const auto t0 = std::chrono::steady_clock::now();
    impl->module = torch::jit::load(path, device, extra);
    if (staged) {
      const StagedLoad::Counts c = staged->counts();
      LF_LOG(logger("model"), info)
          << "model load: " << c.staged << " records through a pinned staging buffer of " << (c.slab_bytes >> 20)
          << " MiB (allocated in " << static_cast<int>(c.slab_s * 1000) << " ms), " << c.passed
          << " allocations by the CPU allocator, "
          << static_cast<int>(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1000)
          << " ms";
    }
  } catch (const c10::Error& e) {
    throw ModelError("cannot load model file '" + path + "' as TorchScript: " + e.what_without_backtrace() +
                     " (was it written by scripts/model/export.py with a compatible torch?)");
  }
  for (const char* name : kExtraFiles) {
    if (extra[name].empty()) {
      throw ModelError(path + ": extra file '" + std::string(name) +
                       "' is missing: this file was not written by scripts/model/export.py; re-export it");
    }
  }

  ModelInfo info;
  info.path = path;
  info.config = parse_json(extra["loongforge/config.json"], path, "config.json");
  info.architecture_hash =
      sha256_hex(extra["loongforge/config.json"] + std::string(1, '\0') + extra["loongforge/params.json"]);
  info.batch_spec = parse_json(extra["loongforge/batch_spec.json"], path, "batch_spec.json");
  if (!extra["loongforge/code.json"].empty())
    info.code_hash = parse_json(extra["loongforge/code.json"], path, "code.json").value("sha256", std::string());
  const auto flops = parse_json(extra["loongforge/flops.json"], path, "flops.json");
  const auto counts = parse_json(extra["loongforge/counts.json"], path, "counts.json");
  const auto params = parse_json(extra["loongforge/params.json"], path, "params.json");
  try {
    info.name = info.config.value("name", std::string("unnamed"));
    info.forward_flops_per_sample = flops.at("forward_per_sample").get<double>();
    info.backward_flops_per_sample = flops.at("backward_per_sample").get<double>();
    if (const auto shape = flops.value("batch_shape", nlohmann::json::object()); shape.is_object()) {
      info.vl_tokens_per_sample = shape.value("S_vl", int64_t{0});
      info.text_slot = shape.value("L", int64_t{0});
    }
    if (flops.contains("by_text_len"))
      for (const auto& fb : flops.at("by_text_len")) info.flops_by_text_len.push_back(fb.at(0).get<double>() + fb.at(1).get<double>());
    info.text_slot_cut = info.batch_spec.value("text_slot_cut", false);
    info.total_params = counts.at("total").get<int64_t>();
    info.trainable_params = counts.at("trainable").get<int64_t>();
    for (const auto& p : params) {
      ParamInfo pi;
      pi.name = p.at("name").get<std::string>();
      pi.shape = p.at("shape").get<std::vector<int64_t>>();
      pi.numel = p.at("numel").get<int64_t>();
      pi.role = parse_role(p.at("role").get<std::string>(), path, pi.name);
      pi.trainable = p.at("trainable").get<bool>();
      if (!p.contains("decay"))
        throw ModelError(path + ": params.json: parameter '" + pi.name +
                         "' has no \"decay\" flag (exported by an older scripts/model): re-export with "
                         "scripts/model/export.py");
      pi.decay = p.at("decay").get<bool>();
      info.params.push_back(std::move(pi));
    }
  } catch (const nlohmann::json::exception& e) {
    throw ModelError(path + ": model metadata is incomplete (" + std::string(e.what()) +
                     "): re-export with scripts/model/export.py");
  }

  // The module's parameters must be exactly params.json, in order.
  std::map<std::string, at::Tensor> by_name;
  for (const auto& np : impl->module.named_parameters(/*recurse=*/true)) by_name.emplace(np.name, np.value);
  std::string problems;
  int64_t total = 0, trainable = 0;
  for (const auto& p : info.params) {
    auto it = by_name.find(p.name);
    if (it == by_name.end()) {
      problems += "\n  params.json names '" + p.name + "' but the module has no such parameter";
      continue;
    }
    const std::vector<int64_t> actual(it->second.sizes().begin(), it->second.sizes().end());
    if (actual != p.shape)
      problems += "\n  '" + p.name + "': params.json says " + shape_text(p.shape) + ", module has " + shape_text(actual);
    total += p.numel;
    trainable += p.trainable ? p.numel : 0;
    impl->params.push_back(it->second);
    by_name.erase(it);
  }
  for (const auto& extra_param : by_name) problems += "\n  module parameter '" + extra_param.first + "' is not in params.json";
  if (total != info.total_params || trainable != info.trainable_params)
    problems += "\n  counts.json (total " + std::to_string(info.total_params) + ", trainable " +
                std::to_string(info.trainable_params) + ") disagrees with params.json (" + std::to_string(total) +
                ", " + std::to_string(trainable) + ")";
  if (!problems.empty()) throw ModelError(path + ": metadata does not match the module:" + problems);

  for (size_t i = 0; i < info.params.size(); ++i) impl->params[i].set_requires_grad(info.params[i].trainable);
  LF_LOG(logger("model"), info) << "loaded " << path << " (" << info.name << "): " << total / 1e6 << "M params, "
                                << trainable / 1e6 << "M trainable, "
                                << (info.forward_flops_per_sample + info.backward_flops_per_sample) / 1e9
                                << " GFLOP/sample fwd+bwd";
  return Model(std::move(impl), std::move(info));
}

std::vector<NamedParameter> Model::parameters() const {
  std::vector<NamedParameter> out;
  for (size_t i = 0; i < info_.params.size(); ++i) out.push_back({&info_.params[i], impl_->params[i]});
  return out;
}

std::vector<at::Tensor> Model::trainable_parameters() const {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < info_.params.size(); ++i)
    if (info_.params[i].trainable) out.push_back(impl_->params[i]);
  return out;
}

void Model::train(bool on) { impl_->module.train(on); }

void Model::cast_frozen(c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < info_.params.size(); ++i)
    if (!info_.params[i].trainable) impl_->params[i].set_data(impl_->params[i].to(dtype));
}

std::map<std::string, at::Tensor> Model::forward(const Batch& batch) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& kv : batch) dict.insert(kv.first, kv.second);
  c10::IValue result;
  try {
    result = impl_->module.forward({c10::IValue(dict)});
  } catch (const c10::Error& e) {
    throw ModelError(info_.path + ": forward failed: " + e.what_without_backtrace());
  }
  if (!result.isGenericDict())
    throw ModelError(info_.path + ": forward must return Dict[str, Tensor] (docs/architecture.md s1), got " +
                     result.tagKind());
  std::map<std::string, at::Tensor> out;
  for (const auto& kv : result.toGenericDict()) out.emplace(kv.key().toStringRef(), kv.value().toTensor());
  for (const char* key : {"loss", "num_valid"})
    if (!out.count(key))
      throw ModelError(info_.path + ": forward's result has no '" + std::string(key) +
                       "' (model contract, docs/architecture.md s1)");
  return out;
}

}  // namespace loongforge::model
