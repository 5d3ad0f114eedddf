// loongforge/engines/dmf/dmf.hpp — DMF, dynamic micro-batch fusion: one of the
// four engines (docs/architecture.md). Its step runner wraps the fast step's.
//
// What it does today (dmf.enable=true): the text buckets. Each micro-batch's
// text slot (text_tokens, text_mask: data.max_text_len wide) is cut to the
// smallest of a few widths that holds the micro-batch's longest task text.
// The widths (dmf.text_buckets at most) are chosen once at start from the
// dataset's task-text lengths (text_buckets.hpp: the least expected padding
// for the micro-batch size). Where the compiled step may run
// (trainer.compiled_step not off) each width is a package of its own
// (its cache key holds the width) and the widths are at most
// dmf.package_buckets (1 by default: the dataset's longest text). Only
// for models whose result does not depend on the slot's width
// (batch_spec.json text_slot_cut: the n16 family and chat-templated GR00T
// N1.7 imports); the loss and gradients are those of the whole slot
// (test/model/test_text_slot_cut.py, test/engines/dmf/test_dmf_train.py).
// With CUDA graphs each width is a graph of its own.
//
// What the DMF issue asks beyond this (not built): packing the vision-language
// sequences into one varlen sequence, cameras at their aspect, micro-batches
// by token budget across embodiments.
//
// Contract:
//  - resolve(cfg, info): after the model loads. dmf.enable=false: warns about
//    each dmf key set to no effect. dmf.enable=true: ConfigError
//    when the model's result depends on the slot (naming the model and the
//    fix), when the model file predates text_slot_cut or by_text_len
//    (re-export), or when data.max_text_len exceeds the export's slot.
//  - plan(cfg, text_hist, compiled_step): the buckets (no widths when DMF is off):
//    at most dmf.text_buckets, or dmf.package_buckets when compiled_step
//    (the compiled step may run: compiled_step_setting is not off; without
//    it a dmf.package_buckets other than 1 is warned about as without
//    effect). text_hist: data::text_length_histogram of the run's dataset.
//    plan.buckets.widths (empty when DMF is off) are what step_mode takes
//    as its packages' text widths.
//  - make_step_runner(): with dmf.enable=false the fast step's runner
//    (fusion::make_step_runner), unchanged; with it, that runner wrapped by
//    the text-slot cut. Attaches `debug-dmf` and the status to `record`.
//    Logs the widths and the expected padding. std::logic_error when the
//    mode's packages are for other widths than the plan's.
//  - The wrapper's run() cuts each ReadyBatch's text tensors (a copy of the
//    first `width` columns) before the inner runner sees them, so that the
//    trainer reads each batch's width after run() (its padding and FLOPs).
//    std::out_of_range (data changed under the buckets) names both lengths.
//    Its step_scalars(): the run's counts so far for metrics.jsonl
//    (dmf_micro_batches, dmf_new_shapes, dmf_shape_reuse: Note [DMF's shape
//    counts]).
//  - debug-dmf (a query, control thread): {"buckets", "slot", "steps": the
//    last `steps` (1..256, default 10) steps, each {"step", "micro_batches":
//    [{"samples", "embodiments", "text_tokens", "text_slot_tokens", "width",
//    "new_shape"}]}}.
//  - engine(): DMF's record (common/engine.hpp).
//
// Example:
//   dmf::resolve(cfg, net.info());
//   const dmf::Plan plan = dmf::plan(cfg, data::text_length_histogram(dataset, cfg.data.max_text_len), compiled);
//   const fusion::StepMode mode = fusion::step_mode(cfg, net, device, bf16, progress, copies, plan.buckets.widths);
//   auto runner = dmf::make_step_runner(cfg, net, mode, bf16_autocast, device, plan, record);
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string
#include <vector>  // std::vector

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/engines/dmf/text_buckets.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::dmf {

constexpr bool kBuilt = true;

void resolve(const config::Config& cfg, const model::ModelInfo& info);

struct Plan {
  TextBuckets buckets;                 // widths empty: DMF is off
  double whole_slot_tokens = 0;        // per micro-batch without the cut
  bool for_packages = false;           // the compiled step may run: each width is a package
};
Plan plan(const config::Config& cfg, const std::vector<double>& text_hist, bool compiled_step);

std::unique_ptr<fusion::StepRunner> make_step_runner(const config::Config& cfg, model::Model& net,
                                                     const fusion::StepMode& mode, bool bf16_autocast,
                                                     c10::Device device, const Plan& plan, Engine& record);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::dmf
