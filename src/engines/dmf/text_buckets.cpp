// The text slot's shape buckets (text_buckets.hpp).
#include "loongforge/engines/dmf/text_buckets.hpp"

#include <algorithm>  // std::max
#include <cmath>      // std::pow
#include <limits>     // std::numeric_limits
#include <stdexcept>  // std::invalid_argument, std::out_of_range
#include <string>     // std::to_string

namespace loongforge::dmf {

namespace {

// P(the longest text of a micro-batch has l tokens), l = 0 .. hist.size() - 1, with width-0 texts counted as 1
// (a batch keeps one text column).
std::vector<double> longest_distribution(const std::vector<double>& hist, int64_t micro_batch) {
  if (hist.empty()) throw std::invalid_argument("text buckets: the histogram of text lengths is empty");
  if (micro_batch < 1) throw std::invalid_argument("text buckets: micro_batch must be at least 1");
  double total = 0;
  for (const double h : hist) {
    if (!(h >= 0)) throw std::invalid_argument("text buckets: a count of the histogram is negative or NaN");
    total += h;
  }
  if (total <= 0) throw std::invalid_argument("text buckets: the histogram of text lengths has no samples");
  std::vector<double> p(std::max<size_t>(hist.size(), 2), 0.0);
  double below = 0, prev = 0;
  for (size_t l = 0; l < hist.size(); ++l) {
    below += hist[l] / total;
    const double f = std::pow(std::min(below, 1.0), static_cast<double>(micro_batch));
    p[std::max<size_t>(l, 1)] += f - prev;
    prev = f;
  }
  return p;
}

}  // namespace

double expected_slot_tokens(const std::vector<double>& hist, int64_t micro_batch, const std::vector<int64_t>& buckets) {
  const std::vector<double> p = longest_distribution(hist, micro_batch);
  double width = 0;
  for (size_t l = 1; l < p.size(); ++l)
    if (p[l] > 0) width += p[l] * static_cast<double>(text_bucket(buckets, static_cast<int64_t>(l)));
  return width * static_cast<double>(micro_batch);
}

TextBuckets choose_text_buckets(const std::vector<double>& hist, int64_t micro_batch, int64_t max_buckets) {
  if (max_buckets < 1) throw std::invalid_argument("text buckets: max_buckets must be at least 1");
  const std::vector<double> p = longest_distribution(hist, micro_batch);
  std::vector<int64_t> c;  // the widths a micro-batch's longest text can have
  std::vector<double> q;   // their probabilities
  for (size_t l = 1; l < p.size(); ++l)
    if (p[l] > 0) c.push_back(static_cast<int64_t>(l)), q.push_back(p[l]);
  const size_t m = c.size();
  std::vector<double> prefix(m + 1, 0.0);
  for (size_t i = 0; i < m; ++i) prefix[i + 1] = prefix[i] + q[i];
  // cost[j][i]: least expected width covering c[0..i] with j + 1 buckets, the last at c[i]; from[j][i] its group start.
  const size_t k = std::min<size_t>(static_cast<size_t>(max_buckets), m);
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> cost(k, std::vector<double>(m, inf));
  std::vector<std::vector<size_t>> from(k, std::vector<size_t>(m, 0));
  for (size_t i = 0; i < m; ++i) cost[0][i] = static_cast<double>(c[i]) * prefix[i + 1];
  for (size_t j = 1; j < k; ++j)
    for (size_t i = j; i < m; ++i)
      for (size_t a = j; a <= i; ++a) {  // the last group is c[a..i]
        const double v = cost[j - 1][a - 1] + static_cast<double>(c[i]) * (prefix[i + 1] - prefix[a]);
        if (v < cost[j][i]) cost[j][i] = v, from[j][i] = a;
      }
  // The fewest buckets within rounding of the best (each bucket is a captured graph).
  size_t best = 0;
  for (size_t j = 1; j < k; ++j)
    if (cost[j][m - 1] < cost[best][m - 1] * (1 - 1e-9)) best = j;
  TextBuckets out;
  for (size_t j = best + 1, i = m - 1; j-- > 0;) {
    out.widths.insert(out.widths.begin(), c[i]);
    if (j > 0) i = from[j][i] - 1;
  }
  out.expected_slot_tokens = cost[best][m - 1] * static_cast<double>(micro_batch);
  double total = 0, mean = 0;
  for (size_t l = 0; l < hist.size(); ++l) total += hist[l], mean += hist[l] * static_cast<double>(l);
  out.expected_real_tokens = mean / total * static_cast<double>(micro_batch);
  return out;
}

int64_t text_bucket(const std::vector<int64_t>& buckets, int64_t longest) {
  for (const int64_t w : buckets)
    if (w >= longest) return w;
  throw std::out_of_range("text buckets: a micro-batch's longest text has " + std::to_string(longest) +
                          " tokens, more than the widest bucket (" +
                          (buckets.empty() ? std::string("none") : std::to_string(buckets.back())) +
                          "): the buckets were chosen from other data");
}

}  // namespace loongforge::dmf
