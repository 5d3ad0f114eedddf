// loongforge-train's entry point for one rank (run.hpp) and the stop signals.
#include "loongforge/trainer/run.hpp"

#include <atomic>  // std::atomic
#include <csignal>  // std::signal, SIGTERM, SIGINT

#include "loongforge/trainer/trainer.hpp"
#include "stop_signal.hpp"

namespace loongforge::trainer {

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int sig) {
  g_stop = true;
  std::signal(sig, SIG_DFL);
}
}  // namespace

void install_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

bool stop_requested() { return g_stop.load(); }

int run(const config::Config& cfg, const comm::WorldInfo& world) {
  Trainer trainer(cfg, world);
  return trainer.run();
}

}  // namespace loongforge::trainer
