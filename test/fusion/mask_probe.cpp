// A test probe (LD_PRELOAD) that measures the dropout masks an AOTInductor
// package draws (test/e2e/test_compiled_dropout.py). scripts/compile_step.py
// builds packages with Inductor's fallback_random, so a package draws each
// mask by calling AOTInductor's C shim - on the CPU
// aoti_torch_cpu_bernoulli__float (the mask tensor filled with 0/1), on a
// GPU aoti_torch_cuda_native_dropout (its second output is the mask) or
// aoti_torch_cuda_bernoulli__float. This library defines those functions,
// calls libtorch's (dlsym RTLD_NEXT) and, when LOONGFORGE_MASK_PROBE names a
// file, appends one line per mask: "<elements> <kept> <FNV-1a hash of the
// mask as bytes>". The TorchScript forward calls ATen directly, not the
// shim: only the package's masks are counted. A call inside a CUDA graph
// capture is passed through unrecorded (a replay calls no host code), so on
// a GPU the probe sees uncaptured package calls only.
#include <dlfcn.h>  // dlsym, RTLD_NEXT

#include <cinttypes>  // PRIx64, PRId64
#include <cstdio>     // std::fopen, std::fprintf
#include <cstdlib>    // std::getenv
#include <mutex>      // std::mutex

#include <ATen/ATen.h>  // at::Tensor
#include <torch/csrc/inductor/aoti_torch/c/shim.h>  // AtenTensorHandle, AOTITorchError
#include <torch/csrc/inductor/aoti_torch/utils.h>   // tensor_handle_to_tensor_pointer
#if LOONGFORGE_WITH_CUDA
#include <c10/cuda/CUDAGraphsC10Utils.h>  // c10::cuda::currentStreamCaptureStatusMayInitCtx
#endif

namespace {

void record(const at::Tensor& mask) {
  const char* path = std::getenv("LOONGFORGE_MASK_PROBE");
  if (!path) return;
#if LOONGFORGE_WITH_CUDA
  if (mask.is_cuda() && c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) return;
#endif
  const at::Tensor bytes = mask.ne(0).to(at::kByte).cpu().contiguous();
  const auto* p = bytes.data_ptr<uint8_t>();
  uint64_t hash = 1469598103934665603ull;
  int64_t kept = 0;
  for (int64_t i = 0; i < bytes.numel(); ++i) hash = (hash ^ p[i]) * 1099511628211ull, kept += p[i];
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%" PRId64 " %" PRId64 " %016" PRIx64 "\n", bytes.numel(), kept, hash);
    std::fclose(f);
  }
}

template <class F>
F real(const char* name) {
  auto* f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
  if (!f) {
    std::fprintf(stderr, "mask_probe: libtorch has no %s\n", name);
    std::abort();
  }
  return f;
}

const at::Tensor& tensor(AtenTensorHandle h) { return *torch::aot_inductor::tensor_handle_to_tensor_pointer(h); }

}  // namespace

extern "C" {

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cpu_bernoulli__float(AtenTensorHandle self, double p,
                                                                 AtenGeneratorHandle* generator) {
  using Fn = AOTITorchError (*)(AtenTensorHandle, double, AtenGeneratorHandle*);
  static const Fn fn = real<Fn>("aoti_torch_cpu_bernoulli__float");
  const AOTITorchError e = fn(self, p, generator);
  if (e == AOTI_TORCH_SUCCESS) record(tensor(self));
  return e;
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cuda_bernoulli__float(AtenTensorHandle self, double p,
                                                                  AtenGeneratorHandle* generator) {
  using Fn = AOTITorchError (*)(AtenTensorHandle, double, AtenGeneratorHandle*);
  static const Fn fn = real<Fn>("aoti_torch_cuda_bernoulli__float");
  const AOTITorchError e = fn(self, p, generator);
  if (e == AOTI_TORCH_SUCCESS) record(tensor(self));
  return e;
}

AOTI_TORCH_EXPORT AOTITorchError aoti_torch_cuda_native_dropout(AtenTensorHandle input, double p, int32_t* train,
                                                                AtenTensorHandle* ret0, AtenTensorHandle* ret1) {
  using Fn = AOTITorchError (*)(AtenTensorHandle, double, int32_t*, AtenTensorHandle*, AtenTensorHandle*);
  static const Fn fn = real<Fn>("aoti_torch_cuda_native_dropout");
  const AOTITorchError e = fn(input, p, train, ret0, ret1);
  if (e == AOTI_TORCH_SUCCESS) record(tensor(*ret1));
  return e;
}

}  // extern "C"
