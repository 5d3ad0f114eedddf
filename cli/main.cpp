// `loongforge`: the operator's client for running trainers. Builds its
// subcommands from the verb table (verbs.hpp) and dispatches to one.
#include <iostream>  // std::cout, std::cerr

#include <CLI/CLI.hpp>  // CLI::App

#include "loongforge/common/version.hpp"
#include "verbs.hpp"

int main(int argc, char** argv) {
  using loongforge::cli::verbs;
  CLI::App app{"loongforge: talk to running loongforge-train processes over their control socket"};
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  app.require_subcommand(0, 1);

  std::string selected;
  for (const auto& verb : verbs()) {
    CLI::App* sub = app.add_subcommand(verb.name, verb.help + (verb.lands_with.empty() ? "" : " [not available yet]"));
    sub->allow_extras();  // options of verbs that have not landed are accepted and ignored
    if (verb.add_options) verb.add_options(*sub);
    sub->callback([&selected, name = verb.name] { selected = name; });
  }
  CLI11_PARSE(app, argc, argv);

  if (show_version) {
    std::cout << "loongforge " << loongforge::version_string() << "\n";
    return 0;
  }
  if (selected.empty()) {
    std::cerr << app.help();
    return 2;
  }
  for (const auto& verb : verbs()) {
    if (verb.name != selected) continue;
    if (!verb.lands_with.empty() || !verb.run) {
      std::cerr << "loongforge " << verb.name << ": not available in this build yet; it arrives with "
                << verb.lands_with << ".\n";
      return loongforge::cli::kExitNotAvailable;
    }
    return verb.run();
  }
  return 2;
}
