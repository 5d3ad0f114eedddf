// make_step_runner's wrapper for a compiled package (with_package_status,
// include/loongforge/fusion/step_runner.hpp) adds "package" to the status and
// forwards everything else. It once dropped bf16_weights(): a package compiled
// with --bf16-weights then ran with fp32 weights and failed at its first
// matrix product (gr00t-n1.7-3b on an H100, 2026-12-06).
#include <optional>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "loongforge/fusion/step_runner.hpp"

using namespace loongforge;

namespace {
struct FakeRunner final : fusion::StepRunner {
  bool gradients_asked = false;
  at::Tensor run(std::vector<data::ReadyBatch>&, const std::vector<double>&, int64_t,
                 PhaseRecorder&) override {
    return at::ones({});
  }
  nlohmann::json status() const override { return {{"calls", 3}}; }
  bool set_graph_reduction(fusion::GraphReduction*) override { return true; }
  bool make_gradients(bool allowed) override { return gradients_asked = allowed; }
  std::optional<double> take_graph_comm_ms(int64_t step) override { return static_cast<double>(step); }
  std::vector<std::string> bf16_weights() const override { return {"a.weight", "b.weight"}; }
};
}  // namespace

TEST_CASE("compiled step: the package's runner names its package and passes on everything else of the runner") {
  auto fake = std::make_unique<FakeRunner>();
  FakeRunner* inner = fake.get();
  const auto runner = fusion::with_package_status(std::move(fake), {{"path", "/p/step.pt2"}});
  REQUIRE(runner->status() == nlohmann::json{{"calls", 3}, {"package", {{"path", "/p/step.pt2"}}}});
  REQUIRE(runner->bf16_weights() == std::vector<std::string>{"a.weight", "b.weight"});
  REQUIRE(runner->set_graph_reduction(nullptr));
  REQUIRE(runner->make_gradients(true));
  REQUIRE(inner->gradients_asked);
  REQUIRE(runner->take_graph_comm_ms(7) == 7.0);
}
