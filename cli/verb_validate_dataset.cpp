// `loongforge validate-dataset PATH [--full] [--spans N] [--progress-s S] [--json]`:
// check a converted dataset before a long run (data::validate_dataset,
// include/loongforge/data/check.hpp). The data room needs libtorch, which the
// `loongforge` client does not link: this verb runs loongforge-validate-dataset
// from the same folder with the same options (offline_tool.hpp).
#include <CLI/CLI.hpp>  // CLI::App

#include "offline_tool.hpp"
#include "validate_dataset_options.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
ValidateDatasetOptions g_opt;
}  // namespace

void validate_dataset_options(CLI::App& app) { g_opt.add_to(app); }

int validate_dataset_run() {
  return exec_offline_tool("loongforge-validate-dataset", g_opt.to_args(), "validate-dataset");
}

}  // namespace loongforge::cli
