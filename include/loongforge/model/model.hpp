// loongforge/model/model.hpp — the exported TorchScript model and its metadata.
//
// Contract:
//  - Owns: the loaded module (torch::jit stays inside this room so that
//    another loader can replace TorchScript later) and the metadata written by
//    scripts/model/export.py as extra files: loongforge/config.json,
//    params.json, flops.json, counts.json, batch_spec.json.
//  - Model contract (docs/architecture.md s1): forward(batch) returns at least "loss"
//    (scalar mean over valid action elements) and "num_valid" (their count).
//  - Weight decay comes from params.json too ("decay" per parameter, decided
//    by scripts/model/registry.py); a file without it is refused (re-export).
//  - Freezing comes from params.json: load() sets requires_grad on exactly the
//    parameters marked trainable, so every trainer sees the export's freezing.
//  - load() checks that params.json names, shapes and counts match the module
//    and throws ModelError naming the file and the first mismatches.
//  - TorchScript's graph-executor optimization is switched off process-wide
//    on load: autocast around a scripted forward needs it (docs/architecture.md s9), and
//    without it every op runs its eager kernel and eager autograd formula, so
//    the C++ trainer matches the eager reference trainer bit for bit.
//  - Not thread-safe: one trainer thread owns a Model.
//
// Example:
//   auto m = Model::load("build/models/n16-tiny.pt", at::kCPU);
//   Batch b = make_example_batch(m.info(), /*batch_size=*/2, /*seed=*/0);
//   auto out = m.forward(b);
//   out.at("loss").backward();
#pragma once

#include <cstdint>  // int64_t
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>    // at::Tensor
#include <c10/core/Device.h>     // c10::Device
#include <nlohmann/json.hpp>     // nlohmann::json

namespace loongforge::model {

using Batch = std::map<std::string, at::Tensor>;

enum class ParamRole { Vision, Llm, Action, Embodiment, Small };
const char* role_name(ParamRole role);

struct ParamInfo {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel = 0;
  ParamRole role = ParamRole::Small;
  bool trainable = false;
  bool decay = false;  // takes weight decay (params.json "decay": dim >= 2, not a bias, not a norm weight)
};

struct ModelInfo {
  std::string path;
  std::string name;              // "n16-tiny", ...
  nlohmann::json config;         // loongforge/config.json
  nlohmann::json batch_spec;     // loongforge/batch_spec.json
  std::string architecture_hash; // SHA-256 of config.json, a NUL byte and params.json as stored (scripts/compile_step.py)
  std::string code_hash;         // loongforge/code.json's sha256 (the model code that wrote the file); "" in older files
  std::vector<ParamInfo> params; // named_parameters() order
  // The vision-language sequence of one sample (flops.json batch_shape S_vl) and its text slot (L), padded to
  // max_text_len; 0 in files without them.
  int64_t vl_tokens_per_sample = 0, text_slot = 0;
  double forward_flops_per_sample = 0;
  double backward_flops_per_sample = 0;
  // flops.json by_text_len: forward + backward per sample with the text slot cut to l tokens, l = 0 .. L;
  // empty in files without it. text_slot_cut: batch_spec.json's (the result does not depend on L beyond the
  // longest text); false in files without it.
  std::vector<double> flops_by_text_len;
  bool text_slot_cut = false;
  int64_t total_params = 0;
  int64_t trainable_params = 0;
};

// The module dependency graph (MDG) of a TorchScript module (GCTS,
// docs/architecture.md s4): its submodule tree, and for every parameter the
// submodule that owns it, a role taken from the submodule names, and its
// first use in the inlined forward graph, and whether only linear layers read
// it (Note [MDG] in src/model/mdg.cpp).
// Backward readiness order is the reverse of first use: a gradient is final
// once backward has passed the parameter's earliest use.
struct MdgParam {
  std::string name;    // "action_head.blocks.0.attn.q.weight"
  std::string module;  // owning submodule path ("" for the root)
  std::string role;    // backbone | encoder | dit | decoder | embodiment | other
  int64_t first_use = -1;  // order of first use in the forward graph; -1: never read there
  int64_t ready = 0;       // backward readiness position (0 = final first); unused ones last
  bool linear_only = false;  // read, and every read is aten::linear's weight or bias (Note [MDG])
};

struct Mdg {
  std::vector<MdgParam> params;  // in the module's named_parameters() order
  nlohmann::json modules;        // {name, role, params: n, children: [...]} from the root
  int64_t graph_nodes = 0;       // nodes of the inlined forward graph walked
  nlohmann::json to_json() const;
};

// The role of a submodule path, from its names (first match from the leaf:
// "*decoder*" decoder, "*encoder*" encoder, "embodiment*" embodiment,
// "action_head"/"dit*" dit, "vision"/"vit*"/"llm"/"language*"/"backbone*"/
// "connector" backbone; else other).
std::string mdg_role(const std::string& module_path);

// The MDG of a TorchScript file (any scripted module with a forward), for
// tools and tests; Model::dependency_graph() is the same for a loaded model.
Mdg dependency_graph_of_file(const std::string& path);

struct NamedParameter {
  const ParamInfo* info;
  at::Tensor tensor;
};

class Model {
 public:
  static Model load(const std::string& path, c10::Device device);
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  const ModelInfo& info() const { return info_; }
  std::vector<NamedParameter> parameters() const;  // all, in params.json order
  std::vector<at::Tensor> trainable_parameters() const;

  void train(bool on = true);
  // The MDG of the loaded module (parameters in params.json order).
  Mdg dependency_graph() const;
  // Casts frozen (non-trainable) parameters to `dtype` (bf16 mode keeps
  // trainable weights fp32 and frozen ones bf16, docs/architecture.md s1).
  void cast_frozen(c10::ScalarType dtype);
  // Runs forward; throws ModelError if the result lacks "loss" or "num_valid".
  std::map<std::string, at::Tensor> forward(const Batch& batch);

 private:
  struct Impl;
  Model(std::unique_ptr<Impl> impl, ModelInfo info);
  std::unique_ptr<Impl> impl_;
  ModelInfo info_;
};

// A well-formed random batch for this model, shapes from batch_spec.json
// (deterministic in `seed`); for tests, warm-up and benchmarks.
Batch make_example_batch(const ModelInfo& info, int64_t batch_size, uint64_t seed);

}  // namespace loongforge::model
