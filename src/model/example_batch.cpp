// Random well-formed batches for a model, sized from its config.json. Used by
// tests, warm-up and benchmarks; the data room builds real batches.
#include <ATen/ATen.h>  // at::randn, at::randint, at::Generator

#include "loongforge/common/error.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::model {

namespace {
int64_t field(const ModelInfo& info, const char* key) {
  if (!info.config.contains(key))
    throw ModelError(info.path + ": config.json has no '" + std::string(key) + "': re-export the model");
  return info.config.at(key).get<int64_t>();
}
}  // namespace

Batch make_example_batch(const ModelInfo& info, int64_t batch_size, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t B = batch_size;
  const int64_t V = field(info, "num_views");
  const int64_t S = field(info, "image_size");
  const int64_t H = field(info, "action_horizon");
  const int64_t L = field(info, "max_text_len");
  const int64_t A = field(info, "max_action_dim");
  const int64_t D = field(info, "max_state_dim");
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const auto i64 = at::TensorOptions().dtype(at::kLong);

  Batch b;
  b["images"] = at::randn({B, V, 3, S, S}, gen, f32);                      // (B, V, 3, S, S)
  b["text_tokens"] = at::randint(4, 8192, {B, L}, gen, i64);               // (B, L)
  auto text_len = at::randint(2, L + 1, {B, 1}, gen, i64);                 // (B, 1)
  b["text_mask"] = at::arange(L, i64).unsqueeze(0) < text_len;             // (B, L) bool
  b["text_tokens"].masked_fill_(b["text_mask"].logical_not(), 0);
  b["state"] = at::randn({B, D}, gen, f32);                                // (B, D)
  b["actions"] = at::randn({B, H, A}, gen, f32);                           // (B, H, A)
  // Valid: the first `valid_steps` rows (episode end) and the first 44 dims.
  auto valid_steps = at::randint(1, H + 1, {B, 1, 1}, gen, i64);
  auto rows = at::arange(H, i64).view({1, H, 1}) < valid_steps;
  auto dims = at::arange(A, i64).view({1, 1, A}) < std::min<int64_t>(A, 44);
  b["action_mask"] = (rows & dims).to(at::kFloat);                         // (B, H, A)
  b["embodiment_id"] = at::randint(0, field(info, "num_embodiments"), {B}, gen, i64);  // (B,)
  b["fm_t"] = at::rand({B}, gen, f32);                                     // (B,)
  b["fm_noise"] = at::randn({B, H, A}, gen, f32);                          // (B, H, A)
  if (info.config.value("use_imu", false))
    b["imu"] = at::randn({B, field(info, "imu_len"), field(info, "imu_channels")}, gen, f32);
  if (info.config.value("use_audio", false))
    b["audio"] = at::randn({B, field(info, "audio_len"), field(info, "audio_features")}, gen, f32);
  return b;
}

}  // namespace loongforge::model
