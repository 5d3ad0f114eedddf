// loongforge/engines/mla/pool.hpp — MLA's pool logic as host code over an
// abstract address range: no CUDA, no libtorch. The device allocator
// (device_allocator.hpp) puts cudaMalloc'd ranges under it; the property test
// (test/engines/mla/test_mla_pool.cpp) drives it with millions of random
// operations against a brute-force model.
//
// Contract:
//  - Addresses are plain integers. add_range() gives the pool [base, base +
//    bytes); both must be multiples of the alignment. Blocks never span two
//    ranges (two cudaMalloc'd ranges are not one allocation even when their
//    addresses touch), so ranges never merge.
//  - allocate() rounds a request up to its size class (class_bytes()) and
//    takes the best fit: the smallest free block usable on the request's
//    stream (lowest address on ties), split when larger. Every address and
//    size it hands out is a multiple of the alignment. It returns nullopt when
//    no usable block is large enough; it never grows the pool itself.
//  - free() returns a block; free neighbours in the same range coalesce at
//    once where their stream rules agree (Note [Stream-ordered reuse]), so
//    once every block is free and every event has completed, a fence_all()
//    whose events complete (blocks that waited for other streams are then
//    their own stream's) leaves each range one free block again.
//  - Stream-ordered safety (Note [Stream-ordered reuse]): a block freed on
//    stream S is handed to S again at once (S's order makes that safe) but to
//    another stream only after an event recorded on S after the free has
//    completed; a block also used on other streams (record_use) is reusable
//    by nobody until an event recorded on each of them after the free has
//    completed. Events come from the EventRecorder the pool was built with;
//    the caller reports each one's completion with complete(). Events on one
//    stream complete in the order they were recorded, so complete(E) also
//    completes the earlier events of E's stream.
//  - stats() is exact and O(streams): bytes in use by category, peak,
//    free and pending bytes, the largest free block, fragmentation.
//  - Single-threaded: the caller serialises calls (the device allocator holds
//    a mutex). Misuse (freeing an address that is not an allocated block,
//    a misaligned range, overlapping ranges) throws std::invalid_argument.
//
// Example:
//   mla::Pool pool(mla::PoolOptions{}, [&](mla::StreamId s) { return record_on(s); });
//   pool.add_range(base, 1 << 30);
//   auto a = pool.allocate(1000, mla::Category::kActivation, stream);   // a->addr, a->bytes (1024)
//   pool.free(a->addr);
//   pool.fence_all();                      // events on the streams owning free blocks
//   pool.complete(event);                  // when the caller sees it done
#pragma once

#include <array>          // std::array
#include <cstdint>        // uint64_t
#include <deque>          // std::deque
#include <functional>     // std::function
#include <map>            // std::map
#include <optional>       // std::optional
#include <set>            // std::set
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair
#include <vector>         // std::vector

namespace loongforge::mla {

// What an allocation lives for (issue #47's lifetimes): the whole run
// (weights, their bf16 copies, optimizer state, gradient buffers), one step's
// forward and backward, or anything else.
enum class Category : uint8_t { kPersistent = 0, kActivation = 1, kOther = 2 };
constexpr int kCategoryCount = 3;
const char* category_name(Category c);  // "persistent", "activation", "other"

using StreamId = uint64_t;  // an opaque stream (a cudaStream_t's bits on the device)
using EventId = uint64_t;   // an opaque event handed out by the EventRecorder

// Records an event on `stream` now and names it; the pool's caller later
// reports it done with Pool::complete().
using EventRecorder = std::function<EventId(StreamId stream)>;

struct PoolOptions {
  uint64_t alignment_bytes = 512;  // every address and block size is a multiple (a power of two)
  // Size classes: a request up to class_linear_bytes is rounded up to the
  // alignment; a larger one up to a multiple of 2^floor(log2(bytes)) /
  // class_steps_per_octave (at most 1/class_steps_per_octave of waste), so
  // blocks freed by one step's tensors fit the next step's equal requests
  // without leaving slivers.
  uint64_t class_linear_bytes = uint64_t{1} << 20;
  uint64_t class_steps_per_octave = 32;
};

struct Allocation {
  uint64_t addr = 0;
  uint64_t bytes = 0;  // the block's size: the request's size class
};

struct PoolStats {
  uint64_t reserved_bytes = 0;   // sum of the ranges
  uint64_t in_use_bytes = 0;     // allocated blocks (size classes)
  uint64_t requested_bytes = 0;  // what the allocated blocks were asked for
  std::array<uint64_t, kCategoryCount> in_use_by_category{};
  std::array<uint64_t, kCategoryCount> peak_by_category{};
  uint64_t peak_in_use_bytes = 0;
  uint64_t free_bytes = 0;     // free blocks some stream may take now
  uint64_t pending_bytes = 0;  // freed blocks waiting for other streams' events
  uint64_t largest_free_bytes = 0;
  uint64_t free_blocks = 0;
  uint64_t ranges = 0;
  uint64_t allocations = 0;         // successful allocate() calls
  uint64_t failed_allocations = 0;  // allocate() calls that returned nullopt
  uint64_t frees = 0;
  uint64_t splits = 0;
  uint64_t merges = 0;
  uint64_t events_recorded = 0;
  // 1 - largest free block / free bytes (0 when nothing is free).
  double fragmentation() const;
};

// One block as the pool sees it (blocks(): the test's brute-force check).
struct BlockInfo {
  enum class State : uint8_t { kAllocated, kFree, kPending };
  uint64_t addr = 0;
  uint64_t bytes = 0;
  uint32_t range = 0;
  State state = State::kFree;
  bool owned = false;   // kFree: reusable only on `stream` until a fence on it completes
  StreamId stream = 0;  // kAllocated: its stream; kFree and owned: the owner; kPending: where it was allocated
  Category category = Category::kOther;  // kAllocated
  uint64_t requested = 0;                // kAllocated
};

class Pool {
 public:
  Pool(PoolOptions options, EventRecorder record_event);

  // Adds [base, base + bytes) as one free block usable by every stream.
  void add_range(uint64_t base, uint64_t bytes);

  // The block size a request of `bytes` gets (0 counts as 1).
  uint64_t class_bytes(uint64_t bytes) const;

  std::optional<Allocation> allocate(uint64_t bytes, Category category, StreamId stream);
  // Returns the block at `addr` (throws std::invalid_argument when `addr` is
  // not an allocated block).
  void free(uint64_t addr);
  // The block at `addr` is also used by work on `stream` (PyTorch's
  // recordStream): its free waits for an event on `stream`.
  void record_use(uint64_t addr, StreamId stream);

  // Records an event on `stream` covering the frees made on it so far, when
  // some free block is owned by it and not yet covered; returns it.
  std::optional<EventId> fence(StreamId stream);
  // fence() on every stream owning free blocks; the events recorded.
  std::vector<EventId> fence_all();
  // Reports `event` (and the earlier events of its stream) complete. An
  // event the pool does not wait for (any more) is ignored.
  void complete(EventId event);
  // Events recorded by the pool and not yet reported complete, oldest first per stream.
  std::vector<EventId> outstanding_events() const;

  // The allocated block at `addr`, if any.
  std::optional<BlockInfo> find(uint64_t addr) const;
  PoolStats stats() const;
  std::vector<BlockInfo> blocks() const;  // address order
  const PoolOptions& options() const { return options_; }

 private:
  struct Block {
    uint64_t bytes = 0;
    uint32_t range = 0;
    BlockInfo::State state = BlockInfo::State::kFree;
    bool owned = false;
    StreamId stream = 0;
    Category category = Category::kOther;
    uint64_t requested = 0;
    uint64_t free_seq = 0;        // kFree and owned: sequence number of its latest free
    uint32_t pending_events = 0;  // kPending: events still to complete
    std::vector<StreamId> uses;   // kAllocated: other streams it was used on
  };
  using Blocks = std::map<uint64_t, Block>;                 // by address
  using FreeSet = std::set<std::pair<uint64_t, uint64_t>>;  // (bytes, addr): best fit = lower_bound

  struct Event {
    StreamId stream = 0;
    uint64_t fence_seq = 0;  // a fence: frees on `stream` up to this sequence number
    bool fence = false;
    std::vector<uint64_t> pending;  // blocks waiting for it
  };

  FreeSet& free_set(const Block& b);
  void insert_free(uint64_t addr, const Block& b);
  void erase_free(uint64_t addr, const Block& b);
  // Merges the free block at `it` with its free neighbours where allowed;
  // `unowned_only`: only with unowned neighbours (a block a fence released).
  Blocks::iterator coalesce(Blocks::iterator it, bool unowned_only);
  bool can_merge(const Block& a, const Block& b, bool unowned_only) const;
  EventId record(StreamId stream);
  void complete_one(EventId event);
  void release_fenced(StreamId stream, uint64_t seq);
  void note_in_use(Category c, int64_t delta_bytes);

  PoolOptions options_;
  EventRecorder record_event_;
  Blocks blocks_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // (base, bytes)
  FreeSet unowned_;
  std::map<StreamId, FreeSet> owned_;
  std::unordered_map<EventId, Event> events_;
  std::map<StreamId, std::deque<EventId>> stream_events_;  // record order
  std::map<StreamId, uint64_t> fenced_seq_;                // latest sequence covered by a recorded fence
  std::map<StreamId, uint64_t> completed_seq_;             // latest sequence covered by a completed fence
  uint64_t seq_ = 0;
  PoolStats counters_;  // the running counters (in-use, peaks, counts)
};

}  // namespace loongforge::mla
