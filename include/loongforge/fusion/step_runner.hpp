// loongforge/fusion/step_runner.hpp — the compute seam of the trainer: the
// forward and backward passes of one optimizer step's micro-batches, and the
// fast step's runners (CUDA graphs, the compiled package) beside the plain
// one. DMF (micro-batch fusion, include/loongforge/engines/dmf/dmf.hpp) will
// wrap them (docs/architecture.md s4).
//
// Contract:
//  - run() takes the step's K micro-batches (on the device) and their loss
//    weights w_i (docs/training-semantics.md s5), runs forward and backward
//    so that every trainable parameter's .grad accumulates the gradient of
//    sum_i w_i * loss_i, and returns sum_i w_i * loss_i as a float64 scalar on
//    the device. It reads nothing back to the host.
//  - Gradient accumulation order and arithmetic are those of the reference
//    trainer: micro-batch by micro-batch, forward then backward.
//  - Phases "forward" and "backward" (per micro-batch) go to the
//    PhaseRecorder.
//  - Before each micro-batch's forward (an eager one, a package call or a
//    CUDA-graph replay) the runner sets the default generator of the
//    batch's device to the batch's draw_seed, offset 0 (seed_draws): what
//    the forward draws itself (dropout masks; a GR00T head's state draws
//    when the batch lacks them) is then a pure function of (run.seed, step,
//    micro-batch, rank) in every runner (draw_seed; Note [Micro-step draws]
//    in step_runner.cpp).
//  - status() describes the runner for `loongforge status` (null: nothing
//    to say).
//  - Trainer thread only.
//  - make_step_runner() picks the runner from step_mode(), which resolves
//    trainer.compiled_step (auto: the package cache, package_cache.hpp).
//
// The graph runner (make_graph_runner, graph_runner.cpp) captures one
// micro-batch's forward + backward as a CUDA graph per input signature after
// kGraphWarmupCalls eager calls and replays it. By default it needs the optimizer to keep the
// gradient tensors allocated (Optimizer::keep_gradients). After
// make_gradients(true) returned true (it does without a graph reduction) it
// makes them instead: each run() sets .grad anew from its first micro-batch
// (that micro-batch's graph writes tensors of its own, which become .grad;
// Note [Fresh gradients]) and adds the later ones, so the optimizer must set
// .grad to undefined after its step (keep_gradients(false)). Its phase is
// "forward_backward" (one replay cannot be split). required: a capture
// failure throws ConfigError; otherwise it is logged and counted, and that
// signature runs eagerly.
//
// The compiled runner (make_compiled_runner, compiled_runner.cpp) runs each
// micro-batch's forward + backward as one call of an AOTInductor package
// built by scripts/compile_step.py for this model's architecture, device,
// precision and micro-batch shape; it accumulates the package's gradients
// into .grad. Given several packages (DMF's package buckets: one per text
// width) each micro-batch runs the one of its text slot's width, in the
// same order and arithmetic. Phase "forward_backward". A micro-batch of another shape
// throws DataError naming the fix (never an eager run around the package). A
// package that does not match throws ConfigError naming the difference and
// the command that rebuilds it. With graphs (CUDA, not
// GraphMode::off) the package call and loss * w are captured as CUDA graphs
// after kGraphWarmupCalls calls and replayed: the first micro-batch's graph
// outputs become .grad (so the optimizer need not keep gradients; with
// several packages it copies them into one set the packages share, which
// becomes .grad), a later micro-batch's graph adds its gradients into them
// (each package has its two graphs); a failed capture throws
// (required) or is logged, counted, and the package runs uncaptured
// (fallback).
//
// Graph reduction (graph runner only; Note [Reduction in the graph] in
// src/engines/gcts/reducer.cpp): with set_graph_reduction(r), a step whose
// r->key() is non-empty runs its last micro-batch as a graph of its own,
// captured (after its own warm-up calls) with r->begin() before the forward
// and r->end() after the backward inside the capture, and replayed only for
// steps of the same key; r->replayed() is called for each step it ran for.
// The part of that graph after the backward (the reduction's waits and
// unpacking: the communication the step waits for) is timed on the device
// by two event-record nodes re-pointed to fresh events before each replay;
// take_graph_comm_ms(step) returns that time for a 1-based step once its
// replay is done (nullopt: no such replay, or not done yet). A reduction
// graph's capture is always required (a failure throws ConfigError naming
// gcts.overlap=false): every rank must replay the same collectives.
//
// Example:
//   auto runner = make_plain_runner(net, /*bf16_autocast=*/device.is_cuda());
//   at::Tensor loss = runner->run(batches, weights, step, phases);  // device, f64
#pragma once

#include <cstdint>  // int64_t
#include <functional>  // std::function
#include <memory>   // std::unique_ptr
#include <optional> // std::optional
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor
#include <c10/core/Device.h>     // c10::Device
#include <nlohmann/json.hpp>     // nlohmann::json

#include "loongforge/common/phases.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/fusion/package_cache.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::fusion {

// Work captured into the last micro-batch's graph after its backward (see above).
class GraphReduction {
 public:
  virtual ~GraphReduction() = default;
  virtual std::string key() const = 0;  // "": not capturable this step
  virtual void prepare() = 0;           // before a capture, outside it
  virtual void begin() = 0;             // inside the capture, before the forward
  virtual void end() = 0;               // inside the capture, after the backward
  virtual void replayed() = 0;          // this step's last micro-batch ran the graph
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual at::Tensor run(std::vector<data::ReadyBatch>& batches, const std::vector<double>& weights, int64_t step,
                         PhaseRecorder& phases) = 0;
  virtual nlohmann::json status() const { return nullptr; }
  // The graph runner only; false elsewhere (the reduction then follows backward).
  virtual bool set_graph_reduction(GraphReduction* r) {
    (void)r;
    return false;
  }
  // The graph runner only (see above): whether run() makes .grad anew each step; false elsewhere. Call
  // after set_graph_reduction.
  virtual bool make_gradients(bool allowed) {
    (void)allowed;
    return false;
  }
  virtual std::optional<double> take_graph_comm_ms(int64_t step) {
    (void)step;
    return std::nullopt;
  }
  // The compiled runner only: the trainable parameters its package takes as bf16 working copies (the
  // manifest's "bf16_weights", scripts/compile_step.py --bf16-weights); empty elsewhere.
  virtual std::vector<std::string> bf16_weights() const { return {}; }
  // Fields for metrics.jsonl after run() (the trainer writes them under "engines/"): DMF's shape counts so
  // far (dmf.hpp); empty elsewhere.
  virtual std::vector<std::pair<std::string, double>> step_scalars() const { return {}; }
};

// The seed of micro-batch `micro`'s draws in 0-based step `step` on `rank`
// (docs/training-semantics.md s4, "Draws inside the model").
uint64_t draw_seed(uint64_t run_seed, int64_t step, int64_t micro, int64_t rank);

// Sets the default generator of `device` to `seed`, offset 0 (a CUDA
// graph's replay reads the generator's seed and offset: call it before).
void seed_draws(uint64_t seed, c10::Device device);

// One forward and one backward per micro-batch, through the TorchScript
// module; bf16_autocast: the forward runs under CUDA bf16 autocast.
std::unique_ptr<StepRunner> make_plain_runner(model::Model& net, bool bf16_autocast);

// CUDA graphs (see above); throws ConfigError on a CPU device or a build without CUDA.
std::unique_ptr<StepRunner> make_graph_runner(model::Model& net, bool bf16_autocast, bool required,
                                              c10::Device device);

// AOTInductor packages (see above): one, or one per text width (DMF's
// package buckets; Note [Several packages] in compiled_runner.cpp). graphs:
// trainer.cuda_graphs (off, auto = fallback on CUDA devices, on = required).
// reload(i, e): called when packages[i] does not load (e: the ConfigError);
// returns the path of a package to load instead (the cache's, compiled
// again) or throws; null: the ConfigError propagates.
enum class GraphMode { off, fallback, required };
using PackageReload = std::function<std::string(size_t, const ConfigError&)>;
std::unique_ptr<StepRunner> make_compiled_runner(model::Model& net, const std::vector<std::string>& packages,
                                                 bool bf16_autocast, GraphMode graphs, c10::Device device,
                                                 const PackageReload& reload = nullptr);

// trainer.compiled_step resolved for a device (Note [Compiled step setting] in step_runner.cpp): off (off, "", auto
// on the CPU); cache (auto on CUDA, on: the package cache, package_cache.hpp); path (one named package).
enum class CompiledStepSetting { off, cache, path };
CompiledStepSetting compiled_step_setting(const config::Config& cfg, c10::Device device);

// The cache's package for this config's model, micro-batch, precision and device: a hit, or compiled now
// (loongforge-train --compile-only; step_mode under auto). Throws ConfigError (CompileFailed) when it cannot.
// text_width: the text slot's width in the batches (0: data.max_text_len; else one of DMF's widths).
PreparedPackage prepare_compiled_step(const config::Config& cfg, const model::Model& net, c10::Device device,
                                      bool bf16_autocast, const CompileProgress& progress,
                                      const std::vector<std::string>& bf16_weights = {}, int64_t text_width = 0);

// How the step runs forward and backward, from trainer.compiled_step and
// trainer.cuda_graphs.
struct StepMode {
  bool compiled = false;         // the compiled runner runs `packages`
  bool graphs = false;           // CUDA graphs: trainer.cuda_graphs=on, or auto on a CUDA device
  bool graphs_required = false;  // trainer.cuda_graphs=on: a failed capture is a ConfigError
  std::vector<std::string> packages;  // the package files (compiled): one per text width, text_widths' order
  bool package_from_cache = false;
  nlohmann::json package_status;  // {path, source: given | cache hit | compiled | compile failed, compile_s, ...};
                                  // several packages: the first's path, "compiled" when any was, the sum of the
                                  // compiles, "text_widths" and "packages" (each's); null when compiled_step is off
  std::vector<std::string> bf16_weights;  // auto: the working copies the cache's package takes (step_mode's argument)
  std::vector<int64_t> text_widths;       // the text slot's widths the batches will have (step_mode's argument,
                                          // resolved: {data.max_text_len} when none was given)
};
// Resolves trainer.compiled_step: under auto prepares the cache's package for each text width (a compile reports
// through `progress`; a failed one falls back to the TorchScript step with a warning). A named package whose
// micro-batch is not trainer.micro_batch_size throws ConfigError naming the fix.
// bf16_weights: under auto, the weights the package should take as bf16 working copies
// (optim::compiled_working_copies; part of the cache's key). text_widths: the text slot's widths the step's
// batches will have, ascending (empty: data.max_text_len; DMF's widths where the compiled step may run, a package
// for each, dmf::Plan's widths); a named package of another width, or several widths with a named package, throw
// ConfigError too.
StepMode step_mode(const config::Config& cfg, const model::Model& net, c10::Device device, bool bf16_autocast,
                   const CompileProgress& progress = nullptr, const std::vector<std::string>& bf16_weights = {},
                   const std::vector<int64_t>& text_widths = {});

// `inner` with `package` as its status()'s "package"; everything else is inner's (make_step_runner wraps the
// compiled runner so when trainer.compiled_step is not off).
std::unique_ptr<StepRunner> with_package_status(std::unique_ptr<StepRunner> inner, nlohmann::json package);

// The runner of `mode`: the compiled package (graphed as the mode says), the
// CUDA-graph runner, or the plain one; its status() holds "package" (the
// mode's package_status) when trainer.compiled_step is not off. A cached
// package that does not load is compiled again once. bf16_autocast: the
// forward runs under CUDA bf16 autocast.
std::unique_ptr<StepRunner> make_step_runner(const config::Config& cfg, model::Model& net, const StepMode& mode,
                                             bool bf16_autocast, c10::Device device);

}  // namespace loongforge::fusion
