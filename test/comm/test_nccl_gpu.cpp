// Proves, on one GPU, the NCCL backend behind World (Note [One interface, two
// backends] in comm/world.hpp), which no CPU run can reach: a one-rank c10d
// ProcessGroupNCCL opens on cuda:0 through the TCPStore rendezvous; every
// collective GCTS uses (all-reduce, reduce-scatter, all-gather, broadcast,
// barrier) leaves its result in place for the caller's stream; and GCTS's
// overlap (Note [Overlap] in src/engines/gcts/reducer.cpp), whose hooks run on
// autograd's CUDA device thread, gives bitwise the gradients of the reduction
// after backward for `simple` and `hybrid`, sharded and not, launching units
// during backward; a sharded optimizer's all-gather in pieces left in flight
// (Note [Gather overlap] in src/engines/gcts/sharded_adamw.cpp) gives bitwise the
// parameters of one blocking all-gather; and an all-reduce through World can
// be captured in a CUDA graph and replayed with new inputs (the question of
// issue #13 whether collectives can live inside the fast step's graphs); and
// GCTS's reduction captured into a CUDA graph with the backward and replayed
// (Note [Reduction in the graph]) gives the reduction after backward's
// gradients for `simple` and `hybrid`, sharded and not; and a world
// aborted and regrouped (Note [Regrouped worlds]: the NCCL path of fault
// tolerance that one rank can run) gets a new communicator that works; and
// settling (Note [Settling a step on NCCL]) waits for queued work and fails a
// stalled device at the timeout, aborting the group. One
// rank is all NCCL allows per GPU; several ranks need the multi-GPU machines
// (issue #13).
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>                    // at::arange
#include <ATen/CPUGeneratorImpl.h>        // at::CPUGeneratorImpl
#include <ATen/cuda/CUDAGraph.h>          // at::cuda::CUDAGraph, at::cuda::graph_pool_handle
#include <ATen/cuda/Sleep.h>              // at::cuda::sleep
#include <c10/cuda/CUDAGuard.h>           // c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAFunctions.h>       // c10::cuda::device_synchronize
#include <cuda_runtime_api.h>             // cudaDeviceGetAttribute

#include "catch_compat.hpp"
#include "engines/gcts/gcts_step.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/engines/gcts/sharded_adamw.hpp"
#include "loongforge/optim/optimizer.hpp"
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
      // monitor-comm on NCCL: device-timed buckets, shown once their events are done.
      REQUIRE(on.clock == "device (CUDA events)");
      REQUIRE(on.shown_step == 1);
      REQUIRE_FALSE(on.times.empty());
      for (const double t : on.times) REQUIRE((t >= 0 && t < 1000));
      // The step's counts through the store; the embodiment rows from the agreed slots.
      const test::StepResult agreed = test::train_step(*world, strategy, sharded, /*overlap=*/true, /*agree=*/true);
      for (size_t i = 0; i < on.grads.size(); ++i) REQUIRE(agreed.grads[i].equal(on.grads[i]));
    }
  }
}

TEST_CASE("comm: on a GPU, a sharded optimizer's all-gather in pieces through NCCL equals one blocking all-gather") {
  auto world = one_nccl_rank();
  const auto cuda = at::TensorOptions().device(world->device()).dtype(at::kFloat);
  auto run = [&](gcts::ShardedOptions sharded, std::vector<int64_t>* in_flight) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
    std::vector<optim::OptimizedParam> ps;
    for (const int64_t n : {700, 9, 1300, 64, 420}) ps.push_back({"p" + std::to_string(n), at::randn({n}, gen).to(cuda), true});
    gcts::ShardedAdamW opt(ps, optim::AdamWOptions{}, world.get(), /*tiny_numel=*/16, sharded);
    for (int64_t step = 0; step < 3; ++step) {
      opt.shard().grad.copy_(at::randn({opt.layout().chunk}, gen).to(cuda));
      for (size_t i : opt.layout().replicated) ps[i].tensor.mutable_grad() = at::randn({9}, gen).to(cuda);
      opt.step(1e-2);
      in_flight->push_back(opt.gathers_in_flight());
      opt.sync_parameters();
    }
    std::vector<at::Tensor> out;
    for (const auto& p : ps) out.push_back(p.tensor.cpu());
    return out;
  };
  std::vector<int64_t> blocking_in_flight, pieces_in_flight;
  const auto blocking = run(gcts::ShardedOptions{false, 0, /*fused=*/true}, &blocking_in_flight);
  const auto pieces = run(gcts::ShardedOptions{true, 100, /*fused=*/true}, &pieces_in_flight);
  for (const int64_t n : blocking_in_flight) REQUIRE(n == 0);
  for (const int64_t n : pieces_in_flight) REQUIRE(n == 25);  // 2484 sharded floats in pieces of 100
  for (size_t i = 0; i < pieces.size(); ++i) REQUIRE(pieces[i].equal(blocking[i]));
}

TEST_CASE("comm: an NCCL all-reduce captured in a CUDA graph runs on every replay") {
  auto world = one_nccl_rank();
  const auto cuda = at::TensorOptions().device(world->device()).dtype(at::kFloat);
  at::Tensor x = at::arange(1000, cuda);
  std::vector<at::Tensor> warm = {x * 2};
  world->allreduce_sum(warm);  // the communicator exists before the capture
  c10::cuda::device_synchronize();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(side);
  at::cuda::CUDAGraph graph;
  at::Tensor z;
  graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
  {
    std::vector<at::Tensor> t = {x * 2};
    world->allreduce_sum(t);
    z = t[0] + 1;
  }
  graph.capture_end();
  for (const float v : {3.0f, -1.5f, 7.25f}) {
    CAPTURE(v);
    x.fill_(v);
    graph.replay();
    side.synchronize();
    REQUIRE(at::equal(z.cpu(), at::full({1000}, 2 * v + 1)));
  }
}

TEST_CASE("comm: on a GPU, GCTS's reduction captured with the backward into a CUDA graph and replayed equals "
          "reduction after backward, bitwise") {
  auto world = one_nccl_rank();
  for (const std::string strategy : {"simple", "hybrid"}) {
    for (const bool sharded : {false, true}) {
      CAPTURE(strategy, sharded);
      std::unique_ptr<at::cuda::CUDAGraph> graph;
      int64_t captures = 0, replays = 0;
      const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
      // As the graph runner: on a side stream, captured once, replayed every step.
      const auto drive = [&](const std::function<void()>& region) {
        c10::cuda::device_synchronize();
        c10::cuda::CUDAStreamGuard guard(side);
        if (!graph) {
          graph = std::make_unique<at::cuda::CUDAGraph>();
          graph->capture_begin(at::cuda::graph_pool_handle(), cudaStreamCaptureModeThreadLocal);
          region();
          graph->capture_end();
          ++captures;
        }
        graph->replay();
        ++replays;
        side.synchronize();
      };
      const auto captured = test::graph_steps(*world, strategy, sharded, 3, drive);
      const auto plain = test::graph_steps(*world, strategy, sharded, 3, {});
      REQUIRE(captures == 1);
      REQUIRE(replays == 3);
      for (size_t step = 0; step < 3; ++step)
        for (size_t i = 0; i < plain[step].size(); ++i) {
          CAPTURE(step, i);
          REQUIRE(captured[step][i].equal(plain[step][i]));
        }
    }
  }
  // What a capture bakes in names the graph: on NCCL the key is set once the slots are agreed.
  test::Net net(world->device());
  config::Config cfg;
  auto reducer = gcts::make_reducer(cfg, world.get(), net.meta, nullptr, false);
  reducer->agree_counts({6, {0, 1}});
  const std::string key = reducer->graph_key();
  REQUIRE_FALSE(key.empty());
  reducer->switch_strategy(cfg.gcts.comm_strategy == "simple" ? "hybrid" : "simple");
  REQUIRE(reducer->graph_key() != key);
}

TEST_CASE("comm: on one GPU, an NCCL world aborted and regrouped into the next generation runs its collectives again") {
  REQUIRE(backend_built(Backend::Nccl));
  auto world = one_nccl_rank();
  const auto cuda = at::TensorOptions().device(world->device()).dtype(at::kFloat);
  const at::Tensor x = at::arange(1000, cuda) * 0.25;
  std::vector<at::Tensor> t = {x.clone()};
  world->allreduce_sum(t);
  REQUIRE(at::equal(t[0].cpu(), x.cpu()));
  world->abort();  // as fault tolerance does to the failed generation's group
  auto next = World::regroup(*world, /*rank=*/0, /*world_size=*/1, /*generation=*/1, /*timeout_ms=*/60000);
  world.reset();  // the aborted group goes away without waiting for anything
  REQUIRE(next->backend() == Backend::Nccl);
  REQUIRE(next->device() == c10::Device(c10::kCUDA, 0));
  std::vector<at::Tensor> u = {x * 3};
  next->allreduce_sum(u);
  REQUIRE(at::equal(u[0].cpu(), (x * 3).cpu()));
  std::vector<at::Tensor> b = {x * 5};
  next->broadcast(b, 0);
  at::Tensor gathered = at::zeros({1000}, cuda);
  next->all_gather_async(gathered, x).wait();
  REQUIRE(at::equal(gathered.cpu(), x.cpu()));
  next->barrier();
  // And a second generation from the first (a later failure).
  next->abort();
  auto third = World::regroup(*next, 0, 1, 2, 60000);
  next.reset();
  std::vector<at::Tensor> v = {x.clone()};
  third->allreduce_sum(v);
  REQUIRE(at::equal(v[0].cpu(), x.cpu()));
}

// Note [Settling a step on NCCL]: settle() returns once the queued work has run; a device kept busy past the
// timeout fails it with CommError (the group aborted), and the next generation's group works.
TEST_CASE("comm: on one GPU, settling waits for the queued collectives and fails a stalled device at the timeout") {
  REQUIRE(backend_built(Backend::Nccl));
  auto world = one_nccl_rank();
  const auto cuda = at::TensorOptions().device(world->device()).dtype(at::kFloat);
  const at::Tensor x = at::arange(1 << 20, cuda);
  std::vector<at::Tensor> t = {x.clone()};
  Pending p = world->allreduce_sum_async(t[0]);
  p.wait();
  world->settle("an all-reduce");  // returns: nothing failed
  REQUIRE(at::equal(t[0].cpu(), x.cpu()));

  world->set_timeout(1000);
  int khz = 0;
  REQUIRE(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) == cudaSuccess);
  at::cuda::sleep(static_cast<int64_t>(4.0 * khz * 1000));  // about 4 s of spinning, queued after the collective
  const auto t0 = std::chrono::steady_clock::now();
  std::string what;
  try {
    world->settle("a stalled step");
  } catch (const CommError& e) {
    what = e.what();
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(what);
  REQUIRE(what.find("a stalled step did not complete") != std::string::npos);
  REQUIRE(what.find("NCCL group was aborted") != std::string::npos);
  REQUIRE(waited >= 0.95);
  REQUIRE(what.find("after 1.0") != std::string::npos);  // failed at the timeout, not at the stall's end
  REQUIRE(waited < 8.0);  // the abort waits out the queued 4 s spin (Note [Settling a step on NCCL]), no more

  auto next = World::regroup(*world, 0, 1, /*generation=*/1, /*timeout_ms=*/60000);
  std::vector<at::Tensor> u = {x * 2};
  next->allreduce_sum(u);
  next->settle("the next generation's all-reduce");
  REQUIRE(at::equal(u[0].cpu(), (x * 2).cpu()));
}
