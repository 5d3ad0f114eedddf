// Readback (readback.hpp).
#include "loongforge/trainer/readback.hpp"

#include <ATen/ATen.h>                                // at::stack, at::empty
#include <c10/core/impl/DeviceGuardImplInterface.h>  // c10::impl::getDeviceGuardImpl

namespace loongforge::trainer {

void Readback::post(const at::Tensor& loss, const at::Tensor& norm) {
  Held h{StepRecord{}, {}, at::empty({2}, at::TensorOptions().dtype(at::kDouble).pinned_memory(true)),
         c10::Event(device_.type())};
  h.host.copy_(at::stack({loss.to(at::kDouble).reshape({}), norm.to(at::kDouble).reshape({})}),
               /*non_blocking=*/true);
  h.done.record(c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_));
  held_.push_back(std::move(h));
}

std::optional<Readback::Held> Readback::take_previous() {
  if (held_.size() < 2) return std::nullopt;
  Held h = std::move(held_.front());
  held_.pop_front();
  return h;
}

std::optional<Readback::Held> Readback::take_current() {
  if (held_.empty()) return std::nullopt;
  Held h = std::move(held_.front());
  held_.pop_front();
  return h;
}

std::pair<double, double> Readback::Held::values() {
  done.synchronize();
  const double* v = host.data_ptr<double>();
  return {v[0], v[1]};
}

// Note [Exposed communication on the device]
// On GPUs the host does not wait for a collective: ProcessGroupNCCL's wait
// makes the compute stream wait for the NCCL stream, and the trainer's fast
// step never blocks. So host time around the communication calls measures
// launches, not what the step lost. The device's own clock does: an event
// recorded on the compute stream before a call completes when the stream
// has run everything before it (the backward, or the update), and one
// recorded after completes once the stream has also waited for the
// collectives and run the unpacking of their results. The time between them
// is the communication the stream could not hide; zero-ish when every
// bucket finished under the backward. (If the host were late to enqueue
// the work after the first event, its lateness would count too; on the fast
// step the host runs ahead of the device.) Spans: the sharded optimizer's
// gather wait before the forward, and the reduction after backward.
c10::Event CommTimer::record() {
  c10::Event e(device_.type(), c10::EventFlag::BACKEND_DEFAULT);  // timing on
  e.record(c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_));
  return e;
}

void CommTimer::begin() { open_.push_back(record()); }
void CommTimer::end() { open_.push_back(record()); }

void CommTimer::close_step(int64_t step) {
  if (!open_.empty()) closed_[step] = std::move(open_);
  open_.clear();
}

std::optional<double> CommTimer::take(int64_t step) {
  auto it = closed_.find(step);
  if (it == closed_.end()) return std::nullopt;
  double ms = 0;
  const auto& e = it->second;
  for (size_t i = 0; i + 1 < e.size(); i += 2) {
    e[i + 1].synchronize();
    ms += e[i].elapsedTime(e[i + 1]);
  }
  closed_.erase(it);
  return ms;
}

}  // namespace loongforge::trainer
