// The optimizer graph (optimizer_graph.hpp).
#include "loongforge/optim/optimizer_graph.hpp"

#include <cstdint>  // int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "loongforge/common/log.hpp"
#include "loongforge/fusion/cuda_graph.hpp"

#if LOONGFORGE_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>  // c10::cuda::getStreamFromPool
#endif

namespace loongforge::optim {

#if LOONGFORGE_WITH_CUDA_KERNELS
namespace {

class CudaOptimizerGraph final : public OptimizerGraph {
 public:
  CudaOptimizerGraph(FusedAdamW& opt, double max_norm, bool required, c10::Device device)
      : opt_(opt), max_norm_(max_norm), required_(required),
        side_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index())) {}

  at::Tensor step(double lr) override {
    std::vector<const void*> now;
    now.reserve(opt_.params().size());
    for (const auto& p : opt_.params()) now.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
    if (now != addresses_) {
      if (graph_) ++invalidations_;
      graph_.reset();
      stable_ = 0;
      addresses_ = std::move(now);
    }
    opt_.set_lr(lr);
    at::Tensor norm;
    fusion::on_side_stream(side_, [&] {
      if (!graph_ && !failed_ && ++stable_ > fusion::kGraphWarmupCalls) capture();
      if (graph_) {
        graph_->replay();
        ++replays_;
        norm = norm_;
      } else {
        norm = opt_.clip_grad_norm(max_norm_);
        opt_.update();
      }
    });
    opt_.zero_grad();
    return norm;
  }

  nlohmann::json status() const override {
    return {{"captures", captures_}, {"replays", replays_}, {"invalidations", invalidations_},
            {"capture_failures", failures_}};
  }

 private:
  void capture() {
    // A fresh memory pool for each capture: the pool of a dropped graph is
    // released with it, and the caching allocator refuses to capture into a
    // released pool's id (INTERNAL ASSERT use_count > 0, seen on the H200).
    graph_ = fusion::capture_or_fallback(
        at::cuda::graph_pool_handle(),
        [&] {
          norm_ = opt_.clip_grad_norm(max_norm_);
          opt_.update();
        },
        {"clipping and the fused AdamW update", "the optimizer runs eagerly", required_, -1, &failures_, ""});
    if (!graph_) {
      failed_ = true;
      return;
    }
    ++captures_;
    LF_LOG(logger("trainer"), info) << "captured clipping and the fused AdamW update as a CUDA graph";
  }

  FusedAdamW& opt_;
  double max_norm_;
  bool required_;
  c10::cuda::CUDAStream side_;
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
  at::Tensor norm_;
  std::vector<const void*> addresses_;
  int64_t stable_ = 0, captures_ = 0, replays_ = 0, invalidations_ = 0, failures_ = 0;
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<OptimizerGraph> make_optimizer_graph(FusedAdamW& optimizer, double max_norm, bool required,
                                                     c10::Device device) {
  if (!device.is_cuda()) return nullptr;
  return std::make_unique<CudaOptimizerGraph>(optimizer, max_norm, required, device);
}

#else

std::unique_ptr<OptimizerGraph> make_optimizer_graph(FusedAdamW&, double, bool, c10::Device) { return nullptr; }

#endif

}  // namespace loongforge::optim
