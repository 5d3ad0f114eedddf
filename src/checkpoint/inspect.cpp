// Finding, validating and comparing checkpoints (contract in checkpoint.hpp).
#include <dirent.h>    // opendir, readdir
#include <fcntl.h>     // open
#include <sys/stat.h>  // stat
#include <unistd.h>    // pread, close

#include <algorithm>  // std::sort, std::min
#include <atomic>     // std::atomic
#include <cerrno>     // errno
#include <cstdio>     // std::snprintf
#include <cstring>    // std::strerror
#include <fstream>    // std::ifstream
#include <iterator>   // std::istreambuf_iterator
#include <thread>     // std::thread
#include <vector>     // std::vector

#include <zlib.h>  // crc32_z

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

namespace {

// One piece of hashing work: a whole file (version 1 entries, text files) or one chunk.
struct HashTask {
  std::string path;
  uint64_t offset = 0, bytes = 0;
  bool crc = false;           // also the CRC-32 (a chunk of an unverified preemption save)
  std::string sha256, error;  // results
  uint32_t crc32 = 0;
};

// SHA-256 (and, when `crc` is given, the CRC-32) of `bytes` bytes of `path` at
// `offset`, read with pread 4 MiB at a time.
std::string hash_range(const std::string& path, uint64_t offset, uint64_t bytes, uint32_t* crc = nullptr) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(std::string("cannot read: ") + std::strerror(errno));
  static thread_local std::vector<char> buf(4u << 20);
  Sha256 sha;
  uLong c = ::crc32(0L, Z_NULL, 0);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), bytes - done),
                              static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      throw CheckpointError(err ? std::string("read error: ") + std::strerror(err) : std::string("shorter than it was"));
    }
    sha.update(buf.data(), static_cast<size_t>(n));
    if (crc) c = ::crc32_z(c, reinterpret_cast<const Bytef*>(buf.data()), static_cast<z_size_t>(n));
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  if (crc) *crc = static_cast<uint32_t>(c);
  return sha.hex();
}

// Runs every task on up to `threads` threads.
void run_hash_tasks(std::vector<HashTask>& tasks, int threads) {
  if (threads <= 0) threads = static_cast<int>(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  threads = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), tasks.size()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < tasks.size();) {
      try {
        tasks[i].sha256 = hash_range(tasks[i].path, tasks[i].offset, tasks[i].bytes,
                                     tasks[i].crc ? &tasks[i].crc32 : nullptr);
      } catch (const std::exception& e) {
        tasks[i].error = e.what();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
}

}  // namespace

Report validate_checkpoint(const std::string& dir, int threads) {
  Report r;
  r.dir = dir;
  const std::string manifest_path = dir + "/" + kManifest;
  try {
    r.manifest = read_manifest(manifest_path);
  } catch (const CheckpointError& e) {
    r.problems.push_back(e.what());
    return r;
  }
  const int version = r.manifest.format_version;
  if (version < kOldestFormatVersion || version > kNewestFormatVersion)
    r.problems.push_back(manifest_path + ": format_version " + std::to_string(version) + " is not one this " +
                         "LoongForge reads (" + std::to_string(kOldestFormatVersion) + " to " +
                         std::to_string(kNewestFormatVersion) + "; written by another LoongForge version)");
  for (const char* req : kRequired)
    if (!r.manifest.files.count(req)) r.problems.push_back(manifest_path + ": does not list " + std::string(req));

  // Sizes first (in the manifest's order), then every hash at once, then the verdicts in that order.
  struct Verdict {
    std::string problem;          // missing or wrong size: no hashing
    size_t first = 0, count = 0;  // its tasks
  };
  std::vector<HashTask> tasks;
  std::vector<Verdict> verdicts;
  for (const auto& [rel, entry] : r.manifest.files) {
    const std::string path = dir + "/" + rel;
    Verdict& v = verdicts.emplace_back();
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      v.problem = path + ": missing";
      continue;
    }
    const auto bytes = static_cast<uint64_t>(st.st_size);
    if (bytes != entry.bytes) {
      v.problem = path + ": " + std::to_string(bytes) + " bytes, the manifest says " + std::to_string(entry.bytes) +
                  " (truncated or replaced)";
      continue;
    }
    v.first = tasks.size();
    if (!entry.chunked()) {
      tasks.push_back({path, 0, bytes, false, "", "", 0});
    } else {
      for (uint64_t off = 0; off < bytes; off += entry.chunk_bytes)
        tasks.push_back({path, off, std::min(entry.chunk_bytes, bytes - off), entry.unverified(), "", "", 0});
    }
    v.count = tasks.size() - v.first;
  }
  run_hash_tasks(tasks, threads);

  size_t k = 0;
  for (const auto& [rel, entry] : r.manifest.files) {
    const Verdict& v = verdicts[k++];
    const std::string path = dir + "/" + rel;
    if (!v.problem.empty()) {
      r.problems.push_back(v.problem);
      continue;
    }
    std::vector<size_t> bad;
    std::string error;
    for (size_t i = 0; i < v.count; ++i) {
      const HashTask& t = tasks[v.first + i];
      if (!t.error.empty() && error.empty()) error = t.error;
      if (!t.error.empty()) continue;
      if (entry.unverified() ? t.crc32 != entry.chunk_crc32[i]
                             : t.sha256 != (entry.chunked() ? entry.chunk_sha256[i] : entry.sha256))
        bad.push_back(i);
    }
    const char* digest = entry.unverified() ? "CRC-32" : "SHA-256";
    if (!error.empty()) {
      r.problems.push_back(path + ": " + error);
    } else if (!bad.empty() && !entry.chunked()) {
      r.problems.push_back(path + ": SHA-256 differs from the manifest (corrupted, or the manifest is another run's)");
    } else if (!bad.empty()) {
      const uint64_t from = bad[0] * entry.chunk_bytes, to = std::min(from + entry.chunk_bytes, entry.bytes);
      r.problems.push_back(path + ": " + digest + " differs from the manifest in chunk " + std::to_string(bad[0]) + " of " +
                           std::to_string(v.count) + " (bytes " + std::to_string(from) + ".." + std::to_string(to) +
                           ")" + (bad.size() > 1 ? " and " + std::to_string(bad.size() - 1) + " more" : "") +
                           " (corrupted, or the manifest is another run's)" +
                           (entry.unverified() ? "; an unverified preemption save" : ""));
    } else if (entry.unverified()) {  // Note [Preemption saves]: the SHA-256s for seal_checkpoint()
      FileEntry sealed = entry;
      sealed.chunk_crc32.clear();
      for (size_t i = 0; i < v.count; ++i) sealed.chunk_sha256.push_back(tasks[v.first + i].sha256);
      r.sealed[rel] = std::move(sealed);
    }
  }
  if (!r.ok()) r.sealed.clear();
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
