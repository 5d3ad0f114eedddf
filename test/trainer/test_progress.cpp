// What a run reports as its speed (Note [Steady state] in src/trainer/progress.cpp):
// the steady state's median and data-wait share, unaffected by a slow first
// step, and the whole-run mean only as a labelled second figure; and the
// allocator's own fields (MLA's) among a record's scalars, after the others.
#include <cmath>  // std::abs
#include <vector>

#include "catch_compat.hpp"
#include "loongforge/trainer/progress.hpp"

using namespace loongforge::trainer;

namespace {
bool near(double a, double b, double rel) { return std::abs(a - b) <= rel * std::abs(b); }

// A run of n steps of 32 samples at step_ms each (data wait wait_ms), whose first step took first_ms.
std::vector<StepRecord> run_of(int n, double first_ms, double step_ms, double wait_ms) {
  std::vector<StepRecord> h;
  for (int i = 1; i <= n; ++i) {
    StepRecord r;
    r.step = i;
    r.step_ms = i == 1 ? first_ms : step_ms + (i % 3) * 0.5;  // a little jitter
    r.data_wait_ms = i == 1 ? first_ms * 0.6 : wait_ms;
    r.samples_per_s = 32.0 / (r.step_ms / 1000.0);
    r.mfu = 0.24 * step_ms / r.step_ms;
    h.push_back(r);
  }
  return h;
}
}  // namespace

TEST_CASE("progress: a 24 s first step changes neither the steady throughput nor its data-wait share") {
  const auto slow = run_of(100, 24000.0, 250.0, 4.0);
  const auto fast = run_of(100, 250.0, 250.0, 4.0);
  const SteadyState a = steady_state(slow), b = steady_state(fast);
  REQUIRE(a.warmup_steps == 10);
  REQUIRE(a.from_step == 11);
  REQUIRE(a.steps == 90);
  REQUIRE(a.samples_per_s == b.samples_per_s);
  REQUIRE(a.data_wait_fraction == b.data_wait_fraction);
  REQUIRE(near(a.samples_per_s, 32.0 / 0.2505, 1e-9));  // the median step: 250.5 ms
  REQUIRE(near(a.data_wait_fraction, 4.0 / 250.5, 1e-9));
  // The whole-run mean is what the old summary printed: the first step drags it far down.
  const WholeRunMean m = whole_run_mean(slow, 32);
  REQUIRE(m.samples_per_s < 0.6 * a.samples_per_s);
  REQUIRE(m.data_wait_fraction > 0.25);
}

TEST_CASE("progress: the warm-up is 10% of the records, at least 1 and at most 50, and leaves one record") {
  REQUIRE(steady_state({}).steps == 0);
  REQUIRE(steady_state(run_of(1, 100.0, 100.0, 0.0)).warmup_steps == 0);
  REQUIRE(steady_state(run_of(2, 100.0, 100.0, 0.0)).warmup_steps == 1);
  REQUIRE(steady_state(run_of(9, 100.0, 100.0, 0.0)).warmup_steps == 1);
  REQUIRE(steady_state(run_of(25, 100.0, 100.0, 0.0)).warmup_steps == 3);
  REQUIRE(steady_state(run_of(5000, 100.0, 100.0, 0.0)).warmup_steps == 50);
}

TEST_CASE("progress: the median ignores a checkpoint stall inside the window") {
  auto h = run_of(60, 250.0, 250.0, 2.0);
  h[40].step_ms = 9000.0, h[40].samples_per_s = 32.0 / 9.0;  // one stalled step
  const SteadyState s = steady_state(h);
  REQUIRE(near(s.samples_per_s, 32.0 / 0.2505, 1e-9));
}

TEST_CASE("progress: the allocator's fields follow the others under memory/, and none without them") {
  StepRecord r;
  r.loss = 0.5;
  const auto plain = scalars_of(r);
  r.memory_scalars = {{"mla_fragmentation", 0.02}, {"mla_cuda_malloc_after_step_1", 0}};
  const auto with = scalars_of(r);
  REQUIRE(with.size() == plain.size() + 2);
  REQUIRE(with[plain.size()].first == "memory/mla_fragmentation");
  REQUIRE(with[plain.size()].second == 0.02);
  REQUIRE(with.back().first == "memory/mla_cuda_malloc_after_step_1");
  for (const auto& [tag, value] : plain) REQUIRE(tag.rfind("memory/mla_", 0) != 0);
}
