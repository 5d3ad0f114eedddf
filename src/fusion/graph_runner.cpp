// The CUDA-graph StepRunner (step_runner.hpp): forward + backward of one
// micro-batch captured once per input signature and replayed.
//
// How a micro-batch runs (everything on one side stream, which the caller's
// stream waits for at the end of run()):
//  - its signature is the batch's keys, shapes and dtypes; the first
//    kGraphWarmupCalls micro-batches of a signature run eagerly (as the plain
//    runner does), so lazy initialisation (cuBLAS handles and workspaces,
//    autocast, the allocator's blocks) happens outside any capture;
//  - then the micro-batch's forward, the backward of w * loss and
//    loss * w in float64 are captured into a CUDAGraph whose inputs are
//    static copies of the batch and of w; capture only records, so the
//    graph is replayed at once for this micro-batch;
//  - from then on: copy the batch into the static inputs, fill w, replay.
// Gradients, two ways (Note [Fresh gradients]):
//  - made (make_gradients(true), no graph reduction): each step's first
//    micro-batch has a graph of its own whose backward allocates the
//    gradients in the graph's pool, as autograd does when .grad is undefined;
//    after each replay they become .grad. A later micro-batch's graph adds
//    into them. The optimizer sets .grad to undefined after its step.
//  - kept: backward accumulates in place into the parameters' existing .grad
//    tensors (autograd does `grad += new` when a gradient exists and grad
//    mode is off), so the optimizer must keep them allocated and zero them in
//    place (Optimizer::keep_gradients). The warm-up calls create them.
// Every graph allocates from one memory pool shared with PyTorch's caching
// allocator (at::cuda::graph_pool_handle()).
// With a GraphReduction (step_runner.hpp; Note [Reduction in the graph] in
// src/engines/gcts/reducer.cpp) whose key is non-empty, the step's last
// micro-batch has a signature of its own (batch + key): its graph holds the
// reduction after the backward, between two event-record nodes (Note [Timing
// inside a graph]).
// A capture that fails (an op that synchronises or is not capturable) either
// throws (required) or is logged once, counted, and that signature runs
// eagerly from then on.
#include "loongforge/fusion/step_runner.hpp"

#include <deque>    // std::deque
#include <iterator>  // std::next
#include <map>      // std::map
#include <sstream>  // std::ostringstream
#include <stdexcept>  // std::logic_error
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/ATen.h>  // at::Tensor

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "runner_common.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>       // at::cuda::CUDAEvent
#include <ATen/cuda/CUDAGraph.h>       // at::cuda::CUDAGraph
#include <c10/cuda/CUDACachingAllocator.h>  // c10::cuda::CUDACachingAllocator::emptyCache
#include <c10/cuda/CUDAGuard.h>        // c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>       // c10::cuda::getStreamFromPool
#include <c10/cuda/CUDAException.h>    // C10_CUDA_CHECK
#include <cuda_runtime_api.h>          // cudaEventRecordWithFlags, cudaGraphExecEventRecordNodeSetEvent
#endif

namespace loongforge::fusion {

#if LOONGFORGE_WITH_CUDA_KERNELS
namespace {

std::string signature(const model::Batch& b) {
  std::ostringstream s;
  for (const auto& [key, t] : b) s << key << ':' << t.sizes() << ':' << t.scalar_type() << ';';
  return s.str();
}

// Note [Timing inside a graph]
// An event recorded during a capture only orders streams, unless recorded
// with cudaEventRecordExternal: then it is a node of the graph, recorded at
// each replay. A reduction graph has two such nodes, after the backward and
// at the end. Before each replay both are re-pointed
// (cudaGraphExecEventRecordNodeSetEvent, which needs the graph the
// executable was made from: such graphs are kept) to a fresh pair of events,
// filed under the step, so each step's pair times that step's tail alone:
// the reduction's waits and unpacking, the communication the step waits for.
struct EventPair {
  cudaEvent_t a = nullptr, b = nullptr;
  EventPair() {
    C10_CUDA_CHECK(cudaEventCreate(&a));
    C10_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~EventPair() {
    if (a) (void)cudaEventDestroy(a);
    if (b) (void)cudaEventDestroy(b);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  bool done() const { return cudaEventQuery(a) == cudaSuccess && cudaEventQuery(b) == cudaSuccess; }
};

struct Captured {
  int64_t calls = 0;
  bool eager_only = false;             // its capture failed (not required)
  bool reduces = false;                // the last micro-batch's graph, with the reduction (key non-empty)
  bool first = false;                  // made gradients: a step's first micro-batch (its backward makes .grad)
  std::vector<at::Tensor> grads;       // first: the gradients its replays write (undefined: none reaches it)
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  model::Batch inputs;                 // static copies of the batch
  at::Tensor w32, w64;                 // the loss weight, float32 (backward) and float64 (the step loss)
  at::Tensor part;                     // loss * w, float64, written by each replay
  cudaGraphNode_t tail_begin = nullptr, tail_end = nullptr;  // Note [Timing inside a graph]
  std::unique_ptr<EventPair> marks;  // the events the capture recorded (the nodes keep referring to them)
};

// The event-record node of `graph` that records `event` (null: none).
cudaGraphNode_t record_node(cudaGraph_t graph, cudaEvent_t event) {
  size_t n = 0;
  C10_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  C10_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    C10_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeEventRecord) continue;
    cudaEvent_t e = nullptr;
    C10_CUDA_CHECK(cudaGraphEventRecordNodeGetEvent(node, &e));
    if (e == event) return node;
  }
  return nullptr;
}

constexpr size_t kMaxReductionGraphs = 8;  // keys (slot sets, plans) with a graph of their own

class GraphRunner final : public StepRunner {
 public:
  GraphRunner(model::Model& net, bool bf16, bool required, c10::Device device)
      : net_(net), bf16_(bf16), required_(required),
        side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())),
        pool_(at::cuda::graph_pool_handle()) {}

  at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                 PhaseRecorder& phases) override {
    at::Tensor total;
    const std::string key = reduction_ ? reduction_->key() : "";
    first_replayed_ = false;
    on_side_stream(side_, [&] {
      std::string first_sig;
      for (size_t i = 0; i < batches.size(); ++i) {
        const auto micro = static_cast<int64_t>(i);
        std::string sig = signature(batches[i].tensors);
        const bool reduce = !key.empty() && i + 1 == batches.size() && reduction_slot(sig + "|" + key);
        if (reduce) sig += "|" + key;
        if (make_grads_) {  // Note [Fresh gradients]: an accumulating graph adds into one first graph's tensors
          if (i == 0) first_sig = sig;
          sig += i == 0 ? std::string("|first") : "|after " + first_sig;
        }
        Captured& c = graphs_[sig];
        c.reduces = reduce;
        c.first = make_grads_ && i == 0;
        const at::Tensor part = micro_step(c, batches[i].tensors, batches[i].draw_seed, weights[i], step, micro, phases);
        total = total.defined() ? total + part : part.clone();
      }
    });
    return total;
  }

  nlohmann::json status() const override {
    int64_t live = 0, eager = 0, reducing = 0;
    for (const auto& [sig, c] : graphs_)
      live += c.graph ? 1 : 0, eager += c.eager_only ? 1 : 0, reducing += c.graph && c.reduces ? 1 : 0;
    return {{"cuda_graphs", true},       {"graphs", live},      {"captures", captures_},
            {"replays", replays_},       {"eager_signatures", eager}, {"capture_failures", failures_},
            {"reduction_graphs", reducing}, {"reduction_replays", reduction_replays_},
            {"made_gradients", make_grads_}};
  }

  bool set_graph_reduction(GraphReduction* r) override {
    if (make_grads_ && r) throw std::logic_error("set_graph_reduction after make_gradients(true)");
    // A new reduction (fault tolerance's new world) must not replay graphs that hold the old one's
    // collectives: they are dropped and captured again (after warm-up calls) with the new one.
    if (r != reduction_)
      for (auto it = graphs_.begin(); it != graphs_.end();) it = it->second.reduces ? graphs_.erase(it) : std::next(it);
    reduction_ = r;
    return true;
  }

  bool make_gradients(bool allowed) override {
    make_grads_ = allowed && reduction_ == nullptr;
    trainable_.clear();
    if (make_grads_)
      for (const auto& p : net_.parameters())
        if (p.info->trainable) trainable_.push_back(p.tensor);
    return make_grads_;
  }

  std::optional<double> take_graph_comm_ms(int64_t step) override {
    for (auto it = timed_.begin(); it != timed_.end(); ++it) {
      if (it->first != step) continue;
      std::optional<double> ms;
      if (it->second->done()) {
        float f = 0;
        if (cudaEventElapsedTime(&f, it->second->a, it->second->b) == cudaSuccess) ms = f;
        spare_.push_back(std::move(it->second));
      }
      timed_.erase(it);
      return ms;
    }
    return std::nullopt;
  }

 private:
  at::Tensor micro_step(Captured& c, const model::Batch& batch, uint64_t draw_seed, double w, int64_t step,
                        int64_t micro, PhaseRecorder& phases) {
    // Made gradients: an accumulating graph adds into its first graph's tensors, so it replays (and is
    // captured) only in a step whose first micro-batch replayed that graph.
    const bool replayable = !make_grads_ || c.first || first_replayed_;
    if (c.graph && replayable) {
      Phase p(phases, "forward_backward", step + 1, micro);
      fault_.maybe_raise("forward", step + 1);
      for (auto& [key, t] : c.inputs) t.copy_(batch.at(key), /*non_blocking=*/true);
      c.w32.fill_(w), c.w64.fill_(w);
      if (c.reduces) time_tail(c, step + 1);  // Note [Timing inside a graph]
      seed_draws(draw_seed, c.w32.device());  // the replay reads the generator's seed and offset (Note [Micro-step draws])
      c.graph->replay();
      ++replays_;
      if (c.reduces) ++reduction_replays_, reduction_->replayed();
      if (c.first) {
        for (size_t j = 0; j < trainable_.size(); ++j) trainable_[j].mutable_grad() = c.grads[j];
        first_replayed_ = true;
      }
      return c.part;
    }
    if (c.eager_only || ++c.calls <= kGraphWarmupCalls || !replayable)
      return eager(c, batch, draw_seed, w, step, micro, phases);
    capture(c, batch, step);
    if (!c.graph) return eager(c, batch, draw_seed, w, step, micro, phases);
    return micro_step(c, batch, draw_seed, w, step, micro, phases);
  }

  // The plain runner's micro-step; a first micro-batch's backward makes .grad anew.
  at::Tensor eager(const Captured& c, const model::Batch& batch, uint64_t draw_seed, double w, int64_t step,
                   int64_t micro, PhaseRecorder& phases) {
    if (c.first) clear_grads();
    return eager_micro_step(net_, bf16_, fault_, batch, draw_seed, w, step, micro, phases);
  }

  void clear_grads() {
    for (auto& t : trainable_) t.mutable_grad() = at::Tensor();
  }

  void capture(Captured& c, const model::Batch& batch, int64_t step) {
    const auto& log = logger("fusion");
    for (const auto& [key, t] : batch) c.inputs[key] = t.clone();
    c.w32 = at::zeros({}, batch.begin()->second.options().dtype(at::kFloat));
    c.w64 = at::zeros({}, c.w32.options().dtype(at::kDouble));
    // Recorded as nodes (Note [Timing inside a graph]).
    std::unique_ptr<EventPair> marks = c.reduces ? std::make_unique<EventPair>() : nullptr;
    if (c.reduces) reduction_->prepare();
    if (c.first) clear_grads();  // Note [Fresh gradients]: the backward below allocates them in the graph's pool
    auto graph = capture_or_fallback(
        pool_,
        [&] {
          if (c.reduces) reduction_->begin();
          AutocastScope autocast(bf16_);
          const at::Tensor loss = net_.forward(c.inputs).at("loss");
          (loss * c.w32).backward();
          c.part = loss.detach().to(at::kDouble) * c.w64;
          if (c.first)
            for (const auto& t : trainable_) c.grads.push_back(t.grad());
          if (!c.reduces) return;
          const cudaStream_t s = c10::cuda::getCurrentCUDAStream().stream();
          C10_CUDA_CHECK(cudaEventRecordWithFlags(marks->a, s, cudaEventRecordExternal));
          reduction_->end();
          C10_CUDA_CHECK(cudaEventRecordWithFlags(marks->b, s, cudaEventRecordExternal));
        },
        // Note [Reduction in the graph]: every rank must replay the same collectives, so a failed capture stops
        // the run instead of leaving this rank eager while the others replay.
        {c.reduces ? "forward+backward with the gradient reduction" : "forward+backward", "this input shape runs eagerly",
         required_ || c.reduces, step + 1, &failures_,
         c.reduces ? "set gcts.overlap=false (the reduction then follows backward) or trainer.cuda_graphs=off" : ""},
        /*keep_graph=*/c.reduces);
    if (!graph) {
      c.eager_only = true;
      c.inputs.clear();
      c.grads.clear();
      if (c.first) clear_grads();  // tensors of the failed capture
      return;
    }
    if (c.reduces) {
      c.tail_begin = record_node(graph->raw_cuda_graph(), marks->a);
      c.tail_end = record_node(graph->raw_cuda_graph(), marks->b);
      c.marks = std::move(marks);
      if (!c.tail_begin || !c.tail_end) untimed("the captured graph has no node for its timing events");
    }
    ++captures_;
    c.graph = std::move(graph);
    LF_LOG(log, info) << "step " << step + 1 << ": captured forward+backward"
                      << (c.reduces ? " with the gradient reduction (" + reduction_->key() + ")" : std::string())
                      << " as CUDA graph " << captures_ << " (batch of " << batch.begin()->second.size(0) << ")";
  }

  // Whether the reduction graph `sig` exists or may be made (at most kMaxReductionGraphs keys).
  bool reduction_slot(const std::string& sig) {
    if (graphs_.count(sig)) return true;
    int64_t n = 0;
    for (const auto& [s, c] : graphs_) n += c.reduces ? 1 : 0;
    if (n < static_cast<int64_t>(kMaxReductionGraphs)) return true;
    if (!full_logged_) {
      full_logged_ = true;
      LF_LOG(logger("fusion"), warn) << kMaxReductionGraphs << " reduction graphs exist (one per embodiment-slot "
                                     << "set and plan); steps with another set reduce after backward";
    }
    return false;
  }

  void untimed(const std::string& why) {
    tail_timing_ = false;
    LF_LOG(logger("fusion"), warn) << "timing the reduction inside the CUDA graph: " << why
                                   << "; exposed_comm_ms leaves it out from now on";
  }

  // Note [Timing inside a graph]: this step's pair of events into the graph's two record nodes.
  // A driver that refuses the update leaves the step untimed (logged once); training goes on.
  void time_tail(Captured& c, int64_t step) {
    if (!tail_timing_) return;
    std::unique_ptr<EventPair> e;
    if (!spare_.empty()) e = std::move(spare_.back()), spare_.pop_back();
    else e = std::make_unique<EventPair>();
    const cudaGraphExec_t exec = c.graph->raw_cuda_graph_exec();
    cudaError_t rc = cudaGraphExecEventRecordNodeSetEvent(exec, c.tail_begin, e->a);
    if (rc == cudaSuccess) rc = cudaGraphExecEventRecordNodeSetEvent(exec, c.tail_end, e->b);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // clear it: nothing ran
      untimed(std::string("re-pointing its event nodes failed: ") + cudaGetErrorString(rc));
      return;
    }
    timed_.emplace_back(step, std::move(e));
    while (timed_.size() > 16) timed_.pop_front();  // never asked for: dropped (their events are destroyed later)
  }

  model::Model& net_;
  bool bf16_, required_;
  c10::cuda::CUDAStream side_;
  at::cuda::MempoolId_t pool_;
  std::map<std::string, Captured> graphs_;
  int64_t captures_ = 0, replays_ = 0, failures_ = 0, reduction_replays_ = 0;
  GraphReduction* reduction_ = nullptr;
  bool full_logged_ = false, tail_timing_ = true;
  bool make_grads_ = false, first_replayed_ = false;  // Note [Fresh gradients]
  std::vector<at::Tensor> trainable_;                 // made gradients: the parameters whose .grad is set
  std::deque<std::pair<int64_t, std::unique_ptr<EventPair>>> timed_;  // (1-based step, its events)
  std::vector<std::unique_ptr<EventPair>> spare_;
  Fault fault_;
};

}  // namespace

void on_side_stream(const c10::cuda::CUDAStream& side, const std::function<void()>& fn) {
  const c10::cuda::CUDAStream caller = c10::cuda::getCurrentCUDAStream(side.device_index());
  at::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(caller);
  inputs_ready.block(side);
  {
    c10::cuda::CUDAStreamGuard guard(side);
    fn();
  }
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(caller);
}

// Note [Fresh gradients]
// Kept gradients cost every trainable parameter, each step, a zeroing pass
// (the optimizer's _foreach_zero_) and a read-modify-write `grad += new` in
// backward, on top of the cast of its bf16 gradient to fp32: on gr00t-n1.6-3b
// (1612.6 M trainable parameters, micro-batch 32, one H200) making them
// instead took 6.3 ms off the step's 94.7 ms of kernel time and 3 GB off its
// peak memory (`profile-step --kernels`, docs/benchmarks.md, 2026-12-04). When .grad is
// undefined, autograd's AccumulateGrad takes the incoming gradient tensor as
// .grad instead, which is what the plain runner, with the optimizer's
// set-to-none, and the reference trainer do. So with made gradients a step's
// first micro-batch runs a graph captured with every .grad undefined: its
// backward allocates the gradients in the graph's pool, at the same
// addresses at every replay, and they become .grad after it (the optimizer
// graph, captured on those addresses, then replays). The values are the
// kept path's: x instead of 0 + x (the sign of a zero aside). An accumulating
// micro-batch's graph adds into one first graph's tensors, so it is keyed by
// that graph's signature and replays only after it in the same step; a step
// whose first micro-batch runs eagerly runs the others eagerly too. The
// trainer asks for made gradients only without a graph reduction (Note
// [Reduction in the graph] packs and unpacks the kept tensors inside the last
// micro-batch's graph, so those runs keep them) and without the sharded
// optimizer (its gradients are views into its flat buffer).

// Note [Thread-local capture]
// In CUDA's default (global) capture mode, a call that could synchronise with
// the capturing stream -- cudaEventSynchronize, cudaStreamSynchronize, a
// blocking cudaMemcpy -- made by ANY thread of the process while a capture is
// open invalidates the capture. ADFE's producer makes such calls (waiting for
// a pinned slot's previous copy, staging on its copy stream). On the H200 one
// of four ADFE runs stopped at step 4 with cudaErrorStreamCaptureInvalidated
// (n16-1b lf-graphs-adfe, docs/benchmarks.md 2026-12-01): the producer is the
// likely cause (inferred; the GPU test "graph capture: another thread ..." is
// to show it). Thread-local mode forbids those calls to the capturing thread
// only, which runs nothing but the captured work. Other threads' work on other
// streams is not part of the graph either way.
//
// Note [Capture memory]
// A capture allocates from its graph's private pool, which cannot use the
// blocks the caching allocator keeps for eager work. The warm-up calls
// before a capture leave a micro-step's activations (and, for a first
// capture, the eager gradients) cached there: for n16-3b full fine-tuning at
// micro-batch 64 that was 53.8 GiB reserved but unallocated when the compiled
// step's capture ran out of device memory on the H200 (docs/benchmarks.md,
// 2026-12-02), and 66.5-70.8 GiB when the TorchScript capture did at
// micro-batch 128. So each capture first returns the cached blocks to the
// driver (emptyCache, once per capture, after the stream is idle): eager work
// after it allocates afresh, once.
std::unique_ptr<at::cuda::CUDAGraph> capture_graph(at::cuda::MempoolId_t pool, const std::function<void()>& fn,
                                                   bool keep_graph) {
  auto graph = std::make_unique<at::cuda::CUDAGraph>(keep_graph);
  c10::cuda::getCurrentCUDAStream().synchronize();  // warm-up work done; nothing else in flight on the stream
  c10::cuda::CUDACachingAllocator::emptyCache();    // Note [Capture memory]
  graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);  // Note [Thread-local capture]
  try {
    fn();
  } catch (...) {
    graph->capture_end();  // leaves the stream usable; the graph is discarded
    throw;
  }
  graph->capture_end();
  if (keep_graph) graph->instantiate();  // capture_end() instantiates only graphs it does not keep
  return graph;
}

std::unique_ptr<at::cuda::CUDAGraph> capture_or_fallback(at::cuda::MempoolId_t pool, const std::function<void()>& fn,
                                                         const CaptureSite& site, bool keep_graph) {
  try {
    return capture_graph(pool, fn, keep_graph);
  } catch (const std::exception& e) {
    if (site.failures) ++*site.failures;
    const std::string why = short_libtorch_message(e.what());
    const std::string at = site.step >= 0 ? "step " + std::to_string(site.step) + ": " : "";
    if (site.required)
      throw ConfigError(at + "capturing " + site.what + " as a CUDA graph failed: " + why +
                        "; " + (site.fix.empty() ? "set trainer.cuda_graphs=off, or auto (then " + site.fallback + ")" : site.fix));
    LF_LOG(logger("fusion"), warn) << at << "capturing " << site.what << " as a CUDA graph failed (" << why << "); "
                                   << site.fallback << " from now on (trainer.cuda_graphs=auto)";
    return nullptr;
  }
}

std::unique_ptr<StepRunner> make_graph_runner(model::Model& net, bool bf16_autocast, bool required,
                                              c10::Device device) {
  if (!device.is_cuda())
    throw ConfigError("trainer.cuda_graphs=on needs run.device=cuda (the run is on " + device.str() + ")");
  return std::make_unique<GraphRunner>(net, bf16_autocast, required, device);
}

#else

std::unique_ptr<StepRunner> make_graph_runner(model::Model&, bool, bool, c10::Device) {
  throw ConfigError("trainer.cuda_graphs=on: this build has no CUDA (configure with -DLOONGFORGE_CUDA=ON on a "
                    "machine with nvcc and a CUDA libtorch), or set trainer.cuda_graphs=off");
}

#endif

}  // namespace loongforge::fusion
