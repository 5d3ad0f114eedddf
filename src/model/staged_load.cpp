// Note [Staged model load]
// torch::jit::load onto a GPU reads every tensor record of the file into
// fresh host memory from the CPU allocator, then copies it to the device
// from that pageable memory and drops it. Fresh memory is faulted in (and
// zeroed) by the kernel page by page on first touch: in `perf` of a 3.2 GB
// file's load on the CPU machine (scripts/dev/model_load_perf.sh) the page
// faults lead the profile (exc_page_fault 14%, with their locks and memory
// charging about 13% more), ahead of the copy itself (10%). On an H100
// host, gr00t-n1.7-3b's 12.58 GB file took 6.8 s to load onto the GPU, of
// which reading its bytes into fresh memory alone took 5.8 s and the
// pageable copy to the GPU 1.8 s, where a pinned copy of the same bytes takes
// 0.24 s (scripts/dev/gpu/model_load_probe.py, docs/benchmarks.md).
//
// So while a model loads onto a GPU, the CPU allocator is replaced by one
// that hands each big record one pinned slab, reused record after record:
// its pages are touched once, and each copy to the device reads pinned
// memory. The records, the code and the pickles that do not fit (or arrive
// while the slab is taken) go to the previous allocator. The replacement is
// process-wide for the load's duration (c10::SetCPUAllocator); any thread's
// CPU allocation may be served from the slab while it is free, which is
// safe: each allocation carries its own deleter, and the allocator object
// itself lives for the process (a storage that remembers its allocator for a
// resize finds it, passing every request on once the load is over).
#include "loongforge/model/staged_load.hpp"

#include <algorithm>  // std::max, std::min
#include <chrono>     // std::chrono::steady_clock
#include <cstring>    // std::memcpy
#include <mutex>      // std::mutex, std::lock_guard
#include <string>     // std::string

#include <ATen/core/CachingHostAllocator.h>  // at::getHostAllocator
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>              // c10::GetCPUAllocator, c10::SetCPUAllocator
#include <caffe2/serialize/inline_container.h>  // caffe2::serialize::PyTorchStreamReader

#include "loongforge/common/log.hpp"

namespace loongforge::model {

namespace {

constexpr size_t kMinStaged = size_t{1} << 20;
constexpr size_t kMaxSlab = size_t{2} << 30;

}  // namespace

struct StagedLoad::State {
  std::mutex mu;
  c10::DataPtr memory;  // the pinned slab
  size_t capacity = 0;
  bool in_use = false;
  Counts counts;
};

namespace {

// One per process (see the note): serves from the current load's slab, if any.
class SlabAllocator final : public c10::Allocator {
 public:
  void install(std::shared_ptr<StagedLoad::State> slab) {
    std::lock_guard<std::mutex> lock(mu_);
    if (c10::Allocator* current = c10::GetCPUAllocator(); current != this) previous_ = current;  // not itself
    slab_ = std::move(slab);  // a second load at once takes the allocator over; the first's leases stay valid
    c10::SetCPUAllocator(this);
  }
  void remove() {
    std::lock_guard<std::mutex> lock(mu_);
    if (c10::GetCPUAllocator() == this) c10::SetCPUAllocator(previous_);
    slab_.reset();
  }

  c10::DataPtr allocate(size_t n) override {
    std::shared_ptr<StagedLoad::State> slab;
    c10::Allocator* previous;
    {
      std::lock_guard<std::mutex> lock(mu_);
      slab = slab_;
      previous = previous_;
    }
    if (slab && n >= kMinStaged && n <= slab->capacity) {
      std::lock_guard<std::mutex> lock(slab->mu);
      if (!slab->in_use) {
        slab->in_use = true;
        ++slab->counts.staged;
        return {slab->memory.get(), new Lease{slab}, &Lease::release, c10::Device(c10::kCPU)};
      }
    }
    if (slab) {
      std::lock_guard<std::mutex> lock(slab->mu);
      ++slab->counts.passed;
    }
    return (previous ? previous : c10::GetDefaultCPUAllocator())->allocate(n);
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  struct Lease {  // an allocation served from the slab: keeps it alive, frees it for the next record
    std::shared_ptr<StagedLoad::State> slab;
    static void release(void* ctx) {
      auto* lease = static_cast<Lease*>(ctx);
      {
        std::lock_guard<std::mutex> lock(lease->slab->mu);
        lease->slab->in_use = false;
      }
      delete lease;
    }
  };

  std::mutex mu_;
  c10::Allocator* previous_ = nullptr;
  std::shared_ptr<StagedLoad::State> slab_;
};

SlabAllocator& slab_allocator() {
  static auto* a = new SlabAllocator();  // never destroyed (see the note)
  return *a;
}

// The file's largest record (0 when the file does not open as an archive: torch::jit::load will say why).
size_t largest_record(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    size_t largest = 0;
    for (const std::string& name : reader.getAllRecords()) largest = std::max(largest, reader.getRecordSize(name));
    return largest;
  } catch (const c10::Error&) {
    return 0;
  }
}

}  // namespace

StagedLoad::StagedLoad(const std::string& path) {
  const size_t capacity = std::min(largest_record(path), kMaxSlab);
  if (capacity < kMinStaged) return;
  auto state = std::make_shared<State>();
  const auto t0 = std::chrono::steady_clock::now();
  try {
    state->memory = at::getHostAllocator(c10::kCUDA)->allocate(capacity);
  } catch (const c10::Error& e) {
    std::string why = e.what_without_backtrace();
    why = why.substr(0, why.find('\n'));
    LF_LOG(logger("model"), warn) << "model load: no pinned staging buffer of " << (capacity >> 20) << " MiB ("
                                  << why << "); loading without it";
    return;
  }
  state->capacity = capacity;
  state->counts.slab_bytes = static_cast<int64_t>(capacity);
  state->counts.slab_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state_ = std::move(state);
  slab_allocator().install(state_);
}

StagedLoad::~StagedLoad() {
  if (!state_) return;
  slab_allocator().remove();
  bool held;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    held = state_->in_use;
  }
  // The slab's memory goes with the last reference to the state (a lease may still hold it); the pinned
  // memory returns to the system once the host allocator's cache is emptied.
  state_.reset();
  if (!held) at::getHostAllocator(c10::kCUDA)->empty_cache();
}

StagedLoad::Counts StagedLoad::counts() const {
  if (!state_) return {};
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->counts;
}

}  // namespace loongforge::model
