// loongforge/checkpoint/checkpoint.hpp — checkpoints that never lose work.
//
// Contract (docs/architecture.md s6, docs/checkpoints.md):
//  - A checkpoint is `<dir>/epoch_E_step_S/` holding model.safetensors,
//    optimizer/rank_RRRRR.safetensors, scheduler.json, trainer_state.json,
//    loongforge_state/ (each engine's part, when it exists) and MANIFEST.json
//    (format version, run id, config and model hashes, world size, and for
//    every other file its size and SHA-256: of each fixed-size chunk for the
//    tensor files, of the whole file for the small text files).
//  - Writing: everything goes to `.<name>.tmp-<pid>`, each file and the
//    directory are fsynced, then one rename publishes it. A directory without
//    a valid MANIFEST.json is never loaded; stale temporaries are ignored.
//    Replacing a checkpoint of the same step swaps old and new atomically, so
//    the step always has a complete checkpoint at its path (Note [Replacing a
//    checkpoint] in writer.cpp has the fallback and crash recovery).
//  - Writer: submit() takes a snapshot of live tensors (on any device) and
//    copies them, chunk by chunk, into a ring of host staging buffers of at
//    most WriterOptions::staging_bytes; `threads` workers hash and write the
//    chunks in parallel straight from those buffers (Note [Chunked writes] in
//    chunks.cpp). submit() returns once every chunk is staged: the caller may
//    then change the tensors. A state larger than the ring makes submit()
//    wait for the writes of all but the last ring's worth (Note [Bounded
//    staging] in writer.cpp). The rest (text files, manifest, publishing)
//    runs on the writer's background thread (async) or before submit()
//    returns (sync). A failed write (disk full, permissions) is reported
//    through take_results() and never stops training; earlier checkpoints
//    stay as they are. keep_last prunes the oldest complete checkpoints
//    after each successful write. progress() tells any thread how far the
//    current write is (bytes, rate, ETA); a write longer than
//    progress_interval_s logs a line that often.
//  - Sharded state (Note [Peer files] in writer.cpp): a rank other than 0
//    submits a `peer` snapshot holding only its own files; they are staged
//    atomically beside the checkpoint, and rank 0's write moves them in and
//    lists them in the manifest before it publishes the directory, so a
//    checkpoint is either complete with every rank's shard or absent.
//  - Preemption saves (Note [Preemption saves] in writer.cpp): a snapshot
//    with `preemption` set is written with a CRC-32 per chunk instead of a
//    SHA-256 (manifest format 3, "verified": false) and prunes nothing;
//    validate_checkpoint() checks the CRC-32s and computes the SHA-256s, and
//    seal_checkpoint() then rewrites the manifest as an ordinary verified one
//    (format 2). The trainer does both before it trains from such a save.
//  - Errors are CheckpointError naming the directory and file.
//
// Example:
//   WriterOptions o;  o.threads = 8;  o.staging_bytes = 4ull << 30;
//   Writer w(run_dir + "/checkpoints", /*keep_last=*/3, /*async=*/true, /*leader=*/true, o);
//   w.submit(std::move(snapshot));          // returns once the tensors are staged
//   for (auto& r : w.take_results()) ...;   // path, bytes, seconds or error
//   std::string latest = find_latest(run_dir + "/checkpoints", &rejected);
#pragma once

#include <condition_variable>  // std::condition_variable
#include <cstddef>             // size_t
#include <cstdint>             // int64_t, uint64_t
#include <functional>          // std::function
#include <map>                 // std::map
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex
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

// The serial writer: one thread writes the file front to back, hashing it
// as it goes. Returns the whole file's SHA-256; `bytes` (optional) receives
// the file size. (Checkpoints are written by Writer, in chunks; this is the
// reference they are tested against.)
std::string write_safetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata = {}, uint64_t* bytes = nullptr);
NamedTensors read_safetensors(const std::string& path);
std::vector<TensorHeader> read_safetensors_header(const std::string& path);

// ---------------------------------------------------------------------------
// Manifest and snapshot

// Version 2 lists the SHA-256 of each chunk of a tensor file; version 1
// (whole files only) is still read and validated; version 3 is a preemption
// save not verified yet (CRC-32 per chunk, "verified": false), which
// seal_checkpoint() turns into version 2.
constexpr int kFormatVersion = 2;
constexpr int kUnverifiedFormatVersion = 3;
constexpr int kOldestFormatVersion = 1;
constexpr int kNewestFormatVersion = kUnverifiedFormatVersion;
constexpr const char* kManifest = "MANIFEST.json";

// A file's size and hashes, as MANIFEST.json lists it: either the SHA-256 of
// the whole file (`sha256`: every file of version 1, text files of version
// 2) or one per chunk (`chunk_bytes` > 0: chunk i is the bytes
// [i * chunk_bytes, min((i + 1) * chunk_bytes, bytes)), `chunk_sha256[i]`
// their SHA-256; a file of one chunk has its whole-file digest there). A
// preemption save's tensor files list `chunk_crc32` (zlib's CRC-32 of each
// chunk, 8 hex digits) instead of `chunk_sha256` until they are verified.
struct FileEntry {
  uint64_t bytes = 0;
  std::string sha256;
  uint64_t chunk_bytes = 0;
  std::vector<std::string> chunk_sha256;
  std::vector<uint32_t> chunk_crc32;
  bool chunked() const { return chunk_bytes > 0; }
  bool unverified() const { return chunked() && chunk_sha256.empty(); }
  nlohmann::json to_json() const;
  static FileEntry from_json(const nlohmann::json& j);  // throws nlohmann::json::exception
};

struct Manifest {
  int format_version = kFormatVersion;
  bool verified = true;  // false: a preemption save whose tensor files carry CRC-32s only (format 3)
  std::string run_id, config_hash, model_hash, loongforge_version;
  int64_t step = 0, epoch = 0, world_size = 1;
  nlohmann::json config;                  // compared keys -> values (see checkpoints.md)
  std::map<std::string, FileEntry> files;  // relative path -> size, hashes
  nlohmann::json to_json() const;
  static Manifest from_json(const nlohmann::json& j);  // throws nlohmann::json::exception
};

// Everything one checkpoint holds. The tensors may be the live state, on any
// device: Writer::submit() copies them (the caller must not change them
// before it returns).
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
  // A preemption save (Note [Preemption saves]): CRC-32 per chunk instead of
  // SHA-256, the manifest marked unverified, nothing pruned after it.
  bool preemption = false;
};

struct WriteResult {
  std::string path;  // final directory
  int64_t step = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  bool preemption = false;  // written as a preemption save (unverified)
  std::string error;  // empty on success
  bool abandoned = false;  // failed because a peer file will never come (Writer::peers_lost), not by a fault of its own
};

// Finishes what a crash cut short under `parent`: removes `.<name>.tmp-<pid>`
// directories of processes that no longer run, and completes an interrupted
// replacement of a checkpoint (Note [Replacing a checkpoint] in writer.cpp:
// `<name>.replaced` goes back to `<name>` when that is absent, else is
// removed). Writer's constructor calls it. Throws Error when a rename fails.
void recover_interrupted_writes(const std::string& parent);

// How a Writer stages, hashes and writes (config section `checkpoint`).
struct WriterOptions {
  int threads = 8;                         // checkpoint.write_threads: hash-and-write workers
  uint64_t chunk_bytes = 64ull << 20;      // checkpoint.chunk_mb: the unit staged, hashed and written (4 KiB multiple)
  uint64_t staging_bytes = 4096ull << 20;  // checkpoint.staging_mb: host staging at most; 0 = as large as the state
  bool direct_io = true;                   // checkpoint.direct_io: O_DIRECT where the file system takes it
  double progress_interval_s = 5;          // a progress line this often while a write lasts
  // Allocates one staging buffer of the given size, 4 KiB aligned (the
  // trainer passes page-locked memory on GPUs); empty = aligned host memory.
  std::function<std::shared_ptr<void>(size_t)> allocate;
};

// How far a write is; Writer::progress() returns a copy to any thread.
struct WriteProgress {
  bool active = false;  // a write is in flight; else the fields describe the last one (none: name empty)
  std::string name;     // "epoch_E_step_S"
  int64_t step = 0;
  uint64_t bytes = 0, bytes_staged = 0, bytes_written = 0;  // tensor files' bytes: all, copied to staging, on disk
  double seconds = 0;        // since the write began (the whole write, when it is over)
  double stall_s = 0;        // submit()'s time: staging, and waiting for the ring
  std::string error;         // the last write's failure
  double bytes_per_s() const { return seconds > 0 ? static_cast<double>(bytes_written) / seconds : 0.0; }
  double eta_s() const;      // < 0 when unknown
  std::string line() const;  // "epoch_0_step_100: 12.3 of 37.7 GB written (33%), 2.10 GB/s, ETA 12 s"
  nlohmann::json to_json() const;
};

// Writes one snapshot as a checkpoint directory, atomically, on the calling
// thread (with a Writer of `options`, not pruning). Never throws: failures
// come back in WriteResult::error with the temporary removed.
WriteResult write_checkpoint_dir(const std::string& parent, const Snapshot& snapshot, const WriterOptions& options = {});

namespace detail {
class StagingRing;
class WorkerPool;
struct Job;
struct ProgressBoard;
}  // namespace detail

class Writer {
 public:
  // `leader`: this process owns `dir` (recovers interrupted writes at start,
  // prunes to keep_last); a peer writer (sharded state of another rank) does neither.
  Writer(std::string dir, int64_t keep_last, bool async, bool leader = true, WriterOptions options = {});
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Allocates the staging ring for a state of `state_bytes` now (at most
  // options.staging_bytes), so that the first checkpoint does not pay for
  // it; any thread, before or while training (submit() allocates what is
  // missing). Throws CheckpointError when the memory cannot be had.
  void reserve_staging(uint64_t state_bytes);
  uint64_t staging_bytes_allocated() const;

  // Waits while a previous write is still in flight, stages the snapshot
  // (Note [Bounded staging]), then returns (async) or writes it (sync).
  // Failures come back through take_results(), never as exceptions.
  void submit(Snapshot snapshot);
  void wait();  // until nothing is pending
  // The write in flight, if any, will never receive these peer files (`rels`, as in Snapshot::peer_files:
  // their ranks were lost): where it waits or would wait for one of them, it fails at once with `why`
  // instead of waiting out peer_timeout_s. Later writes are not affected. Any thread.
  void peers_lost(const std::vector<std::string>& rels, const std::string& why);
  std::vector<WriteResult> take_results();
  const std::string& dir() const { return dir_; }
  const WriterOptions& options() const { return options_; }

  WriteProgress progress() const;
  // The same, for a caller that may outlive the Writer (the control thread's status).
  std::function<WriteProgress()> progress_source() const;

 private:
  void loop();
  void complete(const std::shared_ptr<detail::Job>& job);
  void finish(WriteResult r);
  std::string dir_;
  int64_t keep_last_;
  bool async_;
  bool leader_ = true;
  WriterOptions options_;
  std::unique_ptr<detail::StagingRing> ring_;
  std::unique_ptr<detail::WorkerPool> pool_;
  std::shared_ptr<detail::ProgressBoard> board_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::shared_ptr<detail::Job> pending_;
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
  // An unverified preemption save whose CRC-32s all matched: its tensor
  // files' entries with the SHA-256 of each chunk, for seal_checkpoint().
  std::map<std::string, FileEntry> sealed;
  bool ok() const { return problems.empty(); }
};

// Reads and parses `path` (a MANIFEST.json). Throws CheckpointError naming the file: "missing",
// "corrupt" (not JSON: the byte offset and a printable excerpt of its start, non-printable
// bytes as \xNN, never the raw bytes) or "unreadable" (JSON, not a manifest; the message made
// printable the same way).
Manifest read_manifest(const std::string& path);

// Integrity and completeness: the manifest parses (format version 1 to 3),
// every listed file exists with its size and SHA-256 (each chunk's, or the
// whole file's; an unverified preemption save's CRC-32 of each chunk, whose
// SHA-256 is computed in the same pass into `sealed`), nothing required is missing. Chunks are read and hashed by
// `threads` threads at once (0: the machine's cores, at most 16); problems
// come in the manifest's file order.
Report validate_checkpoint(const std::string& dir, int threads = 0);

// Makes a validated, unverified preemption save an ordinary checkpoint: its
// manifest is rewritten (format 2, the SHA-256s of `report.sealed`) through
// a synced temporary and one rename. Throws CheckpointError when the report
// is not ok() or not of an unverified save, or a write fails.
void seal_checkpoint(const Report& report);

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
