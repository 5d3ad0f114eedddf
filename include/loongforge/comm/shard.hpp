// loongforge/comm/shard.hpp — how a sharded optimizer splits its state over
// the ranks (ZeRO-1), shared by the reducer (which leaves each rank's
// averaged gradient shard here) and the optimizer (which updates that shard
// and all-gathers the parameters).
//
// Note [Flat shards]
// The trainable tensors larger than the tiny threshold (gcts.tiny_tensor_kb)
// are laid end to end in optimizer order: one flat index space of `total`
// elements, padded to world x chunk (chunk = ceil(total / world)). Rank r owns
// [r * chunk, min((r + 1) * chunk, total)): its fp32 AdamW moments, and the
// averaged gradient of that range after the reducer ran. A parameter may
// straddle two ranks; `segments` are the pieces of parameters inside this
// rank's range. Tiny tensors (biases, norms) are `replicated`: every rank
// holds their whole state and receives their whole averaged gradient, in one
// coalesced collective; their state is a few KB.
// The layout is a pure function of (parameter numels, tiny threshold, world
// size), so a checkpoint only records the parameters and the world size; a
// resume on another world size rebuilds every parameter's moments from the
// shards that cover it and takes its own range (exact: copies only).
//
// Example:
//   ShardLayout l = ShardLayout::make({1000, 8, 3000}, /*tiny_numel=*/16, /*world=*/2, /*rank=*/1);
//   // sharded = {0, 2}, replicated = {1}, total = 4000, chunk = 2000: rank 1 owns [2000, 4000)
#pragma once

#include <algorithm>  // std::min
#include <cstddef>  // size_t
#include <cstdint>  // int64_t
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

namespace loongforge::comm {

struct ShardLayout {
  struct Segment {
    size_t param = 0;          // index into the optimizer's parameters
    int64_t param_offset = 0;  // first element inside the parameter (flattened)
    int64_t shard_offset = 0;  // first element inside this rank's shard
    int64_t numel = 0;
  };
  std::vector<size_t> sharded;     // parameter indices, flat order
  std::vector<int64_t> offsets;    // flat offset of each sharded parameter
  std::vector<size_t> replicated;  // parameter indices of the tiny tensors
  std::vector<Segment> segments;   // this rank's pieces, in flat order
  int64_t total = 0, chunk = 0, world = 1, rank = 0;

  int64_t begin() const { return std::min(rank * chunk, total); }
  int64_t end() const { return std::min((rank + 1) * chunk, total); }
  int64_t owned() const { return end() - begin(); }
  // The range [begin, end) that `r` owns under this layout.
  int64_t begin_of(int64_t r) const { return std::min(r * chunk, total); }
  int64_t end_of(int64_t r) const { return std::min((r + 1) * chunk, total); }

  static ShardLayout make(const std::vector<int64_t>& numels, int64_t tiny_numel, int64_t world, int64_t rank);
};

// What the reducer fills for a sharded optimizer (Note [Flat shards]).
struct ShardTarget {
  ShardLayout layout;
  at::Tensor grad;  // (chunk) fp32 on the parameters' device; [0, owned) is this rank's averaged gradient
  // The optimizer's all-gather of updated parameters, for monitor-comm
  // (Note [Gather overlap] in src/trainer/sharded_adamw.cpp): bytes received
  // per step, the collectives it took, the time from the first launch to the
  // last completion, and the part of it the trainer waited for.
  double gather_bytes = 0, gather_ms = 0, gather_exposed_ms = 0;
  int64_t gather_calls = 0;
  bool gather_overlap = false;  // launched in pieces during the update, completed before the next forward
};

}  // namespace loongforge::comm
