// Proves data.path's mixture files (data/mixture.hpp): a mixture's samples are
// its datasets' own samples, bit for bit, numbered part by part, each in the
// embodiment slot the file gives it, normalized by its own statistics and
// padded to the model's widths; a shuffled mixture mixes both embodiments into
// one micro-batch; bad files are refused naming the entry and the fix.
// The mixture (make_mixture_dataset.py): the bundled dataset at 64x64 (44-wide
// state and actions, slot 0) and a one-armed copy of two of its episodes
// (13-wide, an 80x60 camera, longer task texts, slot 3).
#include <fstream>  // std::ofstream
#include <set>      // std::set
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/ATen.h>  // at::Tensor

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/data/batch.hpp"
#include "loongforge/data/mixture.hpp"

using namespace loongforge;
using namespace loongforge::data;
using lf_catch::Contains;

namespace {
const std::string kMixture = LOONGFORGE_TEST_MIXTURE;  // mixture.json
const std::string kSmall = LOONGFORGE_TEST_SMALL_DATASET;

SampleOptions tiny_options() {
  SampleOptions o;
  o.micro_batch_size = 4;
  o.image_size = 64;
  return o;
}

// A mixture file with this text, in the test models folder; returns its path.
std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(LOONGFORGE_TEST_MODELS) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string refusal(const std::string& text) {
  try {
    open_data(write_file("bad-mixture.json", text), 0);
  } catch (const DataError& e) {
    return e.what();
  }
  return "(not refused)";
}
}  // namespace

TEST_CASE("mixture: a mixture's samples are its datasets' own, bit for bit, part by part, in their slots") {
  const Mixture mix = open_data(kMixture, 0);
  REQUIRE(mix.from_file);
  REQUIRE(mix.datasets.size() == 2);
  REQUIRE(mix.embodiment_ids == std::vector<int64_t>{0, 3});
  REQUIRE(mix.episodes() == 7);
  REQUIRE(mix.total_rows() == 2096 + 882);
  BatchBuilder mixed(mix.parts(), tiny_options());
  REQUIRE(mixed.sampler().num_samples() == 2096 + 882);
  SampleOptions o0 = tiny_options(), o3 = tiny_options();
  o3.embodiment_id = 3;
  BatchBuilder alone0(*mix.datasets[0], o0), alone3(*mix.datasets[1], o3);
  for (const int64_t id :
       {int64_t{0}, int64_t{415}, int64_t{2095}, int64_t{2096}, int64_t{2096 + 470}, int64_t{2096 + 881}}) {
    CAPTURE(id);
    const Batch got = mixed.sample(id);
    const Batch want = id < 2096 ? alone0.sample(id) : alone3.sample(id - 2096);
    for (const auto& [key, tensor] : want) {
      CAPTURE(key);
      REQUIRE(at::equal(got.at(key), tensor));
    }
    REQUIRE(got.at("embodiment_id").item<int64_t>() == (id < 2096 ? 0 : 3));
  }
}

TEST_CASE("mixture: the one-armed robot's 13 state and action values are normalized and padded to the model's") {
  const Mixture mix = open_data(kMixture, 0);
  BatchBuilder mixed(mix.parts(), tiny_options());
  const Batch b = mixed.sample(2096 + 100);
  const at::Tensor state = b.at("state")[0], mask = b.at("action_mask")[0];  // (D,), (H, A)
  REQUIRE(state.size(0) == 64);
  REQUIRE(at::all(state.narrow(0, 13, 64 - 13) == 0).item<bool>());
  REQUIRE(at::all(state.narrow(0, 0, 13).abs() <= 1.0f + 1e-6f).item<bool>());  // min-max to [-1, 1]
  REQUIRE(at::all(mask.narrow(1, 0, 13) == 1).item<bool>());
  REQUIRE(at::all(mask.narrow(1, 13, mask.size(1) - 13) == 0).item<bool>());
  // its task text is the longer one, all 19 of its words and BOS/EOS within the 32-token slot
  REQUIRE(b.at("text_mask")[0].sum().item<int64_t>() > mixed.sample(100).at("text_mask")[0].sum().item<int64_t>());
}

TEST_CASE("mixture: shuffled, the micro-batches mix both embodiments and every sample once an epoch") {
  const Mixture mix = open_data(kMixture, 0);
  SampleOptions o = tiny_options();
  o.micro_batch_size = 8;
  BatchBuilder mixed(mix.parts(), o);
  std::set<int64_t> slots;
  int64_t both = 0;
  for (int64_t s = 0; s < 6; ++s) {
    const MicroBatch mb = mixed.micro_batch(s, 0);
    slots.insert(mb.embodiments.begin(), mb.embodiments.end());
    both += mb.embodiments.size() == 2 ? 1 : 0;
    // the counts follow each sample's own width: 44 or 13 valid values per action row
    REQUIRE(mb.num_valid == mb.tensors.at("action_mask").sum().item<int64_t>());
  }
  REQUIRE(slots == std::set<int64_t>{0, 3});
  REQUIRE(both > 0);
  std::vector<int64_t> seen;
  Sampler sampler = mixed.sampler();
  for (int64_t s = 0; s < sampler.steps_per_epoch(); ++s)
    for (const int64_t id : sampler.micro_batch(s, 0)) seen.push_back(id);
  std::set<int64_t> distinct(seen.begin(), seen.end());
  REQUIRE(distinct.size() == seen.size());
  REQUIRE(*distinct.rbegin() < 2096 + 882);
}

TEST_CASE("mixture: a dataset folder is a mixture of one part in data.embodiment_id's slot") {
  const Mixture one = open_data(kSmall, 5);
  REQUIRE_FALSE(one.from_file);
  REQUIRE(one.embodiment_ids == std::vector<int64_t>{5});
  BatchBuilder b(one.parts(), tiny_options());
  REQUIRE(b.sample(7).at("embodiment_id").item<int64_t>() == 5);
}

TEST_CASE("mixture: bad mixture files are refused naming the entry and the fix") {
  REQUIRE_THAT(refusal("{\"datasets\": []}"), Contains("no \"datasets\" list, or an empty one"));
  REQUIRE_THAT(refusal("{\"datasets\": [{\"path\": \"" + kSmall + "\", \"embodiment_id\": 0}], \"weights\": [1]}"),
               Contains("unknown key \"weights\""));
  REQUIRE_THAT(refusal("{\"datasets\": [{\"path\": \"" + kSmall + "\"}]}"),
               Contains("datasets[0]: no integer \"embodiment_id\""));
  REQUIRE_THAT(refusal("{\"datasets\": [{\"path\": \"" + kSmall + "\", \"embodiment_id\": 40}]}"),
               Contains("embodiment_id 40 is outside 0..31"));
  REQUIRE_THAT(refusal("{\"datasets\": [{\"path\": \"" + kSmall + "\", \"embodiment_id\": 0}, {\"path\": \"" + kSmall +
                       "/\", \"embodiment_id\": 1}]}"),
               Contains("datasets[1]: the dataset " + kSmall + "/ is listed twice"));
  REQUIRE_THAT(refusal("{\"datasets\": [{\"path\": \"" + kSmall +
                       "\", \"embodiment_id\": 0}, {\"path\": \"nowhere.lf\", "
                       "\"embodiment_id\": 1}]}"),
               Contains("datasets[1]: cannot read"));
  REQUIRE_THAT(refusal("{\"datasets\": [{\"path\": \"nowhere.lf\", \"embodiment_id\": 1}]}"),
               Contains("is '" + std::string(LOONGFORGE_TEST_MODELS) +
                        "/nowhere.lf' a dataset"));  // relative: from the file's folder
  REQUIRE_THAT(refusal("{\"datasets\": "), Contains("not valid JSON"));
  REQUIRE_THAT(refusal("{\"datasets\": []}"), Contains("relative paths are read from its folder"));
}

TEST_CASE("mixture: a dataset of the mixture with another camera count than the model is refused naming it") {
  const Mixture mix = open_data(kMixture, 0);
  SampleOptions o = tiny_options();
  o.num_views = 2;
  REQUIRE_THROWS_WITH(BatchBuilder(mix.parts(), o), Contains(kSmall + ": the dataset has 1 camera(s)"));
}
