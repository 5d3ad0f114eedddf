// Atomic checkpoint directories, the manifest, keep_last, and the background
// writer thread (contract in checkpoint.hpp).
#include <dirent.h>   // opendir
#include <signal.h>   // kill
#include <unistd.h>   // getpid

#include <cerrno>   // errno
#include <cstdlib>  // std::atol

#include <chrono>   // std::chrono::steady_clock
#include <cstdio>   // std::snprintf
#include <fstream>  // std::ifstream
#include <functional>  // std::function
#include <thread>   // std::this_thread

#include "io.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/common/threads.hpp"

namespace loongforge::checkpoint {

nlohmann::json Manifest::to_json() const {
  nlohmann::json files_json = nlohmann::json::object();
  for (const auto& [path, f] : files) files_json[path] = {{"bytes", f.bytes}, {"sha256", f.sha256}};
  return {{"format", "loongforge-checkpoint"},
          {"format_version", format_version},
          {"run_id", run_id},
          {"step", step},
          {"epoch", epoch},
          {"world_size", world_size},
          {"config_hash", config_hash},
          {"model_hash", model_hash},
          {"loongforge_version", loongforge_version},
          {"config", config},
          {"files", files_json}};
}

Manifest Manifest::from_json(const nlohmann::json& j) {
  if (j.at("format").get<std::string>() != "loongforge-checkpoint")
    throw nlohmann::json::other_error::create(501, "format is not loongforge-checkpoint", &j);
  Manifest m;
  m.format_version = j.at("format_version").get<int>();
  m.run_id = j.at("run_id").get<std::string>();
  m.step = j.at("step").get<int64_t>();
  m.epoch = j.at("epoch").get<int64_t>();
  m.world_size = j.at("world_size").get<int64_t>();
  m.config_hash = j.at("config_hash").get<std::string>();
  m.model_hash = j.at("model_hash").get<std::string>();
  m.loongforge_version = j.value("loongforge_version", "");
  m.config = j.at("config");
  for (const auto& [path, f] : j.at("files").items())
    m.files[path] = FileEntry{f.at("bytes").get<uint64_t>(), f.at("sha256").get<std::string>()};
  return m;
}

// ---------------------------------------------------------------------------
// Publishing

// Note [Replacing a checkpoint]
// A resumed run that redoes step S writes epoch_E_step_S again. The new
// directory takes the old one's place without a moment where neither is at
// the final path, for a reader (find_latest in another process) and across a
// crash:
//  1. Linux renameat2(RENAME_EXCHANGE) swaps the complete temporary and the
//     old directory in one step; the old one, now under the temporary's name,
//     is then removed. A crash in between leaves a temporary of a dead
//     process, removed at the next start (recover_interrupted_writes).
//  2. Where the file system refuses the exchange, the old directory is renamed
//     to `<name>.replaced`, the new one to `<name>`, and `<name>.replaced` is
//     removed. A reader may look in the gap between the two renames, but a
//     crash there loses nothing: while `<name>` is absent, list_checkpoints()
//     (and so find_latest) takes `<name>.replaced` as the checkpoint of its
//     step, and the next Writer renames it back.

namespace {

// Moves the complete, synced directory `tmp` to `final_path` (Note [Replacing a checkpoint]).
void publish(const std::string& parent, const std::string& tmp, const std::string& final_path) {
  if (!path_exists(final_path)) {
    rename_path(tmp, final_path);
    fsync_directory(parent);
    return;
  }
  if (!detail::test_no_exchange() && exchange_paths(tmp, final_path)) {
    fsync_directory(parent);
    detail::test_delay();
    try {
      remove_tree(tmp);  // the old checkpoint, under the temporary's name now
    } catch (const std::exception&) {
      // best effort: a leftover temporary is never loaded, and removed at the next start
    }
    return;
  }
  const std::string aside = final_path + detail::kReplacedSuffix;
  remove_tree(aside);  // left by an interrupted replacement whose new directory is in place
  rename_path(final_path, aside);
  detail::test_delay();
  try {
    rename_path(tmp, final_path);
  } catch (...) {
    rename_path(aside, final_path);  // put the old one back before reporting
    throw;
  }
  fsync_directory(parent);
  try {
    remove_tree(aside);
  } catch (const std::exception&) {
    // best effort: beside `<name>` it is never listed, and removed at the next start
  }
}

}  // namespace

// Note [Peer files]
// With a sharded optimizer every rank holds state that rank 0 does not. Rank
// r > 0 writes its files into `<parent>/.<name>.peers/` (a name that
// list_checkpoints never takes): each file to a temporary, fsynced, renamed
// to `<rel with / as __>`, then a sidecar `<that>.json` with its size and
// SHA-256 (or the error that stopped it) the same way, so a sidecar means a
// complete file. Rank 0's write, before its manifest, waits for every
// sidecar it expects, renames the files into its temporary directory (same
// file system) and lists them; then it publishes as usual and removes the
// staging directory. A rank that failed, or a sidecar that does not come
// within peer_timeout_s, fails rank 0's write (reported like a full disk;
// earlier checkpoints stay). Staging directories left by a crash are removed
// by recover_interrupted_writes() at the next start, before any rank writes.

namespace {

std::string peer_dir(const std::string& parent, const std::string& name) { return parent + "/." + name + ".peers"; }

std::string peer_name(const std::string& rel) {
  std::string s = rel;
  for (size_t i = 0; (i = s.find('/', i)) != std::string::npos;) s.replace(i, 1, "__");
  return s;
}

WriteResult write_peer_files(const std::string& parent, const Snapshot& snapshot) {
  const auto t0 = std::chrono::steady_clock::now();
  WriteResult r;
  r.step = snapshot.manifest.step;
  const std::string dir = peer_dir(parent, snapshot.name);
  for (const auto& [rel, tensors] : snapshot.tensor_files) {
    const std::string final_path = dir + "/" + peer_name(rel);
    const std::string tmp = final_path + ".tmp-" + std::to_string(::getpid());
    nlohmann::json side;
    try {
      make_dirs(dir);
      uint64_t bytes = 0;
      const std::string sha = write_safetensors(tmp, tensors, {}, &bytes);
      rename_path(tmp, final_path);
      side = {{"bytes", bytes}, {"sha256", sha}};
      r.bytes += bytes;
    } catch (const std::exception& e) {
      side = {{"error", e.what()}};
      r.error = e.what();
    }
    try {
      detail::write_text_synced(final_path + ".json.tmp", side.dump() + "\n");
      rename_path(final_path + ".json.tmp", final_path + ".json");
      fsync_directory(dir);
    } catch (const std::exception& e) {
      if (r.error.empty()) r.error = e.what();
    }
  }
  r.path = dir;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// Waits for the peers' files of `snapshot` and moves them into `tmp`.
void collect_peer_files(const std::string& parent, const Snapshot& snapshot, const std::string& tmp,
                        const std::function<void(const std::string&, uint64_t, std::string)>& record) {
  const std::string dir = peer_dir(parent, snapshot.name);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(snapshot.peer_timeout_s);
  for (const auto& rel : snapshot.peer_files) {
    const std::string staged = dir + "/" + peer_name(rel);
    while (!path_exists(staged + ".json")) {
      if (std::chrono::steady_clock::now() > deadline)
        throw CheckpointError(staged + ": another rank's file did not arrive within " +
                              std::to_string(static_cast<int64_t>(snapshot.peer_timeout_s)) +
                              " s (did that rank fail or lag? its log says why)");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream in(staged + ".json");
    nlohmann::json side;
    in >> side;
    if (side.contains("error"))
      throw CheckpointError(staged + ": the rank writing it failed: " + side.at("error").get<std::string>());
    const auto slash = rel.rfind('/');
    if (slash != std::string::npos) make_dirs(tmp + "/" + rel.substr(0, slash));
    rename_path(staged, tmp + "/" + rel);
    record(rel, side.at("bytes").get<uint64_t>(), side.at("sha256").get<std::string>());
  }
}

}  // namespace

WriteResult write_checkpoint_dir(const std::string& parent, const Snapshot& snapshot) {
  if (snapshot.peer) return write_peer_files(parent, snapshot);
  const auto t0 = std::chrono::steady_clock::now();
  WriteResult r;
  r.path = parent + "/" + snapshot.name;
  r.step = snapshot.manifest.step;
  const std::string tmp = parent + "/." + snapshot.name + ".tmp-" + std::to_string(::getpid());
  try {
    make_dirs(parent);
    remove_tree(tmp);
    make_dirs(tmp);
    Manifest manifest = snapshot.manifest;
    auto record = [&](const std::string& rel, uint64_t bytes, std::string sha) {
      manifest.files[rel] = FileEntry{bytes, std::move(sha)};
      r.bytes += bytes;
    };
    // Tensor files are written (and hashed) in parallel, one thread each.
    struct Written {
      std::string rel, sha, error;
      uint64_t bytes = 0;
    };
    std::vector<Written> written(snapshot.tensor_files.size());
    std::vector<std::thread> workers;
    size_t k = 0;
    for (const auto& [rel_, tensors_] : snapshot.tensor_files) {
      Written& w = written[k++];
      w.rel = rel_;
      const NamedTensors* tensors = &tensors_;
      workers.emplace_back([&w, tensors, &tmp] {
        set_thread_name("lf-ckpt-file");
        lower_thread_priority(kCheckpointThreadNice);  // below the data path (common/threads.hpp)
        try {
          detail::test_delay();
          const auto slash = w.rel.rfind('/');
          if (slash != std::string::npos) make_dirs(tmp + "/" + w.rel.substr(0, slash));
          w.sha = write_safetensors(tmp + "/" + w.rel, *tensors, {}, &w.bytes);
        } catch (const std::exception& e) {
          w.error = e.what();
        }
      });
    }
    for (auto& t : workers) t.join();
    for (auto& w : written) {
      if (!w.error.empty()) throw CheckpointError(w.error);
      record(w.rel, w.bytes, std::move(w.sha));
    }
    for (const auto& [rel, text] : snapshot.text_files) {
      detail::test_delay();
      const auto slash = rel.rfind('/');
      if (slash != std::string::npos) make_dirs(tmp + "/" + rel.substr(0, slash));
      record(rel, text.size(), detail::write_text_synced(tmp + "/" + rel, text));
    }
    if (!snapshot.peer_files.empty()) collect_peer_files(parent, snapshot, tmp, record);
    // The manifest is written last: a directory with a valid manifest is complete.
    detail::test_delay();
    detail::write_text_synced(tmp + "/" + kManifest, manifest.to_json().dump(2) + "\n");
    for (const auto& [rel, unused] : snapshot.tensor_files)
      if (rel.find('/') != std::string::npos) fsync_directory(tmp + "/" + rel.substr(0, rel.rfind('/')));
    fsync_directory(tmp);
    publish(parent, tmp, r.path);
    if (!snapshot.peer_files.empty()) {
      try {
        remove_tree(peer_dir(parent, snapshot.name));
      } catch (const std::exception&) {
        // best effort: removed at the next start
      }
    }
  } catch (const std::exception& e) {
    r.error = e.what();
    try {
      remove_tree(tmp);
    } catch (...) {
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Writer::Writer(std::string dir, int64_t keep_last, bool async, bool leader)
    : dir_(std::move(dir)), keep_last_(keep_last), async_(async), leader_(leader) {
  if (leader_) recover_interrupted_writes(dir_);
  if (async_)
    thread_ = std::thread([this] {
      set_thread_name("lf-ckpt-writer");
      lower_thread_priority(kCheckpointThreadNice);  // hashing and copying yield to the trainer and the data path
      loop();
    });
}

void recover_interrupted_writes(const std::string& parent) {
  DIR* d = ::opendir(parent.c_str());
  if (!d) return;
  std::vector<std::string> stale, replaced;
  const std::string suffix = detail::kReplacedSuffix;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      if (detail::step_of(name.substr(0, name.size() - suffix.size())) >= 0) replaced.push_back(parent + "/" + name);
      continue;
    }
    const std::string peers = ".peers";  // Note [Peer files]: nobody writes before the leader's start
    if (name.size() > peers.size() && name[0] == '.' &&
        name.compare(name.size() - peers.size(), peers.size(), peers) == 0) {
      stale.push_back(parent + "/" + name);
      continue;
    }
    const auto at = name.rfind(".tmp-");
    if (name.empty() || name[0] != '.' || at == std::string::npos) continue;
    const long pid = std::atol(name.c_str() + at + 5);
    // A temporary of a live process is someone's write in progress: leave it.
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) continue;
    stale.push_back(parent + "/" + name);
  }
  ::closedir(d);
  // A replacement cut short (Note [Replacing a checkpoint]): without its final
  // directory, `<name>.replaced` is the checkpoint of its step; beside it, it is the
  // old copy of a finished replacement.
  for (const auto& aside : replaced) {
    const std::string final_path = aside.substr(0, aside.size() - suffix.size());
    if (!path_exists(final_path)) {
      rename_path(aside, final_path);
      fsync_directory(parent);
    } else {
      stale.push_back(aside);
    }
  }
  for (const auto& p : stale) {
    try {
      remove_tree(p);
    } catch (const std::exception&) {
      // best effort: a leftover temporary is never loaded anyway
    }
  }
}

Writer::~Writer() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !pending_ && !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Writer::finish(WriteResult r) {
  if (r.error.empty() && leader_) {
    // keep_last: drop the oldest complete checkpoints (never the new one).
    const auto all = list_checkpoints(dir_);
    for (size_t i = static_cast<size_t>(keep_last_); i < all.size(); ++i) {
      try {
        remove_tree(all[i]);
      } catch (const std::exception& e) {
        r.error = std::string("written, but pruning failed: ") + e.what();
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  results_.push_back(std::move(r));
}

void Writer::submit(Snapshot snapshot) {
  if (!async_) {
    finish(write_checkpoint_dir(dir_, snapshot));
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !pending_ && !busy_; });
  pending_ = std::move(snapshot);
  lock.unlock();
  cv_.notify_all();
}

void Writer::loop() {
  for (;;) {
    Snapshot job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || pending_.has_value(); });
      if (stop_ && !pending_) return;
      job = std::move(*pending_);
      pending_.reset();
      busy_ = true;
    }
    finish(write_checkpoint_dir(dir_, job));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void Writer::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return !pending_ && !busy_; });
}

std::vector<WriteResult> Writer::take_results() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<WriteResult> out;
  out.swap(results_);
  return out;
}

}  // namespace loongforge::checkpoint
