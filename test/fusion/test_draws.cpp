// The seed of a micro-step's draws (fusion::draw_seed, fusion::seed_draws;
// Note [Micro-step draws] in src/fusion/step_runner.cpp): it is the formula
// docs/training-semantics.md s4 states (values computed from that text in
// Python), it changes with each of (run seed, step, micro-batch, rank), and
// seeding the CPU generator with it makes the next draws a function of the
// seed alone, whatever was drawn before.
#include <ATen/ATen.h>  // at::rand

#include "catch_compat.hpp"
#include "loongforge/fusion/step_runner.hpp"

using namespace loongforge;

TEST_CASE("draw_seed is the documented SplitMix64 of (seed, step, micro-batch, rank)") {
  CHECK(fusion::draw_seed(42, 0, 0, 0) == 0x1b5ef32be528b9b9ull);
  CHECK(fusion::draw_seed(42, 299, 3, 7) == 0x5aa0fff2e709b05full);
  const uint64_t base = fusion::draw_seed(42, 5, 1, 0);
  CHECK(fusion::draw_seed(43, 5, 1, 0) != base);
  CHECK(fusion::draw_seed(42, 6, 1, 0) != base);
  CHECK(fusion::draw_seed(42, 5, 2, 0) != base);
  CHECK(fusion::draw_seed(42, 5, 1, 1) != base);
  CHECK(fusion::draw_seed(42, 5, 1, 0) == base);
}

TEST_CASE("seed_draws makes the CPU generator's next draws a function of the seed alone") {
  const c10::Device cpu(c10::kCPU);
  fusion::seed_draws(fusion::draw_seed(42, 5, 1, 0), cpu);
  const at::Tensor a = at::rand({64});
  (void)at::randn({100});  // the rest of a forward's draws
  fusion::seed_draws(fusion::draw_seed(42, 5, 1, 0), cpu);
  CHECK(at::equal(at::rand({64}), a));
  fusion::seed_draws(fusion::draw_seed(42, 6, 1, 0), cpu);
  CHECK(!at::equal(at::rand({64}), a));
}
