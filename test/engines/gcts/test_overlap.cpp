// Proves GCTS's overlap (Note [Overlap] in src/engines/gcts/reducer.cpp): the
// libtorch hook it relies on fires after the backward's gradient has been
// accumulated into .grad; and on two Gloo ranks (two threads), a small model
// trained with 2 micro-batches gets bitwise the same averaged gradients with
// overlap on as with it off, for `simple` and `hybrid`, sharded and not, while
// overlap launches some buckets during backward and the other path none; and
// that the step's counts travel host to host (World::all_gather_on_hosts) and
// the per-embodiment rows they name reduce what the gradients' rows would;
// and that the reducer's protocol for a reduction captured in a CUDA graph
// (Note [Reduction in the graph]), driven without a graph, gives bitwise the
// gradients of the reduction after backward (Gloo itself never captures).
#include <string>
#include <vector>

#include <ATen/ATen.h>                          // at::ones
#include <torch/csrc/autograd/function_hook.h>  // PostAccumulateGradHook
#include <torch/csrc/autograd/variable.h>       // set_post_acc_grad_hooks
#include <torch/csrc/distributed/c10d/Store.hpp>  // c10d::Store::getNumKeys

#include "catch_compat.hpp"
#include "gcts_step.hpp"
#include "comm/ranks.hpp"

using namespace loongforge;
using namespace loongforge::comm;

namespace {

struct Record final : torch::autograd::PostAccumulateGradHook {
  explicit Record(std::vector<at::Tensor>* s) : seen(s) {}
  void operator()(const torch::autograd::Variable& t) override { seen->push_back(t.grad().clone()); }
  std::vector<at::Tensor>* seen;
};

// The trainer's exchange of a step's counts, through a plain reducer of `world`.
StepCounts detail_agree(World& world, const StepCounts& mine) {
  return make_plain_reducer(&world)->agree_counts(mine);
}

}  // namespace

TEST_CASE("comm: a post-accumulate-grad hook sees the gradient after accumulation") {
  at::Tensor w = at::ones({3}).requires_grad_(true);
  std::vector<at::Tensor> seen;
  torch::autograd::impl::set_post_acc_grad_hooks(w, std::make_unique<Record>(&seen));
  (w * 2.0).sum().backward();
  (w * 3.0).sum().backward();
  torch::autograd::impl::set_post_acc_grad_hooks(w, nullptr);
  REQUIRE(seen.size() == 2);
  REQUIRE(seen[0].equal(at::full({3}, 2.0)));
  REQUIRE(seen[1].equal(at::full({3}, 5.0)));  // 2 + 3: fired after the second accumulation
}

TEST_CASE("comm: overlapped reduction equals reduction after backward, bitwise (2 ranks)") {
  test::warm_up_math();  // Note [First use of MKL on two threads] in gcts_step.hpp
  for (const std::string strategy : {"simple", "hybrid"}) {
    for (const bool sharded : {false, true}) {
      CAPTURE(strategy, sharded);
      std::vector<test::StepResult> on(2), off(2);  // one slot per rank: the rank threads never insert concurrently
      test::two_ranks([&](World& world) {
        on[world.rank()] = test::train_step(world, strategy, sharded, /*overlap=*/true);
        off[world.rank()] = test::train_step(world, strategy, sharded, /*overlap=*/false);
      });
      for (int64_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        REQUIRE(on[r].launched_in_backward > 0);
        REQUIRE(off[r].launched_in_backward == 0);
        REQUIRE(on[r].bytes == off[r].bytes);
        REQUIRE(on[r].clock == "host");
        REQUIRE(on[r].shown_step == 1);
        for (size_t i = 0; i < on[r].grads.size(); ++i) {
          CAPTURE(i);
          REQUIRE(on[r].grads[i].equal(off[r].grads[i]));
        }
        if (sharded) REQUIRE(on[r].shard_grad.equal(off[r].shard_grad));
      }
      // Unsharded: both ranks hold the same averaged gradients.
      if (!sharded)
        for (size_t i = 0; i < on[0].grads.size(); ++i) REQUIRE(on[0].grads[i].equal(on[1].grads[i]));
    }
  }
}

TEST_CASE("comm: per-embodiment rows chosen from the agreed batch slots equal rows found from the gradients, bitwise (2 ranks)") {
  test::warm_up_math();  // Note [First use of MKL on two threads] in gcts_step.hpp
  for (const bool overlap : {false, true}) {
    CAPTURE(overlap);
    std::vector<test::StepResult> agreed(2), found(2);
    test::two_ranks([&](World& world) {
      agreed[world.rank()] = test::train_step(world, "hybrid", /*sharded=*/false, overlap, /*agree=*/true);
      found[world.rank()] = test::train_step(world, "hybrid", /*sharded=*/false, overlap, /*agree=*/false);
    });
    for (int64_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      for (size_t i = 0; i < agreed[r].grads.size(); ++i) {
        CAPTURE(i);
        REQUIRE(agreed[r].grads[i].equal(found[r].grads[i]));
        REQUIRE(agreed[r].grads[i].equal(agreed[0].grads[i]));
      }
      // The same rows travel; only the 4 slots' int32 row masks (16 bytes) are not all-reduced.
      REQUIRE(agreed[r].bytes == found[r].bytes - 16);
    }
  }
}

TEST_CASE("comm: the step's counts are summed and their slots united host to host, call after call, without piling up keys") {
  std::vector<std::vector<StepCounts>> seen(2);
  std::vector<int64_t> keys(2);
  test::two_ranks([&](World& world) {
    const int64_t r = world.rank();
    for (int64_t call = 0; call < 50; ++call)
      seen[r].push_back(detail_agree(world, {call + r, {r == 0 ? call % 3 : 7}}));
    world.barrier();
    keys[r] = world.store().getNumKeys();
  });
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t call = 0; call < 50; ++call) {
      CAPTURE(r, call);
      REQUIRE(seen[r][call].valid == 2 * call + 1);
      REQUIRE(seen[r][call].slots == std::vector<int64_t>{call % 3, 7});
    }
  REQUIRE(keys[0] < 20);  // two per rank at most, plus the rendezvous's own
  REQUIRE_THROWS_WITH(StepCounts::decode("12;3,x"), lf_catch::Contains("malformed"));
  REQUIRE(StepCounts::decode(StepCounts{5, {1, 4}}.encode()).slots == std::vector<int64_t>{1, 4});
}

TEST_CASE("comm: the reduction-in-the-graph protocol, run without a graph, equals reduction after backward, bitwise (2 ranks)") {
  test::warm_up_math();  // Note [First use of MKL on two threads] in gcts_step.hpp
  for (const std::string strategy : {"simple", "hybrid"}) {
    for (const bool sharded : {false, true}) {
      CAPTURE(strategy, sharded);
      std::vector<std::vector<std::vector<at::Tensor>>> protocol(2), plain(2);
      std::vector<std::string> keys(2, "unset");
      std::vector<nlohmann::json> in_graph(2), after(2);
      test::two_ranks([&](World& world) {
        const auto r = static_cast<size_t>(world.rank());
        protocol[r] = test::graph_steps(world, strategy, sharded, 3, [](const std::function<void()>& region) { region(); },
                                        &in_graph[r]);
        plain[r] = test::graph_steps(world, strategy, sharded, 3, {}, &after[r]);
        test::Net net(world.device());
        keys[r] = gcts::make_reducer(config::Config{}, &world, net.meta, nullptr, false)->graph_key();
      });
      for (size_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        REQUIRE(keys[r].empty());  // Gloo: nothing to capture
        // monitor-comm: the captured units, untimed, the same bytes as after backward
        REQUIRE(in_graph[r].value("in_graph", false));
        REQUIRE_FALSE(after[r].contains("in_graph"));
        double a = 0, b = 0;
        for (const auto& x : in_graph[r].at("buckets")) {
          a += x.at("bytes").get<double>();
          REQUIRE(x.at("time_ms").is_null());
        }
        for (const auto& x : after[r].at("buckets")) b += x.at("bytes").get<double>();
        REQUIRE(a == b);
        REQUIRE(a > 0);
        REQUIRE(protocol[r].size() == 3);
        for (size_t step = 0; step < 3; ++step)
          for (size_t i = 0; i < plain[r][step].size(); ++i) {
            CAPTURE(step, i);
            REQUIRE(protocol[r][step][i].equal(plain[r][step][i]));
          }
      }
      // The ranks averaged: the replicated gradients agree across ranks.
      if (!sharded)
        for (size_t i = 0; i < plain[0][2].size(); ++i) REQUIRE(plain[0][2][i].equal(plain[1][2][i]));
    }
  }
}
