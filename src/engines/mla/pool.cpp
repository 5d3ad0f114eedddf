// MLA's pool logic over an abstract address range (pool.hpp): size classes,
// best-fit free lists per stream, coalescing of neighbours, stream-ordered
// reuse, statistics. Host code only; the device allocator wraps it.
#include "loongforge/engines/mla/pool.hpp"

#include <algorithm>  // std::max
#include <iterator>   // std::prev, std::next
#include <stdexcept>  // std::invalid_argument, std::logic_error

namespace loongforge::mla {

// Note [Stream-ordered reuse]
// ---------------------------
// CUDA runs a stream's work in order, and the host frees a tensor as soon as
// its last kernel is *enqueued*, not run. So a block freed on stream S may be
// handed to the next request on S at once (its new kernels run after the old
// ones), but handing it to a request on stream T could let T's kernels
// overwrite it while S's are still reading. A free block therefore has an
// owner: the stream it was freed on ("owned"). Only the owner may take it,
// until an event recorded on S after the free has completed (a "fence"):
// then S's work on it is done and the block is unowned, free for every stream.
// A block that other streams also used (record_use, PyTorch's recordStream)
// is "pending" when freed: an event is recorded on each of those streams and
// nobody may take it until all have completed; it is then owned by S (its
// allocation stream), as any block freed on S.
//
// Free neighbours coalesce when the merged block keeps every rule: two
// unowned blocks give an unowned one; an owned block with an unowned block or
// one of the same owner gives an owned one (the later free's sequence number,
// so only a fence after both releases it); blocks of different owners, and
// pending blocks, stay apart. A block a fence releases merges only with
// unowned neighbours (merging it into an owned one would undo the fence).
// With one stream (the trainer's), every free block is owned by it, so
// everything coalesces at once and no event is ever needed.
//
// Events on one stream complete in the order recorded, so complete(E)
// completes the stream's earlier events too: the caller may poll only the
// newest. fence() records an event only when the stream owns a free block not
// yet covered by a fence, so fencing every stream at every step boundary
// records at most one event per stream that freed something.

const char* category_name(Category c) {
  switch (c) {
    case Category::kPersistent:
      return "persistent";
    case Category::kActivation:
      return "activation";
    case Category::kOther:
      return "other";
  }
  return "other";
}

double PoolStats::fragmentation() const {
  if (free_bytes == 0) return 0.0;
  return 1.0 - static_cast<double>(largest_free_bytes) / static_cast<double>(free_bytes);
}

namespace {

bool power_of_two(uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

uint64_t round_up(uint64_t v, uint64_t multiple) {
  return (v + multiple - 1) / multiple * multiple;
}

constexpr uint64_t kLargestRequest = uint64_t{1} << 62;  // past this, nothing fits (and no overflow)

}  // namespace

Pool::Pool(PoolOptions options, EventRecorder record_event)
    : options_(options), record_event_(std::move(record_event)) {
  if (!power_of_two(options_.alignment_bytes))
    throw std::invalid_argument("mla::Pool: alignment_bytes (" + std::to_string(options_.alignment_bytes) +
                                ") must be a power of two");
  if (options_.class_steps_per_octave != 0 && !power_of_two(options_.class_steps_per_octave))
    throw std::invalid_argument("mla::Pool: class_steps_per_octave (" +
                                std::to_string(options_.class_steps_per_octave) + ") must be 0 or a power of two");
  if (!record_event_) throw std::invalid_argument("mla::Pool: an EventRecorder is required");
}

void Pool::add_range(uint64_t base, uint64_t bytes) {
  const uint64_t a = options_.alignment_bytes;
  if (bytes == 0 || base % a != 0 || bytes % a != 0 || base + bytes < base)
    throw std::invalid_argument("mla::Pool::add_range: [" + std::to_string(base) + ", +" + std::to_string(bytes) +
                                ") must be non-empty and aligned to " + std::to_string(a) + " bytes");
  for (const auto& [b, n] : ranges_)
    if (base < b + n && b < base + bytes)
      throw std::invalid_argument("mla::Pool::add_range: [" + std::to_string(base) + ", +" + std::to_string(bytes) +
                                  ") overlaps the range [" + std::to_string(b) + ", +" + std::to_string(n) + ")");
  Block block;
  block.bytes = bytes;
  block.range = static_cast<uint32_t>(ranges_.size());
  ranges_.emplace_back(base, bytes);
  blocks_.emplace(base, block);
  insert_free(base, block);
  counters_.reserved_bytes += bytes;
}

uint64_t Pool::class_bytes(uint64_t bytes) const {
  bytes = std::max<uint64_t>(bytes, 1);
  if (bytes > kLargestRequest) return ~uint64_t{0};
  uint64_t step = options_.alignment_bytes;
  if (bytes > options_.class_linear_bytes && options_.class_steps_per_octave != 0) {
    uint64_t octave = uint64_t{1} << (63 - __builtin_clzll(bytes));  // 2^floor(log2 bytes)
    step = std::max(step, octave / options_.class_steps_per_octave);
  }
  return round_up(bytes, step);
}

// ---------------------------------------------------------------------------
// Free lists

Pool::FreeSet& Pool::free_set(const Block& b) {
  return b.owned ? owned_[b.stream] : unowned_;
}

void Pool::insert_free(uint64_t addr, const Block& b) {
  free_set(b).emplace(b.bytes, addr);
  counters_.free_bytes += b.bytes;
}

void Pool::erase_free(uint64_t addr, const Block& b) {
  FreeSet& set = free_set(b);
  set.erase({b.bytes, addr});
  if (b.owned && set.empty()) owned_.erase(b.stream);
  counters_.free_bytes -= b.bytes;
}

bool Pool::can_merge(const Block& a, const Block& b, bool unowned_only) const {
  if (a.state != BlockInfo::State::kFree || b.state != BlockInfo::State::kFree || a.range != b.range) return false;
  if (unowned_only) return !a.owned && !b.owned;
  return !a.owned || !b.owned || a.stream == b.stream;
}

Pool::Blocks::iterator Pool::coalesce(Blocks::iterator it, bool unowned_only) {
  auto merge_into = [&](Blocks::iterator left, Blocks::iterator right) {
    erase_free(left->first, left->second);
    erase_free(right->first, right->second);
    Block& l = left->second;
    const Block& r = right->second;
    const uint64_t seq = std::max(l.owned ? l.free_seq : 0, r.owned ? r.free_seq : 0);
    if (!l.owned && r.owned) l.stream = r.stream;
    l.owned = l.owned || r.owned;
    l.free_seq = seq;
    l.bytes += r.bytes;
    blocks_.erase(right);
    insert_free(left->first, l);
    ++counters_.merges;
    return left;
  };
  // Repeated: an unowned neighbour merged into an owned block makes the
  // owner's block next to it mergeable too (owned | unowned | owned).
  while (it != blocks_.begin()) {
    auto left = std::prev(it);
    if (!can_merge(left->second, it->second, unowned_only)) break;
    it = merge_into(left, it);
  }
  for (auto right = std::next(it); right != blocks_.end() && can_merge(it->second, right->second, unowned_only);
       right = std::next(it))
    it = merge_into(it, right);
  return it;
}

// ---------------------------------------------------------------------------
// Allocate and free

std::optional<Allocation> Pool::allocate(uint64_t bytes, Category category, StreamId stream) {
  const uint64_t need = class_bytes(bytes);
  // Best fit among the blocks this stream may take: its own and the unowned.
  const FreeSet* best_set = nullptr;
  FreeSet::const_iterator best;
  auto consider = [&](const FreeSet& set) {
    auto c = set.lower_bound({need, 0});
    if (c != set.end() && (best_set == nullptr || *c < *best)) best_set = &set, best = c;
  };
  if (need != ~uint64_t{0}) {
    consider(unowned_);
    if (auto own = owned_.find(stream); own != owned_.end()) consider(own->second);
  }
  if (best_set == nullptr) {
    ++counters_.failed_allocations;
    return std::nullopt;
  }
  const uint64_t addr = best->second;
  auto it = blocks_.find(addr);
  Block& b = it->second;
  erase_free(addr, b);
  if (b.bytes > need) {  // split: the rest stays free under the same rules
    Block rest = b;
    rest.bytes = b.bytes - need;
    b.bytes = need;
    blocks_.emplace(addr + need, rest);
    insert_free(addr + need, rest);
    ++counters_.splits;
  }
  b.state = BlockInfo::State::kAllocated;
  b.owned = false;
  b.stream = stream;
  b.category = category;
  b.requested = bytes;
  b.uses.clear();
  b.free_seq = 0;
  note_in_use(category, static_cast<int64_t>(b.bytes));
  counters_.requested_bytes += bytes;
  ++counters_.allocations;
  return Allocation{addr, b.bytes};
}

void Pool::free(uint64_t addr) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.state != BlockInfo::State::kAllocated)
    throw std::invalid_argument("mla::Pool::free: " + std::to_string(addr) +
                                " is not an allocated block (a double free, or a pointer this pool never gave)");
  Block& b = it->second;
  note_in_use(b.category, -static_cast<int64_t>(b.bytes));
  counters_.requested_bytes -= b.requested;
  ++counters_.frees;
  b.free_seq = ++seq_;
  if (!b.uses.empty()) {
    b.state = BlockInfo::State::kPending;
    b.pending_events = static_cast<uint32_t>(b.uses.size());
    counters_.pending_bytes += b.bytes;
    const std::vector<StreamId> uses = std::move(b.uses);
    b.uses.clear();
    for (StreamId s : uses) events_[record(s)].pending.push_back(addr);
    return;
  }
  b.state = BlockInfo::State::kFree;
  b.owned = true;
  insert_free(addr, b);
  coalesce(it, /*unowned_only=*/false);
}

void Pool::record_use(uint64_t addr, StreamId stream) {
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.state != BlockInfo::State::kAllocated)
    throw std::invalid_argument("mla::Pool::record_use: " + std::to_string(addr) + " is not an allocated block");
  Block& b = it->second;
  if (stream == b.stream) return;
  for (StreamId s : b.uses)
    if (s == stream) return;
  b.uses.push_back(stream);
}

void Pool::note_in_use(Category c, int64_t delta_bytes) {
  const auto i = static_cast<size_t>(c);
  counters_.in_use_by_category[i] += static_cast<uint64_t>(delta_bytes);
  counters_.in_use_bytes += static_cast<uint64_t>(delta_bytes);
  counters_.peak_by_category[i] = std::max(counters_.peak_by_category[i], counters_.in_use_by_category[i]);
  counters_.peak_in_use_bytes = std::max(counters_.peak_in_use_bytes, counters_.in_use_bytes);
}

// ---------------------------------------------------------------------------
// Events (Note [Stream-ordered reuse])

EventId Pool::record(StreamId stream) {
  const EventId id = record_event_(stream);
  if (events_.count(id) != 0)
    throw std::logic_error("mla::Pool: the EventRecorder returned event " + std::to_string(id) +
                           ", which is still outstanding");
  events_[id].stream = stream;
  stream_events_[stream].push_back(id);
  ++counters_.events_recorded;
  return id;
}

std::optional<EventId> Pool::fence(StreamId stream) {
  auto own = owned_.find(stream);
  if (own == owned_.end()) return std::nullopt;
  uint64_t newest = 0;
  for (const auto& [bytes, addr] : own->second) newest = std::max(newest, blocks_.at(addr).free_seq);
  if (newest <= fenced_seq_[stream]) return std::nullopt;  // an outstanding fence covers them
  const EventId id = record(stream);
  events_[id].fence = true;
  events_[id].fence_seq = seq_;
  fenced_seq_[stream] = seq_;
  return id;
}

std::vector<EventId> Pool::fence_all() {
  std::vector<StreamId> streams;
  for (const auto& [s, set] : owned_) streams.push_back(s);
  std::vector<EventId> recorded;
  for (StreamId s : streams)
    if (auto e = fence(s)) recorded.push_back(*e);
  return recorded;
}

void Pool::complete(EventId event) {
  auto it = events_.find(event);
  if (it == events_.end()) return;
  std::deque<EventId>& order = stream_events_[it->second.stream];
  const StreamId stream = it->second.stream;
  while (!order.empty()) {
    const EventId e = order.front();
    order.pop_front();
    complete_one(e);
    if (e == event) break;
  }
  if (order.empty()) stream_events_.erase(stream);
}

void Pool::complete_one(EventId event) {
  Event ev = std::move(events_.at(event));
  events_.erase(event);
  if (ev.fence) release_fenced(ev.stream, ev.fence_seq);
  for (uint64_t addr : ev.pending) {
    auto it = blocks_.find(addr);
    Block& b = it->second;
    if (--b.pending_events != 0) continue;
    counters_.pending_bytes -= b.bytes;
    b.state = BlockInfo::State::kFree;
    // Every other stream is done with it; its own stream's work is done when
    // a fence on it recorded after the free has completed.
    auto done = completed_seq_.find(b.stream);
    b.owned = done == completed_seq_.end() || done->second < b.free_seq;
    insert_free(addr, b);
    coalesce(it, /*unowned_only=*/!b.owned);
  }
}

void Pool::release_fenced(StreamId stream, uint64_t seq) {
  uint64_t& done = completed_seq_[stream];
  done = std::max(done, seq);
  auto own = owned_.find(stream);
  if (own == owned_.end()) return;
  std::vector<uint64_t> released;
  for (const auto& [bytes, addr] : own->second)
    if (blocks_.at(addr).free_seq <= seq) released.push_back(addr);
  for (uint64_t addr : released) {
    auto it = blocks_.find(addr);
    erase_free(addr, it->second);
    it->second.owned = false;
    it->second.free_seq = 0;
    insert_free(addr, it->second);
    coalesce(it, /*unowned_only=*/true);
  }
}

std::vector<EventId> Pool::outstanding_events() const {
  std::vector<EventId> out;
  for (const auto& [s, order] : stream_events_) out.insert(out.end(), order.begin(), order.end());
  return out;
}

// ---------------------------------------------------------------------------
// Inspection

namespace {
BlockInfo info(uint64_t addr, uint64_t bytes, uint32_t range, BlockInfo::State state, bool owned, StreamId stream,
               Category category, uint64_t requested) {
  BlockInfo i;
  i.addr = addr, i.bytes = bytes, i.range = range, i.state = state, i.owned = owned, i.stream = stream;
  i.category = category, i.requested = requested;
  return i;
}
}  // namespace

std::optional<BlockInfo> Pool::find(uint64_t addr) const {
  auto it = blocks_.find(addr);
  if (it == blocks_.end() || it->second.state != BlockInfo::State::kAllocated) return std::nullopt;
  const Block& b = it->second;
  return info(addr, b.bytes, b.range, b.state, b.owned, b.stream, b.category, b.requested);
}

PoolStats Pool::stats() const {
  PoolStats s = counters_;
  s.ranges = ranges_.size();
  s.free_blocks = unowned_.size();
  if (!unowned_.empty()) s.largest_free_bytes = unowned_.rbegin()->first;
  for (const auto& [stream, set] : owned_) {
    s.free_blocks += set.size();
    if (!set.empty()) s.largest_free_bytes = std::max(s.largest_free_bytes, set.rbegin()->first);
  }
  return s;
}

std::vector<BlockInfo> Pool::blocks() const {
  std::vector<BlockInfo> out;
  out.reserve(blocks_.size());
  for (const auto& [addr, b] : blocks_)
    out.push_back(info(addr, b.bytes, b.range, b.state, b.owned, b.stream, b.category, b.requested));
  return out;
}

}  // namespace loongforge::mla
