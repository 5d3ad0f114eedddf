// The NCCL backend behind World (backends.hpp): libtorch's c10d
// ProcessGroupNCCL on the rank's GPU (Note [One interface, two backends] in
// world.hpp). Compiled with LOONGFORGE_WITH_NCCL when the build has CUDA and
// nccl.h (the torch wheel's nvidia-nccl package, or the CUDA toolkit's);
// ProcessGroupNCCL.hpp declares its class only under USE_C10D_NCCL, which
// src/comm/CMakeLists.txt defines for this file alone. The symbols are in
// libtorch_cuda.so.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if LOONGFORGE_WITH_NCCL
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

}  // namespace loongforge::comm::detail
