// loongforge/common/engine.hpp — the record every engine (GCTS, MLA, ADFE,
// DMF) fills in once, so that `status`, the control verbs and a checkpoint's
// loongforge_state/ are never edited per engine.
//
// Contract:
//  - Each engine room declares its record (comm: GCTS, memory: MLA, data:
//    ADFE, fusion: DMF; docs/architecture.md). The trainer collects the four
//    and hands them to the control plane (verbs, status) and to checkpoints
//    (state). Nothing else names an engine.
//  - `built` is a property of the binary (the engine's code is compiled in);
//    `enabled` is `<name>.enable` of the config and can only be true when built.
//  - Verbs of an engine that is not on answer `engine_off` naming what brings
//    it; their arguments are still checked first, so a malformed request is
//    `bad_args` either way.
//  - Callbacks run on the trainer thread (tasks, state) or, for `query` verbs
//    and `status`, on the control thread: a query's `run` must be thread-safe.
//  - No libtorch: the control plane and the CLI-side code can include this.
#pragma once

#include <functional>  // std::function
#include <set>         // std::set
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge {

struct EngineVerb {
  std::string name;    // "switch-strategy"
  bool query = false;  // answered on the control thread at once (else a task at the next step boundary)
  // What is wrong with the arguments ("" when nothing; the reply is then
  // bad_args with this text); may be empty.
  std::function<std::string(const nlohmann::json& args)> check_args;
  // The engine's answer when it is on.
  std::function<nlohmann::json(const nlohmann::json& args)> run;
  // A cluster-wide task: published on the control plane's command bus and
  // run by every rank at the same step boundary (Note [Cluster-wide verbs]
  // in src/trainer/control_plane.hpp); the receiving rank answers with its run's result.
  bool cluster = false;
};

struct Engine {
  std::string name;   // config section and status key: "gcts"
  std::string title;  // "GCTS"
  std::string what;   // one line: "gradient communication scheduling"
  std::string arrives_with;  // while not built: the issue that brings it ("the GCTS and NCCL issue")
  bool built = false;
  bool enabled = false;
  std::vector<EngineVerb> verbs;
  std::function<nlohmann::json()> status;                   // when on: its status object
  std::function<nlohmann::json()> save_state;               // when on: loongforge_state/<name>.json
  std::function<void(const nlohmann::json&)> load_state;    // when on: from a checkpoint

  bool on() const { return built && enabled; }
  // {"built", "enabled", "state", ...status()}: what `loongforge status` shows.
  nlohmann::json status_json() const;
};

// Names of the engines built into this binary.
std::set<std::string> built_engine_names(const std::vector<Engine>& engines);

// The record named `name` (std::logic_error when there is none: the engine
// registry and its caller disagree).
Engine& find_engine(std::vector<Engine>& engines, const std::string& name);

}  // namespace loongforge
