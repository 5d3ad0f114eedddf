// loongforge/trainer/tensorboard.hpp — TensorBoard event files written
// natively (no TensorFlow, no protobuf library), so `tensorboard --logdir RUN`
// shows a run's scalars.
//
// Contract:
//  - The file is <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>, in the
//    TFRecord framing (length, masked CRC32C of the length, payload, masked
//    CRC32C of the payload) with tensorflow.Event payloads: first a
//    file_version "brain.Event:2" record, then one Event per add_scalars()
//    call holding a Summary with one simple_value per tag.
//  - Every call is flushed, so a crash loses nothing already written.
//  - Trainer thread only.
//
// Example:
//   TensorBoardWriter tb(run_dir + "/tb");
//   tb.add_scalars(step, {{"train/loss", 0.53}, {"train/lr", 1e-4}});
#pragma once

#include <cstdint>  // int64_t, uint32_t
#include <cstdio>   // std::FILE
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace loongforge::trainer {

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::string path_;
  std::FILE* file_ = nullptr;
};

// CRC32C (Castagnoli) and TFRecord's masking of it; exposed for tests.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace loongforge::trainer
