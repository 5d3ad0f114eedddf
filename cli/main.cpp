// `loongforge`: the operator's client for running trainers. Builds its
// subcommands from the verb table (verbs.hpp) and dispatches to one.
#include <iostream>  // std::cout, std::cerr

#include <CLI/CLI.hpp>  // CLI::App

#include "loongforge/common/version.hpp"
#include "verbs.hpp"

int main(int argc, char** argv) {
  using loongforge::cli::verbs;
  CLI::App app{"loongforge: talk to running loongforge-train processes over their control socket"};
  app.footer(
      "Target: --pid P, --socket PATH, or the only trainer in this environment's socket directory.\n"
      "Exit codes: 0 ok, 1 the trainer answered with an error, 2 usage, 3 engine off/not built,\n"
      "            4 no trainer (or several: pick --pid), 5 permission denied, 6 version mismatch,\n"
      "            7 busy or no answer within --timeout.");
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the version and exit");
  app.require_subcommand(0, 1);

  std::string selected;
  for (const auto& verb : verbs()) {
    CLI::App* sub = app.add_subcommand(verb.name, verb.help);
    verb.add_options(*sub);
    sub->callback([&selected, name = verb.name] { selected = name; });
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is success; every usage error exits 2
  }

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
    return verb.run();
  }
  return 2;
}
