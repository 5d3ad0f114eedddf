// Sample order, sample construction and micro-batches
// (docs/training-semantics.md sections 1-4, implemented line by line).
#include "loongforge/data/batch.hpp"

#include <algorithm>  // std::upper_bound, std::min
#include <chrono>     // std::chrono::steady_clock

#include <ATen/ATen.h>  // at::adaptive_avg_pool2d, at::rand, at::randn

#include "loongforge/data/video.hpp"

namespace loongforge::data {

// ---------------------------------------------------------------------------
// Order (s2)

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    state += kGolden;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};
}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  SplitMix64 rng{seed + static_cast<uint64_t>(epoch) * kGolden};
  for (int64_t i = n - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(rng.next() % static_cast<uint64_t>(i + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

Sampler::Sampler(int64_t num_samples, uint64_t seed, bool shuffle, int64_t rank, int64_t world,
                 int64_t micro_batch_size, int64_t accumulation)
    : n_(num_samples),
      rank_(rank),
      world_(world),
      batch_(micro_batch_size),
      accumulation_(accumulation),
      global_(micro_batch_size * accumulation * world),
      seed_(seed),
      shuffle_(shuffle) {
  if (world_ < 1 || rank_ < 0 || rank_ >= world_ || batch_ < 1 || accumulation_ < 1)
    throw DataError("sampler: rank " + std::to_string(rank_) + " of world " + std::to_string(world_) +
                    ", micro_batch_size " + std::to_string(batch_) + ", accumulation " + std::to_string(accumulation_) +
                    ": need 0 <= rank < world and sizes >= 1");
  steps_per_epoch_ = n_ / global_;
  if (steps_per_epoch_ < 1)
    throw DataError("the dataset has " + std::to_string(n_) +
                    " samples, fewer than one global batch G = B x K x W = " + std::to_string(batch_) + " x " +
                    std::to_string(accumulation_) + " x " + std::to_string(world_) + " = " + std::to_string(global_) +
                    " (trainer.micro_batch_size x trainer.gradient_accumulation_steps x world size): lower "
                    "trainer.micro_batch_size or trainer.gradient_accumulation_steps, or use fewer ranks");
}

std::vector<int64_t> Sampler::micro_batch(int64_t step, int64_t i) {
  if (i < 0 || i >= accumulation_)
    throw DataError("sampler: micro-batch " + std::to_string(i) + " of a step with gradient_accumulation_steps " +
                    std::to_string(accumulation_));
  const int64_t epoch = step / steps_per_epoch_;
  if (epoch != cached_epoch_) {
    if (shuffle_) {
      perm_ = epoch_permutation(n_, seed_, epoch);
    } else {
      perm_.resize(static_cast<size_t>(n_));
      for (int64_t k = 0; k < n_; ++k) perm_[k] = k;
    }
    cached_epoch_ = epoch;
  }
  const int64_t block = (step % steps_per_epoch_) * global_;
  std::vector<int64_t> ids(static_cast<size_t>(batch_));
  for (int64_t b = 0; b < batch_; ++b) ids[b] = perm_[block + i * batch_ * world_ + b * world_ + rank_];
  return ids;
}

int64_t Sampler::stream_position(int64_t step, int64_t i, int64_t b) const {
  return step * global_ + i * batch_ * world_ + b * world_ + rank_;
}

// ---------------------------------------------------------------------------
// Sample construction (s3)

namespace {
std::vector<double> require_stat(const std::vector<double>& v, int64_t width, const std::string& what) {
  if (static_cast<int64_t>(v.size()) != width)
    throw DataError("stats '" + what + "' have " + std::to_string(v.size()) + " values, the column has " +
                    std::to_string(width) + "; re-convert the dataset");
  return v;
}

// min_max: ((2 * (x - min)) / d) - 1 with d = max - min; mean_std: (x - mean) / std;
// in float64, 0 where d or std < 1e-8 (s3).
inline float normalize(float x, double a, double b, bool mean_std) {
  if (mean_std) return b < 1e-8 ? 0.0f : static_cast<float>((static_cast<double>(x) - a) / b);
  const double d = b - a;
  if (d < 1e-8) return 0.0f;
  return static_cast<float>(((2.0 * (static_cast<double>(x) - a)) / d) - 1.0);
}
}  // namespace

BatchBuilder::BatchBuilder(const Dataset& dataset, SampleOptions options)
    : ds_(dataset),
      opt_(options),
      sampler_(dataset.total_rows(), options.seed, options.shuffle, options.rank, options.world,
               options.micro_batch_size, options.accumulation) {
  episode_start_.push_back(0);
  for (const auto& e : ds_.episodes()) episode_start_.push_back(episode_start_.back() + e.length);

  state_col_ = ds_.column_by_role("state");
  action_col_ = ds_.column_by_role("action");
  if (state_col_ < 0 || action_col_ < 0)
    throw DataError(ds_.dir() + ": the dataset has no state or action column (modality.json groups)");
  for (const auto& c : ds_.columns())
    if (c.role == "annotation" && c.name.size() >= 16 &&
        c.name.compare(c.name.size() - 16, 16, "task_description") == 0)
      task_col_ = c.id;
  if (task_col_ < 0) task_col_ = ds_.column_by_role("task_index");
  if (task_col_ < 0) throw DataError(ds_.dir() + ": the dataset has neither a task_description annotation nor task_index");

  const auto& sc = ds_.columns()[state_col_];
  const auto& ac = ds_.columns()[action_col_];
  if (sc.width > opt_.max_state_dim || ac.width > opt_.max_action_dim)
    throw DataError(ds_.dir() + ": state width " + std::to_string(sc.width) + " / action width " +
                    std::to_string(ac.width) + " exceed the model's max_state_dim " +
                    std::to_string(opt_.max_state_dim) + " / max_action_dim " + std::to_string(opt_.max_action_dim));
  mean_std_ = opt_.normalization == "mean_std";
  const Stats& ss = ds_.stats(sc.name);
  const Stats& as = ds_.stats(ac.name);
  state_a_ = require_stat(mean_std_ ? ss.mean : ss.min, sc.width, sc.name + (mean_std_ ? ".mean" : ".min"));
  state_b_ = require_stat(mean_std_ ? ss.std : ss.max, sc.width, sc.name + (mean_std_ ? ".std" : ".max"));
  action_a_ = require_stat(mean_std_ ? as.mean : as.min, ac.width, ac.name + (mean_std_ ? ".mean" : ".min"));
  action_b_ = require_stat(mean_std_ ? as.std : as.max, ac.width, ac.name + (mean_std_ ? ".std" : ".max"));

  for (const auto& cam : ds_.cameras()) {
    if (cam.modality_name.empty()) continue;
    const int col = ds_.column_by_name("video_frame:" + cam.key);
    if (col < 0) throw DataError(ds_.dir() + ": no video_frame column for camera '" + cam.key + "'");
    cameras_.push_back(cam.id);
    frame_cols_.push_back(col);
  }
  if (static_cast<int64_t>(cameras_.size()) != opt_.num_views)
    throw DataError(ds_.dir() + ": the dataset has " + std::to_string(cameras_.size()) +
                    " camera(s) used by modality.json but the model expects num_views = " +
                    std::to_string(opt_.num_views) + " (re-export the model with --set num_views=" +
                    std::to_string(cameras_.size()) + ")");
}

BatchBuilder::Location BatchBuilder::locate(int64_t sample_id) const {
  const auto it = std::upper_bound(episode_start_.begin(), episode_start_.end(), sample_id);
  const size_t e = static_cast<size_t>(it - episode_start_.begin()) - 1;
  return {e, sample_id - episode_start_[e]};
}

const at::Tensor& BatchBuilder::frames(size_t episode, int camera) {
  const int64_t key = static_cast<int64_t>(episode) * 1024 + camera;
  auto hit = cache_.find(key);
  if (hit != cache_.end()) {
    lru_.remove(key);
    lru_.push_front(key);
    return hit->second;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string& path = ds_.episodes()[episode].video_paths.at(camera);
  RgbFrames rgb = decode_video_rgb(path);
  const int64_t S = opt_.image_size;
  const auto u8 = at::from_blob(rgb.pixels.data(), {rgb.count, rgb.height, rgb.width, 3}, at::kByte);
  at::Tensor out = at::empty({rgb.count, 3, S, S}, at::kFloat);
  constexpr int64_t kChunk = 64;  // bounds the float copy of full-size frames
  for (int64_t i = 0; i < rgb.count; i += kChunk) {
    const int64_t n = std::min(kChunk, rgb.count - i);
    at::Tensor f = u8.narrow(0, i, n).permute({0, 3, 1, 2}).to(at::kFloat).contiguous();  // (n, 3, h, w)
    at::Tensor pooled = at::adaptive_avg_pool2d(f, {S, S});                                  // (n, 3, S, S)
    out.narrow(0, i, n).copy_(((pooled / 255.0) - 0.5) / 0.5);
  }
  stats_.videos_decoded += 1;
  stats_.frames_decoded += rgb.count;
  stats_.decode_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  cache_bytes_ += out.numel() * 4;
  lru_.push_front(key);
  cache_[key] = out;
  while (cache_bytes_ > opt_.frame_cache_mb * (1 << 20) && lru_.size() > 1) {
    const int64_t old = lru_.back();
    lru_.pop_back();
    cache_bytes_ -= cache_[old].numel() * 4;
    cache_.erase(old);
  }
  return cache_[key];
}

void BatchBuilder::fill(int64_t slot, int64_t sample_id, MicroBatch& mb) {
  Batch& b = mb.tensors;
  const Location loc = locate(sample_id);
  const EpisodeInfo& ep = ds_.episodes()[loc.episode];
  const int64_t t = loc.row, L = ep.length, H = opt_.action_horizon;

  const ArrayView state = ds_.array(loc.episode, state_col_);
  float* s_out = b["state"][slot].data_ptr<float>();
  for (int64_t j = 0; j < state.width; ++j)
    s_out[j] = normalize(state.as<float>()[t * state.width + j], state_a_[j], state_b_[j], mean_std_);

  const ArrayView action = ds_.array(loc.episode, action_col_);
  float* a_out = b["actions"][slot].data_ptr<float>();
  float* m_out = b["action_mask"][slot].data_ptr<float>();
  const int64_t A = opt_.max_action_dim;
  for (int64_t k = 0; k < H && t + k < L; ++k) {
    for (int64_t j = 0; j < action.width; ++j) {
      a_out[k * A + j] = normalize(action.as<float>()[(t + k) * action.width + j], action_a_[j], action_b_[j],
                                   mean_std_);
      m_out[k * A + j] = 1.0f;
    }
    if (action.width > 0) mb.action_tokens += 1;
    mb.num_valid += action.width;
  }

  const int64_t task = ds_.array(loc.episode, task_col_).as<int64_t>()[t];
  const auto it = ds_.tasks().find(task);
  if (it == ds_.tasks().end())
    throw DataError(ds_.dir() + ": episode " + std::to_string(ep.index) + " row " + std::to_string(t) +
                    " names task " + std::to_string(task) + ", which is not in the task table");
  const auto& ids = it->second.token_ids;
  int64_t* tok = b["text_tokens"][slot].data_ptr<int64_t>();
  bool* tmask = b["text_mask"][slot].data_ptr<bool>();
  for (int64_t k = 0; k < std::min<int64_t>(opt_.max_text_len, static_cast<int64_t>(ids.size())); ++k) {
    tok[k] = ids[k];
    tmask[k] = true;
    mb.text_tokens += 1;
  }

  for (size_t v = 0; v < cameras_.size(); ++v) {
    const int64_t f = ds_.array(loc.episode, frame_cols_[v]).as<int64_t>()[t];
    const at::Tensor& fr = frames(loc.episode, cameras_[v]);
    if (f < 0 || f >= fr.size(0))
      throw DataError(ep.video_paths[cameras_[v]] + ": row " + std::to_string(t) + " needs frame " +
                      std::to_string(f) + " but the video decodes to " + std::to_string(fr.size(0)) +
                      " frames (truncated video?)");
    b["images"][slot][static_cast<int64_t>(v)].copy_(fr[f]);
  }
  b["embodiment_id"][slot].fill_(opt_.embodiment_id);
}

namespace {
Batch empty_batch(const SampleOptions& o, int64_t B) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  Batch b;
  b["images"] = at::empty({B, o.num_views, 3, o.image_size, o.image_size}, f32);  // (B, V, 3, S, S)
  b["state"] = at::zeros({B, o.max_state_dim}, f32);                              // (B, D)
  b["actions"] = at::zeros({B, o.action_horizon, o.max_action_dim}, f32);         // (B, H, A)
  b["action_mask"] = at::zeros({B, o.action_horizon, o.max_action_dim}, f32);     // (B, H, A)
  b["text_tokens"] = at::zeros({B, o.max_text_len}, at::kLong);                   // (B, L)
  b["text_mask"] = at::zeros({B, o.max_text_len}, at::kBool);                     // (B, L)
  b["embodiment_id"] = at::zeros({B}, at::kLong);                                 // (B,)
  return b;
}
}  // namespace

Batch BatchBuilder::sample(int64_t sample_id) {
  MicroBatch mb{empty_batch(opt_, 1)};
  fill(0, sample_id, mb);
  return std::move(mb.tensors);
}

MicroBatch BatchBuilder::micro_batch(int64_t step, int64_t i) {
  const std::vector<int64_t> ids = sampler_.micro_batch(step, i);
  const int64_t B = static_cast<int64_t>(ids.size());
  MicroBatch mb{empty_batch(opt_, B)};
  for (int64_t b = 0; b < B; ++b) fill(b, ids[b], mb);

  // Flow-matching draws, one generator per sample at its stream position (s4).
  at::Tensor fm_t = at::empty({B}, at::kFloat);                                             // (B,)
  at::Tensor noise = at::empty({B, opt_.action_horizon, opt_.max_action_dim}, at::kFloat);  // (B, H, A)
  for (int64_t b = 0; b < B; ++b) {
    const auto p = static_cast<uint64_t>(sampler_.stream_position(step, i, b));
    auto gen = at::make_generator<at::CPUGeneratorImpl>((opt_.seed * 1000003ull + p) & 0x7FFFFFFFFFFFFFFFull);
    const at::Tensor u = at::rand({1}, gen, at::kFloat);  // (1,)
    fm_t.narrow(0, b, 1).copy_(at::div(at::rsub(at::pow(u, 1.0 / 1.5), 0.999), 0.999));
    noise[b].copy_(at::randn({opt_.action_horizon, opt_.max_action_dim}, gen, at::kFloat));  // (H, A)
  }
  mb.tensors["fm_t"] = fm_t;
  mb.tensors["fm_noise"] = noise;
  return mb;
}

}  // namespace loongforge::data
