// The engine record's status view (engine.hpp).
#include "loongforge/common/engine.hpp"

#include <stdexcept>  // std::logic_error

namespace loongforge {

nlohmann::json Engine::status_json() const {
  nlohmann::json j = {{"built", built}, {"enabled", enabled}};
  if (!built)
    j["state"] = "not in this build (arrives with " + arrives_with + "): plain path";
  else if (!enabled)
    j["state"] = "off (" + name + ".enable=false): plain path";
  else
    j["state"] = "on";
  if (on() && status) j.update(status());
  return j;
}

std::set<std::string> built_engine_names(const std::vector<Engine>& engines) {
  std::set<std::string> names;
  for (const auto& e : engines)
    if (e.built) names.insert(e.name);
  return names;
}

Engine& find_engine(std::vector<Engine>& engines, const std::string& name) {
  for (auto& e : engines)
    if (e.name == name) return e;
  throw std::logic_error("no engine record named '" + name + "'");
}

}  // namespace loongforge
