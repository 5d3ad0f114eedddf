// Readback: a step's loss and gradient norm brought to the host without a
// synchronisation (the trainer's fast path, trainer_step.cpp).
//
// Contract:
//  - post(loss, norm) enqueues, on the current stream of their device, a copy
//    of the two device scalars into pinned host memory and records an event;
//    it never waits. hold(record, started) attaches the step's record and
//    start time to the newest post.
//  - take_previous() hands out the oldest held step once a newer one was
//    posted; take_current() hands out the newest. Held::values() waits for
//    that step's copy only (not for later work) and returns (loss, norm).
//  - Trainer thread only.
#pragma once

#include <chrono>    // std::chrono::steady_clock
#include <deque>     // std::deque
#include <optional>  // std::optional
#include <utility>   // std::pair

#include <ATen/core/Tensor.h>  // at::Tensor
#include <c10/core/Device.h>   // c10::Device
#include <c10/core/Event.h>    // c10::Event

#include "loongforge/trainer/progress.hpp"

namespace loongforge::trainer {

class Readback {
 public:
  struct Held {
    StepRecord record;
    std::chrono::steady_clock::time_point started;
    at::Tensor host;  // float64 (2,), pinned: loss, norm
    c10::Event done;
    std::pair<double, double> values();
  };

  explicit Readback(c10::Device device) : device_(device) {}
  void post(const at::Tensor& loss, const at::Tensor& norm);
  void hold(const StepRecord& record, std::chrono::steady_clock::time_point started) {
    held_.back().record = record;
    held_.back().started = started;
  }
  std::optional<Held> take_previous();
  std::optional<Held> take_current();

 private:
  c10::Device device_;
  std::deque<Held> held_;
};

}  // namespace loongforge::trainer
