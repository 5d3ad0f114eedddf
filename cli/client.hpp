// cli/client.hpp — how `loongforge` verbs reach a running trainer: target
// selection (--pid, --socket, or the only trainer of this user), the
// handshake, one request/reply, and streams.
//
// Contract:
//  - add_target_options() gives a verb --pid/--socket/--json/--timeout.
//  - call() connects, greets, sends one request and returns the result; every
//    failure (no trainer, several trainers, permission denied, version
//    mismatch, busy, engine off, error reply) is thrown as ClientError with
//    the message a user should read and the verb's exit code.
//  - stream() calls `on_line` for each streamed result until the trainer
//    ends the stream, `on_line` returns false, or the process is interrupted.
#pragma once

#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string

#include <nlohmann/json.hpp>  // nlohmann::json

namespace CLI {
class App;
}

namespace loongforge::cli {

// Exit codes of remote verbs (README and `loongforge --help` list them).
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;          // the trainer answered with an error
constexpr int kExitUsage = 2;
constexpr int kExitEngineOff = 3;       // the verb's engine is off or not built (kExitNotAvailable)
constexpr int kExitNoTrainer = 4;       // nothing to talk to, or several and none chosen
constexpr int kExitPermission = 5;
constexpr int kExitVersion = 6;
constexpr int kExitBusy = 7;            // busy or no answer within --timeout

struct ClientError : std::runtime_error {
  ClientError(int exit_code_in, const std::string& message) : std::runtime_error(message), exit_code(exit_code_in) {}
  int exit_code;
};

struct TargetOptions {
  int64_t pid = 0;
  std::string socket;
  bool json = false;
  double timeout_s = 120;
};

void add_target_options(CLI::App& app, TargetOptions& opt);

// The socket to use; throws ClientError when none or several match.
std::string resolve_socket(const TargetOptions& opt);

nlohmann::json call(const TargetOptions& opt, const std::string& verb, const nlohmann::json& args = nlohmann::json::object());

void stream(const TargetOptions& opt, const std::string& verb, const nlohmann::json& args,
            const std::function<bool(const nlohmann::json& result)>& on_line);

// Runs `body` and turns a ClientError into its message on stderr and its exit
// code (prefixed "loongforge <verb>: ").
int run_remote(const std::string& verb, const std::function<int()>& body);

}  // namespace loongforge::cli
