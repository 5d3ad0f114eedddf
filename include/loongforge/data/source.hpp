// loongforge/data/source.hpp — the data seam of the trainer: where the
// micro-batches of a step come from, ready on the device. The plain
// implementation (decode and build on the trainer thread) is here; ADFE's
// asynchronous one (include/loongforge/engines/adfe/adfe.hpp) yields the same
// bits.
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
//  - stats() counts the batches handed out so far (skips, bad videos) and
//    the decode work done so far (which ADFE does ahead of the trainer).
//  - status() is what `loongforge status` shows of the source under "data"
//    besides stats(): which source it is, and its settings.
//
// Example:
//   auto source = make_sync_source(dataset, options, device, tokens_per_view);
//   ReadyBatch b = source->next(step, 0);   // b.tensors on the device, b.num_valid
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

#include <c10/core/Device.h>  // c10::Device
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/phases.hpp"
#include "loongforge/data/batch.hpp"

namespace loongforge::data {

// Every source's last step before handing a micro-batch out: uint8 images (frames resized on
// the device, SampleOptions::frames_on_device) become the model's float images where they are,
// on the current stream (frames.hpp model_images; pad_square: SampleOptions::image_aspect is pad);
// float images are left as they are.
void finish_images(Batch& tensors, int64_t image_size, const std::vector<int64_t>& blank_slots,
                   bool pad_square = false);

struct ReadyBatch {
  Batch tensors;              // the model's batch, on the device
  int64_t num_valid = 0;      // valid action elements (the loss is averaged over them)
  int64_t tokens = 0;         // text + action + image tokens (throughput metrics)
  int64_t text_tokens = 0;    // real text tokens (== sum of text_mask): the rest of the text slots is padding
  int64_t text_len_max = 0;   // the longest sample's real text tokens (known on the host)
  std::vector<int64_t> embodiments;  // the distinct embodiment ids in the batch, sorted (known on the host)
  uint64_t draw_seed = 0;     // the seed of the draws inside the model's forward (fusion::draw_seed; the trainer sets it)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual ReadyBatch next(int64_t step, int64_t micro, PhaseRecorder& phases) = 0;
  virtual const Sampler& sampler() const = 0;
  virtual DataStats stats() const = 0;
  virtual nlohmann::json status() const { return {{"source", "sync"}}; }
};

// The plain source: builds each micro-batch on the calling thread, then
// copies it to `device`. tokens_per_view: image tokens one camera view adds.
// A mixture's parts (mixture.hpp), or one dataset in slot options.embodiment_id.
std::unique_ptr<BatchSource> make_sync_source(const std::vector<DataPart>& parts, const SampleOptions& options,
                                              c10::Device device, int64_t tokens_per_view);
std::unique_ptr<BatchSource> make_sync_source(const Dataset& dataset, const SampleOptions& options,
                                              c10::Device device, int64_t tokens_per_view);

}  // namespace loongforge::data
