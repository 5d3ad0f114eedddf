// loongforge/data/dataset.hpp — a LoongForge dataset folder, memory-mapped.
//
// Contract:
//  - Owns: the parsed loongforge_dataset.json and one read-only mmap per shard
//    (docs/shard-format.md). Never parses Parquet.
//  - open() checks every shard's header, column table and index (CRC32, magic,
//    version, sizes, alignment) against the JSON and throws DataError naming
//    the file and what is wrong. Each episode record's CRC32 is checked the
//    first time array() touches it (thread-safe, once per process).
//  - open() also requires each episode video's size, SHA-256 and frame count
//    in the JSON (a dataset converted before they were recorded is refused:
//    re-run scripts/convert_lerobot.py); the files are checked against them
//    when an episode's video is decoded (video.hpp), not here.
//  - Arrays are returned as views into the mapping: valid while the Dataset
//    lives. Nothing is copied.
//
// Example:
//   auto ds = Dataset::open("build/datasets/robot_sim.PickNPlace.lf");
//   auto state = ds.array(0, ds.column_by_role("state"));  // (rows, 44) float32
//   const float* row7 = state.as<float>() + 7 * state.width;
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // int64_t, uint32_t
#include <map>      // std::map
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "loongforge/common/error.hpp"

namespace loongforge::data {

// CRC-32/ISO-HDLC (zlib's): crc32("123456789") == 0xCBF43926.
uint32_t crc32(const void* data, size_t bytes);

enum class DType : uint32_t { Float32 = 1, Float64 = 2, Int64 = 3, UInt8 = 4, Int32 = 5 };

struct ColumnInfo {
  int id = 0;
  std::string name;
  std::string role;  // state, action, annotation, timestamp, video_frame, ...
  DType dtype = DType::Float32;
  int64_t width = 1;
  bool per_video_frame = false;
  int camera_id = -1;
};

struct CameraInfo {
  int id = 0;
  std::string key;            // "observation.images.ego_view"
  std::string modality_name;  // "" when modality.json does not use it
  int64_t height = 0, width = 0;
};

// One camera video of an episode as the converter recorded it
// (loongforge_dataset.json episodes[].videos[]); the decoder checks the file
// against it (video.hpp).
struct VideoInfo {
  std::string file;             // relative to the dataset folder ("" if none)
  uint64_t bytes = 0;
  std::string sha256;           // hex, of the whole file
  int64_t frame_count = 0;
  double timestamp_offset_s = 0;  // parquet timestamp - video pts (docs/shard-format.md s5)
};

struct EpisodeInfo {
  int64_t index = 0;   // LeRobot episode index
  int64_t length = 0;  // rows
  int shard_id = 0;
  std::string shard_file;  // e.g. "shard-00000.lfshard"
  uint64_t record_offset = 0, record_bytes = 0;
  uint32_t record_crc32 = 0;
  std::vector<std::string> video_paths;  // absolute, by camera id ("" if none)
  std::vector<VideoInfo> videos;         // by camera id
};

struct TaskInfo {
  int64_t index = 0;
  std::string text;
  std::vector<int64_t> token_ids;  // BOS ... EOS
};

struct Stats {
  std::vector<double> min, max, mean, std;
};

// Which tokenizer made the tasks' token ids (loongforge_dataset.json "tokenizer";
// docs/shard-format.md s2). The model export records the same three fields in
// batch_spec.json; BatchBuilder refuses a pair that differs (Note [Tokenizer match]).
struct TokenizerInfo {
  std::string kind;    // "word_hash" (scripts/model/tokenizer.py) or "hf_tokenizer_json"
  std::string sha256;  // of scripts/model/tokenizer.py, or of the tokenizer.json file
  std::string file;    // the path it was read from, for messages
  // how each task text was changed before tokenizing: "raw" (as the dataset has it) or
  // "gr00t_formalized" (upstream GR00T's formalize_language: lowercased, only letters, digits,
  // spaces and '_' kept); absent in a record = "raw"
  std::string text_form = "raw";
};

struct ArrayView {
  const void* data = nullptr;
  int64_t rows = 0, width = 0;
  DType dtype = DType::Float32;
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

class Dataset {
 public:
  static Dataset open(const std::string& dir);
  Dataset(Dataset&&) noexcept;
  Dataset& operator=(Dataset&&) noexcept;
  ~Dataset();

  const std::string& dir() const { return dir_; }
  const std::vector<EpisodeInfo>& episodes() const { return episodes_; }
  const std::vector<ColumnInfo>& columns() const { return columns_; }
  const std::vector<CameraInfo>& cameras() const { return cameras_; }
  const std::map<int64_t, TaskInfo>& tasks() const { return tasks_; }
  const TokenizerInfo& tokenizer() const { return tokenizer_; }
  int64_t total_rows() const { return total_rows_; }
  double fps() const { return fps_; }
  // Largest |row timestamp - offset - frame pts| the converter accepted: 1/(2*fps).
  double alignment_tolerance_s() const { return tolerance_s_; }

  // Column id by exact name / first column with the role; -1 if none.
  int column_by_name(const std::string& name) const;
  int column_by_role(const std::string& role) const;
  // Normalization stats of a column; throws DataError if absent.
  const Stats& stats(const std::string& column_name) const;

  // Column `column` of episode position `episode` (not the LeRobot index).
  ArrayView array(size_t episode, int column) const;

 private:
  Dataset() = default;
  struct Shards;
  std::string dir_;
  double fps_ = 0, tolerance_s_ = 0;
  int64_t total_rows_ = 0;
  std::vector<EpisodeInfo> episodes_;
  std::vector<ColumnInfo> columns_;
  std::vector<CameraInfo> cameras_;
  std::map<int64_t, TaskInfo> tasks_;
  std::map<std::string, Stats> stats_;
  TokenizerInfo tokenizer_;
  std::unique_ptr<Shards> shards_;
};

}  // namespace loongforge::data
