// loongforge/common/version.hpp — build identity printed by --version and
// written into run directories and checkpoints.
#pragma once

#include <string>  // std::string

namespace loongforge {

// "0.1.0 (git abc1234, libtorch 2.11.0, CUDA kernels on)"
std::string version_string();
// Semantic version only: "0.1.0".
const char* version_number();

}  // namespace loongforge
