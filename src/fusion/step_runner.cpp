// The plain StepRunner: the reference trainer's loop, micro-batch by
// micro-batch (step_runner.hpp).
#include "loongforge/fusion/step_runner.hpp"

#include <cstdlib>  // std::getenv
#include <string>   // std::string

#include <mutex>    // std::lock_guard

#include <ATen/ATen.h>           // at::Tensor, at::globalContext
#include <ATen/autocast_mode.h>  // at::autocast::set_autocast_enabled
#include <c10/util/Exception.h>  // c10::OutOfMemoryError

#include "runner_common.hpp"

namespace loongforge::fusion {

// Note [Micro-step draws]
// What a micro-step's forward draws itself - dropout masks, and a GR00T
// head's state_drop / state_noise when the batch lacks them - comes from
// the default generator of the batch's device, which every runner sets to
// the micro-batch's draw_seed (offset 0) just before its forward: an eager
// forward, a compiled package call, or a CUDA-graph replay (a replay reads
// the generator's seed and Philox offset then: at::cuda::CUDAGraph::replay's
// replay_prologue, so it draws what an uncaptured call would). The draws are
// then a pure function of (run.seed, step, micro-batch, rank): a resume
// reproduces them without any generator state, and the plain, graphed and
// compiled runners each draw per micro-batch, not along one stream of the
// run. A mask covers a micro-batch, not a sample: another world size or
// accumulation gives other masks of the same distribution
// (docs/training-semantics.md s4). The compiled package draws its masks
// with other generator calls than the TorchScript forward (its own order
// and ops: compiled_runner.cpp, Note [Compiled step draws]), so the two
// runners' masks are equal in distribution, not in value.
uint64_t draw_seed(uint64_t run_seed, int64_t step, int64_t micro, int64_t rank) {
  constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  constexpr uint64_t kSalt = 0x4452415753454544ull;  // "DRAWSEED"
  const uint64_t index =
      (static_cast<uint64_t>(step) * 65536 + static_cast<uint64_t>(micro)) * 65536 + static_cast<uint64_t>(rank);
  uint64_t z = (run_seed ^ kSalt) + index * kGolden + kGolden;  // SplitMix64's first output from that state
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFull;
}

void seed_draws(uint64_t seed, c10::Device device) {
  at::Generator g = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(g.mutex());
  g.set_current_seed(seed);  // CUDA: Philox offset 0 as well
}

// Shared runner pieces (runner_common.hpp).
AutocastScope::AutocastScope(bool enable) : on(enable) {
  if (on) {
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
}

AutocastScope::~AutocastScope() {
  if (on) {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
}

Fault::Fault() {
  const char* v = std::getenv("LOONGFORGE_TEST_FAULT");
  if (!v) return;
  const std::string s = v;
  const auto at = s.find('@');
  if (at == std::string::npos) return;
  phase = s.substr(0, at);
  step = std::stoll(s.substr(at + 1));
}

void Fault::maybe_raise(const char* where, int64_t step_1based) const {
  if (step_1based == step && phase == where)
    TORCH_CHECK_WITH(OutOfMemoryError, false, "injected by LOONGFORGE_TEST_FAULT: out of memory in ", where,
                     " at step ", step_1based);
}

at::Tensor eager_micro_step(model::Model& net, bool bf16, const Fault& fault, const model::Batch& batch,
                            uint64_t draw_seed, double w, int64_t step, int64_t micro, PhaseRecorder& phases) {
  at::Tensor loss;
  {
    Phase p(phases, "forward", step + 1, micro);
    fault.maybe_raise("forward", step + 1);
    seed_draws(draw_seed, batch.begin()->second.device());
    AutocastScope autocast(bf16);
    loss = net.forward(batch).at("loss");
  }
  Phase p(phases, "backward", step + 1, micro);
  fault.maybe_raise("backward", step + 1);
  (loss * w).backward();
  return loss.detach().to(at::kDouble) * w;
}

namespace {

class PlainRunner final : public StepRunner {
 public:
  PlainRunner(model::Model& net, bool bf16) : net_(net), bf16_(bf16) {}

  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    at::Tensor total;  // sum_i w_i * loss_i, float64, on the loss's device
    for (size_t i = 0; i < batches.size(); ++i) {
      const at::Tensor part = eager_micro_step(net_, bf16_, fault_, batches[i].tensors, batches[i].draw_seed,
                                               weights[i], step, static_cast<int64_t>(i), phases);
      total = total.defined() ? total + part : part;
    }
    return total;
  }

 private:
  model::Model& net_;
  bool bf16_;
  Fault fault_;
};

}  // namespace

std::unique_ptr<StepRunner> make_plain_runner(model::Model& net, bool bf16_autocast) {
  return std::make_unique<PlainRunner>(net, bf16_autocast);
}

StepMode step_mode(const config::Config& cfg, c10::Device device) {
  StepMode m;
  m.compiled = !cfg.trainer.compiled_step.empty();
  m.graphs = cfg.trainer.cuda_graphs == "on" || (cfg.trainer.cuda_graphs == "auto" && device.is_cuda());
  m.graphs_required = cfg.trainer.cuda_graphs == "on";
  return m;
}

std::unique_ptr<StepRunner> make_step_runner(const config::Config& cfg, model::Model& net, const StepMode& mode,
                                             bool bf16_autocast, c10::Device device) {
  if (mode.compiled)
    return make_compiled_runner(
        net, cfg.trainer.compiled_step, bf16_autocast,
        !mode.graphs ? GraphMode::off : (mode.graphs_required ? GraphMode::required : GraphMode::fallback), device);
  if (mode.graphs) return make_graph_runner(net, bf16_autocast, mode.graphs_required, device);
  return make_plain_runner(net, bf16_autocast);
}

}  // namespace loongforge::fusion
