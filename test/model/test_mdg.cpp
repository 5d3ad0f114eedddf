// Proves the module dependency graph (Note [MDG] in src/model/mdg.cpp): for a
// small scripted module built here, every parameter's first use in the
// inlined forward graph (through submodule calls and an if/else), its
// backward readiness position (reverse of first use, unused parameters last)
// and its role from the module names are exactly the known ones; for the
// exported n16-tiny the order follows GR00T's forward (vision, LM,
// embodiment encoders, DiT, action decoder) and the decoder is ready first;
// a parameter is linear-only exactly when every read of it is aten::linear's
// weight or bias (a second linear read keeps it so; layer_norm, a transpose,
// a dtype read or no read at all do not).
#include <filesystem>  // std::filesystem::temp_directory_path
#include <map>         // std::map
#include <string>      // std::string

#include <torch/script.h>  // torch::jit::Module

#include "catch_compat.hpp"
#include "loongforge/model/model.hpp"

using namespace loongforge::model;

namespace {

torch::jit::Module leaf(const std::string& type, const std::map<std::string, at::Tensor>& params,
                        const std::string& forward) {
  torch::jit::Module m(type);
  for (const auto& [name, t] : params) m.register_parameter(name, t, /*is_buffer=*/false);
  m.define(forward);
  return m;
}

std::map<std::string, MdgParam> by_name(const Mdg& g) {
  std::map<std::string, MdgParam> out;
  for (const auto& p : g.params) out[p.name] = p;
  return out;
}

}  // namespace

TEST_CASE("model: the MDG of a known small module gives its first-use and readiness order and roles") {
  const auto w = [] { return at::ones({4, 4}).requires_grad_(true); };
  torch::jit::Module net("Net");
  net.register_parameter("scale", at::ones({4}).requires_grad_(true), false);
  net.register_parameter("spare", at::ones({4}).requires_grad_(true), false);  // never read by forward
  net.register_module("state_encoder", leaf("Enc", {{"weight", w()}}, "def forward(self, x):\n  return x.mm(self.weight)\n"));
  // b is read before a; both branches read b.
  net.register_module("dit", leaf("Dit", {{"a", w()}, {"b", w()}},
                                  "def forward(self, x):\n"
                                  "  if bool(x.sum() > 0.0):\n    y = x.mm(self.b)\n"
                                  "  else:\n    y = x.mm(self.b) * 2.0\n"
                                  "  return y.mm(self.a)\n"));
  net.register_module("action_decoder", leaf("Dec", {{"weight", w()}}, "def forward(self, x):\n  return x.mm(self.weight)\n"));
  net.define(
      "def forward(self, x):\n"
      "  h = self.state_encoder.forward(x * self.scale)\n"
      "  return self.action_decoder.forward(self.dit.forward(h)).sum()\n");
  const std::string path = (std::filesystem::temp_directory_path() / "loongforge_test_mdg.pt").string();
  net.save(path);
  const Mdg g = dependency_graph_of_file(path);
  std::filesystem::remove(path);

  REQUIRE(g.params.size() == 6);
  REQUIRE(g.graph_nodes > 0);
  auto p = by_name(g);
  REQUIRE(p.at("scale").first_use == 0);
  REQUIRE(p.at("state_encoder.weight").first_use == 1);
  REQUIRE(p.at("dit.b").first_use == 2);
  REQUIRE(p.at("dit.a").first_use == 3);
  REQUIRE(p.at("action_decoder.weight").first_use == 4);
  REQUIRE(p.at("spare").first_use == -1);
  REQUIRE(p.at("action_decoder.weight").ready == 0);
  REQUIRE(p.at("dit.a").ready == 1);
  REQUIRE(p.at("dit.b").ready == 2);
  REQUIRE(p.at("state_encoder.weight").ready == 3);
  REQUIRE(p.at("scale").ready == 4);
  REQUIRE(p.at("spare").ready == 5);
  REQUIRE(p.at("state_encoder.weight").role == "encoder");
  REQUIRE(p.at("dit.a").role == "dit");
  REQUIRE(p.at("action_decoder.weight").role == "decoder");
  REQUIRE(p.at("scale").role == "other");
  REQUIRE(p.at("dit.a").module == "dit");
  const auto j = g.to_json();
  for (const auto& q : g.params) REQUIRE_FALSE(q.linear_only);  // mm and mul, never aten::linear
  REQUIRE(j.at("format") == "loongforge-mdg/1");
  REQUIRE(j.at("modules").at("children").size() == 3);
}

TEST_CASE("model: the MDG marks a parameter linear-only when every read of it is a linear layer's weight or bias") {
  const auto t = [](std::vector<int64_t> shape) { return at::ones(shape).requires_grad_(true); };
  torch::jit::Module net("Net");
  // fc: read twice, both times by aten::linear; norm.weight: by layer_norm; head.weight: by linear and by
  // a transpose (tied); gate.weight: by linear once and its dtype read once; unused: never read.
  net.register_module("fc", leaf("Fc", {{"weight", t({4, 4})}, {"bias", t({4})}},
                                 "def forward(self, x):\n"
                                 "  return torch.linear(torch.linear(x, self.weight, self.bias), self.weight, self.bias)\n"));
  net.register_module("norm", leaf("Norm", {{"weight", t({4})}},
                                   "def forward(self, x):\n  return torch.layer_norm(x, [4], self.weight)\n"));
  net.register_module("head", leaf("Head", {{"weight", t({4, 4})}},
                                   "def forward(self, x):\n"
                                   "  return torch.linear(x, self.weight) + x.mm(self.weight.t())\n"));
  net.register_module("gate", leaf("Gate", {{"weight", t({4, 4})}, {"unused", t({4})}},
                                   "def forward(self, x):\n"
                                   "  return torch.linear(x.to(self.weight.dtype), self.weight)\n"));
  net.define(
      "def forward(self, x):\n"
      "  return self.gate.forward(self.head.forward(self.norm.forward(self.fc.forward(x)))).sum()\n");
  const std::string path = (std::filesystem::temp_directory_path() / "loongforge_test_mdg_linear.pt").string();
  net.save(path);
  const Mdg g = dependency_graph_of_file(path);
  std::filesystem::remove(path);
  auto p = by_name(g);
  REQUIRE(p.at("fc.weight").linear_only);
  REQUIRE(p.at("fc.bias").linear_only);
  REQUIRE_FALSE(p.at("norm.weight").linear_only);
  REQUIRE_FALSE(p.at("head.weight").linear_only);
  REQUIRE_FALSE(p.at("gate.weight").linear_only);
  REQUIRE_FALSE(p.at("gate.unused").linear_only);
  REQUIRE(g.to_json().at("params").at(0).contains("linear_only"));
}

TEST_CASE("model: the MDG of n16-tiny follows GR00T's forward and readies the action decoder first") {
  const Model m = Model::load(std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", c10::kCPU);
  const Mdg g = m.dependency_graph();
  REQUIRE(g.params.size() == m.info().params.size());
  for (const auto& p : g.params) REQUIRE(p.first_use >= 0);  // n16-tiny has no disabled encoder
  // first use and readiness of the first parameter of each stage, in forward order
  const std::vector<std::pair<std::string, std::string>> stages = {
      {"vision.", "backbone"},         {"llm.", "backbone"},           {"embodiment.state_encoder.", "encoder"},
      {"embodiment.action_encoder.", "encoder"}, {"action_head.blocks.", "dit"}, {"embodiment.action_decoder.", "decoder"}};
  std::vector<int64_t> first, ready;
  for (const auto& [prefix, role] : stages) {
    CAPTURE(prefix);
    int64_t f = -1, r = -1;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const MdgParam& p = g.params[i];
      if (p.name.rfind(prefix, 0) != 0) continue;
      CAPTURE(p.name);
      REQUIRE(p.name == m.info().params[i].name);
      REQUIRE(p.role == role);
      REQUIRE(p.first_use >= 0);
      if (f < 0 || p.first_use < f) f = p.first_use;
      if (r < 0 || p.ready > r) r = p.ready;  // the stage's last-ready parameter
    }
    REQUIRE(f >= 0);
    first.push_back(f), ready.push_back(r);
  }
  for (size_t k = 1; k < stages.size(); ++k) {
    CAPTURE(stages[k].first);
    REQUIRE(first[k - 1] < first[k]);
    REQUIRE(ready[k - 1] > ready[k]);
  }
  // The DiT's blocks: block 1 is read after block 0, so ready before it.
  auto p = by_name(g);
  REQUIRE(p.at("action_head.blocks.1.attn.q.weight").first_use > p.at("action_head.blocks.0.attn.q.weight").first_use);
  REQUIRE(p.at("action_head.blocks.1.attn.q.weight").ready < p.at("action_head.blocks.0.attn.q.weight").ready);
  // The DiT's projections are read only by linear layers; its norms and the per-embodiment slots are not.
  int64_t linear = 0;
  for (const auto& q : g.params) linear += q.linear_only ? 1 : 0;
  INFO(linear << " of " << g.params.size() << " parameters linear-only");
  REQUIRE(p.at("action_head.blocks.0.attn.q.weight").linear_only);
  for (const auto& q : g.params) {
    CAPTURE(q.name);
    const bool norm_weight = q.name.find("norm") != std::string::npos && q.name.find(".linear.") == std::string::npos;
    if (q.name.find("embodiment.") == 0 || norm_weight) REQUIRE_FALSE(q.linear_only);
  }
  REQUIRE(linear > 0);
}
