// GCTS's plan: which gradients go into which collective, in which order
// (plan.hpp).
//
// Note [GCTS strategies]
// Gradients are packed into flat buffers of gcts.reduce_dtype, summed, then
// divided by the world size in fp32: with fp32 and two ranks every element is
// (a + b) / 2 whatever the bucket, so the strategies (and overlap on or off)
// agree bit for bit; with more ranks only the collective's summation order
// differs.
//  - simple: parameters in reverse definition order (DDP's), cut into
//    buckets of gcts.bucket_mb (the first, holding the last parameters, of
//    gcts.first_bucket_mb), all-reduced; with a sharded optimizer each rank
//    keeps its range of the result.
//  - hybrid: (1) tensors up to gcts.tiny_tensor_kb in one coalesced
//    all-reduce (latency-bound: one call instead of dozens); (2) unsharded,
//    with gcts.sparse_embodiment: per-embodiment parameters (dim 0 = slot)
//    reduce only the slot rows that hold a non-zero gradient on some rank
//    (one small all-reduce of the row masks, then the selected rows in one
//    coalesced all-reduce); rows zero on every rank average to zero, which
//    they already are; (3) the rest in buckets of backward-readiness order,
//    the first bucket small; all-reduced, or with a sharded optimizer
//    reduce-scattered straight into each rank's shard (Note [Flat shards]):
//    unit k is the k-th slice of every rank's range, so rank r receives slice
//    k of its own range.
// With a sharded optimizer the shard layout does not depend on the strategy,
// which is what lets switch-strategy change it between any two steps.
//
// Note [Bucket order]
// Units launch strictly in plan order on every rank (c10d's rule: the same
// collectives in the same order), never in the order hooks happen to fire.
// The plan orders units by the readiness position of their last parameter
// (stable for ties), so that with gcts.overlap a unit is launched as soon as
// its gradients and those of every unit before it are final, while backward
// still runs (reducer.cpp, Note [Overlap]). Readiness positions come
// from the MDG (the reverse of first use in the forward graph) when the
// model has one, else reverse definition order (what autograd produces for a
// module written top to bottom, as DDP assumes). Consequences: simple's
// buckets (cut in reverse definition order) launch roughly in cut order,
// moved where the MDG's order differs; hybrid's tiny
// tensors, spread over every layer, launch when the last of them is final
// (near the end of backward); reduce-scatter slices whose pieces lie late in
// every rank's range launch first. The order changes which call carries an
// element, never what it is summed with.
#include "plan.hpp"

#include <algorithm>  // std::stable_sort, std::max, std::min
#include <numeric>    // std::iota

namespace loongforge::gcts {

namespace {

// Cuts `order` into buckets: the first up to first_numel elements, the rest
// up to bucket_numel; a tensor larger than a bucket gets one of its own.
std::vector<Bucket> cut_buckets(const std::vector<size_t>& order, const std::vector<ReducedParam>& params,
                                int64_t first_numel, int64_t bucket_numel) {
  std::vector<Bucket> out;
  Bucket cur;
  for (size_t i : order) {
    const int64_t cap = out.empty() ? first_numel : bucket_numel;
    if (!cur.params.empty() && cur.numel + params[i].numel > cap) {
      out.push_back(std::move(cur));
      cur = Bucket{};
    }
    cur.params.push_back(i);
    cur.numel += params[i].numel;
  }
  if (!cur.params.empty()) out.push_back(std::move(cur));
  return out;
}

Unit all_reduce_unit(Bucket b, std::string group) {
  Unit u;
  u.kind = Unit::Kind::AllReduce;
  u.group = std::move(group);
  u.bucket = std::move(b);
  return u;
}

// Orders the units (Note [Bucket order]) and indexes them by parameter.
Plan finish(std::vector<Unit> units, const PlanInputs& in) {
  for (auto& u : units) {
    u.ready_at = 0;
    for (size_t i : u.bucket.params) u.ready_at = std::max(u.ready_at, in.ready_pos[i]);
  }
  std::stable_sort(units.begin(), units.end(), [](const Unit& a, const Unit& b) { return a.ready_at < b.ready_at; });
  Plan p;
  p.units = std::move(units);
  p.units_of.resize(in.params->size());
  for (size_t u = 0; u < p.units.size(); ++u)
    for (size_t i : p.units[u].bucket.params) p.units_of[i].push_back(u);
  return p;
}

std::vector<size_t> by_readiness(std::vector<size_t> idx, const PlanInputs& in) {
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return in.ready_pos[a] < in.ready_pos[b]; });
  return idx;
}

}  // namespace

std::vector<int64_t> readiness_positions(const std::vector<ReducedParam>& params) {
  const auto n = static_cast<int64_t>(params.size());
  std::vector<int64_t> pos(params.size());
  bool mdg = !params.empty();
  for (const auto& p : params) mdg = mdg && p.ready_rank >= 0;
  for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = mdg ? params[static_cast<size_t>(i)].ready_rank : n - 1 - i;
  return pos;
}

Plan make_simple_plan(const PlanInputs& in) {
  std::vector<size_t> all(in.params->size());
  std::iota(all.rbegin(), all.rend(), size_t{0});  // reverse definition order, as DDP cuts
  std::vector<Unit> units;
  for (auto& b : cut_buckets(all, *in.params, in.first_numel, in.bucket_numel))
    units.push_back(all_reduce_unit(std::move(b), "all-reduce (buckets)"));
  return finish(std::move(units), in);
}

std::vector<std::pair<int64_t, int64_t>> reduce_scatter_slices(const PlanInputs& in) {
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t n = in.world, chunk = in.shard->chunk;
  int64_t a = 0;
  while (a < chunk) {
    const int64_t len = std::max<int64_t>(1, (out.empty() ? in.first_numel : in.bucket_numel) / n);
    out.emplace_back(a, std::min(chunk, a + len));
    a = out.back().second;
  }
  return out;
}

Plan make_hybrid_plan(const PlanInputs& in) {
  const auto& params = *in.params;
  std::vector<Unit> units;
  Bucket tiny;
  if (in.shard) {
    const ShardLayout& l = *in.shard;
    for (size_t i : l.replicated) tiny.params.push_back(i), tiny.numel += params[i].numel;
    for (const auto& [a, b] : reduce_scatter_slices(in)) {
      Unit u;
      u.kind = Unit::Kind::ReduceScatter;
      u.group = "dense (reduce-scatter into shards)";
      u.slice_begin = a, u.slice_end = b;
      for (size_t k = 0; k < l.sharded.size(); ++k) {
        const int64_t p0 = l.offsets[k], p1 = p0 + params[l.sharded[k]].numel;
        for (int64_t r = 0; r < in.world; ++r)
          if (p0 < r * l.chunk + b && p1 > r * l.chunk + a) {
            u.bucket.params.push_back(l.sharded[k]);
            break;
          }
      }
      u.bucket.numel = (b - a) * in.world;  // what the collective carries
      units.push_back(std::move(u));
    }
  } else {
    std::vector<size_t> dense, embodiment;
    for (size_t k = 0; k < params.size(); ++k) {
      if (params[k].numel <= in.tiny_numel)
        tiny.params.push_back(k), tiny.numel += params[k].numel;
      else if (in.sparse_embodiment && params[k].embodiment && !params[k].shape.empty())
        embodiment.push_back(k);
      else
        dense.push_back(k);
    }
    tiny.params = by_readiness(tiny.params, in);
    if (!embodiment.empty()) {
      Unit u;
      u.kind = Unit::Kind::Embodiment;
      u.group = "embodiment (used slot rows)";
      u.bucket.params = by_readiness(embodiment, in);
      for (size_t i : embodiment) u.bucket.numel += params[i].numel;
      units.push_back(std::move(u));
    }
    for (auto& b : cut_buckets(by_readiness(dense, in), params, in.first_numel, in.bucket_numel))
      units.push_back(all_reduce_unit(std::move(b), "dense (buckets)"));
  }
  if (!tiny.params.empty()) units.push_back(all_reduce_unit(std::move(tiny), "tiny tensors (coalesced)"));
  return finish(std::move(units), in);
}

nlohmann::json plan_json(const Plan& plan, const std::vector<ReducedParam>& params) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& u : plan.units) {
    nlohmann::json names = nlohmann::json::array();
    for (size_t i : u.bucket.params) names.push_back(params[i].name);
    nlohmann::json j = {{"group", u.group}, {"numel", u.bucket.numel}, {"ready_at", u.ready_at}, {"params", names}};
    if (u.kind == Unit::Kind::ReduceScatter) j["slice"] = {u.slice_begin, u.slice_end};
    a.push_back(std::move(j));
  }
  return a;
}

}  // namespace loongforge::gcts
