// loongforge/data/batch.hpp — samples and micro-batches, exactly as
// docs/training-semantics.md sections 1-4 define them.
//
// Contract:
//  - Sampler: the order is a pure function of (seed, epoch, rank, world);
//    micro-batch m of a rank is the same on every run and after a resume.
//  - BatchBuilder::micro_batch(m) returns the model's batch (DESIGN.md s1
//    keys, CPU tensors) for global micro-batch m, including the flow-matching
//    draws fm_t / fm_noise, so both trainers compute the same numbers.
//  - Decoded, resized frames are cached per episode (LRU bounded by bytes);
//    a video is decoded sequentially once per cache miss, never per sample.
//  - Synchronous and single-threaded: the ADFE engine wraps it later.
//
// Example:
//   BatchBuilder builder(dataset, options);
//   model::Batch b = builder.micro_batch(step * accumulation + i);
#pragma once

#include <cstdint>  // int64_t, uint64_t
#include <list>     // std::list
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

#include "loongforge/data/dataset.hpp"

namespace loongforge::data {

using Batch = std::map<std::string, at::Tensor>;

// SplitMix64 Fisher-Yates permutation of [0, n) for an epoch (s2).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

class Sampler {
 public:
  Sampler(int64_t num_samples, uint64_t seed, bool shuffle, int64_t rank, int64_t world, int64_t micro_batch_size);
  int64_t micro_batches_per_epoch() const { return per_epoch_; }
  int64_t epoch_of(int64_t m) const { return m / per_epoch_; }
  // Sample ids of global micro-batch m of this rank.
  std::vector<int64_t> micro_batch(int64_t m);

 private:
  int64_t n_, rank_, world_, batch_, per_rank_, per_epoch_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> rank_order_;  // this rank's samples of cached_epoch_
};

struct SampleOptions {
  // From the trainer config (data.*, run.seed, trainer.micro_batch_size).
  int64_t action_horizon = 16;
  int64_t max_text_len = 32;
  int64_t embodiment_id = 0;
  std::string normalization = "min_max";  // or "mean_std" (training-semantics s3)
  bool shuffle = true;
  uint64_t seed = 42;
  int64_t micro_batch_size = 8;
  int64_t rank = 0, world = 1;
  // From the model (config.json).
  int64_t image_size = 64;
  int64_t num_views = 1;
  int64_t max_state_dim = 64;
  int64_t max_action_dim = 64;
  // Decoded-frame cache.
  int64_t frame_cache_mb = 2048;
};

struct DataStats {
  int64_t videos_decoded = 0;
  int64_t frames_decoded = 0;
  double decode_ms = 0;
};

class BatchBuilder {
 public:
  BatchBuilder(const Dataset& dataset, SampleOptions options);
  Batch micro_batch(int64_t m);
  const Sampler& sampler() const { return sampler_; }
  const DataStats& stats() const { return stats_; }

  // One sample without flow-matching draws (tests, inspection).
  Batch sample(int64_t sample_id);

 private:
  struct Location {
    size_t episode;
    int64_t row;
  };
  Location locate(int64_t sample_id) const;
  void fill(int64_t slot, int64_t sample_id, Batch& b);
  const at::Tensor& frames(size_t episode, int camera);  // (len, 3, S, S) float32

  const Dataset& ds_;
  SampleOptions opt_;
  Sampler sampler_;
  std::vector<int64_t> episode_start_;  // prefix sums of lengths
  int state_col_ = -1, action_col_ = -1, task_col_ = -1;
  std::vector<int> cameras_;            // used cameras, cameras[] order
  std::vector<int> frame_cols_;         // video_frame column per used camera
  // Normalization statistics: (min, max) or (mean, std) per value.
  std::vector<double> state_a_, state_b_, action_a_, action_b_;
  bool mean_std_ = false;
  // LRU of decoded episodes: key = episode * 1024 + camera.
  std::map<int64_t, at::Tensor> cache_;
  std::list<int64_t> lru_;
  int64_t cache_bytes_ = 0;
  DataStats stats_;
};

}  // namespace loongforge::data
