// The NCCL backend behind World (backends.hpp): libtorch's c10d
// ProcessGroupNCCL on the rank's GPU (Note [One interface, two backends] in
// world.hpp). Compiled with LOONGFORGE_WITH_NCCL when the build has CUDA and
// nccl.h (the torch wheel's nvidia-nccl package, or the CUDA toolkit's);
// ProcessGroupNCCL.hpp declares its class only under USE_C10D_NCCL, which
// src/comm/CMakeLists.txt defines for this file alone. The symbols are in
// libtorch_cuda.so.
#include <thread>  // std::this_thread

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if LOONGFORGE_WITH_NCCL
#include <ATen/cuda/CUDAContext.h>  // at::cuda::getCurrentCUDAStream
#include <ATen/cuda/CUDAEvent.h>    // at::cuda::CUDAEvent
#include <c10/cuda/CUDAFunctions.h>  // c10::cuda::set_device
#include <c10/cuda/CUDAGuard.h>            // c10::cuda::CUDAGuard
#include <c10/cuda/CUDAGraphsC10Utils.h>  // c10::cuda::currentStreamCaptureStatusMayInitCtx
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "backends.hpp"
#include "loongforge/common/error.hpp"

namespace loongforge::comm::detail {

c10::intrusive_ptr<c10d::Backend> open_nccl(const c10::intrusive_ptr<c10d::Store>& store, const WorldInfo& info,
                                            std::chrono::milliseconds timeout, c10::Device device, std::string* on) {
#if !LOONGFORGE_WITH_NCCL
  (void)store, (void)timeout, (void)device, (void)on;
  throw CommError("rank " + std::to_string(info.rank) +
                  ": this build has no NCCL (it was built without CUDA or without nccl.h): multi-rank training on "
                  "GPUs is unavailable; rebuild with -DLOONGFORGE_CUDA=ON on a machine with the CUDA toolkit and "
                  "the torch wheel's nvidia-nccl package, or use run.device=cpu (Gloo)");
#else
  if (!device.is_cuda() || !device.has_index())
    throw CommError("rank " + std::to_string(info.rank) + ": NCCL needs a CUDA device with an index, got " +
                    device.str());
  try {
    // NCCL binds its communicator to the current device: one process, one GPU.
    c10::cuda::set_device(device.index());
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nccl", store);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, static_cast<int>(info.rank),
                                                          static_cast<int>(info.world_size), opts);
    // Communicators are created at the first collective; binding the device
    // lets c10d create them eagerly and never guess the device.
    pg->setBoundDeviceId(device);
    pg->eagerConnectSingleDevice(device);
    *on = "NCCL on " + device.str();
    return pg;
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info.rank) + ": opening the NCCL process group on " + device.str() +
                    " failed: " + e.what() +
                    " (one process per GPU: LOCAL_RANK must name a visible GPU; NCCL_DEBUG=INFO shows why a "
                    "communicator could not be created)");
  }
#endif
}

bool stream_capturing(c10::Device device) {
#if !LOONGFORGE_WITH_NCCL
  (void)device;
  return false;
#else
  if (!device.is_cuda()) return false;
  c10::cuda::CUDAGuard on(device);
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
#endif
}

std::string settle_nccl(c10d::Backend& pg, c10::Device device, std::chrono::milliseconds timeout) {
#if !LOONGFORGE_WITH_NCCL
  (void)pg, (void)device, (void)timeout;
  return "";
#else
  c10::cuda::CUDAGuard on(device);
  at::cuda::CUDAEvent done;  // no timing: the cheapest event to record and query
  done.record(at::cuda::getCurrentCUDAStream(device.index()));
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  for (int64_t polls = 0;; ++polls) {
    // The watchdog's findings first: an error (a peer's, or its own timeout) means the results are not whole,
    // even where the event completed because the watchdog's abort ended the kernels.
    switch (pg.getError()) {
      case c10d::ErrorType::SUCCESS: break;
      case c10d::ErrorType::TIMEOUT: return "NCCL's watchdog timed a collective out";
      case c10d::ErrorType::REMOTE_ERROR: return "NCCL reported an error on a peer";
      default: return "NCCL reported a communicator error";
    }
    if (done.query()) return "";
    const auto waited = Clock::now() - t0;
    if (waited > timeout)
      return "the device had not finished it after " +
             std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() / 1000.0) +
             " s (the collective timeout)";
    // Mostly the device is nearly done: yield for the first ~100 us, then sleep in 50 us steps.
    if (polls < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
#endif
}

}  // namespace loongforge::comm::detail
