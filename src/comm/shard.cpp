// The flat shard layout (Note [Flat shards] in shard.hpp).
#include "loongforge/comm/shard.hpp"

#include <algorithm>  // std::max, std::min

#include <ATen/ATen.h>  // at::Tensor::copy_

namespace loongforge::comm {

ShardLayout ShardLayout::make(const std::vector<int64_t>& numels, int64_t tiny_numel, int64_t world, int64_t rank) {
  ShardLayout l;
  l.world = std::max<int64_t>(1, world);
  l.rank = rank;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] <= tiny_numel) {
      l.replicated.push_back(i);
      continue;
    }
    l.sharded.push_back(i);
    l.offsets.push_back(l.total);
    l.total += numels[i];
  }
  l.chunk = (l.total + l.world - 1) / l.world;
  const int64_t b = l.begin(), e = l.end();
  for (size_t k = 0; k < l.sharded.size(); ++k) {
    const int64_t p0 = l.offsets[k], p1 = p0 + numels[l.sharded[k]];
    const int64_t s0 = std::max(p0, b), s1 = std::min(p1, e);
    if (s0 >= s1) continue;
    l.segments.push_back(Segment{l.sharded[k], s0 - p0, s0 - b, s1 - s0});
  }
  return l;
}

bool ShardTarget::is_view_grad(size_t k, const at::Tensor& g) const {
  return local.defined() && g.defined() &&
         g.data_ptr() == static_cast<void*>(local.data_ptr<float>() + layout.offsets[k]);
}

void ShardTarget::adopt_foreign_grads(const std::vector<at::Tensor>& params) const {
  if (!local.defined()) return;
  for (size_t k = 0; k < layout.sharded.size(); ++k) {
    const at::Tensor& g = params[layout.sharded[k]].grad();
    if (!g.defined() || is_view_grad(k, g)) continue;
    local.narrow(0, layout.offsets[k], g.numel()).copy_(g.reshape({-1}));
  }
}

}  // namespace loongforge::comm
