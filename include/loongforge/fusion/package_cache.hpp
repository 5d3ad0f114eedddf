// loongforge/fusion/package_cache.hpp — trainer.compiled_step=auto: the
// compiled step's AOTInductor packages kept in a cache directory on this
// machine, found by a digest of everything the package's manifest must match,
// and compiled by scripts/compile_step.py (a subprocess) on a miss.
//
// Contract:
//  - The key (PackageKey) holds what the compiled runner checks before it
//    loads a package (src/fusion/compiled_runner.cpp): the model file's
//    architecture hash (config.json + params.json: architecture, names,
//    shapes, freezing), its model-code hash, the trainable parameter names,
//    the micro-batch size, the action horizon and the text slot's width (the
//    rest of the batch's shape follows from the model config), the precision, the device kind and the GPU architecture
//    (sm_XX), the torch version; and the SHA-256 of the compile script, so a
//    changed compiler makes new entries. The entry's file is
//    <model>-b<B>-<device>-<precision>-<digest, 16 hex>.pt2 in the cache
//    directory (cache_dir()), beside it <same>.log (the last compile's
//    output) and <same>.lock.
//  - prepare_package() returns the entry: a hit when the file is there and
//    its manifest reads back and matches the key; otherwise (absent, or
//    unreadable / not matching: a corrupted or stale file, logged and
//    replaced) it compiles it. The compile writes to a temporary name of this
//    process and is renamed onto the entry only when complete (rename is
//    atomic within the directory), so a reader never sees half a package.
//    Two processes on one machine (two local ranks, two runs) take the
//    entry's lock file (flock): the second waits, then finds the finished
//    package (a hit) instead of compiling again.
//  - While compiling, each line the script prints goes to the entry's .log,
//    to the log (room "fusion"), and to `progress` with the elapsed time and
//    an estimate (the last compile of the same model, device and GPU
//    architecture recorded in the directory's compile_times.jsonl; none
//    before the first); a silent stretch reports every 30 s.
//  - A failed compile throws CompileFailed (a ConfigError) naming the log's
//    path and ending with its last lines; nothing is left at the entry.
//  - Trainer thread (or loongforge-train --compile-only); blocks for the
//    whole compile.
//
// Example:
//   const CompileTools tools = find_compile_tools();
//   const PackageKey key = package_key(net, cfg.trainer.micro_batch_size, cfg.data.action_horizon,
//                                      cfg.data.max_text_len, bf16, device, tools);
//   const PreparedPackage p = prepare_package(cache_dir(cfg), key, tools, progress);  // p.path: load it
#pragma once

#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include <c10/core/Device.h>  // c10::Device
#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/error.hpp"
#include "loongforge/config/config.hpp"
#include "loongforge/model/model.hpp"

namespace loongforge::fusion {

// How to run the compiler: the Python with torch and scripts/compile_step.py.
//  python: $LOONGFORGE_PYTHON, else the Python this build was configured with
//          (CMake's LOONGFORGE_PYTHON) when it exists, else python3 on PATH.
//  script: $LOONGFORGE_SCRIPTS_DIR/compile_step.py, else
//          <executable's folder>/../share/loongforge/scripts/compile_step.py,
//          else the source tree this binary was built from.
//  ops_library: the build's libloongforge_ops.so when it exists (passed as
//          LOONGFORGE_OPS_LIBRARY unless set: models with category_linear=grouped).
// Throws ConfigError naming the variables to set when the script is not found.
struct CompileTools {
  std::string python, script, ops_library;
};
CompileTools find_compile_tools();

// trainer.compile_cache, else $LOONGFORGE_CACHE/compiled, else ~/.cache/loongforge/compiled.
std::string cache_dir(const config::Config& cfg);

// The CUDA driver's JIT cache beside the packages: sets CUDA_CACHE_PATH to
// <cache_dir(cfg)>/cuda-jit (made when missing) so that kernels the driver
// compiles from PTX on their first use (seconds of CPU in a machine's first
// step: Note [The driver's JIT cache] in package_cache.cpp) are kept with the
// packages and found by every run that finds them, on this machine or any
// that shares the directory. Does nothing, returning "", for run.device=cpu,
// when CUDA_CACHE_PATH or CUDA_CACHE_DISABLE is set (the user's choice), or
// when the directory cannot be made (the driver's default stays). Must run
// before the process's first CUDA call (the driver reads it once); returns
// the path it set.
std::string share_cuda_jit_cache(const config::Config& cfg);

struct PackageKey {
  std::string model_name, model_path, architecture_hash, code_hash;
  std::vector<std::string> trainable;
  int64_t micro_batch = 0;
  int64_t action_horizon = 0;  // data.action_horizon: the actions' second dimension
  int64_t text_width = 0;      // the text slot's width in the batches (data.max_text_len, or DMF's width)
  int64_t model_text_slot = 0; // the model file's own slot (flops.json L): a width equal to it is not in to_json()
  std::string precision;  // fp32 | bf16
  std::string device;     // cpu | cuda
  std::string gpu_arch;   // sm_90, ...; "" on the CPU
  std::string torch_version, script_hash;
  std::vector<std::string> bf16_weights;  // taken as bf16 working copies (--bf16-weights); in the key when any

  nlohmann::json to_json() const;  // every field but the model's path
  std::string digest() const;      // SHA-256 (hex) of to_json()
  std::string file_name() const;   // <model>-b<B>-<device>-<precision>-<digest 16>.pt2
};
PackageKey package_key(const model::Model& net, int64_t micro_batch, int64_t action_horizon, int64_t text_width,
                       bool bf16, c10::Device device, const CompileTools& tools,
                       const std::vector<std::string>& bf16_weights = {});

struct PreparedPackage {
  std::string path;
  bool compiled = false;  // false: a cache hit
  double compile_s = 0;   // this process's compile (0 on a hit)
  double waited_s = 0;    // waiting for another process's compile of the same entry
  std::string log;        // the entry's compile log
  std::string key;        // the digest
  nlohmann::json to_json() const;
};

// Progress while compiling: {"state": "waiting"|"compiling", "package", "elapsed_s", "estimate_s" (null when
// none), "stage" (the compiler's last line)}.
using CompileProgress = std::function<void(const nlohmann::json&)>;

class CompileFailed : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

PreparedPackage prepare_package(const std::string& dir, const PackageKey& key, const CompileTools& tools,
                                const CompileProgress& progress);

// The micro-batch a package was compiled for (its manifest's actions' first dimension); -1 when unreadable.
int64_t package_micro_batch(const std::string& path);
// The action horizon a package was compiled for (its manifest's actions' second dimension); -1 when unreadable.
int64_t package_action_horizon(const std::string& path);
// The text slot's width a package was compiled for (its manifest's text_tokens' second dimension); -1 when
// unreadable.
int64_t package_text_width(const std::string& path);

// Removes an entry the compiled runner could not load (its file only; the next prepare compiles it).
void discard_package(const std::string& path);

}  // namespace loongforge::fusion
