// The verb table: one row per verb; main.cpp builds the CLI and its help from it.
#include "verbs.hpp"

namespace loongforge::cli {

const std::vector<Verb>& verbs() {
#define ROW(name, fn, help) {name, help, fn##_options, fn##_run}
  static const std::vector<Verb> table = {
      ROW("status", status, "Step, loss, throughput, ETA, engines, strategy and world of a running trainer"),
      ROW("profile-step", profile_step, "Profile the next steps: per-phase times (JSON) plus a Chrome trace"),
      ROW("switch-strategy", switch_strategy, "Switch gradient communication between simple and hybrid, on every rank at one step"),
      ROW("monitor-comm", monitor_comm, "Live table of per-group communication bytes, time and bandwidth (Ctrl-C stops)"),
      ROW("hot-rejoin", hot_rejoin, "Admit a restarted rank back into the job at a step boundary"),
      ROW("mla-stats", mla_stats, "Memory pool usage, fragmentation and allocation time"),
      ROW("debug-dmf", debug_dmf, "Write a micro-batch fusion trace"),
      ROW("checkpoint-now", checkpoint_now, "Write a checkpoint on every rank at the next common step boundary"),
      ROW("stop", stop, "Checkpoint, then stop the trainer cleanly (exit 0) on every rank"),
      ROW("validate-checkpoint", validate_checkpoint, "Check a checkpoint's integrity and compatibility with a model file (offline)"),
      ROW("validate-dataset", validate_dataset, "Check a converted dataset before a run: index, shards, videos, frames, timestamps (offline)"),
  };
#undef ROW
  return table;
}

}  // namespace loongforge::cli
