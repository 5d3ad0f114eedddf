// Proves the synchronous data path: the C++ shard reader finds what the
// converter wrote and refuses corrupt shards; the sample order is the
// documented SplitMix64 permutation, cut into global batches of B x K x W
// with block position q = i*B*W + b*W + r; a step's samples and each sample's
// flow-matching draws are the same for every split of G = 8 into B x K x W;
// the counts a micro-batch carries equal its tensors' sums; samples are built as
// docs/training-semantics.md says (episode-end padding and masks, min-max
// normalization, task tokens); and the frame paired with row t is the one the
// timestamps say, checked against an independent decode by the ffmpeg CLI.
#include <algorithm>   // std::sort, std::upper_bound
#include <cmath>       // std::fabs
#include <cstdio>      // popen
#include <fstream>     // std::fstream
#include <map>         // std::map
#include <set>         // std::set
#include <tuple>       // std::tuple
#include <vector>      // std::vector

#include <ATen/ATen.h>  // at::Tensor

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/video.hpp"

using namespace loongforge;
using namespace loongforge::data;
using lf_catch::Contains;

namespace {
const std::string kData = LOONGFORGE_TEST_DATASET;

SampleOptions tiny_options() {
  SampleOptions o;
  o.micro_batch_size = 4;
  o.image_size = 64;
  return o;
}

// A private copy of the converted dataset that a test may damage.
std::string copy_dataset(const std::string& name) {
  const std::string dst = std::string(LOONGFORGE_TEST_MODELS) + "/" + name;
  remove_tree(dst);
  copy_tree(kData, dst);
  return dst;
}
}  // namespace

TEST_CASE("data: crc32 matches the check value of the format doc") {
  REQUIRE(crc32("123456789", 9) == 0xCBF43926u);
}

TEST_CASE("data: the converted PickNPlace dataset opens with its episodes, columns and tasks") {
  const Dataset ds = Dataset::open(kData);
  REQUIRE(ds.episodes().size() == 5);
  REQUIRE(ds.total_rows() == 2096);
  REQUIRE(ds.episodes()[0].length == 416);
  const int state = ds.column_by_role("state");
  REQUIRE(state >= 0);
  const ArrayView v = ds.array(0, state);
  REQUIRE(v.rows == 416);
  REQUIRE(v.width == 44);
  REQUIRE(ds.cameras().size() == 1);
  REQUIRE(ds.tasks().at(0).text == "pick the squash from the counter and place it in the plate");
}

TEST_CASE("data: a flipped byte inside an episode record is refused with the shard and episode") {
  const std::string dir = copy_dataset("flipped");
  const std::string shard = dir + "/shard-00000.lfshard";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(5000);
    f.write(&c, 1);
  }
  const Dataset ds = Dataset::open(dir);  // header, column table and index are intact
  REQUIRE_THROWS_WITH(ds.array(0, 0), Contains(shard + ": episode 0: record CRC32 mismatch"));
}

TEST_CASE("data: a truncated shard is refused when the dataset opens") {
  const std::string dir = copy_dataset("truncated");
  resize_file(dir + "/shard-00000.lfshard", 100000);
  REQUIRE_THROWS_WITH(Dataset::open(dir), Contains("shard-00000.lfshard: header says 912672 bytes, file has 100000"));
}

TEST_CASE("data: a folder that is not a converted dataset says how to make one") {
  REQUIRE_THROWS_WITH(Dataset::open("/tmp"), Contains("is '/tmp' a dataset written by scripts/convert_lerobot.py?"));
}

TEST_CASE("data: the epoch permutation is a deterministic SplitMix64 Fisher-Yates shuffle") {
  const auto a = epoch_permutation(2096, 42, 0);
  const auto b = epoch_permutation(2096, 42, 0);
  const auto c = epoch_permutation(2096, 42, 1);
  REQUIRE(a == b);
  REQUIRE(a != c);
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 2096; ++i) REQUIRE(sorted[i] == i);
  // Hand-checkable: n = 3, seed 0, epoch 0 (SplitMix64 outputs of state
  // 0x9E3779B97F4A7C15 and twice that: 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4).
  // i=2: j = 0xE220A8397B1DCDAF % 3 = 1 -> [0,2,1]; i=1: j = 0x6E789E6AA1B965F4 % 2 = 0 -> [2,0,1].
  REQUIRE(epoch_permutation(3, 0, 0) == std::vector<int64_t>{2, 0, 1});
}

TEST_CASE("data: with K = 1 a step's global batch is split over the ranks interleaved") {
  Sampler r0(2096, 42, true, 0, 2, 8, 1), r1(2096, 42, true, 1, 2, 8, 1);
  REQUIRE(r0.steps_per_epoch() == 2096 / 16);
  const auto perm = epoch_permutation(2096, 42, 0);
  const auto b0 = r0.micro_batch(0, 0), b1 = r1.micro_batch(0, 0);
  for (int k = 0; k < 8; ++k) {
    REQUIRE(b0[k] == perm[2 * k]);
    REQUIRE(b1[k] == perm[2 * k + 1]);
  }
  // Step 131 is the first of epoch 1.
  REQUIRE(r0.epoch_of_step(130) == 0);
  REQUIRE(r0.epoch_of_step(131) == 1);
  REQUIRE(r0.micro_batch(131, 0)[0] == epoch_permutation(2096, 42, 1)[0]);
}

TEST_CASE("data: micro-batch i of rank r takes block positions i*B*W + b*W + r of its step") {
  // B = 4, K = 3, W = 2: G = 24, T = 2096 / 24 = 87 steps per epoch.
  const auto e0 = epoch_permutation(2096, 42, 0), e1 = epoch_permutation(2096, 42, 1);
  for (int64_t r = 0; r < 2; ++r) {
    Sampler s(2096, 42, true, r, 2, 4, 3);
    REQUIRE(s.steps_per_epoch() == 87);
    REQUIRE(s.global_batch() == 24);
    const auto ids = s.micro_batch(5, 2);
    REQUIRE(ids.size() == 4);
    for (int64_t b = 0; b < 4; ++b) {
      REQUIRE(ids[b] == e0[5 * 24 + 2 * 8 + b * 2 + r]);
      REQUIRE(s.stream_position(5, 2, b) == 5 * 24 + 2 * 8 + b * 2 + r);
    }
    REQUIRE(s.micro_batch(87, 1)[3] == e1[8 + 3 * 2 + r]);  // step 87 opens epoch 1
    REQUIRE(s.stream_position(87, 1, 3) == 87 * 24 + 8 + 3 * 2 + r);
  }
  // Without shuffling the blocks are consecutive sample ids.
  Sampler plain(2096, 42, false, 1, 2, 4, 3);
  REQUIRE(plain.micro_batch(1, 0) == std::vector<int64_t>{25, 27, 29, 31});
}

TEST_CASE("data: a dataset smaller than one global batch is refused naming N and G = B x K x W") {
  REQUIRE_THROWS_WITH(
      Sampler(10, 42, true, 0, 2, 4, 2),
      Contains("the dataset has 10 samples, fewer than one global batch G = B x K x W = 4 x 2 x 2 = 16") &&
          Contains("lower trainer.micro_batch_size or trainer.gradient_accumulation_steps, or use "
                   "fewer ranks"));
}

TEST_CASE("data: every split of G = 8 into B x K x W gives each step the same samples with the same draws") {
  const Dataset ds = Dataset::open(kData);
  // sample id -> (stream position, fm_t, fm_noise) over all ranks and micro-batches of a step.
  using Draws = std::map<int64_t, std::tuple<int64_t, at::Tensor, at::Tensor>>;
  auto step_draws = [&](int64_t B, int64_t K, int64_t W, int64_t step) {
    Draws out;
    for (int64_t r = 0; r < W; ++r) {
      SampleOptions o = tiny_options();
      o.micro_batch_size = B, o.accumulation = K, o.world = W, o.rank = r;
      BatchBuilder builder(ds, o);
      Sampler sampler(ds.total_rows(), o.seed, o.shuffle, r, W, B, K);  // the builder's order
      for (int64_t i = 0; i < K; ++i) {
        MicroBatch mb = builder.micro_batch(step, i);
        const auto ids = sampler.micro_batch(step, i);
        for (int64_t b = 0; b < B; ++b) {
          REQUIRE(out.count(ids[b]) == 0);
          out[ids[b]] = std::make_tuple(builder.sampler().stream_position(step, i, b),
                                        mb.tensors["fm_t"][b].clone(), mb.tensors["fm_noise"][b].clone());
        }
      }
    }
    return out;
  };
  const auto perm1 = epoch_permutation(2096, 42, 1);
  for (int64_t step : {0, 263}) {  // 263 = step 1 of epoch 1 (T = 262)
    const Draws ref = step_draws(8, 1, 1, step);
    REQUIRE(ref.size() == 8);
    const std::vector<std::tuple<int64_t, int64_t, int64_t>> splits = {{4, 2, 1}, {4, 1, 2}, {2, 2, 2}};
    for (const auto& split : splits) {
      const auto [B, K, W] = split;
      INFO("B x K x W = " << B << " x " << K << " x " << W << ", step " << step);
      const Draws got = step_draws(B, K, W, step);
      REQUIRE(got.size() == ref.size());
      for (const auto& [id, d] : ref) {
        REQUIRE(got.count(id) == 1);
        const auto& g = got.at(id);
        REQUIRE(std::get<0>(g) == std::get<0>(d));
        REQUIRE(at::equal(std::get<1>(g), std::get<1>(d)));
        REQUIRE(at::equal(std::get<2>(g), std::get<2>(d)));
      }
    }
    if (step == 263)
      for (int64_t q = 0; q < 8; ++q) REQUIRE(ref.count(perm1[8 + q]) == 1);
  }
}

TEST_CASE("data: a sample's draws come from a generator seeded with seed * 1000003 + its stream position") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.accumulation = 2, o.world = 2, o.rank = 1;
  BatchBuilder builder(ds, o);
  MicroBatch mb = builder.micro_batch(3, 1);
  const int64_t p = 3 * 16 + 1 * 8 + 2 * 2 + 1;  // slot b = 2
  REQUIRE(builder.sampler().stream_position(3, 1, 2) == p);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42ull * 1000003ull + static_cast<uint64_t>(p));
  const at::Tensor u = at::rand({1}, gen, at::kFloat);
  REQUIRE(mb.tensors["fm_t"][2].item<float>() ==
          at::div(at::rsub(at::pow(u, 1.0 / 1.5), 0.999), 0.999).item<float>());
  REQUIRE(at::equal(mb.tensors["fm_noise"][2], at::randn({16, 64}, gen, at::kFloat)));
}

TEST_CASE("data: the episode order is a permutation, a pure function of its inputs, read few episodes at a time") {
  const std::vector<int64_t> lengths = {5, 0, 40, 17, 33, 8};
  const std::vector<int64_t> a = episode_order(lengths, 42, 3, 2, 6);
  REQUIRE(a == episode_order(lengths, 42, 3, 2, 6));
  REQUIRE(a != episode_order(lengths, 42, 4, 2, 6));
  REQUIRE(a != episode_order(lengths, 42, 3, 3, 6));
  std::vector<int64_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t k = 0; k < 103; ++k) REQUIRE(sorted[static_cast<size_t>(k)] == k);
  REQUIRE(sorted.size() == 103u);

  // On the bundled dataset (5 episodes of ~400 samples): the first 64 samples of the epoch come
  // from data.open_episodes = 2 episodes only; the uniform order touches every episode.
  const Dataset ds = Dataset::open(kData);
  std::vector<int64_t> first{0};
  for (const auto& e : ds.episodes()) first.push_back(first.back() + e.length);
  auto episodes_in_first_64 = [&](SampleOptions o) {
    BatchBuilder builder(ds, o);
    Sampler sampler = builder.sampler();
    std::set<int64_t> seen;
    for (int64_t step = 0; step < 16; ++step)
      for (const int64_t id : sampler.micro_batch(step, 0))
        seen.insert(std::upper_bound(first.begin(), first.end(), id) - first.begin() - 1);
    return seen.size();
  };
  SampleOptions o = tiny_options();
  REQUIRE(episodes_in_first_64(o) == ds.episodes().size());
  o.sampler = "episode", o.open_episodes = 2, o.shuffle_buffer = 16;
  REQUIRE(episodes_in_first_64(o) == 2u);
}

TEST_CASE("data: the flow-matching time follows the model's form, noise_s and beta_alpha (fm_time upstream)") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.fm_time_upstream = true, o.noise_s = 0.99, o.beta_alpha = 2.0;
  BatchBuilder builder(ds, o);
  MicroBatch mb = builder.micro_batch(0, 0);
  const int64_t p = builder.sampler().stream_position(0, 0, 1);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(42ull * 1000003ull + static_cast<uint64_t>(p));
  const at::Tensor u = at::rand({1}, gen, at::kFloat);
  REQUIRE(mb.tensors["fm_t"][1].item<float>() == at::mul(at::rsub(at::pow(u, 0.5), 1.0), 0.99).item<float>());
  REQUIRE(mb.tensors["fm_t"].max().item<float>() < 0.99f);  // upstream's t stays below noise_s
}

TEST_CASE("data: a micro-batch's counts equal the sums of its masks, also at an episode end") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.shuffle = false, o.accumulation = 2;
  BatchBuilder builder(ds, o);
  // G = 8: step 51 holds samples 408..415, the last rows of episode 0 (L = 416).
  MicroBatch mb = builder.micro_batch(51, 1);  // samples 412..415: 4, 3, 2, 1 action rows
  REQUIRE(Sampler(2096, 42, false, 0, 1, 4, 2).micro_batch(51, 1) == std::vector<int64_t>{412, 413, 414, 415});
  REQUIRE(mb.num_valid == (4 + 3 + 2 + 1) * 44);
  REQUIRE(mb.action_tokens == 4 + 3 + 2 + 1);
  REQUIRE(mb.num_valid == mb.tensors["action_mask"].sum().item<int64_t>());
  REQUIRE(mb.action_tokens == mb.tensors["action_mask"].amax(2).sum().item<int64_t>());
  REQUIRE(mb.text_tokens == mb.tensors["text_mask"].sum().item<int64_t>());
  REQUIRE(mb.text_tokens > 0);
  MicroBatch full = builder.micro_batch(0, 0);
  REQUIRE(full.num_valid == 4 * 16 * 44);
  REQUIRE(full.action_tokens == 4 * 16);
}

TEST_CASE("data: actions past the episode end are zero and masked, real ones min-max normalized") {
  const Dataset ds = Dataset::open(kData);
  BatchBuilder builder(ds, tiny_options());
  const int64_t last_row_of_ep0 = 415;
  Batch b = builder.sample(last_row_of_ep0 - 2);  // rows 413, 414, 415 exist; 13 of 16 are padding
  const at::Tensor mask = b["action_mask"][0];     // (H, A)
  REQUIRE(mask.sum(1)[0].item<float>() == 44.0f);  // 44 real action dims
  REQUIRE(mask.sum(1)[2].item<float>() == 44.0f);
  REQUIRE(mask.sum(1)[3].item<float>() == 0.0f);
  REQUIRE(mask.narrow(1, 44, 20).sum().item<float>() == 0.0f);  // padded dims never valid
  REQUIRE(b["actions"][0].narrow(0, 3, 13).abs().sum().item<float>() == 0.0f);
  const at::Tensor a = b["actions"][0].narrow(0, 0, 3).narrow(1, 0, 44);
  REQUIRE(a.min().item<float>() >= -1.0f - 1e-6f);
  REQUIRE(a.max().item<float>() <= 1.0f + 1e-6f);
  // Value check against the raw shard: action[413][0] normalized by hand.
  const ArrayView raw = ds.array(0, ds.column_by_role("action"));
  const auto& st = ds.stats("action");
  const double expect = ((2.0 * (static_cast<double>(raw.as<float>()[413 * 44]) - st.min[0])) / (st.max[0] - st.min[0])) - 1.0;
  REQUIRE(b["actions"][0][0][0].item<float>() == static_cast<float>(expect));
}

TEST_CASE("data: mean_std normalization divides by the stats' std and zeroes constant values") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.normalization = "mean_std";
  BatchBuilder builder(ds, o);
  Batch b = builder.sample(7);
  const ArrayView raw = ds.array(0, ds.column_by_role("state"));
  const auto& st = ds.stats("observation.state");
  for (int64_t j = 0; j < 44; ++j) {
    const double x = raw.as<float>()[7 * 44 + j];
    const float expect = st.std[j] < 1e-8 ? 0.0f : static_cast<float>((x - st.mean[j]) / st.std[j]);
    REQUIRE(b["state"][0][j].item<float>() == expect);
  }
}

namespace {
// A processor record as scripts/gr00t_processor.py writes it for checkpoint statistics: the
// dataset's own min / max scaled about their middle by `shrink` (so clipping shows), two chunk
// rows, and action values 0..6 relative to state values 0..6.
ProcessorRecord n17_record(const Dataset& ds, double shrink, bool clip) {
  ProcessorRecord r;
  r.form = ProcessorForm::gr00t_n17, r.clip = clip, r.checkpoint_stats = true, r.embodiment_id = 5;
  r.embodiment_tag = "robot";
  const Stats& ss = ds.stats("observation.state");
  for (size_t j = 0; j < ss.min.size(); ++j) {
    const double mid = (ss.min[j] + ss.max[j]) / 2, half = (ss.max[j] - ss.min[j]) / 2 * shrink;
    r.state_min.push_back(static_cast<float>(mid - half)), r.state_max.push_back(static_cast<float>(mid + half));
  }
  r.action_rows = 2;
  for (int row = 0; row < 2; ++row)
    for (size_t j = 0; j < 44; ++j) {
      r.action_min.push_back(j < 7 ? -0.1f * static_cast<float>(row + 1) : r.state_min[j]);
      r.action_max.push_back(j < 7 ? 0.1f * static_cast<float>(row + 1) : r.state_max[j]);
    }
  for (int64_t j = 0; j < 44; ++j) r.state_index.push_back(j < 7 ? j : -1);
  return r;
}
}  // namespace

TEST_CASE("data: an N1.7 processor record normalizes in float32 from its statistics, relative and clipped") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.action_horizon = 2;
  o.processor = n17_record(ds, 0.5, /*clip=*/true);
  BatchBuilder builder(ds, o);
  Batch b = builder.sample(100);  // episode 0, row 100
  const ArrayView state = ds.array(0, ds.column_by_role("state"));
  const ArrayView action = ds.array(0, ds.column_by_role("action"));
  const float* s = state.as<float>() + 100 * 44;
  int64_t clipped = 0;
  for (int64_t j = 0; j < 44; ++j) {
    const float mn = o.processor.state_min[j], mx = o.processor.state_max[j];
    float want = (2.0f * (s[j] - mn)) / (mx - mn) - 1.0f;  // Note [N1.7 processor], by hand
    if (want > 1.0f || want < -1.0f) ++clipped;
    want = want > 1.0f ? 1.0f : (want < -1.0f ? -1.0f : want);
    if (mx == mn) want = 0.0f;
    REQUIRE(b["state"][0][j].item<float>() == want);
  }
  REQUIRE(clipped > 0);  // the halved range clips some of row 100's values
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t j = 0; j < 7; ++j) {  // relative: the action minus state value j, with row k's bounds
      const float x = action.as<float>()[(100 + k) * 44 + j] - s[j];
      const float mn = o.processor.action_min[k * 44 + j], mx = o.processor.action_max[k * 44 + j];
      float want = (2.0f * (x - mn)) / (mx - mn) - 1.0f;
      want = want > 1.0f ? 1.0f : (want < -1.0f ? -1.0f : want);
      REQUIRE(b["actions"][0][k][j].item<float>() == want);
    }
  REQUIRE(b["embodiment_id"][0].item<int64_t>() == 5);  // the record's slot, not data.embodiment_id
}

TEST_CASE("data: an N1.7 processor record that does not fit the dataset is refused naming both") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.model_path = "m.pt";
  o.processor = n17_record(ds, 1.0, true);
  o.processor.state_min.pop_back(), o.processor.state_max.pop_back();
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("the checkpoint's state statistics") &&
                                               Contains("have 43 values") && Contains("has 44") &&
                                               Contains("--embodiment-tag"));
  o.processor = n17_record(ds, 1.0, true);
  o.action_horizon = 16;  // more than the relative statistics' 2 rows
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("data.action_horizon=16 exceeds the 2 chunk rows"));
  o.action_horizon = 2, o.normalization = "mean_std";
  REQUIRE_THROWS_WITH(BatchBuilder(ds, o), Contains("data.normalization=mean_std"));
}

TEST_CASE("data: an N1.6 processor record normalizes as numpy does, float64 statistics and relative values") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.action_horizon = 2;
  o.processor = n17_record(ds, 0.5, /*clip=*/true);
  o.processor.form = ProcessorForm::gr00t_n16, o.processor.embodiment_id = 3;
  for (double& v : o.processor.state_max) v += 1.0 / 3.0;  // bounds that are not float32 values
  // A column whose range numpy's isclose calls empty (|max - min| <= 1e-8 + 1e-5 |min|): 0 in N1.6, not in N1.7.
  o.processor.state_min[10] = 1000.0, o.processor.state_max[10] = 1000.005;
  BatchBuilder builder(ds, o);
  Batch b = builder.sample(100);  // episode 0, row 100
  const ArrayView state = ds.array(0, ds.column_by_role("state"));
  const ArrayView action = ds.array(0, ds.column_by_role("action"));
  const float* s = state.as<float>() + 100 * 44;
  auto clip = [](double y) { return y > 1.0 ? 1.0 : (y < -1.0 ? -1.0 : y); };
  int64_t off_float32 = 0;
  for (int64_t j = 0; j < 44; ++j) {
    const double mn = o.processor.state_min[j], mx = o.processor.state_max[j];
    // Note [N1.6 processor], by hand: q in float64 stored as float32, then 2 q - 1 in float32
    const float q = static_cast<float>((static_cast<double>(s[j]) - mn) / (mx - mn));
    float want = 2.0f * q - 1.0f;
    want = static_cast<float>(clip(want));
    if (std::fabs(mx - mn) <= 1e-8 + 1e-5 * std::fabs(mn)) want = 0.0f;
    REQUIRE(b["state"][0][j].item<float>() == want);
    const float n17 = n17_normalize(s[j], static_cast<float>(mn), static_cast<float>(mx), true);
    off_float32 += n17 != want;
  }
  REQUIRE(b["state"][0][10].item<float>() == 0.0f);
  REQUIRE(off_float32 > 0);  // N1.7's float32 arithmetic gives other values on this row
  for (int64_t k = 0; k < 2; ++k)
    for (int64_t j = 0; j < 7; ++j) {  // relative: the action minus state value j in float64, row k's bounds
      const double x = static_cast<double>(action.as<float>()[(100 + k) * 44 + j]) - static_cast<double>(s[j]);
      const double mn = o.processor.action_min[k * 44 + j], mx = o.processor.action_max[k * 44 + j];
      REQUIRE(b["actions"][0][k][j].item<float>() == static_cast<float>(clip(2.0 * ((x - mn) / (mx - mn)) - 1.0)));
    }
  REQUIRE(b["embodiment_id"][0].item<int64_t>() == 3);
  o.action_horizon = 16;  // an N1.6 record's relative rows are its counted rows: no horizon check of its own
  o.processor.valid_horizon = 2;
  REQUIRE_NOTHROW(BatchBuilder(ds, o));
}

TEST_CASE("data: an N1.6 record that counts V action rows samples only the rows whose chunk ends in the episode") {
  // Isaac-GR00T's ShardedSingleStepDataset samples step t of an episode of L rows only for t <= L - V.
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.processor.form = ProcessorForm::gr00t_n16, o.processor.valid_horizon = 16;
  std::vector<int64_t> want;
  for (const auto& e : ds.episodes()) want.push_back(e.length - 15);
  REQUIRE(sample_rows(ds, o.processor) == want);
  BatchBuilder builder(ds, o);
  REQUIRE(builder.sampler().num_samples() == ds.total_rows() - 15 * static_cast<int64_t>(want.size()));
  SampleOptions every = o;
  every.processor.valid_horizon = 0;
  BatchBuilder rows(ds, every);  // sample i = row i of the dataset
  const int64_t l0 = ds.episodes()[0].length;
  Batch last = builder.sample(l0 - 16);  // episode 0's last sample: row L0 - 16, its chunk ends at the last row
  REQUIRE(at::equal(last["state"], rows.sample(l0 - 16)["state"]));
  REQUIRE(last["action_mask"][0].slice(0, 0, 16).slice(1, 0, 44).all().item<bool>());
  REQUIRE(at::equal(builder.sample(l0 - 15)["state"], rows.sample(l0)["state"]));  // episode 1, row 0
  o.processor.form = ProcessorForm::gr00t_n17;  // N1.7 (lerobot) samples every row
  REQUIRE(BatchBuilder(ds, o).sampler().num_samples() == ds.total_rows());
}

TEST_CASE("data: the processor's state dropout zeroes the states its per-sample draws pick") {
  const Dataset ds = Dataset::open(kData);
  SampleOptions o = tiny_options();
  o.micro_batch_size = 8;
  // the dataset's statistics
  o.processor.form = ProcessorForm::gr00t_n17, o.processor.clip = true, o.processor.state_dropout = 0.5;
  BatchBuilder dropping(ds, o);
  o.processor.state_dropout = 0;
  BatchBuilder keeping(ds, o);
  int64_t dropped = 0;
  for (int64_t step = 0; step < 4; ++step) {
    const at::Tensor x = dropping.micro_batch(step, 0).tensors["state"],
                     y = keeping.micro_batch(step, 0).tensors["state"];
    for (int64_t b = 0; b < 8; ++b) {
      const auto p = static_cast<uint64_t>(dropping.sampler().stream_position(step, 0, b));
      auto gen = at::make_generator<at::CPUGeneratorImpl>(((42ull * 1000003ull + p) & 0x7FFFFFFFFFFFFFFFull) ^
                                                          0x53544154455F4450ull);
      const bool drop = at::rand({1}, gen, at::kFloat).item<float>() < 0.5f;
      dropped += drop;
      REQUIRE(at::equal(x[b], drop ? at::zeros_like(y[b]) : y[b]));
    }
  }
  REQUIRE(dropped > 0);
  REQUIRE(dropped < 32);
}

TEST_CASE("data: the task tokens of a sample are the task's BOS..EOS ids, zero padded") {
  const Dataset ds = Dataset::open(kData);
  BatchBuilder builder(ds, tiny_options());
  Batch b = builder.sample(0);
  const auto& ids = ds.tasks().at(0).token_ids;
  REQUIRE(b["text_mask"][0].sum().item<int64_t>() == static_cast<int64_t>(ids.size()));
  for (size_t k = 0; k < ids.size(); ++k) REQUIRE(b["text_tokens"][0][k].item<int64_t>() == ids[k]);
  REQUIRE(b["text_tokens"][0][static_cast<int64_t>(ids.size())].item<int64_t>() == 0);
}

TEST_CASE("data: row t shows the video frame its timestamp names, as an independent ffmpeg decode shows it") {
  const Dataset ds = Dataset::open(kData);
  const int frame_col = ds.column_by_name("video_frame:observation.images.ego_view");
  REQUIRE(frame_col >= 0);
  const ArrayView frames = ds.array(0, frame_col);
  // PickNPlace's parquet timestamps run one frame ahead of the video; after the
  // converter's constant-offset correction row t shows frame t.
  for (int64_t t : {0, 100, 415}) REQUIRE(frames.as<int64_t>()[t] == t);

  const std::string video = ds.episodes()[0].video_paths[0];
  const RgbFrames ours = decode_video_rgb(video, 101);
  REQUIRE(ours.count == 101);
  const std::string cmd = "ffmpeg -v error -i '" + video + "' -vf 'select=eq(n\\,100)' -frames:v 1 -f rawvideo -pix_fmt rgb24 -";
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::vector<uint8_t> ref(static_cast<size_t>(ours.width * ours.height * 3));
  const size_t got = fread(ref.data(), 1, ref.size(), p);
  pclose(p);
  REQUIRE(got == ref.size());
  const uint8_t* mine = ours.pixels.data() + 100 * ref.size();
  double sum_abs = 0;
  int max_abs = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const int d = std::abs(static_cast<int>(mine[i]) - static_cast<int>(ref[i]));
    max_abs = std::max(max_abs, d);
    sum_abs += d;
  }
  // Same frame, different YUV->RGB rounding (integer BT.601 vs swscale): a few
  // levels at most. A neighbouring frame differs far more (checked below).
  INFO("max abs diff " << max_abs << ", mean " << sum_abs / static_cast<double>(ref.size()));
  REQUIRE(max_abs <= 6);
  REQUIRE(sum_abs / static_cast<double>(ref.size()) < 1.0);
  double neighbour = 0;
  const uint8_t* prev = ours.pixels.data() + 99 * ref.size();
  for (size_t i = 0; i < ref.size(); ++i) neighbour += std::abs(static_cast<int>(prev[i]) - static_cast<int>(ref[i]));
  REQUIRE(neighbour > sum_abs * 1.5);
}

TEST_CASE("data: a micro-batch carries every model input and deterministic flow-matching draws") {
  const Dataset ds = Dataset::open(kData);
  BatchBuilder a(ds, tiny_options()), b(ds, tiny_options());
  Batch x = a.micro_batch(3, 0).tensors, y = b.micro_batch(3, 0).tensors;
  for (const char* key : {"images", "state", "actions", "action_mask", "text_tokens", "text_mask", "embodiment_id",
                          "fm_t", "fm_noise"})
    REQUIRE(x.count(key) == 1);
  REQUIRE(x["images"].sizes() == at::IntArrayRef({4, 1, 3, 64, 64}));
  REQUIRE(at::equal(x["fm_noise"], y["fm_noise"]));
  REQUIRE(at::equal(x["images"], y["images"]));
  REQUIRE(x["fm_t"].max().item<float>() <= 1.0f);
  REQUIRE_FALSE(at::equal(x["fm_noise"], a.micro_batch(4, 0).tensors["fm_noise"]));
  // The embodiment slots it indexes, known on the host (GCTS's per-embodiment rows).
  SampleOptions other = tiny_options();
  other.embodiment_id = 5;
  const MicroBatch m = BatchBuilder(ds, other).micro_batch(3, 0);
  REQUIRE(m.embodiments == std::vector<int64_t>{5});
  REQUIRE(at::equal(m.tensors.at("embodiment_id"), at::full({4}, 5, at::kLong)));
}

TEST_CASE("data: a truncated video is reported with the file") {
  const std::string dir = copy_dataset("shortvideo");
  const std::string video = dir + "/videos/chunk-000/observation.images.ego_view/episode_000000.mp4";
  resize_file(video, 20000);
  REQUIRE_THROWS_WITH(decode_video_rgb(video), Contains(video));
}
