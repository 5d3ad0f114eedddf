// Proves the model room: an exported n16-tiny file loads with its extra files,
// its metadata matches the module, forward+backward runs on the CPU, gradients
// land on exactly the parameters the freezing config marks trainable, the
// weight-decay flags come from params.json (a 2-D per-embodiment bias and
// norm weights do not decay, weights do), and bad model files (one without
// decay flags included) are refused with messages naming the file.
#include <fstream>  // std::ofstream
#include <map>      // std::map
#include <set>      // std::set

#include <torch/torch.h>  // torch::manual_seed

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/model/model.hpp"

using namespace loongforge;
using namespace loongforge::model;
using lf_catch::Contains;

namespace {
const std::string kTiny = std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt";
}

TEST_CASE("model: the exported n16-tiny file loads with its config, roles, counts and FLOPs") {
  const Model m = Model::load(kTiny, c10::kCPU);
  const ModelInfo& info = m.info();
  REQUIRE(info.name == "n16-tiny");
  REQUIRE(info.config.at("vit_layers").get<int>() == 2);
  REQUIRE(info.total_params > 1'000'000);
  REQUIRE(info.total_params < 10'000'000);
  REQUIRE(info.trainable_params > 0);
  REQUIRE(info.trainable_params < info.total_params);  // the ViT is frozen by default
  REQUIRE(info.forward_flops_per_sample > 0);
  REQUIRE(info.backward_flops_per_sample > 0);
  std::set<ParamRole> roles;
  for (const auto& p : info.params) roles.insert(p.role);
  REQUIRE(roles.count(ParamRole::Vision) == 1);
  REQUIRE(roles.count(ParamRole::Llm) == 1);
  REQUIRE(roles.count(ParamRole::Action) == 1);
  REQUIRE(roles.count(ParamRole::Embodiment) == 1);
}

TEST_CASE("model: forward and backward on the CPU put gradients on exactly the trainable parameters") {
  Model m = Model::load(kTiny, c10::kCPU);
  m.train();
  const Batch batch = make_example_batch(m.info(), 2, 7);
  auto out = m.forward(batch);
  const auto loss = out.at("loss");
  REQUIRE(loss.dim() == 0);
  REQUIRE(std::isfinite(loss.item<double>()));
  REQUIRE(out.at("num_valid").item<double>() == batch.at("action_mask").sum().item<double>());
  loss.backward();
  int64_t with_grad = 0, trainable = 0;
  for (const auto& p : m.parameters()) {
    INFO(p.info->name);
    const bool has_grad = p.tensor.grad().defined() && p.tensor.grad().abs().sum().item<double>() > 0;
    if (p.info->trainable) {
      ++trainable;
      REQUIRE(p.tensor.requires_grad());
      // Every trainable tensor is reachable from the loss (embodiment slots not
      // in the batch get an all-zero gradient, which is still a gradient).
      REQUIRE(p.tensor.grad().defined());
      with_grad += has_grad;
    } else {
      REQUIRE_FALSE(p.tensor.requires_grad());
      REQUIRE_FALSE(p.tensor.grad().defined());
    }
  }
  REQUIRE(trainable == static_cast<int64_t>(m.trainable_parameters().size()));
  REQUIRE(with_grad > trainable / 2);
}

TEST_CASE("model: the same batch gives the same loss (fm_t and fm_noise come from the batch)") {
  Model m = Model::load(kTiny, c10::kCPU);
  const Batch batch = make_example_batch(m.info(), 2, 11);
  const double a = m.forward(batch).at("loss").item<double>();
  const double b = m.forward(batch).at("loss").item<double>();
  REQUIRE(a == b);
}

TEST_CASE("model: a missing model file says how to export one") {
  REQUIRE_THROWS_WITH(Model::load("/nonexistent/model.pt", c10::kCPU),
                      Contains("cannot read model file '/nonexistent/model.pt': export one with"));
}

TEST_CASE("model: params.json decay flags: weights decay, biases (2-D ones too) and norm weights do not") {
  const Model m = Model::load(kTiny, c10::kCPU);
  std::map<std::string, const ParamInfo*> by_name;
  for (const auto& p : m.info().params) by_name[p.name] = &p;
  const ParamInfo& bias = *by_name.at("embodiment.state_encoder.layer1.bias");      // (E, out)
  const ParamInfo& weight = *by_name.at("embodiment.state_encoder.layer1.weight");  // (E, in, out)
  REQUIRE(bias.shape.size() == 2);
  REQUIRE_FALSE(bias.decay);
  REQUIRE(weight.shape.size() == 3);
  REQUIRE(weight.decay);
  REQUIRE_FALSE(by_name.at("action_head.vl_norm.weight")->decay);  // LayerNorm
  REQUIRE_FALSE(by_name.at("llm.norm.weight")->decay);             // RMSNorm
}

TEST_CASE("model: a file whose params.json has no decay flags is refused: re-export") {
  const std::string path = std::string(LOONGFORGE_TEST_MODELS) + "/no-decay.pt";
  torch::jit::ExtraFilesMap extra = {{"loongforge/config.json", ""},
                                     {"loongforge/params.json", ""},
                                     {"loongforge/flops.json", ""},
                                     {"loongforge/counts.json", ""},
                                     {"loongforge/batch_spec.json", ""}};
  torch::jit::Module module = torch::jit::load(kTiny, c10::kCPU, extra);
  auto params = nlohmann::json::parse(extra.at("loongforge/params.json"));
  for (auto& p : params) p.erase("decay");
  extra["loongforge/params.json"] = params.dump();
  module.save(path, extra);
  REQUIRE_THROWS_WITH(Model::load(path, c10::kCPU),
                      Contains(path + ": params.json: parameter 'vision.pos_embed' has no \"decay\" flag") &&
                          Contains("re-export with scripts/model/export.py"));
}

TEST_CASE("model: a file that is not TorchScript is refused with its path") {
  const std::string path = std::string(LOONGFORGE_TEST_MODELS) + "/garbage.pt";
  std::ofstream(path) << "this is not a zip archive";
  REQUIRE_THROWS_WITH(Model::load(path, c10::kCPU), Contains("cannot load model file '" + path + "' as TorchScript"));
}

TEST_CASE("model: a TorchScript file without LoongForge metadata is refused") {
  const std::string path = std::string(LOONGFORGE_TEST_MODELS) + "/plain.pt";
  torch::jit::Module plain("Plain");
  plain.register_parameter("w", torch::zeros({2}), false);
  plain.save(path);
  REQUIRE_THROWS_WITH(Model::load(path, c10::kCPU),
                      Contains("extra file 'loongforge/config.json' is missing: this file was not written by "
                               "scripts/model/export.py"));
}
