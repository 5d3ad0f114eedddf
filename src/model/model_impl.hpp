// Private to the model room: what a Model holds (model.cpp, mdg.cpp).
#pragma once

#include <vector>  // std::vector

#include <torch/script.h>  // torch::jit::Module

#include "loongforge/model/model.hpp"

namespace loongforge::model {

struct Model::Impl {
  torch::jit::Module module;
  std::vector<at::Tensor> params;  // aligned with ModelInfo::params
};

}  // namespace loongforge::model
