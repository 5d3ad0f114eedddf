// Atomic checkpoint directories, the manifest, keep_last, and the writer:
// staging, its background thread and progress (contract in checkpoint.hpp).
#include <dirent.h>   // opendir
#include <signal.h>   // kill
#include <unistd.h>   // getpid

#include <cerrno>   // errno
#include <cstdlib>  // std::atol, std::strtoul

#include <atomic>      // std::atomic
#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::ceil
#include <cstdio>      // std::snprintf
#include <fstream>     // std::ifstream
#include <functional>  // std::function
#include <map>         // std::map
#include <mutex>       // std::mutex
#include <set>         // std::set
#include <thread>      // std::this_thread

#include "chunks.hpp"
#include "io.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/common/threads.hpp"

namespace loongforge::checkpoint {

using Clock = std::chrono::steady_clock;

namespace {
std::string crc_hex(uint32_t crc) {
  char b[16];
  std::snprintf(b, sizeof b, "%08x", crc);
  return b;
}
}  // namespace

nlohmann::json FileEntry::to_json() const {
  if (!chunked()) return {{"bytes", bytes}, {"sha256", sha256}};
  if (unverified()) {
    std::vector<std::string> crcs;
    for (uint32_t c : chunk_crc32) crcs.push_back(crc_hex(c));
    return {{"bytes", bytes}, {"chunk_bytes", chunk_bytes}, {"chunk_crc32", crcs}};
  }
  return {{"bytes", bytes}, {"chunk_bytes", chunk_bytes}, {"chunk_sha256", chunk_sha256}};
}

FileEntry FileEntry::from_json(const nlohmann::json& j) {
  FileEntry e;
  e.bytes = j.at("bytes").get<uint64_t>();
  const bool crc = !j.contains("chunk_sha256") && j.contains("chunk_crc32");
  if (!j.contains("chunk_sha256") && !crc) {
    e.sha256 = j.at("sha256").get<std::string>();
    return e;
  }
  e.chunk_bytes = j.at("chunk_bytes").get<uint64_t>();
  size_t listed = 0;
  if (crc) {
    for (const auto& h : j.at("chunk_crc32")) {
      const std::string t = h.get<std::string>();
      char* end = nullptr;
      const unsigned long v = std::strtoul(t.c_str(), &end, 16);
      if (t.size() != 8 || *end != '\0')
        throw nlohmann::json::other_error::create(501, "chunk_crc32 '" + t + "' is not 8 hex digits", &j);
      e.chunk_crc32.push_back(static_cast<uint32_t>(v));
    }
    listed = e.chunk_crc32.size();
  } else {
    e.chunk_sha256 = j.at("chunk_sha256").get<std::vector<std::string>>();
    listed = e.chunk_sha256.size();
  }
  const uint64_t want = e.chunk_bytes == 0 ? 0 : (e.bytes + e.chunk_bytes - 1) / e.chunk_bytes;
  if (e.chunk_bytes == 0 || listed != want)
    throw nlohmann::json::other_error::create(
        501, "a file of " + std::to_string(e.bytes) + " bytes in chunks of " + std::to_string(e.chunk_bytes) +
                 " lists " + std::to_string(listed) + " chunk hashes, not " + std::to_string(want),
        &j);
  return e;
}

nlohmann::json Manifest::to_json() const {
  nlohmann::json files_json = nlohmann::json::object();
  for (const auto& [path, f] : files) files_json[path] = f.to_json();
  return {{"format", "loongforge-checkpoint"},
          {"format_version", format_version},
          {"verified", verified},
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
  m.verified = j.value("verified", true);
  m.run_id = j.at("run_id").get<std::string>();
  m.step = j.at("step").get<int64_t>();
  m.epoch = j.at("epoch").get<int64_t>();
  m.world_size = j.at("world_size").get<int64_t>();
  m.config_hash = j.at("config_hash").get<std::string>();
  m.model_hash = j.at("model_hash").get<std::string>();
  m.loongforge_version = j.value("loongforge_version", "");
  m.config = j.at("config");
  for (const auto& [path, f] : j.at("files").items()) m.files[path] = FileEntry::from_json(f);
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
// SHA-256s (FileEntry's JSON; or the error that stopped it) the same way, so a sidecar means a
// complete file. Rank 0's write, before its manifest, waits for every
// sidecar it expects, renames the files into its temporary directory (same
// file system) and lists them; then it publishes as usual and removes the
// staging directory. A rank that failed, or a sidecar that does not come
// within peer_timeout_s, fails rank 0's write (reported like a full disk;
// earlier checkpoints stay). A rank lost with fault.enable never sends its
// file: the trainer declares it (Writer::peers_lost) and the write fails at
// once, marked abandoned, so rank 0 does not wait out the timeout while the
// survivors wait for it. Staging directories left by a crash are removed by
// recover_interrupted_writes() at the next start, before any rank writes.

// Note [Preemption saves]
// Slurm sends its warning a fixed time before the end (scripts/slurm:
// --signal=B:USR1@120); whatever is not durable by then is lost. So the
// checkpoint written when a stop signal (SIGUSR1, SIGTERM, SIGINT) ends a
// run takes the fastest layout the state allows, and the trainer checks
// that it fits (src/trainer/trainer_close.cpp, checkpoint.preempt_lead_s):
//  - every rank writes only its own files, as always (a sharded optimizer's
//    ranks their shards, Note [Peer files]; replicated state is rank 0's);
//    nothing is gathered that an ordinary checkpoint would not gather;
//  - no SHA-256 on the way: each chunk gets zlib's CRC-32 (1.3 GB/s per core
//    on the CPU machine against 0.7 for OpenSSL's SHA-256 there; enough to
//    catch a torn or flipped chunk, not a deliberate forgery), listed as
//    `chunk_crc32`; the manifest says "verified": false and format 3, which
//    an older LoongForge refuses by its version instead of misreading;
//  - everything else is as for every checkpoint: each file fsynced, the
//    manifest last, one rename, the parent fsynced; so a SIGKILL during the
//    save leaves a temporary that is never loaded;
//  - it prunes nothing (keep_last), so the newest verified checkpoint is
//    still there if the save turns out damaged.
// The next start verifies before it trains: validate_checkpoint() reads
// every chunk once, checks its CRC-32 and computes its SHA-256 in the same
// pass; seal_checkpoint() then rewrites the manifest (format 2, the
// SHA-256s, through a synced temporary and a rename), and from then on it is
// an ordinary checkpoint. A damaged save is skipped by --resume latest
// (find_latest) for the newest checkpoint that validates; named with
// --resume DIR it is refused with the chunk that differs.

// Note [Bounded staging]
// The state is copied to host memory before it is written, so that training
// can go on changing it. Until issue #45 the trainer copied all of it into
// one host slab as large as the state (page-locked on GPUs; 37.9 GB of host
// memory at peak for 3B full fine-tuning) and the write ran from the slab in
// the background. Now host staging is a ring of chunk-sized slots
// (StagingRing) of at most checkpoint.staging_mb (default 4096 MiB; 0 = as
// large as the state, the old behaviour), allocated once and reused:
//  - submit() runs on the trainer thread. It copies chunk after chunk of the
//    live state into free slots (on GPUs a device-to-host copy into a
//    page-locked slot: the trainer passes that allocator) and posts each to
//    the pool, which hashes and writes it and frees the slot (Note [Chunked
//    writes] in chunks.cpp). The tensors may change once their last chunk is
//    staged, so submit() returns then; the writer thread finishes the rest.
//  - State S no larger than the ring R: nothing waits for the storage. The
//    training stall is the copy, S / B_copy (B_copy: device-to-host bandwidth
//    on GPUs, some 20 GB/s into page-locked memory on an H100 host, not
//    measured here; memcpy on CPUs), and the write is asynchronous as before.
//  - S larger than R: once the ring is full, each further chunk waits until
//    a writer frees a slot, so the stall is about R / B_copy + (S - R) / W,
//    W being the write rate (hashing and storage). Such a checkpoint is NOT
//    asynchronous: training waits until all but the last R bytes are on the
//    storage. 3B full fine-tuning (S = 37.7 GB) with the default R = 4 GiB at
//    W = 2 GB/s would stall about 17 s per checkpoint, instead of ~2 s with
//    a 38 GB slab (checkpoint.staging_mb=0 keeps that choice).
//  - Throughput should not suffer from the bound while R holds a few chunks
//    per writer thread: a slot is filled several times faster than it is
//    written, so writers do not wait for staging (on the 2-core CPU machine
//    256 MB of staging for a 2.33 GB state lost nothing: docs/benchmarks.md,
//    2026-12-05; scripts/bench/checkpoint.sh measures the rate and
//    submit()'s stall for bounds below and above the state).
// What would make large states asynchronous within the bound (not built; it
// needs the GPU to measure): snapshot the state into spare GPU memory with a
// device-to-device copy (HBM bandwidth: tens of milliseconds for 37.7 GB),
// then drain that copy through the ring on the writer thread. It costs S
// bytes of GPU memory: n16-1b's 7.9 GB fits beside training, 3B full
// fine-tuning (51.5 GB peak on an 80 GB H100, plus 37.7) does not, so it
// would be chosen per run by the free GPU memory, falling back to the stall
// above.

namespace detail {

// A peer file that will never come (Writer::peers_lost): the write is abandoned (WriteResult::abandoned).
class PeerLost : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// One write in flight: planned and staged by submit(), finished by Writer::complete().
struct Job {
  Snapshot snapshot;  // text files, manifest, peers; its tensor files live in `files` until staged
  std::string dir;    // the temporary directory (peer: the staging directory)
  std::shared_ptr<ChunkedFiles> files;
  std::string error;  // planning failed: nothing is staged
  Clock::time_point t0 = Clock::now();
  std::atomic<double> stall_s{0};
  // Peer files that will never come (Writer::peers_lost): relative path -> why. Guarded by gone_mu.
  mutable std::mutex gone_mu;
  std::map<std::string, std::string> gone;
  std::string never_coming(const std::string& rel) const {
    std::lock_guard<std::mutex> lock(gone_mu);
    const auto it = gone.find(rel);
    return it == gone.end() ? std::string() : it->second;
  }

  WriteProgress progress() const {
    WriteProgress p;
    p.active = true;
    p.name = snapshot.name;
    p.step = snapshot.manifest.step;
    if (files) p.bytes = files->bytes(), p.bytes_staged = files->bytes_staged(), p.bytes_written = files->bytes_written();
    p.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    p.stall_s = stall_s.load();
    return p;
  }
};

// What progress() reads: the write in flight, else the last one.
struct ProgressBoard {
  mutable std::mutex mu;
  std::shared_ptr<Job> current;
  WriteProgress last;
  WriteProgress read() const {
    std::lock_guard<std::mutex> lock(mu);
    return current ? current->progress() : last;
  }
};

}  // namespace detail

namespace {

using detail::ChunkedFiles;
using detail::Job;

std::string peer_dir(const std::string& parent, const std::string& name) { return parent + "/." + name + ".peers"; }

std::string peer_name(const std::string& rel) {
  std::string s = rel;
  for (size_t i = 0; (i = s.find('/', i)) != std::string::npos;) s.replace(i, 1, "__");
  return s;
}

std::string pid_suffix() { return ".tmp-" + std::to_string(::getpid()); }

void make_parent_dirs(const std::string& root, const std::string& rel) {
  const auto slash = rel.rfind('/');
  if (slash != std::string::npos) make_dirs(root + "/" + rel.substr(0, slash));
}

// Creates the job's directory and files; the snapshot's tensors move into the images.
void plan(Job& job, const std::string& parent, const WriterOptions& o) {
  Snapshot& s = job.snapshot;
  make_dirs(parent);
  if (s.peer) {
    job.dir = peer_dir(parent, s.name);
    make_dirs(job.dir);
  } else {
    job.dir = parent + "/." + s.name + pid_suffix();
    remove_tree(job.dir);
    make_dirs(job.dir);
  }
  std::vector<detail::FileImage> images;
  std::vector<std::string> paths;
  for (const auto& [rel, tensors] : s.tensor_files) {
    images.push_back(detail::safetensors_image(rel, tensors));
    if (s.peer) {
      paths.push_back(job.dir + "/" + peer_name(rel) + pid_suffix());
    } else {
      make_parent_dirs(job.dir, rel);
      paths.push_back(job.dir + "/" + rel);
    }
  }
  s.tensor_files.clear();
  job.files = std::make_shared<ChunkedFiles>(std::move(images), std::move(paths), o.chunk_bytes, o.direct_io,
                                             /*crc_only=*/s.preemption);
  job.files->open();
}

// A peer's files: each renamed into place, then its sidecar (Note [Peer files]).
void finish_peer_files(const Job& job, const std::string& failure, WriteResult& r) {
  for (size_t i = 0; i < job.files->size(); ++i) {
    const std::string final_path = job.dir + "/" + peer_name(job.files->rel(i));
    nlohmann::json side;
    if (failure.empty()) {
      try {
        rename_path(final_path + pid_suffix(), final_path);
        const FileEntry e = job.files->entry(i);
        side = e.to_json();
        r.bytes += e.bytes;
      } catch (const std::exception& ex) {
        side = {{"error", ex.what()}};
        if (r.error.empty()) r.error = ex.what();
      }
    } else {
      side = {{"error", failure}};
      try {
        remove_tree(final_path + pid_suffix());
      } catch (const std::exception&) {
        // best effort: removed at the next start
      }
    }
    try {
      detail::write_text_synced(final_path + ".json.tmp", side.dump() + "\n");
      rename_path(final_path + ".json.tmp", final_path + ".json");
      fsync_directory(job.dir);
    } catch (const std::exception& ex) {
      if (r.error.empty()) r.error = ex.what();
    }
  }
}

// Waits for the peers' files of the job's snapshot and moves them into `tmp`; a file the trainer declared
// lost (Writer::peers_lost) fails the write at once.
void collect_peer_files(const std::string& parent, const Job& job, const std::string& tmp,
                        const std::function<void(const std::string&, FileEntry)>& record) {
  const Snapshot& snapshot = job.snapshot;
  const std::string dir = peer_dir(parent, snapshot.name);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(snapshot.peer_timeout_s);
  for (const auto& rel : snapshot.peer_files) {
    const std::string staged = dir + "/" + peer_name(rel);
    while (!path_exists(staged + ".json")) {
      const std::string why = job.never_coming(rel);
      if (!why.empty()) throw detail::PeerLost(staged + ": another rank's file will not arrive: " + why);
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
    make_parent_dirs(tmp, rel);
    rename_path(staged, tmp + "/" + rel);
    record(rel, FileEntry::from_json(side));
  }
}

// The rest of a checkpoint once its tensor files are written: the text files,
// the peers' files, the manifest last, then publishing.
void finish_checkpoint_dir(const std::string& parent, const Job& job, WriteResult& r) {
  const Snapshot& snapshot = job.snapshot;
  const std::string& tmp = job.dir;
  Manifest manifest = snapshot.manifest;
  manifest.format_version = snapshot.preemption ? kUnverifiedFormatVersion : kFormatVersion;
  manifest.verified = !snapshot.preemption;
  std::set<std::string> subdirs;
  auto record = [&](const std::string& rel, FileEntry e) {
    r.bytes += e.bytes;
    if (rel.find('/') != std::string::npos) subdirs.insert(tmp + "/" + rel.substr(0, rel.rfind('/')));
    manifest.files[rel] = std::move(e);
  };
  for (size_t i = 0; i < job.files->size(); ++i) record(job.files->rel(i), job.files->entry(i));
  for (const auto& [rel, text] : snapshot.text_files) {
    detail::test_delay();
    make_parent_dirs(tmp, rel);
    FileEntry e;
    e.bytes = text.size();
    e.sha256 = detail::write_text_synced(tmp + "/" + rel, text);
    record(rel, std::move(e));
  }
  if (!snapshot.peer_files.empty()) collect_peer_files(parent, job, tmp, record);
  // The manifest is written last: a directory with a valid manifest is complete.
  detail::test_delay();
  detail::write_text_synced(tmp + "/" + kManifest, manifest.to_json().dump(2) + "\n");
  for (const auto& d : subdirs) fsync_directory(d);
  fsync_directory(tmp);
  publish(parent, tmp, r.path);
  if (!snapshot.peer_files.empty()) {
    try {
      remove_tree(peer_dir(parent, snapshot.name));
    } catch (const std::exception&) {
      // best effort: removed at the next start
    }
  }
}

std::string size_text(uint64_t bytes, uint64_t scale_of) {
  char b[32];
  if (scale_of >= 1000000000ull)
    std::snprintf(b, sizeof b, "%.2f", static_cast<double>(bytes) / 1e9);
  else
    std::snprintf(b, sizeof b, "%.1f", static_cast<double>(bytes) / 1e6);
  return b;
}

}  // namespace

// ---------------------------------------------------------------------------
// Sealing a preemption save (Note [Preemption saves])

void seal_checkpoint(const Report& report) {
  const std::string path = report.dir + "/" + kManifest;
  if (!report.ok()) throw CheckpointError(report.dir + ": cannot seal a checkpoint that does not validate");
  if (report.manifest.verified) throw CheckpointError(path + ": not an unverified preemption save; nothing to seal");
  Manifest m = report.manifest;
  for (const auto& [rel, entry] : m.files)
    if (entry.unverified() && !report.sealed.count(rel))
      throw CheckpointError(path + ": " + rel + " has no SHA-256s computed (validate it first)");
  for (const auto& [rel, entry] : report.sealed) m.files[rel] = entry;
  m.verified = true;
  m.format_version = kFormatVersion;
  const std::string tmp = report.dir + "/." + kManifest + pid_suffix();
  detail::write_text_synced(tmp, m.to_json().dump(2) + "\n");
  rename_path(tmp, path);
  fsync_directory(report.dir);
}

// ---------------------------------------------------------------------------
// Progress

double WriteProgress::eta_s() const {
  const double rate = bytes_per_s();
  if (!active) return 0.0;
  if (rate <= 0) return -1.0;
  return static_cast<double>(bytes - bytes_written) / rate;
}

std::string WriteProgress::line() const {
  const char* unit = bytes >= 1000000000ull ? " GB" : " MB";
  const double rate = bytes_per_s();
  char b[160];
  std::snprintf(b, sizeof b, "%s: %s of %s%s written (%.0f%%), %.*f %s", name.c_str(),
                size_text(bytes_written, bytes).c_str(), size_text(bytes, bytes).c_str(), unit,
                bytes ? 100.0 * static_cast<double>(bytes_written) / static_cast<double>(bytes) : 100.0,
                rate >= 1e9 ? 2 : 0, rate >= 1e9 ? rate / 1e9 : rate / 1e6, rate >= 1e9 ? "GB/s" : "MB/s");
  std::string out = b;
  const double eta = eta_s();
  if (active) out += eta < 0 ? ", ETA unknown" : ", ETA " + std::to_string(static_cast<int64_t>(std::ceil(eta))) + " s";
  return out;
}

nlohmann::json WriteProgress::to_json() const {
  nlohmann::json j = {{"active", active},
                      {"name", name},
                      {"step", step},
                      {"bytes", bytes},
                      {"bytes_staged", bytes_staged},
                      {"bytes_written", bytes_written},
                      {"seconds", seconds},
                      {"gb_per_s", bytes_per_s() / 1e9},
                      {"stall_s", stall_s}};
  if (active) j["eta_s"] = eta_s();
  if (!error.empty()) j["error"] = error;
  return j;
}

// ---------------------------------------------------------------------------
// Writer

WriteResult write_checkpoint_dir(const std::string& parent, const Snapshot& snapshot, const WriterOptions& options) {
  Writer w(parent, /*keep_last=*/1, /*async=*/false, /*leader=*/false, options);
  w.submit(snapshot);
  return w.take_results().front();
}

Writer::Writer(std::string dir, int64_t keep_last, bool async, bool leader, WriterOptions options)
    : dir_(std::move(dir)), keep_last_(keep_last), async_(async), leader_(leader), options_(std::move(options)) {
  if (options_.chunk_bytes == 0 || options_.chunk_bytes % 4096 != 0)
    throw CheckpointError("checkpoint chunk size " + std::to_string(options_.chunk_bytes) +
                          " bytes is not a positive multiple of 4096 (checkpoint.chunk_mb)");
  ring_ = std::make_unique<detail::StagingRing>(options_.chunk_bytes, options_.staging_bytes, options_.allocate);
  pool_ = std::make_unique<detail::WorkerPool>(options_.threads);
  board_ = std::make_shared<detail::ProgressBoard>();
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

void Writer::reserve_staging(uint64_t state_bytes) {
  // A chunk never spans two files: a few more slots than the bytes alone need.
  ring_->reserve((state_bytes + options_.chunk_bytes - 1) / options_.chunk_bytes + 2);
}

uint64_t Writer::staging_bytes_allocated() const { return ring_->allocated_bytes(); }

WriteProgress Writer::progress() const { return board_->read(); }

std::function<WriteProgress()> Writer::progress_source() const {
  std::shared_ptr<const detail::ProgressBoard> board = board_;
  return [board] { return board->read(); };
}

void Writer::finish(WriteResult r) {
  // Note [Preemption saves]: an unverified save prunes nothing, so the newest verified checkpoint stays.
  if (r.error.empty() && leader_ && !r.preemption) {
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
  {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !pending_ && !busy_; });
    busy_ = true;
  }
  const auto t0 = Clock::now();
  auto job = std::make_shared<Job>();
  job->snapshot = std::move(snapshot);
  try {
    plan(*job, dir_, options_);
  } catch (const std::exception& e) {
    job->error = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(board_->mu);
    board_->current = job;
  }
  if (async_) {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_ = job;  // the writer thread watches it from now on
  }
  cv_.notify_all();
  // Note [Bounded staging]: returns once every chunk is in the ring.
  if (job->error.empty()) job->files->stage(*ring_, *pool_);
  job->stall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (async_) return;
  complete(job);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
  }
  cv_.notify_all();
}

// Waits for the job's chunks (a progress line every progress_interval_s), then finishes the directory.
void Writer::complete(const std::shared_ptr<Job>& job) {
  WriteResult r;
  r.step = job->snapshot.manifest.step;
  r.preemption = job->snapshot.preemption;
  r.path = job->snapshot.peer ? job->dir : dir_ + "/" + job->snapshot.name;
  try {
    if (!job->error.empty()) throw CheckpointError(job->error);
    while (!job->files->wait_for(options_.progress_interval_s))
      LF_LOG(logger("checkpoint"), info) << "checkpoint " << job->progress().line();
    const std::string failure = job->files->error();
    if (job->snapshot.peer) {
      finish_peer_files(*job, failure, r);
      if (r.error.empty()) r.error = failure;
    } else {
      if (!failure.empty()) throw CheckpointError(failure);
      finish_checkpoint_dir(dir_, *job, r);
    }
  } catch (const std::exception& e) {
    r.error = e.what();
    r.abandoned = dynamic_cast<const detail::PeerLost*>(&e) != nullptr;
    if (!job->snapshot.peer && !job->dir.empty()) {
      try {
        remove_tree(job->dir);
      } catch (...) {
      }
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - job->t0).count();
  {
    std::lock_guard<std::mutex> lock(board_->mu);
    board_->last = job->progress();
    board_->last.active = false;
    board_->last.seconds = r.seconds;
    board_->last.error = r.error;
    board_->current.reset();
  }
  finish(std::move(r));
}

void Writer::loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || pending_ != nullptr; });
      if (stop_ && !pending_) return;
      job = std::move(pending_);
      pending_.reset();
    }
    complete(job);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

void Writer::peers_lost(const std::vector<std::string>& rels, const std::string& why) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(board_->mu);
    job = board_->current;
  }
  if (!job) return;
  std::lock_guard<std::mutex> lock(job->gone_mu);
  for (const auto& rel : rels) job->gone[rel] = why;
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
