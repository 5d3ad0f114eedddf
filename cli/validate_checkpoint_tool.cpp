// loongforge-validate-checkpoint: the libtorch side of `loongforge
// validate-checkpoint DIR [--model FILE] [--json]` (the `loongforge` client
// itself links no libtorch and runs this program; see verb_validate_checkpoint.cpp):
// offline integrity (every file's size and SHA-256 against MANIFEST.json),
// completeness, and compatibility with a model file. Exit 0 when valid, 1 not.
#include <iostream>  // std::cout

#include <CLI/CLI.hpp>        // CLI::App
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/model/model.hpp"
#include "validate_checkpoint_options.hpp"

namespace loongforge::cli {

namespace {
ValidateCheckpointOptions g_opt;
}  // namespace

int validate_checkpoint_tool_run() {
  const checkpoint::Report report = checkpoint::validate_checkpoint(g_opt.dir);
  std::vector<std::string> problems = report.problems, notes;
  if (report.ok() && !g_opt.model.empty()) {
    try {
      const model::Model net = model::Model::load(g_opt.model, c10::kCPU);
      std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
      for (const auto& p : net.info().params) shapes.emplace_back(p.name, p.shape);
      for (const auto& d : checkpoint::compare_parameters(g_opt.dir, shapes)) problems.push_back("model: " + d);
      if (problems.empty())
        notes.push_back("compatible with " + g_opt.model + " (" + std::to_string(shapes.size()) +
                        " parameters, names and shapes match)");
    } catch (const Error& e) {
      problems.push_back(std::string("model: ") + e.what());
    }
  }
  uint64_t bytes = 0;
  for (const auto& [rel, f] : report.manifest.files) bytes += f.bytes;
  if (g_opt.json) {
    nlohmann::json j = {{"dir", g_opt.dir}, {"valid", problems.empty()}, {"problems", problems}, {"notes", notes}};
    if (report.manifest.step || !report.manifest.files.empty()) j["manifest"] = report.manifest.to_json();
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << "checkpoint " << g_opt.dir << "\n";
    if (!report.manifest.files.empty())
      std::cout << "  step " << report.manifest.step << ", epoch " << report.manifest.epoch << ", world size "
                << report.manifest.world_size << ", run " << report.manifest.run_id << "\n  "
                << report.manifest.files.size() << " files, " << bytes / 1e6 << " MB"
                << (!report.ok()                ? ""
                    : report.manifest.verified ? ", every SHA-256 matches the manifest"
                                               : ", every CRC-32 matches the manifest (an unverified preemption save: "
                                                 "the next training start records its SHA-256s)")
                << "\n";
    for (const auto& n : notes) std::cout << "  " << n << "\n";
    for (const auto& p : problems) std::cout << "  PROBLEM: " << p << "\n";
    std::cout << (problems.empty() ? "VALID" : "INVALID: do not resume from this checkpoint") << "\n";
  }
  return problems.empty() ? 0 : 1;
}

}  // namespace loongforge::cli

int main(int argc, char** argv) {
  CLI::App app{"loongforge-validate-checkpoint: check a checkpoint offline (run through `loongforge validate-checkpoint`)"};
  loongforge::cli::g_opt.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return loongforge::cli::validate_checkpoint_tool_run();
}
