// loongforge/common/error.hpp — the typed exceptions every room throws.
//
// Contract:
//  - Inside a process, failures are typed exceptions derived from Error. The
//    message names the file, key or rank involved and says what to do.
//  - Exceptions never cross threads: a worker captures std::exception_ptr and
//    the owning thread rethrows it.
//  - On the control socket an Error becomes {code, message}; code() is the
//    stable machine-readable name of the type.
//  - Each level may add a breadcrumb with with_context() ("while loading
//    model file X: ..."), NCCL-style.
//
// Example:
//   throw ConfigError("n16.yaml:12: trainer.lr: expected a number, got 'fast'");
#pragma once

#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

namespace loongforge {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
  // Stable name used on the wire and in logs ("config_error", ...).
  virtual const char* code() const noexcept { return "error"; }
};

#define LOONGFORGE_DEFINE_ERROR(Name, code_string)                          \
  class Name : public Error {                                               \
   public:                                                                  \
    using Error::Error;                                                     \
    const char* code() const noexcept override { return code_string; }      \
  }

LOONGFORGE_DEFINE_ERROR(ConfigError, "config_error");          // bad config file, key or override
LOONGFORGE_DEFINE_ERROR(ModelError, "model_error");            // bad or incompatible model file
LOONGFORGE_DEFINE_ERROR(DataError, "data_error");              // bad dataset, shard or video
LOONGFORGE_DEFINE_ERROR(CommError, "comm_error");              // collectives, rendezvous, dead ranks
LOONGFORGE_DEFINE_ERROR(CheckpointError, "checkpoint_error");  // unreadable or incompatible checkpoint
LOONGFORGE_DEFINE_ERROR(ControlError, "control_error");        // control socket and protocol
LOONGFORGE_DEFINE_ERROR(TrainingError, "training_error");      // NaN/Inf, divergence, step failures

#undef LOONGFORGE_DEFINE_ERROR

// Rethrows `e` (of the same dynamic type when it is one of ours) with
// "context: " prepended to its message.
[[noreturn]] void rethrow_with_context(const std::exception& e, const std::string& context);

// libtorch's message without its C++ backtrace; for an error re-wrapped by the
// TorchScript interpreter, its last line ("RuntimeError: CUDA out of memory.
// ...") plus the innermost model source line.
std::string short_libtorch_message(const std::string& what);

}  // namespace loongforge
