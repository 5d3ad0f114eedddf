// Proves MLA's pool logic (include/loongforge/engines/mla/pool.hpp) against a
// brute-force model over random operation sequences: allocate (random sizes,
// categories and streams), free, record_use on other streams, fences and
// out-of-order event completions, over one to three ranges (some touching).
// After every operation: no allocation overlaps another or leaves its range,
// addresses and sizes are aligned and equal the size class, and the counters
// (in use by category, requested, peaks, counts) equal the model's. No block
// is ever handed to a stream before the rule of Note [Stream-ordered reuse]
// allows it (the model keeps, per byte, the stream, time and other users of
// its last free, and per stream the newest completed event). Every 64
// operations the whole block list is checked: the blocks tile each range,
// the allocated ones are exactly the model's, free/pending/largest/fragmentation
// equal a recount, no two free neighbours that the rules let merge are apart,
// an allocation took the best fit and a refusal had no block to give. At the
// end of each sequence everything is freed, fenced and completed, and each
// range is one free block again. The suite runs 2 million operations; the
// long form ([.long], ctest label long) 100 million. Also small hand-written
// cases: size classes, best fit, stream rules, coalescing, misuse.
#include <algorithm>      // std::max
#include <cstdint>        // uint64_t
#include <cstdlib>        // std::getenv
#include <map>            // std::map
#include <random>         // std::mt19937_64
#include <set>            // std::set
#include <string>         // std::string
#include <unordered_map>  // std::unordered_map
#include <vector>         // std::vector

#include "catch_compat.hpp"
#include "loongforge/engines/mla/pool.hpp"

using namespace loongforge::mla;
using State = BlockInfo::State;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kFullCheckEvery = 64;  // operations between whole block-list checks

// Fails the test case with `what` when `cond` is false (REQUIRE would count
// every one of the millions of checks).
#define MODEL_CHECK(cond, what)                                        \
  do {                                                                 \
    if (!(cond)) FAIL("op " << op_ << " (" << last_ << "): " << what); \
  } while (0)

// A fake event source: ids in record order, each with its stream and time.
struct Events {
  struct Rec {
    StreamId stream;
    uint64_t time;
  };
  std::unordered_map<EventId, Rec> recorded;
  std::vector<EventId> outstanding;  // record order
  EventId next = 1;
  uint64_t now = 0;
  EventRecorder recorder() {
    return [this](StreamId s) {
      const EventId id = next++;
      recorded[id] = {s, now};
      outstanding.push_back(id);
      return id;
    };
  }
};

class Model {
 public:
  Model(uint64_t seed, PoolOptions options, int streams)
      : rng_(seed), options_(options), streams_(streams), pool_(options, events_.recorder()) {}

  Pool& pool() { return pool_; }

  void add_range(uint64_t base, uint64_t bytes) {
    pool_.add_range(base, bytes);
    ranges_.emplace_back(base, bytes);
    reserved_ += bytes;
  }

  // One random operation.
  void step() {
    ++op_;
    events_.now = 2 * op_ + 1;  // events recorded during this op come after its free (2 * op_)
    const int r = static_cast<int>(rng_() % 100);
    if (live_addrs_.empty() || r < 45)
      last_ = "allocate", do_allocate();
    else if (r < 80)
      last_ = "free", do_free(pick_live());
    else if (r < 85)
      last_ = "record_use", do_record_use();
    else if (r < 93)
      last_ = "fence", do_fence();
    else
      last_ = "complete", do_complete();
    check_counters();
    if (op_ % kFullCheckEvery == 0) check_blocks();
  }

  // Frees everything, completes every event, fences every stream (again after
  // blocks that waited for other streams came back): each range must be one free block.
  void drain() {
    while (!live_addrs_.empty()) {
      ++op_;
      events_.now = 2 * op_ + 1;
      do_free(live_addrs_.back());
    }
    // A block that waited for another stream's event is its own stream's
    // once that completes, and needs a fence of its own: fence until none is recorded.
    do {
      events_.now = 2 * ++op_ + 1;
      while (!events_.outstanding.empty()) complete(events_.outstanding.back());
    } while (!pool_.fence_all().empty());
    check_counters();
    check_blocks();
    const auto blocks = pool_.blocks();
    MODEL_CHECK(blocks.size() == ranges_.size(),
                "after draining " << blocks.size() << " blocks for " << ranges_.size() << " ranges");
    uint64_t largest = 0;
    for (size_t i = 0; i < blocks.size(); ++i) {
      MODEL_CHECK(blocks[i].state == State::kFree && !blocks[i].owned, "a drained block is not free for all");
      largest = std::max(largest, blocks[i].bytes);
    }
    const PoolStats s = pool_.stats();
    MODEL_CHECK(s.free_bytes == reserved_ && s.in_use_bytes == 0 && s.pending_bytes == 0, "drained counters");
    MODEL_CHECK(s.largest_free_bytes == largest, "drained largest free block");
    if (ranges_.size() == 1) MODEL_CHECK(s.fragmentation() == 0.0, "one drained range is fragmented");
  }

  uint64_t ops() const { return op_; }
  uint64_t allocations() const { return allocations_; }
  uint64_t refusals() const { return refusals_; }

 private:
  struct Live {
    uint64_t bytes, requested;
    Category category;
    StreamId stream;
    std::set<StreamId> uses;
  };
  struct LastFree {  // a region's last free: who freed it, when, who else used it
    uint64_t end;
    StreamId stream;
    uint64_t time;
    std::vector<StreamId> uses;
  };

  uint64_t random_request() {
    const uint64_t total = reserved_;
    const int kind = static_cast<int>(rng_() % 10);
    if (kind < 5) return 1 + rng_() % (8 * 1024);
    if (kind < 8) return 8 * 1024 + rng_() % kMiB;
    return 1 + rng_() % std::max<uint64_t>(total / 4, 1);
  }

  uint64_t pick_live() { return live_addrs_[rng_() % live_addrs_.size()]; }

  void do_allocate() {
    const uint64_t request = random_request();
    const auto category = static_cast<Category>(rng_() % kCategoryCount);
    const StreamId stream = rng_() % streams_;
    const uint64_t need = pool_.class_bytes(request);
    const bool full_check = op_ % kFullCheckEvery == 0;
    std::optional<uint64_t> expected_addr;
    if (full_check) expected_addr = best_fit(need, stream);
    const auto a = pool_.allocate(request, category, stream);
    if (!a) {
      ++refusals_;
      MODEL_CHECK(!best_fit(need, stream),
                  "refused " << need << " bytes on stream " << stream << " though a usable free block is large enough");
      return;
    }
    ++allocations_;
    MODEL_CHECK(a->bytes == need && need >= request, "block of " << a->bytes << " for a request of " << request);
    MODEL_CHECK(a->addr % options_.alignment_bytes == 0 && a->bytes % options_.alignment_bytes == 0,
                "misaligned block " << a->addr << " +" << a->bytes);
    if (full_check) MODEL_CHECK(expected_addr && *expected_addr == a->addr, "not the best fit");
    // Inside one range, overlapping nothing live.
    bool inside = false;
    for (const auto& [base, bytes] : ranges_)
      inside = inside || (a->addr >= base && a->addr + a->bytes <= base + bytes);
    MODEL_CHECK(inside, "block " << a->addr << " +" << a->bytes << " leaves its range");
    auto next = live_.lower_bound(a->addr);
    if (next != live_.end()) MODEL_CHECK(a->addr + a->bytes <= next->first, "overlaps the block at " << next->first);
    if (next != live_.begin()) {
      auto prev = std::prev(next);
      MODEL_CHECK(prev->first + prev->second.bytes <= a->addr, "overlaps the block at " << prev->first);
    }
    check_reuse_allowed(a->addr, a->addr + a->bytes, stream);
    live_[a->addr] = Live{a->bytes, request, category, stream, {}};
    live_index_[a->addr] = live_addrs_.size();
    live_addrs_.push_back(a->addr);
    in_use_ += a->bytes;
    requested_ += request;
    by_category_[static_cast<size_t>(category)] += a->bytes;
    peak_ = std::max(peak_, in_use_);
    const auto c = static_cast<size_t>(category);
    peak_by_category_[c] = std::max(peak_by_category_[c], by_category_[c]);
  }

  // Note [Stream-ordered reuse] from the model's side: every byte's last free.
  void check_reuse_allowed(uint64_t begin, uint64_t end, StreamId stream) {
    auto it = last_free_.upper_bound(begin);
    if (it != last_free_.begin()) --it;
    for (; it != last_free_.end() && it->first < end; ++it) {
      const LastFree& f = it->second;
      if (f.end <= begin) continue;
      MODEL_CHECK(stream == f.stream || completed_time(f.stream) > f.time,
                  "bytes freed on stream " << f.stream << " at " << f.time << " handed to stream " << stream
                                           << " before a later event on " << f.stream << " completed");
      for (StreamId u : f.uses)
        MODEL_CHECK(completed_time(u) > f.time, "bytes also used on stream " << u << " reused before its event");
    }
  }

  uint64_t completed_time(StreamId s) const {
    auto it = completed_.find(s);
    return it == completed_.end() ? 0 : it->second;
  }

  void do_free(uint64_t addr) {
    const Live l = live_.at(addr);
    pool_.free(addr);
    // Record the free over [addr, addr + bytes) in the interval map.
    const uint64_t end = addr + l.bytes;
    auto it = last_free_.upper_bound(addr);
    if (it != last_free_.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > addr) {  // split the region straddling addr
        LastFree tail = prev->second;
        prev->second.end = addr;
        if (tail.end > end) last_free_[end] = tail;  // it straddles end too
        it = last_free_.upper_bound(addr);
      }
    }
    while (it != last_free_.end() && it->first < end) {
      if (it->second.end > end) {
        LastFree tail = it->second;
        last_free_.erase(it);
        last_free_[end] = tail;
        break;
      }
      it = last_free_.erase(it);
    }
    last_free_[addr] = LastFree{end, l.stream, 2 * op_, {l.uses.begin(), l.uses.end()}};
    live_.erase(addr);
    const size_t i = live_index_.at(addr);
    live_addrs_[i] = live_addrs_.back();
    live_index_[live_addrs_[i]] = i;
    live_addrs_.pop_back();
    live_index_.erase(addr);
    in_use_ -= l.bytes;
    requested_ -= l.requested;
    by_category_[static_cast<size_t>(l.category)] -= l.bytes;
    ++frees_;
  }

  void do_record_use() {
    const uint64_t addr = pick_live();
    const StreamId s = rng_() % streams_;
    pool_.record_use(addr, s);
    Live& l = live_.at(addr);
    if (s != l.stream) l.uses.insert(s);
  }

  void do_fence() {
    if (rng_() % 4 == 0)
      pool_.fence_all();
    else
      pool_.fence(rng_() % streams_);
  }

  void do_complete() {
    if (events_.outstanding.empty()) return;
    complete(events_.outstanding[rng_() % events_.outstanding.size()]);
  }

  // Completes `e` and, as a stream does, the earlier events of its stream.
  void complete(EventId e) {
    const auto rec = events_.recorded.at(e);
    std::vector<EventId> left;
    for (EventId o : events_.outstanding) {
      const auto& r = events_.recorded.at(o);
      if (!(r.stream == rec.stream && r.time <= rec.time && o <= e)) left.push_back(o);
    }
    events_.outstanding = left;
    uint64_t& done = completed_[rec.stream];
    done = std::max(done, rec.time);
    pool_.complete(e);
  }

  void check_counters() {
    const PoolStats s = pool_.stats();
    MODEL_CHECK(s.reserved_bytes == reserved_, "reserved " << s.reserved_bytes << " != " << reserved_);
    MODEL_CHECK(s.in_use_bytes == in_use_, "in use " << s.in_use_bytes << " != " << in_use_);
    MODEL_CHECK(s.requested_bytes == requested_, "requested " << s.requested_bytes << " != " << requested_);
    MODEL_CHECK(s.peak_in_use_bytes == peak_, "peak " << s.peak_in_use_bytes << " != " << peak_);
    for (size_t c = 0; c < kCategoryCount; ++c) {
      MODEL_CHECK(s.in_use_by_category[c] == by_category_[c], category_name(static_cast<Category>(c)) << " in use");
      MODEL_CHECK(s.peak_by_category[c] == peak_by_category_[c], category_name(static_cast<Category>(c)) << " peak");
    }
    MODEL_CHECK(s.allocations == allocations_ && s.frees == frees_ && s.failed_allocations == refusals_,
                "operation counts");
    MODEL_CHECK(s.in_use_bytes + s.free_bytes + s.pending_bytes == s.reserved_bytes, "bytes do not add up");
  }

  // The block list against a recount and the model.
  void check_blocks() {
    const auto blocks = pool_.blocks();
    uint64_t free = 0, pending = 0, largest = 0, free_blocks = 0, allocated = 0;
    size_t range_i = 0;
    uint64_t expect_addr = 0;
    std::vector<bool> seen(ranges_.size(), false);
    for (size_t i = 0; i < blocks.size(); ++i) {
      const BlockInfo& b = blocks[i];
      MODEL_CHECK(b.range < ranges_.size(), "block in no range");
      if (!seen[b.range]) {
        MODEL_CHECK(b.addr == ranges_[b.range].first, "range " << b.range << " does not start with a block");
        seen[b.range] = true;
      } else {
        MODEL_CHECK(b.addr == expect_addr && b.range == range_i, "gap or overlap at " << b.addr);
      }
      range_i = b.range;
      expect_addr = b.addr + b.bytes;
      const bool range_ends = i + 1 == blocks.size() || blocks[i + 1].range != b.range;
      if (range_ends)
        MODEL_CHECK(expect_addr == ranges_[b.range].first + ranges_[b.range].second,
                    "range " << b.range << " not tiled");
      if (b.state == State::kAllocated) {
        ++allocated;
        auto l = live_.find(b.addr);
        MODEL_CHECK(l != live_.end() && l->second.bytes == b.bytes && l->second.category == b.category &&
                        l->second.stream == b.stream && l->second.requested == b.requested,
                    "allocated block " << b.addr << " is not the model's");
      } else if (b.state == State::kPending) {
        pending += b.bytes;
      } else {
        free += b.bytes, ++free_blocks, largest = std::max(largest, b.bytes);
        if (i + 1 < blocks.size()) {
          const BlockInfo& n = blocks[i + 1];
          const bool same_rule = (!b.owned && !n.owned) || (b.owned && n.owned && b.stream == n.stream);
          MODEL_CHECK(!(n.range == b.range && n.state == State::kFree && same_rule),
                      "free neighbours " << b.addr << " (owned " << b.owned << ", stream " << b.stream << ") and "
                                         << n.addr << " (owned " << n.owned << ", stream " << n.stream
                                         << ") not coalesced");
        }
      }
    }
    for (bool s : seen) MODEL_CHECK(s, "a range has no block");
    MODEL_CHECK(allocated == live_.size(), "allocated blocks " << allocated << " != live " << live_.size());
    const PoolStats s = pool_.stats();
    MODEL_CHECK(s.free_bytes == free && s.pending_bytes == pending && s.largest_free_bytes == largest &&
                    s.free_blocks == free_blocks,
                "free statistics differ from a recount");
    const double frag = free == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / static_cast<double>(free);
    MODEL_CHECK(s.fragmentation() == frag, "fragmentation");
    auto pool_events = pool_.outstanding_events();
    std::set<EventId> a(pool_events.begin(), pool_events.end()),
        b(events_.outstanding.begin(), events_.outstanding.end());
    MODEL_CHECK(std::includes(b.begin(), b.end(), a.begin(), a.end()), "the pool waits for an event already done");
  }

  // The address the best fit for `need` on `stream` should return (smallest
  // usable free block, lowest address on ties), by a scan.
  std::optional<uint64_t> best_fit(uint64_t need, StreamId stream) {
    std::optional<std::pair<uint64_t, uint64_t>> best;
    for (const BlockInfo& b : pool_.blocks()) {
      if (b.state != State::kFree || b.bytes < need || (b.owned && b.stream != stream)) continue;
      if (!best || std::make_pair(b.bytes, b.addr) < *best) best = std::make_pair(b.bytes, b.addr);
    }
    if (!best) return std::nullopt;
    return best->second;
  }

  std::mt19937_64 rng_;
  PoolOptions options_;
  uint64_t streams_;
  Events events_;
  Pool pool_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
  std::map<uint64_t, Live> live_;
  std::vector<uint64_t> live_addrs_;
  std::unordered_map<uint64_t, size_t> live_index_;
  std::map<uint64_t, LastFree> last_free_;
  std::map<StreamId, uint64_t> completed_;
  uint64_t reserved_ = 0, in_use_ = 0, requested_ = 0, peak_ = 0;
  uint64_t by_category_[kCategoryCount] = {}, peak_by_category_[kCategoryCount] = {};
  uint64_t allocations_ = 0, frees_ = 0, refusals_ = 0, op_ = 0;
  const char* last_ = "";  // the operation that ran last (failure messages)
};

struct Totals {
  uint64_t sequences = 0, ops = 0, allocations = 0, refusals = 0;
};

// `sequences` random sequences of `ops` operations each, seeds from `seed`.
Totals run_sequences(uint64_t seed, int sequences, int ops) {
  Totals t;
  for (int q = 0; q < sequences; ++q) {
    std::mt19937_64 rng(seed + static_cast<uint64_t>(q));
    PoolOptions options;
    options.alignment_bytes = uint64_t{256} << (rng() % 5);  // 256 B .. 4 KiB
    options.class_steps_per_octave = std::vector<uint64_t>{0, 4, 32}[rng() % 3];
    options.class_linear_bytes = std::vector<uint64_t>{4096, kMiB}[rng() % 2];
    const int streams = 1 + static_cast<int>(rng() % 3);
    Model m(rng(), options, streams);
    const int ranges = 1 + static_cast<int>(rng() % 3);
    uint64_t base = options.alignment_bytes * (1 + rng() % 1024);
    for (int r = 0; r < ranges; ++r) {
      const uint64_t bytes = (1 + rng() % 64) * kMiB / 4;  // 256 KiB .. 16 MiB
      m.add_range(base, bytes);
      base += bytes + (rng() % 2 == 0 ? 0 : options.alignment_bytes * (1 + rng() % 64));  // touching or not
    }
    for (int i = 0; i < ops; ++i) m.step();
    m.drain();
    ++t.sequences;
    t.ops += m.ops();
    t.allocations += m.allocations();
    t.refusals += m.refusals();
  }
  return t;
}

#undef MODEL_CHECK

}  // namespace

TEST_CASE("mla pool: 2 million random operations agree with a brute-force model") {
  const Totals t = run_sequences(/*seed=*/1, /*sequences=*/400, /*ops=*/5000);
  WARN("mla pool property test: " << t.sequences << " sequences, " << t.ops << " operations, " << t.allocations
                                  << " allocations, " << t.refusals << " refused");
  REQUIRE(t.ops >= 2000000);
  REQUIRE(t.allocations > 500000);
  REQUIRE(t.refusals > 0);  // the sequences do reach a full pool
}

TEST_CASE("mla pool: 100 million random operations agree with a brute-force model", "[.long]") {
  const Totals t = run_sequences(/*seed=*/1000003, /*sequences=*/5000, /*ops=*/20000);
  WARN("mla pool property test (long): " << t.sequences << " sequences, " << t.ops << " operations, " << t.allocations
                                         << " allocations, " << t.refusals << " refused");
  REQUIRE(t.ops >= 100000000);
}

// ---------------------------------------------------------------------------
// Hand-written cases

namespace {
struct Fixture {
  std::vector<std::pair<EventId, StreamId>> recorded;
  Pool pool{PoolOptions{}, [this](StreamId s) {
              recorded.emplace_back(recorded.size() + 1, s);
              return static_cast<EventId>(recorded.size());
            }};
};
}  // namespace

TEST_CASE("mla pool: size classes round to the alignment, then to 1/32 of the power of two") {
  Fixture f;
  REQUIRE(f.pool.class_bytes(0) == 512);
  REQUIRE(f.pool.class_bytes(1) == 512);
  REQUIRE(f.pool.class_bytes(513) == 1024);
  REQUIRE(f.pool.class_bytes(kMiB) == kMiB);
  REQUIRE(f.pool.class_bytes(kMiB + 1) == kMiB + 32 * 1024);  // steps of 1 MiB / 32
  REQUIRE(f.pool.class_bytes(100 * kMiB) == 100 * kMiB);      // 64 MiB octave: 2 MiB steps
  REQUIRE(f.pool.class_bytes(100 * kMiB + 1) == 102 * kMiB);
}

TEST_CASE("mla pool: best fit takes the smallest block that fits, and a full pool refuses") {
  Fixture f;
  f.pool.add_range(0, 16 * 1024);
  const auto a = f.pool.allocate(4096, Category::kActivation, 0);
  const auto b = f.pool.allocate(1024, Category::kActivation, 0);
  const auto c = f.pool.allocate(2048, Category::kActivation, 0);
  const auto d = f.pool.allocate(8192, Category::kActivation, 0);
  REQUIRE((a->addr == 0 && b->addr == 4096 && c->addr == 5120 && d->addr == 7168));
  f.pool.free(a->addr);
  f.pool.free(c->addr);  // free now: 4 KiB at 0, 2 KiB at 5120, 1 KiB at 15360
  REQUIRE(f.pool.allocate(2000, Category::kOther, 0)->addr == 5120);  // class 2 KiB: the exact block
  REQUIRE(f.pool.allocate(900, Category::kOther, 0)->addr == 15360);  // 1 KiB
  REQUIRE(f.pool.allocate(4096, Category::kOther, 0)->addr == 0);
  REQUIRE_FALSE(f.pool.allocate(1, Category::kOther, 0).has_value());
  REQUIRE(f.pool.stats().failed_allocations == 1);
  REQUIRE(f.pool.stats().free_bytes == 0);
}

TEST_CASE("mla pool: a block freed on one stream goes to another only after a later event on the first completes") {
  Fixture f;
  f.pool.add_range(0, 4096);
  const auto a = f.pool.allocate(4096, Category::kActivation, /*stream=*/1);
  f.pool.free(a->addr);
  REQUIRE_FALSE(f.pool.allocate(4096, Category::kActivation, 2).has_value());  // stream 2 must wait
  REQUIRE(f.pool.allocate(4096, Category::kActivation, 1)->addr == 0);         // stream 1 may take it at once
  f.pool.free(0);
  const auto fence = f.pool.fence(1);
  REQUIRE(fence.has_value());
  REQUIRE_FALSE(f.pool.fence(1).has_value());  // the outstanding fence covers the free already
  REQUIRE_FALSE(f.pool.allocate(4096, Category::kActivation, 2).has_value());  // recorded, not completed
  f.pool.complete(*fence);
  REQUIRE(f.pool.allocate(4096, Category::kActivation, 2)->addr == 0);
  REQUIRE(f.recorded.size() == 1);
}

TEST_CASE("mla pool: a block also used on another stream is reused by nobody until that stream's event completes") {
  Fixture f;
  f.pool.add_range(0, 4096);
  const auto a = f.pool.allocate(4096, Category::kOther, /*stream=*/1);
  f.pool.record_use(a->addr, 2);
  f.pool.free(a->addr);
  REQUIRE(f.recorded.size() == 1);
  REQUIRE(f.recorded[0].second == 2);  // the event is on the other stream
  REQUIRE(f.pool.stats().pending_bytes == 4096);
  REQUIRE_FALSE(f.pool.allocate(4096, Category::kOther, 1).has_value());
  f.pool.complete(f.recorded[0].first);
  REQUIRE(f.pool.stats().pending_bytes == 0);
  REQUIRE_FALSE(f.pool.allocate(4096, Category::kOther, 2).has_value());  // still stream 1's until a fence on it
  REQUIRE(f.pool.allocate(4096, Category::kOther, 1)->addr == 0);
}

TEST_CASE("mla pool: freed neighbours coalesce, fragmentation is 1 - largest free block / free bytes") {
  Fixture f;
  f.pool.add_range(0, 12 * 1024);
  const auto a = f.pool.allocate(4096, Category::kPersistent, 0);
  const auto b = f.pool.allocate(4096, Category::kActivation, 0);
  const auto c = f.pool.allocate(4096, Category::kOther, 0);
  PoolStats s = f.pool.stats();
  REQUIRE(s.in_use_by_category[0] == 4096);
  REQUIRE(s.in_use_by_category[1] == 4096);
  REQUIRE(s.in_use_by_category[2] == 4096);
  f.pool.free(a->addr);
  f.pool.free(c->addr);
  s = f.pool.stats();
  REQUIRE(s.free_blocks == 2);
  REQUIRE(s.largest_free_bytes == 4096);
  REQUIRE(s.fragmentation() == 0.5);  // 1 - 4 KiB / 8 KiB, exact in binary
  f.pool.free(b->addr);
  s = f.pool.stats();
  REQUIRE(s.free_blocks == 1);
  REQUIRE(s.largest_free_bytes == 12 * 1024);
  REQUIRE(s.fragmentation() == 0.0);
  REQUIRE(s.peak_in_use_bytes == 12 * 1024);
  REQUIRE(s.merges == 2);
}

TEST_CASE("mla pool: touching ranges stay apart, and misuse is refused naming the address") {
  Fixture f;
  f.pool.add_range(0, 4096);
  f.pool.add_range(4096, 4096);
  REQUIRE(f.pool.stats().free_blocks == 2);
  REQUIRE_FALSE(f.pool.allocate(8192, Category::kOther, 0).has_value());
  REQUIRE_THROWS_WITH(f.pool.add_range(2048, 4096), lf_catch::Contains("overlaps the range [0, +4096)"));
  REQUIRE_THROWS_WITH(f.pool.add_range(8192 + 100, 4096), lf_catch::Contains("aligned to 512 bytes"));
  const auto a = f.pool.allocate(100, Category::kOther, 0);
  f.pool.free(a->addr);
  REQUIRE_THROWS_WITH(f.pool.free(a->addr), lf_catch::Contains("double free"));
  REQUIRE_THROWS_WITH(f.pool.free(12345), lf_catch::Contains("12345 is not an allocated block"));
}
