// trainer.micro_batch_size: auto, the choosing (micro_batch.hpp). No libtorch
// here: the probes come in as a function (the trainer's is in
// trainer_micro_batch.cpp), so the policy is tested on the CPU with fakes.
#include "loongforge/trainer/micro_batch.hpp"

#include <algorithm>  // std::sort, std::min, std::max
#include <cstdio>     // std::snprintf
#include <limits>     // std::numeric_limits
#include <map>        // std::map
#include <string>     // std::stoll

#include "loongforge/common/error.hpp"

namespace loongforge::trainer {

// Note [Choosing the micro-batch]
// The candidates are the divisors B of G / W (largest first): only they keep
// the global batch G with a whole accumulation K = G / (B x W). The device
// memory a training step holds at its peak is, to a good approximation,
// a + b x B: a for what does not grow with the batch (weights, gradients,
// workspaces) and b per sample (activations, the batch). Two probes at small
// sizes (16 and 8, or the largest candidate and its half when that is
// smaller) fit the line, so the expensive sizes are not all tried. A probe
// is one real forward+backward, so its peak includes the gradients; what
// the run allocates later and a probe does not (optimizer moments, working
// copies, communication buffers, the data source's micro-batches) comes in
// as `later`, estimated by the trainer term by term, each a fixed part plus
// a part per sample (the data source holds more for a larger B), so later(B)
// is evaluated at every candidate compared. The largest candidate with
// a + b x B + later(B) under the budget (capacity less kMicroBatchHeadroom)
// is then measured once at its own size, and its measured peak plus later(B)
// must stay under the budget too: the line is a model, the confirmation is
// the fact. A
// confirmation that runs out of memory rules out it and everything larger;
// one that measures over the budget shows the peak bends upward (attention
// grows faster than linearly with a longer sequence, the allocator rounds
// larger blocks differently), so the line is redrawn through the largest
// smaller size measured and this one before the next candidate is picked.
// Each confirmation is a smaller candidate than the last, so the search ends
// after at most as many probes as there are candidates. A probe at the
// smallest fit size that runs out of memory halves it down to 1; at 1 there
// is no micro-batch that fits, which is an error naming the numbers, as is a
// smallest candidate predicted over the budget.
//
// Note [Micro-batch headroom]
// 10% of the capacity is never planned for. It covers what neither the probe
// nor the estimated terms see: the allocator's fragmentation under the run's
// changing shapes (DMF's text widths, a last partial micro-batch), NCCL's
// buffers and streams on several ranks, the compiled step's package (it
// runs instead of the TorchScript step the probe measured, with its own
// buffers), the CUDA graphs' pool rounding, and a peak that varies from batch
// to batch with the data (masks do not change the shapes, but kernels may
// pick other workspaces). 10% is a judgment, not a measurement: on an 80 GB
// GPU it leaves 8 GB, and it is smaller than the step between consecutive
// large candidates (divisors usually differ by 25% or more), so it rarely
// costs a candidate. No GPU run has measured how close to the edge a choice
// lands yet (docs/mla.md's feature table).

namespace {

constexpr int64_t kFitProbe = 16;  // the larger of the two fit probes (the smaller is its half)

std::string list_text(const std::vector<int64_t>& v, size_t most) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < most; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > most) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace

std::string gb_text(double bytes) {
  char text[32];
  if (bytes < kGiB)  // a small model's numbers: MB = 2^20 bytes, as the run line's
    std::snprintf(text, sizeof text, "%.0f MB", bytes / (1024.0 * 1024.0));
  else
    std::snprintf(text, sizeof text, "%.1f GB", bytes / kGiB);
  return text;
}

double later_at(const std::vector<MemoryTerm>& terms, int64_t micro_batch) {
  double sum = 0;
  for (const auto& t : terms) sum += t.at(micro_batch);
  return sum;
}

std::vector<MemoryTerm> data_terms(const DataMemory& d) {
  std::vector<MemoryTerm> terms;
  terms.push_back({"the step's micro-batches", d.sample_bytes * static_cast<double>(d.step_samples), 0.0});
  if (d.adfe) {
    terms.push_back({"ADFE's ready micro-batches (prefetch_factor " + std::to_string(d.prefetch_factor) + " + 1)", 0.0,
                     d.sample_bytes * static_cast<double>(d.prefetch_factor + 1)});
    if (d.frame_bytes > 0) terms.push_back({"frames before the device resize", 0.0, d.frame_bytes});
  }
  return terms;
}

std::vector<int64_t> candidates(int64_t global_batch, int64_t world_size, int64_t max_micro_batch,
                                int64_t max_accumulation) {
  std::vector<int64_t> out;
  if (global_batch <= 0 || world_size <= 0 || global_batch % world_size != 0) return out;
  const int64_t per_rank = global_batch / world_size;
  for (int64_t d = 1; d <= per_rank / d; ++d) {
    if (per_rank % d != 0) continue;
    for (const int64_t b : {d, per_rank / d})
      if (b <= max_micro_batch && per_rank / b <= max_accumulation) out.push_back(b);
  }
  std::sort(out.begin(), out.end(), [](int64_t x, int64_t y) { return x > y; });
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

const ProbeRecord* MicroBatchChoice::larger_probe() const {
  for (const auto& p : probes)
    if (p.micro_batch == larger) return &p;
  return nullptr;
}

MicroBatchChoice choose_micro_batch(const MicroBatchInput& in, const Probe& probe) {
  MicroBatchChoice c;
  c.candidates = candidates(in.global_batch, in.world_size, in.max_micro_batch, in.max_accumulation);
  c.budget_bytes = in.capacity_bytes * (1.0 - in.headroom);
  const std::string G = std::to_string(in.global_batch), W = std::to_string(in.world_size);
  const std::string prefix = "trainer.micro_batch_size auto: ";
  if (c.candidates.empty())
    throw ConfigError(prefix + "no micro-batch keeps trainer.global_batch_size " + G + " on " + W +
                      " rank(s) with a micro-batch of at most " + std::to_string(in.max_micro_batch) +
                      " and an accumulation of at most " + std::to_string(in.max_accumulation) +
                      ": set global_batch_size to a multiple of the world size with a smaller share per rank, or "
                      "set micro_batch_size to a number");
  const auto& cands = c.candidates;
  const size_t n = cands.size();

  std::map<int64_t, ProbeResult> seen;  // each size is measured once
  auto run = [&](int64_t b, const char* purpose) {
    if (const auto it = seen.find(b); it != seen.end()) return it->second;
    const ProbeResult r = probe(b);
    c.probes.push_back({b, purpose, r});
    seen[b] = r;
    return r;
  };
  int64_t smallest_oom = std::numeric_limits<int64_t>::max();
  double a = 0, slope = 0;  // peak(B) = a + slope x B
  auto line_through = [&](double x0, double y0, double x1, double y1) {
    slope = std::max(0.0, (y1 - y0) / (x1 - x0));  // a noisy decrease is no reason to predict less for more
    a = y0 - slope * x0;
  };
  auto predict = [&](int64_t b) { return a + slope * static_cast<double>(b) + later_at(in.later, b); };
  auto budget_text = [&] {
    return gb_text(c.budget_bytes) + " budget (" + gb_text(in.capacity_bytes) + " less " +
           std::to_string(static_cast<int>(in.headroom * 100.0 + 0.5)) + "% headroom, Note [Micro-batch headroom])";
  };
  auto later_text = [&](int64_t b) {  // each term at a micro-batch of b
    std::string s;
    for (const auto& t : in.later) s += (s.empty() ? "" : ", ") + t.name + " " + gb_text(t.at(b));
    return s.empty() ? std::string("nothing") : s;
  };

  // 1. The line, from two small sizes (halved while the smaller runs out of memory).
  const int64_t hi = std::min(kFitProbe, cands.front());
  int64_t lo = std::max<int64_t>(1, hi / 2);
  ProbeResult r_lo = run(lo, "fit");
  while (r_lo.out_of_memory && lo > 1) {
    smallest_oom = lo;
    lo /= 2;
    r_lo = run(lo, "fit");
  }
  if (r_lo.out_of_memory)
    throw ConfigError(prefix + "a forward+backward of one sample runs out of device memory (" +
                      gb_text(in.capacity_bytes) +
                      " usable): the model leaves no room for any micro-batch; lower what the run holds "
                      "(precision.mode=bf16, a smaller model) or train on a larger GPU");
  a = 0, slope = r_lo.peak_bytes / static_cast<double>(lo);  // one size: proportional (an upper bound while a > 0)
  if (smallest_oom > hi && hi > lo) {
    const ProbeResult r_hi = run(hi, "fit");
    if (r_hi.out_of_memory)
      smallest_oom = hi;
    else
      line_through(static_cast<double>(lo), r_lo.peak_bytes, static_cast<double>(hi), r_hi.peak_bytes), c.fitted = true;
  }
  c.intercept_bytes = a, c.per_sample_bytes = slope;

  // 2. The largest candidate predicted to fit, confirmed by a probe at its size; stepping down otherwise.
  auto next_fitting = [&](size_t from) {
    for (size_t i = from; i < n; ++i)
      if (cands[i] < smallest_oom && predict(cands[i]) <= c.budget_bytes) return i;
    return n;
  };
  auto none_fits = [&] {
    const int64_t smallest = cands.back();
    return ConfigError(prefix + "no candidate fits: the smallest, " + std::to_string(smallest) + ", is " +
                       (smallest >= smallest_oom ? std::string("out of memory in its probe")
                                                 : "predicted at " + gb_text(predict(smallest))) +
                       " (the probe's peak plus " + later_text(smallest) + ") against the " + budget_text() +
                       "; lower what the run holds (gcts.shard_optimizer=true over several ranks, "
                       "precision.mode=bf16), train on more ranks for a smaller share per rank, or set "
                       "micro_batch_size to a number to try it anyway");
  };
  size_t i = next_fitting(0);
  if (i == n) throw none_fits();
  while (true) {
    const int64_t b = cands[i];
    const double predicted = predict(b);
    const ProbeResult r = run(b, "confirm");
    if (!r.out_of_memory && r.peak_bytes + later_at(in.later, b) <= c.budget_bytes) {
      c.micro_batch = b;
      c.predicted_bytes = predicted;
      c.later_bytes = later_at(in.later, b);
      c.confirmed_bytes = r.peak_bytes + c.later_bytes;
      break;
    }
    if (r.out_of_memory) {
      smallest_oom = std::min(smallest_oom, b);
    } else {  // the peak bends upward: the line through the largest smaller size measured and this one
      int64_t x0 = 0;
      double y0 = 0;
      for (const auto& [s, m] : seen)
        if (s < b && !m.out_of_memory && s > x0) x0 = s, y0 = m.peak_bytes;
      if (x0 > 0) line_through(static_cast<double>(x0), y0, static_cast<double>(b), r.peak_bytes);
    }
    size_t next = next_fitting(i + 1);
    if (next == n) next = i + 1;  // no smaller prediction fits either: the next one is measured all the same
    if (next >= n) throw none_fits();
    i = next;
  }
  c.accumulation = in.global_batch / (c.micro_batch * in.world_size);
  if (i > 0) c.larger = cands[i - 1], c.larger_predicted_bytes = predict(c.larger);
  return c;
}

int64_t agree_on_smallest(const std::vector<std::string>& per_rank) {
  int64_t smallest = 0;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    const std::string& v = per_rank[r];
    if (!v.empty() && v[0] == '!') throw ConfigError("rank " + std::to_string(r) + ": " + v.substr(1));
    const int64_t b = std::stoll(v);
    if (smallest == 0 || b < smallest) smallest = b;
  }
  if (smallest <= 0) throw ConfigError("trainer.micro_batch_size auto: no rank's choice to agree on");
  return smallest;
}

std::string MicroBatchChoice::text(const MicroBatchInput& in) const {
  std::string s = "trainer.micro_batch_size auto: " + std::to_string(micro_batch) + " of candidates " +
                  list_text(candidates, 8) + " (global batch " + std::to_string(in.global_batch) + " = " +
                  std::to_string(micro_batch) + " x accumulation " + std::to_string(accumulation) + " x " +
                  std::to_string(in.world_size) + (in.world_size == 1 ? " rank" : " ranks") + "); predicted peak " +
                  gb_text(predicted_bytes) + ", measured " + gb_text(confirmed_bytes) + " of " +
                  gb_text(budget_bytes) + " (" + gb_text(in.capacity_bytes) + " less " +
                  std::to_string(static_cast<int>(in.headroom * 100.0 + 0.5)) + "% headroom; probes";
  const char* sep = " at ";
  for (const auto& p : probes) {
    s += sep + std::to_string(p.micro_batch) + ": " +
         (p.result.out_of_memory ? std::string("out of memory") : gb_text(p.result.peak_bytes));
    sep = ", ";
  }
  s += fitted ? "; line " + gb_text(intercept_bytes) + " + " + gb_text(per_sample_bytes) + " per sample"
              : std::string("; proportional to the one size measured");
  for (const auto& t : in.later) s += "; " + t.name + " " + gb_text(t.at(micro_batch));  // at the chosen size
  s += ")";
  if (!in.limit.empty()) s += "; at most " + std::to_string(in.max_micro_batch) + ": " + in.limit;
  if (larger > 0) {
    const ProbeRecord* p = larger_probe();
    s += "; " + std::to_string(larger) +
         (p == nullptr              ? " predicted " + gb_text(larger_predicted_bytes)
          : p->result.out_of_memory ? std::string(" ran out of memory in its probe")
                                    : " measured " + gb_text(p->result.peak_bytes + later_at(in.later, larger)));
  }
  return s;
}

nlohmann::json MicroBatchChoice::to_json(const MicroBatchInput& in) const {
  nlohmann::json probes_json = nlohmann::json::array();
  for (const auto& p : probes)
    probes_json.push_back({{"micro_batch", p.micro_batch},
                           {"purpose", p.purpose},
                           {"out_of_memory", p.result.out_of_memory},
                           {"peak_gb", p.result.out_of_memory ? nlohmann::json(nullptr)
                                                              : nlohmann::json(p.result.peak_bytes / kGiB)}});
  nlohmann::json later_json = nlohmann::json::array();
  for (const auto& t : in.later)  // gb: at the chosen micro-batch, = fixed_gb + per_sample_gb x micro_batch
    later_json.push_back({{"name", t.name},
                          {"gb", t.at(micro_batch) / kGiB},
                          {"fixed_gb", t.bytes / kGiB},
                          {"per_sample_gb", t.per_sample_bytes / kGiB}});
  nlohmann::json j = {{"micro_batch", micro_batch},
                      {"source", "probed"},
                      {"candidates", candidates},
                      {"global_batch", in.global_batch},
                      {"accumulation", accumulation},
                      {"world_size", in.world_size},
                      {"probes", probes_json},
                      {"fitted", fitted},
                      {"intercept_gb", intercept_bytes / kGiB},
                      {"per_sample_gb", per_sample_bytes / kGiB},
                      {"later", later_json},
                      {"capacity_gb", in.capacity_bytes / kGiB},
                      {"headroom", in.headroom},
                      {"budget_gb", budget_bytes / kGiB},
                      {"predicted_gb", predicted_bytes / kGiB},
                      {"measured_gb", confirmed_bytes / kGiB}};
  if (larger > 0) j["larger"] = {{"micro_batch", larger}, {"predicted_gb", larger_predicted_bytes / kGiB}};
  if (!in.limit.empty()) j["limit"] = {{"micro_batch", in.max_micro_batch}, {"why", in.limit}};
  return j;
}

}  // namespace loongforge::trainer
