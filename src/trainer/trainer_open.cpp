// Trainer, phase 1: open -- everything a rank needs before its first step
// (trainer.hpp). open(), at the end, is the list of seams being built; each
// helper above it builds one thing.
#include <algorithm>  // std::min
#include <chrono>   // std::chrono::system_clock
#include <cstdio>   // std::snprintf
#include <fstream>  // std::ofstream
#include <optional>  // std::optional

#include <ATen/Context.h>   // at::globalContext
#include <ATen/Parallel.h>  // at::set_num_threads
#include <torch/cuda.h>     // torch::cuda::is_available

#include "control_plane.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/data/aspect.hpp"
#include "loongforge/data/batch.hpp"  // data::text_length_histogram
#include "loongforge/engines/adfe/adfe.hpp"
#include "loongforge/engines/dmf/dmf.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/engines/mla/mla.hpp"
#include "loongforge/fusion/package_cache.hpp"
#include "loongforge/memory/memory.hpp"
#include "stop_signal.hpp"
#include "trainer_impl.hpp"

namespace loongforge::trainer {


Trainer::Trainer(config::Config cfg, comm::WorldInfo world)
    : impl_(std::make_unique<Impl>(std::move(cfg), std::move(world))) {}
Trainer::~Trainer() = default;
void Trainer::open() { impl_->open(); }
bool Trainer::more() const { return impl_->more(); }
void Trainer::step() { impl_->step(); }
void Trainer::step_boundary() { impl_->step_boundary(); }
int Trainer::close() { return impl_->close(); }
int Trainer::run() { return impl_->run(); }
const std::string& Trainer::run_dir() const { return impl_->run_dir_; }
const std::vector<StepRecord>& Trainer::history() const { return impl_->progress_->history(); }
nlohmann::json Trainer::runner_status() const {
  return impl_->runner_ ? impl_->runner_->status() : nlohmann::json(nullptr);
}
nlohmann::json Trainer::comm_status() const {
  return impl_->reducer_ ? impl_->reducer_->comm_status() : nlohmann::json(nullptr);
}

Trainer::Impl::Impl(config::Config cfg, comm::WorldInfo world)
    : cfg_(std::move(cfg)),
      world_info_(std::move(world)),
      leader_(world_info_.rank == 0),
      t_start_(Clock::now()),
      startup_mark_(t_start_) {}

Trainer::Impl::~Impl() {
  if (reserver_.joinable()) reserver_.join();
  join_retired_worlds();
}

void Trainer::Impl::resolve_device() {
  const bool cuda = torch::cuda::is_available();
  if (cfg_.run.device == "cuda" && !cuda)
    throw ConfigError(cfg_.origin["run.device"] +
                      ": run.device is cuda but no GPU is visible to this process: use run.device=cpu or auto");
  const bool on_gpu = cfg_.run.device == "cuda" || (cfg_.run.device == "auto" && cuda);
  if (on_gpu && world_info_.local_rank >= static_cast<int64_t>(torch::cuda::device_count()))
    throw ConfigError("LOCAL_RANK " + std::to_string(world_info_.local_rank) + " but only " +
                      std::to_string(torch::cuda::device_count()) + " GPU(s) are visible: start one process per GPU");
  device_ = on_gpu ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(world_info_.local_rank))
                   : c10::Device(c10::kCPU);
  bf16_ = cfg_.precision.mode == "bf16" || (cfg_.precision.mode == "auto" && device_.is_cuda());
}

// Small strings every rank must agree on (run directory, checkpoint to
// resume): rank 0 decides and shares them through the rendezvous store. A
// value starting with '!' is rank 0's error, raised on every rank.
std::string Trainer::Impl::agree(const std::string& key, const std::string& value) {
  const std::string v = world_ ? world_->agree(key, value) : value;
  if (!v.empty() && v[0] == '!') throw CheckpointError("rank 0: " + v.substr(1));
  return v;
}

// The checkpoint this run resumes from ("" = a fresh run), decided by rank 0.
std::string Trainer::Impl::choose_resume_dir() {
  const std::string& resume = cfg_.checkpoint.resume;
  if (resume.empty()) return agree("resume_dir", "");
  std::string dir;
  if (leader_) {
    try {
      if (resume == "latest") {
        const std::string named_dir = cfg_.run.output_dir + "/" + cfg_.run.name;
        const std::string parent = cfg_.checkpoint.dir.empty() ? named_dir + "/checkpoints" : cfg_.checkpoint.dir;
        std::vector<std::string> rejected;
        dir = checkpoint::find_latest(parent, &rejected);
        if (dir.empty() && !rejected.empty()) {
          // Starting again from step 0 would silently throw away the run.
          std::string msg = "--resume latest: every checkpoint in " + parent + " is damaged:";
          for (const auto& r : rejected) msg += "\n  " + r;
          throw CheckpointError(msg +
                                "\nNothing was trained. Repair or move them away, or start a fresh run without "
                                "--resume (it gets a new run directory).");
        }
        for (const auto& r : rejected) LF_LOG(logger("trainer"), warn) << "skipping damaged checkpoint " << r;
        if (dir.empty())
          LF_LOG(logger("trainer"), info) << "--resume latest: no checkpoint in " << parent << " yet; starting from step 0";
      } else {
        dir = resume;
        if (!is_directory(dir))
          throw CheckpointError(cfg_.origin["checkpoint.resume"] + ": checkpoint.resume: '" + dir +
                                "' is not a directory (use a checkpoint directory such as "
                                "<run>/checkpoints/epoch_0_step_100, or 'latest')");
      }
    } catch (const Error& e) {
      agree("resume_dir", std::string("!") + e.what());  // the other ranks fail with the same message
      throw;
    }
  }
  return agree("resume_dir", dir);
}

namespace {

// data.frame_resize (SampleOptions::frames_on_device): device on CUDA runs of a build with the
// kernels when every used camera has one size after the crop; "device" where that cannot be
// is refused naming the reason, "auto" falls back to the CPU with a log line.
void choose_frame_resize(data::SampleOptions& so, const data::Mixture& mix, const std::string& mode, bool cuda) {
  if (mode == "cpu") return;
  std::string why;
  const auto [h, w] = data::common_cropped_size(mix, so.image_crop_fraction, &why);
  if (so.image_resample != "box") why = "the model's image_resample is " + so.image_resample + " (a CPU resize)";
  if (!cuda) why = "this run is not on a CUDA device";
  if (!LOONGFORGE_WITH_CUDA_KERNELS) why = "this build has no LoongForge CUDA kernels";
  if (!why.empty()) {
    if (mode == "device")
      throw ConfigError("data.frame_resize=device resizes frames on the GPU, but " + why +
                        "; set data.frame_resize=auto or cpu");
    if (cuda) LF_LOG(logger("data"), info) << "frames are resized on the CPU (data.frame_resize=auto): " << why;
    return;
  }
  so.frames_on_device = true;
  so.frame_height = h, so.frame_width = w;
}

}  // namespace

// The dataset and the options the data source is built with (sample_options_), all but the micro-batch,
// which trainer.micro_batch_size auto may still choose: the choice sizes the data's device memory from them
// (Note [The data's device memory] in trainer_micro_batch.cpp). open_data() completes them.
void Trainer::Impl::open_dataset() {
  const auto& mc = net_->info().config;
  if (data::is_mixture_file(cfg_.data.path) && cfg_.origin.count("data.embodiment_id"))
    throw ConfigError("data.embodiment_id (set at " + cfg_.origin["data.embodiment_id"] + ") and data.path " +
                      cfg_.data.path + ", a mixture file, which names each dataset's embodiment_id: remove "
                      "data.embodiment_id");
  data_ = data::open_data(cfg_.data.path, cfg_.data.embodiment_id);
  if (const int64_t slots = mc.value("num_embodiments", int64_t{0}); slots > 0)
    for (size_t k = 0; k < data_.datasets.size(); ++k)
      if (data_.embodiment_ids[k] >= slots)
        throw ConfigError((data_.from_file ? "data.path " + cfg_.data.path + ": the dataset " +
                                                 data_.datasets[k]->dir() + "'s embodiment_id "
                                           : std::string("data.embodiment_id ")) +
                          std::to_string(data_.embodiment_ids[k]) + " is outside the model's " +
                          std::to_string(slots) + " embodiment slots (config.json num_embodiments of " +
                          net_->info().path + "); use 0.." + std::to_string(slots - 1) +
                          " or re-export the model with --set num_embodiments=" +
                          std::to_string(data_.embodiment_ids[k] + 1));
  data::SampleOptions so;
  so.action_horizon = cfg_.data.action_horizon;
  so.max_text_len = cfg_.data.max_text_len;
  so.embodiment_id = cfg_.data.embodiment_id;
  so.normalization = cfg_.data.normalization;
  so.shuffle = cfg_.data.shuffle;
  so.sampler = cfg_.data.sampler;
  so.open_episodes = cfg_.data.open_episodes;
  so.shuffle_buffer = cfg_.data.shuffle_buffer;
  so.frame_cache_mb = cfg_.data.frame_cache_mb;
  cfg_.data.video_decode = so.video_decode = data::resolve_video_decode(cfg_.data.video_decode, data_);
  so.image_aspect = cfg_.data.image_aspect;  // checked against the model by BatchBuilder
  if (so.sampler == "episode" && !so.shuffle)
    throw ConfigError("data.sampler=episode orders a shuffled epoch, but data.shuffle is false (unshuffled, the "
                      "order is already episode by episode): set data.shuffle=true or data.sampler=uniform");
  so.on_bad_video = cfg_.data.on_bad_video;
  so.seed = static_cast<uint64_t>(cfg_.run.seed);
  so.micro_batch_size = 0, so.accumulation = 0;  // open_data's, once the micro-batch is known
  so.rank = world_info_.rank;
  so.world = world_info_.world_size;
  so.image_size = mc.at("image_size").get<int64_t>();
  so.image_crop_fraction = mc.value("image_crop_fraction", 1.0);  // exports before the field: no crop
  if (!(so.image_crop_fraction > 0.0 && so.image_crop_fraction <= 1.0))
    throw ConfigError("model.path " + net_->info().path + ": config.json image_crop_fraction=" +
                      std::to_string(so.image_crop_fraction) + " must be in (0, 1]; re-export the model");
  so.image_resample = mc.value("image_resample", std::string("box"));  // exports before the field: box
  so.image_resize_edge = mc.value("image_resize_edge", int64_t{0});
  so.image_target_size = mc.value("image_target_size", int64_t{0});  // exports before the field: image_size
  so.image_letterbox = mc.value("image_letterbox", false);
  so.image_random_crop = mc.value("image_random_crop", false);
  choose_frame_resize(so, data_, cfg_.data.frame_resize, device_.is_cuda());
  so.num_views = mc.at("num_views").get<int64_t>();
  so.max_state_dim = mc.at("max_state_dim").get<int64_t>();
  so.max_action_dim = mc.at("max_action_dim").get<int64_t>();
  so.noise_s = mc.value("noise_s", 0.999);
  so.beta_alpha = mc.value("beta_alpha", 1.5);
  const std::string fm_time = mc.value("fm_time", std::string("n16"));  // exports before the field: n16
  if (fm_time != "n16" && fm_time != "upstream")
    throw ConfigError("model.path " + net_->info().path + ": config.json fm_time='" + fm_time +
                      "' must be n16 or upstream; re-export the model");
  so.fm_time_upstream = fm_time == "upstream";
  so.model_path = net_->info().path;
  if (const auto& spec = net_->info().batch_spec; spec.contains("tokenizer")) {  // Note [Tokenizer match]
    const auto& t = spec.at("tokenizer");
    so.model_tokenizer = {t.at("kind").get<std::string>(), t.at("sha256").get<std::string>(),
                          t.value("file", std::string()), t.value("text_form", std::string("raw"))};
  }
  // The data processing the weights expect (batch_spec.json "processor"; data/processor.hpp).
  so.processor = data::parse_processor(net_->info().batch_spec, net_->info().path);
  if (so.processor.upstream()) {
    const auto& p = so.processor;
    if (p.embodiment_id >= 0 && cfg_.origin.count("data.embodiment_id") && cfg_.data.embodiment_id != p.embodiment_id)
      throw ConfigError("data.embodiment_id=" + std::to_string(cfg_.data.embodiment_id) + " (set at " +
                        cfg_.origin["data.embodiment_id"] + "): the model " + net_->info().path +
                        " was imported for embodiment '" + p.embodiment_tag + "', slot " +
                        std::to_string(p.embodiment_id) +
                        " (batch_spec.json processor); remove data.embodiment_id, or re-import the checkpoint with "
                        "scripts/convert_gr00t_checkpoint.py --embodiment-tag");
    LF_LOG(logger("data"), info) << "state and actions prepared as upstream GR00T " << p.upstream_name()
                                 << "'s processor for embodiment '" << p.embodiment_tag << "' (slot "
                                 << p.embodiment_id << "): min-max "
                                 << (p.form == data::ProcessorForm::gr00t_n16 ? "in numpy's float64 / float32"
                                                                              : "in float32")
                                 << " from "
                                 << p.source << (p.clip ? ", clipped to [-1, 1]" : "")
                                 << (p.state_dropout > 0 ? ", state dropout " + std::to_string(p.state_dropout) : "");
  }
  const int64_t side = so.image_size / mc.at("patch_size").get<int64_t>();
  const int64_t shuffle = mc.at("pixel_shuffle").get<int64_t>();
  tokens_per_view_ = side * side / (shuffle * shuffle);
  // What the model's resize does with each camera's aspect (kept, squashed, cropped, padded), counted: said once per run.
  if (leader_)
    for (const auto& ds : data_.datasets)
      LF_LOG(logger("data"), info) << (data_.from_file ? ds->dir() + ": " : std::string())
                                   << data::camera_aspect_line(*ds, so);
  sample_options_ = so;
}

// The data seam, with the micro-batch (set or chosen by now).
void Trainer::Impl::open_data() {
  sample_options_.micro_batch_size = cfg_.trainer.micro_batch_size;
  sample_options_.accumulation = cfg_.trainer.gradient_accumulation_steps;
  source_ = adfe::make_source(cfg_, data_.parts(), sample_options_, device_, tokens_per_view_);
}

void Trainer::Impl::open_run_dir(const std::string& resume_dir) {
  // A resumed run continues in its own directory; a fresh one never reuses one.
  const std::string named_dir = cfg_.run.output_dir + "/" + cfg_.run.name;
  std::string dir;
  if (leader_) {
    if (!cfg_.checkpoint.resume.empty() && is_directory(named_dir)) {
      dir = named_dir;
    } else {
      dir = named_dir;
      for (int i = 2; path_exists(dir); ++i) dir = named_dir + "-" + std::to_string(i);
      try {
        make_dirs(dir);
      } catch (const Error& e) {
        throw ConfigError(std::string(e.what()) + " (check run.output_dir, " + cfg_.origin["run.output_dir"] + ")");
      }
    }
  }
  run_dir_ = agree("run_dir", dir);
  make_dirs(run_dir_);
  ckpt_dir_ = cfg_.checkpoint.dir.empty() ? run_dir_ + "/checkpoints" : cfg_.checkpoint.dir;
  last_ckpt_ = resume_dir;
  if (leader_) write_working_copies();
}

// <run dir>/bf16_weights.json: the trainable parameters this run keeps as bf16 working copies (the fused
// optimizer made them bf16: precision.bf16_weights), a JSON list in parameter order, for
// `scripts/compile_step.py --bf16-weights` (a package that takes the same copies). Not written without copies.
void Trainer::Impl::write_working_copies() const {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& p : net_->parameters())
    if (p.info->trainable && p.tensor.scalar_type() == at::kBFloat16) names.push_back(p.info->name);
  if (!names.empty()) std::ofstream(run_dir_ + "/bf16_weights.json") << names.dump(1) << "\n";
}

// The control socket first, so `loongforge status` answers while the model loads.
void Trainer::Impl::open_control() {
  ControlPlane::Identity identity;
  identity.rank = world_info_.rank, identity.world = world_info_.world_size;
  identity.device = device_.str(), identity.precision = bf16_ ? "bf16" : "fp32";
  identity.model = cfg_.model.path, identity.cuda = device_.is_cuda();
  control_ = std::make_unique<ControlPlane>(cfg_, identity,
                                            world_ ? make_store_bus(world_->store()) : make_local_bus(), engines_);
  control_->publish_status({{"phase", "loading"},
                            {"model", cfg_.model.path},
                            {"rank", world_info_.rank},
                            {"world", world_info_.world_size}});
}

// Threads, determinism and the random generators of this process.
void Trainer::Impl::prepare_process() {
  if (cfg_.run.threads > 0) at::set_num_threads(static_cast<int>(cfg_.run.threads));
  // Bitwise reproducibility across runs and with the reference trainer: the
  // per-embodiment weight[ids] backward accumulates in parallel otherwise.
  if (cfg_.run.deterministic) at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
  seed_default_generators(cfg_, world_info_.rank);
}

// The checkpoint decides the accumulation before anything is sized by it (its global batch is kept).
void Trainer::Impl::adopt_checkpoint_batch(const std::string& resume_dir) {
  if (resume_dir.empty()) return;
  if (micro_batch_unresolved()) keep_checkpoint_micro_batch(resume_dir);  // Note [Micro-batch auto on resume]
  std::string note;
  const int64_t k = check_resume(resume_dir, cfg_, world_info_.world_size, &note);
  if (k != cfg_.trainer.gradient_accumulation_steps) {
    cfg_.trainer.gradient_accumulation_steps = k;
    cfg_.origin["trainer.gradient_accumulation_steps"] = "kept the global batch of " + resume_dir;
  }
  if (!note.empty()) LF_LOG(logger("trainer"), info) << note;
}

void Trainer::Impl::open_model() {
  net_ = std::make_unique<model::Model>(model::Model::load(cfg_.model.path, device_));
  if (bf16_) net_->cast_frozen(at::kBFloat16);
  net_->train();
  flops_per_sample_ = net_->info().forward_flops_per_sample + net_->info().backward_flops_per_sample;
}

// What the fast path adds around the seams on a GPU: the one-step-late readback, the device timing of the
// exposed communication, the optimizer's CUDA graph; and who owns the gradient tensors.
void Trainer::Impl::open_fast_path(const fusion::StepMode& mode, bool made_gradients) {
  // The compiled runner's graph outputs are the gradients; the graph runner makes them too where it can (Note
  // [Fresh gradients] in src/fusion/graph_runner.cpp); otherwise a graphed step adds into kept gradients.
  optimizer_->keep_gradients(mode.graphs && !mode.compiled && !made_gradients);
  // Several ranks too: the loss and the norm are sums over ranks on the device (every rank reads the same values
  // one step late, so a non-finite one stops or warns at the same step everywhere) and the step's counts travel
  // host to host (agree_counts), so no rank waits for its device mid-step.
  if (device_.is_cuda() && optimizer_->skips_nonfinite_on_device()) readback_ = std::make_unique<Readback>(device_);
  if (device_.is_cuda() && reducer_->reduces()) comm_timer_ = std::make_unique<CommTimer>(device_);
  if (readback_ && mode.graphs)
    if (auto* fused = dynamic_cast<optim::FusedAdamW*>(optimizer_.get()))
      optimizer_graph_ = optim::make_optimizer_graph(*fused, cfg_.trainer.grad_clip_norm, mode.graphs_required, device_);
}

void Trainer::Impl::resume(const std::string& resume_dir) {
  pos_.global_batch = cfg_.trainer.micro_batch_size * cfg_.trainer.gradient_accumulation_steps * world_info_.world_size;
  pos_.steps_per_epoch = source_->sampler().steps_per_epoch();
  pos_.run_id = sha256_hex(run_dir_ + std::to_string(std::chrono::system_clock::now().time_since_epoch().count()))
                    .substr(0, 16);
  if (!resume_dir.empty()) {
    const nlohmann::json state =
        resume_from(resume_dir, cfg_, *net_, *optimizer_, world_info_.world_size, engines_, /*seal=*/leader_);
    pos_.step = state.at("step").get<int64_t>();
    pos_.run_id = state.at("run_id").get<std::string>();
    LF_LOG(logger("trainer"), info) << "resumed from " << resume_dir << " at step " << pos_.step;
  }
  steps_done_ = pos_.step;
  last_step_ = cfg_.trainer.steps_per_run > 0 ? std::min(cfg_.trainer.max_steps, pos_.step + cfg_.trainer.steps_per_run)
                                              : cfg_.trainer.max_steps;
  if (leader_) std::ofstream(run_dir_ + "/config.yaml") << config::print_config(cfg_);
}

// The run line: what this rank trains, on what, with which seams.
void Trainer::Impl::log_run_line() const {
  const auto mb = [](int64_t bytes) {  // MB = 2^20 bytes, as the peak memory figures
    char text[32];
    std::snprintf(text, sizeof text, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
    return std::string(text);
  };
  // Besides the moments: the masters of working copies, and a sharded optimizer's communication buffers.
  const int64_t masters = 4 * optimizer_->working_copies().numel;
  const int64_t comm_buffers = optimizer_->buffer_bytes() - masters;
  const std::string held = (masters > 0 ? ", " + mb(masters) + " MB of fp32 masters" : std::string()) +
                           (comm_buffers > 0 ? ", " + mb(comm_buffers) + " MB of communication buffers" : std::string());
  const bool fused = optimizer_->skips_nonfinite_on_device();  // the fused kernels, sharded or not
  const data::Sampler& sampler = source_->sampler();
  LF_LOG(logger("trainer"), info)
      << "run " << run_dir_ << ": " << net_->info().name << " on " << device_ << " (" << (bf16_ ? "bf16" : "fp32")
      << "), " << (data_.from_file ? std::to_string(data_.datasets.size()) + " datasets (" + cfg_.data.path + "), "
                                   : std::string())
      << data_.episodes() << " episodes / " << sampler.num_samples() << " samples"
      << (sampler.num_samples() != data_.total_rows()
              ? " (of " + std::to_string(data_.total_rows()) +
                    " rows: those whose action chunk ends inside its episode, as Isaac-GR00T N1.6 samples)"
              : std::string())
      << ", global batch " << pos_.global_batch << " (" << cfg_.trainer.micro_batch_size << " x "
      << cfg_.trainer.gradient_accumulation_steps << " x " << world_info_.world_size << " ranks"
      << (micro_batch_choice_.is_null()                          ? ""
          : micro_batch_choice_.value("source", "") == "checkpoint" ? ", micro-batch auto: the checkpoint's"
                                                                     : ", micro-batch chosen by auto")
      << "), "
      << pos_.steps_per_epoch << " steps per epoch, AdamW "
      << (optimizer_->sharded()
              ? std::string(fused ? "fused, " : "") + "sharded over " + std::to_string(world_info_.world_size) + " rank(s)"
          : fused ? "fused"
                  : "plain")
      << " (moments " << mb(optimizer_->state_bytes()) << " MB on this rank)" << held
      << optim::working_copies_note(*optimizer_) << ", gradient communication " << reducer_->strategy()
      << (graph_reduction_ ? " until the last micro-batch's graph is captured with it" : "") << ", steps "
      << pos_.step + 1 << ".." << last_step_ << ", compiled step " << compiled_step_text();
}

// `status` and summary.json: the micro-batch, its accumulation and, with auto, how it was chosen.
nlohmann::json Trainer::Impl::micro_batch_json() const {
  return {{"size", cfg_.trainer.micro_batch_size},
          {"accumulation", cfg_.trainer.gradient_accumulation_steps},
          {"auto", micro_batch_choice_}};
}

// "off", "PATH (cache hit)", "PATH (compiled in 95 s)", "PATH (given)", "not used (compile failed)";
// several packages: "2 packages, text widths 6, 14 (first PATH) (cache hit)".
std::string Trainer::Impl::compiled_step_text() const {
  if (compiled_step_.is_null()) return "off";
  const std::string source = compiled_step_.value("source", "");
  if (source == "compile failed") return "not used (its compile failed: see the warning above)";
  char compile_s[32];
  std::snprintf(compile_s, sizeof compile_s, "%.0f s", compiled_step_.value("compile_s", 0.0));
  std::string what = compiled_step_.value("path", "");
  if (compiled_step_.contains("packages")) {  // DMF's package buckets: one per text width
    std::string widths;
    for (const auto& w : compiled_step_["text_widths"]) widths += (widths.empty() ? "" : ", ") + w.dump();
    what = std::to_string(compiled_step_["packages"].size()) + " packages, text widths " + widths + " (first " +
           what + ")";
  }
  return what + " (" + (source == "compiled" ? "compiled in " + std::string(compile_s) : source) + ")";
}

// Progress (rank 0 reports for the job: its loss is the one of the whole job) and the checkpoint writer.
void Trainer::Impl::open_outputs() {
  progress_ = std::make_unique<Progress>(
      leader_ ? cfg_.logging.progress : "off", cfg_.logging.interval_steps, cfg_.trainer.max_steps,
      leader_ && cfg_.logging.metrics_jsonl ? run_dir_ + "/metrics.jsonl" : "", pos_.step,
      leader_ && cfg_.logging.tensorboard ? run_dir_ + "/tb" : "");
  // Rank 0 writes checkpoints; with a sharded optimizer every other rank
  // stages its own shard for it (Note [Peer files] in src/checkpoint/writer.cpp).
  const checkpoint::WriterOptions writing = writer_options(cfg_, device_.is_cuda());
  if (!leader_ && optimizer_->sharded())
    writer_ = std::make_unique<checkpoint::Writer>(ckpt_dir_, cfg_.checkpoint.keep_last, cfg_.checkpoint.async_write,
                                                   /*leader=*/false, writing);
  if (leader_) {
    writer_ = std::make_unique<checkpoint::Writer>(ckpt_dir_, cfg_.checkpoint.keep_last, cfg_.checkpoint.async_write,
                                                   /*leader=*/true, writing);
    // The staging ring is allocated on a helper thread while training starts.
    reserver_ = std::thread([this] {
      try {
        writer_->reserve_staging(snapshot_state_bytes(*net_, *optimizer_));
      } catch (...) {
        reserve_error_ = std::current_exception();
      }
    });
  }
  // `status` reads the write in flight when it is asked, also while close() waits for the last one.
  if (writer_)
    control_->set_live_status("checkpoint_write",
                              [progress = writer_->progress_source()] { return progress().to_json(); });
  last_ckpt_time_ = Clock::now();
  frames_counted_at_ = Clock::now();
}

// Note [Time to the first step]
// From launch (the Trainer's construction) to the first step's record, in the
// phases a user can act on: "start" (the device, the rendezvous, the control
// socket, the checkpoint chosen), "model" (the file read and its weights put on
// the device, frozen ones cast), "data" (the dataset's index, the decode
// threads; with trainer.micro_batch_size auto the index before the probes and
// the source after them, one phase), "micro-batch" (auto's probes; only when
// they run), "step runner" (a compiled package loaded), "optimizer" (the
// gradient path, the moments, the optimizer graph), "resume" (the run
// directory and a checkpoint read), "first batch" (the first step's data
// wait: the first decode), "first forward+backward" (the step runner's first
// call: on a GPU the host's part, where the first use of every kernel loads
// it, and the wait for the device once its queue is full), "first update"
// (clipping and the optimizer's first call; on the plain path also the wait
// for the step's values) and "first record" (the rest until the step's record:
// on the fast path the next step's launch and the wait for the values, read
// one step late). Each phase also carries what the trainer thread spent in it:
// its CPU time and its page faults served from storage (a library's code
// mapped but never read, a model file not in the page cache), with the
// process's bytes read from storage, so a slow phase says whether it
// computed, read, or waited on the device or another thread. Logged once
// (phases of 0.05 s or more; the usage for those of 1 s or more), in
// summary.json and in `status` (time_to_first_step).
void Trainer::Impl::startup_phase(const char* name) {
  const Clock::time_point now = Clock::now();
  const ThreadUsage use = ThreadUsage::now();
  const StartupPhase part{name, std::chrono::duration<double>(now - startup_mark_).count(), use - startup_use_};
  startup_mark_ = now;
  startup_use_ = use;
  // A phase in two parts ("data": the dataset before auto's probes, the source after them) is one phase.
  for (StartupPhase& p : startup_)
    if (p.name == part.name) {
      p.s += part.s, p.use = p.use + part.use;
      return;
    }
  startup_.push_back(part);
}

void Trainer::Impl::close_startup() {
  double before = 0;
  for (const StartupPhase& p : startup_) before += p.s;
  // The last phase ends where first_step_s_ was taken, so the phases sum to it exactly.
  startup_.push_back({"first record", std::max(first_step_s_ - before, 0.0), ThreadUsage::now() - startup_use_});
  if (leader_) LF_LOG(logger("trainer"), info) << "first step done " << startup_text();
}

// "16.4 s after launch: start 1.2 s, model 6.3 s (cpu 5.1 s, 1203 MB read, 4 page faults from storage), ..."
// (the phases of 0.05 s or more; what the trainer thread spent for those of 1 s or more).
std::string Trainer::Impl::startup_text() const {
  char text[160];
  std::snprintf(text, sizeof text, "%.1f s after launch", first_step_s_);
  std::string line = text;
  const char* sep = ": ";
  for (const StartupPhase& p : startup_) {
    if (p.s < 0.05) continue;
    std::snprintf(text, sizeof text, "%s%s %.1f s", sep, p.name.c_str(), p.s);
    line += text, sep = ", ";
    if (p.s < 1.0) continue;
    std::snprintf(text, sizeof text, " (cpu %.1f s", p.use.cpu_s);
    line += text;
    if (p.use.storage_read_bytes >= 0) {
      std::snprintf(text, sizeof text, ", %.0f MB read", static_cast<double>(p.use.storage_read_bytes) / (1 << 20));
      line += text;
    }
    std::snprintf(text, sizeof text, ", %lld page faults from storage)", static_cast<long long>(p.use.major_faults));
    line += text;
  }
  return line;
}

nlohmann::json Trainer::Impl::startup_json() const {
  nlohmann::json phases = nlohmann::json::array();  // in order (a JSON object's keys would be sorted)
  for (const StartupPhase& p : startup_)
    phases.push_back({{"phase", p.name},
                      {"s", p.s},
                      {"cpu_s", p.use.cpu_s},
                      {"major_faults", p.use.major_faults},
                      {"storage_read_mb", p.use.storage_read_bytes >= 0
                                              ? nlohmann::json(static_cast<double>(p.use.storage_read_bytes) / (1 << 20))
                                              : nlohmann::json(nullptr)}});
  return {{"total_s", first_step_s_}, {"phases", phases}};
}

void Trainer::Impl::open() {
  startup_use_ = ThreadUsage::now();  // usage is per thread: counted on the thread that opens and trains
  // Before the first CUDA call (resolve_device's): the driver reads CUDA_CACHE_PATH once.
  if (const std::string jit = fusion::share_cuda_jit_cache(cfg_); !jit.empty() && leader_)
    LF_LOG(logger("trainer"), info) << "CUDA's JIT cache: " << jit
                                    << " (kernels compiled from PTX on first use, kept beside the compiled packages)";
  resolve_device();
  // A SIGUSR1/SIGTERM that arrives while the model loads or the ranks rendezvous (Slurm's warning can come
  // early) is kept for the first step boundary instead of killing the process.
  install_stop_signals();
  mla::install(cfg_, device_);  // the memory seam, before the first CUDA allocation
  if (const std::string chose = adfe::resolve(cfg_, device_); !chose.empty() && leader_)
    LF_LOG(logger("trainer"), info) << chose;
  engines_ = engine_records(cfg_);
  // nullptr at one rank; with fault.enable, a restarted rank of a job that went on without it joins later
  // (Note [Taking a rank back] in trainer_fault.cpp).
  world_ = comm::connect_for_training(world_info_, device_, cfg_.fault.enable);
  open_control();
  open_fault();  // the heartbeat (fault.enable)
  prepare_process();
  const std::string resume_dir = choose_resume_dir();
  check_preemption_lead();  // Note [Preemption lead time] in trainer_close.cpp
  adopt_checkpoint_batch(resume_dir);
  check_micro_batch_auto();  // before the model loads: the CPU cannot choose a micro-batch
  startup_phase("start");
  // What lives the whole run is allocated from here to the fast path, each
  // part under its label (MLA's persistent arena; memory seam).
  std::optional<memory::LifetimeScope> whole_run;
  auto persistent = [&whole_run](const char* what) {
    whole_run.reset();
    whole_run.emplace(memory::Lifetime::kPersistent, what);
  };
  persistent("model");
  open_model();
  dmf::resolve(cfg_, net_->info());  // DMF's requirements of the model, before the data opens
  startup_phase("model");
  persistent("data source");
  // The dataset and the sample options first: auto sizes the data's device memory from them.
  open_dataset();
  if (micro_batch_unresolved()) {  // trainer.micro_batch_size auto, before its first user (the data source)
    startup_phase("data");
    whole_run.reset();  // the probes' memory lives only while they run
    resolve_micro_batch();
    startup_phase("micro-batch");
    persistent("data source");
  }

  // The seams, each through its engine's factory (the plain implementation when the engine is off).
  open_data();  // data: adfe::make_source
  startup_phase("data");  // with auto, added to the dataset's part before the probes
  persistent("step runner");
  // trainer.compiled_step=auto may compile the package first (minutes): `status` shows it as phase "compiling".
  // Its package takes the bf16 working copies this run would keep (optim::compiled_working_copies).
  const bool bf16_cuda = bf16_ && device_.is_cuda();
  const fusion::CompiledStepSetting compiled = fusion::compiled_step_setting(cfg_, device_);
  const std::vector<std::string> copies =
      compiled == fusion::CompiledStepSetting::cache
          ? optim::compiled_working_copies(cfg_, *net_, device_, bf16_cuda, world_ != nullptr)
          : std::vector<std::string>{};
  // DMF's text widths: a package for each where the compiled step may run (Note [DMF and the package]).
  const dmf::Plan dmf_plan = dmf::plan(
      cfg_, cfg_.dmf.enable ? data::text_length_histogram(data_, cfg_.data.max_text_len) : std::vector<double>{},
      compiled != fusion::CompiledStepSetting::off);
  const fusion::StepMode& mode = mode_ = fusion::step_mode(
      cfg_, *net_, device_, bf16_cuda,
      [this](const nlohmann::json& compile) {
        control_->publish_status({{"phase", "compiling"},
                                  {"model", cfg_.model.path},
                                  {"rank", world_info_.rank},
                                  {"world", world_info_.world_size},
                                  {"compile", compile}});
      },
      copies, dmf_plan.buckets.widths);
  runner_ = dmf::make_step_runner(cfg_, *net_, mode, bf16_ && device_.is_cuda(), device_, dmf_plan,  // compute
                                  find_engine(engines_, "dmf"));
  if (const nlohmann::json st = runner_->status(); st.is_object() && st.contains("package"))
    compiled_step_ = st["package"];
  startup_phase("step runner");
  persistent("optimizer");
  gcts::GradientPath gradients = gcts::make_gradient_path(
      cfg_,
      {world_.get(), net_.get(), runner_.get(), device_, bf16_, mode.graphs, mode.compiled,
       cfg_.trainer.gradient_accumulation_steps},
      find_engine(engines_, "gcts"));  // gradient communication and the update
  optimizer_ = std::move(gradients.optimizer);
  reducer_ = std::move(gradients.reducer);
  graph_reduction_ = std::move(gradients.graph_reduction);
  schedule_ = optim::schedule(cfg_);
  persistent("gradients");
  const bool made_gradients =
      mode.graphs && !mode.compiled && runner_->make_gradients(/*allowed=*/!optimizer_->owns_gradients());
  persistent("fast path");
  open_fast_path(mode, made_gradients);
  whole_run.reset();
  startup_phase("optimizer");

  open_run_dir(resume_dir);
  resume(resume_dir);
  startup_phase("resume");
  log_run_line();
  open_outputs();

  if (world_ && world_->joining()) {
    if (!wait_to_rejoin()) {
      ended_before_rejoin_ = true;
      return;
    }
    control_->skip_published();  // the commands of the job before this rank rejoined are not its own
  }
  publish("training", nullptr);
  // Requests that arrived while the model loaded.
  const auto a = control_->step_boundary(steps_done_, stop_requested(), requeue_requested());
  if (a.checkpoint && !a.stop) save(steps_done_);
  if (a.stop) stop_applied_at_ = Clock::now();
  control_stop_ = a.stop;
  requeue_stop_ = a.requeue;
  preempt_stop_ = a.signal;
}

}  // namespace loongforge::trainer
