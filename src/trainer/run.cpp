// loongforge-train's entry point for one rank (run.hpp) and the stop signals.
#include "loongforge/trainer/run.hpp"

#include <atomic>  // std::atomic
#include <csignal>  // std::signal, SIGTERM, SIGINT, SIGUSR1

#include "loongforge/trainer/trainer.hpp"
#include "stop_signal.hpp"

namespace loongforge::trainer {

namespace {
std::atomic<bool> g_stop{false}, g_requeue{false};
extern "C" void on_stop_signal(int sig) {
  // The first signal decides: a SIGUSR1 after a SIGTERM does not turn a stop
  // into a requeue. g_requeue is set before g_stop, which the trainer reads first.
  if (sig == SIGUSR1 && !g_stop.load()) g_requeue = true;
  g_stop = true;
  std::signal(sig, SIG_DFL);
}
}  // namespace

void install_stop_signals() {
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGUSR1, on_stop_signal);
}

bool stop_requested() { return g_stop.load(); }
bool requeue_requested() { return g_requeue.load(); }

int run(const config::Config& cfg, const comm::WorldInfo& world) {
  Trainer trainer(cfg, world);
  return trainer.run();
}

}  // namespace loongforge::trainer
