// Proves ADFE's asynchronous source (source.hpp, Note [ADFE]) yields exactly
// the plain source's micro-batches: bitwise equal tensors and equal counts
// over 2 steps of 2 micro-batches for decode_threads 1, 2 and 8 and
// prefetch_factor 1 and 4 (also with a frame cache too small for the
// look-ahead, so videos are evicted and decoded again), from any starting
// step (a resumed run); that a bad video stops it at the micro-batch that
// needs it with the plain source's message, again if asked again
// (on_bad_video=error), and is skipped with the same counts
// (on_bad_video=skip); that it stops cleanly with decodes and a full queue
// in flight; that I/O threads (level 0) read each coming video's file ahead
// once without changing a bit or an error; that a micro-batch too large
// for a pinned slot is refused naming adfe.slot_mb and the size needed; and
// that the staged size and the largest micro-batch a slot holds (what
// trainer.micro_batch_size auto caps its candidates at) count uint8 camera
// frames where frames are resized on the device, exactly as that refusal does.
#include <chrono>      // std::chrono::steady_clock
#include <filesystem>  // std::filesystem::copy_file
#include <string>      // std::string
#include <vector>      // std::vector

#include <ATen/ATen.h>  // at::equal

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/engines/adfe/adfe.hpp"

using namespace loongforge;
using namespace loongforge::data;
using lf_catch::Contains;

namespace {

const std::string kData = LOONGFORGE_TEST_DATASET;
const std::string kCamera = "observation.images.ego_view";
constexpr int64_t kTokensPerView = 16;

struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
} no_phases;

// In order (shuffle off), step s holds samples 8s .. 8s+7: steps 51 and 52
// cross from episode 0 (rows 0..415) into episode 1, so two videos are
// decoded, the second ahead while the first is in use (each costs about a
// second of CPU, hence few videos per test).
constexpr int64_t kBoundaryStep = 51;

SampleOptions options(const std::string& policy = "error", bool shuffle = false) {
  SampleOptions o;
  o.micro_batch_size = 4;
  o.accumulation = 2;
  o.image_size = 64;
  o.shuffle = shuffle;
  o.on_bad_video = policy;
  return o;
}

std::string video_of(const std::string& dir, int episode) {
  char name[256];
  std::snprintf(name, sizeof(name), "/videos/chunk-000/%s/episode_%06d.mp4", kCamera.c_str(), episode);
  return dir + name;
}

// A private copy of the converted dataset with episode `bad`'s video replaced
// by the next episode's (refused by its size against the index).
std::string swapped_copy(const std::string& name, int bad) {
  const std::string dst = std::string(LOONGFORGE_TEST_MODELS) + "/adfe-" + name;
  remove_tree(dst);
  copy_tree(kData, dst);
  std::filesystem::copy_file(video_of(kData, bad + 1), video_of(dst, bad),
                             std::filesystem::copy_options::overwrite_existing);
  return dst;
}

void require_same(const ReadyBatch& a, const ReadyBatch& b) {
  REQUIRE(a.num_valid == b.num_valid);
  REQUIRE(a.tokens == b.tokens);
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (const auto& [key, t] : a.tensors) {
    INFO("key " << key);
    const at::Tensor& u = b.tensors.at(key);
    REQUIRE(t.scalar_type() == u.scalar_type());
    REQUIRE(t.sizes() == u.sizes());
    REQUIRE(at::equal(t, u));  // bitwise: same values, NaN-free inputs
  }
}

// (step, micro) of every micro-batch from `first_step` for `steps` steps.
std::vector<std::pair<int64_t, int64_t>> order(int64_t first_step, int64_t steps, int64_t k) {
  std::vector<std::pair<int64_t, int64_t>> o;
  for (int64_t s = first_step; s < first_step + steps; ++s)
    for (int64_t i = 0; i < k; ++i) o.emplace_back(s, i);
  return o;
}

}  // namespace

TEST_CASE("adfe: micro-batches equal the plain source's bitwise for 1, 2 and 8 decode threads and prefetch 1 and 4") {
  const Dataset ds = Dataset::open(kData);
  const SampleOptions o = options();
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  std::vector<ReadyBatch> want;
  for (const auto& [s, i] : order(kBoundaryStep, 2, o.accumulation)) want.push_back(sync->next(s, i, no_phases));
  REQUIRE(sync->stats().videos_decoded == 2);
  for (const int64_t threads : {1, 2, 8})
    for (const int64_t prefetch : {1, 4}) {
      INFO("decode_threads " << threads << ", prefetch_factor " << prefetch);
      auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {prefetch, threads, 64.0});
      size_t n = 0;
      for (const auto& [s, i] : order(kBoundaryStep, 2, o.accumulation)) {
        INFO("step " << s << " micro " << i);
        require_same(adfe->next(s, i, no_phases), want[n++]);
      }
      REQUIRE(adfe->stats().samples_skipped == 0);
      REQUIRE(adfe->stats().queue_depth <= prefetch);
    }
}

TEST_CASE("adfe: in the shuffled order, with several videos decoded at once, micro-batches equal the plain source's") {
  const Dataset ds = Dataset::open(kData);
  const SampleOptions o = options("error", /*shuffle=*/true);
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 2, 64.0});
  for (const auto& [s, i] : order(0, 1, o.accumulation)) {
    INFO("step " << s << " micro " << i);
    require_same(adfe->next(s, i, no_phases), sync->next(s, i, no_phases));
  }
  REQUIRE(sync->stats().videos_decoded >= 3);  // seed 42's first 8 samples span several episodes
}

TEST_CASE("adfe: with a frame cache smaller than the look-ahead, evicted videos are decoded again to the same bits") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = options();
  o.frame_cache_mb = 25;  // one decoded episode (416 x 3 x 64 x 64 float32 = 20 MB): the next one evicts it
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 2, 64.0});
  for (const auto& [s, i] : order(kBoundaryStep, 2, o.accumulation)) {
    INFO("step " << s << " micro " << i);
    require_same(adfe->next(s, i, no_phases), sync->next(s, i, no_phases));
  }
}

TEST_CASE("adfe: a source started at step s (a resumed run) yields what an uninterrupted one yields there") {
  const Dataset ds = Dataset::open(kData);
  const SampleOptions o = options();
  auto whole = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {2, 2, 64.0});
  std::vector<ReadyBatch> tail;
  for (const auto& [s, i] : order(kBoundaryStep - 1, 3, o.accumulation)) {
    ReadyBatch b = whole->next(s, i, no_phases);
    if (s >= kBoundaryStep) tail.push_back(std::move(b));
  }
  auto resumed = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {2, 2, 64.0});
  size_t n = 0;
  for (const auto& [s, i] : order(kBoundaryStep, 2, o.accumulation)) {
    INFO("step " << s << " micro " << i);
    require_same(resumed->next(s, i, no_phases), tail[n++]);
  }
}

// The first (step, micro-batch) of the four steps from kBoundaryStep - 1 at which
// `source` throws a DataError, and its message ({-1, -1} and "" when none does).
static std::pair<std::pair<int64_t, int64_t>, std::string> first_error(BatchSource& source, const SampleOptions& o) {
  for (const auto& [s, i] : order(kBoundaryStep - 1, 4, o.accumulation)) {
    try {
      source.next(s, i, no_phases);
    } catch (const DataError& e) {
      return {{s, i}, e.what()};
    }
  }
  return {{-1, -1}, ""};
}

TEST_CASE("adfe: a bad video stops at the micro-batch that needs it with the plain source's message") {
  const std::string dir = swapped_copy("error", 1);
  const Dataset ds = Dataset::open(dir);
  const SampleOptions o = options("error");
  // Where and how the plain source stops.
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  const auto [stop, message] = first_error(*sync, o);
  REQUIRE(stop == std::pair<int64_t, int64_t>{kBoundaryStep + 1, 0});  // sample 416: episode 1's first row
  REQUIRE_THAT(message, Contains("bad video (data.on_bad_video=error): shard shard-00000.lfshard, episode 1, camera '" +
                                 kCamera + "', video " + video_of(dir, 1) + ": "));
  for (const int64_t threads : {1, 8}) {
    INFO("decode_threads " << threads);
    auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, threads, 64.0});
    const auto [got, got_message] = first_error(*adfe, o);
    REQUIRE(got == stop);
    REQUIRE(got_message == message);
    // Asked again (the producer had stopped there), the same error.
    REQUIRE_THROWS_WITH(adfe->next(stop.first, stop.second, no_phases), message);
  }
}

TEST_CASE("adfe: with on_bad_video=skip the same samples are masked and the same skips counted, micro-batch by micro-batch") {
  const std::string dir = swapped_copy("skip", 1);
  const Dataset ds = Dataset::open(dir);
  const SampleOptions o = options("skip");
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 2, 64.0});
  for (const auto& [s, i] : order(kBoundaryStep, 2, o.accumulation)) {
    INFO("step " << s << " micro " << i);
    require_same(adfe->next(s, i, no_phases), sync->next(s, i, no_phases));
    REQUIRE(adfe->stats().samples_skipped == sync->stats().samples_skipped);
    REQUIRE(adfe->stats().videos_bad == sync->stats().videos_bad);
  }
  REQUIRE(sync->stats().samples_skipped == 8);  // samples 416..423 of step 52: episode 1
  REQUIRE(sync->stats().videos_bad == 1);
}

TEST_CASE("adfe: I/O threads read the coming videos' files ahead of a busy decode thread, each once, and the "
          "micro-batches stay the plain source's") {
  const Dataset ds = Dataset::open(kData);
  const SampleOptions o = options("error", /*shuffle=*/true);  // seed 42's first step spans several episodes
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  std::vector<ReadyBatch> want;
  for (const auto& [s, i] : order(0, 1, o.accumulation)) want.push_back(sync->next(s, i, no_phases));
  const int64_t videos = sync->stats().videos_decoded;
  REQUIRE(videos >= 3);
  int64_t all_bytes = 0;
  for (const auto& ep : ds.episodes())
    all_bytes += static_cast<int64_t>(std::filesystem::file_size(video_of(kData, static_cast<int>(ep.index))));
  for (const int64_t io : {0, 1, 2}) {
    INFO("io_threads " << io);
    // One decode thread: while it decodes the first video (about a second), the others wait in its queue.
    auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 1, 64.0, io});
    size_t n = 0;
    for (const auto& [s, i] : order(0, 1, o.accumulation)) require_same(adfe->next(s, i, no_phases), want[n++]);
    const DataStats st = adfe->stats();
    INFO("read ahead: " << st.readahead_files << " files, " << st.readahead_bytes << " bytes; " << videos
                        << " videos decoded");
    if (io == 0) {
      REQUIRE(st.readahead_files == 0);
      REQUIRE(st.readahead_bytes == 0);
    } else {
      // A video a decoder has claimed is not read ahead; the queued ones are, each once (the frame cache
      // keeps every video here, so none is decoded twice).
      REQUIRE(st.readahead_files >= 1);
      REQUIRE(st.readahead_files <= static_cast<int64_t>(ds.episodes().size()));
      REQUIRE(st.readahead_bytes > 0);
      REQUIRE(st.readahead_bytes <= all_bytes);
    }
  }
}

TEST_CASE("adfe: with I/O threads, a missing video stops at the micro-batch that needs it with the plain source's "
          "message") {
  const std::string dir = std::string(LOONGFORGE_TEST_MODELS) + "/adfe-missing";
  remove_tree(dir);
  copy_tree(kData, dir);
  std::filesystem::remove(video_of(dir, 1));
  const Dataset ds = Dataset::open(dir);
  const SampleOptions o = options("error");
  auto sync = make_sync_source(ds, o, c10::kCPU, kTokensPerView);
  const auto [stop, message] = first_error(*sync, o);
  REQUIRE(stop == std::pair<int64_t, int64_t>{kBoundaryStep + 1, 0});
  REQUIRE_THAT(message, Contains("cannot open the video file"));
  auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 2, 64.0, 2});
  const auto [got, got_message] = first_error(*adfe, o);
  REQUIRE(got == stop);
  REQUIRE(got_message == message);
}

TEST_CASE("adfe: destroying the source with a full queue and decodes in flight joins its threads promptly") {
  const Dataset ds = Dataset::open(kData);
  const SampleOptions o = options();
  const auto t0 = std::chrono::steady_clock::now();
  {
    auto unused = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 2, 64.0});  // never started
    auto adfe = adfe::make_async_source(ds, o, c10::kCPU, kTokensPerView, {4, 8, 64.0});
    adfe->next(0, 0, no_phases);  // starts the producer and the pool; decodes and builds run ahead
  }
  // Each thread finishes at most the video it decodes (a fraction of a second each here).
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
}

TEST_CASE("adfe: a micro-batch larger than a pinned slot is refused naming adfe.slot_mb and the size needed") {
  SampleOptions o = options();
  o.micro_batch_size = 64;
  o.image_size = 224;
  o.num_views = 2;  // images: 64 x 2 x 3 x 224 x 224 x 4 bytes = 73.5 MiB; with the rest 74.28 MiB
  REQUIRE(adfe::slot_size_problem(o, 128.0).empty());
  const std::string p = adfe::slot_size_problem(o, 64.0);
  REQUIRE_THAT(p, Contains("adfe.slot_mb is 64 MB but one micro-batch needs 74.28 MB") &&
                      Contains("trainer.micro_batch_size 64, 2 view(s) of 224 px") &&
                      Contains("set adfe.slot_mb to at least 75"));
  REQUIRE(micro_batch_bytes(o) > 64 * 3 * 224 * 224 * 4 * 2);  // the images and the rest
}

TEST_CASE("adfe: the staged size counts uint8 camera frames, and the largest micro-batch a slot holds is exact") {
  SampleOptions floats = options();  // frames resized on the CPU: float 3 x 64 x 64 images
  SampleOptions frames = options();  // on the device: the camera's uint8 256 x 256 x 3 frames
  frames.frames_on_device = true, frames.frame_height = 256, frames.frame_width = 256;
  // One sample: the image, then state, actions, action_mask, text_tokens, text_mask, embodiment_id, fm_t and
  // fm_noise, each tensor's start aligned to 256 bytes (the three (16, 64) floats and the state already are).
  const int64_t rest = 256 + 3 * 16 * 64 * 4 + 32 * 8 + 256 + 256 + 256;
  REQUIRE(adfe::staged_bytes(frames, 1) == 256 * 256 * 3 + rest);
  REQUIRE(adfe::staged_bytes(floats, 1) == 3 * 64 * 64 * 4 + rest);
  REQUIRE(adfe::staged_bytes(frames, 4) == 4 * 256 * 256 * 3 + 4 * (256 + 3 * 16 * 64 * 4 + 32 * 8) + 256 + 256 + 256);
  // The largest micro-batch in a 64 MB slot is the one the source accepts, the next one it refuses.
  const int64_t fits = adfe::largest_micro_batch_in_slot(frames, 64.0);
  REQUIRE(fits == 64 * 1048576 / (256 * 256 * 3 + 256 + 3 * 16 * 64 * 4 + 32 * 8 + 32 + 8 + 4));  // 320
  frames.micro_batch_size = fits;
  REQUIRE(adfe::slot_size_problem(frames, 64.0).empty());
  frames.micro_batch_size = fits + 1;
  REQUIRE_THAT(adfe::slot_size_problem(frames, 64.0), Contains("adfe.slot_mb is 64 MB but one micro-batch needs"));
  // Sized as float model images a slot would seem to hold three times as many: the cap must not use them.
  REQUIRE(adfe::largest_micro_batch_in_slot(floats, 64.0) > 3 * fits);
  // Not one sample: 0.
  REQUIRE(adfe::largest_micro_batch_in_slot(frames, 0.1) == 0);
}
