// Training entry point. This first version checks that the model loads and
// runs one forward/backward on an example batch; the data path and the loop
// over the dataset arrive with the train-end-to-end issue (#3).
#include "loongforge/trainer/run.hpp"

#include <torch/torch.h>  // torch::NoGradGuard

#include "loongforge/common/log.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::trainer {

int run(const config::Config& cfg, int64_t /*world_size*/) {
  const auto& log = logger("trainer");
  auto model = model::Model::load(cfg.model.path, c10::Device(c10::kCPU));
  model.train();
  auto batch = model::make_example_batch(model.info(), cfg.trainer.micro_batch_size, cfg.run.seed);
  auto out = model.forward(batch);
  out.at("loss").backward();
  LF_LOG(log, info) << "model check passed: loss " << out.at("loss").item<double>() << " over "
                    << out.at("num_valid").item<double>() << " valid elements";
  LF_LOG(log, error) << "training on a dataset is not available in this build yet: it arrives with issue #3";
  return 3;
}

}  // namespace loongforge::trainer
