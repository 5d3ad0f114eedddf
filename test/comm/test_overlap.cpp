// Proves GCTS's overlap (Note [Overlap] in src/comm/gcts_reducer.cpp): the
// libtorch hook it relies on fires after the backward's gradient has been
// accumulated into .grad; and on two Gloo ranks (two threads), a small model
// trained with 2 micro-batches gets bitwise the same averaged gradients with
// overlap on as with it off, for `simple` and `hybrid`, sharded and not, while
// overlap launches some buckets during backward and the other path none.
#include <string>
#include <vector>

#include <ATen/ATen.h>                           // at::randn, at::tanh
#include <ATen/CPUGeneratorImpl.h>               // at::CPUGeneratorImpl
#include <torch/csrc/autograd/function_hook.h>  // PostAccumulateGradHook
#include <torch/csrc/autograd/variable.h>       // set_post_acc_grad_hooks

#include "catch_compat.hpp"
#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/shard.hpp"
#include "loongforge/config/config.hpp"
#include "ranks.hpp"

using namespace loongforge;
using namespace loongforge::comm;

namespace {

struct Record final : torch::autograd::PostAccumulateGradHook {
  explicit Record(std::vector<at::Tensor>* s) : seen(s) {}
  void operator()(const torch::autograd::Variable& t) override { seen->push_back(t.grad().clone()); }
  std::vector<at::Tensor>* seen;
};

// A recorder that records nothing (phases are not under test here).
struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};

// W1 (8x16), b1 (16, tiny), W2 (16x16), E (4 slots x 16 x 16, per
// embodiment), W3 (16x4): the parameter kinds the plans treat differently.
struct Net {
  std::vector<at::Tensor> params;
  std::vector<ReducedParam> meta;
  Net() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);  // threads: no global seed
    const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
        {"w1", {8, 16}}, {"b1", {16}}, {"w2", {16, 16}}, {"emb", {4, 16, 16}}, {"w3", {16, 4}}};
    for (const auto& [name, shape] : shapes) {
      params.push_back((at::randn(shape, gen) * 0.3).requires_grad_(true));
      ReducedParam m;
      m.name = name, m.shape = shape, m.numel = params.back().numel(), m.embodiment = name == "emb";
      meta.push_back(m);
    }
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& ids) const {
    at::Tensor h = at::tanh(x.matmul(params[0]) + params[1]);
    h = at::tanh(h.matmul(params[2]));
    h = at::tanh(at::bmm(h.unsqueeze(1), params[3].index_select(0, ids)).squeeze(1));
    return h.matmul(params[4]).pow(2).mean();
  }
};

struct Result {
  std::vector<at::Tensor> grads;  // per parameter (replicated ones when sharded)
  at::Tensor shard_grad;          // sharded: this rank's averaged range
  int64_t launched_in_backward = 0;
  double bytes = 0;
};

Result train_step(World& world, const std::string& strategy, bool sharded, bool overlap) {
  Net net;
  config::Config cfg;
  cfg.gcts.enable = true;
  cfg.gcts.comm_strategy = strategy;
  cfg.gcts.bucket_mb = 0.002;         // 500 floats: several buckets
  cfg.gcts.first_bucket_mb = 0.0005;  // 125 floats
  cfg.gcts.tiny_tensor_kb = 0.1;      // 25 floats: b1 is tiny
  ShardTarget target;
  std::vector<int64_t> numels;
  for (const auto& m : net.meta) numels.push_back(m.numel);
  if (sharded) {
    target.layout = ShardLayout::make(numels, 25, world.size(), world.rank());
    target.grad = at::zeros({target.layout.chunk});
  }
  auto reducer = make_gcts_reducer(cfg, &world, net.meta, sharded ? &target : nullptr, overlap);
  NoPhases phases;
  reducer->begin_step(net.params, /*micro_batches=*/2);
  for (int64_t micro = 0; micro < 2; ++micro) {
    // each rank, each micro-batch: its own data
    auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + world.rank() * 10 + micro);
    const at::Tensor x = at::randn({6, 8}, gen);
    const at::Tensor ids = at::randint(0, 2, {6}, gen, at::kLong);  // slots 2, 3 get no gradient
    net.loss(x, ids).backward();
  }
  reducer->average_gradients(net.params, phases, 0);
  Result r;
  for (const auto& p : net.params) r.grads.push_back(p.grad().clone());
  if (sharded) r.shard_grad = target.grad.clone();
  const auto status = reducer->comm_status();
  r.launched_in_backward = status.at("units_launched_in_backward").get<int64_t>();
  for (const auto& b : status.at("buckets")) r.bytes += b.at("bytes").get<double>();
  return r;
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
  for (const std::string strategy : {"simple", "hybrid"}) {
    for (const bool sharded : {false, true}) {
      CAPTURE(strategy, sharded);
      std::vector<Result> on(2), off(2);  // one slot per rank: the rank threads never insert concurrently
      test::two_ranks([&](World& world) {
        on[world.rank()] = train_step(world, strategy, sharded, /*overlap=*/true);
        off[world.rank()] = train_step(world, strategy, sharded, /*overlap=*/false);
      });
      for (int64_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        REQUIRE(on[r].launched_in_backward > 0);
        REQUIRE(off[r].launched_in_backward == 0);
        REQUIRE(on[r].bytes == off[r].bytes);
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
