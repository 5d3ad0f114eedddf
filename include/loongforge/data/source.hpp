// loongforge/data/source.hpp — the data seam of the trainer: where the
// micro-batches of a step come from, ready on the device. Two implementations:
// the plain one (decode and build on the trainer thread) and ADFE's
// asynchronous one (adfe.enable; docs/architecture.md s4), which yields the
// same bits.
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
//  - engine() is ADFE's record (common/engine.hpp).
//
// ADFE (make_async_source; Note [ADFE] in src/data/async_source.cpp):
//  - Threads: one producer builds micro-batches in the trainer's order
//    (BatchBuilder::micro_batch, the same code as the plain source) into a
//    queue of at most prefetch_factor ready micro-batches, and asks a pool of
//    decode_threads threads to decode the videos of the micro-batches up to
//    prefetch_factor ahead of the one it builds (BatchBuilder::prefetch). The
//    producer and the decoders run at a lower CPU priority than the trainer
//    thread and above the checkpoint writer (common/threads.hpp).
//  - Level 0: io_threads threads (0: none) have the kernel read the video
//    files of the micro-batches up to 2 x prefetch_factor ahead into the page
//    cache (BatchBuilder::readahead), at the decoders' priority; counted in
//    stats() as readahead_files / readahead_bytes. They change no bit.
//  - Same bits: micro-batch (s, i) is BatchBuilder::micro_batch(s, i)
//    whatever the thread count and timing (Note [Frame cache] in batch.cpp).
//  - Errors: an exception building micro-batch (s, i) (a bad video with
//    on_bad_video=error, with the plain source's message) is raised by
//    next(s, i), not before; nothing after it is built.
//  - Position: the producer starts at the first next(s, i) (a resumed run's
//    first step) and restarts if calls ever skip; it may build micro-batches
//    past the last step (never handed out).
//  - On a CUDA device: each micro-batch is packed into one of prefetch_factor
//    pinned host slots of adfe.slot_mb (a ConfigError at construction when a
//    micro-batch does not fit, naming the key and the size needed) and
//    copied to the device on a separate copy stream by the producer; next()
//    makes the caller's current stream wait for that copy (an event) and
//    records the tensors' use on it. On the CPU the tensors are handed over.
//  - Destruction stops and joins every thread (a decode in flight finishes
//    first: at most one video per thread).
//
// Example:
//   auto source = make_sync_source(dataset, options, device, tokens_per_view);
//   ReadyBatch b = source->next(step, 0);   // b.tensors on the device, b.num_valid
//   auto adfe = make_async_source(dataset, options, device, tokens_per_view, {4, 2, 64.0});
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/data/batch.hpp"

namespace loongforge::data {

constexpr bool kAdfeBuilt = true;

// Every source's last step before handing a micro-batch out: uint8 images (frames resized on
// the device, SampleOptions::frames_on_device) become the model's float images where they are,
// on the current stream (frames.hpp model_images); float images are left as they are.
void finish_images(Batch& tensors, int64_t image_size, const std::vector<int64_t>& blank_slots);

struct ReadyBatch {
  Batch tensors;              // the model's batch, on the device
  int64_t num_valid = 0;      // valid action elements (the loss is averaged over them)
  int64_t tokens = 0;         // text + action + image tokens (throughput metrics)
  std::vector<int64_t> embodiments;  // the distinct embodiment ids in the batch, sorted (known on the host)
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual ReadyBatch next(int64_t step, int64_t micro, PhaseRecorder& phases) = 0;
  virtual const Sampler& sampler() const = 0;
  virtual DataStats stats() const = 0;
};

struct AsyncOptions {
  int64_t prefetch_factor = 4;  // adfe.prefetch_factor: ready micro-batches (and pinned slots)
  int64_t decode_threads = 2;   // adfe.decode_threads
  double slot_mb = 64.0;        // adfe.slot_mb: one pinned slot (CUDA devices)
  int64_t io_threads = 1;       // adfe.io_threads: readahead threads (level 0); 0 = none
};

// The plain source: builds each micro-batch on the calling thread, then
// copies it to `device`. tokens_per_view: image tokens one camera view adds.
std::unique_ptr<BatchSource> make_sync_source(const Dataset& dataset, const SampleOptions& options,
                                              c10::Device device, int64_t tokens_per_view);

// ADFE's source (adfe.enable). Throws ConfigError when a micro-batch does not
// fit in adfe.slot_mb on a CUDA device.
std::unique_ptr<BatchSource> make_async_source(const Dataset& dataset, const SampleOptions& options,
                                               c10::Device device, int64_t tokens_per_view, AsyncOptions async);

// The ConfigError text when a micro-batch of `options` does not fit in a slot
// of `slot_mb` ("" when it fits).
std::string slot_size_problem(const SampleOptions& options, double slot_mb);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::data
