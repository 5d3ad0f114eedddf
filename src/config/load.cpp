// YAML loading and --set overrides. Every problem is collected with its
// location and reported together (see config.hpp's contract).
#include <fstream>   // std::ifstream
#include <set>       // std::set
#include <sstream>   // std::stringstream

#include <yaml-cpp/yaml.h>  // YAML::Load, YAML::Node, YAML::Mark

#include "internal.hpp"
#include "loongforge/common/error.hpp"

namespace loongforge::config {

namespace {

using detail::Value;

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& s : sections()) out.push_back(s.name);
  return out;
}

std::vector<std::string> all_paths() {
  std::vector<std::string> out;
  for (const auto& k : schema()) out.push_back(k.path);
  return out;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> out;
  for (const auto& k : schema())
    if (k.section == section) out.push_back(k.name);
  return out;
}

// "did you mean 'trainer.lr'?" against the section's keys first, then all paths.
std::string suggestion_for(const std::string& section, const std::string& key) {
  std::string best = detail::did_you_mean(key, keys_of(section));
  if (!best.empty()) return " (did you mean '" + section + "." + best + "'?)";
  // The key may live in another section ("trainer.comm_strategy").
  for (const auto& k : schema())
    if (k.name == key) return " (did you mean '" + k.path + "'?)";
  best = detail::did_you_mean(section + "." + key, all_paths());
  if (!best.empty()) return " (did you mean '" + best + "'?)";
  std::string list;
  for (const auto& k : keys_of(section)) list += (list.empty() ? "" : ", ") + k;
  return "; keys of section '" + section + "': " + list;
}

std::string kind_of(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: return "a mapping";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Null: return "nothing";
    default: return "a scalar";
  }
}

class Loader {
 public:
  explicit Loader(std::string file) : file_(std::move(file)) {}

  std::string where(const YAML::Mark& m) const { return file_ + ":" + std::to_string(m.line + 1); }

  void load_text(const std::string& text, Config* cfg) {
    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      errors_.push_back(file_ + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                        ": YAML syntax error: " + e.msg);
      return;
    }
    if (root.IsNull()) return;  // an empty file means all defaults
    if (!root.IsMap()) {
      errors_.push_back(where(root.Mark()) + ": the top level must be a mapping of sections (" +
                        join(section_names()) + "), got " + kind_of(root));
      return;
    }
    std::map<std::string, int> seen_sections;
    for (const auto& sec : root) {
      const std::string name = sec.first.Scalar();
      const int line = sec.first.Mark().line + 1;
      if (!seen_sections.emplace(name, line).second) {
        errors_.push_back(where(sec.first.Mark()) + ": duplicate section '" + name + "' (first at line " +
                          std::to_string(seen_sections[name]) + ")");
        continue;
      }
      bool known = false;
      for (const auto& s : sections()) known = known || s.name == name;
      if (!known) {
        const std::string best = detail::did_you_mean(name, section_names());
        errors_.push_back(where(sec.first.Mark()) + ": unknown section '" + name + "'" +
                          (best.empty() ? "; sections are: " + join(section_names())
                                        : " (did you mean '" + best + "'?)"));
        continue;
      }
      if (sec.second.IsNull()) continue;  // "gcts:" with nothing under it
      if (!sec.second.IsMap()) {
        errors_.push_back(where(sec.first.Mark()) + ": section '" + name + "' must be a mapping of keys, got " +
                          kind_of(sec.second));
        continue;
      }
      load_section(name, sec.second, cfg);
    }
  }

  void apply_override(const std::string& assignment, Config* cfg) {
    const auto eq = assignment.find('=');
    const std::string path = eq == std::string::npos ? assignment : assignment.substr(0, eq);
    const auto dot = path.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot == 0 || dot + 1 == path.size()) {
      errors_.push_back("--set '" + assignment + "': expected section.key=value (e.g. trainer.max_steps=200)");
      return;
    }
    const auto* access = detail::find_access(path);
    if (!access) {
      const std::string best = detail::did_you_mean(path, all_paths());
      errors_.push_back("--set: unknown key '" + path + "'" + (best.empty() ? "" : " (did you mean '" + best + "'?)"));
      return;
    }
    set_value(*access, assignment.substr(eq + 1), true, "--set", cfg);
  }

  std::vector<std::string>& errors() { return errors_; }

 private:
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }

  void load_section(const std::string& section, const YAML::Node& map, Config* cfg) {
    std::map<std::string, int> seen;
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      const std::string path = section + "." + key;
      const std::string at = where(kv.first.Mark());
      const int line = kv.first.Mark().line + 1;
      if (!seen.emplace(key, line).second) {
        errors_.push_back(at + ": duplicate key '" + path + "' (first set at line " + std::to_string(seen[key]) + ")");
        continue;
      }
      const auto* access = detail::find_access(path);
      if (!access) {
        errors_.push_back(at + ": unknown key '" + path + "'" + suggestion_for(section, key));
        continue;
      }
      const YAML::Node& v = kv.second;
      if (v.IsNull()) {
        errors_.push_back(at + ": " + path + ": has no value: write " + detail::allowed_text(*access->def));
        continue;
      }
      if (!v.IsScalar()) {
        errors_.push_back(at + ": " + path + ": expected " + detail::allowed_text(*access->def) + ", got " +
                          kind_of(v));
        continue;
      }
      // yaml-cpp tags plain scalars "?" and quoted ones "!".
      set_value(*access, v.Scalar(), v.Tag() != "!", at, cfg);
    }
  }

  void set_value(const detail::KeyAccess& access, const std::string& text, bool plain, const std::string& at,
                 Config* cfg) {
    Value value;
    std::string why;
    if (!detail::parse_value(*access.def, text, plain, &value, &why)) {
      errors_.push_back(at + ": " + why);
      return;
    }
    access.set(*cfg, value);
    cfg->origin[access.def->path] = at;
  }

  std::string file_;
  std::vector<std::string> errors_;
};

Config finish(Loader& loader, Config cfg, const std::vector<std::string>& overrides, const ValidationContext& ctx) {
  for (const auto& o : overrides) loader.apply_override(o, &cfg);
  cfg.built_engines = ctx.built_engines;
  if (loader.errors().empty()) detail::derive(&cfg, ctx, &loader.errors());
  if (loader.errors().empty()) detail::validate(cfg, ctx, &loader.errors());
  if (!loader.errors().empty()) {
    std::string msg = loader.errors().size() == 1 ? "invalid configuration:\n"
                                                   : std::to_string(loader.errors().size()) +
                                                         " problems in the configuration:\n";
    for (const auto& e : loader.errors()) msg += "  " + e + "\n";
    msg += "Run `loongforge-train --print-config` to see every key, its allowed values and its default.";
    throw ConfigError(msg);
  }
  return cfg;
}

}  // namespace

Config parse_config_text(const std::string& yaml_text, const std::string& display_name,
                         const std::vector<std::string>& overrides, const ValidationContext& ctx) {
  Loader loader(display_name);
  Config cfg;
  loader.load_text(yaml_text, &cfg);
  return finish(loader, std::move(cfg), overrides, ctx);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const ValidationContext& ctx) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError("cannot read config file '" + path +
                      "': check the path (configs/n16.yaml is the documented example)");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config_text(text.str(), path, overrides, ctx);
}

Config default_config(const std::vector<std::string>& overrides, const ValidationContext& ctx) {
  Loader loader("defaults");
  return finish(loader, Config{}, overrides, ctx);
}

}  // namespace loongforge::config
