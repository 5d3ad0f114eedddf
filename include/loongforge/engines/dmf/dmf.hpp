// loongforge/engines/dmf/dmf.hpp — DMF, dynamic micro-batch fusion: one of the
// four engines (docs/architecture.md). NOT IN THIS BUILD YET: this room holds
// its record and the factory the trainer builds its step runner through, so
// that packing lands here without touching the trainer.
//
// What it will guarantee (the DMF issue): the vision-language sequences of a
// micro-batch packed into one varlen sequence (no padding tokens), cameras
// kept at their aspect, micro-batches built by token budget across
// embodiments, shape buckets for CUDA graphs and compiled packages, and
// gradients equal to the unpacked computation; `loongforge debug-dmf`.
//
// Today:
//  - make_step_runner() returns the fast step's runner for `mode`
//    (fusion::make_step_runner: plain, CUDA graphs or the compiled package),
//    unchanged.
//  - engine() is DMF's record (common/engine.hpp): status "not in this build",
//    and the verb `debug-dmf`, which answers engine_off naming what brings it.
//  - Config: the `dmf` section of keys.def; any key set to a non-default value
//    is refused at load time (Note [Unbuilt engines] in src/config/validate.cpp).
//
// Example:
//   auto runner = dmf::make_step_runner(cfg, net, fusion::step_mode(cfg, net, device, bf16_autocast), bf16_autocast,
//                                       device);
#pragma once

#include <memory>  // std::unique_ptr

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::dmf {

constexpr bool kBuilt = false;  // the DMF engine is not in this build yet

std::unique_ptr<fusion::StepRunner> make_step_runner(const config::Config& cfg, model::Model& net,
                                                     const fusion::StepMode& mode, bool bf16_autocast,
                                                     c10::Device device);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::dmf
