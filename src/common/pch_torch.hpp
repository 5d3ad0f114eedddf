// Precompiled header for every room that uses libtorch (LOONGFORGE_PCH).
// Only heavy, stable third-party headers belong here.
#pragma once
#include <torch/script.h>  // torch::jit::Module, torch::Tensor, IValue
#include <torch/torch.h>   // torch::optim, torch::nn::utils
