// Proves the chunked parallel writer (Note [Chunked writes], Note [Bounded
// staging]): a state larger than the staging bound, written by several
// threads in chunks, gives the serial writer's bytes file for file, and the
// manifest lists each chunk's SHA-256 (checked here against slices hashed on
// their own); host staging never exceeds the bound (every staging byte is
// counted through the allocator); submit() waits for the storage only when
// the state is larger than the bound; progress() tells another thread how far
// a slow write is; a damaged chunk is named by validate_checkpoint; a version
// 1 manifest (whole-file SHA-256s) still validates.
#include <atomic>   // std::atomic
#include <chrono>   // std::chrono::steady_clock
#include <fstream>  // std::ifstream, std::fstream
#include <memory>   // std::shared_ptr
#include <string>
#include <thread>  // std::thread
#include <vector>

#include <ATen/ATen.h>  // at::arange

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"
#include "snapshots.hpp"

using namespace loongforge;
using namespace loongforge::checkpoint;
using lf_catch::Contains;

namespace {

constexpr uint64_t kChunk = 64 << 10;  // 64 KiB chunks: many of them in a small state

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Sets an environment variable for one scope (the writer's test hooks).
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// A state of about 1.6 MB in odd-sized tensors of three dtypes, so chunk
// boundaries fall inside tensors, between them and inside the header.
Snapshot odd_state(int64_t step) {
  Snapshot s = lf_test::make_snapshot(step);
  auto& model = s.tensor_files["model.safetensors"];
  for (int i = 0; i < 12; ++i) {
    model.emplace_back("block." + std::to_string(i) + ".weight", at::arange(20011 + 977 * i, at::kFloat) * (i + 1));
    model.emplace_back("block." + std::to_string(i) + ".norm", at::arange(131 + i, at::kFloat).to(at::kBFloat16));
    model.emplace_back("block." + std::to_string(i) + ".ids", at::arange(7 + i, at::kLong));
  }
  s.tensor_files["optimizer/rank_00000.safetensors"].emplace_back("moments", at::arange(150001, at::kFloat) / 3);
  return s;
}

uint64_t tensor_bytes(const Snapshot& s) {
  uint64_t n = 0;
  for (const auto& [rel, tensors] : s.tensor_files)
    for (const auto& [name, t] : tensors) n += static_cast<uint64_t>(t.numel()) * t.element_size();
  return n;
}

// An allocator that counts what it holds now and at most.
struct CountingAllocator {
  std::shared_ptr<std::atomic<uint64_t>> now = std::make_shared<std::atomic<uint64_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> peak = std::make_shared<std::atomic<uint64_t>>(0);
  std::function<std::shared_ptr<void>(size_t)> fn() const {
    auto n = now, p = peak;
    return [n, p](size_t bytes) {
      void* mem = std::aligned_alloc(4096, bytes);
      const uint64_t held = n->fetch_add(bytes) + bytes;
      for (uint64_t old = p->load(); held > old && !p->compare_exchange_weak(old, held);) {
      }
      return std::shared_ptr<void>(mem, [n, bytes](void* q) {
        n->fetch_sub(bytes);
        std::free(q);
      });
    };
  }
};

WriterOptions small_chunks(int threads, uint64_t staging_bytes) {
  WriterOptions o;
  o.threads = threads;
  o.chunk_bytes = kChunk;
  o.staging_bytes = staging_bytes;
  return o;
}

}  // namespace

TEST_CASE("checkpoint: a chunked parallel write larger than the staging bound gives the serial writer's bytes") {
  lf_test::ScratchDir parent, serial;
  const Snapshot s = odd_state(3);
  const uint64_t state = tensor_bytes(s);
  REQUIRE(state > 16 * kChunk);  // many chunks, several times the bound below
  CountingAllocator counted;
  WriterOptions o = small_chunks(/*threads=*/4, /*staging_bytes=*/4 * kChunk);
  o.allocate = counted.fn();
  for (const bool async : {false, true}) {
    INFO("async " << async);
    remove_tree(parent.path + "/epoch_0_step_3");
    Writer w(parent.path, /*keep_last=*/3, async, /*leader=*/true, o);
    w.submit(s);
    w.wait();
    const auto results = w.take_results();
    REQUIRE(results.size() == 1);
    REQUIRE(results[0].error.empty());
    REQUIRE(w.staging_bytes_allocated() <= 4 * kChunk);
    const std::string dir = results[0].path;
    const Report report = validate_checkpoint(dir);
    REQUIRE(report.ok());
    REQUIRE(report.manifest.format_version == kFormatVersion);
    for (const auto& [rel, tensors] : s.tensor_files) {
      INFO(rel);
      uint64_t bytes = 0;
      const std::string reference = serial.path + "/" + (rel == "model.safetensors" ? "model" : "optimizer");
      const std::string sha = write_safetensors(reference, tensors, {}, &bytes);
      const std::string written = read_bytes(dir + "/" + rel);
      REQUIRE(written == read_bytes(reference));  // byte for byte
      const FileEntry& e = report.manifest.files.at(rel);
      REQUIRE(e.bytes == bytes);
      REQUIRE(e.chunk_bytes == kChunk);
      REQUIRE(e.chunk_sha256.size() == (bytes + kChunk - 1) / kChunk);
      for (size_t i = 0; i < e.chunk_sha256.size(); ++i)
        REQUIRE(e.chunk_sha256[i] == sha256_hex(written.substr(i * kChunk, kChunk)));
      if (e.chunk_sha256.size() == 1) REQUIRE(e.chunk_sha256[0] == sha);
    }
    // Text files are listed with the whole file's SHA-256, as in version 1.
    REQUIRE(report.manifest.files.at("scheduler.json").sha256 == sha256_hex(s.text_files.at("scheduler.json")));
  }
  REQUIRE(*counted.peak <= 4 * kChunk);  // every staging byte went through the allocator
  REQUIRE(*counted.peak > 0);
  REQUIRE(*counted.now == 0);  // and went back with the writers
}

TEST_CASE("checkpoint: submit() waits for the storage only when the state is larger than the staging bound") {
  lf_test::ScratchDir parent;
  const Snapshot s = odd_state(4);
  const uint64_t chunks = tensor_bytes(s) / kChunk;  // at least this many: 26
  constexpr int kThreads = 2, kDelayMs = 25;
  const ScopedEnv slow("LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS", "25");  // every chunk takes >= 25 ms to write
  // Bound of 4 chunks: staging chunk c waits until c - 4 chunks are written, at most kThreads at a time.
  {
    Writer w(parent.path, 3, /*async=*/true, true, small_chunks(kThreads, 4 * kChunk));
    const auto t0 = std::chrono::steady_clock::now();
    w.submit(s);
    const double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    w.wait();
    const auto r = w.take_results().at(0);
    REQUIRE(r.error.empty());
    const double floor_s = static_cast<double>((chunks - 4) / kThreads) * kDelayMs / 1000.0;
    INFO("stall " << stall << " s, write " << r.seconds << " s, chunks " << chunks);
    REQUIRE(stall >= floor_s);  // the ring was full: staging waited for the writers
    REQUIRE(w.progress().stall_s <= stall);  // the writer's own measure of it, inside submit()
    REQUIRE(w.progress().stall_s >= floor_s);
    REQUIRE(w.staging_bytes_allocated() == 4 * kChunk);
  }
  // No bound (staging_mb = 0): every chunk gets a slot, submit() only copies.
  {
    Writer w(parent.path, 3, /*async=*/true, true, small_chunks(kThreads, 0));
    const auto t0 = std::chrono::steady_clock::now();
    w.submit(odd_state(5));
    const double stall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    w.wait();
    const auto r = w.take_results().at(0);
    REQUIRE(r.error.empty());
    INFO("stall " << stall << " s, write " << r.seconds << " s");
    REQUIRE(r.seconds >= static_cast<double>(chunks / kThreads) * kDelayMs / 1000.0);
    REQUIRE(stall < 0.5 * r.seconds);  // the write went on after submit() returned
    uint64_t written_chunks = 0;  // each file's last chunk may be shorter: count them in the manifest
    for (const auto& [rel, e] : validate_checkpoint(r.path).manifest.files) written_chunks += e.chunk_sha256.size();
    REQUIRE(written_chunks > chunks);
    REQUIRE(w.staging_bytes_allocated() == written_chunks * kChunk);
    REQUIRE(validate_checkpoint(r.path).ok());
  }
}

TEST_CASE("checkpoint: progress() tells another thread the bytes, rate and ETA of a slow write") {
  lf_test::ScratchDir parent;
  const ScopedEnv slow("LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS", "40");
  WriterOptions o = small_chunks(/*threads=*/1, /*staging_bytes=*/0);
  o.progress_interval_s = 0.1;  // the writer logs a line this often (seen in the e2e test's log)
  Writer w(parent.path, 3, /*async=*/true, true, o);
  REQUIRE_FALSE(w.progress().active);
  REQUIRE(w.progress().name.empty());
  const auto source = w.progress_source();
  w.submit(odd_state(6));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // about 7 of 26 chunks
  const WriteProgress mid = source();
  INFO(mid.line());
  REQUIRE(mid.active);
  REQUIRE(mid.name == "epoch_0_step_6");
  REQUIRE(mid.bytes > 0);
  REQUIRE(mid.bytes_staged == mid.bytes);  // no bound: all staged at once
  REQUIRE(mid.bytes_written > 0);
  REQUIRE(mid.bytes_written < mid.bytes);
  REQUIRE(mid.eta_s() > 0);
  REQUIRE_THAT(mid.line(), Contains("epoch_0_step_6: "));
  REQUIRE_THAT(mid.line(), Contains(" MB written ("));
  REQUIRE_THAT(mid.line(), Contains("/s, ETA "));
  REQUIRE(mid.to_json().at("eta_s").get<double>() > 0);
  w.wait();
  const WriteProgress done = w.progress();
  REQUIRE_FALSE(done.active);
  REQUIRE(done.bytes_written == done.bytes);
  REQUIRE(done.seconds > 0.5);
  REQUIRE(done.error.empty());
}

TEST_CASE("checkpoint: a damaged chunk is named, and a version 1 manifest of whole-file hashes still validates") {
  lf_test::ScratchDir parent;
  const WriteResult r = write_checkpoint_dir(parent.path, odd_state(7), small_chunks(2, 0));
  REQUIRE(r.error.empty());
  const std::string dir = r.path, model = dir + "/model.safetensors";
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(5 * kChunk + 100));
    f.put('\x7f');
  }
  Report bad = validate_checkpoint(dir);
  REQUIRE(bad.problems.size() == 1);
  REQUIRE_THAT(bad.problems[0], Contains(model + ": SHA-256 differs from the manifest in chunk 5 of "));
  REQUIRE_THAT(bad.problems[0], Contains("(bytes 327680..393216)"));

  // The same directory as the writer before issue #45 described it: version 1, one SHA-256 per file.
  nlohmann::json j;
  std::ifstream(dir + "/MANIFEST.json") >> j;
  j["format_version"] = 1;
  for (auto& [rel, e] : j["files"].items()) {
    uint64_t bytes = 0;
    e = {{"bytes", e.at("bytes")}, {"sha256", sha256_file(dir + "/" + rel, &bytes)}};
  }
  std::ofstream(dir + "/MANIFEST.json") << j.dump(2) << "\n";
  Report old = validate_checkpoint(dir);
  REQUIRE(old.ok());  // the flipped byte is part of the file the version 1 hash describes now
  REQUIRE(old.manifest.format_version == 1);
  REQUIRE_FALSE(old.manifest.files.at("model.safetensors").chunked());
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(5 * kChunk + 100));
    f.put('\x00');
  }
  old = validate_checkpoint(dir);
  REQUIRE(old.problems ==
          std::vector<std::string>{model + ": SHA-256 differs from the manifest (corrupted, or the manifest is another "
                                           "run's)"});

  // A chunked entry whose hash count does not fit its size makes the manifest unreadable.
  j["format_version"] = 2;
  j["files"]["model.safetensors"] = {{"bytes", 3 * kChunk + 1}, {"chunk_bytes", kChunk}, {"chunk_sha256", {"a", "b"}}};
  std::ofstream(dir + "/MANIFEST.json") << j.dump(2) << "\n";
  const Report unreadable = validate_checkpoint(dir);
  REQUIRE(unreadable.problems.size() == 1);
  REQUIRE_THAT(unreadable.problems[0], Contains("unreadable ("));
  REQUIRE_THAT(unreadable.problems[0], Contains("lists 2 chunk hashes, not 4"));
}

TEST_CASE("checkpoint: a staging allocation that fails is reported as a failed write naming the key") {
  lf_test::ScratchDir parent;
  WriterOptions o = small_chunks(2, 0);
  o.allocate = [](size_t) -> std::shared_ptr<void> { return nullptr; };
  Writer w(parent.path, 3, /*async=*/true, true, o);
  w.submit(odd_state(8));
  w.wait();
  const auto r = w.take_results().at(0);
  REQUIRE_THAT(r.error, Contains("cannot allocate 64 KiB of checkpoint staging (0 KiB held)"));
  REQUIRE_THAT(r.error, Contains("lower checkpoint.staging_mb"));
  REQUIRE(find_latest(parent.path).empty());
  REQUIRE(list_checkpoints(parent.path).empty());
}

TEST_CASE("checkpoint: staging reserved on another thread while a write runs keeps to the bound and the bytes") {
  lf_test::ScratchDir parent;
  const Snapshot s = odd_state(5);
  const uint64_t state = tensor_bytes(s);
  CountingAllocator counted;
  WriterOptions o = small_chunks(/*threads=*/3, /*staging_bytes=*/6 * kChunk);
  o.allocate = counted.fn();
  for (int round = 0; round < 20; ++round) {  // the two threads interleave differently each time
    INFO("round " << round);
    remove_tree(parent.path + "/epoch_0_step_5");
    Writer w(parent.path, /*keep_last=*/3, /*async=*/true, /*leader=*/true, o);
    std::thread reserve([&] { w.reserve_staging(state); });  // as the trainer does while training starts
    w.submit(s);
    reserve.join();
    w.wait();
    const auto r = w.take_results().at(0);
    REQUIRE(r.error.empty());
    REQUIRE(validate_checkpoint(r.path).ok());
    REQUIRE(read_bytes(r.path + "/optimizer/rank_00000.safetensors").size() > 600000);
    REQUIRE(w.staging_bytes_allocated() <= 6 * kChunk);
  }
  REQUIRE(*counted.peak <= 6 * kChunk);
  REQUIRE(*counted.now == 0);
}
