// loongforge/engines/dmf/dmf.hpp — DMF, dynamic micro-batch fusion: one of the
// four engines (docs/architecture.md). Its step runner wraps the fast step's.
//
// What it does today (dmf.enable=true): the text buckets. Each micro-batch's
// text slot (text_tokens, text_mask: data.max_text_len wide) is cut to the
// smallest of a few widths that holds the micro-batch's longest task text.
// The widths (dmf.text_buckets at most) are chosen once at start from the
// dataset's task-text lengths (text_buckets.hpp: the least expected padding
// for the micro-batch size). Only for models whose result does not depend on
// the slot's width (batch_spec.json text_slot_cut: the n16 family); the loss
// and gradients are those of the whole slot (test/model/test_text_slot_cut.py,
// test/engines/dmf/test_dmf_train.py). Each width is one input shape: the
// TorchScript step, and CUDA graphs with one graph per width.
//
// What the DMF issue asks beyond this (not built): packing the vision-language
// sequences into one varlen sequence, cameras at their aspect, micro-batches
// by token budget across embodiments, buckets for the compiled packages.
//
// Contract:
//  - resolve(cfg, info): before step_mode(). dmf.enable=false: warns about
//    each dmf key set to no effect, returns "". dmf.enable=true: ConfigError
//    when the model's result depends on the slot (naming the model and the
//    fix), when the model file predates text_slot_cut or by_text_len (re-export),
//    when data.max_text_len exceeds the export's slot, or with
//    trainer.compiled_step=on (a package has one text width);
//    trainer.compiled_step=auto becomes off (recorded as the key's origin)
//    and the returned line says so.
//  - make_step_runner(): with dmf.enable=false the fast step's runner
//    (fusion::make_step_runner), unchanged; with it, that runner wrapped by
//    the text-slot cut. text_hist: data::text_length_histogram of the run's
//    dataset (ignored when off). Attaches `debug-dmf` and the status to
//    `record`. Logs the buckets and the expected padding.
//  - The wrapper's run() cuts each ReadyBatch's text tensors (a copy of the
//    first `width` columns) before the inner runner sees them, so that the
//    trainer reads each batch's width after run() (its padding and FLOPs).
//    std::out_of_range (data changed under the buckets) names both lengths.
//  - debug-dmf (a query, control thread): {"buckets", "slot", "steps": the
//    last `steps` (1..256, default 10) steps, each {"step", "micro_batches":
//    [{"samples", "text_tokens", "text_slot_tokens", "width", "new_shape"}]}}.
//  - engine(): DMF's record (common/engine.hpp).
//
// Example:
//   const std::string note = dmf::resolve(cfg, net.info());
//   auto runner = dmf::make_step_runner(cfg, net, mode, bf16_autocast, device, hist, record);
#pragma once

#include <memory>  // std::unique_ptr
#include <string>  // std::string
#include <vector>  // std::vector

#include <c10/core/Device.h>  // c10::Device

#include "loongforge/common/engine.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::dmf {

constexpr bool kBuilt = true;

std::string resolve(config::Config& cfg, const model::ModelInfo& info);

std::unique_ptr<fusion::StepRunner> make_step_runner(const config::Config& cfg, model::Model& net,
                                                     const fusion::StepMode& mode, bool bf16_autocast,
                                                     c10::Device device, const std::vector<double>& text_hist,
                                                     Engine& record);

Engine engine(const config::Config& cfg);

}  // namespace loongforge::dmf
