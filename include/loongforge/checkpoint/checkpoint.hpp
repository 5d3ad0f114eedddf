// loongforge/checkpoint/checkpoint.hpp — checkpoint directories and the
// safetensors format.
//
// Contract:
//  - write_safetensors() writes the Hugging Face safetensors layout (8-byte
//    little-endian header length, JSON header, raw little-endian data), so
//    `safetensors.torch.load_file` reads it in Python. Tensors are copied to
//    the CPU; names keep their order.
//  - write_checkpoint() builds `<parent>/<name>/` under a temporary name,
//    fsyncs every file and the directory, then renames: the directory either
//    is complete or does not exist.
//  - Throws CheckpointError naming the path and the OS error.
//
// Example:
//   write_checkpoint(run_dir + "/checkpoints", "epoch_0_step_200",
//                    {{"model.safetensors", tensors}}, {{"trainer_state.json", state.dump(2)}});
#pragma once

#include <map>      // std::map
#include <string>   // std::string
#include <utility>  // std::pair
#include <vector>   // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

namespace loongforge::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
NamedTensors read_safetensors(const std::string& path);

// Returns the final directory path.
std::string write_checkpoint(const std::string& parent, const std::string& name,
                             const std::map<std::string, NamedTensors>& tensor_files,
                             const std::map<std::string, std::string>& text_files);

}  // namespace loongforge::checkpoint
