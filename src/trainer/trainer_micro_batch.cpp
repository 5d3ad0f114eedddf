// Trainer, phase 1 (open), continued: trainer.micro_batch_size: auto resolved
// to a number before anything is sized by it. The choosing policy is
// micro_batch.cpp's (pure); this file measures the device for it, agrees on one
// size over the ranks, and keeps a checkpoint's size on resume.
#include <algorithm>  // std::max
#include <cstdio>     // std::snprintf
#include <cstdlib>    // std::getenv, std::strtod
#include <exception>  // std::exception_ptr, std::rethrow_exception
#include <string>     // std::string
#include <vector>     // std::vector

#include <ATen/ATen.h>            // at::Tensor, at::NoGradGuard
#include <ATen/Context.h>         // at::globalContext
#include <ATen/core/Generator.h>  // at::Generator
#include <c10/util/Exception.h>   // c10::OutOfMemoryError
#if LOONGFORGE_WITH_CUDA_KERNELS
#include <c10/cuda/CUDACachingAllocator.h>  // emptyCache, resetPeakStats, getDeviceStats, setMemoryFraction
#include <c10/cuda/CUDAFunctions.h>         // c10::cuda::device_synchronize
#include <c10/cuda/CUDAGuard.h>             // c10::cuda::CUDAGuard
#include <cuda_runtime_api.h>               // cudaMemGetInfo
#endif

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/data/batch.hpp"         // data::micro_batch_bytes, micro_batch_spec (what the data holds)
#include "loongforge/engines/adfe/adfe.hpp"  // adfe::enabled (its staging slot caps the choice)
#include "loongforge/trainer/micro_batch.hpp"
#include "trainer_impl.hpp"

namespace loongforge::trainer {

// Note [Micro-batch auto on resume]
// A resume with trainer.micro_batch_size: auto keeps the checkpoint's
// micro-batch instead of choosing again, on any device. The samples of each
// step depend only on (seed, global batch) (docs/training-semantics.md s2),
// but the draws inside the model (dropout masks, a GR00T head's state
// dropout) are per micro-batch (s4), so another size would continue with
// other draws than the run that wrote the checkpoint, and resume_from()
// refuses a checkpoint whose micro-batch differs for that reason. Keeping it
// makes the resumed run the one that was interrupted; the accumulation then
// follows from the global batch (check_resume adjusts it for another world
// size as for a set micro-batch). Nothing is probed, so a checkpoint written
// on a larger GPU can run out of memory here at its first step: the error
// then names trainer.micro_batch_size, and a number there starts over only
// through a new run (resume_from() would refuse the other size).
bool Trainer::Impl::micro_batch_unresolved() const {
  return cfg_.trainer.micro_batch_size_auto && cfg_.trainer.micro_batch_size == 0;
}

void Trainer::Impl::keep_checkpoint_micro_batch(const std::string& resume_dir) {
  const int64_t b = checkpoint_micro_batch(resume_dir);
  const int64_t g = cfg_.trainer.global_batch_size, w = world_info_.world_size;
  if (g % (b * w) != 0) {
    std::string fits;
    for (int64_t n = 1; n <= g / b; ++n)
      if (g % (b * n) == 0) fits += (fits.empty() ? "" : ", ") + std::to_string(n);
    throw CheckpointError("cannot resume '" + resume_dir + "' with trainer.micro_batch_size auto on " +
                          std::to_string(w) + " rank(s): a resume keeps the checkpoint's micro-batch, " +
                          std::to_string(b) + " (Note [Micro-batch auto on resume]), and " + std::to_string(b) +
                          " x " + std::to_string(w) + " rank(s) does not divide trainer.global_batch_size (" +
                          std::to_string(g) + "). Resume on " + (fits.empty() ? "1" : fits) +
                          " rank(s), or start a new run");
  }
  const std::string where = cfg_.origin["trainer.micro_batch_size"];
  config::resolve_auto_micro_batch(&cfg_, b, w);
  cfg_.origin["trainer.micro_batch_size"] += ", kept from " + resume_dir;
  micro_batch_choice_ = {{"micro_batch", b},
                         {"source", "checkpoint"},
                         {"checkpoint", resume_dir},
                         {"global_batch", g},
                         {"accumulation", cfg_.trainer.gradient_accumulation_steps},
                         {"world_size", w}};
  if (leader_)
    LF_LOG(logger("trainer"), info) << "trainer.micro_batch_size auto (" << where << "): " << b
                                    << ", the micro-batch of the checkpoint " << resume_dir
                                    << " (a resume keeps it: the draws inside each micro-batch depend on its size, "
                                       "docs/training-semantics.md s4); global batch "
                                    << g << " = " << b << " x accumulation " << cfg_.trainer.gradient_accumulation_steps
                                    << " x " << w << (w == 1 ? " rank" : " ranks") << "; nothing probed";
}

// What auto cannot do, said before the model loads.
void Trainer::Impl::check_micro_batch_auto() const {
  if (!micro_batch_unresolved()) return;
  const std::string at = cfg_.origin.count("trainer.micro_batch_size") ? cfg_.origin.at("trainer.micro_batch_size")
                                                                        : std::string("default");
  const std::string head = at + ": trainer.micro_batch_size is auto, which sizes the micro-batch to the GPU's memory";
  if (!device_.is_cuda())
    throw ConfigError(head + ", but this run is on the CPU (run.device=" + cfg_.run.device +
                      (cfg_.run.device == "auto" ? ", no GPU visible" : "") +
                      "): there is no device memory to fit, and host memory is not probed. Set "
                      "trainer.micro_batch_size to a number (the accumulation then follows from "
                      "trainer.global_batch_size). A resume (--resume) with auto keeps its checkpoint's micro-batch on "
                      "any device");
  if (!LOONGFORGE_WITH_CUDA_KERNELS)
    throw ConfigError(head + ", but this loongforge-train was built without CUDA (LOONGFORGE_CUDA=OFF, or no nvcc at "
                             "configure time), so it cannot read the device's memory: set trainer.micro_batch_size to "
                             "a number, or rebuild with CUDA");
  if (cfg_.mla.enable)
    throw ConfigError(head + " from the peaks of PyTorch's caching allocator, but mla.enable=true replaces it with "
                             "MLA's pools, whose peak cannot be reset between probes: set trainer.micro_batch_size "
                             "to a number, or mla.enable=false");
  if (cfg_.fault.enable)
    throw ConfigError(head + ", agreed over the ranks when they start, but fault.enable=true lets a rank join "
                             "later, which would probe and agree alone: set trainer.micro_batch_size to a number "
                             "(a run with auto that wrote a checkpoint resumes with its micro-batch), or "
                             "fault.enable=false");
}

#if LOONGFORGE_WITH_CUDA_KERNELS
namespace {

namespace alloc = c10::cuda::CUDACachingAllocator;

class NoPhases final : public PhaseRecorder {
 public:
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};

double reserved_bytes(c10::DeviceIndex device, bool peak) {
  using c10::CachingAllocator::StatType;
  const auto stats = alloc::getDeviceStats(device);  // a copy: the stat below must not outlive it
  const auto& s = stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)];
  return static_cast<double>(peak ? s.peak : s.current);
}

// Note [Test memory fraction]: LOONGFORGE_TEST_CUDA_MEMORY_FRACTION (a number
// in (0, 1]) caps what PyTorch's caching allocator may hold on the device at
// that fraction of it (c10's setMemoryFraction: an allocation past it is an
// out-of-memory error) for the whole run, and the probes see the smaller
// capacity. It exists so that a test on a large GPU can make it look small
// enough for the choice to step down (e2e_micro_batch_auto_gpu); it is no config key,
// because it changes nothing a training run should want.
double test_memory_fraction() {
  const char* text = std::getenv("LOONGFORGE_TEST_CUDA_MEMORY_FRACTION");
  if (text == nullptr || *text == '\0') return 1.0;
  char* end = nullptr;
  const double f = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(f > 0.0 && f <= 1.0))
    throw ConfigError(std::string("LOONGFORGE_TEST_CUDA_MEMORY_FRACTION='") + text +
                      "' must be a number in (0, 1] (Note [Test memory fraction]); unset it for a normal run");
  return f;
}

}  // namespace
#endif

// Note [What the probe does not see]
// A probe is one forward+backward of the TorchScript model on a synthetic
// batch (model::make_example_batch's sample, the model's own shapes, with
// every text and action position real, the longest a batch can be, repeated
// on the device to the probe's size) through the plain
// runner, after the model is loaded and its frozen weights cast: its peak
// holds the weights, the gradients and one micro-batch's activations and
// inputs. Added to it, each term logged: the optimizer's fp32 moments (8
// bytes per trainable element; divided over the ranks with
// gcts.shard_optimizer), the bf16 working copies where they may be made (2
// bytes per trainable element, an upper bound: only weights that linear layers
// alone read get one), the gradient communication's buffers on several ranks
// (one gradient's size in the reduce dtype, an upper bound), and what the
// data source holds on the device, which grows with the micro-batch (Note
// [The data's device memory]). The CUDA-graph pool is logged at 0: a graph holds
// the activations of one micro-batch, which the probe already counts, and the
// eager warm-up's blocks it leaves cached are released by the allocator when
// a capture needs the room. The compiled step (trainer.compiled_step) is
// compiled afterwards for the chosen size and is not what was measured; it
// and everything else unseen is what the headroom is for (Note [Micro-batch
// headroom] in micro_batch.cpp).
//
// Note [The data's device memory]
// The terms count the data as the run's source holds it on the device, sized
// from the run's SampleOptions (built before the choice: open_dataset in
// trainer_open.cpp) through data::micro_batch_spec, the tensors both sources
// allocate; not from the model's example batch, whose images are float at the
// model's size where frames resized on the device are staged as uint8 camera
// frames (for n16-tiny on the bundled dataset: 196,608 bytes a view at
// 256 x 256 x 3 against 49,152 at 3 x 64 x 64 floats). From the code:
//  - The trainer takes every micro-batch of a step before it runs any
//    (Trainer::Impl::step: their valid counts weight the losses) and drops
//    them after the backward: G / W samples, as the model takes them (float
//    images once finish_images ran), are on the device at the step's peak.
//    "the step's micro-batches", fixed.
//  - ADFE on a CUDA device (AsyncSource::produce and stage): the producer
//    stages each micro-batch into device tensors allocated on its copy stream,
//    resizes its frames there (finish_images), and only then waits for room
//    in a queue of at most prefetch_factor. While a step runs, the queue
//    refills: prefetch_factor ready micro-batches plus the one staged and
//    waiting, each of B samples. "ADFE's ready micro-batches
//    (prefetch_factor P + 1)", (P + 1) x B samples.
//  - With frames resized on the device (SampleOptions::frames_on_device,
//    data.frame_resize), the staged micro-batch's images are uint8 frames at
//    the cameras' cropped size; resize_frames allocates the float images
//    beside them (frames.cpp), and the uint8 ones are freed when it returns.
//    The producer may stage while the step runs: "frames before the device
//    resize", B samples of frames.
//  - The caching allocator reuses a freed block only for the stream it was
//    allocated on, so what the copy stream frees is not the main stream's
//    activations' to take (a wholly free segment is released to the device
//    when an allocation would fail; a partly used one is not).
//  - The plain source (adfe.enable=false: data/source.cpp) copies and
//    resizes on the trainer's stream when the step asks, one micro-batch at
//    a time: the step's micro-batches only. The uint8 frames it frees before
//    the forward go back to the stream whose activations reuse them.
// One micro-batch is counted twice: the probe's peak holds its own inputs,
// and the step's micro-batches include one of B samples. That stays as a
// margin for what the terms round away (the allocator's block sizes, a
// segment the copy stream leaves partly free). Under the 420 MB cap of
// docs/benchmarks.md (2026-12-07, n16-tiny, B = 128) the ADFE terms add about
// 62 MB to the terms that left a training step ~60 MB short; with them auto
// steps down there and the smaller choice trains (e2e_micro_batch_auto_gpu,
// an H100, session 55). Each term's own size was not measured apart.
void Trainer::Impl::resolve_micro_batch() {
  if (!micro_batch_unresolved()) return;
  check_micro_batch_auto();
#if LOONGFORGE_WITH_CUDA_KERNELS
  const c10::DeviceIndex dev = device_.index();
  const c10::cuda::CUDAGuard on_device(dev);  // cudaMemGetInfo reads the current device
  const double fraction = test_memory_fraction();
  if (fraction < 1.0) alloc::setMemoryFraction(fraction, dev);
  const int64_t w = world_info_.world_size, g = cfg_.trainer.global_batch_size;
  const model::ModelInfo& info = net_->info();

  MicroBatchInput in;
  in.global_batch = g, in.world_size = w;
  in.max_micro_batch = static_cast<int64_t>(config::find_key("trainer.micro_batch_size")->max);
  in.max_accumulation = static_cast<int64_t>(config::find_key("trainer.gradient_accumulation_steps")->max);
  alloc::emptyCache();
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
    throw ConfigError("trainer.micro_batch_size auto: cannot read the memory of " + device_.str() +
                      " (cudaMemGetInfo failed): set trainer.micro_batch_size to a number");
  // What this process may hold: what is free now plus what it holds already (the model), within the fraction.
  in.capacity_bytes = std::min(static_cast<double>(free_bytes) + reserved_bytes(dev, false),
                               fraction * static_cast<double>(total_bytes));
  const double trainable = static_cast<double>(info.trainable_params);
  const bool sharded = cfg_.gcts.enable && cfg_.gcts.shard_optimizer && w > 1;
  in.later.push_back({std::string("optimizer moments") + (sharded ? " (sharded)" : ""),
                      8.0 * trainable / (sharded ? static_cast<double>(w) : 1.0)});
  const std::string& copies = cfg_.precision.bf16_weights;
  if (bf16_ && (copies == "on" || (copies == "auto" && w == 1 && !sharded)))
    in.later.push_back({"bf16 working copies", 2.0 * trainable});
  if (w > 1)
    in.later.push_back({"gradient communication buffers",
                        (cfg_.gcts.enable && cfg_.gcts.reduce_dtype == "bf16" ? 2.0 : 4.0) * trainable});
  // The data source's micro-batches, as it stages and holds them (Note [The data's device memory]).
  const data::SampleOptions& so = sample_options_;
  data::SampleOptions sample = so;  // a sample as the model takes it: float images, as finish_images leaves them
  sample.micro_batch_size = 1, sample.frames_on_device = false;
  const bool adfe_on = adfe::enabled(cfg_);
  DataMemory data;
  data.step_samples = g / w;
  data.sample_bytes = static_cast<double>(data::micro_batch_bytes(sample));
  data.adfe = adfe_on, data.prefetch_factor = cfg_.adfe.prefetch_factor;
  if (so.frames_on_device) {  // a sample's uint8 frames before the device resize
    sample.frames_on_device = true;
    for (const data::TensorSpec& t : data::micro_batch_spec(sample))
      if (t.key == "images") data.frame_bytes = static_cast<double>(t.bytes());
  }
  for (MemoryTerm& t : data_terms(data)) in.later.push_back(std::move(t));
  // Note [ADFE's slot caps auto]: ADFE stages each micro-batch in a pinned host slot of adfe.slot_mb and
  // refuses a micro-batch larger than one (adfe::slot_size_problem), so a choice above what a slot holds would
  // stop the run when its source opens. The candidates stop at the largest micro-batch whose staged bytes
  // (adfe::staged_bytes: uint8 camera frames with frames resized on the device, each tensor aligned) fit a
  // slot, exactly what the source checks, and the line says so; a larger adfe.slot_mb lifts it. A slot that
  // holds not one sample is the source's error, raised here before any probe.
  if (adfe_on) {
    const int64_t fits = adfe::largest_micro_batch_in_slot(so, cfg_.adfe.slot_mb);
    if (fits == 0) {
      data::SampleOptions one = so;
      one.micro_batch_size = 1;
      throw ConfigError(adfe::slot_size_problem(one, cfg_.adfe.slot_mb));
    }
    if (fits < in.max_micro_batch) {
      in.max_micro_batch = fits;
      char why[200];
      std::snprintf(why, sizeof why,
                    "one ADFE staging slot (adfe.slot_mb %g MB) holds %lld samples as staged (%.0f kB "
                    "each); raise adfe.slot_mb for larger micro-batches",
                    cfg_.adfe.slot_mb, static_cast<long long>(fits),
                    static_cast<double>(adfe::staged_bytes(so, fits)) / static_cast<double>(fits) / 1024.0);
      in.limit = why;
    }
  }
  in.later.push_back({"CUDA-graph pool", 0.0});

  // The probes: the default generators are put back after them (a probe's forward reseeds them).
  at::Generator cpu_gen = at::globalContext().defaultGenerator(c10::Device(c10::kCPU));
  at::Generator gpu_gen = at::globalContext().defaultGenerator(device_);
  const at::Tensor cpu_state = cpu_gen.get_state(), gpu_state = gpu_gen.get_state();
  std::unique_ptr<fusion::StepRunner> runner = fusion::make_plain_runner(*net_, bf16_);
  NoPhases phases;
  // One synthetic sample, repeated on the device to each size (the memory of B samples without building them
  // on the host): every text and action position real, the longest a batch can be.
  model::Batch one = model::make_example_batch(info, 1, 0);
  one.at("text_mask").fill_(true);
  one.at("action_mask").fill_(1.0);
  for (auto& [key, t] : one) t = t.to(device_);
  auto clear = [&] {
    for (at::Tensor p : net_->trainable_parameters()) p.mutable_grad() = at::Tensor();
    alloc::emptyCache();
  };
  const Probe probe = [&](int64_t b) {
    ProbeResult r;
    clear();
    alloc::resetPeakStats(dev);
    try {
      std::vector<data::ReadyBatch> batches(1);
      for (const auto& [key, t] : one) {
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] = b;
        batches[0].tensors[key] = t.expand(shape).contiguous();
      }
      runner->run(batches, {1.0}, 0, phases);
      c10::cuda::device_synchronize();
      r.peak_bytes = reserved_bytes(dev, true);
    } catch (const c10::OutOfMemoryError&) {
      r.out_of_memory = true;
    }
    clear();
    return r;
  };
  std::string mine;
  MicroBatchChoice c;
  std::exception_ptr failed;
  try {
    c = choose_micro_batch(in, probe);
    mine = std::to_string(c.micro_batch);
  } catch (const std::exception& e) {
    failed = std::current_exception();
    mine = std::string("!") + e.what();  // every rank stops with it, none waits for the others' choices
  }
  one.clear();
  clear();
  cpu_gen.set_state(cpu_state), gpu_gen.set_state(gpu_state);

  // Several ranks: each probed its own device; all take the smallest choice (every one is a candidate).
  std::vector<std::string> all = world_ ? world_->all_gather_on_hosts(mine) : std::vector<std::string>{mine};
  if (failed) std::rethrow_exception(failed);
  const int64_t b = agree_on_smallest(all);
  std::vector<int64_t> chosen;
  for (const auto& v : all) chosen.push_back(std::stoll(v));
  const std::string where = cfg_.origin["trainer.micro_batch_size"];
  config::resolve_auto_micro_batch(&cfg_, b, w);
  micro_batch_choice_ = c.to_json(in);
  micro_batch_choice_["micro_batch"] = b;
  micro_batch_choice_["accumulation"] = cfg_.trainer.gradient_accumulation_steps;
  micro_batch_choice_["rank_choices"] = chosen;
  micro_batch_choice_["set_at"] = where;
  if (fraction < 1.0) micro_batch_choice_["test_memory_fraction"] = fraction;
  if (leader_) {
    std::string line = c.text(in);
    if (w > 1) {
      std::string list;
      for (const int64_t x : chosen) list += (list.empty() ? "" : ", ") + std::to_string(x);
      line += "; the ranks chose " + list + ": every rank trains with the smallest, " + std::to_string(b) +
              " (accumulation " + std::to_string(cfg_.trainer.gradient_accumulation_steps) + ")";
    }
    if (fraction < 1.0) line += "; LOONGFORGE_TEST_CUDA_MEMORY_FRACTION=" + std::to_string(fraction);
    LF_LOG(logger("trainer"), info) << line;
  }
#endif
}

}  // namespace loongforge::trainer
