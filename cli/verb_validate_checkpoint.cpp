// `loongforge validate-checkpoint DIR [--model FILE] [--json]`: offline
// integrity, completeness and compatibility with a model file. Checking
// needs libtorch, which the `loongforge` client does not link (it would cost
// every `loongforge status` 0.4 s and 470 MB): this verb runs
// loongforge-validate-checkpoint from the same folder with the same options.
#include <limits.h>  // PATH_MAX
#include <unistd.h>  // execv, readlink, access

#include <cerrno>    // errno
#include <cstring>   // std::strerror
#include <iostream>  // std::cerr
#include <vector>    // std::vector

#include <CLI/CLI.hpp>  // CLI::App

#include "client.hpp"
#include "validate_checkpoint_options.hpp"
#include "verbs.hpp"

namespace loongforge::cli {

namespace {
ValidateCheckpointOptions g_opt;

std::string own_folder() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}
}  // namespace

void validate_checkpoint_options(CLI::App& app) { g_opt.add_to(app); }

int validate_checkpoint_run() {
  const std::string tool = own_folder() + "/loongforge-validate-checkpoint";
  std::vector<std::string> args = g_opt.to_args();
  args.insert(args.begin(), tool);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(tool.c_str(), argv.data());
  std::cerr << "loongforge validate-checkpoint: cannot run " << tool << ": " << std::strerror(errno)
            << " (it is built and installed next to loongforge)\n";
  return kExitFailed;
}

}  // namespace loongforge::cli
