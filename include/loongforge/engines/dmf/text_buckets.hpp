// loongforge/engines/dmf/text_buckets.hpp — the widths DMF cuts a micro-batch's
// text slot to (shape buckets), chosen once at start from the dataset's text
// lengths. No libtorch.
//
// Contract:
//  - choose_text_buckets(hist, micro_batch, max_buckets): hist[l] is how many
//    samples have a task text of l tokens (l = 0 .. the text slot; the data's
//    lengths are already cut to data.max_text_len). A micro-batch of
//    `micro_batch` samples drawn independently from hist is padded to the
//    smallest bucket at least its longest text; the buckets (ascending, at most
//    max_buckets, the last one the longest length with samples) minimise the
//    expected text-slot tokens of a micro-batch (dynamic programming over the
//    distribution of the micro-batch's longest text: exact, not a heuristic).
//    Widths below 1 are never chosen (a batch keeps one text column).
//    Throws std::invalid_argument on an empty histogram, a negative count,
//    micro_batch < 1 or max_buckets < 1.
//  - expected_slot_tokens(hist, micro_batch, buckets): that expectation for
//    any bucket set covering hist (the whole slot: {hist.size() - 1}).
//  - text_bucket(buckets, longest): the smallest bucket >= longest
//    (std::out_of_range naming both when none is: the data changed under the
//    buckets).
//
// Example:
//   auto b = choose_text_buckets(hist, 32, 4);  // e.g. {14}: every text has 14 tokens
//   int64_t width = text_bucket(b.widths, mb.text_len_max);
#pragma once

#include <cstdint>  // int64_t
#include <vector>   // std::vector

namespace loongforge::dmf {

struct TextBuckets {
  std::vector<int64_t> widths;       // ascending
  double expected_slot_tokens = 0;   // per micro-batch, with these widths
  double expected_real_tokens = 0;   // per micro-batch: micro_batch * mean length
};

TextBuckets choose_text_buckets(const std::vector<double>& hist, int64_t micro_batch, int64_t max_buckets);

double expected_slot_tokens(const std::vector<double>& hist, int64_t micro_batch, const std::vector<int64_t>& buckets);

int64_t text_bucket(const std::vector<int64_t>& buckets, int64_t longest);

}  // namespace loongforge::dmf
