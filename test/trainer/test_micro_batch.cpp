// Proves trainer.micro_batch_size: auto's choosing (micro_batch.hpp, Note
// [Choosing the micro-batch]) on the CPU with fake probes: the candidates are
// exactly the divisors of the global batch per rank within the keys' ranges,
// largest first; a linear peak gives the largest candidate under the budget
// after two fit probes and one confirmation; a confirmation that runs out of
// memory or measures over the budget steps down; one candidate, many
// divisors and probes that run out of memory at small sizes are handled; a
// term that grows per sample (the data source's micro-batches) is evaluated
// at each candidate, in the prediction and in the confirmation, and can turn
// a candidate that fits without it away; the data source's terms come out of
// their numbers as Note [The data's device memory] says; the log line and the
// JSON say what was chosen and why, each term at the chosen size. The probes
// on a real GPU are e2e_micro_batch_auto_gpu's.
#include <cmath>    // std::fabs
#include <set>      // std::set
#include <string>   // std::string
#include <vector>   // std::vector

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/trainer/micro_batch.hpp"

using namespace loongforge;
using namespace loongforge::trainer;
using lf_catch::Contains;

namespace {

// A device of `capacity_gb` whose step needs peak(B) GB; a probe past the capacity runs out of memory.
struct FakeDevice {
  double capacity_gb = 80.0;
  std::function<double(int64_t)> peak_gb;
  std::vector<int64_t> asked;  // every size probed, in order
  Probe probe() {
    return [this](int64_t b) {
      asked.push_back(b);
      const double gb = peak_gb(b);
      if (gb > capacity_gb) return ProbeResult{true, 0};
      return ProbeResult{false, gb * kGiB};
    };
  }
};

MicroBatchInput input(int64_t global_batch, int64_t world, double capacity_gb, double later_gb) {
  MicroBatchInput in;
  in.global_batch = global_batch;
  in.world_size = world;
  in.capacity_bytes = capacity_gb * kGiB;
  if (later_gb > 0) in.later = {{"optimizer moments", later_gb * kGiB}};
  return in;
}

}  // namespace

TEST_CASE("micro_batch: the candidates are the divisors of the global batch per rank, largest first") {
  REQUIRE(candidates(384, 1) == std::vector<int64_t>{384, 192, 128, 96, 64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1});
  REQUIRE(candidates(384, 4) == std::vector<int64_t>{96, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2, 1});
  REQUIRE(candidates(36, 1) == std::vector<int64_t>{36, 18, 12, 9, 6, 4, 3, 2, 1});  // a square: 6 once
  REQUIRE(candidates(7, 1) == std::vector<int64_t>{7, 1});
  // Within the keys' ranges: a micro-batch of at most 65536, an accumulation of at most 65536.
  REQUIRE(candidates(131072, 1).front() == 65536);
  REQUIRE(candidates(131072, 1).back() == 2);
  REQUIRE(candidates(384, 1, /*max_micro_batch=*/100, /*max_accumulation=*/100) ==
          std::vector<int64_t>{96, 64, 48, 32, 24, 16, 12, 8, 6, 4});
  // No equal share per rank: none.
  REQUIRE(candidates(10, 3).empty());
  REQUIRE(candidates(0, 1).empty());
}

TEST_CASE("micro_batch: a linear peak gives the largest candidate under the budget after two fits and one confirmation") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 2.0 + 0.5 * static_cast<double>(b); };
  const MicroBatchInput in = input(384, 1, 80.0, 9.6);
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  // budget 72 GB: 2 + 0.5 B + 9.6 <= 72 for B <= 120, so 96 (128 would need 75.6 GB).
  REQUIRE(c.micro_batch == 96);
  REQUIRE(c.accumulation == 4);
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16, 96});
  REQUIRE(c.fitted);
  REQUIRE(std::fabs(c.intercept_bytes / kGiB - 2.0) < 1e-9);
  REQUIRE(std::fabs(c.per_sample_bytes / kGiB - 0.5) < 1e-9);
  REQUIRE(std::fabs(c.budget_bytes / kGiB - 72.0) < 1e-9);
  REQUIRE(std::fabs(c.predicted_bytes / kGiB - 59.6) < 1e-9);
  REQUIRE(std::fabs(c.confirmed_bytes / kGiB - 59.6) < 1e-9);
  REQUIRE(c.larger == 128);
  REQUIRE(std::fabs(c.larger_predicted_bytes / kGiB - 75.6) < 1e-9);
  REQUIRE(c.text(in) ==
          "trainer.micro_batch_size auto: 96 of candidates 384, 192, 128, 96, 64, 48, 32, 24, ... (16 in all) (global "
          "batch 384 = 96 x accumulation 4 x 1 rank); predicted peak 59.6 GB, measured 59.6 GB of 72.0 GB (80.0 GB "
          "less 10% headroom; probes at 8: 6.0 GB, 16: 10.0 GB, 96: 50.0 GB; line 2.0 GB + 512 MB per sample; "
          "optimizer moments 9.6 GB); 128 predicted 75.6 GB");
  const nlohmann::json j = c.to_json(in);
  REQUIRE(j.at("micro_batch") == 96);
  REQUIRE(j.at("accumulation") == 4);
  REQUIRE(j.at("source") == "probed");
  REQUIRE(j.at("probes").size() == 3);
  REQUIRE(j.at("probes").at(2).at("purpose") == "confirm");
  REQUIRE(j.at("larger").at("micro_batch") == 128);
}

TEST_CASE("micro_batch: a confirmation that runs out of memory steps down past every larger size") {
  FakeDevice dev;
  // Linear up to 48, then a cliff: anything of 64 or more runs out of memory.
  dev.peak_gb = [](int64_t b) { return b >= 64 ? 1e9 : 2.0 + 0.5 * static_cast<double>(b); };
  const MicroBatchInput in = input(384, 1, 80.0, 9.6);
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  // 96 and then 64 are predicted to fit and run out of memory; 48 fits. Nothing above 96 is tried after it.
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16, 96, 64, 48});
  REQUIRE(c.micro_batch == 48);
  REQUIRE(c.accumulation == 8);
  REQUIRE(c.larger == 64);
  REQUIRE_THAT(c.text(in), Contains("probes at 8: 6.0 GB, 16: 10.0 GB, 96: out of memory, 64: out of memory, "
                                    "48: 26.0 GB"));
  REQUIRE_THAT(c.text(in), Contains("; 64 ran out of memory in its probe"));
}

TEST_CASE("micro_batch: a peak that bends upward is caught by the confirmation, which redraws the line and steps down") {
  FakeDevice dev;
  dev.capacity_gb = 1000.0;  // never out of memory: only the budget decides
  dev.peak_gb = [](int64_t b) {
    const double x = static_cast<double>(b);
    return 2.0 + 0.5 * x + 0.004 * x * x;
  };
  MicroBatchInput in = input(384, 1, 80.0, 9.6);
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  // The line through 8 and 16 predicts 68.0 GB at 96 (fits); 96 measures 86.9 + 9.6 GB (over); the line
  // through 16 and 96 predicts 66.1 GB at 64, which measures 50.4 + 9.6 = 60.0 GB: taken.
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16, 96, 64});
  REQUIRE(c.micro_batch == 64);
  REQUIRE(c.accumulation == 6);
  REQUIRE(c.confirmed_bytes <= c.budget_bytes);
  REQUIRE(c.larger == 96);
  REQUIRE(c.larger_probe() != nullptr);
  REQUIRE_THAT(c.text(in), Contains("; 96 measured 96.5 GB"));
}

TEST_CASE("micro_batch: a single candidate is measured once and taken when it fits") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 10.0 + static_cast<double>(b); };
  const MicroBatchInput in = input(4, 4, 80.0, 0.0);  // one sample per rank: candidates {1}
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  REQUIRE(c.candidates == std::vector<int64_t>{1});
  REQUIRE(dev.asked == std::vector<int64_t>{1});
  REQUIRE(c.micro_batch == 1);
  REQUIRE(c.accumulation == 1);
  REQUIRE(c.larger == 0);
  REQUIRE(!c.fitted);
  REQUIRE_THAT(c.text(in), Contains("(global batch 4 = 1 x accumulation 1 x 4 ranks)"));
}

TEST_CASE("micro_batch: a global batch per rank with many divisors needs only a few probes") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 1.0 + 0.001 * static_cast<double>(b); };
  const MicroBatchInput in = input(720720, 2, 80.0, 5.0);  // 360360 per rank: 192 divisors, 65536 at most
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  // 1 + 0.001 B + 5 <= 72: B <= 66000, so the largest divisor of 360360 within 65536.
  int64_t want = 0;
  for (int64_t b = 65536; b >= 1 && want == 0; --b)
    if (360360 % b == 0) want = b;
  REQUIRE(c.micro_batch == want);
  REQUIRE(360360 % c.micro_batch == 0);
  REQUIRE(c.accumulation * c.micro_batch * 2 == 720720);
  REQUIRE(dev.asked.size() == 3);
  REQUIRE_THAT(c.text(in), Contains("in all)"));
}

TEST_CASE("micro_batch: a fit probe that runs out of memory halves down and predicts proportionally") {
  FakeDevice dev;
  dev.capacity_gb = 20.0;
  dev.peak_gb = [](int64_t b) { return 4.0 + 2.0 * static_cast<double>(b); };  // 8 needs 20: fits; 16 does not
  const MicroBatchInput in = input(64, 1, 20.0, 0.0);
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  // Only 8 measured (20 GB, over the 18 GB budget): proportionally 2.5 GB per sample, so 4 (10 GB predicted),
  // measured at 12 GB.
  REQUIRE(!c.fitted);
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16, 4});
  REQUIRE(c.micro_batch == 4);
  REQUIRE(c.accumulation == 16);

  FakeDevice tight;
  tight.capacity_gb = 9.0;
  tight.peak_gb = [](int64_t b) { return 4.0 + 2.0 * static_cast<double>(b); };  // 8 and 4 run out; 2 fits
  const MicroBatchChoice t = choose_micro_batch(input(64, 1, 9.0, 0.0), tight.probe());
  // Halved to 2 (8 GB, under the 8.1 GB budget), which is then its own confirmation.
  REQUIRE(tight.asked == std::vector<int64_t>{8, 4, 2});
  REQUIRE(t.micro_batch == 2);
  REQUIRE(t.accumulation == 32);
}

TEST_CASE("micro_batch: when not even one sample fits, the error says so and names what to change") {
  FakeDevice dev;
  dev.capacity_gb = 1.0;
  dev.peak_gb = [](int64_t) { return 5.0; };
  REQUIRE_THROWS_WITH(choose_micro_batch(input(64, 1, 1.0, 0.0), dev.probe()),
                      Contains("trainer.micro_batch_size auto: a forward+backward of one sample runs out of device "
                               "memory (1.0 GB usable)"));
  REQUIRE(dev.asked == std::vector<int64_t>{8, 4, 2, 1});
}

TEST_CASE("micro_batch: when the smallest candidate is predicted over the budget, the error gives the numbers and fixes") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 10.0 + 0.1 * static_cast<double>(b); };
  // 70 GB of optimizer state leave less than the model's 10 GB in a 72 GB budget.
  REQUIRE_THROWS_WITH(choose_micro_batch(input(64, 1, 80.0, 70.0), dev.probe()),
                      Contains("trainer.micro_batch_size auto: no candidate fits: the smallest, 1, is predicted at "
                               "80.1 GB (the probe's peak plus optimizer moments 70.0 GB) against the 72.0 GB budget "
                               "(80.0 GB less 10% headroom"));
}

TEST_CASE("micro_batch: no candidate without an equal share per rank is an error naming the keys") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t) { return 1.0; };
  REQUIRE_THROWS_WITH(choose_micro_batch(input(10, 3, 80.0, 0.0), dev.probe()),
                      Contains("no micro-batch keeps trainer.global_batch_size 10 on 3 rank(s)"));
  REQUIRE(dev.asked.empty());
}

TEST_CASE("micro_batch: every size is probed at most once, even when the confirmation is a fit size") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 2.0 + static_cast<double>(b); };
  const MicroBatchChoice c = choose_micro_batch(input(16, 1, 80.0, 0.0), dev.probe());
  REQUIRE(c.micro_batch == 16);
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16});
  std::set<int64_t> distinct(dev.asked.begin(), dev.asked.end());
  REQUIRE(distinct.size() == dev.asked.size());
}

// Several ranks exchange their choices host to host (World::all_gather_on_hosts, tested in test/comm); what
// they make of them is this function. Only one rank trains with auto in the trainer tests (plumbing).
TEST_CASE("micro_batch: the ranks agree on the smallest choice, and one rank's failure stops every rank naming it") {
  REQUIRE(agree_on_smallest({"96"}) == 96);
  REQUIRE(agree_on_smallest({"96", "64", "128", "96"}) == 64);
  REQUIRE_THROWS_WITH(agree_on_smallest({"96", "!trainer.micro_batch_size auto: no candidate fits", "64"}),
                      Contains("rank 1: trainer.micro_batch_size auto: no candidate fits"));
}

TEST_CASE("micro_batch: a term per sample is evaluated at each candidate and turns away one that fits without it") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 2.0 + 0.5 * static_cast<double>(b); };
  // Without the per-sample term 96 is chosen (the linear-peak case above); with 0.2 GB a sample more,
  // 96 needs 59.6 + 19.2 = 78.8 GB of the 72 GB budget and 64 needs 2 + 32 + 9.6 + 12.8 = 56.4 GB.
  MicroBatchInput in = input(384, 1, 80.0, 9.6);
  REQUIRE(choose_micro_batch(in, dev.probe()).micro_batch == 96);
  in.later.push_back({"ADFE's ready micro-batches (prefetch_factor 4 + 1)", 0.0, 0.2 * kGiB});
  dev.asked.clear();
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  REQUIRE(c.micro_batch == 64);
  REQUIRE(c.accumulation == 6);
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16, 64});  // 96 is never probed: its prediction is over
  REQUIRE(std::fabs(c.later_bytes / kGiB - (9.6 + 12.8)) < 1e-9);
  REQUIRE(std::fabs(c.predicted_bytes / kGiB - 56.4) < 1e-9);
  REQUIRE(std::fabs(c.confirmed_bytes / kGiB - 56.4) < 1e-9);
  REQUIRE(c.larger == 96);
  REQUIRE(std::fabs(c.larger_predicted_bytes / kGiB - 78.8) < 1e-9);
  // The text gives each term at the chosen micro-batch; the JSON also its two parts.
  REQUIRE_THAT(c.text(in), Contains("; optimizer moments 9.6 GB; ADFE's ready micro-batches (prefetch_factor 4 + 1) "
                                    "12.8 GB); 96 predicted 78.8 GB"));
  const nlohmann::json later = c.to_json(in).at("later");
  REQUIRE(later.size() == 2);
  REQUIRE(later.at(0).at("name") == "optimizer moments");
  REQUIRE(std::fabs(later.at(0).at("gb").get<double>() - 9.6) < 1e-9);
  REQUIRE(std::fabs(later.at(0).at("fixed_gb").get<double>() - 9.6) < 1e-9);
  REQUIRE(later.at(0).at("per_sample_gb").get<double>() == 0.0);
  REQUIRE(later.at(1).at("name") == "ADFE's ready micro-batches (prefetch_factor 4 + 1)");
  REQUIRE(std::fabs(later.at(1).at("gb").get<double>() - 12.8) < 1e-9);
  REQUIRE(later.at(1).at("fixed_gb").get<double>() == 0.0);
  REQUIRE(std::fabs(later.at(1).at("per_sample_gb").get<double>() - 0.2) < 1e-9);
  // What the GPU test recomputes: the line plus every term's two parts at the chosen size is the prediction.
  const nlohmann::json j = c.to_json(in);
  double predicted = j.at("intercept_gb").get<double>() + j.at("per_sample_gb").get<double>() * 64;
  for (const auto& t : later) predicted += t.at("fixed_gb").get<double>() + t.at("per_sample_gb").get<double>() * 64;
  REQUIRE(std::fabs(predicted - j.at("predicted_gb").get<double>()) < 1e-9);
}

TEST_CASE("micro_batch: a confirmation adds the per-sample terms at its size and steps down when they push it over") {
  FakeDevice dev;
  // The line through 8 and 16 (0.5 GB a sample) under-predicts 96, which measures 55 GB: with 9.6 GB fixed
  // and 0.1 GB a sample, 96 is predicted at 50 + 9.6 + 9.6 = 69.2 GB (fits) but confirmed at 55 + 19.2 =
  // 74.2 GB (over); the line through 16 and 96 then predicts 64 at 37 + 9.6 + 6.4 = 53 GB, which it measures.
  dev.peak_gb = [](int64_t b) {
    const double x = static_cast<double>(b);
    return b <= 16 ? 2.0 + 0.5 * x : 1.0 + 0.5625 * x;
  };
  MicroBatchInput in = input(384, 1, 80.0, 9.6);
  in.later.push_back({"frames before the device resize", 0.0, 0.1 * kGiB});
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  REQUIRE(dev.asked == std::vector<int64_t>{8, 16, 96, 64});
  REQUIRE(c.micro_batch == 64);
  REQUIRE(std::fabs(c.confirmed_bytes / kGiB - 53.0) < 1e-9);
  REQUIRE_THAT(c.text(in), Contains("; frames before the device resize 6.4 GB); 96 measured 74.2 GB"));
  // Without the term 96's confirmation (55 + 9.6 GB) fits.
  in.later.pop_back();
  dev.asked.clear();
  REQUIRE(choose_micro_batch(in, dev.probe()).micro_batch == 96);
}

TEST_CASE("micro_batch: the smallest candidate's error gives the per-sample terms at its size") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 10.0 + 0.1 * static_cast<double>(b); };
  MicroBatchInput in = input(64, 1, 80.0, 70.0);
  in.later.push_back({"ADFE's ready micro-batches (prefetch_factor 4 + 1)", 0.0, 0.5 * kGiB});
  REQUIRE_THROWS_WITH(choose_micro_batch(in, dev.probe()),
                      Contains("the smallest, 1, is predicted at 80.6 GB (the probe's peak plus optimizer moments "
                               "70.0 GB, ADFE's ready micro-batches (prefetch_factor 4 + 1) 512 MB)"));
}

TEST_CASE("micro_batch: the data's terms: the step's samples, ADFE's queue plus one, the frames before the resize") {
  // n16-tiny's sample on the bundled dataset: 61,996 bytes as the model takes it (a 3 x 64 x 64 float view
  // and the rest), 196,608 bytes of a 256 x 256 x 3 uint8 camera frame before the device resize.
  DataMemory d;
  d.step_samples = 256, d.sample_bytes = 61996.0, d.adfe = true, d.prefetch_factor = 4, d.frame_bytes = 196608.0;
  const std::vector<MemoryTerm> adfe = data_terms(d);
  REQUIRE(adfe.size() == 3);
  REQUIRE(adfe[0].name == "the step's micro-batches");
  REQUIRE(adfe[0].bytes == 256.0 * 61996.0);
  REQUIRE(adfe[0].per_sample_bytes == 0.0);
  REQUIRE(adfe[1].name == "ADFE's ready micro-batches (prefetch_factor 4 + 1)");
  REQUIRE(adfe[1].bytes == 0.0);
  REQUIRE(adfe[1].per_sample_bytes == 5.0 * 61996.0);
  REQUIRE(adfe[2].name == "frames before the device resize");
  REQUIRE(adfe[2].per_sample_bytes == 196608.0);
  // At 128 samples (the H100 run of docs/benchmarks.md, 2026-12-07): 15 + 38 + 24 MB, about 62 MB more than the
  // step's micro-batches alone.
  REQUIRE(gb_text(adfe[0].at(128)) == "15 MB");
  REQUIRE(gb_text(adfe[1].at(128)) == "38 MB");
  REQUIRE(gb_text(adfe[2].at(128)) == "24 MB");
  REQUIRE(gb_text(later_at(adfe, 128) - adfe[0].at(128)) == "62 MB");
  // Frames resized on the CPU: no frames term; the plain source: the step's micro-batches only.
  d.frame_bytes = 0;
  REQUIRE(data_terms(d).size() == 2);
  d.adfe = false, d.frame_bytes = 196608.0;
  const std::vector<MemoryTerm> plain = data_terms(d);
  REQUIRE(plain.size() == 1);
  REQUIRE(plain[0].name == "the step's micro-batches");
  REQUIRE(later_at(plain, 1) == later_at(plain, 4096));  // nothing of it grows with the micro-batch
}

TEST_CASE("micro_batch: a cap below the key's range (ADFE's staging slot) bounds the candidates and is named") {
  FakeDevice dev;
  dev.peak_gb = [](int64_t b) { return 2.0 + 0.01 * static_cast<double>(b); };
  MicroBatchInput in = input(384, 1, 80.0, 0.0);
  in.max_micro_batch = 100;
  in.limit =
      "one ADFE staging slot (adfe.slot_mb 64 MB) holds 100 samples as staged (655 kB each); raise adfe.slot_mb for "
      "larger micro-batches";
  const MicroBatchChoice c = choose_micro_batch(in, dev.probe());
  REQUIRE(c.candidates.front() == 96);
  REQUIRE(c.micro_batch == 96);  // everything fits the device: the cap decides
  REQUIRE_THAT(c.text(in),
               Contains("; at most 100: one ADFE staging slot (adfe.slot_mb 64 MB) holds 100 samples as staged"));
  REQUIRE(c.to_json(in).at("limit").at("micro_batch") == 100);
}
