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
// Note [Gradient views]
// With `local` defined (ShardedOptions::gradient_views, the default), the
// sharded parameters' .grad tensors are views into one flat buffer laid out
// as above (world x chunk elements, the padding zero): autograd's
// AccumulateGrad adds each backward's gradient into the existing .grad in
// place, so backward writes straight into the flat space, as DDP's
// gradient_as_bucket_view does. The reducer then reads ranges of `local`
// instead of packing parameter by parameter (one copy per rank and unit
// instead of one per parameter piece), and at one rank `grad` IS `local`
// (the optimizer's range is everything): nothing is copied at all. A runner
// that replaces a .grad (the compiled runner's graph outputs) breaks the
// view for that step: the reducer copies such a gradient into `local` first
// (is_view_grad), and the optimizer's zero_grad() re-installs the views.
// Numbers: 0 + g is g, so the gradients are bitwise those of the copies.
//
// Example:
//   ShardLayout l = ShardLayout::make({1000, 8, 3000}, /*tiny_numel=*/16, /*world=*/2, /*rank=*/1);
//   // sharded = {0, 2}, replicated = {1}, total = 4000, chunk = 2000: rank 1 owns [2000, 4000)
#pragma once

#include <algorithm>  // std::min
#include <cstddef>  // size_t
#include <cstdint>  // int64_t
#include <memory>   // std::shared_ptr
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

#include "loongforge/comm/world.hpp"  // DeviceSpan

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
  // Note [Gradient views]: (world x chunk) fp32, this rank's own gradients of
  // the sharded parameters at their flat offsets, or undefined (the reducer
  // packs each parameter's .grad). At one rank the same tensor as `grad`.
  at::Tensor local;
  // The optimizer's all-gather of updated parameters, for monitor-comm
  // (Note [Gather overlap] in src/engines/gcts/sharded_adamw.cpp): bytes received
  // per step, the collectives it took, the time from the first launch to the
  // last completion, and the part of it the trainer waited for.
  double gather_bytes = 0, gather_ms = 0, gather_exposed_ms = 0;
  int64_t gather_calls = 0;
  bool gather_overlap = false;
  // NCCL: the last gather's pieces timed on the device (world.hpp, Note
  // [Collective timings on the device]); monitor-comm prefers them once done.
  std::vector<std::shared_ptr<const DeviceSpan>> gather_spans;  // launched in pieces during the update, completed before the next forward

  // Whether `g` (a sharded parameter's .grad; k its index in layout.sharded)
  // is its view into `local`, i.e. its values are there already.
  bool is_view_grad(size_t k, const at::Tensor& g) const;
  // Copies into `local` every sharded parameter's .grad in `params`
  // (optimizer order) that is not its view (Note [Gradient views]); an
  // undefined one leaves its zeros. No-op without `local`.
  void adopt_foreign_grads(const std::vector<at::Tensor>& params) const;
};

}  // namespace loongforge::comm
