// Protocol framing helpers and socket placement (protocol.hpp).
#include "loongforge/control/protocol.hpp"

#include <sys/stat.h>  // mkdir, lstat
#include <unistd.h>    // getuid

#include <cerrno>   // errno
#include <cstdlib>  // std::getenv
#include <cstring>  // std::strerror

#include "loongforge/common/error.hpp"

namespace loongforge::control {

using nlohmann::json;

// ---------------------------------------------------------------------------
// Lines

Request parse_request(const std::string& line) {
  json doc = json::parse(line, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw ProtocolError{code::kBadRequest, "not a JSON object (one JSON object per line)", 0};
  if (!doc.is_object()) throw ProtocolError{code::kBadRequest, "expected a JSON object, got " + std::string(doc.type_name()), 0};
  Request r;
  if (auto it = doc.find("id"); it != doc.end()) {
    if (!it->is_number_unsigned())
      throw ProtocolError{code::kBadRequest, "\"id\" must be a non-negative integer", 0};
    r.id = it->get<uint64_t>();
  }
  auto v = doc.find("v");
  if (v == doc.end() || !v->is_number_integer())
    throw ProtocolError{code::kBadRequest, "missing protocol version \"v\" (this server speaks " +
                                               std::to_string(kProtocolVersion) + ")", r.id};
  if (v->get<int64_t>() != kProtocolVersion)
    throw ProtocolError{code::kVersionMismatch,
                        "client speaks protocol " + std::to_string(v->get<int64_t>()) + ", this trainer speaks " +
                            std::to_string(kProtocolVersion) +
                            ": use the loongforge client from the same build as loongforge-train",
                        r.id};
  auto verb = doc.find("verb");
  if (verb == doc.end() || !verb->is_string() || verb->get_ref<const std::string&>().empty())
    throw ProtocolError{code::kBadRequest, "missing \"verb\" (a string such as \"status\")", r.id};
  r.verb = verb->get<std::string>();
  if (auto a = doc.find("args"); a != doc.end()) {
    if (!a->is_object()) throw ProtocolError{code::kBadRequest, "\"args\" must be an object", r.id};
    r.args = std::move(*a);
  }
  return r;
}

namespace {
std::string line_of(const json& j) {
  // Replace invalid UTF-8 instead of throwing: messages may quote client bytes.
  return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
}
}  // namespace

std::string reply_ok(uint64_t id, const json& result, bool stream) {
  json j = {{"v", kProtocolVersion}, {"id", id}, {"ok", true}, {"result", result}};
  if (stream) j["stream"] = true;
  return line_of(j);
}

std::string reply_error(uint64_t id, const std::string& code_name, const std::string& message) {
  return line_of({{"v", kProtocolVersion},
                  {"id", id},
                  {"ok", false},
                  {"error", {{"code", code_name}, {"message", message}}}});
}

std::string request_line(uint64_t id, const std::string& verb, const json& args) {
  return line_of({{"v", kProtocolVersion}, {"id", id}, {"verb", verb}, {"args", args}});
}

// ---------------------------------------------------------------------------
// Placement

std::string socket_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  struct stat st {};
  if (xdg && *xdg && ::stat(xdg, &st) == 0 && S_ISDIR(st.st_mode)) return std::string(xdg) + "/loongforge";
  return "/tmp/loongforge-" + std::to_string(::getuid());
}

std::vector<std::string> socket_dirs() {
  std::vector<std::string> dirs = {socket_dir()};
  const std::string fallback = "/tmp/loongforge-" + std::to_string(::getuid());
  if (dirs.front() != fallback) dirs.push_back(fallback);
  return dirs;
}

std::string socket_path(int64_t pid) { return socket_dir() + "/" + std::to_string(pid) + ".sock"; }

void ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw ControlError("cannot create the control socket directory " + dir + ": " + std::strerror(errno) +
                       " (set control.socket to a writable path, or control.enable=false)");
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    throw ControlError("cannot inspect the control socket directory " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    throw ControlError("the control socket directory " + dir +
                       " exists but is not a directory (a symlink or file): remove it, then start again");
  if (st.st_uid != ::getuid())
    throw ControlError("the control socket directory " + dir + " belongs to uid " + std::to_string(st.st_uid) +
                       ", not to this user (uid " + std::to_string(::getuid()) +
                       "): someone else created it; remove it or set control.socket to a path of your own");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw ControlError("the control socket directory " + dir + " has mode " + mode +
                       "; it must be private (0700) so that no other user can reach the trainer: run "
                       "`chmod 700 " + dir + "` and start again");
  }
}

}  // namespace loongforge::control
