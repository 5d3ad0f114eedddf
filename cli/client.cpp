// Talking to a trainer's control socket (client.hpp).
#include "client.hpp"

#include <dirent.h>      // opendir, readdir
#include <poll.h>        // poll
#include <signal.h>      // kill
#include <sys/socket.h>  // socket, connect
#include <sys/un.h>      // sockaddr_un
#include <unistd.h>      // close, read, write

#include <cerrno>    // errno
#include <chrono>    // std::chrono::steady_clock
#include <csignal>   // std::signal, SIGINT
#include <cstring>   // std::strerror, std::memcpy
#include <fstream>   // std::ifstream
#include <iostream>  // std::cerr
#include <vector>    // std::vector

#include <CLI/CLI.hpp>  // CLI::App

#include "loongforge/common/version.hpp"
#include "loongforge/control/protocol.hpp"

namespace loongforge::cli {

using nlohmann::json;
namespace code = control::code;

void add_target_options(CLI::App& app, TargetOptions& opt) {
  app.add_option("--pid", opt.pid, "Talk to the trainer with this process id");
  app.add_option("--socket", opt.socket, "Talk to the trainer serving this socket path");
  app.add_flag("--json", opt.json, "Print the reply as JSON (for scripts)");
  app.add_option("--timeout", opt.timeout_s, "Seconds to wait for the answer (requests run at step boundaries)")
      ->capture_default_str();
}

// ---------------------------------------------------------------------------
// Target selection

namespace {

bool pid_alive(int64_t pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

std::string cmdline_of(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline");
  std::string all, arg;
  while (std::getline(f, arg, '\0')) all += (all.empty() ? "" : " ") + arg;
  return all.size() > 100 ? all.substr(0, 97) + "..." : all;
}

}  // namespace

std::string resolve_socket(const TargetOptions& opt) {
  if (!opt.socket.empty()) return opt.socket;
  if (opt.pid > 0) {
    for (const auto& dir : control::socket_dirs()) {
      const std::string p = dir + "/" + std::to_string(opt.pid) + ".sock";
      if (::access(p.c_str(), F_OK) == 0) return p;
    }
    if (!pid_alive(opt.pid)) throw ClientError(kExitNoTrainer, "no process with pid " + std::to_string(opt.pid) + " is running");
    throw ClientError(kExitNoTrainer, "pid " + std::to_string(opt.pid) + " serves no control socket in " +
                                          control::socket_dirs().front() +
                                          " (is it a loongforge-train of this user? was control.enable=false or "
                                          "control.socket set? then pass --socket PATH)");
  }
  // Automatic selection looks where a trainer started in this environment
  // puts its socket (socket_dir()); --pid also tries the /tmp fallback.
  std::vector<std::pair<int64_t, std::string>> live;
  std::string looked;
  for (const auto& dir : {control::socket_dir()}) {
    looked += (looked.empty() ? "" : ", ") + dir;
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() < 6 || name.substr(name.size() - 5) != ".sock") continue;
      const int64_t pid = std::atoll(name.c_str());
      if (pid > 0 && pid_alive(pid)) live.emplace_back(pid, dir + "/" + name);
    }
    ::closedir(d);
  }
  if (live.size() == 1) return live.front().second;
  if (live.empty())
    throw ClientError(kExitNoTrainer, "no running loongforge-train of this user found (looked in " + looked +
                                          "); start one, or pass --pid PID or --socket PATH (a trainer started "
                                          "with another XDG_RUNTIME_DIR, or none, puts its socket elsewhere)");
  std::string list = std::to_string(live.size()) + " trainers are running; choose one with --pid:";
  for (const auto& [pid, path] : live) list += "\n  --pid " + std::to_string(pid) + "   " + cmdline_of(pid);
  throw ClientError(kExitNoTrainer, list);
}

// ---------------------------------------------------------------------------
// One connection

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_interrupt(int) { g_interrupted = 1; }

int exit_code_for(const std::string& c) {
  if (c == code::kEngineOff) return kExitEngineOff;
  if (c == code::kPermissionDenied) return kExitPermission;
  if (c == code::kVersionMismatch) return kExitVersion;
  if (c == code::kBusy || c == code::kTimeout) return kExitBusy;
  if (c == code::kBadArgs) return kExitUsage;
  return kExitFailed;
}

class Connection {
 public:
  Connection(const std::string& path, double timeout_s) : path_(path), timeout_s_(timeout_s) {
    if (path.size() > control::kMaxSocketPathBytes) throw ClientError(kExitUsage, "socket path too long: " + path);
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (::connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      const int err = errno;
      ::close(fd_);
      if (err == EACCES || err == EPERM)
        throw ClientError(kExitPermission, "permission denied on " + path +
                                               ": the trainer belongs to another user; run loongforge as that user");
      if (err == ECONNREFUSED)
        throw ClientError(kExitNoTrainer, "nobody answers on " + path + ": its trainer has exited (stale socket)");
      if (err == ENOENT) throw ClientError(kExitNoTrainer, "no trainer at " + path + " (no such socket)");
      throw ClientError(kExitNoTrainer, "cannot connect to " + path + ": " + std::strerror(err));
    }
    const json hello = request(0, "hello", {{"client", "loongforge " + version_string()}});
    (void)hello;
  }
  ~Connection() { ::close(fd_); }

  void send_line(const std::string& line) {
    size_t off = 0;
    while (off < line.size()) {
      const ssize_t n = ::send(fd_, line.data() + off, line.size() - off, MSG_NOSIGNAL);
      if (n <= 0) {
        // The trainer may have refused us (permission, busy) and closed at
        // once: its error line is already waiting; report that instead.
        json r;
        try {
          r = read_reply(1.0);
        } catch (const ClientError&) {
          throw ClientError(kExitFailed, "the trainer closed the connection (" + path_ + ")");
        }
        check(r);
        throw ClientError(kExitFailed, "the trainer closed the connection (" + path_ + ")");
      }
      off += static_cast<size_t>(n);
    }
  }

  // The next reply line; throws ClientError on timeout, close or interrupt.
  json read_reply(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        const std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        json j = json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.is_object()) throw ClientError(kExitFailed, "the trainer sent an unreadable reply");
        return j;
      }
      if (g_interrupted) throw ClientError(130, "interrupted");
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0)
        throw ClientError(kExitBusy, "trainer busy: no answer within " + std::to_string(static_cast<int>(timeout_s)) +
                                         " s (requests run at step boundaries; a long step or checkpoint delays "
                                         "them): retry, or raise --timeout");
      pollfd p{fd_, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 200)));
      if (r < 0 && errno != EINTR) throw ClientError(kExitFailed, std::string("poll: ") + std::strerror(errno));
      if (r <= 0) continue;
      char tmp[65536];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) throw ClientError(kExitFailed, "the trainer closed the connection without answering (it may have exited)");
      buf_.append(tmp, static_cast<size_t>(n));
      if (buf_.size() > (64u << 20)) throw ClientError(kExitFailed, "reply too large");
    }
  }

  // Sends a request and returns the result of the reply with its id.
  json request(uint64_t id, const std::string& verb, const json& args) {
    send_line(control::request_line(id, verb, args));
    for (;;) {
      json r = read_reply(timeout_s_);
      if (r.value("id", uint64_t{0}) != id && r.value("ok", true)) continue;  // not ours
      check(r);
      return r.value("result", json::object());
    }
  }

  static void check(const json& r) {
    if (r.value("ok", false)) return;
    const json e = r.value("error", json::object());
    const std::string c = e.value("code", std::string(code::kInternal));
    throw ClientError(exit_code_for(c), e.value("message", std::string("(no message)")) + " [" + c + "]");
  }

 private:
  std::string path_;
  double timeout_s_;
  int fd_ = -1;
  std::string buf_;
};

}  // namespace

json call(const TargetOptions& opt, const std::string& verb, const json& args) {
  Connection c(resolve_socket(opt), opt.timeout_s);
  return c.request(1, verb, args);
}

void stream(const TargetOptions& opt, const std::string& verb, const json& args,
            const std::function<bool(const json&)>& on_line) {
  std::signal(SIGINT, on_interrupt);
  Connection c(resolve_socket(opt), opt.timeout_s);
  c.send_line(control::request_line(1, verb, args));
  for (;;) {
    json r;
    try {
      r = c.read_reply(opt.timeout_s);
    } catch (const ClientError& e) {
      if (e.exit_code == 130) return;  // Ctrl-C ends a stream normally
      throw;
    }
    Connection::check(r);
    if (!on_line(r.value("result", json::object())) || !r.value("stream", false)) return;
  }
}

int run_remote(const std::string& verb, const std::function<int()>& body) {
  try {
    return body();
  } catch (const ClientError& e) {
    std::cerr << "loongforge " << verb << ": " << e.what() << "\n";
    return e.exit_code;
  }
}

}  // namespace loongforge::cli
