// loongforge/fusion/cuda_graph.hpp — what every CUDA-graph user of the
// trainer shares: the number of eager calls before a capture, running work on
// a side stream (a graph cannot be captured on the default stream) and one
// capture. Used by the graph and compiled StepRunners and the optimizer graph
// (optim/optimizer_graph.hpp).
//
// Contract:
//  - on_side_stream(side, fn): fn runs with `side` as the current stream,
//    after the work the caller's current stream has queued; the caller's
//    stream then waits for what fn queued. Nothing synchronises the host.
//  - capture_graph(pool, fn): waits for the current stream's queued work,
//    returns the caching allocator's unused cached blocks to the driver (so
//    the capture's pool can have that memory: Note [Capture memory] in
//    graph_runner.cpp), records what fn() queues on the current
//    (non-default) stream into a new CUDA graph allocating from `pool`, and
//    returns it; nothing of fn has run
//    on the device then. When fn or the capture throws, the capture is ended
//    (the stream stays usable) and the error propagates. The capture is
//    thread-local (cudaStreamCaptureModeThreadLocal): other threads of the
//    process (ADFE's producer synchronising its copy stream and slots, the
//    checkpoint writer) may make calls a global capture forbids without
//    invalidating it (Note [Thread-local capture] in graph_runner.cpp).
//  - capture_or_fallback(pool, fn, site): capture_graph, but a failure is
//    counted in site.failures and then either throws ConfigError (site.required,
//    trainer.cuda_graphs=on) or is logged once as a warning naming what falls
//    back (auto); null is returned then.
//  - CUDA builds only (LOONGFORGE_WITH_CUDA_KERNELS); trainer thread.
//
// Example:
//   on_side_stream(side, [&] {
//     if (!graph) graph = capture_graph(pool, [&] { out = f(static_in); });
//     graph->replay();
//   });
#pragma once

#include <cstdint>  // int64_t

namespace loongforge::fusion {

// Eager calls of an input signature before it is captured: lazy
// initialisation (cuBLAS handles and workspaces, autocast, allocator blocks,
// the gradient tensors) happens outside any capture.
constexpr int64_t kGraphWarmupCalls = 3;

}  // namespace loongforge::fusion

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <string>      // std::string

#include <ATen/cuda/CUDAGraph.h>  // at::cuda::CUDAGraph, at::cuda::MempoolId_t
#include <c10/cuda/CUDAStream.h>  // c10::cuda::CUDAStream

namespace loongforge::fusion {

void on_side_stream(const c10::cuda::CUDAStream& side, const std::function<void()>& fn);

// keep_graph: the graph the executable was made from is kept (for raw_cuda_graph(): updating nodes).
std::unique_ptr<at::cuda::CUDAGraph> capture_graph(at::cuda::MempoolId_t pool, const std::function<void()>& fn,
                                                   bool keep_graph = false);

// Where a capture happens, for its failure: "step N: capturing <what> as a
// CUDA graph failed ...; <fallback> from now on". step: 1-based, or -1.
struct CaptureSite {
  std::string what;      // "forward+backward"
  std::string fallback;  // "this input shape runs eagerly"
  bool required = false;
  int64_t step = -1;
  int64_t* failures = nullptr;  // incremented on a failure
  std::string fix;  // required: what the message tells the user to change ("": trainer.cuda_graphs)
};

std::unique_ptr<at::cuda::CUDAGraph> capture_or_fallback(at::cuda::MempoolId_t pool, const std::function<void()>& fn,
                                                         const CaptureSite& site, bool keep_graph = false);

}  // namespace loongforge::fusion
#endif
