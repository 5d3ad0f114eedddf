// loongforge/engines/adfe/adfe.hpp — ADFE, the asynchronous data flow
// engine: one of the four engines (docs/architecture.md). It implements the
// data seam (data/source.hpp): the trainer's micro-batches built ahead of it
// by threads, ready on the device when the step asks. make_source() is the
// factory the trainer builds its source through, ADFE on or off.
//
// What it guarantees: the same bits as the plain source (micro-batch (s, i)
// is BatchBuilder::micro_batch(s, i) whatever the thread count and timing),
// the same errors at the same micro-batch, and a data wait that is the time
// the trainer really waited (phase "data_wait").
// What it needs: the dataset and the sample options the plain source takes;
// on a CUDA device, pinned host memory (prefetch_factor slots of slot_mb).
// Config: the `adfe` section of keys.def (enable, prefetch_factor,
// decode_threads, io_threads, slot_mb). resolve() turns enable=auto (the
// default: true on CUDA runs) and decode_threads=0 (the default: the CPUs this
// process may use, per local rank, less two) into what the run does, before
// the engines are recorded. With adfe.enable=false make_source()
// builds the plain source and warns about each of these keys set to a
// non-default value (Note [Keys of an engine that is off] in
// src/config/validate.cpp).
// Verbs: none of its own; `loongforge status` shows its queue, decode and
// read-ahead counters under "data" (BatchSource::status and stats).
//
// The asynchronous source (make_async_source; Note [ADFE] in
// src/engines/adfe/async_source.cpp):
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
//    micro-batch does not fit, naming the key and the size needed:
//    staged_bytes) and copied to the device on a separate copy stream by the
//    producer, which also resizes uint8 frames there (finish_images); next()
//    makes the caller's current stream wait for that copy (an event) and
//    records the tensors' use on it. On the CPU the tensors are handed over.
//  - Device memory (CUDA): the micro-batches are allocated on the copy
//    stream, so the caching allocator keeps their blocks for that stream.
//    Live at once: the prefetch_factor micro-batches of the queue, one staged
//    micro-batch waiting for room in it, and the ones the trainer has taken
//    and not dropped (a step's, G / W samples); while one is resized, its
//    uint8 frames besides (Note [The data's device memory] in
//    src/trainer/trainer_micro_batch.cpp).
//  - Destruction stops and joins every thread (a decode in flight finishes
//    first: at most one video per thread).
//
// Example:
//   auto source = adfe::make_source(cfg, dataset, options, device, tokens_per_view);  // plain when adfe.enable=false
//   data::ReadyBatch b = source->next(step, 0, phases);
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/data/source.hpp"

namespace loongforge::adfe {

constexpr bool kBuilt = true;

struct AsyncOptions {
  int64_t prefetch_factor = 4;  // adfe.prefetch_factor: ready micro-batches (and pinned slots)
  int64_t decode_threads = 2;   // adfe.decode_threads
  double slot_mb = 64.0;        // adfe.slot_mb: one pinned slot (CUDA devices)
  int64_t io_threads = 1;       // adfe.io_threads: readahead threads (level 0); 0 = none
};

// Resolves the section's automatic values in `cfg` for a run on `device`:
// adfe.enable auto -> "true" on CUDA, "false" on the CPU; adfe.decode_threads
// 0 -> default_decode_threads(). Returns what it chose, for the log ("" when
// nothing was automatic).
std::string resolve(config::Config& cfg, c10::Device device);

// The CPUs this process may run on (sched_getaffinity), divided by
// LOCAL_WORLD_SIZE when set (torchrun's ranks of a node share them), less two
// (the trainer thread and the batch-building thread), at least one.
int64_t default_decode_threads();

// adfe.enable after resolve() ("true"; "auto" counts as off before it).
bool enabled(const config::Config& cfg);

// The data seam as the config says: ADFE's source when adfe.enable (its
// options from the adfe section), else data::make_sync_source.
std::unique_ptr<data::BatchSource> make_source(const config::Config& cfg, const std::vector<data::DataPart>& parts,
                                               const data::SampleOptions& options, c10::Device device,
                                               int64_t tokens_per_view);

// ADFE's source (adfe.enable). Throws ConfigError when a micro-batch does not
// fit in adfe.slot_mb on a CUDA device.
// One dataset (in slot options.embodiment_id), or a mixture's parts (data/mixture.hpp).
std::unique_ptr<data::BatchSource> make_async_source(const data::Dataset& dataset, const data::SampleOptions& options,
                                                     c10::Device device, int64_t tokens_per_view, AsyncOptions async);
std::unique_ptr<data::BatchSource> make_async_source(const std::vector<data::DataPart>& parts,
                                                     const data::SampleOptions& options, c10::Device device,
                                                     int64_t tokens_per_view, AsyncOptions async);

// The ConfigError text when a micro-batch of `options` does not fit in a slot
// of `slot_mb` ("" when it fits).
std::string slot_size_problem(const data::SampleOptions& options, double slot_mb);

// Bytes one micro-batch of `micro_batch` samples of `options` (its
// micro_batch_size replaced) takes in a pinned slot as ADFE stages it: the
// tensors of data::micro_batch_spec, with frames_on_device uint8 camera
// frames at their cropped size (not the model's float images), each tensor's
// start aligned. What slot_size_problem compares with adfe.slot_mb.
int64_t staged_bytes(const data::SampleOptions& options, int64_t micro_batch);

// The largest micro-batch whose staged_bytes fit a slot of `slot_mb` MB (2^20
// bytes); 0 when not even one sample does. trainer.micro_batch_size auto's cap
// (Note [ADFE's slot caps auto] in src/trainer/trainer_micro_batch.cpp).
int64_t largest_micro_batch_in_slot(const data::SampleOptions& options, double slot_mb);

Engine engine(const config::Config& cfg);


}  // namespace loongforge::adfe
