// loongforge/common/phases.hpp — how the rooms that run a step report its
// phases (data wait, H2D, forward, backward, ...) to `profile-step`.
//
// Contract:
//  - The trainer owns one PhaseRecorder (the control plane's profiler) and
//    passes it to the seams (BatchSource, StepRunner, GradientReducer).
//  - A phase is recorded only while a profile records; when nothing records,
//    a Phase costs two clock reads and no device synchronisation.
//  - While recording, the recorder synchronises the device before closing a
//    phase, so GPU work lands in the phase that queued it.
//  - A Phase left by an exception records itself as failed_phase() (the
//    innermost one wins) and synchronises nothing: the trainer names the
//    phase when it reports the failure.
//  - Trainer thread only.
//
// Example:
//   { Phase p(recorder, "forward", step, micro); loss = net.forward(batch); }
#pragma once

#include <chrono>     // std::chrono::steady_clock
#include <cstdint>    // int64_t
#include <exception>  // std::uncaught_exceptions

namespace loongforge {

class PhaseRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~PhaseRecorder() = default;
  virtual bool recording() const = 0;
  // Closes a phase begun at t0 (synchronising the device first when recording).
  virtual void end_phase(const char* name, int64_t step, int64_t micro, Clock::time_point t0) = 0;
};

// The phase an exception last left on this thread (name nullptr: none).
struct FailedPhase {
  const char* name = nullptr;
  int64_t step = 0, micro = -1;
};
inline FailedPhase& failed_phase() {
  thread_local FailedPhase f;
  return f;
}

// A scoped phase: [construction, destruction).
class Phase {
 public:
  Phase(PhaseRecorder& r, const char* name, int64_t step, int64_t micro = -1)
      : r_(r), name_(name), step_(step), micro_(micro), unwinding_(std::uncaught_exceptions()),
        t0_(PhaseRecorder::Clock::now()) {}
  ~Phase() {
    if (std::uncaught_exceptions() > unwinding_) {
      if (!failed_phase().name) failed_phase() = {name_, step_, micro_};
      return;
    }
    r_.end_phase(name_, step_, micro_, t0_);
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  PhaseRecorder& r_;
  const char* name_;
  int64_t step_, micro_;
  int unwinding_;  // exceptions in flight when the phase began
  PhaseRecorder::Clock::time_point t0_;
};

}  // namespace loongforge
