// The plain BatchSource: synchronous build on the trainer thread, then a
// host-to-device copy (source.hpp).
#include "loongforge/data/source.hpp"

#include <atomic>  // std::atomic

#include "loongforge/data/frames.hpp"

namespace loongforge::data {

namespace {

class SyncSource final : public BatchSource {
 public:
  SyncSource(const std::vector<DataPart>& parts, const SampleOptions& options, c10::Device device,
             int64_t tokens_per_view)
      : builder_(parts, options),
        device_(device),
        image_tokens_per_sample_(options.num_views * tokens_per_view + 1),  // + the state token
        batch_size_(options.micro_batch_size),
        image_size_(options.image_size),
        pad_square_(options.image_aspect == "pad") {}

  ReadyBatch next(int64_t step, int64_t micro, PhaseRecorder& phases) override {
    ReadyBatch r;
    MicroBatch mb;
    {
      Phase p(phases, "data_wait", step + 1, micro);
      mb = builder_.micro_batch(step, micro);
    }
    r.num_valid = mb.num_valid;
    r.embodiments = mb.embodiments;
    r.tokens = mb.text_tokens + mb.action_tokens + batch_size_ * image_tokens_per_sample_;
    r.text_tokens = mb.text_tokens;
    r.text_len_max = mb.text_len_max;
    Phase p(phases, "h2d", step + 1, micro);
    // Through page-locked memory, so the copy is asynchronous (from pageable
    // memory the host would wait for it).
    for (auto& [key, t] : mb.tensors) {
      r.tensors.emplace(key, device_.is_cuda() ? t.pin_memory().to(device_, /*non_blocking=*/true) : t);
      if (device_.is_cuda()) h2d_bytes_ += static_cast<int64_t>(t.nbytes());
    }
    finish_images(r.tensors, image_size_, mb.blank_slots, pad_square_);
    return r;
  }
  const Sampler& sampler() const override { return builder_.sampler(); }
  DataStats stats() const override {
    DataStats d = builder_.stats();
    d.h2d_bytes = h2d_bytes_;
    return d;
  }

 private:
  BatchBuilder builder_;
  std::atomic<int64_t> h2d_bytes_{0};  // next()'s thread adds, stats() reads from any
  c10::Device device_;
  int64_t image_tokens_per_sample_, batch_size_, image_size_;
  bool pad_square_;  // data.image_aspect pad: the device resize pads each frame to a square
};

}  // namespace

void finish_images(Batch& tensors, int64_t image_size, const std::vector<int64_t>& blank_slots, bool pad_square) {
  const auto it = tensors.find("images");
  if (it != tensors.end() && it->second.scalar_type() == at::kByte)
    it->second = model_images(it->second, image_size, blank_slots, pad_square);
}

std::unique_ptr<BatchSource> make_sync_source(const std::vector<DataPart>& parts, const SampleOptions& options,
                                              c10::Device device, int64_t tokens_per_view) {
  return std::make_unique<SyncSource>(parts, options, device, tokens_per_view);
}

std::unique_ptr<BatchSource> make_sync_source(const Dataset& dataset, const SampleOptions& options,
                                              c10::Device device, int64_t tokens_per_view) {
  return make_sync_source({DataPart{&dataset, options.embodiment_id}}, options, device, tokens_per_view);
}

}  // namespace loongforge::data
