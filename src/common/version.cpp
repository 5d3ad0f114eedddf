// Build identity; the values come from CMake (src/common/CMakeLists.txt).
#include "loongforge/common/version.hpp"

namespace loongforge {

const char* version_number() { return LOONGFORGE_VERSION; }

std::string version_string() {
  return std::string(LOONGFORGE_VERSION) + " (git " + LOONGFORGE_GIT_SHA + ", libtorch " +
         LOONGFORGE_TORCH_VERSION + ", CUDA kernels " + (LOONGFORGE_WITH_CUDA_KERNELS ? "on" : "off") + ")";
}

}  // namespace loongforge
