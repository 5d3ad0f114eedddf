// Running an offline verb's libtorch program (offline_tool.hpp).
#include "offline_tool.hpp"

#include <limits.h>  // PATH_MAX
#include <unistd.h>  // execv, readlink

#include <cerrno>    // errno
#include <cstring>   // std::strerror
#include <iostream>  // std::cerr

#include "client.hpp"  // kExitFailed

namespace loongforge::cli {

namespace {
std::string own_folder() {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}
}  // namespace

int exec_offline_tool(const std::string& program, const std::vector<std::string>& args, const std::string& verb) {
  const std::string tool = own_folder() + "/" + program;
  std::vector<std::string> all = args;
  all.insert(all.begin(), tool);
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(tool.c_str(), argv.data());
  std::cerr << "loongforge " << verb << ": cannot run " << tool << ": " << std::strerror(errno)
            << " (it is built and installed next to loongforge)\n";
  return kExitFailed;
}

}  // namespace loongforge::cli
