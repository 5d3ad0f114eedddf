// loongforge/engines/mla/oom.hpp — MLA's out-of-memory message: what was
// asked, what the pool holds and has free, what the persistent arena holds,
// and the config keys that would make the run fit. Host code (no CUDA, no
// libtorch): the device allocator fills an OomReport when a request cannot be
// served and throws with explain_out_of_memory()'s text; the unit test checks
// the text for given numbers.
//
// Contract:
//  - explain_out_of_memory() only formats: it never allocates device memory
//    and never throws.
//  - The keys it proposes exist in keys.def: trainer.micro_batch_size with
//    trainer.gradient_accumulation_steps (the global batch kept), precision.mode
//    (bf16 when the run is fp32), mla.global_pool_gb (when the refusing pool is
//    a fixed size and the device still has room) and mla.fallback_cudamalloc.
//    No exported model has activation checkpointing (scripts/model/), so no
//    such key is proposed.
//  - The micro-batch it proposes assumes activation memory grows linearly
//    with the micro-batch (it says so): the largest divisor of the samples per
//    rank per optimizer step whose estimated activations fit.
//
// Example:
//   mla::OomReport r;  r.request_bytes = n;  r.pool_name = "activation pool";  r.pool = pool.stats(); ...
//   throw c10::OutOfMemoryError(..., mla::explain_out_of_memory(r));
#pragma once

#include <array>     // std::array
#include <cstdint>   // uint64_t, int64_t
#include <optional>  // std::optional
#include <string>    // std::string
#include <utility>   // std::pair
#include <vector>    // std::vector

#include "loongforge/engines/mla/pool.hpp"

namespace loongforge::mla {

struct OomReport {
  uint64_t request_bytes = 0;
  Category category = Category::kOther;  // the request's
  std::string pool_name;                 // "activation pool"
  PoolStats pool;                        // the pool that refused
  bool pool_fixed = false;               // its size is set (mla.global_pool_gb), it does not grow
  // Bytes in use by category over every pool of the allocator.
  std::array<uint64_t, kCategoryCount> in_use_by_category{};
  // What the persistent arena holds, by what the trainer labelled it
  // ("weights", "optimizer state", ...); empty when nothing was labelled.
  std::vector<std::pair<std::string, uint64_t>> persistent_by_label;
  std::optional<uint64_t> device_free_bytes;  // cudaMemGetInfo, when known
  std::optional<uint64_t> device_total_bytes;
  // The run's keys.
  int64_t micro_batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  std::string precision_mode = "bf16";  // after resolution: "fp32" or "bf16"
  double global_pool_gb = 0;
  bool fallback_cudamalloc = false;
};

// "1.50 GiB", "512.0 MiB", "4.0 KiB", "100 B".
std::string format_bytes(uint64_t bytes);

// The message (several sentences, one line), starting "MLA: out of memory".
std::string explain_out_of_memory(const OomReport& r);

// The micro-batch size explain_out_of_memory() proposes (0 when none fits,
// or the micro-batch is already 1).
int64_t proposed_micro_batch(const OomReport& r);

}  // namespace loongforge::mla
