// Finding, validating and comparing checkpoints (contract in checkpoint.hpp).
#include <dirent.h>  // opendir, readdir

#include <algorithm>  // std::sort
#include <cstdio>     // std::snprintf
#include <fstream>    // std::ifstream
#include <iterator>   // std::istreambuf_iterator

#include "io.hpp"  // kReplacedSuffix
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"

namespace loongforge::checkpoint {

int64_t detail::step_of(const std::string& name) {
  long long epoch = 0, step = 0;
  int consumed = 0;
  if (std::sscanf(name.c_str(), "epoch_%lld_step_%lld%n", &epoch, &step, &consumed) != 2 ||
      consumed != static_cast<int>(name.size()))
    return -1;
  return step;
}

namespace {

using detail::step_of;

constexpr const char* kRequired[] = {"model.safetensors", "trainer_state.json", "scheduler.json"};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Note [Manifest messages]
// A damaged MANIFEST.json holds arbitrary bytes, and nlohmann's parse errors
// quote the bytes they stopped at ("last read: '...'"): put in a log line or
// a terminal, they are binary garbage (escape sequences included). Every
// message about a manifest therefore quotes it only through printable():
// printable ASCII kept, anything else as \xNN, at most kExcerptBytes.
constexpr size_t kExcerptBytes = 48;

std::string printable(const std::string& bytes, size_t max = std::string::npos) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  if (bytes.size() > max) out += "...";
  return out;
}

}  // namespace

Manifest read_manifest(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": missing (an incomplete or foreign directory; never loaded)");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {  // Note [Manifest messages]: never e.what()
    throw CheckpointError(path + ": corrupt (not valid JSON: " + std::to_string(text.size()) +
                          " bytes, the parse fails at byte " + std::to_string(e.byte) + "; they begin \"" +
                          printable(text, kExcerptBytes) + "\"); a checkpoint without a valid manifest is never "
                          "loaded: pick another checkpoint");
  }
  try {
    return Manifest::from_json(j);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": unreadable (" + printable(e.what(), 200) +
                          "); a checkpoint without a valid manifest is never loaded: pick another checkpoint");
  }
}

Report validate_checkpoint(const std::string& dir) {
  Report r;
  r.dir = dir;
  const std::string manifest_path = dir + "/" + kManifest;
  try {
    r.manifest = read_manifest(manifest_path);
  } catch (const CheckpointError& e) {
    r.problems.push_back(e.what());
    return r;
  }
  if (r.manifest.format_version != kFormatVersion)
    r.problems.push_back(manifest_path + ": format_version " + std::to_string(r.manifest.format_version) +
                         " is not " + std::to_string(kFormatVersion) + " (written by another LoongForge version)");
  for (const char* req : kRequired)
    if (!r.manifest.files.count(req)) r.problems.push_back(manifest_path + ": does not list " + std::string(req));
  for (const auto& [rel, entry] : r.manifest.files) {
    const std::string path = dir + "/" + rel;
    if (!path_exists(path)) {
      r.problems.push_back(path + ": missing");
      continue;
    }
    uint64_t bytes = 0;
    std::string hash;
    try {
      hash = sha256_file(path, &bytes);
    } catch (const std::exception& e) {
      r.problems.push_back(path + ": " + e.what());
      continue;
    }
    if (bytes != entry.bytes)
      r.problems.push_back(path + ": " + std::to_string(bytes) + " bytes, the manifest says " +
                           std::to_string(entry.bytes) + " (truncated or replaced)");
    else if (hash != entry.sha256)
      r.problems.push_back(path + ": SHA-256 differs from the manifest (corrupted, or the manifest is another run's)");
  }
  return r;
}

std::vector<std::string> list_checkpoints(const std::string& parent) {
  std::vector<std::pair<int64_t, std::string>> found;
  DIR* d = ::opendir(parent.c_str());
  if (!d) return {};
  const std::string suffix = detail::kReplacedSuffix;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    int64_t step = step_of(name);
    if (step < 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      // Note [Replacing a checkpoint]: the old copy stands in while the new one is not in place.
      const std::string base = name.substr(0, name.size() - suffix.size());
      if (!path_exists(parent + "/" + base)) step = step_of(base);
    }
    if (step >= 0 && is_directory(parent + "/" + name)) found.emplace_back(step, parent + "/" + name);
  }
  ::closedir(d);
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string find_latest(const std::string& parent, std::vector<std::string>* rejected) {
  for (const auto& dir : list_checkpoints(parent)) {
    const Report r = validate_checkpoint(dir);
    if (r.ok()) return dir;
    if (rejected) rejected->push_back(dir + ": " + r.problems.front());
  }
  return "";
}

std::vector<std::string> compare_parameters(const std::string& dir,
                                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& model) {
  std::vector<std::string> diffs;
  std::map<std::string, std::vector<int64_t>> saved;
  for (auto& h : read_safetensors_header(dir + "/model.safetensors")) saved[h.name] = h.shape;
  for (const auto& [name, shape] : model) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      diffs.push_back("parameter '" + name + "' is in the model but not in the checkpoint");
    } else {
      if (it->second != shape)
        diffs.push_back("parameter '" + name + "': checkpoint " + shape_text(it->second) + ", model " +
                        shape_text(shape));
      saved.erase(it);
    }
  }
  for (const auto& [name, shape] : saved) diffs.push_back("parameter '" + name + "' is in the checkpoint but not in the model");
  return diffs;
}

}  // namespace loongforge::checkpoint
