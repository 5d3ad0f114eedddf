// `loongforge validate-checkpoint DIR [--model FILE] [--json]`: offline
// integrity, completeness and compatibility with a model file. Checking
// needs libtorch, which the `loongforge` client does not link: this verb runs
// loongforge-validate-checkpoint from the same folder with the same options
// (offline_tool.hpp).
#include <CLI/CLI.hpp>  // CLI::App

#include "offline_tool.hpp"
#include "validate_checkpoint_options.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
ValidateCheckpointOptions g_opt;
}  // namespace

void validate_checkpoint_options(CLI::App& app) { g_opt.add_to(app); }

int validate_checkpoint_run() {
  return exec_offline_tool("loongforge-validate-checkpoint", g_opt.to_args(), "validate-checkpoint");
}

}  // namespace loongforge::cli
