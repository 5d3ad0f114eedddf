// Small complete snapshots and scratch directories for the checkpoint tests.
#pragma once

#include <stdlib.h>  // mkdtemp

#include <string>  // std::string

#include <ATen/ATen.h>  // at::full, at::arange

#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/files.hpp"

namespace lf_test {

// A fresh directory under /tmp, removed when the object goes away.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    char name[] = "/tmp/lf-checkpoint-test-XXXXXX";
    path = ::mkdtemp(name);
  }
  ~ScratchDir() { loongforge::remove_tree(path); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
};

// A snapshot with every required file; `mark` is the value of model.safetensors'
// weight, so a reader can tell two writes of one step apart.
inline loongforge::checkpoint::Snapshot make_snapshot(int64_t step, float mark = 1.0f) {
  using namespace loongforge::checkpoint;
  Snapshot s;
  s.name = "epoch_0_step_" + std::to_string(step);
  s.tensor_files["model.safetensors"] = {{"layer.weight", at::full({4, 3}, mark)},
                                         {"layer.bias", at::arange(3, at::kFloat)}};
  s.tensor_files["optimizer/rank_00000.safetensors"] = {{"layer.weight.exp_avg", at::zeros({4, 3})}};
  s.text_files["trainer_state.json"] = "{\"step\": " + std::to_string(step) + "}\n";
  s.text_files["scheduler.json"] = "{\"lr\": 0.001}\n";
  s.manifest.run_id = "test-run";
  s.manifest.config_hash = "c0";
  s.manifest.model_hash = "m0";
  s.manifest.step = step;
  s.manifest.config = nlohmann::json::object();
  return s;
}

// The value of layer.weight in a checkpoint's model.safetensors.
inline float mark_of(const std::string& dir) {
  for (const auto& [name, t] : loongforge::checkpoint::read_safetensors(dir + "/model.safetensors"))
    if (name == "layer.weight") return t[0][0].item<float>();
  return -1.0f;
}

}  // namespace lf_test
