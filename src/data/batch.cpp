// Sample order, sample construction and micro-batches
// (docs/training-semantics.md sections 1-4, implemented line by line).
#include "loongforge/data/batch.hpp"

#include <algorithm>  // std::upper_bound, std::min, std::find
#include <chrono>     // std::chrono::steady_clock
#include <cmath>      // std::fabs
#include <cstdio>     // std::snprintf
#include <cstring>    // std::memcpy
#include <exception>  // std::rethrow_exception
#include <map>        // std::map
#include <mutex>      // std::lock_guard, std::unique_lock
#include <numeric>    // std::accumulate

#include <fcntl.h>     // open, posix_fadvise
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close

#include <ATen/ATen.h>  // at::adaptive_avg_pool2d, at::rand, at::randn

#include "loongforge/common/log.hpp"
#include "loongforge/data/check.hpp"  // dataset_video_check
#include "loongforge/data/frames.hpp"
#include "loongforge/data/video.hpp"

namespace loongforge::data {

// ---------------------------------------------------------------------------
// Order (s2)

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
// Full-size frames a decoding thread holds before resizing them (Note [Frame cache]):
// this many bytes of uint8 RGB, at least one frame, at most 64 frames.
constexpr int64_t kStagingBytes = 8 << 20;

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

std::vector<int64_t> episode_order(const std::vector<int64_t>& lengths, uint64_t seed, int64_t epoch, int64_t open,
                                   int64_t buffer) {
  std::vector<int64_t> start(lengths.size() + 1, 0);
  for (size_t e = 0; e < lengths.size(); ++e) start[e + 1] = start[e] + lengths[e];
  const std::vector<int64_t> episodes =
      epoch_permutation(static_cast<int64_t>(lengths.size()), seed ^ kEpisodeOrderSalt, epoch);
  SplitMix64 rng{(seed ^ kEpisodeOrderSalt) + static_cast<uint64_t>(epoch) * kGolden + kGolden / 2};
  struct Cursor {
    int64_t next, end;
  };
  std::vector<Cursor> reading;  // the open episodes
  size_t taken = 0;             // episodes opened so far, in `episodes` order
  auto open_next = [&](Cursor& c) {  // the next non-empty episode; false when none is left
    while (taken < episodes.size()) {
      const int64_t e = episodes[taken++];
      if (lengths[e] > 0) {
        c = {start[e], start[e + 1]};
        return true;
      }
    }
    return false;
  };
  for (Cursor c{}; static_cast<int64_t>(reading.size()) < open && open_next(c);) reading.push_back(c);
  std::vector<int64_t> out, held;
  out.reserve(static_cast<size_t>(start.back()));
  auto release = [&] {  // a uniformly drawn held sample leaves (swap with the last)
    const auto k = static_cast<size_t>(rng.next() % held.size());
    out.push_back(held[k]);
    held[k] = held.back();
    held.pop_back();
  };
  size_t j = 0;
  while (!reading.empty()) {
    held.push_back(reading[j].next++);
    if (reading[j].next == reading[j].end && !open_next(reading[j])) {
      reading.erase(reading.begin() + static_cast<std::ptrdiff_t>(j));
      if (j == reading.size()) j = 0;
    } else {
      j = (j + 1) % reading.size();
    }
    if (static_cast<int64_t>(held.size()) >= buffer) release();
  }
  while (!held.empty()) release();
  return out;
}

void Sampler::use_episode_order(std::vector<int64_t> episode_lengths, int64_t open, int64_t buffer) {
  int64_t total = 0;
  for (const int64_t l : episode_lengths) total += l;
  if (total != n_ || open < 1 || buffer < 1)
    throw DataError("sampler: episode order over " + std::to_string(total) + " samples for a dataset of " +
                    std::to_string(n_) + " (open " + std::to_string(open) + ", buffer " + std::to_string(buffer) +
                    ")");
  episode_lengths_ = std::move(episode_lengths);
  open_episodes_ = open, shuffle_buffer_ = buffer;
  cached_epoch_ = -1;
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
    if (shuffle_ && !episode_lengths_.empty()) {
      perm_ = episode_order(episode_lengths_, seed_, epoch, open_episodes_, shuffle_buffer_);
    } else if (shuffle_) {
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

int64_t cropped_size(int64_t n, double f) {
  return f < 1.0 ? std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(n) * f)) : n;
}

FrameWindow box_window(int64_t h, int64_t w, double f, const std::string& image_aspect) {
  FrameWindow win;
  win.height = cropped_size(h, f), win.width = cropped_size(w, f);
  win.top = (h - win.height) / 2, win.left = (w - win.width) / 2;
  if (image_aspect == "crop" && win.height != win.width) {
    const int64_t side = std::min(win.height, win.width);
    win.top += (win.height - side) / 2, win.left += (win.width - side) / 2;
    win.height = win.width = side;
  }
  return win;
}

std::pair<int64_t, int64_t> common_cropped_size(const Dataset& ds, double f, std::string* why) {
  int64_t h = 0, w = 0;
  std::string first;
  for (const auto& cam : ds.cameras()) {
    if (cam.modality_name.empty()) continue;
    const int64_t ch = cropped_size(cam.height, f), cw = cropped_size(cam.width, f);
    if (h == 0) {
      h = ch, w = cw, first = cam.key;
    } else if (ch != h || cw != w) {
      *why = "its cameras differ in size after the crop ('" + first + "' " + std::to_string(w) + "x" +
             std::to_string(h) + ", '" + cam.key + "' " + std::to_string(cw) + "x" + std::to_string(ch) + ")";
      return {0, 0};
    }
  }
  if (h == 0) *why = "the dataset has no cameras";
  return {h, w};
}

std::pair<int64_t, int64_t> common_cropped_size(const Mixture& mixture, double f, std::string* why) {
  std::pair<int64_t, int64_t> first{0, 0};
  for (size_t k = 0; k < mixture.datasets.size(); ++k) {
    const Dataset& ds = *mixture.datasets[k];
    const auto size = common_cropped_size(ds, f, why);
    if (size.first == 0) {
      if (mixture.from_file) *why = ds.dir() + ": " + *why;
      return {0, 0};
    }
    if (k == 0) {
      first = size;
    } else if (size != first) {
      *why = "the mixture's datasets differ in camera size after the crop (" + mixture.datasets[0]->dir() + " " +
             std::to_string(first.second) + "x" + std::to_string(first.first) + ", " + ds.dir() + " " +
             std::to_string(size.second) + "x" + std::to_string(size.first) + ")";
      return {0, 0};
    }
  }
  return first;
}

namespace {
std::vector<double> require_stat(const std::vector<double>& v, int64_t width, const std::string& what) {
  if (static_cast<int64_t>(v.size()) != width)
    throw DataError("stats '" + what + "' have " + std::to_string(v.size()) + " values, the column has " +
                    std::to_string(width) + "; re-convert the dataset");
  return v;
}

// min_max: ((2 * (x - min)) / d) - 1 with d = max - min; mean_std: (x - mean) / std;
// in float64, 0 where d or std < 1e-8 (s3).
inline float normalize(double x, double a, double b, bool mean_std) {
  if (mean_std) return b < 1e-8 ? 0.0f : static_cast<float>((x - a) / b);
  const double d = b - a;
  if (d < 1e-8) return 0.0f;
  return static_cast<float>(((2.0 * (x - a)) / d) - 1.0);
}

// Row r of a float32 or float64 column as doubles (float32 widened exactly).
void row_as_double(const ArrayView& a, int64_t r, double* out) {
  if (a.dtype == DType::Float64) {
    std::memcpy(out, a.as<double>() + r * a.width, static_cast<size_t>(a.width) * sizeof(double));
    return;
  }
  const float* p = a.as<float>() + r * a.width;
  for (int64_t j = 0; j < a.width; ++j) out[j] = p[j];
}
// Note [Tokenizer match]
// The token ids in the dataset index rows of the model's text embedding, so they
// must come from the tokenizer the model was exported for: the same kind and,
// for a Hugging Face tokenizer.json, the same SHA-256 of that file. The word
// hash is one fixed algorithm (pinned by test/model/test_tokenizer.py's golden
// ids), so its records match by kind alone and editing tokenizer.py's comments
// does not invalidate converted datasets. An export without the record predates
// it and was built for the word hash. The text form (how the task text was changed
// before tokenizing, e.g. upstream GR00T N1.7's formalize_language) must match too:
// "Pick the cube." and "pick the cube" are different ids.
void check_tokenizer_match(const Dataset& ds, const SampleOptions& opt) {
  const TokenizerInfo& d = ds.tokenizer();
  const TokenizerInfo& m = opt.model_tokenizer;
  const std::string where = ds.dir() + "/loongforge_dataset.json";
  auto describe = [](const TokenizerInfo& t) {
    return t.kind + " '" + t.file + "' (sha256 " + t.sha256.substr(0, 16) + "...)";
  };
  if (m.kind.empty()) {
    if (d.kind == "word_hash") return;
    throw DataError(where + ": task texts were tokenized with " + describe(d) + " but the model " + opt.model_path +
                    " records no tokenizer (it was exported for the word hash); re-export the model with "
                    "`scripts/model/export.py ... --tokenizer " + d.file + "`");
  }
  if (m.kind == d.kind && (m.kind == "word_hash" || m.sha256 == d.sha256)) {
    if (m.text_form == d.text_form) return;
    const std::string flag = m.text_form == "gr00t_formalized"       ? " --formalize-language"
                             : m.text_form == "gr00t_n16_formalized" ? " --formalize-language n16"
                                                                     : ", without --formalize-language";
    throw DataError(where + ": text form mismatch: task texts were tokenized " + d.text_form + " but the model " +
                    opt.model_path + " reads " + m.text_form + " texts (" + describe(m) +
                    "); re-convert the dataset (scripts/convert_lerobot.py SRC DST --tokenizer " + m.file + flag +
                    ")");
  }
  const std::string fix_data = m.kind == "word_hash" ? std::string("without --tokenizer") : "with --tokenizer " + m.file;
  const std::string fix_model = d.kind == "word_hash" ? std::string("without --tokenizer") : "with --tokenizer " + d.file;
  throw DataError(where + ": tokenizer mismatch: task texts were tokenized with " + describe(d) + " but the model " +
                  opt.model_path + " was exported for " + describe(m) +
                  "; re-convert the dataset (scripts/convert_lerobot.py SRC DST " + fix_data +
                  ") or re-export the model (scripts/model/export.py " + fix_model + ")");
}
}  // namespace


std::vector<int64_t> sample_rows(const Dataset& ds, const ProcessorRecord& record) {
  const int64_t v = record.form == ProcessorForm::gr00t_n16 ? record.valid_horizon : 0;
  std::vector<int64_t> rows;
  for (const auto& e : ds.episodes()) rows.push_back(v > 0 ? std::max<int64_t>(0, e.length - v + 1) : e.length);
  return rows;
}

namespace {
int64_t sum_of(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

// data.image_aspect: squash, crop or pad, the last two for the box resize of a model without an upstream
// processor record only (an import keeps upstream's transform, as its weights were trained).
void check_image_aspect(const SampleOptions& o) {
  if (o.image_aspect != "squash" && o.image_aspect != "crop" && o.image_aspect != "pad")
    throw ConfigError("data.image_aspect is '" + o.image_aspect + "'; expected squash, crop or pad");
  if (o.image_aspect == "squash") return;
  if (o.processor.upstream())  // upstream's transform decides the aspect
    throw ConfigError("data.image_aspect=" + o.image_aspect + ": the model " + o.model_path +
                      " was imported from an upstream GR00T " + o.processor.upstream_name() +
                      " checkpoint (batch_spec.json processor) and keeps upstream's image preprocessing "
                      "(image_resample " + o.image_resample +
                      (o.image_letterbox ? ", image_letterbox: a frame that is not square is padded"
                                         : ": a frame that is not square is squashed") +
                      "), as its weights were trained; remove data.image_aspect (or set it to squash)");
  if (o.image_resample != "box")
    throw ConfigError("data.image_aspect=" + o.image_aspect + " applies to the box resize of n16 exports, but "
                      "the model " + o.model_path + " resizes by image_resample " + o.image_resample +
                      " (an upstream transform, fixed at export or import; its config.json image_letterbox pads "
                      "instead); remove data.image_aspect (or set it to squash)");
}
}  // namespace

namespace {
// The sample rows of each episode of the parts, in order (sample_rows per part).
std::vector<int64_t> rows_of(const std::vector<DataPart>& parts, const ProcessorRecord& record) {
  std::vector<int64_t> rows;
  for (const auto& p : parts) {
    if (p.dataset == nullptr) throw DataError("a mixture part without a dataset");
    const std::vector<int64_t> r = sample_rows(*p.dataset, record);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  return rows;
}
}  // namespace

BatchBuilder::BatchBuilder(const Dataset& dataset, SampleOptions options)
    : BatchBuilder(std::vector<DataPart>{{&dataset, options.embodiment_id}}, std::move(options)) {}

BatchBuilder::BatchBuilder(const std::vector<DataPart>& parts, SampleOptions options)
    : opt_(options),
      sampler_(sum_of(rows_of(parts, options.processor)), options.seed, options.shuffle, options.rank,
               options.world, options.micro_batch_size, options.accumulation) {
  std::vector<int64_t> rows = rows_of(parts, opt_.processor);
  episode_start_.push_back(0);
  for (const int64_t r : rows) episode_start_.push_back(episode_start_.back() + r);
  if (opt_.sampler == "episode") sampler_.use_episode_order(std::move(rows), opt_.open_episodes, opt_.shuffle_buffer);
  mean_std_ = opt_.normalization == "mean_std";
  if (opt_.processor.upstream()) {  // the model's weights expect upstream's preparation (processor.hpp)
    if (mean_std_)
      throw ConfigError("data.normalization=mean_std: the model " + opt_.model_path +
                        " normalizes state and actions min-max as upstream GR00T " + opt_.processor.upstream_name() +
                        " does (batch_spec.json processor); remove data.normalization");
    if (parts.size() > 1)
      throw ConfigError("data.path names a mixture of " + std::to_string(parts.size()) + " datasets, but the model " +
                        opt_.model_path + " was imported from an upstream GR00T " + opt_.processor.upstream_name() +
                        " checkpoint for one embodiment ('" + opt_.processor.embodiment_tag +
                        "', batch_spec.json processor), whose statistics it normalizes with; train it on one "
                        "dataset (data.path a dataset folder)");
  }
  if (opt_.image_resample != "box" && opt_.image_resample != "bicubic_aa" && opt_.image_resample != "bilinear_aa" &&
      opt_.image_resample != "cv2_area")
    throw DataError("model.path " + opt_.model_path + ": config.json image_resample='" + opt_.image_resample +
                    "' is none of box, bicubic_aa, bilinear_aa, cv2_area; re-export the model");
  for (const auto& p : parts) add_part(p);
  if (opt_.processor.upstream()) {
    const Part& p = parts_.front();
    upstream_.emplace(opt_.processor, *p.ds, p.state_col, p.action_col, opt_.action_horizon, opt_.model_path);
    if (opt_.processor.embodiment_id >= 0) parts_.front().embodiment_id = opt_.embodiment_id = opt_.processor.embodiment_id;
  }
  check_image_aspect(opt_);
  if (opt_.image_target_size < 0 ||
      (opt_.image_resample == "box" && opt_.image_target_size != 0 && opt_.image_target_size != opt_.image_size))
    throw DataError("model.path " + opt_.model_path + ": config.json image_target_size=" +
                    std::to_string(opt_.image_target_size) + " must be 0 or image_size (" +
                    std::to_string(opt_.image_size) + ") when image_resample is box; re-export the model");
  if (opt_.image_letterbox && opt_.image_resample == "box")
    throw DataError("model.path " + opt_.model_path + ": config.json image_letterbox=true needs image_resample "
                    "bicubic_aa, bilinear_aa or cv2_area (it is box); re-export the model");
  if (opt_.image_random_crop && ((opt_.image_resample != "cv2_area" && opt_.image_resample != "bilinear_aa") ||
                                  !(opt_.image_crop_fraction < 1.0)))
    throw DataError("model.path " + opt_.model_path + ": config.json image_random_crop=true needs image_resample "
                    "cv2_area or bilinear_aa and an image_crop_fraction below 1 (they are " + opt_.image_resample +
                    " and " +
                    std::to_string(opt_.image_crop_fraction) + "): it moves that crop's window; re-export the model");
  if (opt_.image_resample != "box" && opt_.image_resample != "bicubic_aa" && opt_.image_resize_edge != 0)
    throw DataError("model.path " + opt_.model_path + ": config.json image_resize_edge=" +
                    std::to_string(opt_.image_resize_edge) + " must be 0 when image_resample is " +
                    opt_.image_resample + " (it resizes to image_target_size); re-export the model");
  if (opt_.frames_on_device && opt_.image_resample != "box")
    throw DataError("frames resized on the device do the box resize only, but the model's image_resample is " +
                    opt_.image_resample + "; set data.frame_resize=cpu");
  if (opt_.on_bad_video != "error" && opt_.on_bad_video != "skip")
    throw DataError("data.on_bad_video is '" + opt_.on_bad_video + "'; expected error or skip");
  if (opt_.video_decode != "whole" && opt_.video_decode != "span")
    throw DataError("data.video_decode is '" + opt_.video_decode + "'; expected whole or span");
  spans_ = opt_.video_decode == "span";
}

void BatchBuilder::add_part(const DataPart& part) {
  const Dataset& ds = *part.dataset;
  Part p;
  p.ds = &ds;
  p.embodiment_id = part.embodiment_id;
  p.first_episode = episode_part_.size();
  episode_part_.insert(episode_part_.end(), ds.episodes().size(), parts_.size());
  p.state_col = ds.column_by_role("state");
  p.action_col = ds.column_by_role("action");
  if (p.state_col < 0 || p.action_col < 0)
    throw DataError(ds.dir() + ": the dataset has no state or action column (modality.json groups)");
  for (const int col : {p.state_col, p.action_col}) {
    const ColumnInfo& c = ds.columns()[col];
    if (c.dtype != DType::Float32 && c.dtype != DType::Float64)
      throw DataError(ds.dir() + ": the " + c.role + " column '" + c.name +
                      "' is stored as neither float32 nor float64; re-convert the dataset with scripts/convert_lerobot.py");
  }
  if (ds.columns()[p.state_col].dtype != ds.columns()[p.action_col].dtype)
    throw DataError(ds.dir() + ": the state column '" + ds.columns()[p.state_col].name + "' and the action column '" +
                    ds.columns()[p.action_col].name + "' are stored with different float types; re-convert the "
                    "dataset (with or without --keep-float64 for both)");
  p.task_col = task_column(ds);

  const auto& sc = ds.columns()[p.state_col];
  const auto& ac = ds.columns()[p.action_col];
  if (sc.width > opt_.max_state_dim || ac.width > opt_.max_action_dim)
    throw DataError(ds.dir() + ": state width " + std::to_string(sc.width) + " / action width " +
                    std::to_string(ac.width) + " exceed the model's max_state_dim " +
                    std::to_string(opt_.max_state_dim) + " / max_action_dim " + std::to_string(opt_.max_action_dim));
  const Stats& ss = ds.stats(sc.name);
  const Stats& as = ds.stats(ac.name);
  p.state_a = require_stat(mean_std_ ? ss.mean : ss.min, sc.width, sc.name + (mean_std_ ? ".mean" : ".min"));
  p.state_b = require_stat(mean_std_ ? ss.std : ss.max, sc.width, sc.name + (mean_std_ ? ".std" : ".max"));
  p.action_a = require_stat(mean_std_ ? as.mean : as.min, ac.width, ac.name + (mean_std_ ? ".mean" : ".min"));
  p.action_b = require_stat(mean_std_ ? as.std : as.max, ac.width, ac.name + (mean_std_ ? ".std" : ".max"));

  for (const auto& cam : ds.cameras()) {
    if (cam.modality_name.empty()) continue;
    const int col = ds.column_by_name("video_frame:" + cam.key);
    if (col < 0) throw DataError(ds.dir() + ": no video_frame column for camera '" + cam.key + "'");
    const int pts_col = ds.column_by_name("video_pts:" + cam.key);
    if (pts_col < 0) throw DataError(ds.dir() + ": no video_pts column for camera '" + cam.key + "'");
    if (opt_.image_resample == "cv2_area" && !opt_.image_letterbox && cam.height != cam.width) {
      const int64_t T = opt_.image_target_size > 0 ? opt_.image_target_size : opt_.image_size;
      const auto [rh, rw] = cv2_area_size(cam.height, cam.width, T);
      if (rh != rw)
        throw DataError(ds.dir() + ": camera '" + cam.key + "' has " + std::to_string(cam.height) + " x " +
                        std::to_string(cam.width) + " frames, which the model " + opt_.model_path +
                        " (image_resample cv2_area, upstream's albumentations transform) resizes to " +
                        std::to_string(rh) + " x " + std::to_string(rw) +
                        " keeping the aspect ratio, but it takes square images; import the checkpoint with "
                        "letter_box_transform, or use square frames");
    }
    p.cameras.push_back(cam.id);
    p.frame_cols.push_back(col);
    p.pts_cols.push_back(pts_col);
  }
  if (opt_.frames_on_device) {
    std::string why;
    const auto [fh, fw] = common_cropped_size(ds, opt_.image_crop_fraction, &why);
    if (fh != opt_.frame_height || fw != opt_.frame_width)
      throw DataError(ds.dir() + ": frames resized on the device need every camera at " +
                      std::to_string(opt_.frame_width) + "x" + std::to_string(opt_.frame_height) + " after the crop, " +
                      "but " + (why.empty() ? "they are " + std::to_string(fw) + "x" + std::to_string(fh) : why) +
                      "; set data.frame_resize=cpu");
  }
  p.timestamp_col = ds.column_by_role("timestamp");
  if (!p.cameras.empty() && p.timestamp_col < 0)
    throw DataError(ds.dir() + ": the dataset has cameras but no timestamp column; re-run scripts/convert_lerobot.py");
  if (p.timestamp_col >= 0 && ds.columns()[p.timestamp_col].dtype != DType::Float64 &&
      ds.columns()[p.timestamp_col].dtype != DType::Float32)
    throw DataError(ds.dir() + ": the timestamp column is not float32 or float64; re-run scripts/convert_lerobot.py");
  check_tokenizer_match(ds, opt_);
  if (static_cast<int64_t>(p.cameras.size()) != opt_.num_views)
    throw DataError(ds.dir() + ": the dataset has " + std::to_string(p.cameras.size()) +
                    " camera(s) used by modality.json but the model expects num_views = " +
                    std::to_string(opt_.num_views) + " (re-export the model with --set num_views=" +
                    std::to_string(p.cameras.size()) + ")");
  parts_.push_back(std::move(p));
}

BatchBuilder::Location BatchBuilder::locate(int64_t sample_id) const {
  const auto it = std::upper_bound(episode_start_.begin(), episode_start_.end(), sample_id);
  const size_t e = static_cast<size_t>(it - episode_start_.begin()) - 1;
  return {e, sample_id - episode_start_[e]};
}

// Note [Bad videos]
// A video that fails a check of Note [Checked video] (src/data/video.cpp), or
// whose frame timestamps do not match its rows' timestamps, is bad. With
// data.on_bad_video = error (the default) the builder throws a DataError
// naming the shard, episode, camera, video file, frame and cause; the trainer
// then writes a checkpoint of the last good step and stops. With skip, the
// video is remembered as bad (one warning with its cause, counted in
// DataStats::videos_bad, never decoded again by this builder) and every
// sample that needs it keeps its slot in the micro-batch with zero images and
// an all-zero action mask: it adds nothing to the loss or the gradients
// (their weights count valid elements only, training-semantics s5), each one
// is logged and counted (DataStats::samples_skipped), and no other sample
// takes its place, so the order of every other sample stays the pure
// function of docs/training-semantics.md s2.

// Note [Frame cache]
// Decoded videos (data.video_decode=whole) or keyframe spans (span; then also
// each video's checked file, VideoFile, which its spans decode from) live in
// one map guarded by mu_, each entry in one of four
// states: kDecoding (a thread is decoding it; others wait on decoded_), kReady
// (frames, in the byte-bounded LRU), kBad (on_bad_video=skip: the cause; kept,
// never decoded again) or kFailed (the exception the decode raised: an
// on_bad_video=error DataError, a broken index, out of memory; kept and raised
// again by every micro-batch that needs the video). Decoding itself runs
// outside the lock, on whichever thread asked first: micro_batch()'s (a miss)
// or a prefetch() from ADFE's decode pool. decode() reads only what the
// constructor fixed, and the video decode is deterministic, so the frames,
// the error message and the skip cause do not depend on which thread decoded
// or when. What must follow the training order (the skip counts and their
// log lines) is done by the micro_batch() thread when it uses an entry, in
// sample order, exactly as if it had decoded the video itself. With spans a
// lookup first resolves the frame's span through the file entry (opened on a
// miss, waited for by every other thread, a prefetching one included, so a
// span is never left to the micro-batch's thread because its file was being
// opened), then finds or decodes the span. An entry
// handed out is an at::Tensor reference: eviction never frees frames a
// micro-batch is still copying from. A decode streams (video.hpp's FrameSink):
// full-size frames pass through a staging buffer of kStagingBytes (at least one
// frame), are resized a chunk at a time into the entry's tensor, and are never
// all in memory at once; the chunking does not change the bits (the resize and
// normalisation are per frame; with frames_on_device the chunk is only
// cropped). So a decoding thread holds one entry's frames plus the staging
// buffer and its float copy (5 x kStagingBytes), and
// the cache holds at most data.frame_cache_mb of resized frames (and, with
// spans, compressed files) besides the entries in use.

namespace {
// Frame-cache keys (Note [Frame cache]): (episode * 1024 + camera) << kSpanBits | the span's
// first frame (0: a whole video), or | kFileKey for span decoding's file entry.
constexpr int kSpanBits = 20;
constexpr int64_t kFileKey = (int64_t{1} << kSpanBits) - 1;
int64_t video_key(size_t episode, int camera) {
  return static_cast<int64_t>(episode) * 1024 + camera;
}
}  // namespace

std::string resolve_video_decode(const std::string& mode, const Dataset& dataset) {
  if (mode == "whole" || mode == "span") return mode;
  if (mode != "auto") throw DataError("data.video_decode is '" + mode + "'; expected auto, whole or span");
  for (const auto& ep : dataset.episodes())
    for (const auto& v : ep.videos)
      if (v.frame_count >= kFileKey) return "whole";
  return "span";
}

std::string resolve_video_decode(const std::string& mode, const Mixture& mixture) {
  std::string out = mode == "auto" ? "span" : mode;
  for (const auto& ds : mixture.datasets)
    if (resolve_video_decode(mode, *ds) == "whole") out = "whole";
  return out;
}

int64_t BatchBuilder::Entry::bytes() const {
  if (frames.defined()) return static_cast<int64_t>(frames.nbytes());
  return file ? static_cast<int64_t>(file->bytes.size()) : 0;
}

// The index's facts about one video (VideoCheck), and its path.
VideoCheck BatchBuilder::video_check(size_t episode, int camera) const {
  const EpisodeInfo& ep = episode_info(episode);
  const VideoInfo& info = ep.videos.at(camera);
  const Part& part = part_of(episode);
  VideoCheck check = dataset_video_check(*part.ds, episode - part.first_episode, camera);  // check.hpp: the index's facts and video_pts
  if (spans_ && info.frame_count >= kFileKey)  // the frame is part of a span's key
    throw DataError(ep.video_paths.at(camera) + ": " + std::to_string(info.frame_count) + " frames; " +
                    "data.video_decode=span supports videos of up to " + std::to_string(kFileKey - 1) +
                    " frames (use data.video_decode=whole)");
  return check;
}

// A bad video's entry under data.on_bad_video (Note [Bad videos]): skip keeps the cause, error
// throws the DataError the micro-batch that needs it raises.
BatchBuilder::Entry BatchBuilder::bad_video(size_t episode, int camera, const BadVideoError& e) const {
  const EpisodeInfo& ep = episode_info(episode);
  const std::string where = "shard " + ep.shard_file + ", episode " + std::to_string(ep.index) + ", camera '" +
                            part_of(episode).ds->cameras().at(camera).key + "', video " + e.path() +
                            (e.frame() >= 0 ? ", frame " + std::to_string(e.frame()) : std::string()) + ": " +
                            e.cause();
  if (opt_.on_bad_video == "error")
    throw DataError("bad video (data.on_bad_video=error): " + where +
                    "; or set data.on_bad_video=skip to train without its samples");
  Entry entry;
  entry.state = Entry::State::kBad;
  entry.cause = where;
  return entry;
}

BatchBuilder::Entry BatchBuilder::decode(int64_t key, const VideoFile* file) const {
  const int64_t vk = key >> kSpanBits, first = key & kFileKey;
  const size_t episode = static_cast<size_t>(vk / 1024);
  const int camera = static_cast<int>(vk % 1024);
  Entry entry;
  try {
    const EpisodeInfo& ep = episode_info(episode);
    const std::string& path = ep.video_paths.at(camera);
    const VideoInfo& info = ep.videos.at(camera);
    const CameraInfo& cam = part_of(episode).ds->cameras().at(camera);
    const VideoCheck check = video_check(episode, camera);
    const int64_t end = file != nullptr ? file->span_of(first).second : info.frame_count;
    // Frames stream from the decoder into a bounded staging buffer of full-size frames, are
    // cropped and resized a chunk at a time, and only the resized ones are kept (Note [Frame cache]).
    // With frames_on_device the cropped uint8 frames are kept instead (the device resizes them).
    const int64_t S = opt_.image_size, h = cam.height, w = cam.width, frame_bytes = h * w * 3;
    const bool upstream = opt_.image_resample != "box";  // the upstream transforms crop after their first resize
    // box: the crop of image_crop_fraction, then image_aspect's center square (box_window)
    const FrameWindow win = upstream ? FrameWindow{0, 0, h, w}
                                     : box_window(h, w, opt_.image_crop_fraction, opt_.image_aspect);
    const int64_t ch = win.height, cw = win.width;
    const bool pad = opt_.image_aspect == "pad";  // box only (the constructor refuses it elsewhere)
    const int64_t chunk = std::clamp<int64_t>(kStagingBytes / std::max<int64_t>(frame_bytes, 1), 1, 64);
    const int64_t T = opt_.image_target_size > 0 ? opt_.image_target_size : S;
    at::Tensor out = opt_.frames_on_device    ? at::empty({end - first, ch, cw, 3}, at::kByte)
                     : opt_.image_random_crop ? at::empty({end - first, T, T, 3}, at::kByte)
                                              : at::empty({end - first, 3, S, S}, at::kFloat);
    at::Tensor staging = at::empty({chunk, h, w, 3}, at::kByte);
    int64_t done = 0, staged = 0;  // rows [done, done + staged) of `out` are in `staging`
    auto flush_staged = [&] {  // the staged frames, cropped, in the cache's form
      if (staged == 0) return;
      const at::Tensor u8 = staging.narrow(0, 0, staged).narrow(1, win.top, ch).narrow(2, win.left, cw);
      out.narrow(0, done, staged)
          .copy_(opt_.frames_on_device ? u8  // (n, ch, cw, 3)
                 : opt_.image_resample == "bicubic_aa"
                     ? resize_frames_bicubic_aa(u8, opt_.image_resize_edge, opt_.image_crop_fraction,
                                                opt_.image_target_size, S, opt_.image_letterbox)
                 : opt_.image_random_crop  // each sample crops its own windows (fill)
                     ? (opt_.image_resample == "bilinear_aa" ? bilinear_aa_first(u8, T, opt_.image_letterbox)
                                                             : cv2_area_first(u8, T, opt_.image_letterbox))
                 : opt_.image_resample == "bilinear_aa"
                     ? resize_frames_bilinear_aa(u8, opt_.image_target_size, opt_.image_crop_fraction, S,
                                                 opt_.image_letterbox)
                 : opt_.image_resample == "cv2_area"
                     ? resize_frames_cv2_area(u8, opt_.image_target_size, opt_.image_crop_fraction, S,
                                              opt_.image_letterbox)
                     : resize_frames(u8, S, pad));  // (n, 3, S, S)
      done += staged;
      staged = 0;
    };
    const FrameSink sink = [&](const DecodedFrame& frame) {
      std::memcpy(staging.data_ptr<uint8_t>() + staged * frame_bytes, frame.rgb, static_cast<size_t>(frame_bytes));
      if (++staged == chunk) flush_staged();
    };
    try {
      if (file != nullptr)
        decode_span_checked(*file, check, first, end, sink);
      else
        decode_video_checked(path, check, sink);
      flush_staged();
    } catch (const BadVideoError& e) {
      return bad_video(episode, camera, e);
    }
    entry.state = Entry::State::kReady;
    entry.frames = out;
    entry.bytes_read = file != nullptr ? 0 : static_cast<int64_t>(info.bytes);  // a span's file was read at its open
  } catch (...) {
    entry = Entry{};
    entry.state = Entry::State::kFailed;
    entry.error = std::current_exception();
  }
  return entry;
}

BatchBuilder::Entry BatchBuilder::open_file(int64_t key) const {
  const int64_t vk = key >> kSpanBits;
  const size_t episode = static_cast<size_t>(vk / 1024);
  const int camera = static_cast<int>(vk % 1024);
  Entry entry;
  try {
    const VideoCheck check = video_check(episode, camera);
    try {
      entry.file =
          std::make_shared<const VideoFile>(open_video_checked(episode_info(episode).video_paths.at(camera), check));
    } catch (const BadVideoError& e) {
      return bad_video(episode, camera, e);
    }
    entry.state = Entry::State::kReady;
    entry.bytes_read = static_cast<int64_t>(check.bytes);
  } catch (...) {
    entry = Entry{};
    entry.state = Entry::State::kFailed;
    entry.error = std::current_exception();
  }
  return entry;
}

void BatchBuilder::store_locked(int64_t key, Entry entry) {
  const bool ready = entry.state == Entry::State::kReady;
  const int64_t bytes = ready ? entry.bytes() : 0;
  if (ready) {
    stats_.videos_decoded += (entry.file || !spans_) ? 1 : 0;  // a whole video, or a file opened for its spans
    stats_.video_bytes_read += entry.bytes_read;
    if (entry.bytes_read > 0) read_ahead_.erase(key >> kSpanBits);  // read now: a later miss may read it ahead again
    if (entry.frames.defined()) {
      stats_.spans_decoded += 1;
      stats_.frames_decoded += entry.frames.size(0);
    }
  }
  cache_[key] = std::move(entry);
  if (!ready) return;
  cache_bytes_ += bytes;
  lru_.push_front(key);
  while (cache_bytes_ > opt_.frame_cache_mb * (1 << 20) && lru_.size() > 1) {
    const int64_t old = lru_.back();
    lru_.pop_back();
    cache_bytes_ -= cache_[old].bytes();
    cache_.erase(old);
  }
}

BatchBuilder::Entry* BatchBuilder::entry_locked(std::unique_lock<std::mutex>& lock, int64_t key,
                                                const std::function<Entry()>& make, bool wait) {
  for (;;) {
    auto it = cache_.find(key);
    if (it == cache_.end()) {  // a miss: decode here (Note [Frame cache])
      if (wait && cancelled_) throw DataError("data loading was cancelled (the batch source is stopping)");
      cache_[key] = Entry{};  // kDecoding: this thread makes it
      lock.unlock();
      const auto t0 = std::chrono::steady_clock::now();
      Entry made = make();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      stats_.decode_ms += ms;
      store_locked(key, std::move(made));
      decoded_.notify_all();
      continue;
    }
    Entry& e = it->second;
    switch (e.state) {
      case Entry::State::kDecoding:
        if (!wait) return nullptr;
        decoded_.wait(lock);
        continue;
      case Entry::State::kReady:
        lru_.remove(key);
        lru_.push_front(key);
        return &e;
      case Entry::State::kFailed:
        std::rethrow_exception(e.error);
      case Entry::State::kBad:
        return &e;
    }
  }
}

int64_t BatchBuilder::resolve_locked(std::unique_lock<std::mutex>& lock, int64_t want,
                                     std::shared_ptr<const VideoFile>* file, Entry** bad) {
  const int64_t vk = want >> kSpanBits;
  if (!spans_) return vk << kSpanBits;
  const int64_t fkey = (vk << kSpanBits) | kFileKey;
  Entry* f = entry_locked(
      lock, fkey, [this, fkey] { return open_file(fkey); }, /*wait=*/true);
  if (f->state == Entry::State::kBad) {
    *bad = f;
    return fkey;
  }
  *file = f->file;
  return (vk << kSpanBits) | (*file)->span_of(want & kFileKey).first;
}

void BatchBuilder::prefetch(int64_t want) {
  try {
    std::unique_lock<std::mutex> lock(mu_);
    std::shared_ptr<const VideoFile> file;
    Entry* bad = nullptr;
    // The file is waited for when another thread is opening it (a short read and scan): giving up
    // would leave the span to the micro-batch's own thread. A span in flight elsewhere is not.
    const int64_t key = resolve_locked(lock, want, &file, &bad);
    if (bad != nullptr) return;
    const VideoFile* f = file.get();
    entry_locked(
        lock, key, [this, key, f] { return decode(key, f); }, /*wait=*/false);
  } catch (...) {
    // A failure is kept in the cache, for the micro-batch that needs it.
  }
}

// Note [Readahead]
// Level 0 of ADFE (source.hpp): its I/O threads call readahead() for the
// videos of the micro-batches up to 2 x prefetch_factor ahead (the decode
// threads are handed prefetch_factor), so that a decode job waiting in the
// queue, or one beyond the decode window, finds its file in the page cache
// instead of waiting for storage.
// posix_fadvise(WILLNEED) starts the kernel's reads and returns; the bytes
// are then read, size- and hash-checked by the decode as before (Note
// [Checked video]), so readahead changes no bit and no check, only when the
// storage is read. A video is asked for once between two reads of its file
// (read_ahead_), and not at all while its frames (whole decoding) or its
// file (span decoding) are in the frame cache. Shards need no thread: they
// are mmap'd with MADV_WILLNEED when the dataset is opened (dataset.cpp).
void BatchBuilder::readahead(int64_t want) {
  const int64_t vk = want >> kSpanBits;
  const size_t episode = static_cast<size_t>(vk / 1024);
  const int camera = static_cast<int>(vk % 1024);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.count(spans_ ? (vk << kSpanBits) | kFileKey : vk << kSpanBits) || !read_ahead_.insert(vk).second) return;
  }
  if (episode >= episode_part_.size()) return;
  const std::string& path = episode_info(episode).video_paths.at(camera);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // the decode reports it, with the plain source's message
  struct stat st {};
  const bool advised = ::fstat(fd, &st) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED) == 0;
  ::close(fd);
  if (!advised) return;
  std::lock_guard<std::mutex> lock(mu_);
  stats_.readahead_files += 1;
  stats_.readahead_bytes += static_cast<int64_t>(st.st_size);
}

std::pair<at::Tensor, int64_t> BatchBuilder::frames(size_t episode, int camera, int64_t frame, std::string* cause) {
  std::unique_lock<std::mutex> lock(mu_);
  std::shared_ptr<const VideoFile> file;
  Entry* bad = nullptr;
  const int64_t key = resolve_locked(lock, (video_key(episode, camera) << kSpanBits) | frame, &file, &bad);
  const VideoFile* f = file.get();
  Entry* e = bad != nullptr ? bad
                            : entry_locked(
                                  lock, key, [this, key, f] { return decode(key, f); }, true);
  if (e->state == Entry::State::kBad) {
    *cause = e->cause;
    if (bad_reported_.insert(key).second) {  // counted and logged once, at its first use
      stats_.videos_bad += 1;
      LF_LOG(logger("data"), warn) << "bad video, its samples are skipped (data.on_bad_video=skip): " << e->cause;
    }
    return {at::Tensor(), 0};
  }
  return {e->frames, key & kFileKey};  // the span's first frame (0: a whole video)
}

DataStats BatchBuilder::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DataStats d = stats_;
  d.cache_bytes = cache_bytes_;
  return d;
}

std::vector<int64_t> BatchBuilder::videos_of(const std::vector<int64_t>& sample_ids) const {
  std::vector<int64_t> keys;
  for (const int64_t id : sample_ids) {
    const Location loc = locate(id);
    const Part& part = part_of(loc.episode);
    for (size_t v = 0; v < part.cameras.size(); ++v) {
      int64_t frame = 0;
      if (spans_)
        frame = std::clamp<int64_t>(array(loc.episode, part.frame_cols[v]).as<int64_t>()[loc.row], 0, kFileKey - 1);
      const int64_t key = (video_key(loc.episode, part.cameras[v]) << kSpanBits) | frame;
      if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
    }
  }
  return keys;
}

void BatchBuilder::fill(int64_t slot, int64_t sample_id, MicroBatch& mb,
                        const std::vector<std::pair<double, double>>& crops) {
  Batch& b = mb.tensors;
  const Location loc = locate(sample_id);
  const Part& part = part_of(loc.episode);
  const Dataset& ds = *part.ds;
  const std::vector<int>& cameras = part.cameras;
  const EpisodeInfo& ep = episode_info(loc.episode);
  const int64_t t = loc.row, L = ep.length, H = opt_.action_horizon;

  // The frames first: a sample whose video is bad is skipped (Note [Bad videos]).
  std::string skip_cause;
  for (size_t v = 0; v < cameras.size() && skip_cause.empty(); ++v) {
    const int64_t f = array(loc.episode, part.frame_cols[v]).as<int64_t>()[t];
    const VideoInfo& info = ep.videos[cameras[v]];
    if (f < 0 || f >= info.frame_count)
      throw DataError(ds.dir() + "/" + ep.shard_file + ": episode " + std::to_string(ep.index) + " row " +
                      std::to_string(t) + " needs frame " + std::to_string(f) + " of " + ep.video_paths[cameras[v]] +
                      " but the video has " + std::to_string(info.frame_count) +
                      " frames; re-run scripts/convert_lerobot.py");
    const auto [fr, first] = frames(loc.episode, cameras[v], f, &skip_cause);
    if (!fr.defined()) break;
    // The frame's timestamp (decoded, checked equal to video_pts) against the row's.
    const ArrayView stamps = array(loc.episode, part.timestamp_col);  // float64, or float32 when the parquet had that
    const double ts = (stamps.dtype == DType::Float32 ? static_cast<double>(stamps.as<float>()[t])
                                                      : stamps.as<double>()[t]) -
                      info.timestamp_offset_s;
    const double pts = array(loc.episode, part.pts_cols[v]).as<double>()[f];
    if (!(std::fabs(ts - pts) < ds.alignment_tolerance_s() + 1e-6)) {
      char what[512];
      std::snprintf(what, sizeof(what),
                    "shard %s, episode %lld, camera '%s', video %s, frame %lld: row %lld's timestamp %.6f s "
                    "(offset-corrected) is %.6f s from the frame's %.6f s, more than the %.6f s tolerance",
                    ep.shard_file.c_str(), static_cast<long long>(ep.index), ds.cameras()[cameras[v]].key.c_str(),
                    ep.video_paths[cameras[v]].c_str(), static_cast<long long>(f), static_cast<long long>(t), ts,
                    ts - pts, pts, ds.alignment_tolerance_s());
      if (opt_.on_bad_video == "error")
        throw DataError(std::string("bad video (data.on_bad_video=error): ") + what +
                        "; re-run scripts/convert_lerobot.py on the source dataset, or set data.on_bad_video=skip "
                        "to train without its samples");
      skip_cause = what;
      break;
    }
    const std::pair<double, double> crop =
        crops.empty() ? std::pair<double, double>{-1.0, -1.0} : crops[crops.size() == 1 ? 0 : v];
    b["images"][slot][static_cast<int64_t>(v)].copy_(
        !opt_.image_random_crop ? fr[f - first]
        : opt_.image_resample == "bilinear_aa"
            ? bilinear_aa_rest(fr.narrow(0, f - first, 1), opt_.image_crop_fraction, opt_.image_size, crop.first,
                               crop.second)[0]
            : cv2_area_rest(fr.narrow(0, f - first, 1), opt_.image_crop_fraction, opt_.image_size, crop.first,
                            crop.second)[0]);
  }
  const bool skipped = !skip_cause.empty();
  if (skipped) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.samples_skipped += 1;
    }
    LF_LOG(logger("data"), info) << "sample " << sample_id << " (episode " << ep.index << ", row " << t
                                 << ") skipped, its action mask zeroed: " << skip_cause;
  }

  const ArrayView state = array(loc.episode, part.state_col);
  const ArrayView action = array(loc.episode, part.action_col);
  // the state row and one action row as doubles; per thread, so that a sample allocates nothing
  thread_local std::vector<double> rows_as_double;
  rows_as_double.resize(static_cast<size_t>(state.width + action.width));
  row_as_double(state, t, rows_as_double.data());
  const double* raw_state = rows_as_double.data();  // (w_s)
  float* s_out = b["state"][slot].data_ptr<float>();
  if (upstream_)
    upstream_->state(raw_state, s_out);
  else
    for (int64_t j = 0; j < state.width; ++j) s_out[j] = normalize(raw_state[j], part.state_a[j], part.state_b[j], mean_std_);

  float* a_out = b["actions"][slot].data_ptr<float>();
  float* m_out = b["action_mask"][slot].data_ptr<float>();
  const int64_t A = opt_.max_action_dim;
  // Upstream (N1.7, N1.6) counts only the first valid_horizon rows of a chunk (processor.hpp).
  const int64_t rows = upstream_ && opt_.processor.valid_horizon > 0 ? std::min(H, opt_.processor.valid_horizon) : H;
  double* raw_action = rows_as_double.data() + state.width;  // (w_a)
  for (int64_t k = 0; k < rows && t + k < L && !skipped; ++k) {
    row_as_double(action, t + k, raw_action);
    if (upstream_) upstream_->action_row(k, raw_action, raw_state, a_out + k * A);
    for (int64_t j = 0; j < action.width; ++j) {
      if (!upstream_) a_out[k * A + j] = normalize(raw_action[j], part.action_a[j], part.action_b[j], mean_std_);
      m_out[k * A + j] = 1.0f;
    }
    if (action.width > 0) mb.action_tokens += 1;
    mb.num_valid += action.width;
  }

  const int64_t task = array(loc.episode, part.task_col).as<int64_t>()[t];
  const auto it = ds.tasks().find(task);
  if (it == ds.tasks().end())
    throw DataError(ds.dir() + ": episode " + std::to_string(ep.index) + " row " + std::to_string(t) +
                    " names task " + std::to_string(task) + ", which is not in the task table");
  const auto& ids = it->second.token_ids;
  int64_t* tok = b["text_tokens"][slot].data_ptr<int64_t>();
  bool* tmask = b["text_mask"][slot].data_ptr<bool>();
  const int64_t text_len = std::min<int64_t>(opt_.max_text_len, static_cast<int64_t>(ids.size()));
  for (int64_t k = 0; k < text_len; ++k) {
    tok[k] = ids[k];
    tmask[k] = true;
  }
  mb.text_tokens += text_len;
  mb.text_len_max = std::max(mb.text_len_max, text_len);

  if (skipped) {
    b["images"][slot].zero_();
    mb.blank_slots.push_back(slot);  // zeros after a device resize too (frames.hpp model_images)
  }
  b["embodiment_id"][slot].fill_(part.embodiment_id);
}

int task_column(const Dataset& ds) {
  int col = -1;
  for (const auto& c : ds.columns())
    if (c.role == "annotation" && c.name.size() >= 16 &&
        c.name.compare(c.name.size() - 16, 16, "task_description") == 0)
      col = c.id;
  if (col < 0) col = ds.column_by_role("task_index");
  if (col < 0) throw DataError(ds.dir() + ": the dataset has neither a task_description annotation nor task_index");
  return col;
}

std::vector<double> text_length_histogram(const Dataset& ds, int64_t max_text_len) {
  const int col = task_column(ds);
  std::vector<double> hist(static_cast<size_t>(std::max<int64_t>(max_text_len, 0)) + 1, 0.0);
  std::map<int64_t, int64_t> frames_of_task;
  for (size_t e = 0; e < ds.episodes().size(); ++e) {
    const ArrayView tasks = ds.array(e, col);
    const int64_t* t = tasks.as<int64_t>();
    for (int64_t r = 0; r < tasks.rows; ++r) frames_of_task[t[r]] += 1;
  }
  for (const auto& [task, frames] : frames_of_task) {
    const auto it = ds.tasks().find(task);
    if (it == ds.tasks().end())
      throw DataError(ds.dir() + ": a row names task " + std::to_string(task) + ", which is not in the task table");
    const int64_t len = std::min<int64_t>(max_text_len, static_cast<int64_t>(it->second.token_ids.size()));
    hist[static_cast<size_t>(len)] += static_cast<double>(frames);
  }
  return hist;
}

std::vector<double> text_length_histogram(const Mixture& mixture, int64_t max_text_len) {
  std::vector<double> hist(static_cast<size_t>(std::max<int64_t>(max_text_len, 0)) + 1, 0.0);
  for (const auto& ds : mixture.datasets) {
    const std::vector<double> h = text_length_histogram(*ds, max_text_len);
    for (size_t l = 0; l < h.size(); ++l) hist[l] += h[l];
  }
  return hist;
}

std::vector<TensorSpec> micro_batch_spec(const SampleOptions& o) {
  const int64_t B = o.micro_batch_size, H = o.action_horizon, A = o.max_action_dim, L = o.max_text_len;
  const FrameWindow win = box_window(o.frame_height, o.frame_width, 1.0, o.image_aspect);  // crop: its square
  const TensorSpec images = o.frames_on_device
                                ? TensorSpec{"images", {B, o.num_views, win.height, win.width, 3}, at::kByte}
                                : TensorSpec{"images", {B, o.num_views, 3, o.image_size, o.image_size}, at::kFloat};
  return {images,                                                                   // (B, V, 3, S, S) or (B, V, h, w, 3)
          {"state", {B, o.max_state_dim}, at::kFloat},                              // (B, D)
          {"actions", {B, H, A}, at::kFloat},                                       // (B, H, A)
          {"action_mask", {B, H, A}, at::kFloat},                                   // (B, H, A)
          {"text_tokens", {B, L}, at::kLong},                                       // (B, L)
          {"text_mask", {B, L}, at::kBool},                                         // (B, L)
          {"embodiment_id", {B}, at::kLong},                                        // (B,)
          {"fm_t", {B}, at::kFloat},                                                // (B,)
          {"fm_noise", {B, H, A}, at::kFloat}};                                     // (B, H, A)
}

int64_t TensorSpec::bytes() const {
  int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
  for (const int64_t d : shape) n *= d;
  return n;
}

int64_t micro_batch_bytes(const SampleOptions& options) {
  int64_t bytes = 0;
  for (const auto& t : micro_batch_spec(options)) bytes += t.bytes();
  return bytes;
}

namespace {
// The batch's tensors, zeroed (images: filled by every sample), fm_* left to micro_batch().
Batch empty_batch(const SampleOptions& o, int64_t B) {
  SampleOptions sized = o;
  sized.micro_batch_size = B;
  Batch b;
  for (const auto& t : micro_batch_spec(sized)) {
    if (t.key == "fm_t" || t.key == "fm_noise") continue;
    b[t.key] = t.key == "images" ? at::empty(t.shape, at::TensorOptions().dtype(t.dtype))
                                 : at::zeros(t.shape, at::TensorOptions().dtype(t.dtype));
  }
  return b;
}
}  // namespace

Batch BatchBuilder::sample(int64_t sample_id) {
  MicroBatch mb;
  mb.tensors = empty_batch(opt_, 1);
  fill(0, sample_id, mb);
  return std::move(mb.tensors);
}

MicroBatch BatchBuilder::micro_batch(int64_t step, int64_t i) {
  const std::vector<int64_t> ids = sampler_.micro_batch(step, i);
  const int64_t B = static_cast<int64_t>(ids.size());
  MicroBatch mb;
  mb.tensors = empty_batch(opt_, B);
  // upstream's train-time crop windows, drawn per sample: one for its views (cv2_area) or one per view (s4)
  const int64_t windows = opt_.image_resample == "bilinear_aa" ? opt_.num_views : 1;
  for (int64_t b = 0; b < B; ++b)
    fill(b, ids[b], mb,
         opt_.image_random_crop
             ? crop_positions(opt_.seed, static_cast<uint64_t>(sampler_.stream_position(step, i, b)), windows)
             : std::vector<std::pair<double, double>>{});

  // Flow-matching draws, one generator per sample at its stream position (s4).
  at::Tensor fm_t = at::empty({B}, at::kFloat);                                             // (B,)
  at::Tensor noise = at::empty({B, opt_.action_horizon, opt_.max_action_dim}, at::kFloat);  // (B, H, A)
  for (int64_t b = 0; b < B; ++b) {
    const auto p = static_cast<uint64_t>(sampler_.stream_position(step, i, b));
    auto gen = at::make_generator<at::CPUGeneratorImpl>((opt_.seed * 1000003ull + p) & 0x7FFFFFFFFFFFFFFFull);
    const at::Tensor u = at::rand({1}, gen, at::kFloat);                     // (1,)
    const at::Tensor beta = at::pow(u, 1.0 / opt_.beta_alpha);               // a Beta(alpha, 1) draw
    fm_t.narrow(0, b, 1).copy_(opt_.fm_time_upstream ? at::mul(at::rsub(beta, 1.0), opt_.noise_s)
                                                     : at::div(at::rsub(beta, opt_.noise_s), opt_.noise_s));
    noise[b].copy_(at::randn({opt_.action_horizon, opt_.max_action_dim}, gen, at::kFloat));  // (H, A)
  }
  mb.tensors["fm_t"] = fm_t;
  mb.tensors["fm_noise"] = noise;
  if (opt_.processor.state_dropout > 0) {    // the processor's state dropout, a draw per sample (s4)
    at::Tensor state = mb.tensors["state"];  // (B, D)
    for (int64_t b = 0; b < B; ++b)
      if (state_dropped(opt_.seed, static_cast<uint64_t>(sampler_.stream_position(step, i, b)),
                        opt_.processor.state_dropout))
        state[b].zero_();
  }
  const at::Tensor slots = std::get<0>(at::_unique(mb.tensors.at("embodiment_id"), /*sorted=*/true));
  mb.embodiments.assign(slots.data_ptr<int64_t>(), slots.data_ptr<int64_t>() + slots.numel());
  return mb;
}

}  // namespace loongforge::data
