// ADFE, the asynchronous BatchSource: a producer thread, I/O threads, a
// decode pool, a bounded queue and (CUDA) pinned slots with a copy stream
// (source.hpp).
#include <sched.h>  // sched_getaffinity, CPU_COUNT

#include <algorithm>           // std::max
#include <atomic>              // std::atomic
#include <condition_variable>  // std::condition_variable
#include <cstdio>              // std::snprintf
#include <cstdlib>             // std::getenv, std::atoll
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr, std::rethrow_exception
#include <functional>          // std::function
#include <mutex>               // std::mutex, std::unique_lock
#include <thread>              // std::thread
#include <utility>             // std::move
#include <vector>              // std::vector

#include <ATen/ATen.h>  // at::empty

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/threads.hpp"
#include "loongforge/engines/adfe/adfe.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAEvent.h>  // at::cuda::CUDAEvent
#include <c10/cuda/CUDAGuard.h>   // c10::cuda::CUDAGuard, c10::cuda::CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getStreamFromPool, getCurrentCUDAStream
#endif

namespace loongforge::adfe {

using data::Batch;
using data::BatchBuilder;
using data::BatchSource;
using data::DataStats;
using data::MicroBatch;
using data::Dataset;
using data::ReadyBatch;
using data::SampleOptions;
using data::Sampler;
using data::finish_images;

// Note [ADFE]
// Micro-batch m = s*K + i (step s, micro-batch i) is built by one producer
// thread calling BatchBuilder::micro_batch(s, i), in increasing m, exactly the
// call the plain source makes on the trainer thread: so the samples, the
// flow-matching draws, the skip counts and the first error are those of the
// plain source. Before building m the producer hands the videos of
// m .. m + prefetch_factor (computed by its own copy of the sampler, a pure
// function of the step) to the decode pool, whose threads decode them into
// the builder's frame cache in parallel (BatchBuilder::prefetch; Note [Frame
// cache] in batch.cpp: the same bits whichever thread decodes, a failure kept
// for the micro-batch that needs it), and the videos of m .. m +
// 2 * prefetch_factor to the I/O threads, which have the kernel read their
// files ahead into the page cache (BatchBuilder::readahead, Note [Readahead]). The producer waits for a video being
// decoded, decodes a missing one itself, and pushes each built micro-batch,
// or the exception that stopped it, into a queue of at most prefetch_factor
// entries; it then stops at an exception, so nothing past a bad micro-batch
// is handed out, and the trainer gets the exception from next() of exactly
// that micro-batch. Priorities: the producer and the decoders lower their
// own nice value by kDataThreadNice (common/threads.hpp), so the trainer
// thread wins a busy core and they win it from the checkpoint writer.

namespace {

// The calling data thread yields a busy core to the trainer (common/threads.hpp).
void lower_priority() {
  if (!lower_thread_priority(kDataThreadNice))
    LF_LOG(logger("data"), debug) << "ADFE: could not lower a data thread's priority";
}

constexpr int64_t kSlotAlign = 256;  // bytes: each tensor of a pinned slot starts aligned
int64_t aligned(int64_t bytes) { return (bytes + kSlotAlign - 1) / kSlotAlign * kSlotAlign; }

// Threads running `job` (BatchBuilder::prefetch: the decode threads; BatchBuilder::readahead:
// the I/O threads) on the keys handed to them, first come first served.
class WorkPool {
 public:
  // `pending` counts the jobs handed over and not started (DataStats::decode_jobs for decodes).
  WorkPool(const char* name, int64_t threads, std::atomic<int64_t>& pending, std::function<void(int64_t)> job)
      : name_(name), pending_(pending), job_(std::move(job)) {
    for (int64_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  ~WorkPool() { stop(); }
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  void submit(const std::vector<int64_t>& keys) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.insert(jobs_.end(), keys.begin(), keys.end());
      pending_ = static_cast<int64_t>(jobs_.size());
    }
    cv_.notify_all();
  }
  // Drops the jobs not started and joins the threads (each finishes the video it decodes).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      jobs_.clear();
      pending_ = 0;
    }
    cv_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  void work() {
    set_thread_name(name_);
    lower_priority();
    for (;;) {
      int64_t key = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) return;
        key = jobs_.front();
        jobs_.pop_front();
        pending_ = static_cast<int64_t>(jobs_.size());
      }
      job_(key);  // never throws: prefetch keeps a failure in the cache, readahead leaves it to the decode
    }
  }

  const char* name_;
  std::atomic<int64_t>& pending_;
  std::function<void(int64_t)> job_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int64_t> jobs_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// One built micro-batch (or the exception that stopped the producer there).
struct Item {
  ReadyBatch batch;
  int64_t samples_skipped = 0, videos_bad = 0;  // the builder's counts once it was built
  std::exception_ptr error;
#if LOONGFORGE_WITH_CUDA_KERNELS
  std::shared_ptr<at::cuda::CUDAEvent> copied;  // its H2D copy, on the copy stream
#endif
};

class AsyncSource final : public BatchSource {
 public:
  AsyncSource(const std::vector<data::DataPart>& parts, const SampleOptions& options, c10::Device device,
              int64_t tokens_per_view, AsyncOptions async)
      : builder_(parts, options),
        lookahead_(builder_.sampler()),
        device_(device),
        async_(async),
        accumulation_(options.accumulation),
        image_tokens_per_sample_(options.num_views * tokens_per_view + 1),  // + the state token
        batch_size_(options.micro_batch_size),
        image_size_(options.image_size),
        pad_square_(options.image_aspect == "pad") {
    if (async_.prefetch_factor < 1 || async_.decode_threads < 1 || async_.io_threads < 0)
      throw ConfigError("adfe.prefetch_factor and adfe.decode_threads must be >= 1 and adfe.io_threads >= 0 (got " +
                        std::to_string(async_.prefetch_factor) + ", " + std::to_string(async_.decode_threads) + ", " +
                        std::to_string(async_.io_threads) + ")");
    if (device_.is_cuda()) open_slots(options);
  }
  ~AsyncSource() override { stop(); }

  ReadyBatch next(int64_t step, int64_t micro, PhaseRecorder& phases) override {
    if (!producer_.joinable() || step != want_step_ || micro != want_micro_) start(step, micro);
    Item item;
    {
      Phase p(phases, "data_wait", step + 1, micro);
      {
        std::unique_lock<std::mutex> lock(mu_);
        depth_ = static_cast<int64_t>(queue_.size());
        ready_.wait(lock, [this] { return !queue_.empty(); });
        item = std::move(queue_.front());
        queue_.pop_front();
        if (!item.error) skipped_ = item.samples_skipped, bad_ = item.videos_bad;
      }
      space_.notify_one();
      want_micro_ = micro + 1 == accumulation_ ? 0 : micro + 1;
      want_step_ = micro + 1 == accumulation_ ? step + 1 : step;
      if (item.error) {
        want_step_ = -1;  // the producer has stopped: a later call starts it again (and meets the same error)
        std::rethrow_exception(item.error);  // inside data_wait, as the plain source
      }
    }
    Phase p(phases, "h2d", step + 1, micro);
#if LOONGFORGE_WITH_CUDA_KERNELS
    if (device_.is_cuda()) {
      const c10::cuda::CUDAStream stream = c10::cuda::getCurrentCUDAStream(device_.index());
      item.copied->block(stream);
      for (auto& [key, t] : item.batch.tensors) t.record_stream(stream);  // allocated on the copy stream
    }
#endif
    return std::move(item.batch);
  }

  const Sampler& sampler() const override { return builder_.sampler(); }
  DataStats stats() const override {
    DataStats d = builder_.stats();
    std::lock_guard<std::mutex> lock(mu_);
    d.samples_skipped = skipped_;
    d.videos_bad = bad_;
    d.queue_depth = depth_;
    d.decode_jobs = decode_jobs_;
    d.io_jobs = io_jobs_;
    d.h2d_bytes = h2d_bytes_;
    return d;
  }
  nlohmann::json status() const override {
    const DataStats d = stats();
    return {{"source", "adfe"},
            {"queue_depth", d.queue_depth},
            {"decode_jobs", d.decode_jobs},
            {"io_jobs", d.io_jobs},
            {"prefetch_factor", async_.prefetch_factor},
            {"decode_threads", async_.decode_threads},
            {"io_threads", async_.io_threads},
            {"readahead_files", d.readahead_files},
            {"readahead_mb", static_cast<double>(d.readahead_bytes) / (1 << 20)}};
  }

 private:
  // (Re)starts the producer and the pool at micro-batch (step, micro).
  void start(int64_t step, int64_t micro) {
    stop();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.clear();
      stop_ = false;
    }
    builder_.cancel(false);
    want_step_ = step, want_micro_ = micro;
    pool_ = std::make_unique<WorkPool>("lf-data-decode", async_.decode_threads, decode_jobs_,
                                       [this](int64_t key) { builder_.prefetch(key); });
    if (async_.io_threads > 0)
      io_ = std::make_unique<WorkPool>("lf-data-io", async_.io_threads, io_jobs_,
                                       [this](int64_t key) { builder_.readahead(key); });
    producer_ = std::thread([this, step, micro] { produce(step * accumulation_ + micro); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_.notify_all();
    builder_.cancel(true);  // a producer inside micro_batch() stops at its next cache miss
    if (io_) io_->stop();
    if (pool_) pool_->stop();
    if (producer_.joinable()) producer_.join();
    pool_.reset(), io_.reset();
  }

  void produce(int64_t first) {
    set_thread_name("lf-data-produce");
    lower_priority();
#if LOONGFORGE_WITH_CUDA_KERNELS
    std::unique_ptr<c10::cuda::CUDAGuard> guard;
    if (device_.is_cuda()) guard = std::make_unique<c10::cuda::CUDAGuard>(device_);
#endif
    int64_t scheduled = first - 1;  // the last micro-batch whose videos went to the decode pool
    int64_t read = first - 1;       // ... and to the I/O threads (Note [Readahead] in batch.cpp)
    // The videos of micro-batches scheduled + 1 .. read: computed once, for the I/O threads, and
    // handed to the decode pool when its window reaches them.
    std::deque<std::vector<int64_t>> read_not_decoded;
    const auto videos = [this](int64_t n) {
      return builder_.videos_of(lookahead_.micro_batch(n / accumulation_, n % accumulation_));
    };
    for (int64_t m = first;; ++m) {
      Item item;
      try {
        for (; io_ && read < m + 2 * async_.prefetch_factor; ++read) {
          read_not_decoded.push_back(videos(read + 1));
          io_->submit(read_not_decoded.back());
        }
        for (; scheduled < m + async_.prefetch_factor; ++scheduled) {
          if (read_not_decoded.empty()) {  // no I/O threads
            pool_->submit(videos(scheduled + 1));
          } else {
            pool_->submit(read_not_decoded.front());
            read_not_decoded.pop_front();
          }
        }
        MicroBatch mb = builder_.micro_batch(m / accumulation_, m % accumulation_);
        item.batch.num_valid = mb.num_valid;
        item.batch.embodiments = mb.embodiments;
        item.batch.tokens = mb.text_tokens + mb.action_tokens + batch_size_ * image_tokens_per_sample_;
        item.batch.text_tokens = mb.text_tokens;
        item.batch.text_len_max = mb.text_len_max;
        const DataStats st = builder_.stats();
        item.samples_skipped = st.samples_skipped, item.videos_bad = st.videos_bad;
        if (device_.is_cuda()) {
          stage(mb, item);
        } else {
          item.batch.tensors = std::move(mb.tensors);
          finish_images(item.batch.tensors, image_size_, mb.blank_slots, pad_square_);
        }
      } catch (...) {
        item = Item{};
        item.error = std::current_exception();
      }
      const bool last = static_cast<bool>(item.error);
      {
        std::unique_lock<std::mutex> lock(mu_);
        space_.wait(lock, [this] { return stop_ || static_cast<int64_t>(queue_.size()) < async_.prefetch_factor; });
        if (stop_) return;  // a cancelled micro_batch()'s error is never handed out
        queue_.push_back(std::move(item));
      }
      ready_.notify_one();
      if (last) return;
    }
  }

  // ---- CUDA devices: pinned slots and the copy stream
  void open_slots(const SampleOptions& options) {
    const std::string problem = slot_size_problem(options, async_.slot_mb);
    if (!problem.empty()) throw ConfigError(problem);
#if LOONGFORGE_WITH_CUDA_KERNELS
    const auto bytes = static_cast<int64_t>(async_.slot_mb * (1 << 20));
    for (int64_t i = 0; i < async_.prefetch_factor; ++i)
      slots_.push_back({at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true)), nullptr});
    copy_stream_ = std::make_unique<c10::cuda::CUDAStream>(
        c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index()));
#else
    throw ConfigError("ADFE: this binary was built without CUDA; cannot stage batches for " + device_.str());
#endif
  }

  // Packs `mb` into the next pinned slot and copies it to the device on the copy stream.
  void stage(MicroBatch& mb, Item& item) {
#if LOONGFORGE_WITH_CUDA_KERNELS
    Slot& slot = slots_[static_cast<size_t>(next_slot_++ % static_cast<int64_t>(slots_.size()))];
    if (slot.copied) slot.copied->synchronize();  // its previous batch has left it
    c10::cuda::CUDAStreamGuard on_copy(*copy_stream_);
    int64_t offset = 0;
    for (auto& [key, t] : mb.tensors) {
      const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
      at::Tensor host = slot.host.narrow(0, offset, bytes).view(t.scalar_type()).view(t.sizes());
      host.copy_(t);
      at::Tensor dev = at::empty(t.sizes(), t.options().device(device_));
      dev.copy_(host, /*non_blocking=*/true);
      item.batch.tensors.emplace(key, std::move(dev));
      offset += aligned(bytes);
      h2d_bytes_ += bytes;
    }
    // on the copy stream, before its event
    finish_images(item.batch.tensors, image_size_, mb.blank_slots, pad_square_);
    item.copied = std::make_shared<at::cuda::CUDAEvent>();
    item.copied->record(*copy_stream_);
    slot.copied = item.copied;
#else
    (void)mb, (void)item;
#endif
  }

  BatchBuilder builder_;
  Sampler lookahead_;  // the producer's: which videos the coming micro-batches need
  c10::Device device_;
  AsyncOptions async_;
  int64_t accumulation_, image_tokens_per_sample_, batch_size_, image_size_;
  bool pad_square_;  // data.image_aspect pad: the device resize pads each frame to a square

  std::atomic<int64_t> decode_jobs_{0};  // the pool's pending jobs (DataStats::decode_jobs); outlives pool_
  std::atomic<int64_t> io_jobs_{0};      // the I/O threads' pending jobs; outlives io_
  std::atomic<int64_t> h2d_bytes_{0};    // staged to the device so far (DataStats::h2d_bytes)
  std::unique_ptr<WorkPool> pool_, io_;  // decode threads, I/O threads (none with adfe.io_threads=0)
  std::thread producer_;
  mutable std::mutex mu_;  // guards the queue, stop_ and the counts handed out
  std::condition_variable ready_, space_;
  std::deque<Item> queue_;
  bool stop_ = false;
  int64_t skipped_ = 0, bad_ = 0, depth_ = 0;  // as of the micro-batch last handed out
  int64_t want_step_ = -1, want_micro_ = -1;   // the next() call expected (trainer thread)

#if LOONGFORGE_WITH_CUDA_KERNELS
  struct Slot {
    at::Tensor host;                              // (slot bytes,) uint8, pinned
    std::shared_ptr<at::cuda::CUDAEvent> copied;  // the last copy out of it
  };
  std::vector<Slot> slots_;
  int64_t next_slot_ = 0;
  std::unique_ptr<c10::cuda::CUDAStream> copy_stream_;
#endif
};

}  // namespace

int64_t staged_bytes(const SampleOptions& options, int64_t micro_batch) {
  SampleOptions sized = options;
  sized.micro_batch_size = micro_batch;
  int64_t bytes = 0;
  for (const auto& t : micro_batch_spec(sized)) bytes += aligned(t.bytes());  // the tensors stage() packs, each aligned
  return bytes;
}

int64_t largest_micro_batch_in_slot(const SampleOptions& options, double slot_mb) {
  const double slot = slot_mb * (1 << 20);
  const auto fits = [&](int64_t b) { return static_cast<double>(staged_bytes(options, b)) <= slot; };
  if (!fits(1)) return 0;
  // staged_bytes grows with the micro-batch: double past the slot, then bisect (fits(lo), !fits(hi)).
  constexpr int64_t kMost = int64_t{1} << 40;  // a bound no real slot reaches (every sample has an action)
  int64_t lo = 1, hi = 2;
  while (hi < kMost && fits(hi)) lo = hi, hi *= 2;
  if (hi >= kMost) return lo;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

std::string slot_size_problem(const SampleOptions& options, double slot_mb) {
  const int64_t need = staged_bytes(options, options.micro_batch_size);
  if (static_cast<double>(need) <= slot_mb * (1 << 20)) return "";
  char text[512];
  const double need_mb = static_cast<double>(need) / (1 << 20);
  std::snprintf(text, sizeof(text),
                "adfe.slot_mb is %g MB but one micro-batch needs %.2f MB of pinned staging (%lld bytes: "
                "trainer.micro_batch_size %lld, %lld view(s) of %lld px, horizon %lld): set adfe.slot_mb to at least "
                "%lld, or lower trainer.micro_batch_size",
                slot_mb, need_mb, static_cast<long long>(need), static_cast<long long>(options.micro_batch_size),
                static_cast<long long>(options.num_views), static_cast<long long>(options.image_size),
                static_cast<long long>(options.action_horizon), static_cast<long long>(need_mb) + 1);
  return text;
}

std::unique_ptr<BatchSource> make_async_source(const std::vector<data::DataPart>& parts, const SampleOptions& options,
                                               c10::Device device, int64_t tokens_per_view, AsyncOptions async) {
  return std::make_unique<AsyncSource>(parts, options, device, tokens_per_view, async);
}

std::unique_ptr<BatchSource> make_async_source(const Dataset& dataset, const SampleOptions& options,
                                               c10::Device device, int64_t tokens_per_view, AsyncOptions async) {
  return make_async_source({data::DataPart{&dataset, options.embodiment_id}}, options, device, tokens_per_view, async);
}

int64_t default_decode_threads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int64_t cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  if (cpus <= 0) cpus = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (const char* local = std::getenv("LOCAL_WORLD_SIZE")) cpus /= std::max<int64_t>(1, std::atoll(local));
  return std::max<int64_t>(1, cpus - 2);
}

bool enabled(const config::Config& cfg) { return cfg.adfe.enable == "true"; }

std::string resolve(config::Config& cfg, c10::Device device) {
  std::string chose;
  if (cfg.adfe.enable == "auto") {
    cfg.adfe.enable = device.is_cuda() ? "true" : "false";
    chose = std::string("adfe.enable auto: ") + (device.is_cuda() ? "on (a CUDA run)" : "off (a CPU run)");
  }
  if (cfg.adfe.decode_threads == 0 && enabled(cfg)) {  // off: left at its default (no off-engine warning)
    cfg.adfe.decode_threads = default_decode_threads();
    chose += (chose.empty() ? "" : ", ") + std::string("adfe.decode_threads 0: ") +
             std::to_string(cfg.adfe.decode_threads) + " (this process's CPUs less two)";
  }
  return chose;
}

std::unique_ptr<BatchSource> make_source(const config::Config& cfg, const std::vector<data::DataPart>& parts,
                                         const SampleOptions& options, c10::Device device, int64_t tokens_per_view) {
  if (!enabled(cfg)) {
    for (const auto& key : config::non_default_keys(cfg, "adfe"))
      LF_LOG(logger("data"), warn) << key << " has no effect: adfe.enable is false (the plain source decodes on the "
                                   << "trainer thread); set adfe.enable=true or remove the key";
    return data::make_sync_source(parts, options, device, tokens_per_view);
  }
  return make_async_source(parts, options, device, tokens_per_view,
                           {cfg.adfe.prefetch_factor, cfg.adfe.decode_threads, cfg.adfe.slot_mb, cfg.adfe.io_threads});
}

Engine engine(const config::Config& cfg) {
  Engine e;
  e.name = "adfe";
  e.title = "ADFE";
  e.what = "asynchronous data flow engine";
  e.arrives_with = "the ADFE issue";
  e.built = kBuilt;
  e.enabled = kBuilt && enabled(cfg);
  const nlohmann::json settings = {{"prefetch_factor", cfg.adfe.prefetch_factor},
                                   {"decode_threads", cfg.adfe.decode_threads},
                                   {"io_threads", cfg.adfe.io_threads},
                                   {"slot_mb", cfg.adfe.slot_mb}};
  e.status = [settings] { return settings; };  // the live counters are in status's "data"
  return e;
}

}  // namespace loongforge::adfe
