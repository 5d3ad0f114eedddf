// loongforge/engines/mla/mla.hpp — MLA, the memory lifecycle arranger: one of
// the four engines (docs/architecture.md). NOT IN THIS BUILD YET: this room
// holds its record and the call the trainer makes through the memory seam,
// so that the allocator lands here without touching the trainer.
//
// What it will guarantee (the MLA issue): a persistent arena for what lives
// the whole run, an activation pool per captured graph or compiled step,
// stream-ordered reuse, no cudaMalloc after step 1, and an out-of-memory error
// that names what to change; statistics through `loongforge mla-stats`.
//
// Today:
//  - install() runs once per process before the first CUDA allocation (the
//    trainer calls it first in open()). MLA is not built, so it changes
//    nothing: PyTorch's CUDA caching allocator serves the device, and
//    memory::stats() (memory/memory.hpp) reads its counters.
//  - engine() is MLA's record (common/engine.hpp): status "not in this build",
//    and the verb `mla-stats`, which answers engine_off naming what brings it.
//  - Config: the `mla` section of keys.def; any key set to a non-default value
//    is refused at load time (Note [Unbuilt engines] in src/config/validate.cpp).
//
// Example:
//   mla::install(cfg, device);   // before the model loads
#pragma once

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::mla {

constexpr bool kBuilt = false;  // the MLA engine is not in this build yet

void install(const config::Config& cfg, c10::Device device);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::mla
