// Proves ADFE's CUDA staging (source.hpp, Note [ADFE]): micro-batches packed
// into pinned slots and copied on the copy stream arrive on the device equal,
// bit for bit, to the plain source's CPU tensors, with more micro-batches than
// slots (so slots are reused) and work queued on the caller's stream between
// them; and a slot too small for a micro-batch is refused at construction
// naming adfe.slot_mb. GPU only (label gpu).
#include <string>  // std::string

#include <ATen/ATen.h>            // at::equal
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getCurrentCUDAStream

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/engines/adfe/adfe.hpp"

using namespace loongforge;
using namespace loongforge::data;
using lf_catch::Contains;

namespace {
struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
} no_phases;

SampleOptions options() {
  SampleOptions o;
  o.micro_batch_size = 4;
  o.accumulation = 2;
  o.image_size = 64;
  return o;
}
}  // namespace

TEST_CASE("adfe gpu: micro-batches staged through pinned slots and the copy stream equal the plain source's") {
  const Dataset ds = Dataset::open(LOONGFORGE_TEST_DATASET);
  const SampleOptions o = options();
  const c10::Device gpu(c10::kCUDA, 0);
  auto sync = make_sync_source(ds, o, c10::kCPU, 16);
  auto adfe = adfe::make_async_source(ds, o, gpu, 16, {2, 2, 8.0});  // 2 slots, 6 micro-batches
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t i = 0; i < o.accumulation; ++i) {
      INFO("step " << s << " micro " << i);
      const ReadyBatch want = sync->next(s, i, no_phases);
      ReadyBatch got = adfe->next(s, i, no_phases);
      REQUIRE(got.num_valid == want.num_valid);
      for (auto& [key, t] : got.tensors) {
        INFO("key " << key);
        REQUIRE(t.device() == gpu);
        // Work on the caller's stream that reads the batch: ordered after the copy.
        const at::Tensor read = t.clone();
        REQUIRE(at::equal(read.cpu(), want.tensors.at(key)));
      }
    }
}

TEST_CASE("adfe gpu: with frames resized on the device, both sources' micro-batches equal the CPU-resize ones "
          "bit for bit") {
  const Dataset ds = Dataset::open(LOONGFORGE_TEST_DATASET);
  const SampleOptions o = options();
  SampleOptions dev = o;
  dev.image_crop_fraction = 0.9;
  SampleOptions cpu_crop = dev;
  dev.frames_on_device = true;
  dev.frame_height = cropped_size(ds.cameras()[0].height, dev.image_crop_fraction);
  dev.frame_width = cropped_size(ds.cameras()[0].width, dev.image_crop_fraction);
  const c10::Device gpu(c10::kCUDA, 0);
  auto want_src = make_sync_source(ds, cpu_crop, c10::kCPU, 16);
  auto sync = make_sync_source(ds, dev, gpu, 16);
  auto adfe = adfe::make_async_source(ds, dev, gpu, 16, {2, 2, 8.0});
  for (int64_t s = 0; s < 3; ++s)
    for (int64_t i = 0; i < o.accumulation; ++i) {
      INFO("step " << s << " micro " << i);
      const ReadyBatch want = want_src->next(s, i, no_phases);
      for (auto* src : {sync.get(), adfe.get()}) {
        const ReadyBatch got = src->next(s, i, no_phases);
        const at::Tensor images = got.tensors.at("images").clone();  // on the caller's stream
        REQUIRE(images.device() == gpu);
        REQUIRE(images.scalar_type() == at::kFloat);
        REQUIRE(at::equal(images.cpu(), want.tensors.at("images")));
      }
    }
}

TEST_CASE("adfe gpu: a micro-batch larger than adfe.slot_mb is refused when the source is made") {
  const Dataset ds = Dataset::open(LOONGFORGE_TEST_DATASET);
  SampleOptions o = options();
  o.micro_batch_size = 64;  // about 4 MB
  REQUIRE_THROWS_WITH(adfe::make_async_source(ds, o, c10::Device(c10::kCUDA, 0), 16, {2, 2, 1.0}),
                      Contains("adfe.slot_mb is 1 MB but one micro-batch needs"));
}
