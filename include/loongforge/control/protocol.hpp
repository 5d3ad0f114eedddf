// loongforge/control/protocol.hpp — the control-socket protocol, shared by
// the server in loongforge-train and the `loongforge` client. One header, one
// version number (tmux-protocol.h style).
//
// Wire format (protocol version kProtocolVersion):
//  - A Unix stream socket; newline-delimited JSON, one object per line, at
//    most kMaxLineBytes per line (newline included).
//  - Every message carries the shared header {"v": <protocol version>}.
//  - The client's first line is the handshake:
//        {"v":1, "id":0, "verb":"hello", "args":{"client":"loongforge 0.1.0"}}
//    answered with the server's identity (pid, rank, world, version). Any other
//    first line, or a different "v", gets an error reply and a close.
//  - Requests:   {"v":1, "id":<uint>, "verb":"status", "args":{...}}
//    Replies:    {"v":1, "id":<same>, "ok":true,  "result":{...}}
//                {"v":1, "id":<same>, "ok":false, "error":{"code":"...","message":"..."}}
//    Streams (monitor-comm) send several {"ok":true,"stream":true,"result":...}
//    lines under one id and end with {"ok":true,"stream":false,...}; a client
//    ends a stream by closing the connection.
//  - Replies may arrive out of request order; match them by id.
//  - A line the server cannot use (not JSON, wrong types, unknown verb, too
//    long) is answered with an error reply; a line too long or a broken
//    handshake also closes the connection. Nothing a client sends stops the
//    trainer.
//
// Socket placement (socket_dir/socket_path): $XDG_RUNTIME_DIR/loongforge/<pid>.sock,
// else /tmp/loongforge-<uid>/<pid>.sock; the directory is 0700 and owned by the
// user, the socket 0600.
#pragma once

#include <cstdint>  // int64_t, uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::control {

constexpr int kProtocolVersion = 1;
constexpr size_t kMaxLineBytes = 64 * 1024;  // one request or reply line, newline included
constexpr size_t kMaxSocketPathBytes = 107;  // sizeof(sockaddr_un::sun_path) - 1 on Linux

// Error codes on the wire ({"code": ...}); stable names for scripts.
namespace code {
inline constexpr const char* kBadRequest = "bad_request";            // not JSON, wrong field types
inline constexpr const char* kLineTooLong = "line_too_long";         // over kMaxLineBytes
inline constexpr const char* kVersionMismatch = "version_mismatch";  // "v" differs from ours
inline constexpr const char* kHandshakeRequired = "handshake_required";
inline constexpr const char* kUnknownVerb = "unknown_verb";
inline constexpr const char* kBadArgs = "bad_args";                  // verb known, arguments wrong
inline constexpr const char* kBusy = "busy";                         // too many clients or pending requests
inline constexpr const char* kTimeout = "timeout";                   // client too slow to send a line
inline constexpr const char* kPermissionDenied = "permission_denied";
inline constexpr const char* kEngineOff = "engine_off";              // the verb's engine is off or not built
inline constexpr const char* kShuttingDown = "shutting_down";        // the trainer is exiting
inline constexpr const char* kFailed = "failed";                     // the action ran and failed
inline constexpr const char* kInternal = "internal";
}  // namespace code

// A parsed request line. parse_request() throws ProtocolError (code + message)
// for lines that are not a well-formed request of our version.
struct Request {
  uint64_t id = 0;
  std::string verb;
  nlohmann::json args = nlohmann::json::object();
};

struct ProtocolError {
  std::string code, message;
  uint64_t id = 0;  // the request id when it could be read, else 0
};

// Parses one line (without its newline).
Request parse_request(const std::string& line);

// Reply lines, newline included.
std::string reply_ok(uint64_t id, const nlohmann::json& result, bool stream = false);
std::string reply_error(uint64_t id, const std::string& code, const std::string& message);
std::string request_line(uint64_t id, const std::string& verb, const nlohmann::json& args);

// Socket placement. socket_dir(): $XDG_RUNTIME_DIR/loongforge when
// XDG_RUNTIME_DIR names a directory, else /tmp/loongforge-<uid>.
std::string socket_dir();
std::string socket_path(int64_t pid);
// Where a socket of a given pid may be (socket_dir() first, then the /tmp
// fallback when it differs); `loongforge --pid` tries both.
std::vector<std::string> socket_dirs();

// Makes `dir` (mkdir 0700 when absent) and checks that it is a real
// directory owned by this uid with no group/other permissions. Throws
// ControlError naming the directory, what is wrong and how to fix it.
void ensure_private_dir(const std::string& dir);

}  // namespace loongforge::control
