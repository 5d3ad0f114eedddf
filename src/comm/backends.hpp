// Private to the comm room: opening the c10d backend behind World (Note [One
// interface, two backends] in world.hpp). Each opener lives in its own file,
// compiled only where its library's headers exist.
#pragma once

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string

#include <c10/core/Device.h>  // c10::Device
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "loongforge/comm/world_info.hpp"

namespace loongforge::comm::detail {

// Gloo over TCP (CPU tensors). `on` receives the address it binds, for the log.
// Throws CommError naming the rank and what to change.
c10::intrusive_ptr<c10d::Backend> open_gloo(const c10::intrusive_ptr<c10d::Store>& store, const WorldInfo& info,
                                            std::chrono::milliseconds timeout, std::string* on);

// NCCL on `device` (CUDA). Throws CommError naming the rank and device.
c10::intrusive_ptr<c10d::Backend> open_nccl(const c10::intrusive_ptr<c10d::Store>& store, const WorldInfo& info,
                                            std::chrono::milliseconds timeout, c10::Device device, std::string* on);

// Whether the current CUDA stream of `device` is being captured into a CUDA
// graph (Note [Reduction in the graph] in src/engines/gcts/reducer.cpp); false on CPUs
// and in builds without NCCL (nothing there can be captured).
bool stream_capturing(c10::Device device);

// Note [Settling a step on NCCL] (world.hpp): waits until `device`'s current stream has run what is queued on
// it; "" when it has, else why not (the backend's error, or `timeout` passed). Builds without NCCL: "".
std::string settle_nccl(c10d::Backend& pg, c10::Device device, std::chrono::milliseconds timeout);

}  // namespace loongforge::comm::detail
