// The training loop for one rank (docs/training-semantics.md s5): fetch ->
// forward/backward per micro-batch -> clip -> AdamW -> metrics -> checkpoint.
#include "loongforge/trainer/run.hpp"

#include <sys/resource.h>  // getrusage

#include <atomic>      // std::atomic
#include <exception>   // std::exception_ptr
#include <thread>      // std::thread
#include <csignal>     // std::signal, SIGTERM, SIGINT

#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::isfinite, std::ceil
#include <fstream>     // std::ofstream

#include <ATen/Context.h>        // at::globalContext
#include <ATen/Parallel.h>       // at::set_num_threads
#include <ATen/autocast_mode.h>  // at::autocast::set_autocast_enabled
#include <torch/cuda.h>          // torch::cuda::is_available
#if LOONGFORGE_WITH_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>  // getDeviceStats
#endif
#include <nlohmann/json.hpp>     // nlohmann::json

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/trainer/optimizer.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/trainer/progress.hpp"
#include "loongforge/trainer/state.hpp"
#include "control_plane.hpp"

namespace loongforge::trainer {

using Clock = std::chrono::steady_clock;

namespace {

// SIGTERM (Slurm preemption, kill) and SIGINT (Ctrl-C) finish the current
// step, write a checkpoint and exit 0; a second signal kills as usual.
std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int sig) {
  g_stop = true;
  std::signal(sig, SIG_DFL);
}
void install_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}
bool stop_requested() { return g_stop.load(); }

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Peak GPU memory allocated by the caching allocator on the device in use.
double peak_device_mb(const c10::Device& device) {
#if LOONGFORGE_WITH_CUDA_KERNELS
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(
               stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak) /
           (1024.0 * 1024.0);
  }
#endif
  (void)device;
  return 0.0;
}

double peak_host_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

// A fresh run directory: <output_dir>/<name>, or <name>-2, -3, ... when taken.
std::string make_run_dir(const config::Config& cfg) {
  std::string dir = cfg.run.output_dir + "/" + cfg.run.name;
  for (int i = 2; path_exists(dir); ++i) dir = cfg.run.output_dir + "/" + cfg.run.name + "-" + std::to_string(i);
  try {
    make_dirs(dir);
  } catch (const Error& e) {
    throw ConfigError(std::string(e.what()) + " (check run.output_dir)");
  }
  return dir;
}

// Turns autocast on for a scope (bf16 mode on CUDA).
struct AutocastScope {
  bool on;
  explicit AutocastScope(bool enable) : on(enable) {
    if (on) {
      at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
      at::autocast::set_autocast_enabled(at::kCUDA, true);
    }
  }
  ~AutocastScope() {
    if (on) {
      at::autocast::set_autocast_enabled(at::kCUDA, false);
      at::autocast::clear_cache();
    }
  }
};

struct Setup {
  c10::Device device = c10::kCPU;
  bool bf16 = false;
};

Setup resolve_setup(const config::Config& cfg, int64_t local_rank) {
  Setup s;
  const bool cuda = torch::cuda::is_available();
  if (cfg.run.device == "cuda" && !cuda)
    throw ConfigError("run.device is cuda but no GPU is visible to this process: use run.device=cpu or auto");
  const bool on_gpu = cfg.run.device == "cuda" || (cfg.run.device == "auto" && cuda);
  if (on_gpu && local_rank >= static_cast<int64_t>(torch::cuda::device_count()))
    throw ConfigError("LOCAL_RANK " + std::to_string(local_rank) + " but only " +
                      std::to_string(torch::cuda::device_count()) + " GPU(s) are visible: start one process per GPU");
  s.device = on_gpu ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank)) : c10::Device(c10::kCPU);
  s.bf16 = cfg.precision.mode == "bf16" || (cfg.precision.mode == "auto" && s.device.is_cuda());
  return s;
}

}  // namespace

int run(const config::Config& cfg, const comm::WorldInfo& world_info) {
  const auto& log = logger("trainer");
  const int64_t world_size = world_info.world_size;
  const int64_t rank = world_info.rank;
  const bool leader = rank == 0;  // rank 0 owns the run directory, metrics and checkpoints
  std::unique_ptr<comm::World> world;
  if (world_size > 1) world = comm::World::connect(world_info, /*timeout_ms=*/300000);
  std::unique_ptr<comm::GradientSync> grad_sync;
  if (world) grad_sync = std::make_unique<comm::GradientSync>(*world);
  const Setup setup = resolve_setup(cfg, world_info.local_rank);
  const auto t_start = Clock::now();
  // The control socket comes up first, so `loongforge status` answers while
  // the model loads.
  ControlPlane::Identity identity;
  identity.rank = rank, identity.world = world_size;
  identity.device = setup.device.str(), identity.precision = setup.bf16 ? "bf16" : "fp32";
  identity.model = cfg.model.path;
  ControlPlane control(cfg, identity, world ? make_store_bus(world->store()) : make_local_bus());
  control.publish_status({{"phase", "loading"}, {"model", cfg.model.path}, {"rank", rank}, {"world", world_size}});
  // Small strings every rank must agree on (run directory, checkpoint to
  // resume): rank 0 decides and shares them through the rendezvous store.
  auto agree = [&](const std::string& key, const std::string& value) {
    return world ? world->agree(key, value) : value;
  };
  if (cfg.run.threads > 0) at::set_num_threads(static_cast<int>(cfg.run.threads));
  // Bitwise reproducibility across runs and with the reference trainer: the
  // per-embodiment weight[ids] backward accumulates in parallel otherwise.
  if (cfg.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);

  model::Model net = model::Model::load(cfg.model.path, setup.device);
  if (setup.bf16) net.cast_frozen(at::kBFloat16);
  net.train();
  const auto& mc = net.info().config;

  const data::Dataset dataset = data::Dataset::open(cfg.data.path);
  data::SampleOptions so;
  so.action_horizon = cfg.data.action_horizon;
  so.max_text_len = cfg.data.max_text_len;
  so.embodiment_id = cfg.data.embodiment_id;
  so.normalization = cfg.data.normalization;
  so.shuffle = cfg.data.shuffle;
  so.seed = static_cast<uint64_t>(cfg.run.seed);
  so.micro_batch_size = cfg.trainer.micro_batch_size;
  so.rank = rank;
  so.world = world_size;
  so.accumulation = cfg.trainer.gradient_accumulation_steps;
  so.image_size = mc.at("image_size").get<int64_t>();
  so.num_views = mc.at("num_views").get<int64_t>();
  so.max_state_dim = mc.at("max_state_dim").get<int64_t>();
  so.max_action_dim = mc.at("max_action_dim").get<int64_t>();
  data::BatchBuilder builder(dataset, so);
  const int64_t tokens_per_view = (so.image_size / mc.at("patch_size").get<int64_t>()) *
                                  (so.image_size / mc.at("patch_size").get<int64_t>()) /
                                  (mc.at("pixel_shuffle").get<int64_t>() * mc.at("pixel_shuffle").get<int64_t>());

  AdamWOptions ao;
  ao.beta1 = cfg.optimizer.beta1, ao.beta2 = cfg.optimizer.beta2, ao.eps = cfg.optimizer.eps;
  ao.weight_decay = cfg.optimizer.weight_decay;
  std::vector<bool> decay;  // params.json "decay" of each trainable parameter, in order
  for (const auto& p : net.info().params)
    if (p.trainable) decay.push_back(p.decay);
  AdamW optimizer(net.trainable_parameters(), decay, ao);
  Schedule schedule;
  schedule.peak_lr = cfg.optimizer.lr;
  schedule.total_steps = cfg.trainer.max_steps;
  schedule.warmup_steps = cfg.schedule.warmup_steps > 0
                              ? cfg.schedule.warmup_steps
                              : static_cast<int64_t>(std::ceil(cfg.schedule.warmup_ratio * cfg.trainer.max_steps));
  schedule.min_lr_ratio = cfg.schedule.min_lr_ratio;
  schedule.kind = cfg.schedule.name == "linear"     ? Schedule::Kind::Linear
                  : cfg.schedule.name == "constant" ? Schedule::Kind::Constant
                                                    : Schedule::Kind::Cosine;

  // Run directory, checkpoints and resume (docs/checkpoints.md).
  const std::string named_dir = cfg.run.output_dir + "/" + cfg.run.name;
  const bool resuming_latest = cfg.checkpoint.resume == "latest";
  const std::string ckpt_dir_of_named =
      cfg.checkpoint.dir.empty() ? named_dir + "/checkpoints" : cfg.checkpoint.dir;
  std::string resume_dir;
  if (resuming_latest && leader) {
    std::vector<std::string> rejected;
    resume_dir = checkpoint::find_latest(ckpt_dir_of_named, &rejected);
    for (const auto& r : rejected) LF_LOG(log, warn) << "skipping damaged checkpoint " << r;
    if (resume_dir.empty())
      LF_LOG(log, info) << "--resume latest: no complete checkpoint in " << ckpt_dir_of_named
                        << "; starting from step 0";
  } else if (!cfg.checkpoint.resume.empty() && !resuming_latest) {
    resume_dir = cfg.checkpoint.resume;
    if (!is_directory(resume_dir))
      throw CheckpointError("checkpoint.resume: '" + resume_dir + "' is not a directory (use a checkpoint "
                            "directory such as <run>/checkpoints/epoch_0_step_100, or 'latest')");
  }
  // A resumed run continues in its own directory; a fresh one never reuses one.
  resume_dir = agree("resume_dir", resume_dir);
  const std::string run_dir =
      agree("run_dir", !leader ? std::string()
                               : (!cfg.checkpoint.resume.empty() && is_directory(named_dir)) ? named_dir
                                                                                             : make_run_dir(cfg));
  make_dirs(run_dir);
  const std::string ckpt_dir = cfg.checkpoint.dir.empty() ? run_dir + "/checkpoints" : cfg.checkpoint.dir;
  TrainerPosition pos;
  pos.run_id = sha256_hex(run_dir + std::to_string(std::chrono::system_clock::now().time_since_epoch().count()))
                   .substr(0, 16);
  if (!resume_dir.empty()) {
    const nlohmann::json state = resume_from(resume_dir, cfg, net, optimizer, world_size);
    pos.step = state.at("step").get<int64_t>();
    pos.run_id = state.at("run_id").get<std::string>();
    LF_LOG(log, info) << "resumed from " << resume_dir << " at step " << pos.step;
  }
  if (leader) std::ofstream(run_dir + "/config.yaml") << config::print_config(cfg);
  LF_LOG(log, info) << "run " << run_dir << ": " << net.info().name << " on " << setup.device << " ("
                    << (setup.bf16 ? "bf16" : "fp32") << "), " << dataset.episodes().size() << " episodes / "
                    << dataset.total_rows() << " samples, global batch " << builder.sampler().global_batch() << ", "
                    << builder.sampler().steps_per_epoch() << " steps per epoch, steps " << pos.step + 1 << ".."
                    << cfg.trainer.max_steps;

  // Rank 0 reports for the job (its loss is the mean over ranks).
  Progress progress(leader ? cfg.logging.progress : "off", cfg.logging.interval_steps, cfg.trainer.max_steps,
                    leader && cfg.logging.metrics_jsonl ? run_dir + "/metrics.jsonl" : "", pos.step,
                    leader && cfg.logging.tensorboard ? run_dir + "/tb" : "");
  const int64_t K = cfg.trainer.gradient_accumulation_steps;
  const double flops_per_sample = net.info().forward_flops_per_sample + net.info().backward_flops_per_sample;
  // Only rank 0 writes checkpoints: every rank holds the same replicated state.
  std::unique_ptr<checkpoint::Writer> writer;
  if (leader) writer = std::make_unique<checkpoint::Writer>(ckpt_dir, cfg.checkpoint.keep_last, cfg.checkpoint.async_write);
  auto last_ckpt_time = Clock::now();
  std::string last_ckpt = resume_dir;
  int64_t failed_writes = 0;

  // Reports finished writes: a failure (disk full, ...) is logged and training goes on.
  auto collect = [&] {
    if (!writer) return;
    for (const auto& w : writer->take_results()) {
      control.checkpoint_finished(w.step, w.path, w.error, w.seconds, w.bytes);
      if (w.error.empty()) {
        last_ckpt = w.path;
        LF_LOG(log, info) << "checkpoint " << w.path << ": " << static_cast<double>(w.bytes) / 1e6 << " MB in "
                          << w.seconds << " s";
      } else {
        ++failed_writes;
        LF_LOG(log, warn) << "checkpoint at step " << w.step << " FAILED: " << w.error
                          << " -- training continues; the newest intact checkpoint is "
                          << (last_ckpt.empty() ? "(none)" : last_ckpt);
      }
    }
  };
  // Copies the state to host memory (the stall) and hands it to the writer.
  // Snapshot buffers are allocated on a helper thread while training starts.
  SnapshotBuffers snapshot_buffers;
  std::exception_ptr reserve_error;
  std::thread reserver([&] {
    try {
      if (leader) reserve_snapshot_buffers(snapshot_buffers, net, setup.device.is_cuda());
    } catch (...) {
      reserve_error = std::current_exception();
    }
  });
  struct JoinOnExit {  // an exception leaving run() must not destroy a joinable thread
    std::thread& t;
    ~JoinOnExit() {
      if (t.joinable()) t.join();
    }
  } join_reserver{reserver};
  int64_t last_saved_step = -1;
  auto save = [&](int64_t steps_done) {
    const auto t0 = Clock::now();
    last_saved_step = steps_done;
    if (!writer) return 0.0;
    if (reserver.joinable()) reserver.join();
    if (reserve_error) std::rethrow_exception(reserve_error);
    pos.step = steps_done;
    pos.epoch = builder.sampler().epoch_of_step(steps_done);
    writer->wait();  // the writer may still read the buffers of the previous snapshot
    writer->submit(make_snapshot(cfg, net, optimizer, schedule, pos, world_size, snapshot_buffers));
    last_ckpt_time = Clock::now();
    return ms_since(t0);
  };

  // Status for `loongforge status`: rebuilt after every step.
  const auto engine_state = [](bool configured) {
    return nlohmann::json{{"configured", configured}, {"state", "not in this build: plain path"}};
  };
  const nlohmann::json engines = {{"gcts", engine_state(cfg.gcts.enable)},
                                  {"mla", engine_state(cfg.mla.enable)},
                                  {"adfe", engine_state(cfg.adfe.enable)},
                                  {"dmf", engine_state(cfg.dmf.enable)}};
  comm::SyncStats last_sync;
  auto publish = [&](const char* phase, const StepRecord* r) {
    nlohmann::json st = {{"phase", phase},
                         {"step", r ? r->step : pos.step},
                         {"max_steps", cfg.trainer.max_steps},
                         {"run_dir", run_dir},
                         {"model", net.info().name},
                         {"device", setup.device.str()},
                         {"precision", setup.bf16 ? "bf16" : "fp32"},
                         {"rank", rank},
                         {"world", world_size},
                         {"strategy", world_size > 1 ? "plain (one fp32 all-reduce after backward; GCTS not in this build)"
                                                     : "none (1 rank: no gradient communication)"},
                         {"engines", engines},
                         {"last_checkpoint", last_ckpt},
                         {"checkpoint_writes_failed", failed_writes},
                         {"elapsed_s", std::chrono::duration<double>(Clock::now() - t_start).count()}};
    if (r) {
      const double done = static_cast<double>(progress.history().size());
      const double eta = done > 0 ? progress.elapsed_s() / done * static_cast<double>(cfg.trainer.max_steps - r->step) : 0;
      st.update({{"loss", r->loss},
                 {"lr", r->lr},
                 {"grad_norm", r->grad_norm},
                 {"samples_per_s", r->samples_per_s},
                 {"tokens_per_s", r->tokens_per_s},
                 {"mfu", r->mfu},
                 {"step_ms", r->step_ms},
                 {"data_wait_ms", r->data_wait_ms},
                 {"peak_mem_mb", r->peak_mem_mb},
                 {"eta_s", eta}});
      if (world) {
        const double gbps = r->exposed_comm_ms > 0 ? last_sync.bytes / (r->exposed_comm_ms * 1e6) : 0.0;
        const double n = static_cast<double>(world_size);
        st["comm"] = {{"world", world_size},
                      {"groups", nlohmann::json::array({{{"name", "all-reduce"},
                                                         {"bytes", last_sync.bytes},
                                                         {"time_ms", r->exposed_comm_ms},
                                                         {"algbw_gbps", gbps},
                                                         {"busbw_gbps", gbps * 2.0 * (n - 1.0) / n}}})}};
      }
    }
    control.publish_status(std::move(st));
  };
  // profile-step: one timed phase (the device is synchronised first while a
  // profile records, so GPU work lands in the phase that queued it).
  auto mark = [&](const char* name, int64_t step, int64_t micro, Clock::time_point t0) {
    if (!control.profiling()) return;
    if (setup.device.is_cuda()) torch::cuda::synchronize();
    control.phase(name, step, micro, t0, Clock::now());
  };
  auto memory_now = [&] {
    return nlohmann::json{{"allocator", setup.device.is_cuda() ? "PyTorch CUDA caching allocator (MLA not in this build)"
                                                               : "host malloc"},
                          {"peak_device_mb", peak_device_mb(setup.device)},
                          {"peak_host_mb", peak_host_mb()}};
  };

  install_stop_signals();
  int64_t s = pos.step;
  const int64_t last = cfg.trainer.steps_per_run > 0 ? std::min(cfg.trainer.max_steps, pos.step + cfg.trainer.steps_per_run)
                                                     : cfg.trainer.max_steps;
  publish("training", nullptr);
  bool control_stop = false;
  {  // requests that arrived while the model loaded
    const auto a = control.step_boundary(s, stop_requested());
    if (a.checkpoint && !a.stop) save(s);
    control_stop = a.stop;
  }
  // A signal becomes a cluster-wide stop (every rank stops at one step).
  for (; s < last && !control_stop; ++s) {
    control.step_begins();
    const auto t_step = Clock::now();
    // Fetch every micro-batch of the step (their masks give the loss weights).
    std::vector<data::Batch> batches;
    std::vector<double> valid(static_cast<size_t>(K));  // valid action elements per micro-batch
    double total_valid = 0;
    int64_t tokens = 0;
    for (int64_t i = 0; i < K; ++i) {
      auto t0 = Clock::now();
      data::MicroBatch mb = builder.micro_batch(s, i);
      data::Batch b = std::move(mb.tensors);
      valid[static_cast<size_t>(i)] = static_cast<double>(mb.num_valid);
      total_valid += valid[static_cast<size_t>(i)];
      tokens += mb.text_tokens + mb.action_tokens + b["images"].size(0) * (so.num_views * tokens_per_view + 1);
      mark("data_wait", s + 1, i, t0);
      t0 = Clock::now();
      for (auto& kv : b) kv.second = kv.second.to(setup.device, /*non_blocking=*/true);
      mark("h2d", s + 1, i, t0);
      batches.push_back(std::move(b));
    }
    const double data_ms = ms_since(t_step);
    // s5: V is the job's count of valid elements; w_i = V_i * W / V.
    if (grad_sync) total_valid = grad_sync->sum(total_valid);

    double step_loss = 0;
    for (int64_t i = 0; i < K; ++i) {
      const double w = total_valid > 0 ? valid[static_cast<size_t>(i)] * static_cast<double>(world_size) / total_valid
                                       : 1.0 / static_cast<double>(K);
      at::Tensor loss;
      auto t0 = Clock::now();
      {
        AutocastScope autocast(setup.bf16 && setup.device.is_cuda());
        loss = net.forward(batches[i]).at("loss");
      }
      mark("forward", s + 1, i, t0);
      t0 = Clock::now();
      (loss * w).backward();
      step_loss += loss.item<double>() * w;
      mark("backward", s + 1, i, t0);
    }
    double comm_ms = 0;
    if (grad_sync) {  // the plain path: one all-reduce of every gradient (GCTS off)
      const auto t0 = Clock::now();
      last_sync = grad_sync->average(optimizer.params());
      step_loss = grad_sync->mean(step_loss);  // the job's loss: mean over ranks
      comm_ms = ms_since(t0);
      mark("comm/all-reduce", s + 1, -1, t0);
    }
    const auto t_opt = Clock::now();
    const double grad_norm = clip_grad_norm(optimizer.params(), cfg.trainer.grad_clip_norm);
    if (cfg.trainer.stop_on_nonfinite && (!std::isfinite(step_loss) || !std::isfinite(grad_norm))) {
      throw TrainingError("step " + std::to_string(s + 1) + ": " +
                          (!std::isfinite(step_loss) ? "loss is " + std::to_string(step_loss)
                                                     : "gradient norm is " + std::to_string(grad_norm)) +
                          "; parameters were not updated. Lower optimizer.lr, check the data, or set "
                          "trainer.stop_on_nonfinite=false to skip such steps" +
                          (last_ckpt.empty() ? "" : " (newest checkpoint: " + last_ckpt + ")"));
    }
    const double lr = schedule.lr_at(s);
    const bool finite = std::isfinite(step_loss) && std::isfinite(grad_norm);
    if (finite) {
      optimizer.step(lr);
    } else {
      optimizer.zero_grad();  // stop_on_nonfinite=false: skip this update
      LF_LOG(log, warn) << "step " << s + 1 << ": non-finite loss or gradient norm; update skipped";
    }
    mark("optimizer", s + 1, -1, t_opt);

    StepRecord r;
    r.step = s + 1;
    r.loss = step_loss;
    r.lr = lr;
    r.grad_norm = grad_norm;
    r.num_valid = total_valid;
    r.step_ms = ms_since(t_step);
    r.data_wait_ms = data_ms;
    r.exposed_comm_ms = comm_ms;
    const double samples = static_cast<double>(K * cfg.trainer.micro_batch_size);
    r.samples_per_s = samples / (r.step_ms / 1000.0);
    r.tokens_per_s = static_cast<double>(tokens) / (r.step_ms / 1000.0);
    r.mfu = setup.device.is_cuda() ? flops_per_sample * r.samples_per_s / 989e12 : 0.0;
    r.peak_mem_mb = setup.device.is_cuda() ? peak_device_mb(setup.device) : peak_host_mb();

    // Step boundary: control requests, then checkpoints.
    auto t0 = Clock::now();
    const auto actions = control.step_boundary(s + 1, stop_requested());
    control_stop = actions.stop;
    mark("control", s + 1, -1, t0);
    const bool by_steps = (s + 1) % cfg.checkpoint.interval_steps == 0;
    const bool by_time = cfg.checkpoint.interval_minutes > 0 &&
                         ms_since(last_ckpt_time) >= cfg.checkpoint.interval_minutes * 60000.0;
    t0 = Clock::now();
    if ((by_steps || by_time || actions.checkpoint) && s + 1 < last && !control_stop) r.checkpoint_stall_ms = save(s + 1);
    mark("checkpoint", s + 1, -1, t0);
    progress.record(r);
    collect();
    publish("training", &r);
    control.step_done(s + 1, ms_since(t_step), memory_now());
  }
  progress.finish();
  if (stop_requested()) LF_LOG(log, info) << "stop requested (signal): checkpointing at step " << s;
  if (control_stop) LF_LOG(log, info) << "stop requested (control socket): checkpointing at step " << s;
  // The final checkpoint (also on SIGTERM/SIGINT, `loongforge stop` and
  // steps_per_run); none when this process took no step (resumed at the end,
  // or stopped at once) or when this step is already saved.
  publish("stopping", progress.history().empty() ? nullptr : &progress.history().back());
  if (!progress.history().empty() && last_saved_step != s) save(s);
  if (writer) writer->wait();
  collect();
  if (reserver.joinable()) reserver.join();
  if (world) world->barrier();  // rank 0's final checkpoint is complete before any rank exits
  control.shutdown({{"stopped_at_step", s}, {"checkpoint", last_ckpt}, {"checkpoint_writes_failed", failed_writes}});
  if (progress.history().empty()) return failed_writes > 0 ? 4 : 0;  // nothing left to do (resumed at the end)
  if (!leader) return 0;  // rank 0 reports for the job

  // Summary.
  const auto& h = progress.history();
  double tail_loss = 0, mean_sps = 0, data_ms = 0, step_ms = 0;
  const size_t tail = std::min<size_t>(10, h.size());
  for (size_t i = h.size() - tail; i < h.size(); ++i) tail_loss += h[i].loss / static_cast<double>(tail);
  for (const auto& r : h) data_ms += r.data_wait_ms, step_ms += r.step_ms;
  const double wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  mean_sps = static_cast<double>(h.size() * K * cfg.trainer.micro_batch_size) / (step_ms / 1000.0);
  const nlohmann::json summary = {{"steps", h.size()},
                                  {"first_loss", h.front().loss},
                                  {"final_loss_mean_last_10", tail_loss},
                                  {"samples_per_s", mean_sps},
                                  {"data_wait_fraction", data_ms / step_ms},
                                  {"videos_decoded", builder.stats().videos_decoded},
                                  {"wall_s", wall_s},
                                  {"peak_host_mb", peak_host_mb()},
                                  {"peak_device_mb", peak_device_mb(setup.device)},
                                  {"run_dir", run_dir},
                                  {"checkpoint", last_ckpt},
                                  {"device", setup.device.str()},
                                  {"precision", setup.bf16 ? "bf16" : "fp32"}};
  std::ofstream(run_dir + "/summary.json") << summary.dump(2) << "\n";
  if (failed_writes > 0)
    LF_LOG(log, warn) << failed_writes << " checkpoint write(s) failed during the run (see above); newest intact: "
                      << (last_ckpt.empty() ? "(none)" : last_ckpt);
  std::printf(
      "\n== LoongForge run summary ==\n"
      "  model        %s (%s, %s)\n  steps        %zu in %s (%.2f steps/s)\n"
      "  loss         %.5f -> %.5f (mean of last %zu)\n"
      "  throughput   %.1f samples/s, data wait %.1f%% of step time\n  peak memory  %.0f MB host, %.0f MB device\n"
      "  checkpoint   %s\n  metrics      %s/metrics.jsonl\n  summary      %s/summary.json\n",
      net.info().name.c_str(), setup.device.str().c_str(), setup.bf16 ? "bf16" : "fp32", h.size(),
      format_duration(wall_s).c_str(), static_cast<double>(h.size()) / wall_s, h.front().loss, tail_loss, tail,
      mean_sps, 100.0 * data_ms / step_ms, peak_host_mb(), peak_device_mb(setup.device), last_ckpt.c_str(), run_dir.c_str(), run_dir.c_str());
  return failed_writes > 0 ? 4 : 0;
}

}  // namespace loongforge::trainer
