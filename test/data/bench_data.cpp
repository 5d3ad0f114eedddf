// bench_data: decoded samples/s of one data source over a converted dataset,
// from a cold frame cache (the source is made inside the timed region), on
// the CPU. Driven by scripts/bench_data.py, which runs it next to the
// reference PyTorch DataLoader; not a test.
//
//   bench_data DATASET sync|adfe THREADS PREFETCH MICRO_BATCHES BATCH IMAGE_SIZE FRAME_CACHE_MB
//              [uniform|episode OPEN_EPISODES SHUFFLE_BUFFER] [video_decode=whole|span] [io_threads=N]
//              [cold=1]
// prints one JSON object. io_threads: adfe.io_threads (default 1). cold=1: the dataset's video
// files are dropped from the page cache (posix_fadvise DONTNEED) before the timed region, so
// the run reads them from storage (level 0, Note [Readahead] in src/data/batch.cpp).
#include <chrono>    // std::chrono::steady_clock
#include <cstdio>    // std::printf
#include <cstdlib>   // std::atoll
#include <iostream>  // std::cerr
#include <string>    // std::string

#include <fcntl.h>   // open, posix_fadvise
#include <unistd.h>  // close, fdatasync

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/data/source.hpp"
#include "loongforge/engines/adfe/adfe.hpp"

using namespace loongforge;
using namespace loongforge::data;

namespace {
// Asks the kernel to drop the file's clean pages from the page cache (no root needed).
void drop_from_page_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

struct NoPhases final : PhaseRecorder {
  bool recording() const override { return false; }
  void end_phase(const char*, int64_t, int64_t, Clock::time_point) override {}
};
}  // namespace

int main(int argc, char** argv) {
  std::string video_decode = "whole";
  int64_t io_threads = 1;
  bool cold = false;
  for (; argc > 9; --argc) {  // trailing key=value options
    const std::string a = argv[argc - 1];
    if (a.rfind("video_decode=", 0) == 0)
      video_decode = a.substr(13);
    else if (a.rfind("io_threads=", 0) == 0)
      io_threads = std::atoll(a.c_str() + 11);
    else if (a.rfind("cold=", 0) == 0)
      cold = a.substr(5) == "1";
    else
      break;
  }
  if (argc != 9 && argc != 12) {
    std::cerr << "usage: bench_data DATASET sync|adfe THREADS PREFETCH MICRO_BATCHES BATCH IMAGE_SIZE FRAME_CACHE_MB "
                 "[uniform|episode OPEN_EPISODES SHUFFLE_BUFFER] [video_decode=whole|span] [io_threads=N] [cold=1]\n";
    return 2;
  }
  const std::string path = argv[1], kind = argv[2];
  const int64_t threads = std::atoll(argv[3]), prefetch = std::atoll(argv[4]), micro_batches = std::atoll(argv[5]);
  SampleOptions o;
  o.micro_batch_size = std::atoll(argv[6]);
  o.image_size = std::atoll(argv[7]);
  o.frame_cache_mb = std::atoll(argv[8]);
  o.accumulation = 1;
  o.video_decode = video_decode;
  if (argc == 12) {  // data.sampler, data.open_episodes, data.shuffle_buffer
    o.sampler = argv[9];
    o.open_episodes = std::atoll(argv[10]);
    o.shuffle_buffer = std::atoll(argv[11]);
  }
  try {
    const Dataset ds = Dataset::open(path);
    if (cold)
      for (const auto& ep : ds.episodes())
        for (const auto& video : ep.video_paths) drop_from_page_cache(video);
    NoPhases phases;
    const auto t0 = std::chrono::steady_clock::now();
    DataStats stats;
    {
      auto source = kind == "adfe" ? adfe::make_async_source(ds, o, c10::kCPU, 16, {prefetch, threads, 64.0, io_threads})
                                   : make_sync_source(ds, o, c10::kCPU, 16);
      for (int64_t m = 0; m < micro_batches; ++m) source->next(m, 0, phases);
      stats = source->stats();
    }  // timed up to here: the ADFE source's threads are joined
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const nlohmann::json r = {{"source", kind},
                              {"threads", kind == "adfe" ? threads : 0},
                              {"samples", micro_batches * o.micro_batch_size},
                              {"seconds", s},
                              {"samples_per_s", static_cast<double>(micro_batches * o.micro_batch_size) / s},
                              {"video_decode", video_decode},
                              {"io_threads", kind == "adfe" ? io_threads : 0},
                              {"cold", cold},
                              {"readahead_files", stats.readahead_files},
                              {"readahead_mb", static_cast<double>(stats.readahead_bytes) / (1 << 20)},
                              {"videos_decoded", stats.videos_decoded},
                              {"spans_decoded", stats.spans_decoded},
                              {"frames_decoded", stats.frames_decoded}};
    std::printf("%s\n", r.dump().c_str());
  } catch (const std::exception& e) {
    std::cerr << "bench_data: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
