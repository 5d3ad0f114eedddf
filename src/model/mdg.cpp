// The module dependency graph (model.hpp: Mdg).
//
// Note [MDG]
// The forward method's graph is copied and inlined (torch::jit::Inline,
// repeated until no call is left: every submodule call and scripted function
// becomes part of one graph, and
// ModuleList loops are already unrolled by the scripting compiler into
// attribute reads "blocks.0", "blocks.1", ...). Walking its nodes in order,
// including the blocks of If/Loop nodes, each prim::GetAttr on a value whose
// module path is known gives the path of its result (prim::unchecked_cast,
// the refinement of an Optional submodule, keeps it); the first read of a
// parameter's path is its first use. Backward readiness is the reverse: the
// parameter read last in forward is final first. A parameter the forward
// never reads (a disabled encoder's, reached another way) comes after every
// used one, in definition order: it may get no gradient at all. Roles come
// from the names (mdg_role); `embodiment` in the path marks the
// per-embodiment slot modules whatever their role. A parameter whose every
// read is the weight or bias argument of aten::linear is `linear_only`: under
// CUDA bf16 autocast those reads are all cast to bf16, so a bf16 working copy
// gives the forward and its gradient the same numbers (precision.bf16_weights).
#include <algorithm>      // std::sort
#include <map>            // std::map
#include <unordered_map>  // std::unordered_map

#include <torch/csrc/jit/passes/inliner.h>  // torch::jit::Inline
#include <torch/script.h>                   // torch::jit::load

#include "loongforge/common/error.hpp"
#include "model_impl.hpp"

namespace loongforge::model {

namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> out;
  size_t a = 0;
  while (a <= path.size() && !path.empty()) {
    const size_t b = std::min(path.find('.', a), path.size());
    out.push_back(path.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }
bool has(const std::string& s, const char* p) { return s.find(p) != std::string::npos; }

std::string component_role(const std::string& c) {
  if (has(c, "decoder")) return "decoder";
  if (has(c, "encoder")) return "encoder";
  if (starts_with(c, "embodiment")) return "embodiment";
  if (c == "action_head" || starts_with(c, "dit")) return "dit";
  if (c == "vision" || starts_with(c, "vit") || c == "llm" || starts_with(c, "language") ||
      starts_with(c, "backbone") || c == "connector")
    return "backbone";
  return "";
}

std::string parent_of(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

bool has_calls(torch::jit::Block* block) {
  for (torch::jit::Node* n : block->nodes()) {
    if (n->kind() == c10::prim::CallMethod || n->kind() == c10::prim::CallFunction) return true;
    for (torch::jit::Block* b : n->blocks())
      if (has_calls(b)) return true;
  }
  return false;
}

// Every use of `v` is aten::linear's weight (argument 1) or bias (argument 2).
bool only_linear_reads(const torch::jit::Value* v) {
  static const c10::Symbol linear = c10::Symbol::fromQualString("aten::linear");
  for (const torch::jit::Use& u : v->uses())
    if (u.user->kind() != linear || (u.offset != 1 && u.offset != 2)) return false;
  return true;
}

// First reads of every path in `block`, in order (Note [MDG]); clears
// linear_only of a parameter read any other way.
void walk(torch::jit::Block* block, std::unordered_map<const torch::jit::Value*, std::string>& paths,
          const std::map<std::string, size_t>& param_index, std::vector<int64_t>& first_use,
          std::vector<bool>& linear_only, int64_t& uses, int64_t& nodes) {
  for (torch::jit::Node* n : block->nodes()) {
    ++nodes;
    if (n->kind() == c10::prim::GetAttr) {
      const auto it = paths.find(n->input(0));
      if (it != paths.end()) {
        const std::string p = (it->second.empty() ? "" : it->second + ".") + n->s(c10::attr::name);
        paths[n->output()] = p;
        const auto pi = param_index.find(p);
        if (pi != param_index.end()) {
          if (first_use[pi->second] < 0) first_use[pi->second] = uses++;
          if (!only_linear_reads(n->output())) linear_only[pi->second] = false;
        }
      }
    } else if (n->kind() == c10::prim::unchecked_cast && n->inputs().size() == 1) {
      const auto it = paths.find(n->input(0));
      if (it != paths.end()) paths[n->output()] = it->second;
    }
    for (torch::jit::Block* b : n->blocks()) walk(b, paths, param_index, first_use, linear_only, uses, nodes);
  }
}

nlohmann::json module_tree(const torch::jit::Module& m, const std::string& name, const std::string& path) {
  int64_t direct = 0;
  for (const auto& p : m.named_parameters(/*recurse=*/false)) (void)p, ++direct;
  nlohmann::json children = nlohmann::json::array();
  for (const auto& c : m.named_children())
    children.push_back(module_tree(c.value, c.name, path.empty() ? c.name : path + "." + c.name));
  return {{"name", name}, {"path", path}, {"role", mdg_role(path)}, {"params", direct}, {"children", children}};
}

Mdg build(const torch::jit::Module& module, const std::vector<std::string>& names, const std::string& what) {
  Mdg g;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) index[names[i]] = i;
  std::vector<int64_t> first(names.size(), -1);
  std::vector<bool> linear_only(names.size(), true);
  try {
    auto graph = module.get_method("forward").graph()->copy();
    // One Inline pass leaves the calls inside inlined bodies when the graph
    // executor's optimization is off (Model::load turns it off): repeat.
    for (int pass = 0; pass < 256 && has_calls(graph->block()); ++pass) torch::jit::Inline(*graph);
    std::unordered_map<const torch::jit::Value*, std::string> paths = {{graph->inputs()[0], ""}};
    int64_t uses = 0;
    walk(graph->block(), paths, index, first, linear_only, uses, g.graph_nodes);
  } catch (const std::exception& e) {
    throw ModelError(what + ": cannot build the module dependency graph from its forward graph: " + e.what());
  }
  // Readiness: used parameters by descending first use, then unused ones in definition order.
  std::vector<size_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if ((first[a] < 0) != (first[b] < 0)) return first[a] >= 0;
    return first[a] > first[b];
  });
  g.params.resize(names.size());
  for (size_t k = 0; k < order.size(); ++k) g.params[order[k]].ready = static_cast<int64_t>(k);
  for (size_t i = 0; i < names.size(); ++i) {
    MdgParam& p = g.params[i];
    p.name = names[i];
    p.module = parent_of(names[i]);
    p.role = mdg_role(p.module);
    p.first_use = first[i];
    p.linear_only = first[i] >= 0 && linear_only[i];
  }
  g.modules = module_tree(module, "", "");
  return g;
}

}  // namespace

std::string mdg_role(const std::string& module_path) {
  const auto parts = split_path(module_path);
  for (size_t k = parts.size(); k-- > 0;)
    if (const std::string r = component_role(parts[k]); !r.empty()) return r;
  return "other";
}

nlohmann::json Mdg::to_json() const {
  nlohmann::json ps = nlohmann::json::array();
  for (const auto& p : params)
    ps.push_back({{"name", p.name},
                  {"module", p.module},
                  {"role", p.role},
                  {"embodiment_slots", has(p.module, "embodiment")},
                  {"first_use", p.first_use},
                  {"linear_only", p.linear_only},
                  {"ready", p.ready}});
  return {{"format", "loongforge-mdg/1"}, {"graph_nodes", graph_nodes}, {"params", ps}, {"modules", modules}};
}

Mdg Model::dependency_graph() const {
  std::vector<std::string> names;
  for (const auto& p : info_.params) names.push_back(p.name);
  return build(impl_->module, names, info_.path);
}

Mdg dependency_graph_of_file(const std::string& path) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, c10::kCPU);
  } catch (const std::exception& e) {
    throw ModelError(path + ": not a loadable TorchScript file: " + e.what());
  }
  std::vector<std::string> names;
  for (const auto& p : m.named_parameters(/*recurse=*/true)) names.push_back(p.name);
  return build(m, names, path);
}

}  // namespace loongforge::model
