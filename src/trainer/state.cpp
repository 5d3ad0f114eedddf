// Snapshots of the training state and resuming from them (state.hpp).
#include "loongforge/trainer/state.hpp"

#include <chrono>   // std::chrono::steady_clock
#include <cstdio>   // std::snprintf
#include <fstream>  // std::ifstream
#include <map>      // std::map
#include <mutex>    // std::lock_guard

#include <ATen/ATen.h>             // at::NoGradGuard
#include <ATen/Context.h>          // at::globalContext
#include <ATen/core/Generator.h>   // at::Generator
#if LOONGFORGE_WITH_CUDA_KERNELS
#include <cuda_runtime_api.h>  // cudaHostAlloc, cudaFreeHost
#endif

#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/common/version.hpp"

namespace loongforge::trainer {

namespace {

constexpr const char* kOptimizerFile = "optimizer/rank_00000.safetensors";

std::string optimizer_file(int64_t rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer/rank_%05lld.safetensors", static_cast<long long>(rank));
  return buf;
}

// Keys that change the numbers of a run; everything else (paths, names,
// logging, checkpoint cadence, threads) may change across a resume. The
// accumulation is recorded but not compared: a resume keeps the global batch
// (micro batch x accumulation x world size) instead (check_resume).
constexpr const char* kRecordedKeys[] = {
    "run.seed", "data.action_horizon", "data.max_text_len", "data.embodiment_id", "data.shuffle", "data.sampler",
    "data.open_episodes", "data.shuffle_buffer", "data.normalization",
    "trainer.micro_batch_size", "trainer.gradient_accumulation_steps", "trainer.max_steps",
    "trainer.grad_clip_norm", "optimizer.name", "optimizer.lr", "optimizer.weight_decay", "optimizer.beta1",
    "optimizer.beta2", "optimizer.eps", "schedule.name", "schedule.warmup_steps", "schedule.warmup_ratio",
    "schedule.min_lr_ratio", "precision.mode"};
constexpr const char* kNotCompared = "trainer.gradient_accumulation_steps";
// Keys recorded since a later version: a checkpoint written before them trained with these values.
const std::map<std::string, std::string> kRecordedSince = {
    {"data.sampler", "uniform"}, {"data.open_episodes", "4"}, {"data.shuffle_buffer", "256"}};

std::string hex(const at::Tensor& bytes) {
  static const char* d = "0123456789abcdef";
  const auto* p = bytes.data_ptr<uint8_t>();
  std::string s;
  for (int64_t i = 0; i < bytes.numel(); ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

at::Tensor unhex(const std::string& s, const std::string& what) {
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw CheckpointError(what + ": not a hex string");
  };
  if (s.size() % 2 != 0) throw CheckpointError(what + ": odd length");
  at::Tensor t = at::empty({static_cast<int64_t>(s.size() / 2)}, at::kByte);
  auto* p = t.data_ptr<uint8_t>();
  for (size_t i = 0; i < s.size(); i += 2) p[i / 2] = static_cast<uint8_t>(nibble(s[i]) << 4 | nibble(s[i + 1]));
  return t;
}

at::Tensor generator_state(at::Generator g) {  // a handle: copies share the generator
  std::lock_guard<std::mutex> lock(g.mutex());
  return g.get_state();
}

// The default generators whose state a checkpoint carries: the CPU one, and
// the CUDA one of `device` when training there.
std::vector<std::pair<std::string, at::Generator>> default_generators(c10::Device device) {
  std::vector<std::pair<std::string, at::Generator>> gens = {
      {"cpu_default_generator", at::globalContext().defaultGenerator(c10::Device(c10::kCPU))}};
  if (device.is_cuda()) gens.emplace_back("cuda_default_generator", at::globalContext().defaultGenerator(device));
  return gens;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json j;
  in >> j;
  return j;
}

}  // namespace

nlohmann::json compared_config(const config::Config& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* key : kRecordedKeys) j[key] = config::value_text(cfg, key);
  return j;
}

std::string model_identity_hash(const model::Model& net) {
  Sha256 h;
  for (const auto& p : net.info().params) {
    std::string line = p.name + ":";
    for (auto d : p.shape) line += std::to_string(d) + ",";
    line += p.trainable ? ":t\n" : ":f\n";
    h.update(line);
  }
  return h.hex();
}

void seed_default_generators(const config::Config& cfg, int64_t rank) {
  at::manual_seed(static_cast<uint64_t>(cfg.run.seed) + static_cast<uint64_t>(rank));
}

// ---------------------------------------------------------------------------
// Snapshots

uint64_t snapshot_state_bytes(const model::Model& net, const optim::Optimizer& optimizer) {
  uint64_t total = 0;
  auto bytes_of = [](const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); };
  for (const auto& p : net.parameters()) total += bytes_of(optimizer.master_weight(p.tensor));
  for (const auto& s : optimizer.state_tensors()) total += bytes_of(s.second);
  return total;
}

checkpoint::WriterOptions writer_options(const config::Config& cfg, bool pinned) {
  checkpoint::WriterOptions o;
  o.threads = static_cast<int>(cfg.checkpoint.write_threads);
  o.chunk_bytes = static_cast<uint64_t>(cfg.checkpoint.chunk_mb) << 20;
  o.staging_bytes = static_cast<uint64_t>(cfg.checkpoint.staging_mb) << 20;
  o.direct_io = cfg.checkpoint.direct_io;
#if LOONGFORGE_WITH_CUDA_KERNELS
  // Page-locked slots: device-to-host copies run at full bandwidth (cudaHostAlloc returns page-aligned
  // memory, which O_DIRECT needs).
  if (pinned)
    o.allocate = [](size_t bytes) -> std::shared_ptr<void> {
      void* p = nullptr;
      if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) return nullptr;
      return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
    };
#endif
  (void)pinned;
  return o;
}

checkpoint::Snapshot make_snapshot(const config::Config& cfg, const model::Model& net, const optim::Optimizer& optimizer,
                                   const optim::Schedule& schedule, const TrainerPosition& pos, int64_t world_size,
                                   const std::vector<Engine>& engines) {
  at::NoGradGuard no_grad;
  checkpoint::Snapshot s;
  s.name = "epoch_" + std::to_string(pos.epoch) + "_step_" + std::to_string(pos.step);
  // The live tensors: Writer::submit() stages them before training goes on (Note [Bounded staging]).
  checkpoint::NamedTensors weights, opt_state;
  c10::Device device = c10::kCPU;
  for (const auto& p : net.parameters()) {
    if (p.tensor.is_cuda()) device = p.tensor.device();
    weights.emplace_back(p.info->name, optimizer.master_weight(p.tensor).detach());
  }
  for (const auto& [name, t] : optimizer.state_tensors()) opt_state.emplace_back(name, t.detach());
  s.tensor_files["model.safetensors"] = std::move(weights);
  s.tensor_files[kOptimizerFile] = std::move(opt_state);

  nlohmann::json rng = nlohmann::json::object();
  for (const auto& [name, gen] : default_generators(device)) rng[name] = hex(generator_state(gen));
  const nlohmann::json trainer_state = {
      {"step", pos.step},
      {"epoch", pos.epoch},
      {"run_id", pos.run_id},
      {"seed", cfg.run.seed},
      {"data", {{"global_batch", pos.global_batch},
                {"steps_per_epoch", pos.steps_per_epoch},
                {"epoch", pos.epoch},
                {"step_in_epoch", pos.step % pos.steps_per_epoch},
                {"note", "sample order and flow-matching draws are pure functions of (seed, step, global batch); "
                         "docs/training-semantics.md"}}},
      {"rng", rng},
      {"optimizer", optimizer.state_json()},
      {"model_path", cfg.model.path},
      {"data_path", cfg.data.path}};
  const nlohmann::json sched = {{"name", cfg.schedule.name},           {"peak_lr", schedule.peak_lr},
                                {"warmup_steps", schedule.warmup_steps}, {"total_steps", schedule.total_steps},
                                {"min_lr_ratio", schedule.min_lr_ratio}, {"next_lr", schedule.lr_at(pos.step)}};
  s.text_files["trainer_state.json"] = trainer_state.dump(2) + "\n";
  s.text_files["scheduler.json"] = sched.dump(2) + "\n";
  nlohmann::json index = nlohmann::json::object();
  for (const auto& e : engines) {
    index[e.name] = e.status_json();
    if (e.on() && e.save_state)
      s.text_files["loongforge_state/" + e.name + ".json"] = e.save_state().dump(2) + "\n";
  }
  s.text_files["loongforge_state/engines.json"] = index.dump(2) + "\n";

  auto& m = s.manifest;
  m.run_id = pos.run_id;
  m.step = pos.step;
  m.epoch = pos.epoch;
  m.world_size = world_size;
  m.config = compared_config(cfg);
  m.config_hash = sha256_hex(m.config.dump());
  m.model_hash = model_identity_hash(net);
  m.loongforge_version = version_string();
  return s;
}

std::vector<std::string> peer_optimizer_files(int64_t world_size) {
  std::vector<std::string> out;
  for (int64_t r = 1; r < world_size; ++r) out.push_back(optimizer_file(r));
  return out;
}

checkpoint::Snapshot make_peer_snapshot(const optim::Optimizer& optimizer, const TrainerPosition& pos, int64_t rank) {
  at::NoGradGuard no_grad;
  checkpoint::Snapshot s;
  s.name = "epoch_" + std::to_string(pos.epoch) + "_step_" + std::to_string(pos.step);
  s.peer = true;
  s.manifest.step = pos.step;
  checkpoint::NamedTensors opt_state;
  for (const auto& [name, t] : optimizer.state_tensors()) opt_state.emplace_back(name, t.detach());
  s.tensor_files[optimizer_file(rank)] = std::move(opt_state);
  return s;
}

// ---------------------------------------------------------------------------
// Resume

namespace {
checkpoint::Report valid_or_throw(const std::string& dir) {
  checkpoint::Report report = checkpoint::validate_checkpoint(dir);
  if (!report.ok()) {
    std::string msg = "cannot resume from '" + dir + "': it is damaged or incomplete" +
                      (report.manifest.verified ? "" : " (a preemption save, never verified)") + ":";
    for (const auto& p : report.problems) msg += "\n  " + p;
    throw CheckpointError(msg + "\nPick another checkpoint, or use --resume latest to take the newest intact one.");
  }
  return report;
}

int64_t saved_int(const checkpoint::Manifest& m, const char* key, const std::string& dir) {
  const auto it = m.config.find(key);
  if (it == m.config.end()) throw CheckpointError(dir + "/MANIFEST.json: config key " + key + " is missing");
  return std::stoll(it->get<std::string>());
}

int64_t global_batch_of(const checkpoint::Manifest& m, const std::string& dir) {
  return saved_int(m, "trainer.micro_batch_size", dir) * saved_int(m, "trainer.gradient_accumulation_steps", dir) *
         m.world_size;
}
}  // namespace

namespace {
// Only the manifest; resume_from() verifies every file.
checkpoint::Manifest manifest_of(const std::string& dir) {
  try {
    // read_manifest's message names the file and shows only a printable excerpt of a corrupt one.
    return checkpoint::read_manifest(dir + "/" + checkpoint::kManifest);
  } catch (const std::exception& e) {
    throw CheckpointError("cannot resume from '" + dir + "': " + e.what() +
                          "; pick another checkpoint, or use --resume latest");
  }
}
}  // namespace

int64_t checkpoint_micro_batch(const std::string& dir) {
  return saved_int(manifest_of(dir), "trainer.micro_batch_size", dir);
}

int64_t check_resume(const std::string& dir, const config::Config& cfg, int64_t world_size, std::string* note) {
  const checkpoint::Manifest manifest = manifest_of(dir);
  const int64_t saved_world = manifest.world_size;
  const int64_t global = global_batch_of(manifest, dir);
  const int64_t b = cfg.trainer.micro_batch_size;
  // Only a change of world size is absorbed here; any other difference
  // (micro-batch size, accumulation on the same world size) is for
  // resume_from() to list with the rest.
  if (saved_world == world_size || saved_int(manifest, "trainer.micro_batch_size", dir) != b)
    return cfg.trainer.gradient_accumulation_steps;
  if (global % (b * world_size) != 0) {
    std::string fits;
    for (int64_t w = 1; w <= global / b; ++w)
      if (global % (b * w) == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(w);
    throw CheckpointError("cannot resume '" + dir + "' on " + std::to_string(world_size) + " rank(s): its global batch " +
                          std::to_string(global) + " (trained on " + std::to_string(saved_world) +
                          " rank(s)) is not a multiple of micro_batch_size " + std::to_string(b) + " x " +
                          std::to_string(world_size) + " ranks, so the run would change. Resume on " + fits +
                          " rank(s), or start a new run");
  }
  const int64_t k = global / (b * world_size);
  if (note) {
    *note = "resuming a checkpoint of " + std::to_string(saved_world) + " rank(s) on " + std::to_string(world_size) + ": ";
    if (k != cfg.trainer.gradient_accumulation_steps)
      *note += "trainer.gradient_accumulation_steps " + std::to_string(cfg.trainer.gradient_accumulation_steps) +
               " -> " + std::to_string(k) + " keeps its global batch of " + std::to_string(global) + " samples";
    else
      *note += "its global batch of " + std::to_string(global) + " samples is kept (accumulation " +
               std::to_string(k) + ")";
  }
  return k;
}

// Note [Re-sharding]: a checkpoint's optimizer state, whatever wrote it, as
// full per-parameter moments ("<name>.exp_avg", "<name>.exp_avg_sq" in the
// parameter's shape). An unsharded checkpoint holds them as they are; a
// sharded one (state_json's "sharded": world W, the sharded parameters in
// flat order) holds, in optimizer/rank_r, the range [r * chunk, min((r + 1) *
// chunk, total)) of the flat moments, and rank 0's file the replicated
// tensors. Each range is copied back into the parameters it covers, so any
// optimizer on any world size takes exactly the numbers that were saved.
// Every rank assembles the whole state once at resume (memory: the full fp32
// moments, transiently).
std::map<std::string, at::Tensor> read_optimizer_state(const std::string& dir, const nlohmann::json& opt_json,
                                                       const model::Model& net) {
  std::map<std::string, at::Tensor> opt;
  if (!opt_json.contains("sharded")) {
    for (auto& [name, t] : checkpoint::read_safetensors(dir + "/" + kOptimizerFile)) opt[name] = t;
    return opt;
  }
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : net.info().params) shapes[p.name] = p.shape;
  const nlohmann::json& sh = opt_json.at("sharded");
  const int64_t world = sh.at("world").get<int64_t>(), total = sh.at("total").get<int64_t>();
  const int64_t chunk = sh.at("chunk").get<int64_t>();
  struct Piece {
    std::string name;
    int64_t offset, numel;
  };
  std::vector<Piece> flat;
  int64_t off = 0;
  for (const auto& e : sh.at("params")) {
    flat.push_back({e.at(0).get<std::string>(), off, e.at(1).get<int64_t>()});
    off += flat.back().numel;
  }
  if (off != total || chunk * world < total)
    throw CheckpointError(dir + "/trainer_state.json: optimizer.sharded lists " + std::to_string(off) +
                          " elements but total is " + std::to_string(total));
  for (const auto& f : flat)
    for (const char* what : {".exp_avg", ".exp_avg_sq"}) opt[f.name + what] = at::zeros({f.numel}, at::kFloat);
  for (int64_t r = 0; r < world; ++r) {
    const std::string file = dir + "/" + optimizer_file(r);
    std::map<std::string, at::Tensor> t;
    for (auto& [name, x] : checkpoint::read_safetensors(file)) t[name] = x;
    const int64_t b = std::min(r * chunk, total), e = std::min((r + 1) * chunk, total);
    for (const char* what : {".exp_avg", ".exp_avg_sq"}) {
      const auto it = t.find(std::string("shard") + what);
      if (it == t.end() || it->second.numel() != e - b)
        throw CheckpointError(file + ": shard" + what + " is missing or does not hold " + std::to_string(e - b) +
                              " elements (range [" + std::to_string(b) + ", " + std::to_string(e) + "))");
      for (const auto& f : flat) {
        const int64_t s0 = std::max(b, f.offset), s1 = std::min(e, f.offset + f.numel);
        if (s0 < s1) opt[f.name + what].narrow(0, s0 - f.offset, s1 - s0).copy_(it->second.narrow(0, s0 - b, s1 - s0));
      }
      t.erase(it);
    }
    for (auto& [name, x] : t) opt[name] = x;  // replicated tensors (rank 0)
  }
  for (auto& [name, x] : opt) {
    const std::string param = name.substr(0, name.rfind(".exp_avg"));
    if (auto s = shapes.find(param); s != shapes.end()) x = x.reshape(s->second);
  }
  return opt;
}

nlohmann::json optimizer_json(const nlohmann::json& trainer_state) {
  // Checkpoints before the Optimizer seam kept the step counts at top level.
  return trainer_state.contains("optimizer") ? trainer_state.at("optimizer")
                                             : nlohmann::json{{"steps", trainer_state.at("optimizer_steps")}};
}

std::map<std::string, at::Tensor> read_optimizer_state(const std::string& dir, const model::Model& net,
                                                       int64_t* step) {
  const nlohmann::json state = read_json(dir + "/trainer_state.json");
  if (step) *step = state.value("step", int64_t{-1});
  return read_optimizer_state(dir, optimizer_json(state), net);
}

nlohmann::json resume_from(const std::string& dir, const config::Config& cfg, model::Model& net,
                           optim::Optimizer& optimizer, int64_t world_size, const std::vector<Engine>& engines,
                           bool seal) {
  const auto t_verify = std::chrono::steady_clock::now();
  const checkpoint::Report report = valid_or_throw(dir);
  if (!report.manifest.verified && seal) {  // Note [Preemption saves]: verified before anything is trained from it
    checkpoint::seal_checkpoint(report);
    size_t chunks = 0;
    for (const auto& [rel, e] : report.sealed) chunks += e.chunk_sha256.size();
    LF_LOG(logger("trainer"), info) << "verified preemption save " << dir << ": the CRC-32 of each of its " << chunks
                                    << " chunks matches; their SHA-256s are now in its manifest ("
                                    << std::chrono::duration<double>(std::chrono::steady_clock::now() - t_verify).count()
                                    << " s)";
  }
  // Compatibility: list every difference at once.
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& p : net.info().params) shapes.emplace_back(p.name, p.shape);
  std::vector<std::string> diffs = checkpoint::compare_parameters(dir, shapes);
  const nlohmann::json now = compared_config(cfg);
  for (const auto& [key, value] : now.items()) {
    if (key == kNotCompared) continue;
    const auto saved = report.manifest.config.find(key);
    const auto implied = kRecordedSince.find(key);
    if (saved == report.manifest.config.end() && implied != kRecordedSince.end()) {
      if (implied->second != value.get<std::string>())
        diffs.push_back("config " + key + ": checkpoint " + implied->second + " (written before the key existed), now " +
                        value.get<std::string>());
    } else if (saved == report.manifest.config.end())
      diffs.push_back("config " + key + ": not recorded in the checkpoint");
    else if (*saved != value)
      diffs.push_back("config " + key + ": checkpoint " + saved->get<std::string>() + ", now " +
                      value.get<std::string>());
  }
  const int64_t global_now = cfg.trainer.micro_batch_size * cfg.trainer.gradient_accumulation_steps * world_size;
  const int64_t global_then = global_batch_of(report.manifest, dir);
  if (global_now != global_then)
    diffs.push_back("global batch: checkpoint " + std::to_string(global_then) + ", now " + std::to_string(global_now));
  if (diffs.empty() && report.manifest.model_hash != model_identity_hash(net))
    diffs.push_back("trainable parameters differ (freezing config of the model file)");
  if (!diffs.empty()) {
    std::string msg = "cannot resume from '" + dir + "': it does not match this run:";
    for (const auto& d : diffs) msg += "\n  " + d;
    throw CheckpointError(msg + "\nResume with the same model file and config, or start a new run.");
  }

  at::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> saved;
  for (auto& [name, t] : checkpoint::read_safetensors(dir + "/model.safetensors")) saved[name] = t;
  c10::Device device = c10::kCPU;
  for (const auto& p : net.parameters()) {
    optimizer.load_weight(p.tensor, saved.at(p.info->name));  // a bf16 working copy's master, then the copy
    if (p.tensor.is_cuda()) device = p.tensor.device();
  }
  const nlohmann::json state = read_json(dir + "/trainer_state.json");
  const nlohmann::json opt_json = optimizer_json(state);
  optimizer.load_state(read_optimizer_state(dir, opt_json, net), opt_json);
  const nlohmann::json& rng = state.at("rng");
  for (auto& [name, gen] : default_generators(device)) {
    if (!rng.contains(name)) {
      LF_LOG(logger("trainer"), warn) << dir << "/trainer_state.json has no " << name
                                      << " state (written on another device kind): it keeps its seeded state";
      continue;
    }
    const at::Tensor bytes = unhex(rng.at(name).get<std::string>(), dir + "/trainer_state.json rng." + name);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(bytes);
  }
  for (const auto& e : engines) {
    const std::string file = dir + "/loongforge_state/" + e.name + ".json";
    if (e.on() && e.load_state && path_exists(file)) e.load_state(read_json(file));
  }
  return state;
}

}  // namespace loongforge::trainer
