// loongforge-train's entry point for one rank (run.hpp) and the stop signals.
#include "loongforge/trainer/run.hpp"

#include <time.h>  // clock_gettime (async-signal-safe)

#include <atomic>  // std::atomic
#include <chrono>  // std::chrono::steady_clock
#include <csignal>  // std::signal, SIGTERM, SIGINT, SIGUSR1

#include "loongforge/trainer/trainer.hpp"
#include "stop_signal.hpp"

namespace loongforge::trainer {

namespace {
std::atomic<bool> g_stop{false}, g_requeue{false};
std::atomic<int64_t> g_signal_ns{-1};  // CLOCK_MONOTONIC (steady_clock's clock on Linux) at the first signal
extern "C" void on_stop_signal(int sig) {
  if (g_signal_ns.load() < 0) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    g_signal_ns = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }
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

std::optional<std::chrono::steady_clock::time_point> stop_signal_time() {
  const int64_t ns = g_signal_ns.load();
  if (ns < 0) return std::nullopt;
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

int run(const config::Config& cfg, const comm::WorldInfo& world) {
  Trainer trainer(cfg, world);
  return trainer.run();
}

}  // namespace loongforge::trainer
