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
  auto adfe = make_async_source(ds, o, gpu, 16, {2, 2, 8.0});  // 2 slots, 6 micro-batches
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

TEST_CASE("adfe gpu: a micro-batch larger than adfe.slot_mb is refused when the source is made") {
  const Dataset ds = Dataset::open(LOONGFORGE_TEST_DATASET);
  SampleOptions o = options();
  o.micro_batch_size = 64;  // about 4 MB
  REQUIRE_THROWS_WITH(make_async_source(ds, o, c10::Device(c10::kCUDA, 0), 16, {2, 2, 1.0}),
                      Contains("adfe.slot_mb is 1 MB but one micro-batch needs"));
}
