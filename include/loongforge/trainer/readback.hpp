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
//
// CommTimer: a step's exposed communication timed on the device (Note
// [Exposed communication on the device] in readback.cpp).
//  - begin() and end() record timing events on the current stream of the
//    device around the trainer's communication calls (end() after the call
//    has made the stream wait for the collectives); close_step(step) files
//    the spans recorded since the last close under `step`.
//  - take(step) returns the device milliseconds from each begin to its end,
//    summed, and forgets the step; it waits for those events only (the
//    trainer asks once the step's values have been read, so they are done).
//    nullopt for a step without spans.
#pragma once

#include <chrono>    // std::chrono::steady_clock
#include <deque>     // std::deque
#include <map>       // std::map
#include <optional>  // std::optional
#include <utility>   // std::pair
#include <vector>    // std::vector

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

class CommTimer {
 public:
  explicit CommTimer(c10::Device device) : device_(device) {}
  void begin();
  void end();
  void close_step(int64_t step);
  std::optional<double> take(int64_t step);

 private:
  c10::Event record();
  c10::Device device_;
  std::vector<c10::Event> open_;                       // begin, end, begin, end, ... of the step running
  std::map<int64_t, std::vector<c10::Event>> closed_;  // per step, until taken
};

}  // namespace loongforge::trainer
