// cli/validate_checkpoint_options.hpp — the options of `loongforge
// validate-checkpoint`, declared once for both programs that parse them: the
// `loongforge` verb (which forwards them) and loongforge-validate-checkpoint
// (which does the libtorch work).
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>  // CLI::App

namespace loongforge::cli {

struct ValidateCheckpointOptions {
  std::string dir, model;
  bool json = false;

  void add_to(CLI::App& app) {
    app.add_option("dir", dir, "Checkpoint directory (…/checkpoints/epoch_E_step_S)")->required();
    app.add_option("--model", model, "Also check compatibility with this exported model file");
    app.add_flag("--json", json, "Print the report as JSON");
  }
  // The same options as arguments, for forwarding.
  std::vector<std::string> to_args() const {
    std::vector<std::string> args = {dir};
    if (!model.empty()) args.insert(args.end(), {"--model", model});
    if (json) args.push_back("--json");
    return args;
  }
};

}  // namespace loongforge::cli
