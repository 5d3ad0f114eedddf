// A model's processor record and upstream GR00T N1.7's and N1.6's state/action
// preparation (processor.hpp, Notes [N1.7 processor] and [N1.6 processor]).
#include "loongforge/data/processor.hpp"

#include <cmath>  // std::fabs

#include <ATen/ATen.h>              // at::rand
#include <ATen/CPUGeneratorImpl.h>  // at::CPUGeneratorImpl
#include <nlohmann/json.hpp>        // nlohmann::json

#include "loongforge/common/error.hpp"
#include "loongforge/data/dataset.hpp"

namespace loongforge::data {

namespace {
std::vector<double> numbers(const nlohmann::json& v, const std::string& what, const std::string& model_path) {
  if (!v.is_array())
    throw DataError("model.path " + model_path + ": batch_spec.json processor." + what +
                    " is not a list of numbers; re-import the model");
  std::vector<double> out;
  for (const auto& x : v) {
    if (!x.is_number())
      throw DataError("model.path " + model_path + ": batch_spec.json processor." + what +
                      " holds a non-number; re-import the model");
    out.push_back(x.get<double>());
  }
  return out;
}
}  // namespace

ProcessorRecord parse_processor(const nlohmann::json& spec, const std::string& model_path) {
  ProcessorRecord r;
  if (!spec.is_object() || !spec.contains("processor") || spec.at("processor").is_null()) return r;
  const nlohmann::json& j = spec.at("processor");
  const std::string where = "model.path " + model_path + ": batch_spec.json processor";
  try {
    const std::string form = j.at("form").get<std::string>();
    if (form == "dataset") return r;
    if (form != "gr00t_n17" && form != "gr00t_n16")
      throw DataError(where + ".form '" + form + "' is not dataset, gr00t_n17 or gr00t_n16; re-import the model");
    r.form = form == "gr00t_n16" ? ProcessorForm::gr00t_n16 : ProcessorForm::gr00t_n17;
    r.clip = j.at("clip").get<bool>();
    r.state_dropout = j.value("state_dropout", 0.0);
    r.valid_horizon = j.value("valid_horizon", int64_t{0});
    r.embodiment_id = j.value("embodiment_id", int64_t{-1});
    r.embodiment_tag = j.value("embodiment_tag", std::string());
    r.source = j.value("stats_source", std::string("the dataset's min / max"));
    if (!(r.state_dropout >= 0.0 && r.state_dropout < 1.0) || r.valid_horizon < 0)
      throw DataError(where + ": state_dropout must be in [0, 1) and valid_horizon >= 0; re-import the model");
    if (j.value("stats", std::string("dataset")) != "checkpoint") return r;
    r.checkpoint_stats = true;
    const auto& st = j.at("state");
    const auto& ac = j.at("action");
    r.state_min = numbers(st.at("min"), "state.min", model_path);
    r.state_max = numbers(st.at("max"), "state.max", model_path);
    r.action_rows = ac.at("rows").get<int64_t>();
    for (const auto& row : ac.at("min")) {
      const auto v = numbers(row, "action.min", model_path);
      r.action_min.insert(r.action_min.end(), v.begin(), v.end());
    }
    for (const auto& row : ac.at("max")) {
      const auto v = numbers(row, "action.max", model_path);
      r.action_max.insert(r.action_max.end(), v.begin(), v.end());
    }
    r.state_index = ac.at("state_index").get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(where + " is malformed (" + e.what() + "); re-import the model");
  }
  const auto width = static_cast<int64_t>(r.state_index.size());
  if (r.state_min.size() != r.state_max.size() || r.action_rows < 1 ||
      static_cast<int64_t>(r.action_min.size()) != r.action_rows * width || r.action_max.size() != r.action_min.size())
    throw DataError(where + ": its statistics have inconsistent sizes (state " + std::to_string(r.state_min.size()) +
                    " / " + std::to_string(r.state_max.size()) + ", action " + std::to_string(r.action_rows) +
                    " rows of " + std::to_string(width) + "); re-import the model");
  for (int64_t s : r.state_index)
    if (s < -1 || s >= static_cast<int64_t>(r.state_min.size()))
      throw DataError(where + ": action.state_index names state value " + std::to_string(s) + " of " +
                      std::to_string(r.state_min.size()) + "; re-import the model");
  return r;
}

float n17_normalize(float x, float min, float max, bool clip) {
  const float d = max - min;
  if (d == 0.0f) return 0.0f;
  float y = (2.0f * (x - min)) / d - 1.0f;  // Note [N1.7 processor]: each step in float32
  if (clip) {
    if (y < -1.0f) y = -1.0f;  // a NaN stays NaN, as torch's clamp leaves it
    if (y > 1.0f) y = 1.0f;
  }
  return y;
}

float n17_normalize_wide(double x, float min, float max, bool clip, bool range32) {
  const double d = range32 ? static_cast<double>(max - min) : static_cast<double>(max) - static_cast<double>(min);
  if (d == 0.0) return 0.0f;
  double y = (2.0 * (x - static_cast<double>(min))) / d - 1.0;
  if (clip) y = y < -1.0 ? -1.0 : (y > 1.0 ? 1.0 : y);
  return static_cast<float>(y);
}

float n16_normalize(double x, double min, double max, bool clip, bool relative) {
  if (std::fabs(max - min) <= 1e-8 + 1e-5 * std::fabs(min)) return 0.0f;  // numpy's isclose(max, min)
  const double q = (x - min) / (max - min);
  // Note [N1.6 processor]: 2 q - 1 in float64 for relative values; else q rounded to float32 and
  // 2 q - 1 in float32 (2 q is exact, so one rounding of the double difference is float32's).
  const double y = relative ? 2.0 * q - 1.0 : 2.0 * static_cast<double>(static_cast<float>(q)) - 1.0;
  float out = static_cast<float>(y);
  if (clip) {  // clamping before or after the rounding agrees: +-1 are float32 values
    if (out < -1.0f) out = -1.0f;
    if (out > 1.0f) out = 1.0f;
  }
  return out;
}

UpstreamNormalizer::UpstreamNormalizer(ProcessorRecord record, const Dataset& dataset, int state_col, int action_col,
                                       int64_t action_horizon, const std::string& model_path)
    : r_(std::move(record)) {
  const ColumnInfo& sc = dataset.columns()[state_col];
  const ColumnInfo& ac = dataset.columns()[action_col];
  state_width_ = sc.width, action_width_ = ac.width;
  wide_ = sc.dtype == DType::Float64 && ac.dtype == DType::Float64;
  const std::string model = "model.path " + model_path + " (imported for embodiment '" + r_.embodiment_tag + "')";
  if (!r_.checkpoint_stats) {
    // The dataset's min / max (N1.7 rounds them to float32 where it uses them).
    const Stats& ss = dataset.stats(sc.name);
    const Stats& as = dataset.stats(ac.name);
    if (static_cast<int64_t>(ss.min.size()) != sc.width || static_cast<int64_t>(as.min.size()) != ac.width ||
        ss.max.size() != ss.min.size() || as.max.size() != as.min.size())
      throw DataError(dataset.dir() + ": the min / max stats of '" + sc.name + "' or '" + ac.name +
                      "' do not have one value per column value; re-convert the dataset");
    r_.state_min.assign(ss.min.begin(), ss.min.end());
    r_.state_max.assign(ss.max.begin(), ss.max.end());
    r_.action_rows = 1;
    r_.action_min.assign(as.min.begin(), as.min.end());
    r_.action_max.assign(as.max.begin(), as.max.end());
    r_.state_index.assign(static_cast<size_t>(ac.width), -1);
    return;
  }
  // The checkpoint's statistics must cover the column exactly (upstream would pad or cut them).
  auto require_width = [&](size_t stats, const ColumnInfo& column, const char* what) {
    if (static_cast<int64_t>(stats) == column.width) return;
    throw DataError(model + ": the checkpoint's " + what + " statistics (" + r_.source + ") have " +
                    std::to_string(stats) + " values but the " + what + " column '" + column.name + "' of " +
                    dataset.dir() + " has " + std::to_string(column.width) + "; convert a dataset whose " + what +
                    " values are laid out as the checkpoint's modality keys, or import with another --embodiment-tag");
  };
  require_width(r_.state_min.size(), sc, "state");
  require_width(r_.state_index.size(), ac, "action");
  // (an N1.6 record has as many relative rows as counted chunk rows, the most a sample uses)
  if (r_.form == ProcessorForm::gr00t_n17 && r_.action_rows > 1 && action_horizon > r_.action_rows)
    throw DataError("data.action_horizon=" + std::to_string(action_horizon) + " exceeds the " +
                    std::to_string(r_.action_rows) + " chunk rows of the relative-action statistics of " + model +
                    " (upstream refuses it too); lower data.action_horizon");
}

void UpstreamNormalizer::state(const double* raw, float* out) const {
  const bool n16 = r_.form == ProcessorForm::gr00t_n16;
  for (int64_t j = 0; j < state_width_; ++j) {
    const double mn = r_.state_min[static_cast<size_t>(j)], mx = r_.state_max[static_cast<size_t>(j)];
    const auto mn32 = static_cast<float>(mn), mx32 = static_cast<float>(mx);
    out[j] = n16     ? n16_normalize(raw[j], mn, mx, r_.clip, wide_)
             : wide_ ? n17_normalize_wide(raw[j], mn32, mx32, r_.clip, /*range32=*/true)
                     : n17_normalize(static_cast<float>(raw[j]), mn32, mx32, r_.clip);
  }
}

void UpstreamNormalizer::action_row(int64_t k, const double* raw_action, const double* raw_state, float* out) const {
  const bool n16 = r_.form == ProcessorForm::gr00t_n16;
  const int64_t row = r_.action_rows > 1 ? k : 0;
  const double* mn = r_.action_min.data() + row * action_width_;
  const double* mx = r_.action_max.data() + row * action_width_;
  for (int64_t j = 0; j < action_width_; ++j) {
    const int64_t s = r_.state_index[static_cast<size_t>(j)];
    if (n16) {  // a relative value: the difference in float64 (Note [N1.6 processor])
      const double x = s >= 0 ? raw_action[j] - raw_state[s] : raw_action[j];
      out[j] = n16_normalize(x, mn[j], mx[j], r_.clip, wide_ || s >= 0);
    } else if (wide_) {  // float64 data: the difference in float64; lerobot's grouped path with checkpoint stats
      const double x = s >= 0 ? raw_action[j] - raw_state[s] : raw_action[j];
      out[j] = n17_normalize_wide(x, static_cast<float>(mn[j]), static_cast<float>(mx[j]), r_.clip,
                                  /*range32=*/!r_.checkpoint_stats);
    } else {  // a relative value: float32
      const float x = s >= 0 ? static_cast<float>(raw_action[j]) - static_cast<float>(raw_state[s])
                             : static_cast<float>(raw_action[j]);
      out[j] = n17_normalize(x, static_cast<float>(mn[j]), static_cast<float>(mx[j]), r_.clip);
    }
  }
}

bool state_dropped(uint64_t seed, uint64_t p, double probability) {
  if (probability <= 0) return false;
  auto gen =
      at::make_generator<at::CPUGeneratorImpl>(((seed * 1000003ull + p) & 0x7FFFFFFFFFFFFFFFull) ^ kStateDropoutSalt);
  const float u = at::rand({1}, gen, at::kFloat).item<float>();
  return static_cast<double>(u) < probability;
}

}  // namespace loongforge::data
