// Proves the fused optimizer computes the plain one's update: FusedAdamW
// (ATen's multi-tensor kernels) against AdamW (docs/training-semantics.md s5)
// in fp32 on the CPU over 100 steps with clipping, a non-finite gradient that
// must change nothing, and checkpoint state that moves between the two; and
// that ShardedAdamW's all-gathers, cut in pieces and left in flight after
// step() (Note [Gather overlap]), give two Gloo ranks bitwise the parameters
// of one blocking all-gather, op for op and fused; and that the fused
// ShardedAdamW computes the op-for-op one's update and skips a non-finite one
// on the device; and that gradients as views into the sharded optimizer's flat
// buffer (Note [Gradient views]) give the update of packed copies bitwise;
// and which optimizers keep bf16 working copies (precision.bf16_weights:
// AdamW, and FusedAdamW off a GPU, refuse them naming the key; ShardedAdamW
// keeps them, and its masters and moments are those of fp32 weights cast to
// bf16, bitwise, at 1 and 2 ranks: Note [Sharded working copies]); and that
// autograd sums a bf16 copy's gradients of several backward passes into an
// fp32 .grad exactly as the fp32-weight path sums them (Note [fp32 gradients
// of bf16 copies] in fused_adamw.cpp), where a bf16 .grad would round.
#include <cmath>   // std::isnan
#include <functional>  // std::function
#include <limits>  // std::numeric_limits
#include <stdexcept>  // std::logic_error

#include <ATen/ATen.h>              // at::randn
#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl

#include "catch_compat.hpp"
#include "engines/gcts/gcts_step.hpp"
#include "comm/ranks.hpp"
#include "loongforge/comm/reducer.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/engines/gcts/sharded_adamw.hpp"
#include "loongforge/optim/optimizer.hpp"

using namespace loongforge::optim;
using loongforge::gcts::ShardedAdamW;
using loongforge::gcts::ShardedOptions;
using loongforge::ConfigError;
using lf_catch::Contains;

namespace {

// ~20 tensors of mixed shapes; 2-D and larger ones decay, like a model's weights.
std::vector<OptimizedParam> make_params(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const std::vector<std::vector<int64_t>> shapes = {{64, 32}, {32}, {8, 16, 4}, {16}, {128}, {3, 5}, {1},
                                                    {32, 64}, {64}, {7, 9, 2}, {9}, {256, 4}, {4}, {2, 2},
                                                    {33}, {17, 3}, {5}, {12, 12}, {12}, {40, 8}};
  std::vector<OptimizedParam> out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    at::Tensor t = at::randn(shapes[i], gen);
    out.push_back({"p" + std::to_string(i), t, t.dim() >= 2});
  }
  return out;
}

std::vector<OptimizedParam> clone(const std::vector<OptimizedParam>& ps) {
  std::vector<OptimizedParam> out;
  for (const auto& p : ps) out.push_back({p.name, p.tensor.clone(), p.decay});
  return out;
}

void set_grads(const std::vector<at::Tensor>& params, int64_t step, double scale) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + static_cast<uint64_t>(step));
  for (const auto& p : params) {
    at::Tensor g = at::randn(p.sizes(), gen) * scale;
    const_cast<at::Tensor&>(p).mutable_grad() = g;
  }
}

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(b.norm().item<double>(), 1e-30);
}

// Everything an update may change: parameters, state tensors and step counts.
struct Snapshot {
  std::vector<at::Tensor> tensors;
  nlohmann::json steps;
  explicit Snapshot(const Optimizer& o) : steps(o.state_json()) {
    for (const auto& p : o.params()) tensors.push_back(p.clone());
    for (const auto& t : o.state_tensors()) tensors.push_back(t.second.clone());
  }
  bool operator==(const Snapshot& other) const {
    if (steps != other.steps || tensors.size() != other.tensors.size()) return false;
    for (size_t i = 0; i < tensors.size(); ++i)
      if (!at::equal(tensors[i], other.tensors[i])) return false;
    return true;
  }
};

AdamWOptions options() {
  AdamWOptions o;
  o.beta1 = 0.95, o.beta2 = 0.999, o.eps = 1e-8, o.weight_decay = 0.05;
  return o;
}

}  // namespace

TEST_CASE("optimizer: FusedAdamW equals AdamW within 1e-6 per tensor over 100 fp32 steps with clipping") {
  const auto init = make_params(7);
  AdamW plain(clone(init), options());
  FusedAdamW fused(clone(init), options());
  double worst = 0, worst_norm = 0;
  int64_t clipped = 0;
  for (int64_t s = 0; s < 100; ++s) {
    const double scale = s % 3 == 0 ? 1.0 : 0.01;  // large gradients every third step: those are clipped
    set_grads(plain.params(), s, scale);
    set_grads(fused.params(), s, scale);
    const double n_plain = plain.clip_grad_norm(1.0).item<double>();
    const double n_fused = fused.clip_grad_norm(1.0).item<double>();
    clipped += n_plain > 1.0;
    worst_norm = std::max(worst_norm, std::abs(n_plain - n_fused) / n_plain);
    const double lr = 1e-3 * (1.0 - static_cast<double>(s) / 100.0);
    plain.step(lr);
    fused.step(lr);
  }
  for (size_t i = 0; i < plain.params().size(); ++i) worst = std::max(worst, rel(fused.params()[i], plain.params()[i]));
  const auto sp = plain.state_tensors(), sf = fused.state_tensors();
  for (size_t i = 0; i < sp.size(); ++i) worst = std::max(worst, rel(sf[i].second, sp[i].second));
  WARN("measured: max relative difference per tensor " << worst << ", of the clip norm " << worst_norm);
  CHECK(clipped >= 30);
  CHECK(worst_norm <= 1e-6);
  CHECK(worst <= 1e-6);
  CHECK(fused.state_json() == plain.state_json());  // step counts
}

TEST_CASE("optimizer: a non-finite gradient changes nothing in FusedAdamW, on the device") {
  const auto init = make_params(3);
  FusedAdamW fused(clone(init), options());
  set_grads(fused.params(), 0, 1.0);
  fused.clip_grad_norm(1.0);
  fused.step(1e-3);  // one real step, so the state is not all zeros
  const Snapshot before(fused);

  set_grads(fused.params(), 1, 1.0);
  const_cast<at::Tensor&>(fused.params()[4]).mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(std::isnan(fused.clip_grad_norm(1.0).item<double>()));
  fused.step(1e-3);
  REQUIRE(Snapshot(fused) == before);
}

TEST_CASE("optimizer: state saved from one AdamW implementation continues in the other") {
  const auto init = make_params(11);
  AdamW a(clone(init), options());
  AdamW a_next(clone(init), options());
  for (int64_t s = 0; s < 5; ++s) {
    for (AdamW* o : {&a, &a_next}) {
      set_grads(o->params(), s, 1.0);
      o->clip_grad_norm(1.0);
      o->step(1e-3);
    }
  }
  // FusedAdamW picks up a's weights and state and takes the same next step as AdamW.
  std::vector<OptimizedParam> weights;
  for (size_t i = 0; i < init.size(); ++i) weights.push_back({init[i].name, a.params()[i].clone(), init[i].decay});
  FusedAdamW f(weights, options());
  std::map<std::string, at::Tensor> state;
  for (const auto& [name, t] : a.state_tensors()) state[name] = t;
  f.load_state(state, a.state_json());
  REQUIRE(f.state_json() == a.state_json());
  set_grads(f.params(), 5, 1.0);
  set_grads(a_next.params(), 5, 1.0);
  f.clip_grad_norm(1.0), a_next.clip_grad_norm(1.0);
  f.step(1e-3), a_next.step(1e-3);
  for (size_t i = 0; i < init.size(); ++i) CHECK(rel(f.params()[i], a_next.params()[i]) <= 1e-6);
}

namespace {

// Three sharded updates on this rank with the same gradients everywhere: the
// flat gradient of the sharded tensors and the replicated tensors' own.
struct ShardedRun {
  std::vector<at::Tensor> params;
  std::vector<int64_t> in_flight_after_step;
  bool stale_until_synced = true;  // another rank's range kept its old values until sync_parameters()
};

ShardedRun sharded_steps(loongforge::comm::World& world, ShardedOptions sharded) {
  auto ps = make_params(11);
  ShardedAdamW opt(ps, options(), &world, /*tiny_numel=*/16, sharded);
  const auto& l = opt.layout();
  ShardedRun out;
  for (int64_t step = 0; step < 3; ++step) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + static_cast<uint64_t>(step));
    const at::Tensor flat = at::randn({l.total}, gen);
    opt.shard().grad.narrow(0, 0, l.owned()).copy_(flat.narrow(0, l.begin(), l.owned()));
    for (size_t i : l.replicated) ps[i].tensor.mutable_grad() = at::randn(ps[i].tensor.sizes(), gen);
    // The first element of the other rank's range: which parameter, where.
    const int64_t other = l.begin_of(1 - l.rank);
    size_t k = 0;
    while (k + 1 < l.offsets.size() && l.offsets[k + 1] <= other) ++k;
    const at::Tensor watched = ps[l.sharded[k]].tensor.view({-1}).narrow(0, other - l.offsets[k], 1);
    const at::Tensor before = watched.clone();
    opt.step(1e-2);
    out.in_flight_after_step.push_back(opt.gathers_in_flight());
    out.stale_until_synced = out.stale_until_synced && watched.equal(before);
    opt.sync_parameters();
    REQUIRE(opt.gathers_in_flight() == 0);
    REQUIRE_FALSE(watched.equal(before));  // the other rank's update arrived
  }
  for (const auto& p : ps) out.params.push_back(p.tensor.clone());
  return out;
}

}  // namespace

TEST_CASE("optimizer: ShardedAdamW's all-gathers in pieces left in flight equal one blocking all-gather, bitwise") {
 for (const bool fused : {false, true}) {
  CAPTURE(fused);
  std::vector<ShardedRun> blocking(2), pieces(2);
  loongforge::comm::test::two_ranks([&](loongforge::comm::World& world) {
    blocking[world.rank()] = sharded_steps(world, ShardedOptions{/*overlap_gather=*/false, /*gather_piece_numel=*/0, fused});
    pieces[world.rank()] = sharded_steps(world, ShardedOptions{/*overlap_gather=*/true, /*gather_piece_numel=*/37, fused});
  });
  for (int64_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    for (const int64_t n : blocking[r].in_flight_after_step) REQUIRE(n == 0);  // completed inside step()
    for (const int64_t n : pieces[r].in_flight_after_step) REQUIRE(n > 10);    // a rank's ~3300 floats in pieces of 37
    REQUIRE(pieces[r].stale_until_synced);
    for (size_t i = 0; i < pieces[r].params.size(); ++i) {
      CAPTURE(i);
      REQUIRE(pieces[r].params[i].equal(blocking[r].params[i]));
      REQUIRE(pieces[r].params[i].equal(pieces[0].params[i]));  // every rank ends with the same parameters
    }
  }
 }
}

namespace {
// What the reducer does for a sharded optimizer on one rank: the gradients of
// the sharded tensors laid end to end into shard().grad.
void fill_shard(ShardedAdamW& opt) {
  for (const auto& s : opt.layout().segments)
    opt.shard().grad.narrow(0, s.shard_offset, s.numel)
        .copy_(opt.params()[s.param].grad().reshape({-1}).narrow(0, s.param_offset, s.numel));
}
}  // namespace

TEST_CASE("optimizer: the fused ShardedAdamW equals the op-for-op one within 1e-6 per tensor over 100 steps with clipping") {
  const auto init = make_params(5);
  ShardedAdamW plain(clone(init), options(), nullptr, /*tiny_numel=*/16);
  ShardedAdamW fused(clone(init), options(), nullptr, /*tiny_numel=*/16, ShardedOptions{false, 0, /*fused=*/true});
  REQUIRE(fused.skips_nonfinite_on_device());
  REQUIRE_FALSE(plain.skips_nonfinite_on_device());
  double worst_norm = 0;
  for (int64_t s = 0; s < 100; ++s) {
    for (ShardedAdamW* o : {&plain, &fused}) {
      set_grads(o->params(), s, s % 3 == 0 ? 10.0 : 0.1);  // every third step clips
      fill_shard(*o);
    }
    const double np = plain.clip_grad_norm(1.0).item<double>(), nf = fused.clip_grad_norm(1.0).item<double>();
    worst_norm = std::max(worst_norm, std::abs(nf - np) / np);
    plain.step(1e-3 * (1 + s % 7)), fused.step(1e-3 * (1 + s % 7));
  }
  double worst = 0;
  for (size_t i = 0; i < plain.params().size(); ++i) worst = std::max(worst, rel(fused.params()[i], plain.params()[i]));
  const auto sp = plain.state_tensors(), sf = fused.state_tensors();
  REQUIRE(sp.size() == sf.size());
  for (size_t i = 0; i < sp.size(); ++i) worst = std::max(worst, rel(sf[i].second, sp[i].second));
  WARN("measured: max relative difference per tensor " << worst << ", of the clip norm " << worst_norm);
  CHECK(worst_norm <= 1e-6);
  CHECK(worst <= 1e-6);
  CHECK(fused.state_json() == plain.state_json());  // step counts
}

TEST_CASE("optimizer: a non-finite gradient changes nothing in the fused ShardedAdamW, on the device") {
  ShardedAdamW fused(make_params(3), options(), nullptr, /*tiny_numel=*/16, ShardedOptions{false, 0, /*fused=*/true});
  set_grads(fused.params(), 0, 1.0);
  fill_shard(fused);
  fused.clip_grad_norm(1.0);
  fused.step(1e-3);
  const Snapshot before(fused);
  set_grads(fused.params(), 1, 1.0);
  fill_shard(fused);
  fused.shard().grad[5] = std::numeric_limits<float>::infinity();
  REQUIRE_FALSE(std::isfinite(fused.clip_grad_norm(1.0).item<double>()));
  fused.step(1e-3);
  REQUIRE(Snapshot(fused) == before);
}

TEST_CASE("optimizer: a compiled package decides the working copies: none without its list, and a run that cannot "
          "keep its list is refused naming why") {
  loongforge::config::Config cfg;  // precision.bf16_weights: auto
  const auto refused = [&](const WeightsContext& c) {
    try {
      use_bf16_weights(cfg, c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  WeightsContext c;
  c.device = c10::Device(c10::kCUDA, 0), c.bf16 = true, c.fused = true, c.compiled = true;
  // A package of fp32 weights: no copies under auto; `on` is refused naming the compile flag.
  REQUIRE_FALSE(use_bf16_weights(cfg, c));
  cfg.precision.bf16_weights = "on";
  CHECK_THAT(refused(c), Contains("--bf16-weights"));
  // A package of copies runs only with them.
  c.package_bf16 = {"w"};
  c.accumulation = 2;
  CHECK_THAT(refused(c), Contains("the package takes 1 weights as bf16 working copies"));
  CHECK_THAT(refused(c), Contains("without gradient accumulation"));
  c.accumulation = 1, c.multi_rank = true;
  CHECK_THAT(refused(c), Contains("one rank"));
  c.multi_rank = false;
  cfg.precision.bf16_weights = "off";
  CHECK_THAT(refused(c), Contains("precision.bf16_weights is off"));
  cfg.precision.bf16_weights = "auto";
  c.fused = false;
  CHECK_THAT(refused(c), Contains("optimizer.implementation is plain"));
  c.fused = true;
#if LOONGFORGE_WITH_CUDA_KERNELS
  REQUIRE(use_bf16_weights(cfg, c));
#else
  CHECK_THAT(refused(c), Contains("no LoongForge CUDA kernels"));
#endif
  c.device = c10::kCPU;
  CHECK_THAT(refused(c), Contains("does not compute in bf16 autocast on a GPU"));
}

TEST_CASE("optimizer: a package's list of working copies is taken as it is, and a weight it lists that another "
          "layer than a linear one reads, or that the model lacks, is refused by name") {
  loongforge::model::Model net =
      loongforge::model::Model::load(std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", c10::kCPU);
  const loongforge::model::Mdg mdg = net.dependency_graph();
  const auto copies = [](const std::vector<OptimizedParam>& ps) {
    std::vector<std::string> out;
    for (const auto& p : ps)
      if (p.bf16_weight) out.push_back(p.name);
    return out;
  };
  const auto by_rule = copies(trainable_params(net, mdg, true));  // the MDG's linear-only weights
  REQUIRE(by_rule.size() > 2);
  REQUIRE(copies(trainable_params(net, mdg, true, {by_rule[1], by_rule[0]})) ==
          std::vector<std::string>{by_rule[0], by_rule[1]});  // exactly the list, in parameter order
  const auto refused = [&](const std::vector<std::string>& only) {
    try {
      trainable_params(net, mdg, true, only);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(refused({"connector.norm.weight"}), Contains("'connector.norm.weight' as a bf16 working copy, but layers "
                                                           "other than linear ones read it"));
  CHECK_THAT(refused({"no.such.weight"}), Contains("has no trainable parameter of that name"));
}

namespace {
// Three steps of 2 micro-batches through GCTS's reducer (hybrid) into a
// ShardedAdamW, each rank with its own data; `foreign`: at step 1 one sharded
// parameter's .grad is replaced by a copy, as the compiled runner's graph
// outputs do (Note [Gradient views]).
struct ViewRun {
  std::vector<at::Tensor> params;
  bool grad_is_local = false;        // one rank: the optimizer's shard is the flat gradient buffer itself
  bool backward_wrote_local = true;  // every sharded .grad pointed into shard().local after backward
};

// GCTS's reducer (hybrid, buckets small enough for several) in front of `opt`, whose parameters are `ps`.
std::unique_ptr<loongforge::comm::GradientReducer> hybrid_reducer(loongforge::comm::World* world,
                                                                  const std::vector<OptimizedParam>& ps,
                                                                  ShardedAdamW& opt) {
  std::vector<loongforge::comm::ReducedParam> meta;
  for (const auto& p : ps) meta.push_back({p.name, p.tensor.sizes().vec(), p.tensor.numel(), false, -1});
  loongforge::config::Config cfg;
  cfg.gcts.enable = true, cfg.gcts.comm_strategy = "hybrid", cfg.gcts.bucket_mb = 0.002, cfg.gcts.first_bucket_mb = 0.0005;
  return loongforge::gcts::make_reducer(cfg, world, meta, &opt.shard(), /*overlap=*/false);
}

ViewRun view_steps(loongforge::comm::World* world, bool views, bool foreign) {
  auto ps = make_params(21);
  for (auto& p : ps) p.tensor.requires_grad_(true);
  ShardedOptions o;
  o.gradient_views = views;
  ShardedAdamW opt(ps, options(), world, /*tiny_numel=*/16, o);
  auto reducer = hybrid_reducer(world, ps, opt);
  loongforge::comm::test::NoPhases phases;
  const int64_t rank = world ? world->rank() : 0;
  ViewRun out;
  out.grad_is_local = opt.shard().grad.is_same(opt.shard().local);
  for (int64_t step = 0; step < 3; ++step) {
    reducer->begin_step(opt.params(), 2);
    for (int64_t micro = 0; micro < 2; ++micro) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(300 + static_cast<uint64_t>(step * 10 + micro + 100 * rank));
      at::Tensor loss = at::zeros({});
      for (const auto& p : opt.params()) loss = loss + (p.tanh() * at::randn(p.sizes(), gen)).sum();
      loss.backward();
    }
    if (foreign && step == 1) {
      at::Tensor& p = const_cast<at::Tensor&>(opt.params()[opt.layout().sharded[2]]);
      p.mutable_grad() = p.grad().clone();
    }
    const auto& l = opt.layout();
    for (size_t k = 0; k < l.sharded.size(); ++k)
      out.backward_wrote_local = out.backward_wrote_local && opt.shard().is_view_grad(k, opt.params()[l.sharded[k]].grad());
    reducer->average_gradients(opt.params(), phases, step);
    opt.clip_grad_norm(1.0);
    opt.step(1e-2);
  }
  for (const auto& p : ps) out.params.push_back(p.tensor.detach().clone());
  return out;
}

void require_equal(const ViewRun& a, const ViewRun& b) {
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a.params[i].equal(b.params[i]));
  }
}
}  // namespace

TEST_CASE("optimizer: gradients as views into the sharded optimizer's flat buffer update bitwise as packed copies, at 1 and 2 ranks") {
  for (const bool foreign : {false, true}) {
    CAPTURE(foreign);
    const ViewRun copies = view_steps(nullptr, /*views=*/false, foreign);
    const ViewRun views = view_steps(nullptr, /*views=*/true, foreign);
    REQUIRE(views.grad_is_local);
    REQUIRE(views.backward_wrote_local == !foreign);  // backward accumulated straight into the flat buffer
    REQUIRE_FALSE(copies.backward_wrote_local);
    require_equal(views, copies);
    std::vector<ViewRun> c2(2), v2(2);
    loongforge::comm::test::two_ranks([&](loongforge::comm::World& world) {
      c2[world.rank()] = view_steps(&world, false, foreign);
      v2[world.rank()] = view_steps(&world, true, foreign);
    });
    for (int64_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      REQUIRE_FALSE(v2[r].grad_is_local);  // two ranks: the averaged range is a buffer of its own
      REQUIRE(v2[r].backward_wrote_local == !foreign);
      require_equal(v2[r], c2[r]);
      require_equal(v2[r], v2[0]);
    }
  }
}

namespace {
// Three steps of 2 micro-batches, with the same data on every rank (so the
// average over ranks is each rank's own gradient, exactly), through `step`:
// the parameters after them, and whether every gradient was zero (or
// undefined) whenever a backward began.
struct BorrowRun {
  std::vector<at::Tensor> params;
  bool zero_before_backward = true;
  std::vector<int64_t> in_flight_after_step;
  bool step_refused_before_sync = false;  // a second step() with the gathers still in flight
};

BorrowRun borrow_steps(const std::vector<at::Tensor>& params, const std::function<void(int64_t)>& begin,
                       const std::function<void(int64_t)>& finish) {
  BorrowRun out;
  for (int64_t step = 0; step < 3; ++step) {
    begin(step);
    for (const auto& p : params)
      out.zero_before_backward = out.zero_before_backward && (!p.grad().defined() || p.grad().eq(0).all().item<bool>());
    for (int64_t micro = 0; micro < 2; ++micro) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(700 + static_cast<uint64_t>(step * 10 + micro));
      at::Tensor loss = at::zeros({});
      for (const auto& p : params) loss = loss + (p.tanh() * at::randn(p.sizes(), gen)).sum();
      loss.backward();
    }
    finish(step);
  }
  for (const auto& p : params) out.params.push_back(p.detach().clone());
  return out;
}
}  // namespace

TEST_CASE("optimizer: at 2 ranks the sharded AdamW's all-gathers borrow the gradients' memory and still update bitwise "
          "as the plain AdamW, with every gradient zero again before the next backward, and a step before "
          "sync_parameters() is refused") {
  auto plain_params = make_params(29);
  for (auto& p : plain_params) p.tensor.requires_grad_(true);
  AdamW plain(plain_params, options());
  const BorrowRun expected = borrow_steps(plain.params(), [](int64_t) {}, [&](int64_t) {
    plain.clip_grad_norm(0.0);
    plain.step(1e-2);
  });
  for (const bool views : {true, false})
    for (const bool overlap : {true, false}) {
      CAPTURE(views);
      CAPTURE(overlap);
      std::vector<BorrowRun> runs(2);
      std::vector<int64_t> buffers(2), chunks(2), pieces(2);
      loongforge::comm::test::two_ranks([&](loongforge::comm::World& world) {
        auto ps = make_params(29);
        for (auto& p : ps) p.tensor.requires_grad_(true);
        ShardedOptions o;
        o.overlap_gather = overlap, o.gather_piece_numel = 37, o.gradient_views = views;
        ShardedAdamW opt(ps, options(), &world, /*tiny_numel=*/16, o);
        auto reducer = hybrid_reducer(&world, ps, opt);
        loongforge::comm::test::NoPhases phases;
        BorrowRun& run = runs[world.rank()];
        run = borrow_steps(
            opt.params(),
            [&](int64_t) {
              opt.sync_parameters();  // as the trainer, before the forward
              reducer->begin_step(opt.params(), 2);
            },
            [&](int64_t step) {
              reducer->average_gradients(opt.params(), phases, step);
              opt.clip_grad_norm(0.0);
              opt.step(1e-2);
              run.in_flight_after_step.push_back(opt.gathers_in_flight());
            });
        try {
          if (overlap) opt.step(1e-2);
        } catch (const std::logic_error&) {
          run.step_refused_before_sync = true;
        }
        opt.sync_parameters();
        for (size_t i = 0; i < ps.size(); ++i) run.params[i] = ps[i].tensor.detach().clone();
        buffers[world.rank()] = opt.buffer_bytes();
        chunks[world.rank()] = opt.layout().chunk;
        pieces[world.rank()] = (opt.layout().chunk + 36) / 37;
      });
      for (int64_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        for (const int64_t n : runs[r].in_flight_after_step) REQUIRE((n > 0) == overlap);
        REQUIRE(runs[r].zero_before_backward);
        REQUIRE(runs[r].step_refused_before_sync == overlap);
        REQUIRE(runs[r].params.size() == expected.params.size());
        for (size_t i = 0; i < expected.params.size(); ++i) {
          CAPTURE(i);
          REQUIRE(runs[r].params[i].equal(expected.params[i]));
        }
        // Note [Borrowed gather buffers]: the send buffer is the gradient shard (padded to whole
        // pieces); the receive buffer lies in the flat gradient buffer, past it only its padding.
        const int64_t shard = pieces[r] * 37, receive = 2 * pieces[r] * 37;
        CHECK(buffers[r] == 4 * (views ? shard + (receive - 2 * chunks[r]) : shard + receive));
      }
    }
}

TEST_CASE("optimizer: the memory each optimizer reports is its moments, 8 bytes per element at one rank, and "
          "besides them the sharded one's masters and communication buffers") {
  const auto init = make_params(7);
  int64_t elements = 0;
  for (const auto& p : init) elements += p.tensor.numel();
  AdamW plain(clone(init), options());
  FusedAdamW fused(clone(init), options());
  ShardedAdamW sharded(clone(init), options(), nullptr, /*tiny_numel=*/16);  // one rank: the whole range
  CHECK(plain.state_bytes() == 8 * elements);
  CHECK(fused.state_bytes() == 8 * elements);
  CHECK(sharded.state_bytes() == 8 * elements);
  CHECK(plain.buffer_bytes() == 0);
  CHECK(fused.buffer_bytes() == 0);
  CHECK(sharded.buffer_bytes() == 0);  // one rank with gradient views: the shard is the gradients' flat buffer
  // Without views the shard is a buffer of its own: 4 bytes per sharded element.
  ShardedAdamW packed(clone(init), options(), nullptr, 16, ShardedOptions{false, 0, false, /*gradient_views=*/false});
  CHECK(packed.buffer_bytes() == 4 * packed.layout().total);
  // Working copies add their fp32 masters: 4 bytes per copied element (the {64, 32} weight here).
  auto with_copy = clone(init);
  with_copy[0].bf16_weight = true;
  ShardedAdamW copies(with_copy, options(), nullptr, 16);
  CHECK(copies.buffer_bytes() == 4 * 64 * 32);
  // Two ranks, the all-gather in pieces of 100 elements per rank: the gradient shard, which is also the
  // send buffer (padded to whole pieces), and of the receive buffer (every rank's rows of every piece)
  // only what exceeds the flat gradient buffer it lies in (Note [Borrowed gather buffers]).
  std::vector<int64_t> buffers(2), chunk(2), pieces(2);
  loongforge::comm::test::two_ranks([&](loongforge::comm::World& world) {
    ShardedAdamW two(clone(init), options(), &world, 16, ShardedOptions{true, 100, false, true});
    const int64_t c = two.layout().chunk;
    buffers[world.rank()] = two.buffer_bytes();
    chunk[world.rank()] = c;
    pieces[world.rank()] = (c + 99) / 100;
    CHECK(two.state_bytes() < 8 * elements * 3 / 4);  // about half the moments, and the replicated ones
    CHECK(two.state_bytes() + two.buffer_bytes() < 8 * elements);  // less than one rank's moments alone
  });
  for (int64_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(buffers[r] == 4 * (pieces[r] * 100 + (2 * pieces[r] * 100 - 2 * chunk[r])));
  }
}

TEST_CASE("optimizer: the plain AdamW refuses bf16 working copies by the key's name, the fused one off a GPU, and the "
          "sharded one keeps them on any device") {
  const std::vector<OptimizedParam> p = {{"w", at::ones({2, 2}).requires_grad_(true), true, true}};
  const auto refused = [](const std::function<void()>& make) {
    try {
      make();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(refused([&] { AdamW(p, {}); }), Contains("precision.bf16_weights: 'w'"));
  CHECK_THAT(refused([&] { FusedAdamW(p, {}); }), Contains("contiguous fp32 parameters on a GPU"));
  ShardedAdamW sharded(p, {}, nullptr, 0);
  REQUIRE(sharded.working_copies().count == 1);
  REQUIRE(sharded.working_copies().fp32_gradients);
  REQUIRE(p[0].tensor.scalar_type() == at::kBFloat16);  // the parameter itself is the copy
  REQUIRE(sharded.master_weight(p[0].tensor).scalar_type() == at::kFloat);
}

namespace {
// Three steps of 2 micro-batches through GCTS's reducer (hybrid) into a
// ShardedAdamW, each rank with its own data, where two of every three
// parameters are read in bf16: as bf16 working copies (`copies`), or as fp32
// weights cast to bf16 in the forward (as autocast casts them).
struct CopyRun {
  std::vector<at::Tensor> values;  // master_weight of every parameter
  std::vector<at::Tensor> state;
  Optimizer::WorkingCopies copies;
  bool rounded = true;  // after every step each copy was its master rounded to bf16
};

bool read_in_bf16(size_t i) { return i % 3 != 1; }

CopyRun copy_steps(loongforge::comm::World* world, bool copies, ShardedOptions o) {
  auto ps = make_params(23);
  for (size_t i = 0; i < ps.size(); ++i) {
    ps[i].tensor.requires_grad_(true);
    ps[i].bf16_weight = copies && read_in_bf16(i);
  }
  ShardedAdamW opt(ps, options(), world, /*tiny_numel=*/16, o);
  auto reducer = hybrid_reducer(world, ps, opt);
  loongforge::comm::test::NoPhases phases;
  const int64_t rank = world ? world->rank() : 0;
  CopyRun out;
  out.copies = opt.working_copies();
  for (int64_t step = 0; step < 3; ++step) {
    reducer->begin_step(opt.params(), 2);
    for (int64_t micro = 0; micro < 2; ++micro) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(500 + static_cast<uint64_t>(step * 10 + micro + 100 * rank));
      at::Tensor loss = at::zeros({});
      for (size_t i = 0; i < opt.params().size(); ++i) {
        const at::Tensor& p = opt.params()[i];
        const at::Tensor w = read_in_bf16(i) ? p.to(at::kBFloat16) : p;  // a copy is bf16 already: no cast
        loss = loss + (w.tanh() * at::randn(p.sizes(), gen).to(w.scalar_type())).sum().to(at::kFloat);
      }
      loss.backward();
    }
    reducer->average_gradients(opt.params(), phases, step);
    opt.clip_grad_norm(step == 1 ? 0.5 : 0.0);  // step 2 clips
    opt.step(1e-2);
    opt.sync_parameters();
    for (const auto& p : opt.params())
      if (p.scalar_type() == at::kBFloat16) out.rounded = out.rounded && p.equal(opt.master_weight(p).to(at::kBFloat16));
  }
  for (const auto& p : opt.params()) out.values.push_back(opt.master_weight(p).detach().clone());
  for (const auto& [name, t] : opt.state_tensors()) out.state.push_back(t.clone());
  return out;
}

void require_same_numbers(const CopyRun& copies, const CopyRun& casts) {
  REQUIRE(copies.copies.count == 13);  // read_in_bf16: 13 of the 20 parameters
  REQUIRE(copies.copies.fp32_gradients);
  REQUIRE(casts.copies.count == 0);
  REQUIRE(copies.rounded);
  for (size_t i = 0; i < casts.values.size(); ++i) {
    CAPTURE(i);
    REQUIRE(copies.values[i].scalar_type() == at::kFloat);
    REQUIRE(copies.values[i].equal(casts.values[i]));
  }
  for (size_t k = 0; k < casts.state.size(); ++k) REQUIRE(copies.state[k].equal(casts.state[k]));
}
}  // namespace

TEST_CASE("optimizer: the sharded AdamW's bf16 working copies give masters and moments bitwise those of fp32 weights "
          "cast to bf16, at 1 and 2 ranks, fused or op for op, with gradient views or without") {
  for (const bool fused : {false, true})
    for (const bool views : {true, false}) {
      CAPTURE(fused);
      CAPTURE(views);
      ShardedOptions o;
      o.overlap_gather = true, o.gather_piece_numel = 37, o.fused = fused, o.gradient_views = views;
      require_same_numbers(copy_steps(nullptr, true, o), copy_steps(nullptr, false, o));
      std::vector<CopyRun> copies(2), casts(2);
      loongforge::comm::test::two_ranks([&](loongforge::comm::World& world) {
        copies[world.rank()] = copy_steps(&world, true, o);
        casts[world.rank()] = copy_steps(&world, false, o);
      });
      for (int64_t r = 0; r < 2; ++r) {
        CAPTURE(r);
        require_same_numbers(copies[r], casts[r]);
        for (size_t i = 0; i < copies[r].values.size(); ++i) REQUIRE(copies[r].values[i].equal(copies[0].values[i]));
      }
    }
}

TEST_CASE("optimizer: autograd sums a bf16 copy's gradients of several backward passes into an fp32 .grad bit for bit "
          "as the fp32-weight path does, where a bf16 .grad rounds them") {
  at::manual_seed(5);
  const at::Tensor w = at::randn({64, 96});
  std::vector<at::Tensor> micro_batches;
  for (int k = 0; k < 4; ++k) micro_batches.push_back(at::randn({16, 96}).to(at::kBFloat16));
  const auto backward_all = [&](const std::function<at::Tensor()>& weight) {
    for (const auto& x : micro_batches) at::linear(x, weight()).to(at::kFloat).square().sum().backward();
  };
  // The fp32-weight path: the forward reads a bf16 cast (as autocast's), whose backward upcasts the gradient.
  const at::Tensor fp32_weight = w.clone().requires_grad_(true);
  backward_all([&] { return fp32_weight.to(at::kBFloat16); });
  // A bf16 working copy whose .grad is an fp32 tensor from the start (CopyGradients::fp32).
  const at::Tensor copy = w.to(at::kBFloat16).requires_grad_(true);
  copy.mutable_grad() = at::zeros_like(w);
  const at::Tensor kept = copy.grad();
  backward_all([&] { return copy; });
  REQUIRE(copy.grad().scalar_type() == at::kFloat);
  REQUIRE(copy.grad().is_same(kept));  // added in place, never replaced
  REQUIRE(copy.grad().equal(fp32_weight.grad()));
  // The same copy with autograd's own bf16 .grad: each partial sum is rounded to bf16.
  const at::Tensor rounded = w.to(at::kBFloat16).requires_grad_(true);
  backward_all([&] { return rounded; });
  REQUIRE(rounded.grad().scalar_type() == at::kBFloat16);
  const int64_t differ = rounded.grad().to(at::kFloat).ne(fp32_weight.grad()).sum().item<int64_t>();
  INFO(differ << " of " << w.numel() << " elements of the bf16 sum differ from the fp32 one");
  REQUIRE(differ > 0);
}
