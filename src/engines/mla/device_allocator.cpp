// MLA's device allocator (device_allocator.hpp): pool.hpp's logic over
// cudaMalloc'd ranges, behind libtorch's pluggable allocator. Compiled only
// with CUDA kernels (src/engines/mla/CMakeLists.txt).
#include "device_allocator.hpp"

#include <algorithm>  // std::max, std::sort
#include <chrono>     // std::chrono::steady_clock
#include <cstdlib>    // std::getenv
#include <sstream>    // std::stringstream
#include <stdexcept>  // std::invalid_argument, std::logic_error
#include <string>     // std::string

#include <c10/cuda/CUDAException.h>       // C10_CUDA_CHECK
#include <c10/cuda/CUDAGraphsC10Utils.h>  // c10::cuda::CUDAStreamCaptureModeGuard
#include <c10/cuda/CUDAGuard.h>           // c10::cuda::CUDAGuard
#include <c10/util/Exception.h>           // TORCH_CHECK_WITH, c10::OutOfMemoryError

#include "loongforge/common/log.hpp"
#include "loongforge/memory/memory.hpp"

namespace loongforge::mla {

// Note [MLA's device pools]
// -------------------------
// Three pools of pool.hpp, one per Category, each over its own cudaMalloc'd
// ranges (an allocation is placed by the calling thread's
// memory::current_lifetime(); the trainer marks the model's load and the
// optimizer's construction persistent, each part with a label by which the
// persistent bytes are counted: mla-stats, the out-of-memory message):
//  - persistent: one arena of mla.persistent_gb cudaMalloc'd at install when
//    set (it then never grows: a request past it is an explained
//    out-of-memory error), else grown as needed (below);
//  - activation: the arena of mla.global_pool_gb when set (same rule), else
//    ranges as needed;
//  - other: everything else, grown as needed.
// A pool grown as needed sits on ranges of mla.segment_mb (or the request
// rounded up to 2 MiB when larger) cudaMalloc'd as needed, or, with the
// experimental mla.virtual_memory on a device with virtual memory
// management, on one virtual range (Note [Virtual pools]).
// A CUDA graph capture (libtorch's beginAllocateToPool: trainer.cuda_graphs,
// the optimizer's graph) gets a pool of its own (kept per MempoolId, as
// PyTorch's private pools: its blocks are never handed to work outside the
// graphs that share the id) over 2 MiB-multiple chunks taken from the
// activation arena when mla.global_pool_gb is set, else from the other pool,
// so the eager steps' freed activations serve the capture without a new
// cudaMalloc. The chunks go back when libtorch has released every graph
// captured into the id (graphs may share one) and the last block is freed.
// When a capture begins (before libtorch begins the stream capture) every
// pool is fenced and its events waited for, so the capture stream may take
// any block freed so far. Frees outside graph pools that come while a capture
// is underway are deferred to its end (their events could not be recorded during a capture),
// as is polling events. cudaMalloc and event queries run in relaxed capture
// mode. Stream-ordered reuse is pool.hpp's (Note [Stream-ordered reuse] in
// pool.cpp): the events are real cudaEvents, polled at each allocation that
// misses and fenced at each step's end (memory::step_done), so at most one
// event per stream that freed something per step.
// When a pool cannot serve a request (after polling, growing and waiting for
// every outstanding event) the request goes to plain cudaMalloc with a
// warning when mla.fallback_cudamalloc is on; else c10::OutOfMemoryError with
// explain_out_of_memory()'s text.

// Note [Virtual pools]
// --------------------
// A pool over separately cudaMalloc'd ranges cannot put one block across two
// ranges, so its free memory splinters: on an H100, gr00t-n1.7-3b's full
// fine-tuning at micro-batch 64 ran out of memory in the other pool with
// 16.1 GiB free there in blocks of at most 1.12 GiB, where PyTorch's
// allocator with expandable_segments trained (scripts/bench/mla_compare.sh,
// session 56). With mla.virtual_memory (off by default, experimental: see
// below; it needs the driver's virtual memory management), each pool without an arena sits
// instead on one VirtualRange (virtual_range.hpp): an address range as large
// as the device, reserved once, whose 2 MiB granules get physical memory when
// a block over them is handed out (back()). The pool's logic is unchanged: one
// range, best fit, coalescing; so a free block is never cut by a range's end.
// When the device has no memory left to back a block, reclaim() waits for the
// device to be idle (every event, cudaDeviceSynchronize) and gives back the
// memory of every granule lying wholly inside a run of free blocks, in every
// virtual pool, and the allocation is tried again; not during a CUDA graph
// capture (nothing may be waited for then: the request fails as before).
// Graph pools' chunks are allocated blocks of their source pool, so their
// memory is never given back while a graph may replay into it. Statistics
// count a virtual pool in backed memory: reserved = backed, free = backed
// less in use, largest free = the backed granules wholly inside free runs (a
// request can take all of them once they are mapped where it lands), so
// fragmentation there is the granules' slack that free blocks share with
// allocated ones. Backing a granule counts as a cudaMalloc call
// (cuda_malloc_calls, and after step 1).
// Measured on an H100 (session 56): n16-3b full fine-tuning trained at
// micro-batch 72 as fast as expandable segments (221.3 against 220.9
// samples/s), but with 487 granules backed after step 1 (the pages given
// back at each step's peak are backed again); gr00t-n1.7-3b's full
// fine-tuning at micro-batch 64 gave a NaN loss at step 3, not understood
// yet (what session 59 ruled out: Note [Diagnosing the virtual pools]; the
// NaN needs CUDA graphs, and step 3's loss is read after step 4's capture); n16-tiny backed
// 5 granules after step 1 with no memory pressure (each granule was backed on
// its own, where cudaMalloc'd ranges leave segment_mb of slack: Note [Backing
// a segment at a time]). Hence off by default.

// Note [Backing a segment at a time]
// -----------------------------------
// Backing each block's granules alone backs a new granule whenever a later
// block reaches past the backed ones, well after step 1 (5 granules on
// n16-tiny, where cudaMalloc'd ranges leave mla.segment_mb of slack). So when
// a block needs new granules, back() backs the whole mla.segment_mb-aligned
// segments around it, as long as the device keeps at least twice their size
// free (cudaMemGetInfo: under memory pressure only the block's granules are
// backed, and nothing is taken that the next request needs). The slack lies
// under free blocks, so a reclaim gives it back like any other. mla_gpu checks
// that n16-tiny backs no page after step 1 this way (passes on an H100).

namespace {

constexpr uint64_t kChunkBytes = uint64_t{2} << 20;  // graph pool chunks and large ranges: multiples of 2 MiB
constexpr double kMb = 1024.0 * 1024.0;

uint64_t round_up(uint64_t v, uint64_t m) {
  return (v + m - 1) / m * m;
}

Category category_of(memory::Lifetime l) {
  switch (l) {
    case memory::Lifetime::kPersistent:
      return Category::kPersistent;
    case memory::Lifetime::kActivation:
      return Category::kActivation;
    case memory::Lifetime::kOther:
      return Category::kOther;
  }
  return Category::kOther;
}

std::string pool_name(Category c) {
  return std::string(category_name(c)) + " pool";
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

nlohmann::json pool_json(const PoolStats& s) {
  return {{"reserved_mb", static_cast<double>(s.reserved_bytes) / kMb},
          {"in_use_mb", static_cast<double>(s.in_use_bytes) / kMb},
          {"requested_mb", static_cast<double>(s.requested_bytes) / kMb},
          {"peak_in_use_mb", static_cast<double>(s.peak_in_use_bytes) / kMb},
          {"free_mb", static_cast<double>(s.free_bytes) / kMb},
          {"pending_mb", static_cast<double>(s.pending_bytes) / kMb},
          {"largest_free_mb", static_cast<double>(s.largest_free_bytes) / kMb},
          {"fragmentation", s.fragmentation()},
          {"ranges", s.ranges},
          {"free_blocks", s.free_blocks},
          {"allocations", s.allocations},
          {"failed_allocations", s.failed_allocations},
          {"events_recorded", s.events_recorded}};
}

}  // namespace

// Note [Diagnosing the virtual pools]
// ------------------------------------
// For the NaN of Note [Virtual pools], the environment variable
// LOONGFORGE_MLA_DEBUG (a comma-separated list; a developer's switch, not a
// config key: no run should set it) turns on:
//  - poison: every block handed out outside a capture is filled with 0xFF
//    bytes (NaN in fp32 and bf16) on its stream first, so a kernel that reads
//    memory it did not write shows up as a NaN with any pool layout;
//  - keep_pages: reclaim() gives nothing back (a request that needs it then
//    fails as out of memory), to tell giving pages back from backing them;
//  - sync: outside a capture the device is made idle (cudaDeviceSynchronize)
//    before each block is handed out, so no stream's work can still use
//    memory handed out again, and after it every allocated block must lie on
//    backed pages (check_backed). A NaN that goes away under sync is a race
//    on reused memory.
// With any item (`log` alone changes nothing else), the start of each CUDA
// graph capture is logged with the device's free memory and MLA's reserved
// bytes (a capture and its instantiation also need memory MLA does not serve).
// What session 59 found with them (docs/mla.md): gr00t-n1.7-3b's NaN at
// micro-batch 64 needs CUDA graphs and segments above a page; no page was
// given back in the failing run, and poison changes no loss of eager runs.
// Always on: after each reclaim, every allocated block of a virtual pool must
// lie on backed pages (check_backed), and the first 20 reclaims are logged
// with the step they happened in.
DeviceAllocator::DeviceAllocator(DeviceOptions options, int device) : options_(std::move(options)), device_(device) {
  if (const char* d = std::getenv("LOONGFORGE_MLA_DEBUG")) {
    std::stringstream list(d);
    for (std::string item; std::getline(list, item, ',');) {
      if (item == "poison")
        poison_ = true;
      else if (item == "keep_pages")
        keep_pages_ = true;
      else if (item == "sync")
        sync_ = true;
      else if (!item.empty() && item != "log")
        throw std::invalid_argument("LOONGFORGE_MLA_DEBUG: unknown item '" + item + "' (poison, keep_pages, sync, log)");
    }
    debug_ = true;
    LF_LOG(logger("mla"), warn) << "MLA: diagnostics on (LOONGFORGE_MLA_DEBUG=" << d
                                << "): not for training runs (Note [Diagnosing the virtual pools])";
  }
  for (size_t c = 0; c < pools_.size(); ++c)
    pools_[c] =
        std::make_unique<Pool>(PoolOptions{}, [this, c](StreamId s) { return record_event(pools_[c].get(), s); });
  fixed_[static_cast<size_t>(Category::kPersistent)] = options_.persistent_bytes > 0;
  fixed_[static_cast<size_t>(Category::kActivation)] = options_.activation_bytes > 0;
}

DeviceAllocator::~DeviceAllocator() {
  for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
  for (auto& v : virtual_) (void)v.release();  // never given back: tensors may outlive the allocator at exit
}

void DeviceAllocator::reserve_arenas() {
  std::lock_guard<std::mutex> lock(mutex_);
  c10::cuda::CUDAGuard on_device(
      static_cast<c10::DeviceIndex>(device_));  // install() may run before the trainer sets it
  auto reserve = [&](Category c, uint64_t bytes) {
    if (bytes == 0) return;
    bytes = round_up(bytes, kChunkBytes);
    void* p = cuda_malloc(bytes);
    if (p == nullptr) {
      size_t free_b = 0, total_b = 0;
      (void)cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error(std::string("MLA: cannot reserve the ") + category_name(c) + " arena of " +
                               format_bytes(bytes) + " (" +
                               (c == Category::kPersistent ? "mla.persistent_gb" : "mla.global_pool_gb") +
                               "): the device has " + format_bytes(free_b) + " free of " + format_bytes(total_b) +
                               "; lower the key or set it to 0 (grown as needed)");
    }
    pool(c).add_range(reinterpret_cast<uint64_t>(p), bytes);
  };
  reserve(Category::kPersistent, options_.persistent_bytes);
  reserve(Category::kActivation, options_.activation_bytes);
}

Category DeviceAllocator::chunk_source() const {
  return options_.activation_bytes > 0 ? Category::kActivation : Category::kOther;
}

// ---------------------------------------------------------------------------
// Allocate

void* DeviceAllocator::allocate(size_t bytes, int device, cudaStream_t stream) {
  if (bytes == 0) return nullptr;  // as the caching allocator: an empty tensor owns no memory
  TORCH_CHECK(device == device_, "MLA serves device ", device_, " of this process; asked for memory on device ", device,
              " (one rank per GPU)");
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  void* p = allocate_locked(bytes, stream);
  note_peak();
  step_alloc_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return p;
}

void* DeviceAllocator::allocate_locked(size_t bytes, cudaStream_t stream) {
  for (auto& [key, filter] : captures_) {
    if (!filter(stream)) continue;
    GraphPool& g = graphs_[key];
    const uint64_t a = allocate_in_graph(g, bytes, stream);
    if (a == 0)
      out_of_memory(Category::kActivation, fixed_[static_cast<size_t>(chunk_source())],
                    "CUDA graph pool (its chunks come from the " + pool_name(chunk_source()) + ")", g.pool->stats(),
                    bytes);
    Where w;
    w.kind = Where::kGraph;
    w.graph = key;
    where_[a] = w;
    return reinterpret_cast<void*>(a);
  }
  const Category c = category_of(memory::current_lifetime());
  if (sync_ && !capturing()) C10_CUDA_CHECK(cudaDeviceSynchronize());  // Note [Diagnosing the virtual pools]
  if (const uint64_t a = allocate_in(c, bytes, stream)) {
    if (sync_ && !capturing()) check_backed("handing out a block (LOONGFORGE_MLA_DEBUG=sync)");
    if (poison_ && !capturing()) {  // Note [Diagnosing the virtual pools]
      c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
      C10_CUDA_CHECK(cudaMemsetAsync(reinterpret_cast<void*>(a), 0xFF, bytes, stream));
    }
    Where w;
    w.category = static_cast<uint8_t>(c);
    if (c == Category::kPersistent) {
      w.label = label_index(memory::current_label());
      w.bytes = pool(c).find(a)->bytes;
      label_bytes_[w.label] += w.bytes;
    }
    where_[a] = w;
    return reinterpret_cast<void*>(a);
  }
  if (options_.fallback_cudamalloc) {
    if (void* p = cuda_malloc(bytes)) {
      if (fallback_allocations_++ == 0)
        LF_LOG(logger("mla"), warn) << "MLA: the " << pool_name(c) << " could not serve " << format_bytes(bytes)
                                    << ": served by plain cudaMalloc (mla.fallback_cudamalloc=true); later ones are "
                                       "counted in `loongforge mla-stats` (fallback_allocations)";
      fallback_bytes_ += bytes;
      Where w;
      w.kind = Where::kFallback;
      w.bytes = bytes;
      where_[reinterpret_cast<uint64_t>(p)] = w;
      return p;
    }
  }
  out_of_memory(c, fixed_[static_cast<size_t>(c)], pool_name(c), physical_stats(c), bytes);
}

uint64_t DeviceAllocator::allocate_in(Category c, size_t bytes, cudaStream_t stream) {
  Pool& p = pool(c);
  const auto s = reinterpret_cast<StreamId>(stream);
  auto take = [&]() -> uint64_t {  // a block, backed by memory (Note [Virtual pools])
    auto a = p.allocate(bytes, c, s);
    if (!a) return 0;
    if (back(c, a->addr, a->bytes)) return a->addr;
    p.free(a->addr);
    return 0;
  };
  if (const uint64_t a = take()) return a;
  if (!capturing()) {
    poll_events();
    if (const uint64_t a = take()) return a;
  }
  if (!fixed_[static_cast<size_t>(c)] && grow(c, p.class_bytes(bytes))) {
    if (const uint64_t a = take()) return a;
  }
  if (!capturing()) {  // every block freed on another stream, once its work is done
    p.fence_all();
    synchronize_events();
    if (const uint64_t a = take()) return a;
    if (reclaim())  // the memory of the virtual pools' free blocks, for this one
      if (const uint64_t a = take()) return a;
  }
  return 0;
}

uint64_t DeviceAllocator::allocate_in_graph(GraphPool& g, size_t bytes, cudaStream_t stream) {
  if (!g.pool)
    g.pool = std::make_unique<Pool>(PoolOptions{},
                                    [this, raw = &g](StreamId s) { return record_event(raw->pool.get(), s); });
  const auto s = reinterpret_cast<StreamId>(stream);
  if (auto a = g.pool->allocate(bytes, Category::kActivation, s)) return a->addr;
  // The chunk is a whole block of the source pool (its size class), so the
  // graph pool owns every byte the source counts as in use for it.
  const uint64_t chunk = pool(chunk_source()).class_bytes(round_up(g.pool->class_bytes(bytes), kChunkBytes));
  const uint64_t base = allocate_in(chunk_source(), chunk, stream);
  if (base == 0) return 0;
  g.chunks.emplace_back(base, chunk);
  graph_chunk_bytes_ += chunk;
  g.pool->add_range(base, chunk);
  auto a = g.pool->allocate(bytes, Category::kActivation, s);
  return a ? a->addr : 0;
}

bool DeviceAllocator::grow(Category c, uint64_t at_least) {
  const size_t ci = static_cast<size_t>(c);
  if (options_.virtual_memory && virtual_supported_ < 0) {
    virtual_supported_ = VirtualRange::supported(device_) ? 1 : 0;
    if (!virtual_supported_)
      LF_LOG(logger("mla"), warn) << "MLA: device " << device_
                                  << " has no virtual memory management: its pools grow by cudaMalloc'd ranges "
                                     "(mla.segment_mb), as with mla.virtual_memory=false";
  }
  if (options_.virtual_memory && virtual_supported_ == 1) {
    if (virtual_[ci]) return false;  // the range is as large as the device: nothing to add
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    size_t free_b = 0, total_b = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    virtual_[ci] = std::make_unique<VirtualRange>(device_, total_b);
    pool(c).add_range(virtual_[ci]->base(), virtual_[ci]->bytes());
    return true;
  }
  const uint64_t bytes = std::max(options_.segment_bytes, round_up(at_least, kChunkBytes));
  void* p = cuda_malloc(bytes);
  if (p == nullptr) return false;
  // cudaMalloc aligns to at least 256 bytes; the pool wants 512.
  const uint64_t base = round_up(reinterpret_cast<uint64_t>(p), pool(c).options().alignment_bytes);
  const uint64_t usable = (bytes - (base - reinterpret_cast<uint64_t>(p))) / pool(c).options().alignment_bytes *
                          pool(c).options().alignment_bytes;
  pool(c).add_range(base, usable);
  return true;
}

bool DeviceAllocator::back(Category c, uint64_t addr, uint64_t bytes) {
  VirtualRange* v = virtual_[static_cast<size_t>(c)].get();
  if (v == nullptr || addr < v->base() || addr >= v->base() + v->bytes()) return true;
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  const uint64_t before = v->map_calls();
  bool ok = v->map(addr, bytes);
  if (ok && v->map_calls() != before) {
    // Note [Backing a segment at a time]: the rest of the block's mla.segment_mb-aligned segments too, while
    // the device keeps twice that much free.
    const uint64_t unit = std::max<uint64_t>(options_.segment_bytes, v->granule());
    const uint64_t lo = std::max(v->base(), addr / unit * unit);
    const uint64_t hi = std::min(v->base() + v->bytes(), round_up(addr + bytes, unit));
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
      (void)cudaGetLastError();
    else if (free_b >= 2 * (hi - lo))
      (void)v->map(lo, hi - lo);  // false: the device filled meanwhile; what it backed stays, under free blocks
  }
  const uint64_t made = v->map_calls() - before;
  cuda_malloc_calls_ += made;
  if (steps_done_ >= 1) cuda_malloc_calls_after_step1_ += made;
  cuda_malloc_bytes_ += made * v->granule();
  return ok;
}

std::vector<std::pair<uint64_t, uint64_t>> DeviceAllocator::free_runs(Category c) const {
  std::vector<std::pair<uint64_t, uint64_t>> runs;
  for (const BlockInfo& b : pools_[static_cast<size_t>(c)]->blocks()) {
    if (b.state == BlockInfo::State::kAllocated) continue;
    if (!runs.empty() && runs.back().first + runs.back().second == b.addr)
      runs.back().second += b.bytes;
    else
      runs.emplace_back(b.addr, b.bytes);
  }
  return runs;
}

bool DeviceAllocator::reclaim() {
  if (keep_pages_) return false;  // Note [Diagnosing the virtual pools]
  bool any = false;
  for (const auto& v : virtual_) any = any || (v && v->mapped_bytes() > 0);
  if (!any) return false;
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  for (auto& p : pools_) p->fence_all();
  synchronize_events();
  C10_CUDA_CHECK(cudaDeviceSynchronize());  // no work in flight may touch a granule given back
  uint64_t bytes = 0;
  for (size_t c = 0; c < virtual_.size(); ++c)
    if (virtual_[c])
      for (const auto& [addr, len] : free_runs(static_cast<Category>(c))) bytes += virtual_[c]->unmap_inside(addr, len);
  if (bytes == 0) return false;
  ++reclaims_, reclaimed_bytes_ += bytes;
  check_backed("after giving pages back");
  // Note [Diagnosing the virtual pools]: the first ones where a run's log shows them, the rest counted
  // (mla-stats: reclaims) and at debug level.
  constexpr uint64_t kReclaimsLogged = 20;
  const std::string what = "MLA: gave back " + format_bytes(bytes) + " under free blocks (reclaim " +
                           std::to_string(reclaims_) + ", during step " + std::to_string(steps_done_ + 1) +
                           (reclaims_ == kReclaimsLogged ? "; later ones at debug level" : "") + ")";
  if (reclaims_ <= kReclaimsLogged)
    LF_LOG(logger("mla"), info) << what;
  else
    LF_LOG(logger("mla"), debug) << what;
  return true;
}

void DeviceAllocator::check_backed(const char* when) const {
  for (size_t c = 0; c < virtual_.size(); ++c) {
    const VirtualRange* v = virtual_[c].get();
    if (v == nullptr) continue;
    for (const BlockInfo& b : pools_[c]->blocks()) {
      if (b.state != BlockInfo::State::kAllocated) continue;
      if (const uint64_t n = v->unbacked_touched(b.addr, b.bytes))
        throw std::logic_error("MLA: " + std::string(when) + ", an allocated block of the " +
                               pool_name(static_cast<Category>(c)) + " at offset " +
                               std::to_string(b.addr - v->base()) + " (" + format_bytes(b.bytes) + ") lies on " +
                               std::to_string(n) + " page(s) without memory: a bug of MLA's virtual pools");
    }
  }
}

PoolStats DeviceAllocator::physical_stats(Category c) {
  PoolStats s = pool(c).stats();
  const VirtualRange* v = virtual_[static_cast<size_t>(c)].get();
  if (v == nullptr) return s;
  s.reserved_bytes = v->mapped_bytes() + (s.reserved_bytes - v->bytes());  // backed, plus any other range
  s.free_bytes = s.reserved_bytes > s.in_use_bytes ? s.reserved_bytes - s.in_use_bytes : 0;
  s.pending_bytes = std::min(s.pending_bytes, s.free_bytes);
  uint64_t whole = 0;
  for (const auto& [addr, len] : free_runs(c)) whole += v->mapped_inside(addr, len);
  s.largest_free_bytes = std::min(whole, s.free_bytes);
  return s;
}

void* DeviceAllocator::cuda_malloc(uint64_t bytes) {
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();  // not sticky: clear it
    return nullptr;
  }
  C10_CUDA_CHECK(e);
  ++cuda_malloc_calls_;
  if (steps_done_ >= 1) ++cuda_malloc_calls_after_step1_;
  cuda_malloc_bytes_ += bytes;
  return p;
}

void DeviceAllocator::out_of_memory(Category c, bool fixed, const std::string& name, const PoolStats& s, size_t bytes) {
  OomReport r = options_.keys;
  r.request_bytes = bytes;
  r.category = c;
  r.pool_name = name;
  r.pool = s;
  r.pool_fixed = fixed;
  r.in_use_by_category = in_use_by_category();
  r.persistent_by_label = persistent_by_label();
  size_t free_b = 0, total_b = 0;
  {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
      r.device_free_bytes = free_b, r.device_total_bytes = total_b;
    else
      (void)cudaGetLastError();
  }
  C10_THROW_ERROR(OutOfMemoryError, explain_out_of_memory(r));
}

// ---------------------------------------------------------------------------
// Free

void DeviceAllocator::release(void* ptr, cudaStream_t stream) {
  (void)stream;  // the block's own stream is the one it was allocated on (pool.hpp)
  std::lock_guard<std::mutex> lock(mutex_);
  const auto t0 = std::chrono::steady_clock::now();
  auto it = where_.find(reinterpret_cast<uint64_t>(ptr));
  TORCH_CHECK(it != where_.end(), "MLA: free of ", ptr, ", which MLA did not allocate");
  if (capturing() && it->second.kind != Where::kGraph)
    deferred_frees_.push_back(ptr);
  else
    release_locked(ptr);
  step_alloc_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

void DeviceAllocator::release_locked(void* ptr) {
  const auto addr = reinterpret_cast<uint64_t>(ptr);
  auto it = where_.find(addr);
  const Where w = it->second;
  where_.erase(it);
  switch (w.kind) {
    case Where::kCategory:
      pools_[w.category]->free(addr);
      if (w.category == static_cast<uint8_t>(Category::kPersistent)) label_bytes_[w.label] -= w.bytes;
      break;
    case Where::kGraph: {
      GraphPool& g = graphs_.at(w.graph);
      g.pool->free(addr);
      if (g.released && g.pool->stats().in_use_bytes == 0) return_graph_chunks(w.graph);
      break;
    }
    case Where::kFallback:
      C10_CUDA_CHECK(cudaFree(ptr));  // synchronises the device: no stream may still use it
      fallback_bytes_ -= w.bytes;
      break;
  }
}

void DeviceAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = where_.find(reinterpret_cast<uint64_t>(ptr));
  if (it == where_.end() || it->second.kind != Where::kCategory) return;  // graph pools keep their blocks
  pools_[it->second.category]->record_use(it->first, reinterpret_cast<StreamId>(stream));
}

// ---------------------------------------------------------------------------
// CUDA graph pools

void DeviceAllocator::begin_allocate_to_pool(MempoolKey key, std::function<bool(cudaStream_t)> filter) {
  std::lock_guard<std::mutex> lock(mutex_);
  // libtorch calls this before it begins the stream capture (and the trainer
  // captures with its streams idle): every block freed so far is released to
  // every stream now, so the capture stream's chunks come from the eager
  // steps' freed memory rather than a new cudaMalloc. Not while another
  // capture is underway (no event may be waited for then).
  if (!capturing()) {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    for (auto& p : pools_) p->fence_all();
    synchronize_events();
  }
  if (debug_) {  // Note [Diagnosing the virtual pools]
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    LF_LOG(logger("mla"), warn) << "MLA: a CUDA graph capture begins (step " << steps_done_ + 1 << "): the device has "
                                << format_bytes(free_b) << " free of " << format_bytes(total_b) << ", MLA holds "
                                << format_bytes(reserved_bytes());
  }
  GraphPool& g = graphs_[key];
  g.released = false;
  ++g.captures;
  captures_.emplace_back(key, std::move(filter));
}

void DeviceAllocator::end_allocate_to_pool(MempoolKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = captures_.begin(); it != captures_.end(); ++it)
    if (it->first == key) {
      captures_.erase(it);
      break;
    }
  if (capturing()) return;
  std::vector<void*> deferred;
  deferred.swap(deferred_frees_);
  for (void* p : deferred) release_locked(p);
}

void DeviceAllocator::release_pool(MempoolKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) return;
  // Graphs sharing an id replay into the same memory: it goes back only
  // when the last of them is released (as PyTorch's private pools' use count).
  if (--it->second.captures > 0) return;
  it->second.released = true;
  if (!it->second.pool || it->second.pool->stats().in_use_bytes == 0) return_graph_chunks(key);
}

void DeviceAllocator::return_graph_chunks(MempoolKey key) {
  GraphPool& g = graphs_.at(key);
  for (const auto& [addr, bytes] : g.chunks) {
    pool(chunk_source()).free(addr);
    graph_chunk_bytes_ -= bytes;
  }
  graphs_.erase(key);
}

// ---------------------------------------------------------------------------
// Events

EventId DeviceAllocator::record_event(Pool* owner, StreamId stream) {
  cudaEvent_t e = nullptr;
  if (!spare_events_.empty()) {
    e = spare_events_.back();
    spare_events_.pop_back();
  } else {
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  C10_CUDA_CHECK(cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream)));
  const EventId id = next_event_++;
  events_[id] = Event{e, owner};
  return id;
}

void DeviceAllocator::poll_events() {
  if (events_.empty()) return;
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  std::vector<EventId> done;
  for (const auto& [id, e] : events_) {
    const cudaError_t q = cudaEventQuery(e.event);
    if (q == cudaSuccess)
      done.push_back(id);
    else if (q == cudaErrorNotReady)
      (void)cudaGetLastError();
    else
      C10_CUDA_CHECK(q);
  }
  std::sort(done.begin(), done.end());
  for (EventId id : done) {
    const Event e = events_.at(id);
    events_.erase(id);
    spare_events_.push_back(e.event);
    e.pool->complete(id);
  }
}

void DeviceAllocator::synchronize_events() {
  std::vector<EventId> ids;
  for (const auto& [id, e] : events_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (EventId id : ids) {
    const Event e = events_.at(id);
    C10_CUDA_CHECK(cudaEventSynchronize(e.event));
    events_.erase(id);
    spare_events_.push_back(e.event);
    e.pool->complete(id);
  }
}

// ---------------------------------------------------------------------------
// Steps and statistics

uint16_t DeviceAllocator::label_index(const char* label) {
  const std::string name = label == nullptr || *label == '\0' ? "unlabelled" : label;
  for (size_t i = 0; i < labels_.size(); ++i)
    if (labels_[i] == name) return static_cast<uint16_t>(i);
  TORCH_CHECK(labels_.size() < 65535, "MLA: too many persistent labels");
  labels_.push_back(name);
  label_bytes_.push_back(0);
  return static_cast<uint16_t>(labels_.size() - 1);
}

std::vector<std::pair<std::string, uint64_t>> DeviceAllocator::persistent_by_label() const {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (size_t i = 0; i < labels_.size(); ++i)
    if (label_bytes_[i] != 0) out.emplace_back(labels_[i], label_bytes_[i]);
  return out;
}

void DeviceAllocator::step_done(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  steps_done_ = step;
  alloc_ms_per_step_.push_back(step_alloc_ms_);
  step_alloc_ms_ = 0;
  if (capturing()) return;
  for (auto& p : pools_) p->fence_all();
  poll_events();
}

std::array<uint64_t, kCategoryCount> DeviceAllocator::in_use_by_category() {
  std::array<uint64_t, kCategoryCount> b{};
  for (int c = 0; c < kCategoryCount; ++c)
    b[static_cast<size_t>(c)] = pools_[static_cast<size_t>(c)]->stats().in_use_bytes;
  b[static_cast<size_t>(chunk_source())] -= graph_chunk_bytes_;  // the graph pools' chunks are counted below
  for (const auto& [key, g] : graphs_)
    if (g.pool) b[static_cast<size_t>(Category::kActivation)] += g.pool->stats().in_use_bytes;
  b[static_cast<size_t>(Category::kOther)] += fallback_bytes_;
  return b;
}

uint64_t DeviceAllocator::reserved_bytes() {
  uint64_t res = fallback_bytes_;
  for (int c = 0; c < kCategoryCount; ++c) res += physical_stats(static_cast<Category>(c)).reserved_bytes;
  return res;
}

void DeviceAllocator::note_peak() {
  const auto b = in_use_by_category();
  peak_in_use_ = std::max(peak_in_use_, b[0] + b[1] + b[2]);
}

void DeviceAllocator::totals_mb(double& in_use, double& reserved, double& peak) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto b = in_use_by_category();
  in_use = static_cast<double>(b[0] + b[1] + b[2]) / kMb;
  reserved = static_cast<double>(reserved_bytes()) / kMb;
  peak = static_cast<double>(peak_in_use_) / kMb;
}

nlohmann::json DeviceAllocator::stats_json() {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json j;
  j["allocator"] = "MLA";
  uint64_t reserved = fallback_bytes_, free_bytes = 0, largest = 0;
  nlohmann::json pools;
  for (int c = 0; c < kCategoryCount; ++c) {
    const PoolStats s = physical_stats(static_cast<Category>(c));
    nlohmann::json pj = pool_json(s);
    pj["fixed_arena"] = fixed_[static_cast<size_t>(c)];
    if (const VirtualRange* v = virtual_[static_cast<size_t>(c)].get())
      pj["virtual"] = {{"address_range_mb", static_cast<double>(v->bytes()) / kMb},
                       {"backed_mb", static_cast<double>(v->mapped_bytes()) / kMb},
                       {"given_back_mb", static_cast<double>(v->unmapped_bytes()) / kMb},
                       {"granule_mb", static_cast<double>(v->granule()) / kMb}};
    pools[category_name(static_cast<Category>(c))] = pj;
    reserved += s.reserved_bytes;
    free_bytes += s.free_bytes;
    largest = std::max(largest, s.largest_free_bytes);
  }
  j["pools"] = pools;
  uint64_t graph_in_use = 0;
  for (const auto& [key, g] : graphs_)
    if (g.pool) graph_in_use += g.pool->stats().in_use_bytes;
  j["graph_pools"] = {{"count", graphs_.size()},
                      {"chunks_mb", static_cast<double>(graph_chunk_bytes_) / kMb},
                      {"in_use_mb", static_cast<double>(graph_in_use) / kMb},
                      {"chunks_from", pool_name(chunk_source())}};
  const auto b = in_use_by_category();
  j["in_use_mb"] = {{"persistent", static_cast<double>(b[0]) / kMb},
                    {"activation", static_cast<double>(b[1]) / kMb},
                    {"other", static_cast<double>(b[2]) / kMb}};
  nlohmann::json by_label = nlohmann::json::object();
  for (const auto& [label, bytes] : persistent_by_label()) by_label[label] = static_cast<double>(bytes) / kMb;
  j["persistent_mb_by_label"] = by_label;
  j["allocated_mb"] = static_cast<double>(b[0] + b[1] + b[2]) / kMb;
  j["reserved_mb"] = static_cast<double>(reserved) / kMb;
  j["peak_allocated_mb"] = static_cast<double>(peak_in_use_) / kMb;
  j["fragmentation"] = free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / static_cast<double>(free_bytes);
  j["cuda_malloc_calls"] = cuda_malloc_calls_;
  j["cuda_malloc_calls_after_step_1"] = cuda_malloc_calls_after_step1_;
  j["cuda_malloc_mb"] = static_cast<double>(cuda_malloc_bytes_) / kMb;
  j["virtual_memory"] = virtual_supported_ == 1;
  j["reclaims"] = reclaims_;
  j["reclaimed_mb"] = static_cast<double>(reclaimed_bytes_) / kMb;
  j["fallback_allocations"] = fallback_allocations_;
  j["fallback_in_use_mb"] = static_cast<double>(fallback_bytes_) / kMb;
  j["events_outstanding"] = events_.size();
  j["steps"] = steps_done_;
  j["alloc_ms_per_step"] = {{"p50", percentile(alloc_ms_per_step_, 0.5)},
                            {"p99", percentile(alloc_ms_per_step_, 0.99)},
                            {"last", alloc_ms_per_step_.empty() ? 0.0 : alloc_ms_per_step_.back()}};
  return j;
}

std::vector<std::pair<std::string, double>> DeviceAllocator::scalars() {
  const nlohmann::json j = stats_json();
  return {{"mla_persistent_mb", j["in_use_mb"]["persistent"].get<double>()},
          {"mla_activation_mb", j["in_use_mb"]["activation"].get<double>()},
          {"mla_other_mb", j["in_use_mb"]["other"].get<double>()},
          {"mla_reserved_mb", j["reserved_mb"].get<double>()},
          {"mla_fragmentation", j["fragmentation"].get<double>()},
          {"mla_cuda_malloc_after_step_1", j["cuda_malloc_calls_after_step_1"].get<double>()},
          {"mla_alloc_ms", j["alloc_ms_per_step"]["last"].get<double>()}};
}

}  // namespace loongforge::mla
