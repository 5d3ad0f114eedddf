// cli/offline_tool.hpp — running an offline verb's libtorch program. The
// `loongforge` client links no libtorch (it would cost every `loongforge status`
// 0.4 s and 470 MB), so a verb that needs it (validate-checkpoint,
// validate-dataset) replaces itself with a program of its own installed next to
// `loongforge`, passing the options on.
#pragma once

#include <string>  // std::string
#include <vector>  // std::vector

namespace loongforge::cli {

// execv()s <folder of this executable>/<program> with `args`; returns only when
// that fails (after saying why on stderr), with kExitFailed.
int exec_offline_tool(const std::string& program, const std::vector<std::string>& args, const std::string& verb);

}  // namespace loongforge::cli
