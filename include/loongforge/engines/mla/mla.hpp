// loongforge/engines/mla/mla.hpp — MLA, the memory lifecycle arranger: one of
// the four engines (docs/architecture.md). It implements the memory seam
// (memory/memory.hpp): with mla.enable it replaces PyTorch's CUDA caching
// allocator with pools arranged by what allocations live for.
//
// What works and what is not yet verified (docs/mla.md):
//  - The pool logic (pool.hpp: size classes, best fit, coalescing,
//    stream-ordered reuse, statistics) is host code, property-tested on the
//    CPU against a brute-force model (test/engines/mla/test_mla_pool.cpp).
//  - The out-of-memory message (oom.hpp) is unit-tested on the CPU.
//  - The device allocator (src/engines/mla/device_allocator.cpp, Note [MLA's
//    device pools]) compiles and its GPU tests exist (label gpu) but it has
//    NOT RUN ON A GPU yet: mla.enable defaults to false.
//
// What it guarantees once on (the MLA issue, #47): a persistent arena for
// what the trainer allocates while it loads the model and builds the
// optimizer; a pool per CUDA graph capture; everything else pooled; a block
// freed on one stream reused on another only after an event says its work
// is done; an out-of-memory error naming the request, the pool, its largest
// free block, the persistent bytes and the keys that would make it fit.
// What it needs: a CUDA device, and install() before the first CUDA
// allocation of the process (libtorch refuses to swap an allocator in use).
// Config: the `mla` section of keys.def (enable, persistent_gb,
// global_pool_gb, segment_mb, virtual_memory, fallback_cudamalloc). With mla.enable=false
// install() warns about each of those keys set to a non-default value (Note
// [Keys of an engine that is off] in src/config/validate.cpp) and installs
// nothing. mla.enable=true on a CPU run is a ConfigError (MLA manages CUDA
// memory only), and so it is in a binary built without CUDA kernels (which
// has no device allocator; the section and verb are the same in every build).
// Verbs: `loongforge mla-stats` (the allocator's statistics: every pool,
// bytes by category, fragmentation, cudaMalloc calls after step 1, allocation
// time per step p50/p99); `status` shows the same under engines.mla, and
// metrics.jsonl gets memory/mla_* fields.
// Threads: the allocator's callbacks run on any thread that allocates (a
// mutex serialises them); mla-stats reads under the same mutex.
//
// Example:
//   mla::install(cfg, device);   // first in Trainer::open, before the model loads
#pragma once

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"

namespace loongforge::mla {

// Installs MLA's allocator when mla.enable (a CUDA device); else warns about
// the section's non-default keys. Throws ConfigError for mla.enable on the
// CPU, and when an arena (mla.persistent_gb, mla.global_pool_gb) cannot be
// reserved.
void install(const config::Config& cfg, c10::Device device);

// MLA's record: built; enabled with mla.enable; its status and mla-stats
// answer from the allocator install() put in place.
Engine engine(const config::Config& cfg);

}  // namespace loongforge::mla
