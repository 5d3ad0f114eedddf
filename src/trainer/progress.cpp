// Progress line, metrics.jsonl and duration formatting.
#include "loongforge/trainer/progress.hpp"

#include <unistd.h>  // isatty

#include <algorithm>  // std::nth_element, std::min, std::max
#include <cmath>      // std::ceil
#include <cstdio>    // std::printf, std::fflush
#include <iomanip>   // std::setprecision
#include <fstream>   // std::ifstream
#include <sstream>   // std::ostringstream

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/log.hpp"

namespace loongforge::trainer {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

// Note [Steady state]
// The first steps of a run pay once for what later steps do not: the model's
// first kernels and autotuning, CUDA-graph capture (after 3 eager calls), the
// compiled package's load, the first decode of every video with cold caches.
// A mean over the whole run counts them with the rest (a 3B run's 24 s first
// step made a 127 samples/s run report 29.7), so every speed LoongForge prints
// is the steady state's: the records after a warm-up of 10% of them, at least
// the first one and at most 50, and the median of those (robust to a
// checkpoint or an evaluation stall). The data-wait share is the window's
// summed wait over its summed step time. The whole-run mean is still given,
// labelled as such, and the time to the first step separately.
namespace {
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) m = (m + *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid))) / 2;
  return m;
}
}  // namespace

SteadyState steady_state(const std::vector<StepRecord>& history) {
  SteadyState s;
  const auto n = static_cast<int64_t>(history.size());
  if (n == 0) return s;
  s.warmup_steps = n == 1 ? 0 : std::min<int64_t>({50, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(0.1 * n))), n - 1});
  std::vector<double> sps, ms, mfu;
  double wait = 0, total = 0;
  for (int64_t i = s.warmup_steps; i < n; ++i) {
    const StepRecord& r = history[static_cast<size_t>(i)];
    sps.push_back(r.samples_per_s), ms.push_back(r.step_ms), mfu.push_back(r.mfu);
    wait += r.data_wait_ms, total += r.step_ms;
  }
  s.from_step = history[static_cast<size_t>(s.warmup_steps)].step;
  s.steps = n - s.warmup_steps;
  s.samples_per_s = median(sps), s.step_ms = median(ms), s.mfu = median(mfu);
  s.data_wait_fraction = total > 0 ? wait / total : 0;
  return s;
}

WholeRunMean whole_run_mean(const std::vector<StepRecord>& history, int64_t samples_per_step) {
  WholeRunMean m;
  double wait = 0, total = 0;
  for (const auto& r : history) wait += r.data_wait_ms, total += r.step_ms;
  if (total <= 0) return m;
  m.samples_per_s = static_cast<double>(history.size()) * static_cast<double>(samples_per_step) / (total / 1000.0);
  m.data_wait_fraction = wait / total;
  return m;
}

std::vector<std::pair<std::string, double>> scalars_of(const StepRecord& r) {
  std::vector<std::pair<std::string, double>> s = {{"train/loss", r.loss},
          {"train/lr", r.lr},
          {"train/grad_norm", r.grad_norm},
          {"train/num_valid", r.num_valid},
          {"perf/samples_per_s", r.samples_per_s},
          {"perf/tokens_per_s", r.tokens_per_s},
          {"perf/mfu", r.mfu},
          {"perf/step_ms", r.step_ms},
          {"perf/data_wait_ms", r.data_wait_ms},
          {"perf/exposed_comm_ms", r.exposed_comm_ms},
          {"memory/peak_mem_mb", r.peak_mem_mb},
          {"checkpoint/checkpoint_stall_ms", r.checkpoint_stall_ms},
          {"data/samples_skipped", r.samples_skipped},
          {"data/videos_bad", r.videos_bad},
          {"data/queue_depth", r.data_queue_depth},
          {"data/decoded_frames_per_s", r.decoded_frames_per_s},
          {"data/read_mb_per_s", r.read_mb_per_s},
          {"data/h2d_mb_per_s", r.h2d_mb_per_s},
          {"data/decode_jobs", r.decode_jobs},
          {"data/io_jobs", r.io_jobs},
          {"data/readahead_mb_per_s", r.readahead_mb_per_s},
          {"data/vl_tokens", r.vl_tokens},
          {"data/vl_padding_tokens", r.vl_padding_tokens},
          {"data/text_width", r.text_width},
          {"data/embodiments", r.embodiments}};
  for (const auto& [name, value] : r.memory_scalars) s.emplace_back("memory/" + name, value);
  for (const auto& [name, value] : r.engine_scalars) s.emplace_back("engines/" + name, value);
  return s;
}

Progress::Progress(std::string mode, int64_t interval_steps, int64_t total_steps, const std::string& metrics_path,
                   int64_t start_step, const std::string& tensorboard_dir)
    : interval_(interval_steps), total_(total_steps), start_(start_step), t0_(std::chrono::steady_clock::now()) {
  off_ = mode == "off";
  bar_ = mode == "bar" || (mode == "auto" && isatty(STDOUT_FILENO));
  if (!tensorboard_dir.empty()) tb_ = std::make_unique<TensorBoardWriter>(tensorboard_dir);
  if (metrics_path.empty()) return;
  std::string kept;
  if (start_step > 0) {
    std::ifstream old(metrics_path);
    std::string line;
    while (std::getline(old, line)) {
      try {
        if (!line.empty() && nlohmann::json::parse(line).at("step").get<int64_t>() <= start_step) kept += line + "\n";
      } catch (const std::exception&) {
        // a line cut short by a crash: dropped
      }
    }
  }
  // The kept records go to a temporary file renamed over the old one, so a
  // crash at any moment leaves either the old or the new file, never a
  // truncated one.
  {
    std::ofstream tmp(metrics_path + ".tmp", std::ios::out | std::ios::trunc);
    tmp << kept;
    tmp.flush();
    if (!tmp) throw Error("cannot write metrics file '" + metrics_path + ".tmp': check run.output_dir");
  }
  rename_path(metrics_path + ".tmp", metrics_path);
  metrics_.open(metrics_path, std::ios::out | std::ios::app);
  if (!metrics_) throw Error("cannot write metrics file '" + metrics_path + "': check run.output_dir");
}

double Progress::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Progress::record(const StepRecord& r) {
  history_.push_back(r);
  const auto scalars = scalars_of(r);
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", r.step}};
    for (const auto& [tag, value] : scalars) j[tag.substr(tag.find('/') + 1)] = value;
    metrics_ << j.dump() << '\n';
    metrics_.flush();
  }
  if (tb_) {
    try {
      tb_->add_scalars(r.step, scalars);
    } catch (const Error& e) {  // disk full and the like: training matters more than plots
      LF_LOG(logger("trainer"), warn) << e.what() << "; TensorBoard output stops, training continues";
      tb_.reset();
    }
  }
  if (off_) return;
  const bool shown = bar_ || r.step % interval_ == 0 || r.step == total_ || r.step == start_ + 1;
  if (!shown) return;
  const double elapsed = elapsed_s();
  // The steady pace (Note [Steady state]) over the last records, for the display and the ETA.
  const size_t recent = std::min<size_t>(history_.size(), 200);
  const SteadyState steady =
      steady_state(std::vector<StepRecord>(history_.end() - static_cast<std::ptrdiff_t>(recent), history_.end()));
  const double eta = steady.step_ms / 1000.0 * static_cast<double>(total_ - r.step);
  std::ostringstream line;
  line << "step " << r.step << "/" << total_ << "  loss " << std::setprecision(5) << r.loss << "  lr "
       << std::setprecision(3) << r.lr << "  " << std::fixed << std::setprecision(1) << r.samples_per_s
       << " samples/s";
  if (steady.steps > 1)
    line << " (median " << steady.samples_per_s << ", data wait " << 100.0 * steady.data_wait_fraction << "%)";
  line << "  data " << r.data_wait_ms << " ms  elapsed " << format_duration(elapsed) << "  ETA "
       << format_duration(eta);
  if (bar_) {
    const int width = 24;
    const int filled = static_cast<int>(width * r.step / std::max<int64_t>(1, total_));
    std::printf("\r[%s%s] %s\033[K", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(),
                line.str().c_str());
    std::fflush(stdout);
  } else {
    std::printf("%s\n", line.str().c_str());
    std::fflush(stdout);
  }
}

void Progress::event(const nlohmann::json& e) {
  if (metrics_.is_open()) metrics_ << e.dump() << "\n" << std::flush;
}

void Progress::finish() {
  if (bar_ && !off_) std::printf("\n");
  std::fflush(stdout);
}

}  // namespace loongforge::trainer
