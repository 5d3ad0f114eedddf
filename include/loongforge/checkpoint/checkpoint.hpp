// loongforge/checkpoint/checkpoint.hpp — checkpoints that never lose work.
//
// Contract (docs/architecture.md s6, docs/checkpoints.md):
//  - A checkpoint is `<dir>/epoch_E_step_S/` holding model.safetensors,
//    optimizer/rank_RRRRR.safetensors, scheduler.json, trainer_state.json,
//    loongforge_state/ (each engine's part, when it exists) and MANIFEST.json
//    (format version, run id, config and model hashes, world size, size and
//    SHA-256 of every other file).
//  - Writing: everything goes to `.<name>.tmp-<pid>`, each file and the
//    directory are fsynced, then one rename publishes it. A directory without
//    a valid MANIFEST.json is never loaded; stale temporaries are ignored.
//    Replacing a checkpoint of the same step swaps old and new atomically, so
//    the step always has a complete checkpoint at its path (Note [Replacing a
//    checkpoint] in writer.cpp has the fallback and crash recovery).
//  - Writer owns one background thread (async) that writes snapshots the
//    trainer has already copied to host memory; a failed write (disk full,
//    permissions) is reported through take_results() and never stops
//    training; earlier checkpoints stay as they are. keep_last prunes the
//    oldest complete checkpoints after each successful write.
//  - Sharded state (Note [Peer files] in writer.cpp): a rank other than 0
//    submits a `peer` snapshot holding only its own files; they are staged
//    atomically beside the checkpoint, and rank 0's write moves them in and
//    lists them in the manifest before it publishes the directory, so a
//    checkpoint is either complete with every rank's shard or absent.
//  - Errors are CheckpointError naming the directory and file.
//
// Example:
//   Writer w(run_dir + "/checkpoints", /*keep_last=*/3, /*async=*/true);
//   w.submit(std::move(snapshot));          // returns at once
//   for (auto& r : w.take_results()) ...;   // path, bytes, seconds or error
//   std::string latest = find_latest(run_dir + "/checkpoints", &rejected);
#pragma once

#include <condition_variable>  // std::condition_variable
#include <cstdint>             // int64_t, uint64_t
#include <map>                 // std::map
#include <mutex>               // std::mutex
#include <optional>            // std::optional
#include <string>              // std::string
#include <thread>              // std::thread
#include <utility>             // std::pair
#include <vector>              // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <nlohmann/json.hpp>   // nlohmann::json

namespace loongforge::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// ---------------------------------------------------------------------------
// safetensors (Hugging Face layout; Python reads it with safetensors.torch)

struct TensorHeader {
  std::string name, dtype;  // dtype as safetensors spells it: "F32", "BF16", ...
  std::vector<int64_t> shape;
};

// Returns the file's SHA-256, computed from the bytes as they are written
// (no second read); `bytes` (optional) receives the file size.
std::string write_safetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {}, uint64_t* bytes = nullptr);
NamedTensors read_safetensors(const std::string& path);
std::vector<TensorHeader> read_safetensors_header(const std::string& path);

// ---------------------------------------------------------------------------
// Manifest and snapshot

constexpr int kFormatVersion = 1;
constexpr const char* kManifest = "MANIFEST.json";

struct FileEntry {
  uint64_t bytes = 0;
  std::string sha256;
};

struct Manifest {
  int format_version = kFormatVersion;
  std::string run_id, config_hash, model_hash, loongforge_version;
  int64_t step = 0, epoch = 0, world_size = 1;
  nlohmann::json config;                  // compared keys -> values (see checkpoints.md)
  std::map<std::string, FileEntry> files;  // relative path -> size, hash
  nlohmann::json to_json() const;
  static Manifest from_json(const nlohmann::json& j);  // throws nlohmann::json::exception
};

// Everything one checkpoint holds, already in host memory.
struct Snapshot {
  std::string name;  // "epoch_E_step_S"
  std::map<std::string, NamedTensors> tensor_files;  // relative path -> tensors
  std::map<std::string, std::string> text_files;     // relative path -> contents
  Manifest manifest;                                 // files are filled in by the writer
  // Sharded state (Note [Peer files]): on rank 0, the relative paths other
  // ranks stage, waited for (up to peer_timeout_s) and listed in the
  // manifest; on another rank, peer = true: only tensor_files are written,
  // staged for rank 0.
  std::vector<std::string> peer_files;
  bool peer = false;
  double peer_timeout_s = 600;
};

struct WriteResult {
  std::string path;  // final directory
  int64_t step = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  std::string error;  // empty on success
};

// Finishes what a crash cut short under `parent`: removes `.<name>.tmp-<pid>`
// directories of processes that no longer run, and completes an interrupted
// replacement of a checkpoint (Note [Replacing a checkpoint] in writer.cpp:
// `<name>.replaced` goes back to `<name>` when that is absent, else is
// removed). Writer's constructor calls it. Throws Error when a rename fails.
void recover_interrupted_writes(const std::string& parent);

// Writes one snapshot as a checkpoint directory, atomically. Never throws:
// failures come back in WriteResult::error with the temporary removed.
WriteResult write_checkpoint_dir(const std::string& parent, const Snapshot& snapshot);

class Writer {
 public:
  // `leader`: this process owns `dir` (recovers interrupted writes at start,
  // prunes to keep_last); a peer writer (sharded state of another rank) does neither.
  Writer(std::string dir, int64_t keep_last, bool async, bool leader = true);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Async: waits while a previous snapshot is still being written, then
  // returns; sync: writes before returning.
  void submit(Snapshot snapshot);
  void wait();  // until nothing is pending
  std::vector<WriteResult> take_results();
  const std::string& dir() const { return dir_; }

 private:
  void loop();
  void finish(WriteResult r);
  std::string dir_;
  int64_t keep_last_;
  bool async_;
  bool leader_ = true;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<Snapshot> pending_;
  bool busy_ = false, stop_ = false;
  std::vector<WriteResult> results_;
  std::thread thread_;
};

// ---------------------------------------------------------------------------
// Finding and checking checkpoints

struct Report {
  std::string dir;
  Manifest manifest;
  std::vector<std::string> problems;  // empty: complete and intact
  bool ok() const { return problems.empty(); }
};

// Reads and parses `path` (a MANIFEST.json). Throws CheckpointError naming the file: "missing",
// "corrupt" (not JSON: the byte offset and a printable excerpt of its start, non-printable
// bytes as \xNN, never the raw bytes) or "unreadable" (JSON, not a manifest; the message made
// printable the same way).
Manifest read_manifest(const std::string& path);

// Integrity and completeness: the manifest parses, every listed file exists
// with its size and SHA-256, nothing required is missing.
Report validate_checkpoint(const std::string& dir);

// Checkpoint directories under `parent` (`epoch_E_step_S`, or
// `epoch_E_step_S.replaced` while `epoch_E_step_S` is absent), newest
// (highest step) first. They are not validated.
std::vector<std::string> list_checkpoints(const std::string& parent);

// The newest checkpoint under `parent` that validates; "" when none does.
// `rejected` (optional) receives one line per newer directory skipped and why.
std::string find_latest(const std::string& parent, std::vector<std::string>* rejected = nullptr);

// Differences between a checkpoint's model.safetensors and a model's
// parameters (names and shapes); empty when they match.
std::vector<std::string> compare_parameters(const std::string& dir,
                                            const std::vector<std::pair<std::string, std::vector<int64_t>>>& model);

}  // namespace loongforge::checkpoint
