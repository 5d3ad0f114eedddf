// loongforge/trainer/progress.hpp — what a run shows and records: the
// progress line (bar on a terminal, plain lines otherwise), metrics.jsonl (one
// record per optimizer step), TensorBoard scalars (the same values) and the
// end-of-run summary.
//
// Contract: owned by the trainer thread; every metrics line is flushed as
// written so a crash loses nothing already reported. The speed it reports
// (progress line, ETA, the summary through steady_state()) is the steady
// state's, never a mean that includes the first steps (Note [Steady state]
// in progress.cpp).
#pragma once

#include <nlohmann/json.hpp>  // nlohmann::json

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // int64_t
#include <fstream>  // std::ofstream
#include <string>   // std::string
#include <memory>   // std::unique_ptr
#include <utility>  // std::pair
#include <vector>   // std::vector

#include "loongforge/trainer/tensorboard.hpp"

namespace loongforge::trainer {

struct StepRecord {
  int64_t step = 0;  // 1-based: the number of optimizer steps done
  double loss = 0, lr = 0, grad_norm = 0, num_valid = 0;
  double samples_per_s = 0, tokens_per_s = 0, mfu = 0;
  double data_wait_ms = 0, step_ms = 0, peak_mem_mb = 0;
  double checkpoint_stall_ms = 0;  // snapshot copy + waiting for the previous write
  // Communication the step waited for outside the optimizer: gradient reduction after backward, the
  // loss sum, and (gcts.overlap) a sharded optimizer's all-gathers still in flight at the forward.
  // Host time on CPUs; on GPUs the compute stream's time in those calls, timed on the device
  // (Note [Exposed communication on the device] in readback.cpp).
  double exposed_comm_ms = 0;
  int64_t tokens = 0;              // tokens of the step (tokens_per_s = tokens / step time)
  // This rank's vision-language tokens of the step (samples x the model's S_vl, with each micro-batch's
  // text slot as it ran: DMF cuts it) and how many of them are padding (the text slots' unused tokens);
  // 0 for a model file without S_vl.
  double vl_tokens = 0, vl_padding_tokens = 0;
  double embodiments = 0;  // distinct embodiment slots in this rank's micro-batches of the step (a mixture: several)
  double text_width = 0;  // the widest text slot among the step's micro-batches (DMF's width; else data.max_text_len)
  double flops = 0;  // the model FLOPs of this rank's step (flops.json, each micro-batch at its text width): MFU
  double samples_skipped = 0;      // this rank's samples skipped for a bad video so far (data.on_bad_video=skip)
  double videos_bad = 0;           // this rank's videos found bad so far
  double data_queue_depth = 0;     // ADFE: micro-batches ready when the step took its last one (0 off ADFE)
  double decoded_frames_per_s = 0; // frames this rank decoded since the previous step's end, per second
  double read_mb_per_s = 0;        // video MB (2^20 bytes) this rank read since the previous step's end, per second
  double h2d_mb_per_s = 0;         // MB the data source copied to the device since the previous step's end, per second
  double decode_jobs = 0;          // ADFE: videos (or spans) waiting for a decode thread at the step's end
  double io_jobs = 0;              // ADFE: videos (or spans) waiting for an I/O thread at the step's end (level 0)
  double readahead_mb_per_s = 0;  // ADFE: video MB its I/O threads read ahead since the previous step's end, per second
  // The allocator's own fields (memory::Stats::scalars; MLA: mla_fragmentation, ...), after the others.
  std::vector<std::pair<std::string, double>> memory_scalars;
  std::vector<std::pair<std::string, double>> engine_scalars;  // the step runner's (DMF's shape counts)
};

// The scalars of a record, by their TensorBoard tag (also the metrics.jsonl
// key after the slash): one list so that the two outputs always agree.
std::vector<std::pair<std::string, double>> scalars_of(const StepRecord& r);

// The steady state of a run (Note [Steady state] in progress.cpp): the
// records after the warm-up, with their medians and data-wait share.
struct SteadyState {
  int64_t from_step = 0;          // first step of the window (0: no record)
  int64_t steps = 0;              // records in the window
  int64_t warmup_steps = 0;       // records left out before it
  double samples_per_s = 0;       // median over the window
  double step_ms = 0;             // median over the window
  double mfu = 0;                 // median over the window
  double data_wait_fraction = 0;  // sum of data_wait_ms / sum of step_ms over the window
};
SteadyState steady_state(const std::vector<StepRecord>& history);

// The mean over every record, warm-up included: samples / time, data wait / time.
struct WholeRunMean {
  double samples_per_s = 0, data_wait_fraction = 0;
};
WholeRunMean whole_run_mean(const std::vector<StepRecord>& history, int64_t samples_per_step);

class Progress {
 public:
  // mode: "auto" | "bar" | "lines" | "off"; metrics_path "" disables metrics,
  // tensorboard_dir "" disables TensorBoard.
  // start_step > 0 (a resumed run): metrics records after start_step are
  // dropped (the steps are about to be redone) and new ones appended.
  Progress(std::string mode, int64_t interval_steps, int64_t total_steps, const std::string& metrics_path,
           int64_t start_step = 0, const std::string& tensorboard_dir = "");
  void record(const StepRecord& r);
  void finish();  // ends the bar line
  // A line {"event": ...} in metrics.jsonl between the step records (a regroup after a lost rank).
  void event(const nlohmann::json& e);
  // Seconds since construction.
  double elapsed_s() const;
  const std::vector<StepRecord>& history() const { return history_; }

 private:
  bool bar_ = false, off_ = false;
  int64_t interval_, total_, start_;
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> tb_;
  std::chrono::steady_clock::time_point t0_;
  std::vector<StepRecord> history_;
};

std::string format_duration(double seconds);  // "1:02:03" / "4:05"

}  // namespace loongforge::trainer
