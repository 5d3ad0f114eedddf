// cli/validate_dataset_options.hpp — the options of `loongforge validate-dataset`,
// declared once for both programs that parse them: the `loongforge` verb (which
// forwards them) and loongforge-validate-dataset (which does the work with the
// data room, a libtorch library).
#pragma once

#include <cstdint>  // int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <CLI/CLI.hpp>  // CLI::App

namespace loongforge::cli {

struct ValidateDatasetOptions {
  std::string dir;
  bool full = false, json = false;
  int64_t spans = 3;
  double progress_s = 5.0;

  void add_to(CLI::App& app) {
    app.add_option("dir", dir, "Dataset folder written by scripts/convert_lerobot.py")->required();
    app.add_flag("--full", full, "Decode every frame of every video (default: a few keyframe spans per video)");
    app.add_option("--spans", spans, "Keyframe spans decoded per video without --full: the first, the last and "
                                     "ones evenly between")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app.add_option("--progress-s", progress_s, "Print a progress line to stderr every this many seconds "
                                               "(0: after every episode)")
        ->check(CLI::Range(0.0, 1e9));
    app.add_flag("--json", json, "Print the report as JSON");
  }
  // The same options as arguments, for forwarding.
  std::vector<std::string> to_args() const {
    std::vector<std::string> args = {dir, "--spans", std::to_string(spans), "--progress-s", std::to_string(progress_s)};
    if (full) args.push_back("--full");
    if (json) args.push_back("--json");
    return args;
  }
};

}  // namespace loongforge::cli
