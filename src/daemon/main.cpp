// loongforge-train: wires the rooms together; no logic lives here.
#include <iostream>  // std::cout, std::cerr

#include <CLI/CLI.hpp>  // CLI::App

#include "loongforge/comm/world_info.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/version.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/trainer/run.hpp"
#include "loongforge/trainer/trainer.hpp"

int main(int argc, char** argv) {
  CLI::App app{"loongforge-train: train a GR00T-N1.6-style model exported to TorchScript"};
  std::string config_path;
  std::vector<std::string> overrides;
  std::string resume;
  bool print_config = false, show_version = false, compile_only = false;
  app.add_option("--config", config_path, "YAML config (see configs/n16.yaml for every key)");
  app.add_option("--set", overrides, "Override a key: --set section.key=value (repeatable)");
  app.add_option("--resume", resume,
                 "Resume: 'latest' (newest intact checkpoint of this run; a fresh start when it has none, an error when all are damaged) or a "
                 "checkpoint directory; same as --set checkpoint.resume=...");
  app.add_flag("--print-config", print_config, "Print the effective config with help for every key, then exit");
  app.add_flag("--compile-only", compile_only,
               "Prepare the compiled step's package for this config (model, micro-batch, precision, device) in "
               "trainer.compile_cache, print its path and exit; a second call finds it there (a Slurm prolog, a CI "
               "job). Reads no data");
  app.add_flag("--version", show_version, "Print the version and exit");
  CLI11_PARSE(app, argc, argv);

  if (show_version) {
    std::cout << "loongforge-train " << loongforge::version_string() << "\n";
    return 0;
  }
  if (!resume.empty()) overrides.push_back("checkpoint.resume=" + resume);
  try {
    loongforge::config::ValidationContext ctx;
    const loongforge::comm::WorldInfo world = loongforge::comm::world_from_env();
    ctx.world_size = world.world_size;
    ctx.require_paths = !print_config && !compile_only;  // --compile-only reads the model file only
    ctx.built_engines = loongforge::trainer::built_engines();
    if (config_path.empty() && !print_config) {
      std::cerr << "loongforge-train: --config is required (try --config configs/n16-tiny.yaml; "
                   "--print-config lists every key)\n";
      return 2;
    }
    const auto cfg = config_path.empty() ? loongforge::config::default_config(overrides, ctx)
                                         : loongforge::config::load_config(config_path, overrides, ctx);
    if (print_config) {
      std::cout << loongforge::config::print_config(cfg);
      return 0;
    }
    loongforge::set_log_level(cfg.run.log_level);
    if (compile_only) return loongforge::trainer::compile_only(cfg, world);
    return loongforge::trainer::run(cfg, world);
  } catch (const loongforge::Error& e) {
    std::cerr << "loongforge-train: " << e.code() << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {  // libtorch (c10::Error) and the standard library
    std::string what = e.what();
    if (const auto cut = what.find("\nException raised from"); cut != std::string::npos) what.resize(cut);
    std::cerr << "loongforge-train: unexpected error: " << what
              << "\n(please report it with the command line and the log above)\n";
    return 1;
  }
}
