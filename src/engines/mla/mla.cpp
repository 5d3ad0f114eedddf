// MLA's record and its call through the memory seam (mla.hpp). MLA is not
// built: install() leaves PyTorch's caching allocator in charge.
#include "loongforge/engines/mla/mla.hpp"

namespace loongforge::mla {

void install(const config::Config& cfg, c10::Device device) {
  (void)cfg, (void)device;  // kBuilt is false: nothing to install
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "mla";
  e.title = "MLA";
  e.what = "memory lifecycle arranger (pooled CUDA allocator)";
  e.arrives_with = "the MLA issue";
  e.built = kBuilt;
  e.enabled = kBuilt && cfg.mla.enable;
  e.verbs.push_back(EngineVerb{"mla-stats", /*query=*/true, nullptr, nullptr});
  return e;
}

}  // namespace loongforge::mla
