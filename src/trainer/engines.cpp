// The engine records of this build, one from each engine room (engine.hpp).
#include "loongforge/engines/adfe/adfe.hpp"
#include "loongforge/engines/dmf/dmf.hpp"
#include "loongforge/engines/gcts/gcts.hpp"
#include "loongforge/engines/mla/mla.hpp"
#include "loongforge/trainer/trainer.hpp"

namespace loongforge::trainer {

std::vector<Engine> engine_records(const config::Config& cfg) {
  return {gcts::engine(cfg), mla::engine(cfg), adfe::engine(cfg), dmf::engine(cfg)};
}

std::set<std::string> built_engines() { return built_engine_names(engine_records(config::Config{})); }

}  // namespace loongforge::trainer
