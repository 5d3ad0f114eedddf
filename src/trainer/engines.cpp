// The engine records of this build, one from each engine room (engine.hpp).
#include "loongforge/comm/reducer.hpp"
#include "loongforge/data/source.hpp"
#include "loongforge/fusion/step_runner.hpp"
#include "loongforge/memory/memory.hpp"
#include "loongforge/trainer/trainer.hpp"

namespace loongforge::trainer {

std::vector<Engine> engine_records(const config::Config& cfg) {
  return {comm::engine(cfg), memory::engine(cfg), data::engine(cfg), fusion::engine(cfg)};
}

std::set<std::string> built_engines() { return built_engine_names(engine_records(config::Config{})); }

}  // namespace loongforge::trainer
