// DMF's text buckets (text_buckets.hpp): the chosen widths are the best of
// every allowed set (brute force over random histograms), cover every text,
// and the expectation they report is the one recomputed from scratch.
#include <algorithm>  // std::is_sorted, std::min, std::max
#include <cmath>      // std::abs
#include <random>     // std::mt19937_64
#include <stdexcept>  // std::invalid_argument
#include <vector>     // std::vector

#include "catch_compat.hpp"
#include "loongforge/engines/dmf/text_buckets.hpp"

using loongforge::dmf::choose_text_buckets;
using loongforge::dmf::expected_slot_tokens;
using loongforge::dmf::text_bucket;

namespace {
// The least expected slot over every bucket set of at most k widths that covers the longest length.
double brute_force_best(const std::vector<double>& hist, int64_t micro_batch, int64_t k) {
  int64_t top = 0;
  for (size_t l = 0; l < hist.size(); ++l)
    if (hist[l] > 0) top = static_cast<int64_t>(l);
  top = std::max<int64_t>(top, 1);
  double best = 1e300;
  for (uint64_t bits = 0; bits < (uint64_t{1} << top); ++bits) {  // widths 1 .. top-1 chosen by bits; top always
    std::vector<int64_t> b;
    for (int64_t w = 1; w < top; ++w)
      if (bits >> (w - 1) & 1) b.push_back(w);
    b.push_back(top);
    if (static_cast<int64_t>(b.size()) > k) continue;
    best = std::min(best, expected_slot_tokens(hist, micro_batch, b));
  }
  return best;
}
}  // namespace

TEST_CASE("dmf: one text length gives one bucket of exactly that width") {
  std::vector<double> hist(33, 0.0);
  hist[14] = 500;
  const auto b = choose_text_buckets(hist, 32, 4);
  REQUIRE(b.widths == std::vector<int64_t>{14});
  REQUIRE(b.expected_slot_tokens == 32 * 14);
  REQUIRE(b.expected_real_tokens == 32 * 14);
  REQUIRE(expected_slot_tokens(hist, 32, {32}) == 32 * 32);  // today's whole slot
}

TEST_CASE("dmf: the chosen buckets are the best of every set of at most max_buckets widths") {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t slot = 2 + rng() % 11;  // lengths 0 .. slot (brute force: 2^slot sets)
    std::vector<double> hist(slot + 1, 0.0);
    for (auto& h : hist)
      if (rng() % 3 == 0) h = static_cast<double>(1 + rng() % 50);
    hist[rng() % hist.size()] += 1;  // never empty
    const int64_t micro_batch = 1 + static_cast<int64_t>(rng() % 8);
    const int64_t k = 1 + static_cast<int64_t>(rng() % 4);
    const auto b = choose_text_buckets(hist, micro_batch, k);
    REQUIRE(static_cast<int64_t>(b.widths.size()) <= k);
    REQUIRE(std::is_sorted(b.widths.begin(), b.widths.end()));
    for (size_t l = 0; l < hist.size(); ++l)
      if (hist[l] > 0) REQUIRE(text_bucket(b.widths, static_cast<int64_t>(l)) >= static_cast<int64_t>(l));
    const double recomputed = expected_slot_tokens(hist, micro_batch, b.widths);
    REQUIRE(std::abs(b.expected_slot_tokens - recomputed) <= 1e-9 * recomputed);
    REQUIRE(recomputed <= brute_force_best(hist, micro_batch, k) * (1 + 1e-9));
    ++checked;
  }
  REQUIRE(checked == 300);
}

TEST_CASE("dmf: a larger micro-batch needs fewer buckets, since its longest text is nearly always the longest") {
  std::vector<double> hist(33, 0.0);
  hist[6] = 90, hist[20] = 10;  // 10% long texts
  REQUIRE(choose_text_buckets(hist, 1, 4).widths == std::vector<int64_t>{6, 20});
  const auto big = choose_text_buckets(hist, 64, 4);  // P(no long text in 64) = 0.9^64 = 0.1%
  REQUIRE(big.widths.back() == 20);
  REQUIRE(big.expected_slot_tokens >= 64 * 20 * 0.998);
}

TEST_CASE("dmf: empty texts still keep one text column") {
  std::vector<double> hist = {5, 0, 0};
  REQUIRE(choose_text_buckets(hist, 4, 2).widths == std::vector<int64_t>{1});
}

TEST_CASE("dmf: bad histograms and a text longer than every bucket are refused by name") {
  REQUIRE_THROWS_AS(choose_text_buckets({}, 4, 2), std::invalid_argument);
  REQUIRE_THROWS_AS(choose_text_buckets({0, 0}, 4, 2), std::invalid_argument);
  REQUIRE_THROWS_AS(choose_text_buckets({1, -1}, 4, 2), std::invalid_argument);
  REQUIRE_THROWS_AS(choose_text_buckets({1, 1}, 0, 2), std::invalid_argument);
  REQUIRE_THROWS_AS(choose_text_buckets({1, 1}, 4, 0), std::invalid_argument);
  REQUIRE_THROWS_WITH(text_bucket({8, 16}, 17), lf_catch::Contains("17 tokens, more than the widest bucket (16)"));
  REQUIRE(text_bucket({8, 16}, 8) == 8);
  REQUIRE(text_bucket({8, 16}, 9) == 16);
}
