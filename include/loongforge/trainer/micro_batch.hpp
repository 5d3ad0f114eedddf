// loongforge/trainer/micro_batch.hpp — trainer.micro_batch_size: auto, the
// choosing: which micro-batch sizes keep the global batch, and the largest of
// them that fits the device, from a few measured forward+backward passes.
//
// Contract:
//  - candidates(): every micro-batch B dividing global_batch / world_size
//    (so the accumulation K = G / (B x W) is an integer) within the keys'
//    ranges (B <= max_micro_batch, K <= max_accumulation), largest first.
//  - choose_micro_batch(): the largest candidate whose measured peak, plus
//    what the run allocates later and the probe does not (`later`, each term
//    a fixed part plus a part per sample of the micro-batch, evaluated at the
//    candidate), stays under the capacity less the headroom. It fits peak(B) = a + b x B from
//    two small probes, takes the largest candidate predicted to fit, confirms
//    it with one real probe, and steps down on an out-of-memory probe or a
//    measured peak over the budget (Note [Choosing the micro-batch] in
//    src/trainer/micro_batch.cpp). Every probe is recorded in order.
//  - Pure: no device, no libtorch; the memory comes from `probe` (the
//    trainer's runs the model's TorchScript forward+backward on a synthetic
//    batch: Trainer::Impl::choose_micro_batch), so tests drive it with fakes.
//  - Throws ConfigError naming the numbers and the keys to change when no
//    candidate exists or none fits.
//  - data_terms(): the data source's device memory as `later` terms, from
//    numbers (Note [The data's device memory] in
//    src/trainer/trainer_micro_batch.cpp says what they count and why).
//  - Memory is in bytes; the texts print GB = 2^30 bytes (gb_text).
//
// Example:
//   MicroBatchInput in;
//   in.global_batch = 384, in.world_size = 1, in.capacity_bytes = 79.1 * kGiB;
//   in.later = {{"optimizer moments", 9.6 * kGiB},
//               {"ADFE's ready micro-batches (prefetch_factor 4 + 1)", 0, 5 * 61e3}};  // 5 x 61 kB per sample
//   MicroBatchChoice c = choose_micro_batch(in, [&](int64_t b) { return run_probe(b); });
//   LF_LOG(logger("trainer"), info) << c.text(in);
#pragma once

#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::trainer {

// The fraction of the device's capacity no choice may use (Note [Micro-batch headroom]).
inline constexpr double kMicroBatchHeadroom = 0.10;
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// What one probe at a micro-batch measured.
struct ProbeResult {
  bool out_of_memory = false;
  double peak_bytes = 0;  // the device memory the allocator held at its peak (unset when out_of_memory)
};
using Probe = std::function<ProbeResult(int64_t micro_batch)>;

// An estimated amount the run allocates after the probe and the probe does not: a fixed part, and a
// part per sample of the micro-batch (what the data source holds ahead grows with B). A term is
// evaluated at each candidate it is compared for; the texts give it at the chosen micro-batch.
struct MemoryTerm {
  std::string name;             // "optimizer moments", "ADFE's ready micro-batches (prefetch_factor 4 + 1)"
  double bytes = 0;             // the fixed part
  double per_sample_bytes = 0;  // and this much per sample of the micro-batch
  double at(int64_t micro_batch) const { return bytes + per_sample_bytes * static_cast<double>(micro_batch); }
};

// The sum of `terms` at a micro-batch of `micro_batch` samples.
double later_at(const std::vector<MemoryTerm>& terms, int64_t micro_batch);

// What the data source holds on the device while a step runs, in numbers (Note [The data's device
// memory] in src/trainer/trainer_micro_batch.cpp).
struct DataMemory {
  int64_t step_samples = 0;     // G / W: the step's micro-batches, which the trainer holds together
  double sample_bytes = 0;      // one sample as the model takes it (after finish_images: float images)
  bool adfe = false;            // ADFE's source on a CUDA device (else the plain one)
  int64_t prefetch_factor = 0;  // adfe.prefetch_factor: ADFE's queue of ready micro-batches
  double frame_bytes = 0;       // one sample's uint8 camera frames before the device resize (0: on the CPU)
};

// The terms: "the step's micro-batches" (step_samples x sample_bytes, fixed); with ADFE also "ADFE's
// ready micro-batches (prefetch_factor P + 1)" ((P + 1) x sample_bytes per sample) and, when frames are
// resized on the device, "frames before the device resize" (frame_bytes per sample).
std::vector<MemoryTerm> data_terms(const DataMemory& data);

struct MicroBatchInput {
  int64_t global_batch = 0;  // trainer.global_batch_size
  int64_t world_size = 1;
  int64_t max_micro_batch = 65536;   // trainer.micro_batch_size's range, or less (then `limit` says why)
  std::string limit;                 // "" or why max_micro_batch is below the key's range (named in the text)
  int64_t max_accumulation = 65536;  // trainer.gradient_accumulation_steps's range
  double capacity_bytes = 0;         // what this process may hold on the device
  double headroom = kMicroBatchHeadroom;
  std::vector<MemoryTerm> later;
};

struct ProbeRecord {
  int64_t micro_batch = 0;
  std::string purpose;  // "fit" (the two small probes) or "confirm"
  ProbeResult result;
};

struct MicroBatchChoice {
  int64_t micro_batch = 0, accumulation = 0;
  std::vector<int64_t> candidates;  // largest first
  std::vector<ProbeRecord> probes;  // in the order they ran
  bool fitted = false;              // a + b x B from two measured sizes (else proportional to one)
  double intercept_bytes = 0, per_sample_bytes = 0;
  double later_bytes = 0;           // the input's `later` at the chosen micro-batch
  double budget_bytes = 0;          // capacity x (1 - headroom)
  double predicted_bytes = 0;       // the chosen size's prediction (the probe line + later at its size)
  double confirmed_bytes = 0;       // its confirmation probe's peak + later at its size
  // The next larger candidate, not taken (0: the chosen is the largest), and why: its prediction, or its probe.
  int64_t larger = 0;
  double larger_predicted_bytes = 0;
  const ProbeRecord* larger_probe() const;  // nullptr: it was never probed

  // "96 of candidates 384, 192, ... (global batch 384 = 96 x accumulation 4 x 1 rank); predicted peak ..."
  std::string text(const MicroBatchInput& in) const;
  nlohmann::json to_json(const MicroBatchInput& in) const;
};

std::vector<int64_t> candidates(int64_t global_batch, int64_t world_size, int64_t max_micro_batch = 65536,
                                int64_t max_accumulation = 65536);

MicroBatchChoice choose_micro_batch(const MicroBatchInput& in, const Probe& probe);

// Several ranks: each rank's choice as gathered in rank order ("96"), or its
// failure ("!" + message). Returns the smallest choice, which every rank
// trains with (each is a candidate of the same list, so the smallest is one
// too, and it fits every rank's device); throws ConfigError naming the first
// rank that failed and its message.
int64_t agree_on_smallest(const std::vector<std::string>& per_rank);

// "12.1 GB" (GB = 2^30 bytes); "310 MB" below 1 GB (MB = 2^20 bytes).
std::string gb_text(double bytes);

}  // namespace loongforge::trainer
