// Private to the comm room: GCTS's plan, the units of communication one step
// launches and their order (Note [GCTS strategies] and Note [Bucket order] in
// plan.cpp). A plan is a pure function of its inputs, so every rank
// computes the same one.
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/shard.hpp"

namespace loongforge::gcts {

using comm::ReducedParam;
using comm::ShardLayout;


struct Bucket {
  std::vector<size_t> params;  // indices, in pack order
  int64_t numel = 0;
};

// One launch: a collective (or, for the embodiment group, a mask all-reduce
// followed by the selected rows' all-reduce).
struct Unit {
  enum class Kind { AllReduce, ReduceScatter, Embodiment };
  Kind kind = Kind::AllReduce;
  std::string group;  // monitor-comm's group name
  // AllReduce: the parameters packed, in this order; Embodiment: its
  // parameters; ReduceScatter: the sharded parameters overlapping the slice.
  Bucket bucket;
  int64_t slice_begin = 0, slice_end = 0;  // ReduceScatter: [a, b) inside every rank's chunk
  int64_t ready_at = 0;                    // readiness position of its last parameter
};

struct Plan {
  std::vector<Unit> units;                   // launch order (Note [Bucket order])
  std::vector<std::vector<size_t>> units_of;  // per parameter: the units that read its gradient
};

struct PlanInputs {
  const std::vector<ReducedParam>* params = nullptr;
  // Per parameter: its position in backward readiness order (0 = final
  // first), from the MDG when it has one, else reverse definition order.
  std::vector<int64_t> ready_pos;
  int64_t first_numel = 1, bucket_numel = 1, tiny_numel = 0, world = 1;
  bool sparse_embodiment = true;
  const ShardLayout* shard = nullptr;  // a sharded optimizer's layout, or nullptr
};

// Readiness positions: MDG ranks (ReducedParam::ready_rank) when every
// parameter has one, else reverse definition order.
std::vector<int64_t> readiness_positions(const std::vector<ReducedParam>& params);

Plan make_simple_plan(const PlanInputs& in);
Plan make_hybrid_plan(const PlanInputs& in);

// Slices [a, b) of every rank's chunk for the reduce-scatter units: the first
// of first_numel / world elements, the rest of bucket_numel / world.
std::vector<std::pair<int64_t, int64_t>> reduce_scatter_slices(const PlanInputs& in);

nlohmann::json plan_json(const Plan& plan, const std::vector<ReducedParam>& params);

}  // namespace loongforge::gcts
