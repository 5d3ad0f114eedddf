// Not a test: scripts/bench/checkpoint.sh's harness. Times, on one file
// system and in one process, what a checkpoint write is measured against:
//
//   --mode storage   a plain sequential write of --gb with fsync, 64 MiB per
//                    write(2) from one buffer (buffered, and with O_DIRECT where
//                    the file system takes it): the storage's own speed
//   --mode hash      SHA-256 of 512 MiB on one core: the built-in code and
//                    the library the build uses (OpenSSL where found)
//   --mode before    the writer as it was before issue #45 (commit 3fc20a7):
//                    the whole state copied into one host slab (the stall),
//                    then one thread per tensor file writing it front to back,
//                    hashing it with the built-in SHA-256
//   --mode after     checkpoint::Writer with --threads, --chunk-mb,
//                    --staging-mb (0: as large as the state), --direct
//
// on a synthetic state of --gb (a third in model.safetensors, two thirds in
// optimizer/rank_00000.safetensors, fp32 tensors of mixed sizes as a
// transformer's, a few bf16 ones). One JSON line per run on stdout:
// {"mode", "gb_per_s", "seconds", "stall_s", "staging_mb", ...}.
#include <fcntl.h>     // open, O_DIRECT
#include <sys/stat.h>  // mkdir
#include <unistd.h>    // write, fsync

#include <chrono>     // std::chrono::steady_clock
#include <cstdio>     // std::printf
#include <cstdlib>    // std::aligned_alloc
#include <cerrno>     // errno
#include <cstring>    // std::memset, std::memcpy, std::strerror
#include <map>        // std::map
#include <memory>     // std::shared_ptr
#include <stdexcept>  // std::runtime_error
#include <iostream>   // std::cout
#include <string>     // std::string
#include <thread>     // std::thread
#include <vector>     // std::vector

#include <ATen/ATen.h>        // at::empty
#include <CLI/CLI.hpp>        // CLI::App
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"

using namespace loongforge;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A transformer-like state of about `bytes`: per layer a few large fp32
// matrices, a bias and a norm weight (odd sizes), and a bf16 embedding.
checkpoint::Snapshot synthetic_state(uint64_t bytes) {
  checkpoint::Snapshot s;
  s.name = "epoch_0_step_1";
  const int64_t widths[] = {2048, 1536, 1024};
  uint64_t model = 0;
  const uint64_t model_target = bytes / 3;
  auto fill = [](at::Tensor t, int seed) {
    std::memset(t.data_ptr(), seed % 251, static_cast<size_t>(t.numel()) * t.element_size());
    return t;
  };
  auto& weights = s.tensor_files["model.safetensors"];
  auto& moments = s.tensor_files["optimizer/rank_00000.safetensors"];
  weights.emplace_back("embed.weight", fill(at::empty({32003, 64}, at::kBFloat16), 1));
  model += 32003ull * 64 * 2;
  for (int layer = 0; model < model_target; ++layer) {
    const int64_t w = widths[layer % 3];
    for (const auto& [part, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"qkv.weight", {3 * w, w}}, {"proj.weight", {w, w}}, {"mlp.up.weight", {3 * w, w}},
             {"mlp.down.weight", {w, 3 * w}}, {"mlp.up.bias", {3 * w + 1}}, {"norm.weight", {w - 3}}}) {
      at::Tensor t = fill(at::empty(shape, at::kFloat), layer);
      const std::string name = "layers." + std::to_string(layer) + "." + part;
      model += static_cast<uint64_t>(t.numel()) * 4;
      weights.emplace_back(name, t);
      moments.emplace_back(name + ".exp_avg", fill(at::empty(shape, at::kFloat), layer + 1));
      moments.emplace_back(name + ".exp_avg_sq", fill(at::empty(shape, at::kFloat), layer + 2));
    }
  }
  s.text_files["trainer_state.json"] = "{\"step\": 1}\n";
  s.text_files["scheduler.json"] = "{\"lr\": 0.001}\n";
  s.manifest.run_id = "bench";
  s.manifest.step = 1;
  s.manifest.config = nlohmann::json::object();
  return s;
}

uint64_t state_bytes(const checkpoint::Snapshot& s) {
  uint64_t n = 0;
  for (const auto& [rel, tensors] : s.tensor_files)
    for (const auto& [name, t] : tensors) n += static_cast<uint64_t>(t.numel()) * t.element_size();
  return n;
}

void write_all(int fd, const char* p, uint64_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) throw std::runtime_error("write " + path + ": " + std::strerror(errno));
    p += w, n -= static_cast<uint64_t>(w);
  }
}

// --mode storage: one sequential file of `bytes`, 64 MiB per write, fsync.
nlohmann::json storage(const std::string& dir, uint64_t bytes, bool direct) {
  const uint64_t block = 64ull << 20;
  char* buf = static_cast<char*>(std::aligned_alloc(4096, block));
  std::memset(buf, 0x5a, block);
  const std::string path = dir + "/bench-storage.bin";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
  if (fd < 0) {
    std::free(buf);
    return {{"mode", direct ? "storage-direct" : "storage"}, {"error", std::strerror(errno)}};
  }
  const auto t0 = Clock::now();
  uint64_t done = 0;
  for (; done + block <= bytes; done += block) write_all(fd, buf, block, path);
  ::fsync(fd);
  const double s = since(t0);
  ::close(fd);
  ::unlink(path.c_str());
  std::free(buf);
  return {{"mode", direct ? "storage-direct" : "storage"}, {"bytes", done}, {"seconds", s}, {"gb_per_s", done / s / 1e9}};
}

// --mode hash: MB/s of one core.
nlohmann::json hash_speed() {
  std::string data(512u << 20, '\0');
  for (size_t i = 0; i < data.size(); i += 64) data[i] = static_cast<char>(i * 31);
  nlohmann::json out = {{"mode", "hash"}};
  for (const auto impl : {Sha256::Impl::builtin, Sha256::Impl::best}) {
    const auto t0 = Clock::now();
    Sha256 h(impl);
    h.update(data);
    h.hex();
    out[impl == Sha256::Impl::builtin ? "builtin_mb_per_s" : "best_mb_per_s"] = data.size() / since(t0) / 1e6;
  }
  out["best"] = Sha256::implementation();
  return out;
}

// --mode before: commit 3fc20a7's path. make_snapshot() copied every tensor into
// one slab (the stall); write_checkpoint_dir() ran one thread per tensor file,
// each writing its safetensors file front to back (write(2) per tensor, the
// built-in SHA-256 on the same bytes), fsync; then the text files, the manifest,
// and the rename.
nlohmann::json before(const std::string& dir, const checkpoint::Snapshot& s) {
  const auto t0 = Clock::now();
  const uint64_t total = state_bytes(s);
  std::shared_ptr<void> slab(std::malloc(total), [](void* p) { std::free(p); });
  char* cur = static_cast<char*>(slab.get());
  std::map<std::string, checkpoint::NamedTensors> staged;
  for (const auto& [rel, tensors] : s.tensor_files)
    for (const auto& [name, t] : tensors) {
      at::Tensor h = at::from_blob(cur, t.sizes(), t.options());
      h.copy_(t);
      cur += static_cast<uint64_t>(t.numel()) * t.element_size();
      staged[rel].emplace_back(name, h);
    }
  const double stall = since(t0);
  const std::string tmp = dir + "/.bench-before.tmp";
  remove_tree(tmp);
  make_dirs(tmp + "/optimizer");
  std::vector<std::thread> threads;
  for (const auto& [rel_, tensors_] : staged) {
    const std::string path = tmp + "/" + rel_;
    const checkpoint::NamedTensors* tensors = &tensors_;
    threads.emplace_back([path, tensors] {
      nlohmann::ordered_json header;
      uint64_t offset = 0;
      for (const auto& [name, t] : *tensors) {
        const uint64_t n = static_cast<uint64_t>(t.numel()) * t.element_size();
        header[name] = {{"dtype", t.scalar_type() == at::kFloat ? "F32" : "BF16"},
                        {"shape", t.sizes().vec()},
                        {"data_offsets", {offset, offset + n}}};
        offset += n;
      }
      std::string h = header.dump();
      h.append((8 - h.size() % 8) % 8, ' ');
      const uint64_t hn = h.size();
      Sha256 sha(Sha256::Impl::builtin);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      auto put = [&](const void* p, uint64_t n) {
        write_all(fd, static_cast<const char*>(p), n, path);
        sha.update(p, n);
      };
      put(&hn, 8);
      put(h.data(), h.size());
      for (const auto& [name, t] : *tensors) put(t.data_ptr(), static_cast<uint64_t>(t.numel()) * t.element_size());
      ::fsync(fd);
      ::close(fd);
      sha.hex();
    });
  }
  for (auto& t : threads) t.join();
  fsync_directory(tmp);
  const double seconds = since(t0);
  remove_tree(tmp);
  return {{"mode", "before"}, {"bytes", total}, {"seconds", seconds}, {"stall_s", stall},
          {"gb_per_s", total / seconds / 1e9}, {"staging_mb", total >> 20}, {"threads", staged.size()}};
}

// --mode after: the Writer, from submit() to the published directory.
nlohmann::json after(const std::string& dir, const checkpoint::Snapshot& s, const checkpoint::WriterOptions& o,
                     uint64_t state) {
  remove_tree(dir + "/bench-after");
  checkpoint::Writer w(dir + "/bench-after", /*keep_last=*/1, /*async=*/true, /*leader=*/true, o);
  w.reserve_staging(state);  // as the trainer does while training starts
  const auto t0 = Clock::now();
  w.submit(s);
  const double stall = since(t0);
  w.wait();
  const double seconds = since(t0);
  const auto r = w.take_results().at(0);
  nlohmann::json out = {{"mode", "after"}, {"bytes", r.bytes}, {"seconds", seconds}, {"stall_s", stall},
                        {"gb_per_s", state / seconds / 1e9}, {"staging_mb", w.staging_bytes_allocated() >> 20},
                        {"threads", o.threads}, {"chunk_mb", o.chunk_bytes >> 20}, {"direct", o.direct_io}};
  if (!r.error.empty()) out["error"] = r.error;
  const auto t1 = Clock::now();
  const auto report = checkpoint::validate_checkpoint(r.path, o.threads);
  out["validate_s"] = since(t1);
  out["valid"] = report.ok();
  remove_tree(dir + "/bench-after");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_checkpoint: checkpoint write throughput against the storage's own (scripts/bench/checkpoint.sh)"};
  std::string mode = "after", dir = "/dev/shm";
  double gb = 2.0;
  int threads = 8, repeat = 1;
  int64_t chunk_mb = 64, staging_mb = 4096;
  bool direct = true;
  app.add_option("--mode", mode, "storage | hash | before | after")->required();
  app.add_option("--dir", dir, "Directory on the file system to measure");
  app.add_option("--gb", gb, "Size of the synthetic state (and of the storage test's file), GB");
  app.add_option("--threads", threads, "after: hash-and-write threads (checkpoint.write_threads)");
  app.add_option("--chunk-mb", chunk_mb, "after: checkpoint.chunk_mb");
  app.add_option("--staging-mb", staging_mb, "after: checkpoint.staging_mb (0: as large as the state)");
  app.add_option("--direct", direct, "after: checkpoint.direct_io (1/0)");
  app.add_option("--repeat", repeat, "Runs of the measurement");
  CLI11_PARSE(app, argc, argv);

  const auto bytes = static_cast<uint64_t>(gb * 1e9);
  if (mode == "hash") {
    for (int i = 0; i < repeat; ++i) std::cout << hash_speed().dump() << std::endl;
    return 0;
  }
  make_dirs(dir);
  if (mode == "storage") {
    for (int i = 0; i < repeat; ++i) {
      for (const bool direct_write : {false, true}) {
        nlohmann::json r = storage(dir, bytes, direct_write);
        r["dir"] = dir;
        std::cout << r.dump() << std::endl;
      }
    }
    return 0;
  }
  const checkpoint::Snapshot s = synthetic_state(bytes);
  const uint64_t state = state_bytes(s);
  checkpoint::WriterOptions o;
  o.threads = threads;
  o.chunk_bytes = static_cast<uint64_t>(chunk_mb) << 20;
  o.staging_bytes = static_cast<uint64_t>(staging_mb) << 20;
  o.direct_io = direct;
  for (int i = 0; i < repeat; ++i) {
    nlohmann::json r = mode == "before" ? before(dir, s) : after(dir, s, o, state);
    r["dir"] = dir;
    r["state_gb"] = state / 1e9;
    std::cout << r.dump() << std::endl;
  }
  return 0;
}
