// Proves, on one GPU, the NCCL backend behind World (Note [One interface, two
// backends] in comm/world.hpp), which no CPU run can reach: a one-rank c10d
// ProcessGroupNCCL opens on cuda:0 through the TCPStore rendezvous; every
// collective GCTS uses (all-reduce, reduce-scatter, all-gather, broadcast,
// barrier) leaves its result in place for the caller's stream; and GCTS's
// overlap (Note [Overlap] in src/comm/gcts_reducer.cpp), whose hooks run on
// autograd's CUDA device thread, gives bitwise the gradients of the reduction
// after backward for `simple` and `hybrid`, sharded and not, launching units
// during backward. One rank is all NCCL allows per GPU; several ranks need the
// multi-GPU machines (issue #13).
#include <string>
#include <vector>

#include <ATen/ATen.h>  // at::arange

#include "catch_compat.hpp"
#include "gcts_step.hpp"
#include "ranks.hpp"

using namespace loongforge;
using namespace loongforge::comm;

namespace {
std::unique_ptr<World> one_nccl_rank() {
  WorldInfo info;
  info.rank = 0, info.world_size = 1, info.master_port = test::free_port();
  return World::connect(info, /*timeout_ms=*/60000, Backend::Nccl, c10::Device(c10::kCUDA, 0));
}
}  // namespace

TEST_CASE("comm: one NCCL rank on a GPU runs every collective GCTS uses") {
  REQUIRE(backend_built(Backend::Nccl));
  auto world = one_nccl_rank();
  REQUIRE(world->backend() == Backend::Nccl);
  REQUIRE(world->device() == c10::Device(c10::kCUDA, 0));
  const auto cuda = at::TensorOptions().device(world->device()).dtype(at::kFloat);
  const at::Tensor x = at::arange(1000, cuda) * 0.5;  // queued on the current stream just before
  std::vector<at::Tensor> t = {x.clone()};
  world->allreduce_sum(t);
  REQUIRE(at::equal(t[0].cpu(), x.cpu()));
  at::Tensor piece = at::zeros({1000}, cuda);
  world->reduce_scatter_sum_async(piece, {x * 2}).wait();
  REQUIRE(at::equal(piece.cpu(), (x * 2).cpu()));
  at::Tensor gathered = at::zeros({1000}, cuda);
  world->all_gather_async(gathered, x + 1).wait();
  REQUIRE(at::equal(gathered.cpu(), (x + 1).cpu()));
  std::vector<at::Tensor> b = {x.clone()};
  world->broadcast(b, 0);
  REQUIRE(at::equal(b[0].cpu(), x.cpu()));
  at::Tensor async = x.clone();
  Pending p = world->allreduce_sum_async(async);
  p.wait();
  REQUIRE(at::equal(async.cpu(), x.cpu()));
  world->barrier();
}

TEST_CASE("comm: on a GPU, overlapped reduction through NCCL equals reduction after backward, bitwise") {
  auto world = one_nccl_rank();
  for (const std::string strategy : {"simple", "hybrid"}) {
    for (const bool sharded : {false, true}) {
      CAPTURE(strategy, sharded);
      const test::StepResult on = test::train_step(*world, strategy, sharded, /*overlap=*/true);
      const test::StepResult off = test::train_step(*world, strategy, sharded, /*overlap=*/false);
      REQUIRE(on.launched_in_backward > 0);
      REQUIRE(off.launched_in_backward == 0);
      REQUIRE(on.bytes == off.bytes);
      for (size_t i = 0; i < on.grads.size(); ++i) {
        CAPTURE(i);
        REQUIRE(on.grads[i].equal(off.grads[i]));
      }
      if (sharded) REQUIRE(on.shard_grad.equal(off.shard_grad));
    }
  }
}
