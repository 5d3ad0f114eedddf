// The verb table. Verbs that talk to a running trainer need the control plane
// (the Unix socket); until it lands their rows carry `lands_with` and the CLI
// answers so. Verbs that work offline run here.
#include "verbs.hpp"

namespace loongforge::cli {

const std::vector<Verb>& verbs() {
  static const std::vector<Verb> table = {
      {"status", "Step, loss, throughput, ETA, engines, strategy and world of a running trainer",
       "the control-plane issue (#4)", nullptr, nullptr},
      {"profile-step", "Profile steps of a running trainer: per-phase JSON plus a Chrome trace",
       "the control-plane issue (#4)", nullptr, nullptr},
      {"switch-strategy", "Switch gradient communication between simple and hybrid, on every rank at one step",
       "the control-plane issue (#4)", nullptr, nullptr},
      {"monitor-comm", "Live table of per-group communication bytes, time and bandwidth",
       "the control-plane issue (#4)", nullptr, nullptr},
      {"hot-rejoin", "Admit a restarted rank back into the job at a step boundary",
       "the control-plane issue (#4)", nullptr, nullptr},
      {"mla-stats", "Memory pool usage, fragmentation and allocation time", "the control-plane issue (#4)",
       nullptr, nullptr},
      {"debug-dmf", "Write a micro-batch fusion trace", "the control-plane issue (#4)", nullptr, nullptr},
      {"checkpoint-now", "Write a checkpoint at the next step boundary", "the control-plane issue (#4)", nullptr,
       nullptr},
      {"stop", "Checkpoint, then stop the trainer cleanly (exit 0)", "the control-plane issue (#4)", nullptr,
       nullptr},
      {"validate-checkpoint", "Check a checkpoint's integrity and compatibility with a model file (offline)", "",
       validate_checkpoint_options, validate_checkpoint_run},
  };
  return table;
}

}  // namespace loongforge::cli
