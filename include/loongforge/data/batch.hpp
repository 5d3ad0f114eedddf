// loongforge/data/batch.hpp — samples and micro-batches, exactly as
// docs/training-semantics.md sections 1-4 define them.
//
// Contract:
//  - Sampler: optimizer step s takes the global batch of G = B x K x W
//    samples perm_e[j*G .. (j+1)*G) (e = s / T, j = s % T, T = N / G steps
//    per epoch); micro-batch i of rank r holds block positions
//    q = i*B*W + b*W + r, b = 0..B-1. A pure function of (seed, G, step), so
//    a run resumed with another split of G into B x K x W takes the same
//    samples at every step.
//  - BatchBuilder::micro_batch(s, i) returns the model's batch (docs/architecture.md s1
//    keys, CPU tensors) of micro-batch i of step s on this rank, including the
//    flow-matching draws fm_t / fm_noise drawn PER SAMPLE from its stream
//    position p = s*G + q (s4), and the counts the loss weights and metrics
//    need (counted while filling: no tensor reads).
//  - Decoded, resized frames are cached per episode (LRU bounded by bytes);
//    a video is decoded sequentially once per cache miss, never per sample,
//    and streamed: its full-size frames are resized a few at a time, never
//    all held (Note [Frame cache]). With video_decode = "span" the unit of
//    decoding and caching is a keyframe span instead (video.hpp): a video's
//    file is read and checked once and kept in the cache too, and a miss
//    decodes only the span holding the needed frame; the frames are the
//    same bits.
//    Entries that are in use stay alive until their user drops them, so the
//    bound can be exceeded by the videos of the micro-batches in flight.
//  - Each video is checked against the dataset index when decoded
//    (video.hpp, Note [Checked video]); a bad one stops with a DataError
//    naming the shard, episode, video, frame and cause
//    (on_bad_video = "error"), or its samples are masked out of the loss,
//    logged and counted (on_bad_video = "skip"; Note [Bad videos]).
//  - Threads (Note [Frame cache] in batch.cpp): micro_batch() and sample()
//    are called by one thread at a time (they own the sampler and the skip
//    counts); prefetch(), readahead(), stats(), videos_of() and sampler()'s const
//    accessors (fields fixed at construction) may be called from any number
//    of other threads concurrently with them. The frame cache is guarded by
//    one mutex (never held while decoding); a video being decoded by one
//    thread is waited for, never decoded twice at once. Whichever thread decodes a
//    video, the frames are the same bits, and a failure is stored and raised
//    by the micro_batch() that needs the video, with the message the
//    decoding thread would have raised: so a micro-batch is the same with
//    or without prefetching threads, and so are its errors and skip counts.
//
// Example:
//   BatchBuilder builder(dataset, options);   // options.accumulation = K
//   for (int64_t i = 0; i < K; ++i) {
//     MicroBatch mb = builder.micro_batch(step, i);
//     ... model(mb.tensors), loss weight from mb.num_valid ...
//   }
#pragma once

#include <atomic>              // std::atomic
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // int64_t, uint64_t
#include <exception>           // std::exception_ptr
#include <functional>          // std::function
#include <list>                // std::list
#include <map>                 // std::map
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex
#include <optional>            // std::optional
#include <set>                 // std::set
#include <string>              // std::string
#include <utility>             // std::pair
#include <vector>              // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

#include "loongforge/data/dataset.hpp"
#include "loongforge/data/mixture.hpp"
#include "loongforge/data/processor.hpp"
#include "loongforge/data/video.hpp"

namespace loongforge::data {

using Batch = std::map<std::string, at::Tensor>;

// SplitMix64 Fisher-Yates permutation of [0, n) for an epoch (s2).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

// The episode-aware order of an epoch (s2, data.sampler=episode): a permutation of the
// samples of episodes with these lengths (samples numbered episode by episode), a pure
// function of (seed, epoch, open, buffer). `open` episodes, taken in the order of
// epoch_permutation(#episodes, seed ^ kEpisodeOrderSalt, epoch), are read front to back,
// one sample from each in turn; each sample enters a buffer of `buffer` samples, and once
// the buffer is full a uniformly drawn one leaves it (swap with the last); a finished
// episode is replaced by the next one; the buffer drains the same way at the end.
constexpr uint64_t kEpisodeOrderSalt = 0x6570697365646573ull;  // "episodes"
std::vector<int64_t> episode_order(const std::vector<int64_t>& lengths, uint64_t seed, int64_t epoch, int64_t open,
                                   int64_t buffer);

// data.video_decode for `dataset`: "whole" or "span" as given; "auto" -> "span",
// or "whole" when a video has more frames than span decoding addresses (2^20 - 1).
// Throws DataError for any other value.
std::string resolve_video_decode(const std::string& mode, const Dataset& dataset);
// The same over a mixture's datasets: "whole" when any of them needs it.
std::string resolve_video_decode(const std::string& mode, const Mixture& mixture);

// A frame side of n pixels after the center crop of SampleOptions::image_crop_fraction f:
// max(1, int(n * f)), n itself when f = 1 (docs/training-semantics.md s3).
int64_t cropped_size(int64_t n, double f);

// The rows and columns of an h x w frame that the box resize reads (docs/training-semantics.md s3):
// the center crop of image_crop_fraction f (cropped_size rows from (h - rows) / 2, likewise
// columns), then, with image_aspect "crop", that region's center square (min(rows, cols) of each,
// from (rows - side) / 2 and (cols - side) / 2 within it). "squash" and "pad" keep the first region
// (pad adds its zeros at the resize: frames.hpp resize_frames).
struct FrameWindow {
  int64_t top = 0, left = 0, height = 0, width = 0;
};
FrameWindow box_window(int64_t h, int64_t w, double f, const std::string& image_aspect);

// The (height, width) every camera the batches use (those with a modality name) has after the
// crop of f: frames resized on the device need one size. {0, 0} with *why set when the cameras
// differ (naming two) or there is none.
std::pair<int64_t, int64_t> common_cropped_size(const Dataset& ds, double f, std::string* why);
// The same over every dataset of a mixture (naming the two datasets that differ).
std::pair<int64_t, int64_t> common_cropped_size(const Mixture& mixture, double f, std::string* why);

// The rows of each episode that are samples (s1), in episodes() order: all L of them, or, when
// the model's processor record is Isaac-GR00T N1.6's and counts V action rows (valid_horizon),
// the first L - V + 1 (none when L < V), the rows whose whole action chunk lies inside the
// episode: upstream's ShardedSingleStepDataset samples only those (Note [N1.6 processor]).
std::vector<int64_t> sample_rows(const Dataset& ds, const ProcessorRecord& record);

// Which samples each micro-batch of each optimizer step holds (s2). Throws
// DataError when the dataset is smaller than one global batch B x K x W.
class Sampler {
 public:
  Sampler(int64_t num_samples, uint64_t seed, bool shuffle, int64_t rank, int64_t world, int64_t micro_batch_size,
          int64_t accumulation);
  int64_t num_samples() const { return n_; }                    // N
  int64_t steps_per_epoch() const { return steps_per_epoch_; }  // T = N / G
  int64_t epoch_of_step(int64_t step) const { return step / steps_per_epoch_; }
  int64_t global_batch() const { return global_; }  // G = B * K * W
  // Sample ids of micro-batch i (0..K-1) of optimizer step `step` on this
  // rank, slot order b = 0..B-1.
  std::vector<int64_t> micro_batch(int64_t step, int64_t i);
  // Shuffled epochs in episode_order (data.sampler=episode) instead of epoch_permutation;
  // the lengths must sum to the sample count.
  void use_episode_order(std::vector<int64_t> episode_lengths, int64_t open, int64_t buffer);
  // Stream position p = step*G + i*B*W + b*W + rank of slot b of micro-batch
  // i of step `step` on this rank (the flow-matching draws' seed input, s4).
  int64_t stream_position(int64_t step, int64_t i, int64_t b) const;

 private:
  int64_t n_, rank_, world_, batch_, accumulation_, global_, steps_per_epoch_;
  uint64_t seed_;
  bool shuffle_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;  // the permutation of cached_epoch_
  std::vector<int64_t> episode_lengths_;  // non-empty: episode_order
  int64_t open_episodes_ = 0, shuffle_buffer_ = 0;
};

struct SampleOptions {
  // From the trainer config (data.*, run.seed, trainer.micro_batch_size).
  int64_t action_horizon = 16;
  int64_t max_text_len = 32;
  int64_t embodiment_id = 0;
  std::string normalization = "min_max";  // or "mean_std" (training-semantics s3)
  bool shuffle = true;
  std::string sampler = "uniform";  // or "episode" (data.sampler; open_episodes, shuffle_buffer)
  int64_t open_episodes = 4, shuffle_buffer = 256;
  uint64_t seed = 42;
  int64_t micro_batch_size = 8;
  int64_t rank = 0, world = 1;
  int64_t accumulation = 1;  // trainer.gradient_accumulation_steps (K)
  // From the model (config.json).
  int64_t image_size = 64;
  // Center crop before the resize (config.json image_crop_fraction; 1 = none): a frame
  // (h, w) keeps rows [(h - ch) / 2, + ch), ch = int(h * f), likewise columns
  // (docs/training-semantics.md s3; upstream GR00T's crop, taken from its checkpoint).
  double image_crop_fraction = 1.0;
  // data.image_aspect: what the box resize does with a frame that is not square after that crop
  // (docs/training-semantics.md s3): "squash" (resized whole, the aspect lost), "crop" (its center
  // square: box_window) or "pad" (zeros to a square of its longer side, centered as image_letterbox
  // places them: resize_frames' pad_square). Anything but squash is refused for a model whose
  // processor record is upstream's or whose image_resample is not box (they keep upstream's transform).
  std::string image_aspect = "squash";
  // config.json image_resample / image_resize_edge / image_target_size (frames.hpp): "box" (the
  // crop above, then resize_frames), "bicubic_aa" (resize_frames_bicubic_aa), "bilinear_aa"
  // (resize_frames_bilinear_aa) or "cv2_area" (resize_frames_cv2_area); image_resize_edge must be 0
  // but for bicubic_aa; the last three crop after their first resize, and take an
  // image_target_size other than image_size (0 = image_size).
  std::string image_resample = "box";
  int64_t image_resize_edge = 0;
  int64_t image_target_size = 0;
  bool image_letterbox = false;  // config.json image_letterbox: all but box pad frames to a square first
  // config.json image_random_crop (cv2_area or bilinear_aa with a crop only): upstream's train-time
  // crop, the windows at crop_positions(seed, p, ...) (frames.hpp): one per sample shared by its views
  // (cv2_area), or one per view (bilinear_aa); the cache then holds cv2_area_first's or
  // bilinear_aa_first's uint8 (len, T, T, 3) frames and each sample finishes them with its windows.
  bool image_random_crop = false;
  int64_t num_views = 1;
  int64_t max_state_dim = 64;
  int64_t max_action_dim = 64;
  // Flow-matching time from u ~ U[0, 1) (config.json noise_s, beta_alpha, fm_time;
  // training-semantics s4): b = u^(1 / beta_alpha), a Beta(beta_alpha, 1) draw, then
  // t = (noise_s - b) / noise_s (n16) or t = (1 - b) * noise_s (fm_time "upstream":
  // GR00T N1.6/N1.7's sample_time).
  double noise_s = 0.999;
  double beta_alpha = 1.5;
  bool fm_time_upstream = false;
  // The tokenizer the model was exported for (batch_spec.json "tokenizer"; kind empty:
  // an export older than that record) and the model file, for messages.
  TokenizerInfo model_tokenizer;
  std::string model_path;
  // Decoded-frame cache (data.frame_cache_mb).
  int64_t frame_cache_mb = 2048;
  // Frames resized on the device (data.frame_resize; frames.hpp): the cache keeps the cropped
  // uint8 frames and the micro-batch's "images" are uint8 (B, V, frame_height, frame_width, 3),
  // which every used camera's cropped size must equal (common_cropped_size; with image_aspect crop
  // the images are box_window's square of that size instead); the source resizes them after the
  // copy (finish_images, padding them to a square there with image_aspect pad).
  bool frames_on_device = false;
  int64_t frame_height = 0, frame_width = 0;
  // data.on_bad_video (Note [Bad videos] in batch.cpp): "error" or "skip".
  std::string on_bad_video = "error";
  // data.video_decode: "whole" (a video per decode) or "span" (a keyframe span per decode); the
  // trainer resolves the config's "auto" first (resolve_video_decode).
  std::string video_decode = "whole";
  // The model's processor record (batch_spec.json "processor"; processor.hpp): upstream GR00T
  // N1.7's state/action preparation, embodiment slot (it replaces embodiment_id) and state
  // dropout. Default: the dataset form (normalization above, in float64).
  ProcessorRecord processor;
};

struct DataStats {
  int64_t videos_decoded = 0;  // by any thread, including prefetches not (yet) used (span decoding: files opened)
  int64_t spans_decoded = 0;   // decodes (whole videos, or keyframe spans with video_decode = "span")
  int64_t frames_decoded = 0;
  double decode_ms = 0;         // summed over the decoding threads
  int64_t videos_bad = 0;       // videos found bad (on_bad_video=skip; each logged at warn with its cause)
  int64_t samples_skipped = 0;  // samples masked out because their video is bad (each logged)
  int64_t queue_depth = 0;      // ADFE: micro-batches ready when the trainer took the last one
  int64_t cache_bytes = 0;      // resized frames in the frame cache now (bounded by SampleOptions::frame_cache_mb)
  int64_t video_bytes_read = 0;  // video file bytes read for the decodes counted in videos_decoded (level 0)
  int64_t decode_jobs = 0;       // ADFE: videos (or spans) handed to the decode threads and not yet started (level 1)
  int64_t h2d_bytes = 0;         // bytes the source copied to the device so far (level 2; 0 on the CPU)
  int64_t readahead_files = 0;   // ADFE's I/O threads: video files read ahead into the page cache (level 0)
  int64_t readahead_bytes = 0;   // their sizes
  int64_t io_jobs = 0;           // ADFE: videos (or spans) handed to the I/O threads and not yet started (level 0)
};

// Shape and dtype of each tensor of a micro-batch of B samples (the model's
// batch keys, fm_t and fm_noise included), and their total size in bytes.
struct TensorSpec {
  std::string key;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  int64_t bytes() const;  // the tensor's size: its elements times the dtype's size
};
std::vector<TensorSpec> micro_batch_spec(const SampleOptions& options);

// The column that names each row's task: a "*task_description" annotation, else task_index (DataError when
// the dataset has neither).
int task_column(const Dataset& dataset);

// hist[l] = rows of the whole dataset whose task text has l tokens once cut to max_text_len (l = 0 ..
// max_text_len): what DMF chooses the text slot's buckets from. DataError when a row names a task the task
// table lacks.
std::vector<double> text_length_histogram(const Dataset& dataset, int64_t max_text_len);
// Summed over a mixture's datasets.
std::vector<double> text_length_histogram(const Mixture& mixture, int64_t max_text_len);
int64_t micro_batch_bytes(const SampleOptions& options);

// One micro-batch with the counts the trainer needs, taken while filling.
struct MicroBatch {
  Batch tensors;              // CPU tensors, the model's batch (incl. fm_t, fm_noise)
  int64_t num_valid = 0;      // valid action elements (== sum of action_mask)
  int64_t text_tokens = 0;    // == sum of text_mask
  int64_t text_len_max = 0;   // the longest row of text_mask (DMF cuts the text slot to its bucket)
  int64_t action_tokens = 0;  // action rows with at least one valid element (== action_mask.amax(2).sum())
  std::vector<int64_t> blank_slots;  // samples skipped for a bad video: zero images (frames.hpp model_images)
  std::vector<int64_t> embodiments;  // the distinct values of "embodiment_id", sorted
};

class BatchBuilder {
 public:
  // One dataset, its samples in embodiment slot options.embodiment_id.
  BatchBuilder(const Dataset& dataset, SampleOptions options);
  // A mixture (mixture.hpp): samples numbered part by part, each part's samples in its own
  // embodiment slot, normalized by its own statistics, its state and actions padded to the model's
  // widths; every part must have the model's num_views cameras. A model with an upstream processor
  // record takes one part (it was imported for one embodiment).
  BatchBuilder(const std::vector<DataPart>& parts, SampleOptions options);
  // Micro-batch i (0..K-1) of optimizer step `step` on this rank.
  MicroBatch micro_batch(int64_t step, int64_t i);
  const Sampler& sampler() const { return sampler_; }
  // A consistent copy; any thread.
  DataStats stats() const;

  // One sample without flow-matching draws (tests, inspection).
  Batch sample(int64_t sample_id);

  // What samples `sample_ids` need decoded (opaque keys for prefetch():
  // their videos, or with span decoding their frames), each once, in
  // first-use order. Any thread.
  std::vector<int64_t> videos_of(const std::vector<int64_t>& sample_ids) const;
  // Decodes what `key` names (a videos_of() key) into the frame cache unless
  // it is there or being decoded. Any thread, concurrently with
  // micro_batch(); never throws (a failure is kept for the micro_batch()
  // that needs it).
  void prefetch(int64_t key);
  // Asks the kernel to read the video file of `key` (a videos_of() key) into
  // the page cache (posix_fadvise WILLNEED; Note [Readahead]) unless its
  // frames or file are cached or it was asked since its file was last read. Any
  // thread; never throws (a file that cannot be opened is left to the decode,
  // which reports it).
  void readahead(int64_t key);
  // While on, micro_batch() throws a DataError at its next cache miss instead
  // of decoding (ADFE's shutdown). Any thread.
  void cancel(bool on) { cancelled_ = on; }

 private:
  // Episodes are numbered over the parts (part k's after parts 0..k-1's): `episode` below is that number.
  struct Location {
    size_t episode;
    int64_t row;
  };
  // What the builder reads of one dataset of the mixture.
  struct Part {
    const Dataset* ds = nullptr;
    int64_t embodiment_id = 0;
    size_t first_episode = 0;  // its episodes' numbers start here
    int state_col = -1, action_col = -1, task_col = -1, timestamp_col = -1;
    std::vector<int> cameras;     // used cameras, cameras[] order
    std::vector<int> frame_cols;  // video_frame column per used camera
    std::vector<int> pts_cols;    // video_pts column per used camera
    // Normalization statistics: (min, max) or (mean, std) per value.
    std::vector<double> state_a, state_b, action_a, action_b;
  };
  void add_part(const DataPart& part);  // the constructor's checks and columns of one dataset
  const Part& part_of(size_t episode) const { return parts_[episode_part_[episode]]; }
  const EpisodeInfo& episode_info(size_t episode) const {
    const Part& p = part_of(episode);
    return p.ds->episodes()[episode - p.first_episode];
  }
  ArrayView array(size_t episode, int column) const {
    const Part& p = part_of(episode);
    return p.ds->array(episode - p.first_episode, column);
  }
  // One frame-cache entry (Note [Frame cache]): the frames of a video or of
  // a span, or (span decoding) a checked video file.
  struct Entry {
    enum class State { kDecoding, kReady, kBad, kFailed } state = State::kDecoding;
    at::Tensor frames;         // kReady: (len, 3, S, S) float32, or (len, h, w, 3) uint8 with frames_on_device
                               // ((len, T, T, 3) uint8 with image_random_crop)
    std::shared_ptr<const VideoFile> file;  // kReady file entries: the bytes and keyframes
    std::string cause;         // kBad (on_bad_video=skip): where and why
    std::exception_ptr error;  // kFailed: raised by the micro-batch that needs it
    int64_t bytes_read = 0;    // kReady: the video file's bytes read for it (read whole, hashed)
    int64_t bytes() const;     // what it holds, against frame_cache_mb
  };
  Location locate(int64_t sample_id) const;
  // Also adds to mb's counts; crops: the sample's crop windows under image_random_crop (one for every
  // view, or one per view; none: the center).
  void fill(int64_t slot, int64_t sample_id, MicroBatch& mb, const std::vector<std::pair<double, double>>& crops = {});
  // The frames of `frame` of a video: a (len, 3, S, S) float32 (or uint8 device-layout) tensor
  // and the frame's row in it, or an undefined tensor when the video is bad and on_bad_video
  // is "skip" (*cause says why). Waits for a decode in flight.
  std::pair<at::Tensor, int64_t> frames(size_t episode, int camera, int64_t frame, std::string* cause);
  // Entry `key`, made on this thread on a miss (make() builds it, outside the lock); a
  // ready or bad one is returned, a stored failure rethrown; one in flight on another
  // thread is waited for (wait) or gives nullptr. mu_ held by `lock`.
  Entry* entry_locked(std::unique_lock<std::mutex>& lock, int64_t key, const std::function<Entry()>& make, bool wait);
  // The cache key of `want` (a videos_of() key). With span decoding the video's file entry
  // comes first (opened here on a miss, waited for while another thread opens it): *file is
  // it, or, when it is bad, *bad its entry and the key returned its key. mu_ held by `lock`.
  int64_t resolve_locked(std::unique_lock<std::mutex>& lock, int64_t want, std::shared_ptr<const VideoFile>* file,
                         Entry** bad);
  // The index's facts about a video; a bad video's entry under data.on_bad_video.
  VideoCheck video_check(size_t episode, int camera) const;
  Entry bad_video(size_t episode, int camera, const BadVideoError& e) const;
  // Decodes and checks one video or span (file: null for a whole video); opens and checks one
  // file. Thread-safe (read only immutable state).
  Entry decode(int64_t key, const VideoFile* file) const;
  Entry open_file(int64_t key) const;
  void store_locked(int64_t key, Entry entry);  // mu_ held

  std::vector<Part> parts_;
  std::vector<size_t> episode_part_;  // the part of each episode
  SampleOptions opt_;
  Sampler sampler_;
  std::vector<int64_t> episode_start_;  // prefix sums of the episodes' sample rows (sample_rows)
  bool mean_std_ = false;
  std::optional<UpstreamNormalizer> upstream_;  // the model's processor record is upstream's (processor.hpp)
  bool spans_ = false;  // opt_.video_decode == "span"
  // The frame cache, key = (episode * 1024 + camera) << 20 | first frame of the span (0 for a
  // whole video; kFileKey for the file entry of span decoding); guarded by mu_.
  mutable std::mutex mu_;
  std::condition_variable decoded_;  // an entry left kDecoding
  std::map<int64_t, Entry> cache_;
  std::list<int64_t> lru_;  // kReady entries, most recent first
  int64_t cache_bytes_ = 0;
  DataStats stats_;  // decode counts under mu_; skip counts by the micro_batch() thread (also under mu_)
  std::atomic<bool> cancelled_{false};
  std::set<int64_t> bad_reported_;  // the micro_batch() thread's: bad videos already counted and logged
  std::set<int64_t> read_ahead_;    // videos (episode * 1024 + camera) read ahead since their last decode; mu_
};

}  // namespace loongforge::data
