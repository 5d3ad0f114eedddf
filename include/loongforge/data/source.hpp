// loongforge/data/source.hpp — the data seam of the trainer: where the
// micro-batches of a step come from, ready on the device. ADFE (docs/architecture.md s4)
// replaces the plain implementation here; nothing else changes.
//
// Contract:
//  - next(step, i) returns micro-batch i (0..K-1) of optimizer step `step`
//    (0-based) of this rank, exactly the samples and draws that
//    docs/training-semantics.md s2-s4 define, its tensors on the device.
//  - Its metadata (valid action elements, tokens) is host integers counted
//    while the batch was built: the trainer never reads a tensor for them.
//  - Calls come in order (step, 0..K-1), step after step; a source may work
//    ahead. A source is owned and called by the trainer thread.
//  - Phases "data_wait" (until the batch is ready on the host) and "h2d" go
//    to the PhaseRecorder.
//  - engine() is ADFE's record (common/engine.hpp).
//
// Example:
//   auto source = make_sync_source(dataset, options, device, tokens_per_view);
//   ReadyBatch b = source->next(step, 0);   // b.tensors on the device, b.num_valid
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/data/batch.hpp"

namespace loongforge::data {

constexpr bool kAdfeBuilt = false;  // the ADFE engine is not in this build yet

struct ReadyBatch {
  Batch tensors;              // the model's batch, on the device
  int64_t num_valid = 0;      // valid action elements (the loss is averaged over them)
  int64_t tokens = 0;         // text + action + image tokens (throughput metrics)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual ReadyBatch next(int64_t step, int64_t micro, PhaseRecorder& phases) = 0;
  virtual const Sampler& sampler() const = 0;
  virtual const DataStats& stats() const = 0;
};

// The plain source: builds each micro-batch on the calling thread, then
// copies it to `device`. tokens_per_view: image tokens one camera view adds.
std::unique_ptr<BatchSource> make_sync_source(const Dataset& dataset, const SampleOptions& options,
                                              c10::Device device, int64_t tokens_per_view);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::data
