// Trainer, phase 2: steps and step boundaries (trainer.hpp).
#include <algorithm>  // std::max
#include <cmath>      // std::isfinite
#include <cstdlib>    // std::getenv, std::atol
#include <set>        // std::set
#include <thread>     // std::this_thread

#include <ATen/ATen.h>  // at::Tensor

#include "control_plane.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/memory/memory.hpp"
#include "stop_signal.hpp"
#include "trainer_impl.hpp"

namespace loongforge::trainer {

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Test hook: LOONGFORGE_TEST_FIRST_STEP_DELAY_MS=N makes the first step of a process wait N ms for its
// data, as a cold first decode does (test/e2e/test_train_run.py: the summary's steady figures ignore it).
void test_first_step_delay() {
  const char* v = std::getenv("LOONGFORGE_TEST_FIRST_STEP_DELAY_MS");
  if (v && std::atol(v) > 0) std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(v)));
}
}  // namespace

// Stops on a non-finite loss or gradient norm of step `step` (1-based) when
// trainer.stop_on_nonfinite, else warns; the update of that step is (or was,
// on the device) skipped.
void Trainer::Impl::check_finite(int64_t step, double loss, double norm, bool read_late) {
  if (std::isfinite(loss) && std::isfinite(norm)) return;
  const std::string what = !std::isfinite(loss) ? "loss is " + std::to_string(loss)
                                                 : "gradient norm is " + std::to_string(norm);
  const std::string late = read_late ? " (values are read one step late on the fast path: step " +
                                           std::to_string(step + 1) + " has run too)"
                                     : "";
  // The fast path skips an update on the device when the gradient norm is non-finite.
  const std::string updated = !read_late || !std::isfinite(norm) ? "parameters were not updated by it"
                                                                  : "its update was applied (only the loss was non-finite)";
  if (cfg_.trainer.stop_on_nonfinite)
    throw TrainingError("step " + std::to_string(step) + ": " + what + "; " + updated + late +
                        ". Lower optimizer.lr, check the data, or set trainer.stop_on_nonfinite=false to skip such "
                        "steps" + (last_ckpt_.empty() ? "" : " (newest checkpoint: " + last_ckpt_ + ")"));
  LF_LOG(logger("trainer"), warn) << "step " << step << ": " << what << "; " << updated << late;
}

bool Trainer::Impl::more() const { return steps_done_ < last_step_ && !control_stop_; }

void Trainer::Impl::step() {
  const int64_t s = steps_done_;  // the 0-based step taken now
  const int64_t k = cfg_.trainer.gradient_accumulation_steps;
  control_->step_begins();
  failed_phase() = {};
  const auto t_step = Clock::now();
  step_began_ = t_step;

  // Every micro-batch of the step first: their valid counts weight the losses.
  std::vector<data::ReadyBatch> batches;
  int64_t local_valid = 0, tokens = 0, text_tokens = 0;
  std::vector<comm::StepCounts> micro;
  for (int64_t i = 0; i < k; ++i) {
    batches.push_back(source_->next(s, i, *control_));
    batches.back().draw_seed = fusion::draw_seed(static_cast<uint64_t>(cfg_.run.seed), s, i, world_info_.rank);
    local_valid += batches.back().num_valid;
    tokens += batches.back().tokens;
    text_tokens += batches.back().text_tokens;
    micro.push_back({batches.back().num_valid, batches.back().embodiments});
  }
  if (s == pos_.step) test_first_step_delay();  // the first step of this process: counted as data wait
  const double data_ms = ms_since(t_step);
  if (marking_first_step_) startup_phase("first batch");  // the first decode (Note [Time to the first step])
  // Host to host: no rank waits for its device here (reducer.hpp).
  const int64_t total_valid = reducer_->agree_counts(comm::StepCounts::combine(micro)).valid;
  const auto world = static_cast<double>(reducer_->world_size());
  std::vector<double> weights(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i)
    weights[static_cast<size_t>(i)] =
        total_valid > 0 ? static_cast<double>(batches[static_cast<size_t>(i)].num_valid) * world /
                              static_cast<double>(total_valid)
                        : 1.0 / static_cast<double>(k);

  double comm_ms = 0;
  {
    // A sharded optimizer's all-gathers of the last update (Note [Gather overlap] in sharded_adamw.cpp).
    Phase p(*control_, "comm/gather", s + 1);
    const auto t0 = Clock::now();
    if (comm_timer_) comm_timer_->begin();
    optimizer_->sync_parameters();
    if (comm_timer_) comm_timer_->end();
    comm_ms += ms_since(t0);
  }
  reducer_->begin_step(optimizer_->params(), k);  // GCTS overlap: arms the gradient hooks
  at::Tensor loss = runner_->run(batches, weights, s, *control_);
  // Each micro-batch's text slot as it ran (DMF cuts it): the step's padding and FLOPs.
  int64_t text_slot_tokens = 0, text_width = 0;
  double step_flops = 0;
  for (const auto& b : batches) {
    const at::Tensor& t = b.tensors.at("text_tokens");
    text_slot_tokens += t.size(0) * t.size(1);
    text_width = std::max(text_width, t.size(1));
    const auto& by_width = net_->info().flops_by_text_len;
    step_flops += static_cast<double>(t.size(0)) *
                  (static_cast<size_t>(t.size(1)) < by_width.size() ? by_width[static_cast<size_t>(t.size(1))]
                                                                   : flops_per_sample_);
  }
  batches.clear();  // the step's inputs are no longer needed

  if (reducer_->reduces()) {  // one rank: a sharded optimizer still takes its gradient shard
    const auto t0 = Clock::now();
    if (comm_timer_) comm_timer_->begin();
    reducer_->average_gradients(optimizer_->params(), *control_, s);
    if (reducer_->world_size() > 1) loss = reducer_->sum_scalar(loss) / world;  // the job's loss (docs/training-semantics.md s5)
    if (comm_timer_) comm_timer_->end();
    comm_ms += ms_since(t0);
  }
  if (comm_timer_) comm_timer_->close_step(s + 1);
  if (marking_first_step_) startup_phase("first forward+backward");
  settle_step(s + 1);  // fault tolerance on NCCL: the step's collectives have completed before its update

  double step_loss = 0, grad_norm = 0;
  const double lr = schedule_.lr_at(s);
  if (readback_) {
    // The fast path: no host synchronisation. A non-finite norm skips the
    // update on the device; loss and norm are read at the next boundary.
    Phase p(*control_, "optimizer", s + 1);
    at::Tensor norm;
    if (optimizer_graph_) {
      norm = optimizer_graph_->step(lr);  // clipping + update replayed as one CUDA graph once the gradients stay put
    } else {
      norm = optimizer_->clip_grad_norm(cfg_.trainer.grad_clip_norm);
      optimizer_->step(lr);
    }
    readback_->post(loss, norm);
  } else {
    Phase p(*control_, "optimizer", s + 1);
    const at::Tensor norm = optimizer_->clip_grad_norm(cfg_.trainer.grad_clip_norm);
    // The plain path reads both now: the non-finite check precedes the update.
    step_loss = loss.item<double>();
    grad_norm = norm.item<double>();
    check_finite(s + 1, step_loss, grad_norm, /*read_late=*/false);
    if (std::isfinite(step_loss) && std::isfinite(grad_norm))
      optimizer_->step(lr);
    else
      optimizer_->zero_grad();  // stop_on_nonfinite=false: skip this update
  }
  if (marking_first_step_) {
    startup_phase("first update");
    marking_first_step_ = false;
  }

  StepRecord& r = record_;
  r = StepRecord{};
  r.step = s + 1;
  r.loss = step_loss;
  r.lr = lr;
  r.grad_norm = grad_norm;
  r.num_valid = static_cast<double>(local_valid);
  r.data_wait_ms = data_ms;
  r.exposed_comm_ms = comm_ms;
  r.tokens = tokens;
  r.flops = step_flops;
  r.text_width = static_cast<double>(text_width);
  {
    std::set<int64_t> slots;
    for (const auto& m : micro) slots.insert(m.slots.begin(), m.slots.end());  // the batches are spent by now
    r.embodiments = static_cast<double>(slots.size());
  }
  if (const auto& info = net_->info(); info.vl_tokens_per_sample > 0) {
    const int64_t samples = k * cfg_.trainer.micro_batch_size;
    r.vl_tokens = static_cast<double>(samples * (info.vl_tokens_per_sample - info.text_slot) + text_slot_tokens);
    r.vl_padding_tokens = static_cast<double>(text_slot_tokens - text_tokens);
  }
  const data::DataStats ds = source_->stats();
  r.samples_skipped = static_cast<double>(ds.samples_skipped);
  r.videos_bad = static_cast<double>(ds.videos_bad);
  r.data_queue_depth = static_cast<double>(ds.queue_depth);
  const double since_ms = std::chrono::duration<double, std::milli>(Clock::now() - frames_counted_at_).count();
  r.decoded_frames_per_s = static_cast<double>(ds.frames_decoded - frames_counted_) / std::max(since_ms / 1000.0, 1e-6);
  r.read_mb_per_s = static_cast<double>(ds.video_bytes_read - bytes_counted_) / (1 << 20) / std::max(since_ms / 1000.0, 1e-6);
  r.h2d_mb_per_s = static_cast<double>(ds.h2d_bytes - h2d_counted_) / (1 << 20) / std::max(since_ms / 1000.0, 1e-6);
  r.decode_jobs = static_cast<double>(ds.decode_jobs);
  r.io_jobs = static_cast<double>(ds.io_jobs);
  r.readahead_mb_per_s =
      static_cast<double>(ds.readahead_bytes - readahead_counted_) / (1 << 20) / std::max(since_ms / 1000.0, 1e-6);
  readahead_counted_ = ds.readahead_bytes;
  frames_counted_ = ds.frames_decoded;
  bytes_counted_ = ds.video_bytes_read;
  h2d_counted_ = ds.h2d_bytes;
  frames_counted_at_ = Clock::now();
  set_step_time(r, ms_since(t_step));  // the fast path corrects it once the step's values are back
  step_started_ = t_step;
  memory::step_done(s + 1);  // MLA: the step's allocation time, its fences
  const memory::Stats mem = memory::stats(device_);
  r.peak_mem_mb = device_.is_cuda() ? mem.peak_device_mb : mem.peak_host_mb;
  r.memory_scalars = mem.scalars;
  r.engine_scalars = runner_->step_scalars();
  steps_done_ = s + 1;
  after_first_step();  // fault.comm_timeout_s from here on
}

void Trainer::Impl::step_boundary() {
  const int64_t s = steps_done_;
  const auto t_step_end = Clock::now();
  ControlPlane::Actions actions;
  {
    Phase p(*control_, "control", s);
    poll_rejoins();  // fault.auto_rejoin
    actions = control_->step_boundary(s, stop_requested(), requeue_requested());
    if (actions.rejoin != -2) admit(actions.rejoin);  // hot-rejoin (Note [Taking a rank back])
  }
  if (actions.stop && !control_stop_) stop_applied_at_ = t_step_end;
  control_stop_ = actions.stop;
  requeue_stop_ = actions.requeue;
  preempt_stop_ = actions.signal;
  {
    Phase p(*control_, "checkpoint", s);
    const bool by_steps = s % cfg_.checkpoint.interval_steps == 0;
    const bool by_time = cfg_.checkpoint.interval_minutes > 0 &&
                         ms_since(last_ckpt_time_) >= cfg_.checkpoint.interval_minutes * 60000.0;
    if ((by_steps || by_time || actions.checkpoint) && s < last_step_ && !control_stop_)
      record_.checkpoint_stall_ms = save(s);
  }
  // The records whose values are known go out: on the fast path the previous
  // step's (its values are ready, or nearly: waiting for them lets this step
  // run on the device meanwhile) and this one's only when the run ends here.
  const StepRecord* newest = &record_;
  StepRecord late;
  if (!readback_) {
    device_exposed_comm(record_);
    record_progress(record_);
  } else {
    newest = nullptr;
    if (auto prev = readback_->take_previous())
      record_progress(late = complete(std::move(*prev), step_started_)), newest = &late;
    readback_->hold(record_, step_started_);
    if (!more() || stop_requested()) {
      auto cur = readback_->take_current();
      cur->values();  // the last step: its period ends when its work is done
      record_progress(late = complete(std::move(*cur), Clock::now())), newest = &late;
    }
  }
  collect_writes();
  if (newest) publish("training", newest);
  control_->step_done(s, record_.step_ms + ms_since(t_step_end), memory::to_json(memory::stats(device_)),
                      {{"queue_depth", record_.data_queue_depth},
                       {"decoded_frames_per_s", record_.decoded_frames_per_s},
                       {"read_mb_per_s", record_.read_mb_per_s},
                       {"h2d_mb_per_s", record_.h2d_mb_per_s},
                       {"decode_jobs", record_.decode_jobs},
                       {"io_jobs", record_.io_jobs},
                       {"readahead_mb_per_s", record_.readahead_mb_per_s}});
}

// Hands a finished step's record to the progress output; the first one also
// fixes the time from launch to the first step (summary, status).
void Trainer::Impl::record_progress(const StepRecord& r) {
  progress_->record(r);
  if (first_step_s_ < 0) {
    first_step_s_ = std::chrono::duration<double>(Clock::now() - t_start_).count();
    close_startup();
  }
}

// Step time and the rates derived from it.
void Trainer::Impl::set_step_time(StepRecord& r, double step_ms) const {
  r.step_ms = step_ms;
  const double samples = static_cast<double>(cfg_.trainer.gradient_accumulation_steps * cfg_.trainer.micro_batch_size);
  r.samples_per_s = samples / (r.step_ms / 1000.0);
  r.tokens_per_s = static_cast<double>(r.tokens) / (r.step_ms / 1000.0);
  r.mfu = device_.is_cuda() ? r.flops / (r.step_ms / 1000.0) / 989e12 : 0.0;
}

// A held record with its loss and gradient norm read back (waits for them).
// On the fast path step() only queues work, so a step's time is the period
// from its start to the start of the next one (or to its values' arrival,
// for the last), less its checkpoint stall: in steady state the host waits
// one step behind the device, so this is the device's pace.
StepRecord Trainer::Impl::complete(Readback::Held held, Clock::time_point next_start) {
  const auto [loss, norm] = held.values();
  held.record.loss = loss, held.record.grad_norm = norm;
  const double period = std::chrono::duration<double, std::milli>(next_start - held.started).count();
  set_step_time(held.record, std::max(period - held.record.checkpoint_stall_ms, 1e-3));
  check_finite(held.record.step, loss, norm, /*read_late=*/true);
  device_exposed_comm(held.record);
  return held.record;
}

// On GPUs the step's exposed communication is the device's (Note [Exposed
// communication on the device] in readback.cpp): the host time around the
// calls counts only launches there. Called once the step's values are read.
void Trainer::Impl::device_exposed_comm(StepRecord& r) {
  if (!comm_timer_) return;
  if (const auto ms = comm_timer_->take(r.step)) r.exposed_comm_ms = *ms;
  // A reduction captured into the step's graph: its tail, timed inside the graph (Note [Timing inside a graph]).
  if (const auto ms = runner_->take_graph_comm_ms(r.step)) r.exposed_comm_ms += *ms;
  reducer_->exposed_on_device(r.step, r.exposed_comm_ms);
}

// Hands the state to the writer, which copies it to host staging (the stall) before submit() returns.
// `preemption`: the fastest layout, verified at the next start (Note [Preemption saves] in src/checkpoint/writer.cpp).
double Trainer::Impl::save(int64_t steps_done, bool preemption) {
  const auto t0 = Clock::now();
  last_saved_step_ = steps_done;
  if (!writer_) return 0.0;
  optimizer_->sync_parameters();  // the parameters of the last update are all in place
  pos_.step = steps_done;
  pos_.epoch = source_->sampler().epoch_of_step(steps_done);
  writer_->wait();  // the previous write is over: its staging is free again
  // submit() copies the state into the writer's staging before it returns (Note [Bounded staging]).
  if (!leader_) {  // a sharded optimizer's shard, staged for rank 0
    checkpoint::Snapshot shard = make_peer_snapshot(*optimizer_, pos_, world_info_.rank);
    shard.preemption = preemption;
    writer_->submit(std::move(shard));
    return ms_since(t0);
  }
  if (reserver_.joinable()) reserver_.join();
  if (reserve_error_) std::rethrow_exception(reserve_error_);
  checkpoint::Snapshot snapshot =
      make_snapshot(cfg_, *net_, *optimizer_, schedule_, pos_, world_info_.world_size, engines_);
  if (optimizer_->sharded()) snapshot.peer_files = peer_optimizer_files(world_info_.world_size);
  snapshot.preemption = preemption;
  writer_->submit(std::move(snapshot));
  last_ckpt_time_ = Clock::now();
  return ms_since(t0);
}

// Reports finished writes: a failure (disk full, ...) is logged and training goes on.
void Trainer::Impl::collect_writes() {
  if (!writer_) return;
  const auto& log = logger("trainer");
  for (const auto& w : writer_->take_results()) {
    if (!leader_) {  // this rank's shard; rank 0 reports the checkpoint
      if (!w.error.empty())
        LF_LOG(log, warn) << "optimizer shard of step " << w.step << " FAILED: " << w.error
                          << " -- rank 0's checkpoint of that step fails with it; training continues";
      continue;
    }
    control_->checkpoint_finished(w.step, w.path, w.error, w.seconds, w.bytes);
    last_write_ = w;
    if (w.error.empty()) {
      last_ckpt_ = w.path;
      LF_LOG(log, info) << "checkpoint " << w.path << ": " << static_cast<double>(w.bytes) / 1e6 << " MB in "
                        << w.seconds << " s";
    } else if (w.abandoned) {  // a lost rank's shard never came (fault.enable): the run survived that
      LF_LOG(log, warn) << "checkpoint at step " << w.step << " abandoned: " << w.error
                        << " -- the newest intact checkpoint is " << (last_ckpt_.empty() ? "(none)" : last_ckpt_);
    } else {
      ++failed_writes_;
      LF_LOG(log, warn) << "checkpoint at step " << w.step << " FAILED: " << w.error
                        << " -- training continues; the newest intact checkpoint is "
                        << (last_ckpt_.empty() ? "(none)" : last_ckpt_);
    }
  }
}

// status's "data": this rank's skips and decode work, and what the source says of itself (ADFE: its queue).
nlohmann::json Trainer::Impl::data_status(const StepRecord* r) const {
  const data::DataStats ds = source_ ? source_->stats() : data::DataStats{};
  nlohmann::json d = {{"samples_skipped", ds.samples_skipped},
                      {"videos_bad", ds.videos_bad},
                      {"on_bad_video", cfg_.data.on_bad_video},
                      {"video_decode", cfg_.data.video_decode},
                      {"videos_decoded", ds.videos_decoded},
                      {"spans_decoded", ds.spans_decoded},
                      {"frames_decoded", ds.frames_decoded},
                      {"video_mb_read", static_cast<double>(ds.video_bytes_read) / (1 << 20)},
                      {"frame_cache_mb", static_cast<double>(ds.cache_bytes) / (1 << 20)},
                      {"frame_cache_limit_mb", cfg_.data.frame_cache_mb}};
  d.update(source_ ? source_->status() : nlohmann::json{{"source", "sync"}});
  if (r) {
    d["decoded_frames_per_s"] = r->decoded_frames_per_s, d["read_mb_per_s"] = r->read_mb_per_s;
    d["h2d_mb_per_s"] = r->h2d_mb_per_s;
  }
  return d;
}

// Status for `loongforge status`: rebuilt after every step.
void Trainer::Impl::publish(const char* phase, const StepRecord* r) {
  nlohmann::json engines = nlohmann::json::object();
  for (const auto& e : engines_) engines[e.name] = e.status_json();
  nlohmann::json st = {{"phase", phase},
                       {"step", r ? r->step : steps_done_},
                       {"max_steps", cfg_.trainer.max_steps},
                       {"run_dir", run_dir_},
                       {"model", net_ ? net_->info().name : cfg_.model.path},
                       {"device", device_.str()},
                       {"precision", bf16_ ? "bf16" : "fp32"},
                       {"bf16_weights", optim::working_copies_json(optimizer_.get())},
                       {"rank", world_info_.rank},
                       {"world", world_info_.world_size},
                       {"global_batch", pos_.global_batch},
                       {"micro_batch", micro_batch_json()},
                       {"strategy", reducer_->strategy()},
                       {"engines", engines},
                       {"last_checkpoint", last_ckpt_},
                       {"checkpoint_writes_failed", failed_writes_},
                       {"data", data_status(r)},
                       {"fault", fault_status()},
                       {"elapsed_s", std::chrono::duration<double>(Clock::now() - t_start_).count()}};
  if (r) {
    // Note [Steady state] in progress.cpp: the speed and the ETA of the steps after warm-up.
    const SteadyState steady = steady_state(progress_->history());
    const double eta = steady.step_ms / 1000.0 * static_cast<double>(cfg_.trainer.max_steps - r->step);
    st["steady_state"] = {{"from_step", steady.from_step},
                          {"steps", steady.steps},
                          {"samples_per_s", steady.samples_per_s},
                          {"step_ms", steady.step_ms},
                          {"data_wait_fraction", steady.data_wait_fraction}};
    if (first_step_s_ >= 0) st["time_to_first_step_s"] = first_step_s_, st["time_to_first_step"] = startup_json();
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
    const nlohmann::json runner = runner_->status();
    if (!runner.is_null()) st["step_runner"] = runner;
    if (optimizer_graph_) st["optimizer_graph"] = optimizer_graph_->status();
    nlohmann::json comm = reducer_->comm_status();
    if (!comm.is_null() && fault_) comm["group"] = {{"generation", generation_}, {"members", members_}};
    if (!comm.is_null()) st["comm"] = comm;
  }
  control_->publish_status(std::move(st));
}

}  // namespace loongforge::trainer
