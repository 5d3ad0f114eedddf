// DMF's record and its step-runner factory (dmf.hpp). DMF is not built: the
// fast step's runner runs unchanged.
#include "loongforge/engines/dmf/dmf.hpp"

namespace loongforge::dmf {

std::unique_ptr<fusion::StepRunner> make_step_runner(const config::Config& cfg, model::Model& net,
                                                     const fusion::StepMode& mode, bool bf16_autocast,
                                                     c10::Device device) {
  return fusion::make_step_runner(cfg, net, mode, bf16_autocast, device);  // kBuilt is false: no fusion
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "dmf";
  e.title = "DMF";
  e.what = "dynamic micro-batch fusion";
  e.arrives_with = "the DMF issue";
  e.built = kBuilt;
  e.enabled = kBuilt && cfg.dmf.enable;
  e.verbs.push_back(EngineVerb{"debug-dmf", false, nullptr, nullptr});
  return e;
}

}  // namespace loongforge::dmf
