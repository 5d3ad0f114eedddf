// Trainer, phase 3: close -- the final checkpoint and the summary; and run(),
// which turns a failure inside a step into a message (trainer.hpp).
#include <algorithm>  // std::min
#include <cmath>      // std::floor
#include <cstdio>     // std::printf, std::snprintf
#include <fstream>    // std::ofstream
#include <string>     // std::string
#include <vector>     // std::vector

#include <c10/util/Exception.h>  // c10::Error, c10::OutOfMemoryError

#include "control_plane.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/memory/memory.hpp"
#include "stop_signal.hpp"
#include "trainer_impl.hpp"

namespace loongforge::trainer {

int Trainer::Impl::run() {
  open();
  if (ended_before_rejoin_) return 0;  // restarted, and the job ended before it was taken back: nothing to do
  try {
    while (more()) {
      try {
        step();
      } catch (const CommError& e) {
        if (!fault_) throw;
        recover(e);  // Note [Training on after a lost rank] in trainer_fault.cpp
        continue;
      }
      step_boundary();
    }
  } catch (const DataError& e) {
    fail_on_data(e);  // a bad video or shard (data.on_bad_video=error): keep the last good step
  } catch (const Error&) {
    throw;  // ours: already names what to do
  } catch (const c10::OutOfMemoryError& e) {
    fail_in_step(e, /*out_of_memory=*/true);
  } catch (const std::exception& e) {
    // libtorch errors inside a TorchScript forward arrive re-wrapped by the
    // interpreter (a std::runtime_error holding the TorchScript traceback).
    const std::string what = e.what();
    fail_in_step(e, what.find("out of memory") != std::string::npos ||
                        what.find("can't allocate memory") != std::string::npos);
  }
  return close();
}

int Trainer::Impl::close() {
  const auto& log = logger("trainer");
  const int64_t s = steps_done_;
  progress_->finish();
  if (requeue_stop_)
    LF_LOG(log, info) << "requeue requested (SIGUSR1): checkpointing at step " << s
                      << (s < cfg_.trainer.max_steps ? ", then exit " + std::to_string(kExitRequeue)
                                                     : std::string("; the run is complete: exit 0"));
  else if (stop_requested())
    LF_LOG(log, info) << "stop requested (signal): checkpointing at step " << s;
  else if (control_stop_)
    LF_LOG(log, info) << "stop requested (control socket): checkpointing at step " << s;
  // The final checkpoint (also on SIGTERM/SIGINT, `loongforge stop` and
  // steps_per_run); none when this process took no step (resumed at the end,
  // or stopped at once) or when this step is already saved.
  const auto& h = progress_->history();
  publish("stopping", h.empty() ? nullptr : &h.back());
  if (!h.empty() && last_saved_step_ != s) {
    if (preempt_stop_)
      preemption_save(s);  // a signal: the fastest layout, timed against checkpoint.preempt_lead_s
    else
      save(s);
  }
  if (writer_) writer_->wait();
  collect_writes();
  if (reserver_.joinable()) reserver_.join();
  if (world_) world_->barrier();  // rank 0's final checkpoint is complete before any rank exits
  tell_waiting_ranks_the_job_ended();
  heartbeat_.reset();
  join_retired_worlds();
  control_->shutdown({{"stopped_at_step", s}, {"checkpoint", last_ckpt_}, {"checkpoint_writes_failed", failed_writes_}});
  // 4: a checkpoint write failed; kExitRequeue: stopped by SIGUSR1 with steps left.
  const int status = failed_writes_ > 0 ? 4 : requeue_stop_ && s < cfg_.trainer.max_steps ? kExitRequeue : 0;
  if (h.empty()) return status;  // nothing left to do (resumed at the end, or stopped before the first step)
  if (!leader_) return status;   // rank 0 reports for the job
  report_summary(status);
  return status;
}

namespace {
// 120, 0.001, 0.45, 37.2: whole numbers as they are, else 3 decimals below 0.1, 2 below 10, then 1.
std::string seconds_text(double s) {
  char b[32];
  const char* form = s == std::floor(s) && s < 1e9 ? "%.0f" : s < 0.1 ? "%.3f" : s < 10 ? "%.2f" : "%.1f";
  std::snprintf(b, sizeof b, form, s);
  return b;
}
}  // namespace

// Note [Preemption lead time]
// A stop signal before the job's end (Slurm: --signal=B:USR1@120, 120 s)
// leaves checkpoint.preempt_lead_s for everything after it: finishing the
// step in flight, then the preemption save (Note [Preemption saves] in
// src/checkpoint/writer.cpp) until it is durable; a periodic write still in
// flight is finished first and counts in the save's time. Rank 0 times that from the
// signal (its own; when another rank got it, from the boundary where rank 0
// applied the stop, which is at most one step later), logs it against the
// lead time and records it in <run dir>/preemption.json. A resumed run
// (checkpoint.resume set) reads that file before it loads anything and
// refuses to start when the recorded time exceeds the lead time: the next
// preemption would be killed before its save is durable (check_preemption_lead).
// The figure is the last preemption save's: a run never preempted has none
// and is not checked.

// The checkpoint of a stop by signal: written, waited for (durable), timed and recorded (rank 0).
void Trainer::Impl::preemption_save(int64_t steps_done) {
  const auto& log = logger("trainer");
  const auto signal_at = stop_signal_time();
  const Clock::time_point from = signal_at ? *signal_at : stop_applied_at_;
  const auto t_save = Clock::now();
  save(steps_done, /*preemption=*/true);
  if (writer_) writer_->wait();  // every file fsynced, the directory published (rank 0: the other ranks' shards too)
  const auto t_durable = Clock::now();
  collect_writes();
  if (!leader_ || !writer_) return;
  const auto secs = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const double total_s = secs(from, t_durable), finish_step_s = secs(from, t_save), save_s = secs(t_save, t_durable);
  const double lead_s = cfg_.checkpoint.preempt_lead_s;
  const bool ok = last_write_.error.empty() && last_write_.step == steps_done;
  const nlohmann::json record = {
      {"step", steps_done},
      {"checkpoint", ok ? last_write_.path : ""},
      {"bytes", ok ? last_write_.bytes : 0},
      {"save_s", save_s},
      {"finish_step_s", finish_step_s},
      {"signal_to_durable_s", total_s},
      {"timed_from", signal_at ? "the signal on rank 0" : "rank 0 applying a stop signalled on another rank"},
      {"preempt_lead_s", lead_s},
      {"error", ok ? "" : last_write_.error}};
  try {
    const std::string file = run_dir_ + "/preemption.json";
    {
      std::ofstream out(file + ".tmp");
      out << record.dump(2) << "\n";
      if (!out.flush()) throw Error(file + ".tmp: write failed");
    }
    rename_path(file + ".tmp", file);
  } catch (const std::exception& e) {
    LF_LOG(log, warn) << "cannot record the preemption save's time: " << e.what();
  }
  if (!ok) return;  // collect_writes() said why
  const std::string what = "preemption save " + last_write_.path + ": " +
                           seconds_text(static_cast<double>(last_write_.bytes) / 1e6) + " MB written in " +
                           seconds_text(save_s) + " s, durable " + seconds_text(total_s) + " s after the " +
                           (signal_at ? "signal" : "stop (signalled on another rank)") + " (finishing step " +
                           std::to_string(steps_done) + ": " + seconds_text(finish_step_s) + " s)";
  if (lead_s <= 0)
    LF_LOG(log, info) << what << "; no lead time set (checkpoint.preempt_lead_s=0)";
  else if (total_s <= lead_s)
    LF_LOG(log, info) << what << "; within the lead time of " << seconds_text(lead_s)
                      << " s (checkpoint.preempt_lead_s), " << seconds_text(lead_s - total_s) << " s to spare";
  else
    LF_LOG(log, warn) << what << ": MORE than the lead time of " << seconds_text(lead_s)
                      << " s (checkpoint.preempt_lead_s): a job ending that long after the signal is killed before "
                         "this save is durable. Give the job more warning (Slurm --signal=B:USR1@<s> and "
                         "checkpoint.preempt_lead_s); the resumed run refuses to start until then";
}

// Before a resumed run loads anything: its last preemption save must fit the lead time (Note [Preemption lead time]).
void Trainer::Impl::check_preemption_lead() {
  if (cfg_.checkpoint.resume.empty() || cfg_.checkpoint.preempt_lead_s <= 0) return;  // every rank has the config
  std::string problem;
  if (leader_) {
    const std::string file = cfg_.run.output_dir + "/" + cfg_.run.name + "/preemption.json";
    if (path_exists(file)) {
      try {
        std::ifstream in(file);
        const nlohmann::json j = nlohmann::json::parse(in);
        const double took = j.at("signal_to_durable_s").get<double>();
        const double lead = cfg_.checkpoint.preempt_lead_s;
        const std::string origin = cfg_.origin.count("checkpoint.preempt_lead_s")
                                       ? cfg_.origin["checkpoint.preempt_lead_s"]
                                       : std::string("the default");
        if (took > lead)
          problem = file + ": the last preemption save (step " + std::to_string(j.value("step", 0LL)) + ", " +
                    seconds_text(j.value("bytes", 0.0) / 1e6) + " MB) was durable " + seconds_text(took) +
                    " s after the stop signal, more than checkpoint.preempt_lead_s = " + seconds_text(lead) +
                    " s (" + origin + "): the next preemption would be killed before its save is durable, losing "
                    "the work since the last checkpoint. Give the job more warning (Slurm: #SBATCH "
                    "--signal=B:USR1@<seconds> in the batch script, and checkpoint.preempt_lead_s to match), make "
                    "the save faster (checkpoint.dir on faster storage, checkpoint.write_threads), or set "
                    "checkpoint.preempt_lead_s=0 to start without this check";
      } catch (const nlohmann::json::exception& e) {
        LF_LOG(logger("trainer"), warn) << file << " is unreadable (" << e.what()
                                        << "); the preemption lead time is not checked";
      }
    }
    if (!problem.empty()) {
      try {
        agree("preempt_lead", "!" + problem);  // the other ranks fail with the same message ("rank 0: ...")
      } catch (const CheckpointError&) {
        // agree() raises rank 0's own '!' value too; here it is a config error, raised below
      }
      throw ConfigError(problem);
    }
  }
  agree("preempt_lead", "");
}

// summary.json and the printed summary: the steady state's speed (Note [Steady state] in progress.cpp),
// the time to the first step, and the whole-run mean labelled as such.
void Trainer::Impl::report_summary(int status) const {
  const auto& log = logger("trainer");
  const auto& h = progress_->history();
  const int64_t s = steps_done_;
  const int64_t k = cfg_.trainer.gradient_accumulation_steps;
  double tail_loss = 0;
  const size_t tail = std::min<size_t>(10, h.size());
  for (size_t i = h.size() - tail; i < h.size(); ++i) tail_loss += h[i].loss / static_cast<double>(tail);
  const double wall_s = std::chrono::duration<double>(Clock::now() - t_start_).count();
  const SteadyState steady = steady_state(h);
  const WholeRunMean mean = whole_run_mean(h, k * cfg_.trainer.micro_batch_size);
  const memory::Stats mem = memory::stats(device_);
  const data::DataStats ds = source_->stats();
  double vl_tokens = 0, vl_padding = 0;  // this rank's, over the steps of this run
  for (const auto& r : h) vl_tokens += r.vl_tokens, vl_padding += r.vl_padding_tokens;
  const double vl_padding_share = vl_tokens > 0 ? vl_padding / vl_tokens : 0.0;
  nlohmann::json summary = {
      {"steps", h.size()},
      {"first_loss", h.front().loss},
      {"final_loss_mean_last_10", tail_loss},
      {"samples_per_s", steady.samples_per_s},
      {"data_wait_fraction", steady.data_wait_fraction},
      {"steady_state",
       {{"from_step", steady.from_step},
        {"steps", steady.steps},
        {"warmup_steps", steady.warmup_steps},
        {"samples_per_s_median", steady.samples_per_s},
        {"step_ms_median", steady.step_ms},
        {"mfu_median", steady.mfu},
        {"data_wait_fraction", steady.data_wait_fraction}}},
      {"whole_run_mean", {{"samples_per_s", mean.samples_per_s}, {"data_wait_fraction", mean.data_wait_fraction}}},
      {"time_to_first_step_s", first_step_s_},
      {"time_to_first_step", startup_json()},
      {"videos_decoded", ds.videos_decoded},
      {"videos_bad", ds.videos_bad},
      {"samples_skipped", ds.samples_skipped},
      {"wall_s", wall_s},
      {"peak_host_mb", mem.peak_host_mb},
      {"peak_device_mb", mem.peak_device_mb},
      {"optimizer_state_mb", static_cast<double>(optimizer_->state_bytes()) / (1024.0 * 1024.0)},
      {"optimizer_buffers_mb", static_cast<double>(optimizer_->buffer_bytes()) / (1024.0 * 1024.0)},
      {"run_dir", run_dir_},
      {"checkpoint", last_ckpt_},
      {"device", device_.str()},
      {"precision", bf16_ ? "bf16" : "fp32"},
      {"bf16_weights", optim::working_copies_json(optimizer_.get())},
      {"compiled_step", compiled_step_},
      {"micro_batch", micro_batch_json()}};
  if (vl_tokens > 0)
    summary["vl_padding"] = {{"vl_tokens", vl_tokens}, {"padding_tokens", vl_padding}, {"share", vl_padding_share},
                             {"text_slot", net_->info().text_slot}, {"text_slot_cut", cfg_.dmf.enable}};
  // DMF's widths and how often a micro-batch's shape was one the run had seen (Note [DMF's shape counts]).
  nlohmann::json dmf_shapes;
  for (const auto& e : engines_)
    if (e.name == "dmf" && e.on()) dmf_shapes = e.status_json();
  if (dmf_shapes.is_object() && dmf_shapes.contains("micro_batches")) summary["dmf"] = dmf_shapes;
  std::ofstream(run_dir_ + "/summary.json") << summary.dump(2) << "\n";
  if (failed_writes_ > 0)
    LF_LOG(log, warn) << failed_writes_ << " checkpoint write(s) failed during the run (see above); newest intact: "
                      << (last_ckpt_.empty() ? "(none)" : last_ckpt_);
  std::printf(
      "\n== LoongForge run summary ==\n"
      "  model        %s (%s, %s)\n  steps        %zu in %s (%.2f steps/s)\n"
      "  loss         %.5f -> %.5f (mean of last %zu)\n"
      "  throughput   %.1f samples/s, data wait %.1f%% of step time (median of steps %lld-%lld, after %lld "
      "warm-up step%s)\n"
      "  first step   %s\n"
      "  whole run    %.1f samples/s, data wait %.1f%% (mean over all %zu steps, warm-up included)\n",
      net_->info().name.c_str(), device_.str().c_str(), bf16_ ? "bf16" : "fp32", h.size(),
      format_duration(wall_s).c_str(), static_cast<double>(h.size()) / wall_s, h.front().loss, tail_loss, tail,
      steady.samples_per_s, 100.0 * steady.data_wait_fraction, static_cast<long long>(steady.from_step),
      static_cast<long long>(h.back().step), static_cast<long long>(steady.warmup_steps),
      steady.warmup_steps == 1 ? "" : "s", startup_text().c_str(), mean.samples_per_s, 100.0 * mean.data_wait_fraction,
      h.size());
  if (!compiled_step_.is_null()) std::printf("  compiled     %s\n", compiled_step_text().c_str());
  if (!micro_batch_choice_.is_null())  // trainer.micro_batch_size auto
    std::printf("  micro-batch  %lld x accumulation %lld (trainer.micro_batch_size auto: %s)\n",
                static_cast<long long>(cfg_.trainer.micro_batch_size),
                static_cast<long long>(cfg_.trainer.gradient_accumulation_steps),
                micro_batch_choice_.value("source", "") == "checkpoint" ? "the checkpoint's"
                                                                        : "chosen from probes of the GPU, see the log");
  if (vl_tokens > 0)
    std::printf("  padding      %.1f%% of the vision-language tokens (unused tokens of the %lld-token text slot%s)\n",
                100.0 * vl_padding_share, static_cast<long long>(net_->info().text_slot),
                cfg_.dmf.enable ? ", cut by DMF to each micro-batch's bucket" : "");
  if (summary.contains("dmf")) {
    std::string widths;
    for (const auto& [w, n] : dmf_shapes["micro_batches_by_width"].items())
      widths += (widths.empty() ? "" : ", ") + w + " (" + std::to_string(n.get<int64_t>()) + ")";
    std::printf("  DMF          text widths run (micro-batches): %s; %lld new shape(s), %.1f%% of micro-batches "
                "reused a shape already run (with CUDA graphs: a replay)\n",
                widths.c_str(), static_cast<long long>(dmf_shapes["new_shapes"].get<int64_t>()),
                100.0 * dmf_shapes["shape_reuse"].get<double>());
  }
  if (ds.samples_skipped > 0 || ds.videos_bad > 0)
    std::printf("  skipped      %lld sample(s) of %lld bad video(s) (data.on_bad_video=%s; the log names them)\n",
                static_cast<long long>(ds.samples_skipped), static_cast<long long>(ds.videos_bad),
                cfg_.data.on_bad_video.c_str());
  std::printf("  peak memory  %.0f MB host, %.0f MB device\n  checkpoint   %s\n  metrics      %s/metrics.jsonl\n"
              "  summary      %s/summary.json\n",
              mem.peak_host_mb, mem.peak_device_mb, last_ckpt_.c_str(), run_dir_.c_str(), run_dir_.c_str());
  if (status == kExitRequeue)
    std::printf("  stopped      by SIGUSR1 at step %lld of %lld: exit %d (requeue and --resume latest)\n",
                static_cast<long long>(s), static_cast<long long>(cfg_.trainer.max_steps), kExitRequeue);
}

// A libtorch error inside step `steps_done_ + 1`: name where it happened and
// what to change; keep the work when the state is intact; then stop.
void Trainer::Impl::fail_in_step(const std::exception& e, bool out_of_memory) {
  const auto& log = logger("trainer");
  const FailedPhase where = failed_phase();
  const std::string phase = where.name ? where.name : "step";
  const int64_t step = steps_done_ + 1;
  std::string msg = "step " + std::to_string(step) + ", phase " + phase +
                    (where.micro >= 0 ? " (micro-batch " + std::to_string(where.micro) + ")" : "") + " on rank " +
                    std::to_string(world_info_.rank) + " (" + device_.str() + "): " +
                    (out_of_memory ? "out of memory" : "libtorch error") + ": " + short_libtorch_message(e.what());
  const memory::Stats mem = memory::stats(device_);
  char figures[256];
  std::snprintf(figures, sizeof(figures),
                "\nMemory: %.0f MB in use, %.0f MB reserved, %.0f MB peak on the device (%s); %.0f MB peak on the host.",
                mem.device_in_use_mb, mem.device_reserved_mb, mem.peak_device_mb, mem.allocator.c_str(),
                mem.peak_host_mb);
  msg += figures;
  if (out_of_memory)
    msg += "\nTo fit: lower trainer.micro_batch_size (now " + std::to_string(cfg_.trainer.micro_batch_size) +
           ") and raise trainer.gradient_accumulation_steps (now " +
           std::to_string(cfg_.trainer.gradient_accumulation_steps) +
           ") to keep the global batch" + (bf16_ ? std::string(", or use a smaller model.")
                                                : std::string("; or use precision.mode=bf16, or a smaller model."));
  // The parameters and optimizer state are those after step - 1 as long as the
  // update has not started: keep them.
  msg += save_after_failure(phase != "optimizer");
  LF_LOG(log, error) << msg;
  control_->shutdown({{"stopped_at_step", steps_done_}, {"checkpoint", last_ckpt_}, {"error", msg}});
  throw TrainingError(msg);
}

// A DataError inside step `steps_done_ + 1` (a bad video with
// data.on_bad_video=error, a corrupt shard record): it comes while the step's
// batches are built, before any forward, so the state after the last good
// step is intact and saved before stopping.
void Trainer::Impl::fail_on_data(const DataError& e) {
  std::string msg = "step " + std::to_string(steps_done_ + 1) + " on rank " + std::to_string(world_info_.rank) +
                    ": " + e.what();
  msg += save_after_failure(/*intact=*/true);
  LF_LOG(logger("trainer"), error) << msg;
  control_->shutdown({{"stopped_at_step", steps_done_}, {"checkpoint", last_ckpt_}, {"error", msg}});
  throw DataError(msg);
}

// After a failure inside a step: with the state intact, a checkpoint of the
// last good step (rank 0; none when it is already saved or no step was taken
// by this process). Returns the sentence for the error message.
std::string Trainer::Impl::save_after_failure(bool intact) {
  // The fast path holds the last completed step's record until its values
  // are back: it goes out before the checkpoint (best effort: a failed
  // device cannot give it).
  if (readback_) {
    try {
      if (auto held = readback_->take_current(); held && held->record.step == steps_done_) {
        held->values();
        record_progress(complete(std::move(*held), Clock::now()));
      }
    } catch (const std::exception& ce) {
      LF_LOG(logger("trainer"), warn) << "step " << steps_done_ << "'s loss could not be read back: "
                                      << short_libtorch_message(ce.what());
    }
  }
  optimizer_->zero_grad();
  if (writer_) {  // a write started at the last boundary finishes first
    writer_->wait();
    collect_writes();
  }
  if (intact && (leader_ || optimizer_->sharded()) && !progress_->history().empty() && last_saved_step_ != steps_done_) {
    try {
      save(steps_done_);
      writer_->wait();
      collect_writes();
      return "\nThe state after step " + std::to_string(steps_done_) + " is saved: " + last_ckpt_ +
             " (resume with --resume latest).";
    } catch (const std::exception& ce) {
      return "\nThe final checkpoint could not be written either: " + std::string(ce.what());
    }
  }
  if (!last_ckpt_.empty())
    return "\nNewest checkpoint: " + last_ckpt_ + (intact ? "" : " (the failure hit the update: nothing newer is saved)");
  return "";
}

}  // namespace loongforge::trainer
