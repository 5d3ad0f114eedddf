// Proves the fused optimizer computes the plain one's update: FusedAdamW
// (ATen's multi-tensor kernels) against AdamW (docs/training-semantics.md s5)
// in fp32 on the CPU over 100 steps with clipping, a non-finite gradient that
// must change nothing, and checkpoint state that moves between the two.
#include <cmath>   // std::isnan
#include <limits>  // std::numeric_limits

#include <ATen/ATen.h>              // at::randn
#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl

#include "catch_compat.hpp"
#include "loongforge/trainer/optimizer.hpp"

using namespace loongforge::trainer;

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
  std::vector<at::Tensor> before;
  for (const auto& p : fused.params()) before.push_back(p.clone());
  for (const auto& t : fused.state_tensors()) before.push_back(t.second.clone());
  const auto steps_before = fused.state_json();

  set_grads(fused.params(), 1, 1.0);
  const_cast<at::Tensor&>(fused.params()[4]).mutable_grad()[3] = std::numeric_limits<float>::quiet_NaN();
  REQUIRE(std::isnan(fused.clip_grad_norm(1.0).item<double>()));
  fused.step(1e-3);
  size_t k = 0;
  for (const auto& p : fused.params()) REQUIRE(at::equal(p, before[k++]));
  for (const auto& t : fused.state_tensors()) REQUIRE(at::equal(t.second, before[k++]));
  REQUIRE(fused.state_json() == steps_before);
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
