// The compiled step's dropout draws under CUDA-graph replay (GPU only, labels
// gpu long: the test exports gr00t-n1.7-tiny with its head's default dropout
// 0.2 and compiles its fp32 CUDA package, a minute or two). The runner seeds
// the default CUDA generator with the micro-batch's draw_seed before each
// package call and replay (Note [Micro-step draws] in
// src/fusion/step_runner.cpp), so on one fixed batch and fixed weights:
// two replays at different steps give different losses and gradients (other
// masks: more than 1e-4 apart), replays at the same step give the same loss
// bit for bit (gradients within 1e-6: a backward may add with atomics), and
// an uncaptured package call at that step gives the replay's loss within
// 1e-6 (a replay draws what a call draws).
#include <cmath>    // std::abs
#include <cstdio>   // std::printf
#include <cstdlib>  // std::system
#include <filesystem>  // std::filesystem::temp_directory_path
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/ATen.h>  // at::Tensor

#include "catch_compat.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"

using namespace loongforge;

namespace {

struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};

constexpr int64_t kMicro = 4;
constexpr uint64_t kSeed = 42;

void run_or_fail(const std::string& cmd) {
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
}

struct Result {
  double loss;
  double grads;  // the sum of every gradient's absolute values (float64)
};

// One step `s` of the fixed batch; .grad is cleared afterwards (the optimizer's part in the trainer).
Result step(fusion::StepRunner& runner, model::Model& net, const data::ReadyBatch& batch, int64_t s) {
  std::vector<data::ReadyBatch> bs{batch};
  bs[0].draw_seed = fusion::draw_seed(kSeed, s, 0, 0);
  NoPhases phases;
  const double loss = runner.run(bs, {1.0}, s, phases).item<double>();
  double grads = 0;
  for (const auto& p : net.parameters()) {
    if (!p.info->trainable || !p.tensor.grad().defined()) continue;
    grads += p.tensor.grad().to(at::kDouble).abs().sum().item<double>();
    p.tensor.mutable_grad() = at::Tensor();
  }
  return {loss, grads};
}

}  // namespace

TEST_CASE("replays at different steps draw other dropout masks, at the same step the same as a call") {
  const std::string dir = (std::filesystem::temp_directory_path() / "loongforge_compiled_draws").string();
  std::filesystem::create_directories(dir);
  const std::string py = std::string(LOONGFORGE_PYTHON) + " " + LOONGFORGE_SOURCE_DIR + "/scripts/";
  const std::string model_file = dir + "/gr00t-n1.7-tiny.pt", package = dir + "/step.pt2";
  run_or_fail(py + "model/export.py --config gr00t-n1.7-tiny --out " + model_file + " > " + dir + "/export.log");
  run_or_fail(py + "compile_step.py " + model_file + " --batch-size " + std::to_string(kMicro) +
              " --device cuda --precision fp32 --out " + package);

  const at::Device cuda(at::kCUDA, 0);
  model::Model net = model::Model::load(model_file, cuda);
  net.train();
  data::ReadyBatch batch;
  for (auto& [key, t] : model::make_example_batch(net.info(), kMicro, 7)) batch.tensors[key] = t.to(cuda);

  auto graphed = fusion::make_compiled_runner(net, {package}, false, fusion::GraphMode::required, cuda);
  for (int64_t s = 0; s < 3; ++s) step(*graphed, net, batch, s);  // the uncaptured warm-up calls
  const Result a = step(*graphed, net, batch, 10);  // captured, then replayed
  const Result b = step(*graphed, net, batch, 11);
  const Result a2 = step(*graphed, net, batch, 10);
  const nlohmann::json st = graphed->status();
  INFO(st.dump());
  REQUIRE(st.at("captures").get<int64_t>() == 1);
  REQUIRE(st.at("replays").get<int64_t>() == 3);
  REQUIRE(st.at("capture_failures").get<int64_t>() == 0);  // every call after the warm-up replayed

  auto called = fusion::make_compiled_runner(net, {package}, false, fusion::GraphMode::off, cuda);
  const Result c = step(*called, net, batch, 10);
  std::printf("replay step 10: loss %.9g grads %.9g; step 11: %.9g %.9g; step 10 again: %.9g %.9g; "
              "call step 10: %.9g %.9g\n", a.loss, a.grads, b.loss, b.grads, a2.loss, a2.grads, c.loss, c.grads);
  CHECK(a.loss == a2.loss);
  CHECK(std::abs(a.grads - a2.grads) <= 1e-6 * std::abs(a.grads));  // a backward may add with atomics
  CHECK(std::abs(a.loss - b.loss) > 1e-4 * std::abs(a.loss));
  CHECK(std::abs(a.grads - b.grads) > 1e-4 * std::abs(a.grads));
  CHECK(std::abs(a.loss - c.loss) <= 1e-6 * std::abs(a.loss));
  CHECK(std::abs(a.grads - c.grads) <= 1e-5 * std::abs(a.grads));
}
