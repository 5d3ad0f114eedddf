// loongforge/data/processor.hpp — the data processing a model's weights expect,
// when its export records one (batch_spec.json "processor"; docs/training-semantics.md
// s3 and s4): upstream GR00T N1.7's (lerobot's) or N1.6's (Isaac-GR00T's) preparation
// of state and actions, taken from the checkpoint by scripts/convert_gr00t_checkpoint.py
// (scripts/gr00t_processor.py writes the record). Without a record the data room uses
// the dataset form (data.normalization over the dataset's stats, in float64;
// data.embodiment_id).
//
// Contract:
//  - parse_processor() reads the record (or its absence) and refuses a malformed one
//    naming the model file and the field; UpstreamNormalizer checks it against the
//    dataset (widths, chunk rows) and refuses a mismatch naming both sides.
//  - UpstreamNormalizer computes exactly what lerobot 0.6.1's GrootN17PackInputsStep does
//    in float32 (Note [N1.7 processor]), or what Isaac-GR00T's N1.6 StateActionProcessor
//    does in numpy (Note [N1.6 processor]); pure, any thread.
//  - state_dropped() is the processor's state dropout draw of one sample (s4).
//
// Example:
//   ProcessorRecord r = parse_processor(model_batch_spec, "models/gr00t.pt");
//   UpstreamNormalizer n(r, dataset, state_col, action_col, /*action_horizon=*/16);
//   n.state(raw_state, state_out);
//   n.action_row(k, raw_action_row, raw_state, action_out_row);
#pragma once

#include <cstdint>  // int64_t, uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

namespace loongforge::data {

class Dataset;

enum class ProcessorForm { dataset, gr00t_n17, gr00t_n16 };

struct ProcessorRecord {
  ProcessorForm form = ProcessorForm::dataset;
  bool upstream() const { return form != ProcessorForm::dataset; }
  const char* upstream_name() const { return form == ProcessorForm::gr00t_n16 ? "N1.6" : "N1.7"; }
  bool clip = false;                           // clip_outliers: normalized values clamped to [-1, 1]
  bool checkpoint_stats = false;               // false: the dataset's min / max
  std::vector<double> state_min, state_max;    // (D) checkpoint statistics (N1.7's are float32 values)
  int64_t action_rows = 1;                     // rows of action_min / action_max (1: every chunk step's)
  std::vector<double> action_min, action_max;  // (rows, A) row-major
  std::vector<int64_t> state_index;           // (A): the raw state value subtracted first (-1: none)
  int64_t embodiment_id = -1;                 // the slot the checkpoint gives this embodiment (-1: none)
  std::string embodiment_tag;
  double state_dropout = 0;   // processor_kwargs.state_dropout_prob
  int64_t valid_horizon = 0;  // action rows that count (0: every row)
  std::string source;         // where the statistics come from, for messages
};

// batch_spec.json's "processor" (`spec` is the whole batch_spec; no key: the dataset
// form). Throws DataError naming model_path and the field.
ProcessorRecord parse_processor(const nlohmann::json& spec, const std::string& model_path);

// Note [N1.7 processor]
// Upstream normalizes min-max with every operand in float32: the statistics are
// rounded to float32, d = max - min, y = ((2 * (x - min)) / d) - 1 (each operation
// rounded to float32), 0 where d == 0, then clamped to [-1, 1] when clip_outliers.
// A relative action value first becomes the action minus the raw state value
// state_index names (float32), and chunk step k uses statistics row k. Our dataset
// form differs: float64 arithmetic, 0 where d < 1e-8, no clamp (s3).
float n17_normalize(float x, float min, float max, bool clip);
// On float64 data (a dataset converted with --keep-float64) upstream's tensors are float64: the
// same steps in float64 with the float32 statistics promoted, d = max - min rounded to float32
// first when range32 (lerobot's flat _min_max_norm: the state, and actions under the dataset's
// statistics) or exact in float64 (its grouped path: actions under the checkpoint's), the result
// rounded to float32 last; a relative value is the float64 difference.
float n17_normalize_wide(double x, float min, float max, bool clip, bool range32);

// Note [N1.6 processor]
// Isaac-GR00T's N1.6 StateActionProcessor normalizes with numpy: the statistics are
// float64 arrays of the JSON lists; columns where isclose(max, min) (|max - min| <=
// 1e-8 + 1e-5 |min|) become 0; elsewhere q = (x - min) / (max - min) in float64. The
// float32 data (state, absolute actions) keep the array's dtype: q is stored as float32,
// then y = 2 q - 1 in float32. A relative action value is the action minus the state in
// float64 (its JointPose), so y = 2 q - 1 stays float64 until the batch is cast to
// float32. Clipped to [-1, 1] when clip_outliers. `relative` picks the float64 path for
// x = action - state (computed by the caller in double), and for every value of float64 data.
float n16_normalize(double x, double min, double max, bool clip, bool relative);

class UpstreamNormalizer {
 public:
  // Checks the record against the dataset's state / action columns (their widths,
  // and, for N1.7, a horizon of at most the relative statistics' rows); with the
  // dataset's stats, N1.7 rounds them to float32. Throws DataError naming the model
  // and dataset.
  UpstreamNormalizer(ProcessorRecord record, const Dataset& dataset, int state_col, int action_col,
                     int64_t action_horizon, const std::string& model_path);
  // The raw values as doubles (float32 data widened exactly; the arithmetic follows the
  // columns' stored type, float32 or float64).
  void state(const double* raw, float* out) const;  // (D) -> (D)
  // Chunk step k: raw_action (A) and the sample's raw state (D) -> out (A).
  void action_row(int64_t k, const double* raw_action, const double* raw_state, float* out) const;
  const ProcessorRecord& record() const { return r_; }

 private:
  ProcessorRecord r_;
  int64_t state_width_ = 0, action_width_ = 0;
  bool wide_ = false;  // the state and action columns hold float64
};

// The processor's state dropout of the sample at stream position p (s4): its own
// generator, seeded with ((seed * 1000003 + p) mod 2^63) XOR kStateDropoutSalt, draws
// u ~ U[0, 1) (float32); the state is dropped when u < probability.
constexpr uint64_t kStateDropoutSalt = 0x53544154455F4450ull;  // "STATE_DP"
bool state_dropped(uint64_t seed, uint64_t p, double probability);

}  // namespace loongforge::data
