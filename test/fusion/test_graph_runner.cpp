// The CUDA-graph StepRunner against the plain one (GPU only, label gpu):
// the same model file, batches and optimizer give the same losses and
// weights whether forward+backward run eagerly or as replayed CUDA graphs
// (fp32: bit for bit, with the gradients made by the graphs or kept by the
// optimizer; bf16 autocast: within 1% over 300 steps), and a
// steady-state step (replay + clipping + fused AdamW) makes no host
// synchronisation (CUDA sync-debug mode set to error). The optimizer graph
// (clipping + fused AdamW replayed) gives the eager optimizer's weights bit
// for bit, and a gradient tensor that moves drops the graph. A capture gets
// the device memory eager work left in the allocator's cache.
#include <algorithm>  // std::max
#include <atomic>     // std::atomic
#include <cmath>      // std::abs
#include <cstdio>     // std::printf
#include <functional>  // std::function
#include <memory>     // std::unique_ptr
#include <string>     // std::string
#include <thread>     // std::thread

#include <ATen/ATen.h>                // at::Tensor
#include <ATen/cuda/CUDAEvent.h>     // at::cuda::CUDAEvent
#include <c10/cuda/CUDACachingAllocator.h>  // c10::cuda::CUDACachingAllocator::emptyCache
#include <c10/cuda/CUDAFunctions.h>   // c10::cuda::device_synchronize, warning_state
#include <c10/cuda/CUDAGuard.h>       // c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>      // c10::cuda::getStreamFromPool

#include <cuda_runtime_api.h>  // cudaMemGetInfo

#include "catch_compat.hpp"
#include "loongforge/common/phases.hpp"
#include "loongforge/fusion/cuda_graph.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"
#include "loongforge/optim/optimizer.hpp"
#include "loongforge/optim/optimizer_graph.hpp"

using namespace loongforge;

namespace {

struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};

const char* kModel = LOONGFORGE_TEST_MODELS "/n16-tiny.pt";
constexpr int64_t kMicro = 4;

// One trainer's worth of state: model, runner, fused optimizer.
struct Rig {
  model::Model net;
  std::unique_ptr<fusion::StepRunner> runner;
  std::unique_ptr<optim::Optimizer> opt;
  std::unique_ptr<optim::OptimizerGraph> opt_graph;  // optimizer_graph: clipping + update replayed
  // made: the graph runner makes the gradients (the trainer's choice without a graph reduction), else the
  // optimizer keeps them (Note [Fresh gradients] in src/fusion/graph_runner.cpp).
  Rig(bool graphs, bool bf16, bool optimizer_graph = false, bool made = true)
      : net(model::Model::load(kModel, at::Device(at::kCUDA, 0))) {
    if (bf16) net.cast_frozen(at::kBFloat16);
    net.train();
    runner = graphs ? fusion::make_graph_runner(net, bf16, /*required=*/true, at::Device(at::kCUDA, 0))
                    : fusion::make_plain_runner(net, bf16);
    std::vector<optim::OptimizedParam> ps;
    for (const auto& p : net.parameters())
      if (p.info->trainable) ps.push_back({p.info->name, p.tensor, p.info->decay});
    opt = std::make_unique<optim::FusedAdamW>(ps, optim::AdamWOptions{});
    made_gradients = graphs && runner->make_gradients(made);
    opt->keep_gradients(graphs && !made_gradients);
    if (optimizer_graph)
      opt_graph = optim::make_optimizer_graph(static_cast<optim::FusedAdamW&>(*opt), 1.0, /*required=*/true,
                                                at::Device(at::kCUDA, 0));
  }
  // Step s's `k` micro-batches, on the device.
  std::vector<data::ReadyBatch> batches(int64_t s, int64_t k) {
    std::vector<data::ReadyBatch> out;
    for (int64_t i = 0; i < k; ++i) {
      data::ReadyBatch b;
      for (auto& [key, t] : model::make_example_batch(net.info(), kMicro, static_cast<uint64_t>(s * k + i)))
        b.tensors[key] = t.to(at::Device(at::kCUDA, 0));
      out.push_back(std::move(b));
    }
    return out;
  }
  // One optimizer step over the given micro-batches; returns the step loss (device).
  at::Tensor step(int64_t s, std::vector<data::ReadyBatch> bs) {
    const std::vector<double> w(bs.size(), 1.0 / static_cast<double>(bs.size()));
    NoPhases phases;
    at::Tensor loss = runner->run(bs, w, s, phases);
    if (after_run) after_run();
    const double lr = 1e-3 * static_cast<double>(s + 1) / 30.0;  // changes every step, as a warm-up does
    if (opt_graph) {
      last_norm = opt_graph->step(lr).clone();
    } else {
      last_norm = opt->clip_grad_norm(1.0);
      opt->step(lr);
    }
    return loss;
  }
  at::Tensor step(int64_t s, int64_t k) { return step(s, batches(s, k)); }
  at::Tensor last_norm;
  bool made_gradients = false;
  std::function<void()> after_run;  // between the runner and the optimizer (the trainer's reduction)
  std::vector<at::Tensor> trainable() {
    std::vector<at::Tensor> out;
    for (const auto& p : net.parameters())
      if (p.info->trainable) out.push_back(p.tensor);
    return out;
  }
};

// A stand-in for GCTS's reduction (Note [Reduction in the graph] in
// src/engines/gcts/reducer.cpp): halves every gradient in place, inside the
// graph when captured there.
struct Halve final : fusion::GraphReduction {
  std::vector<at::Tensor> params;
  std::string k = "A";
  int64_t prepared = 0, begun = 0, ended = 0, replays = 0;
  std::string key() const override { return k; }
  void prepare() override { ++prepared; }
  void begin() override { ++begun; }
  void end() override {
    ++ended;
    for (auto& p : params) p.mutable_grad().mul_(0.5);
  }
  void replayed() override { ++replays; }
};

void require_equal_weights(Rig& a, Rig& b) {
  const auto pa = a.net.parameters(), pb = b.net.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].info->name);
    REQUIRE(at::equal(pa[i].tensor, pb[i].tensor));
  }
}

// `steps` steps of `k` micro-batches on both rigs: every step's loss and the final weights equal, bit for bit.
void require_equal_training(Rig& eager, Rig& graph, int64_t steps, int64_t k) {
  for (int64_t s = 0; s < steps; ++s) {
    const double a = eager.step(s, k).item<double>(), b = graph.step(s, k).item<double>();
    INFO("step " << s + 1 << ": eager " << a << ", graph " << b);
    REQUIRE(a == b);
  }
  require_equal_weights(eager, graph);
}

}  // namespace

TEST_CASE("graph runner: replayed CUDA graphs that make the gradients give the eager losses and weights bit for "
          "bit in fp32") {
  Rig eager(false, false), graph(true, false);
  REQUIRE(graph.made_gradients);
  require_equal_training(eager, graph, 30, 2);
  const auto st = graph.runner->status();
  CHECK(st.at("made_gradients").get<bool>());
  // the first micro-batch's graph and the one adding into its gradients, each after 3 eager calls
  CHECK(st.at("captures").get<int64_t>() == 2);
  CHECK(st.at("replays").get<int64_t>() == 2 * (30 - 3));
}

TEST_CASE("graph runner: replayed CUDA graphs that accumulate into kept gradients give the eager losses and "
          "weights bit for bit in fp32") {
  Rig eager(false, false), graph(true, false, /*optimizer_graph=*/false, /*made=*/false);
  REQUIRE_FALSE(graph.made_gradients);
  require_equal_training(eager, graph, 30, 2);
  const auto st = graph.runner->status();
  CHECK(st.at("captures").get<int64_t>() == 1);
  CHECK(st.at("replays").get<int64_t>() == 30 * 2 - 3);
}

TEST_CASE("graph runner: the gradients the graphs make keep their addresses, so the optimizer graph is captured "
          "once and the weights stay the eager ones bit for bit") {
  Rig eager(false, false), graph(true, false, /*optimizer_graph=*/true);
  require_equal_training(eager, graph, 20, 2);
  const auto st = graph.opt_graph->status();
  CHECK(st.at("captures").get<int64_t>() == 1);
  CHECK(st.at("invalidations").get<int64_t>() == 0);
  CHECK(st.at("replays").get<int64_t>() >= 20 - 7);
}

TEST_CASE("graph runner: bf16 losses stay within 1% of eager over 300 steps") {
  Rig eager(false, true), graph(true, true);
  double worst = 0;
  for (int64_t s = 0; s < 300; ++s) {
    const double a = eager.step(s, 1).item<double>(), b = graph.step(s, 1).item<double>();
    worst = std::max(worst, std::abs(a - b) / std::max(std::abs(a), 1e-12));
  }
  INFO("largest relative loss difference " << worst);
  std::printf("bf16 graph vs eager, 300 steps: largest relative loss difference %.3g\n", worst);
  REQUIRE(worst <= 0.01);
}

TEST_CASE("graph runner: a steady-state step (replay, clipping, fused AdamW) never synchronises with the host") {
  Rig graph(true, true);
  for (int64_t s = 0; s < 5; ++s) graph.step(s, 2);  // warm-up and capture
  // The inputs are made first: a copy from pageable host memory synchronises
  // (the trainer's sources copy from pinned memory, test_trainer_gpu).
  std::vector<std::vector<data::ReadyBatch>> inputs;
  for (int64_t s = 5; s < 10; ++s) inputs.push_back(graph.batches(s, 2));
  c10::cuda::device_synchronize();
  auto& ws = c10::cuda::warning_state();
  ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  bool threw = false;
  std::string what;
  try {
    for (int64_t s = 5; s < 10; ++s) graph.step(s, std::move(inputs[static_cast<size_t>(s - 5)]));
  } catch (const std::exception& e) {
    threw = true, what = e.what();
  }
  ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  INFO(what.substr(0, 600));
  REQUIRE_FALSE(threw);
  // The mode does catch a synchronising call (the test can fail):
  ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  bool caught = false;
  try {
    (void)graph.opt->params().front().sum().item<float>();
  } catch (const std::exception&) {
    caught = true;
  }
  ws.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  REQUIRE(caught);
}

TEST_CASE("optimizer graph: replayed clipping and fused AdamW give the eager optimizer's weights bit for bit") {
  Rig eager(true, false, false, /*made=*/false), replayed(true, false, /*optimizer_graph=*/true, /*made=*/false);
  for (int64_t s = 0; s < 20; ++s) {
    const double a = eager.step(s, 1).item<double>(), b = replayed.step(s, 1).item<double>();
    INFO("step " << s + 1);
    REQUIRE(a == b);
    REQUIRE(eager.last_norm.item<float>() == replayed.last_norm.item<float>());
  }
  require_equal_weights(eager, replayed);
  const auto st = replayed.opt_graph->status();
  CHECK(st.at("captures").get<int64_t>() == 1);
  CHECK(st.at("replays").get<int64_t>() == 20 - 3);
  CHECK(st.at("capture_failures").get<int64_t>() == 0);
}

TEST_CASE("optimizer graph: a gradient tensor that moves drops the graph and the update stays right") {
  // Plain runner, gradients kept (zeroed in place): their addresses stay put until the test moves them.
  Rig eager(false, false), replayed(false, false, /*optimizer_graph=*/true);
  for (auto* rig : {&eager, &replayed}) rig->opt->keep_gradients(true);
  for (int64_t s = 0; s < 12; ++s) {
    if (s == 6)  // new gradient tensors (as after a runner's fallback): the graph must not update from the old ones
      for (auto* rig : {&eager, &replayed})
        for (auto& p : rig->opt->params()) const_cast<at::Tensor&>(p).mutable_grad() = p.grad().clone();
    const double a = eager.step(s, 1).item<double>(), b = replayed.step(s, 1).item<double>();
    INFO("step " << s + 1);
    REQUIRE(a == b);
  }
  require_equal_weights(eager, replayed);
  const auto st = replayed.opt_graph->status();
  CHECK(st.at("invalidations").get<int64_t>() == 1);
  CHECK(st.at("captures").get<int64_t>() == 2);  // at step 4, and again 3 steps after the move
}

TEST_CASE("graph capture: another thread synchronising its own copy stream, as ADFE's producer does, does not "
          "invalidate a capture") {
  const at::Tensor x = at::randn({256, 256}, at::TensorOptions().device(at::kCUDA));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> syncs{0};
  std::string producer_error, capture_error;
  std::thread producer([&] {  // what ADFE's producer does: copies on its stream, then waits for them
    try {
      const c10::cuda::CUDAStream copy = c10::cuda::getStreamFromPool(false, x.device().index());
      const at::Tensor host = at::empty({4096}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
      at::Tensor dev = at::empty({4096}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA));
      at::cuda::CUDAEvent done;
      c10::cuda::CUDAStreamGuard on_copy(copy);
      while (!stop) {
        dev.copy_(host, /*non_blocking=*/true);
        done.record(copy);
        done.synchronize();
        ++syncs;
      }
    } catch (const std::exception& e) {
      producer_error = e.what();
    }
  });
  while (syncs < 10 && producer_error.empty()) std::this_thread::yield();
  at::Tensor y;
  int64_t during = 0;
  try {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, x.device().index());
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    loongforge::fusion::on_side_stream(side, [&] {
      const auto work = [&] {
        y = x;
        for (int i = 0; i < 2000; ++i) y = at::tanh(y.mm(x) * 1e-3);  // a capture long enough to overlap
      };
      // As the runners do: cuBLAS's handle and workspace are made by eager calls, outside the capture.
      for (int64_t i = 0; i < loongforge::fusion::kGraphWarmupCalls; ++i) work();
      const int64_t before = syncs;
      graph = loongforge::fusion::capture_graph(at::cuda::graph_pool_handle(), work);
      during = syncs - before;
      graph->replay();
    });
  } catch (const std::exception& e) {
    capture_error = e.what();
  }
  stop = true;
  producer.join();
  c10::cuda::device_synchronize();
  INFO("the producer synchronised " << during << " times during the capture");
  INFO("capture: " << capture_error.substr(0, 600));
  INFO("producer: " << producer_error.substr(0, 600));
  REQUIRE(capture_error.empty());
  REQUIRE(producer_error.empty());
  REQUIRE(during > 0);
  REQUIRE(at::isfinite(y).all().item<bool>());
}

TEST_CASE("graph capture: device memory the allocator keeps cached for eager work is available to the capture") {
  // Note [Capture memory]: eager work leaves 60% of the free device memory cached, a capture then needs as much.
  c10::cuda::CUDACachingAllocator::emptyCache();
  size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  const auto chunk = static_cast<int64_t>(static_cast<double>(free_bytes) * 0.6);
  const auto bytes = at::TensorOptions().dtype(at::kByte).device(at::kCUDA);
  { at::empty({chunk}, bytes).fill_(1); }  // freed, but kept by the caching allocator
  REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
  INFO("cached " << chunk << " bytes; the driver has " << free_bytes << " free");
  REQUIRE(static_cast<int64_t>(free_bytes) < chunk);  // the capture's pool cannot get it unless the cache lets go
  at::Tensor big;
  std::string capture_error;
  try {
    const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, 0);
    loongforge::fusion::on_side_stream(side, [&] {
      const auto graph = loongforge::fusion::capture_graph(at::cuda::graph_pool_handle(), [&] {
        big = at::empty({chunk}, bytes);
        big.fill_(7);
      });
      graph->replay();
    });
  } catch (const std::exception& e) {
    capture_error = e.what();
  }
  INFO("capture: " << capture_error.substr(0, 600));
  REQUIRE(capture_error.empty());
  REQUIRE(big[chunk - 1].item<int64_t>() == 7);
}

TEST_CASE("graph runner: a reduction captured into the last micro-batch's graph gives the weights of the reduction "
          "after backward, bit for bit, and is recaptured for another key") {
  Rig eager(false, false), graph(true, false, /*optimizer_graph=*/false, /*made=*/false);
  Halve h;
  h.params = graph.trainable();
  REQUIRE(graph.runner->set_graph_reduction(&h));
  eager.after_run = [&] {
    for (auto& p : eager.trainable()) p.mutable_grad().mul_(0.5);
  };
  int64_t seen = 0;
  std::vector<int64_t> replayed_steps;
  graph.after_run = [&] {  // what average_gradients() does when the replay did not reduce
    if (h.replays > seen) {
      seen = h.replays;
      return;
    }
    for (auto& p : h.params) p.mutable_grad().mul_(0.5);
  };
  for (int64_t s = 0; s < 12; ++s) {
    if (s == 8) h.k = "B";  // a new key (another slot set, a re-plan): its own warm-up and capture
    const int64_t before = h.replays;
    const double a = eager.step(s, 2).item<double>(), b = graph.step(s, 2).item<double>();
    if (h.replays > before) replayed_steps.push_back(s + 1);
    INFO("step " << s + 1 << ": eager " << a << ", graph " << b);
    REQUIRE(a == b);
  }
  require_equal_weights(eager, graph);
  // micro-batch 0: one plain graph; micro-batch 1: one graph per key, each after 3 eager calls
  CHECK(h.prepared == 2);
  CHECK(h.begun == 2);
  CHECK(h.ended == 2);
  CHECK(h.replays == 6);  // key A: steps 4-8; key B: step 12
  const auto st = graph.runner->status();
  CHECK(st.at("captures").get<int64_t>() == 3);
  CHECK(st.at("reduction_graphs").get<int64_t>() == 2);
  CHECK(st.at("reduction_replays").get<int64_t>() == 6);
  // The graph's tail is timed per replayed step on the device (Note [Timing inside a graph]).
  c10::cuda::device_synchronize();
  for (const int64_t step : replayed_steps) {
    CAPTURE(step);
    const auto ms = graph.runner->take_graph_comm_ms(step);
    REQUIRE(ms.has_value());
    CHECK((*ms >= 0 && *ms < 1000));
  }
  CHECK_FALSE(graph.runner->take_graph_comm_ms(1).has_value());  // an eager step
}
