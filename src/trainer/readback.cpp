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

}  // namespace loongforge::trainer
