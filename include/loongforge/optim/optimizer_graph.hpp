// loongforge/optim/optimizer_graph.hpp — the optimizer phase of the fast
// step (issue #11 item 5) as one CUDA graph: global-norm clipping and the
// fused AdamW update replayed instead of launched kernel by kernel.
//
// Contract:
//  - step(lr) does what `norm = clip_grad_norm(max_norm); step(lr)` does on
//    the FusedAdamW it wraps (the same kernels, so the same bits) and returns
//    the norm as a float32 device scalar; the tensor is rewritten by the next
//    step, so copy it first (Readback::post does).
//  - A graph holds the gradient tensors it was captured with. So step()
//    compares the gradients' addresses with the previous step's: after
//    kGraphWarmupCalls eager steps with the same addresses it captures
//    clipping + update (the learning rate is filled outside the graph, the
//    step counters and found_inf are device tensors); when they differ the
//    graph is dropped (counted as an invalidation) and eager steps run until
//    the addresses are stable again. The gradients are zeroed (or unset)
//    outside the graph, as the optimizer's keep_gradients says.
//  - A failed capture throws ConfigError when required (trainer.cuda_graphs=on),
//    else is logged and counted, and the optimizer runs eagerly from then on.
//  - status(): captures, replays, invalidations, capture failures.
//  - CUDA builds and CUDA devices only (make_optimizer_graph returns null
//    otherwise); trainer thread.
//
// Example:
//   auto graph = make_optimizer_graph(fused, cfg.trainer.grad_clip_norm, /*required=*/false, device);
//   at::Tensor norm = graph ? graph->step(lr) : (fused.clip_grad_norm(c), fused.step(lr), ...);
#pragma once

#include <memory>  // std::unique_ptr

#include <ATen/core/Tensor.h>  // at::Tensor
#include <c10/core/Device.h>   // c10::Device
#include <nlohmann/json.hpp>   // nlohmann::json

#include "loongforge/optim/optimizer.hpp"

namespace loongforge::optim {

class OptimizerGraph {
 public:
  virtual ~OptimizerGraph() = default;
  virtual at::Tensor step(double lr) = 0;
  virtual nlohmann::json status() const = 0;
};

std::unique_ptr<OptimizerGraph> make_optimizer_graph(FusedAdamW& optimizer, double max_norm, bool required,
                                                     c10::Device device);

}  // namespace loongforge::optim
