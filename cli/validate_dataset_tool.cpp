// loongforge-validate-dataset: the libtorch side of `loongforge validate-dataset
// PATH [--full] [--spans N] [--progress-s S] [--json]` (the `loongforge` client
// itself links no libtorch and runs this program; see verb_validate_dataset.cpp):
// the checks of data::validate_dataset (include/loongforge/data/check.hpp) on a
// folder written by scripts/convert_lerobot.py. Exit 0 when valid, 1 not, 2 usage
// (as validate-checkpoint).
#include <chrono>    // std::chrono::steady_clock
#include <cstdio>    // std::snprintf
#include <iostream>  // std::cout, std::cerr

#include <CLI/CLI.hpp>        // CLI::App
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/data/check.hpp"
#include "validate_dataset_options.hpp"

namespace loongforge::cli {

namespace {
ValidateDatasetOptions g_opt;

std::string megabytes(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}
}  // namespace

int validate_dataset_tool_run() {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last = t0;
  bool printed = false;
  data::CheckOptions opt;
  opt.full = g_opt.full;
  opt.sample_spans = g_opt.spans;
  opt.progress = [&](const data::CheckProgress& p) {  // a line every --progress-s seconds, on stderr
    const auto now = Clock::now();
    const double since = std::chrono::duration<double>(now - last).count();
    const bool done = p.episodes_done == p.episodes;
    if (done ? !printed : since < g_opt.progress_s) return;
    last = now;
    printed = true;
    char line[256];
    std::snprintf(line, sizeof line, "validate-dataset: %lld/%lld episodes, %lld/%lld videos (%s of %s), %.1f s",
                  static_cast<long long>(p.episodes_done), static_cast<long long>(p.episodes),
                  static_cast<long long>(p.videos_done), static_cast<long long>(p.videos),
                  megabytes(p.video_bytes_done).c_str(), megabytes(p.video_bytes).c_str(),
                  std::chrono::duration<double>(now - t0).count());
    std::cerr << line << std::endl;
  };
  const data::DatasetReport r = data::validate_dataset(g_opt.dir, opt);
  const std::string decoded = g_opt.full ? "every frame decoded (" + std::to_string(r.frames_decoded) + ")"
                                         : std::to_string(r.frames_decoded) + " frames decoded (up to " +
                                               std::to_string(g_opt.spans) +
                                               " keyframe spans per video; --full decodes every frame)";
  if (g_opt.json) {
    nlohmann::json j = {{"dir", r.dir},           {"valid", r.ok()},        {"problems", r.problems},
                        {"episodes", r.episodes}, {"rows", r.rows},         {"shards", r.shards},
                        {"shard_bytes", r.shard_bytes}, {"cameras", r.cameras}, {"videos", r.videos},
                        {"video_bytes", r.video_bytes}, {"frames_decoded", r.frames_decoded}, {"full", g_opt.full}};
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "dataset " << r.dir << "\n";
    if (r.opened)
      std::cout << "  " << r.episodes << " episodes, " << r.rows << " rows, " << r.shards << " shard(s) "
                << megabytes(r.shard_bytes) << ", " << r.videos << " videos " << megabytes(r.video_bytes) << " ("
                << r.cameras << " camera(s))\n  index, shards, record checksums, timestamps and frame counts "
                << (r.ok() ? "check out" : "checked") << "; every video's size and SHA-256 "
                << (r.ok() ? "match" : "checked") << "; " << decoded << "\n";
    for (const auto& p : r.problems) std::cout << "  PROBLEM: " << p << "\n";
    std::cout << (r.ok() ? "VALID" : "INVALID: do not train on this dataset as it is") << "\n";
  }
  return r.ok() ? 0 : 1;
}

}  // namespace loongforge::cli

int main(int argc, char** argv) {
  CLI::App app{"loongforge-validate-dataset: check a converted dataset offline (run through `loongforge "
               "validate-dataset`)"};
  loongforge::cli::g_opt.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return loongforge::cli::validate_dataset_tool_run();
}
