// data.path: one dataset folder or a mixture file (loongforge/data/mixture.hpp).
#include "loongforge/data/mixture.hpp"

#include <filesystem>  // std::filesystem::path, weakly_canonical
#include <fstream>     // std::ifstream
#include <set>         // std::set

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/error.hpp"

namespace loongforge::data {

std::vector<DataPart> Mixture::parts() const {
  std::vector<DataPart> out;
  for (size_t k = 0; k < datasets.size(); ++k) out.push_back({datasets[k].get(), embodiment_ids[k]});
  return out;
}

int64_t Mixture::episodes() const {
  int64_t n = 0;
  for (const auto& d : datasets) n += static_cast<int64_t>(d->episodes().size());
  return n;
}

int64_t Mixture::total_rows() const {
  int64_t n = 0;
  for (const auto& d : datasets) n += d->total_rows();
  return n;
}

bool is_mixture_file(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

Mixture open_data(const std::string& path, int64_t embodiment_id) {
  Mixture mix;
  mix.path = path;
  if (!is_mixture_file(path)) {
    mix.datasets.push_back(std::make_unique<Dataset>(Dataset::open(path)));
    mix.embodiment_ids.push_back(embodiment_id);
    return mix;
  }
  mix.from_file = true;
  const std::string usage =
      R"( (a mixture file is {"datasets": [{"path": "a.lf", "embodiment_id": 0}, ...]}; relative paths are read from its folder))";
  std::ifstream in(path);
  if (!in) throw DataError("data.path " + path + ": cannot read the mixture file" + usage);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw DataError("data.path " + path + ": not valid JSON (" + e.what() + ")" + usage);
  }
  if (!j.is_object() || !j.contains("datasets") || !j.at("datasets").is_array() || j.at("datasets").empty())
    throw DataError("data.path " + path + ": no \"datasets\" list, or an empty one" + usage);
  for (const auto& [key, value] : j.items())
    if (key != "datasets") throw DataError("data.path " + path + ": unknown key \"" + key + "\"" + usage);
  const std::filesystem::path base = std::filesystem::path(path).parent_path();
  std::set<std::string> seen;
  size_t k = 0;
  for (const auto& entry : j.at("datasets")) {
    const std::string where = "data.path " + path + ": datasets[" + std::to_string(k++) + "]";
    if (!entry.is_object()) throw DataError(where + " is not an object" + usage);
    for (const auto& [key, value] : entry.items())
      if (key != "path" && key != "embodiment_id")
        throw DataError(where + ": unknown key \"" + key + "\" (path and embodiment_id are read)" + usage);
    if (!entry.contains("path") || !entry.at("path").is_string() || entry.at("path").get<std::string>().empty())
      throw DataError(where + ": no \"path\" (a dataset folder written by scripts/convert_lerobot.py)" + usage);
    if (!entry.contains("embodiment_id") || !entry.at("embodiment_id").is_number_integer())
      throw DataError(where + ": no integer \"embodiment_id\" (the embodiment slot of its samples, 0..31)" + usage);
    const int64_t id = entry.at("embodiment_id").get<int64_t>();
    if (id < 0 || id > 31) throw DataError(where + ": embodiment_id " + std::to_string(id) + " is outside 0..31");
    std::filesystem::path p = entry.at("path").get<std::string>();
    if (p.is_relative()) p = base / p;
    std::string canonical = std::filesystem::weakly_canonical(p).lexically_normal().string();
    while (canonical.size() > 1 && canonical.back() == '/') canonical.pop_back();
    if (!seen.insert(canonical).second)
      throw DataError(where + ": the dataset " + p.string() + " is listed twice; list each dataset once");
    try {
      mix.datasets.push_back(std::make_unique<Dataset>(Dataset::open(p.string())));
    } catch (const DataError& e) {
      throw DataError(where + ": " + e.what());
    }
    mix.embodiment_ids.push_back(id);
  }
  return mix;
}

}  // namespace loongforge::data
