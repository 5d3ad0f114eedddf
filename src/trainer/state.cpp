// Snapshots of the training state and resuming from them.
#include "loongforge/trainer/state.hpp"

#include <fstream>  // std::ifstream
#include <mutex>    // std::lock_guard
#include <string>   // std::stoll

#include <ATen/ATen.h>                 // at::NoGradGuard
#include <ATen/CPUGeneratorImpl.h>     // at::CPUGeneratorImpl
#include <ATen/core/Generator.h>       // at::Generator

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#if LOONGFORGE_WITH_CUDA_KERNELS
#include <cuda_runtime_api.h>  // cudaHostAlloc, cudaFreeHost
#include <torch/cuda.h>        // torch::cuda::synchronize
#endif
#include <cstdlib>  // std::malloc
#include "loongforge/common/sha256.hpp"
#include "loongforge/common/version.hpp"

namespace loongforge::trainer {

namespace {

constexpr const char* kOptimizerFile = "optimizer/rank_00000.safetensors";

// Keys that change the numbers of a run; everything else (paths, names,
// logging, checkpoint cadence, threads) may change across a resume.
constexpr const char* kComparedKeys[] = {
    "run.seed", "data.action_horizon", "data.max_text_len", "data.embodiment_id", "data.shuffle", "data.normalization",
    "trainer.micro_batch_size", "trainer.gradient_accumulation_steps", "trainer.max_steps",
    "trainer.grad_clip_norm", "optimizer.name", "optimizer.lr", "optimizer.weight_decay", "optimizer.beta1",
    "optimizer.beta2", "optimizer.eps", "schedule.name", "schedule.warmup_steps", "schedule.warmup_ratio",
    "schedule.min_lr_ratio", "precision.mode", "precision.fp32_master_weights"};

std::string hex(const at::Tensor& bytes) {
  static const char* d = "0123456789abcdef";
  const auto* p = bytes.data_ptr<uint8_t>();
  std::string s;
  for (int64_t i = 0; i < bytes.numel(); ++i) s += d[p[i] >> 4], s += d[p[i] & 15];
  return s;
}

}  // namespace

nlohmann::json compared_config(const config::Config& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const char* key : kComparedKeys) j[key] = config::value_text(cfg, key);
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

namespace {
// `dst` (reused host buffer, allocated on first use) <- `src`, asynchronously
// when `src` is on a GPU and `dst` is pinned.
void copy_to_host(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.defined())
    dst = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(src.is_cuda()));
  dst.copy_(src.detach(), /*non_blocking=*/true);
}
}  // namespace

void reserve_snapshot_buffers(SnapshotBuffers& buf, const model::Model& net, bool pinned) {
  const auto params = net.parameters();
  auto aligned = [](size_t n) { return (n + 255) / 256 * 256; };
  size_t total = 0;
  for (const auto& p : params) {
    const size_t bytes = aligned(static_cast<size_t>(p.tensor.numel()) * p.tensor.element_size());
    total += p.info->trainable ? 3 * bytes : bytes;  // weights (+ exp_avg, exp_avg_sq of the same dtype)
  }
  void* base = nullptr;
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (pinned) {
    if (cudaHostAlloc(&base, total, cudaHostAllocDefault) != cudaSuccess) base = nullptr;
    if (base) buf.slab = std::shared_ptr<void>(base, [](void* p) { cudaFreeHost(p); });
  }
#endif
  (void)pinned;
  if (!base) {
    base = std::malloc(total);
    if (!base) throw TrainingError("cannot allocate " + std::to_string(total >> 20) + " MB for checkpoint snapshots");
    buf.slab = std::shared_ptr<void>(base, [](void* p) { std::free(p); });
  }
  char* cur = static_cast<char*>(base);
  auto carve = [&](const at::Tensor& like) {
    at::Tensor t = at::from_blob(cur, like.sizes(), like.options().device(at::kCPU));
    cur += aligned(static_cast<size_t>(like.numel()) * like.element_size());
    return t;
  };
  buf.weights.clear(), buf.exp_avg.clear(), buf.exp_avg_sq.clear();
  for (const auto& p : params) {
    buf.weights.push_back(carve(p.tensor));
    if (!p.info->trainable) continue;
    buf.exp_avg.push_back(carve(p.tensor));
    buf.exp_avg_sq.push_back(carve(p.tensor));
  }
}

checkpoint::Snapshot make_snapshot(const config::Config& cfg, const model::Model& net, AdamW& optimizer,
                                   const Schedule& schedule, const TrainerPosition& pos, int64_t world_size,
                                   SnapshotBuffers& buf) {
  at::NoGradGuard no_grad;
  checkpoint::Snapshot s;
  s.name = "epoch_" + std::to_string(pos.epoch) + "_step_" + std::to_string(pos.step);
  const auto params = net.parameters();
  buf.weights.resize(params.size());
  buf.exp_avg.resize(optimizer.state().size());
  buf.exp_avg_sq.resize(optimizer.state().size());
  checkpoint::NamedTensors weights, opt_state;
  nlohmann::json opt_steps = nlohmann::json::object();
  size_t ti = 0;
  bool on_gpu = false;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    on_gpu = on_gpu || p.tensor.is_cuda();
    if (p.info->trainable || !buf.frozen_copied) copy_to_host(buf.weights[i], p.tensor);
    weights.emplace_back(p.info->name, buf.weights[i]);
    if (!p.info->trainable) continue;
    auto& st = optimizer.state()[ti];
    opt_steps[p.info->name] = st.step;
    if (st.exp_avg.defined()) {
      copy_to_host(buf.exp_avg[ti], st.exp_avg);
      copy_to_host(buf.exp_avg_sq[ti], st.exp_avg_sq);
      opt_state.emplace_back(p.info->name + ".exp_avg", buf.exp_avg[ti]);
      opt_state.emplace_back(p.info->name + ".exp_avg_sq", buf.exp_avg_sq[ti]);
    }
    ++ti;
  }
  buf.frozen_copied = true;
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (on_gpu) torch::cuda::synchronize();  // the copies above were asynchronous
#endif
  (void)on_gpu;
  s.tensor_files["model.safetensors"] = std::move(weights);
  s.tensor_files[kOptimizerFile] = std::move(opt_state);

  auto cpu_gen = at::detail::getDefaultCPUGenerator();
  at::Tensor cpu_rng;
  {
    std::lock_guard<std::mutex> lock(cpu_gen.mutex());
    cpu_rng = cpu_gen.get_state();
  }
  const nlohmann::json state = {
      {"step", pos.step},
      {"epoch", pos.epoch},
      {"run_id", pos.run_id},
      {"seed", cfg.run.seed},
      {"data",
       {{"step", pos.step},
        {"epoch", pos.epoch},
        {"note", "a step's samples and flow-matching draws are pure functions of (seed, global batch, step)"}}},
      {"rng", {{"cpu_default_generator", hex(cpu_rng)}}},
      {"optimizer_steps", opt_steps},
      {"model_path", cfg.model.path},
      {"data_path", cfg.data.path}};
  const nlohmann::json sched = {{"name", cfg.schedule.name},           {"peak_lr", schedule.peak_lr},
                                {"warmup_steps", schedule.warmup_steps}, {"total_steps", schedule.total_steps},
                                {"min_lr_ratio", schedule.min_lr_ratio}, {"next_lr", schedule.lr_at(pos.step)}};
  s.text_files["trainer_state.json"] = state.dump(2) + "\n";
  s.text_files["scheduler.json"] = sched.dump(2) + "\n";
  s.text_files["loongforge_state/engines.json"] =
      nlohmann::json({{"note", "each engine stores its state here once it exists (MDG and comm plan: GCTS; "
                               "free-list: MLA)"},
                      {"gcts", nullptr},
                      {"mla", nullptr}})
          .dump(2) + "\n";

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

nlohmann::json resume_from(const std::string& dir, const config::Config& cfg, model::Model& net, AdamW& optimizer,
                           int64_t world_size) {
  const checkpoint::Report report = checkpoint::validate_checkpoint(dir);
  if (!report.ok()) {
    std::string msg = "cannot resume from '" + dir + "': it is damaged or incomplete:";
    for (const auto& p : report.problems) msg += "\n  " + p;
    throw CheckpointError(msg + "\nPick another checkpoint, or use --resume latest to take the newest intact one.");
  }
  // Compatibility: list every difference at once.
  std::vector<std::string> diffs;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& p : net.info().params) shapes.emplace_back(p.name, p.shape);
  diffs = checkpoint::compare_parameters(dir, shapes);
  const nlohmann::json now = compared_config(cfg);
  // The split of the global batch G = B x K x W may change across a resume
  // (docs/training-semantics.md s2); G itself may not.
  const char* kBatchKey = "trainer.micro_batch_size";
  const char* kAccumulationKey = "trainer.gradient_accumulation_steps";
  for (const auto& [key, value] : now.items()) {
    if (key == kBatchKey || key == kAccumulationKey) continue;
    const auto saved = report.manifest.config.find(key);
    if (saved == report.manifest.config.end())
      diffs.push_back("config " + key + ": not recorded in the checkpoint");
    else if (*saved != value)
      diffs.push_back("config " + key + ": checkpoint " + saved->get<std::string>() + ", now " +
                      value.get<std::string>());
  }
  const auto& saved_cfg = report.manifest.config;
  if (saved_cfg.contains(kBatchKey) && saved_cfg.contains(kAccumulationKey)) {
    const int64_t b0 = std::stoll(saved_cfg.at(kBatchKey).get<std::string>());
    const int64_t k0 = std::stoll(saved_cfg.at(kAccumulationKey).get<std::string>());
    const int64_t w0 = report.manifest.world_size;
    const int64_t b = cfg.trainer.micro_batch_size, k = cfg.trainer.gradient_accumulation_steps;
    if (b0 * k0 * w0 != b * k * world_size) {
      const int64_t fit = b0 * k0 * w0 % (b * world_size) == 0 ? b0 * k0 * w0 / (b * world_size) : 0;
      diffs.push_back(
          "global batch (trainer.micro_batch_size x trainer.gradient_accumulation_steps x world size): "
          "checkpoint " +
          std::to_string(b0) + " x " + std::to_string(k0) + " x " + std::to_string(w0) + " = " +
          std::to_string(b0 * k0 * w0) + ", now " + std::to_string(b) + " x " + std::to_string(k) + " x " +
          std::to_string(world_size) + " = " + std::to_string(b * k * world_size) +
          (fit > 0 ? " (set trainer.gradient_accumulation_steps=" + std::to_string(fit) + ")" : ""));
    }
  } else {
    diffs.push_back(std::string("config ") + kBatchKey + " / " + kAccumulationKey + ": not recorded in the checkpoint");
  }
  // A different world size with the same global batch is fine: the optimizer
  // state is replicated (the plain path shards nothing), and a step's samples
  // and draws are a pure function of (seed, global batch, step).
  if (report.manifest.world_size != world_size)
    LF_LOG(logger("trainer"), info) << "resuming a checkpoint of " << report.manifest.world_size << " rank(s) on "
                                    << world_size << ": replicated optimizer state, same global batch, so every "
                                    << "step takes the samples and draws it would have taken";
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
  for (const auto& p : net.parameters()) p.tensor.copy_(saved.at(p.info->name));
  std::map<std::string, at::Tensor> opt;
  for (auto& [name, t] : checkpoint::read_safetensors(dir + "/" + kOptimizerFile)) opt[name] = t;
  nlohmann::json state;
  {
    std::ifstream in(dir + "/trainer_state.json");
    in >> state;
  }
  size_t ti = 0;
  for (const auto& p : net.parameters()) {
    if (!p.info->trainable) continue;
    auto& st = optimizer.state()[ti++];
    st.step = state.at("optimizer_steps").value(p.info->name, int64_t{0});
    auto a = opt.find(p.info->name + ".exp_avg"), b = opt.find(p.info->name + ".exp_avg_sq");
    if (a != opt.end() && b != opt.end()) {
      st.exp_avg = a->second.to(p.tensor.device());
      st.exp_avg_sq = b->second.to(p.tensor.device());
    }
  }
  return state;
}

}  // namespace loongforge::trainer
