// loongforge/control/server.hpp — the control socket of loongforge-train.
//
// Contract:
//  - Owns one control thread that serves the Unix socket (protocol.hpp): it
//    accepts clients, frames and parses lines, checks the peer uid
//    (SO_PEERCRED), enforces the limits below and writes replies. It never
//    touches engine or model state.
//  - Verbs are registered before start(), in three kinds:
//      on_query(verb, fn):  fn(args) -> result runs on the control thread at
//                           once. It may only read state the trainer
//                           publishes thread-safely (e.g. a status snapshot).
//      on_task(verb, fn):   fn(args, reply) runs on the trainer thread inside
//                           drain(), which the trainer calls at every step
//                           boundary. `reply` may be answered then or later
//                           (profile-step answers after the profiled steps).
//      on_stream(verb, fn): fn(args, tick) -> result runs on the control
//                           thread every args.interval_s seconds and is sent
//                           as a stream line until the client goes away or
//                           args.count lines were sent. It is first called
//                           with tick = -1 to validate args (throw VerbError).
//    A handler throws VerbError(code, message) for an error reply; any other
//    exception becomes an "internal" error reply. Handlers never crash the
//    trainer.
//  - Limits (memory stays bounded whatever clients send): max_clients
//    connections (more get "busy" and a close), kMaxLineBytes per line,
//    max_outbox_bytes of unsent replies per client (a client that does not
//    read is closed), max_pending tasks waiting for the trainer thread
//    ("busy" beyond), line_timeout_ms to finish a started line, idle_timeout_ms
//    without traffic.
//  - The socket file is created 0600 in a private 0700 directory, a stale
//    socket at our path is removed, a live one (another process answering) is
//    an error; in the default directory every socket that refuses connections
//    (a killed trainer's) is removed too; the socket file appears only once
//    it listens (a client that sees it can connect); it is removed by
//    stop()/the destructor.
//
// Example:
//   control::Server server({});                     // $XDG_RUNTIME_DIR/loongforge/<pid>.sock
//   server.on_query("status", [&](const json&) { return status.get(); });
//   server.on_task("stop", [&](const json&, Reply r) { stop = true; r.ok({}); });
//   server.start();
//   for (...) { train_step(); server.drain(); }
#pragma once

#include <atomic>      // std::atomic
#include <cstdint>     // int64_t, uint64_t
#include <functional>  // std::function
#include <map>         // std::map
#include <memory>      // std::shared_ptr
#include <mutex>       // std::mutex
#include <string>      // std::string
#include <thread>      // std::thread
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::control {

// Thrown by handlers for an error reply {code, message}.
struct VerbError : std::runtime_error {
  VerbError(std::string code_in, const std::string& message) : std::runtime_error(message), code(std::move(code_in)) {}
  std::string code;
};

struct Outbox;  // replies travelling from the trainer thread to the control thread

// The answer to one task. Copyable; the first ok()/error() wins, later ones
// are ignored. A task whose every Reply copy is destroyed unanswered gets an
// "internal" error reply, so a client never waits forever.
class Reply {
 public:
  void ok(const nlohmann::json& result) const;
  void error(const std::string& code, const std::string& message) const;
  bool answered() const;

  struct State;
  explicit Reply(std::shared_ptr<State> s) : s_(std::move(s)) {}

 private:
  std::shared_ptr<State> s_;
};

struct ServerOptions {
  std::string socket_path;            // "" = socket_path(getpid())
  bool allow_root = false;            // accept uid 0 clients when we are not root
  int max_clients = 128;
  int max_pending = 256;              // tasks waiting for drain(), all clients together
  int max_pending_per_client = 32;
  size_t max_outbox_bytes = 4u << 20;
  int64_t line_timeout_ms = 5000;     // from a line's first byte to its newline
  int64_t idle_timeout_ms = 600000;   // no traffic, nothing pending
  nlohmann::json identity = nlohmann::json::object();  // merged into the handshake reply
};

// Counters since start (read from any thread).
struct ServerStats {
  uint64_t connections = 0, requests = 0, error_replies = 0, rejected_connections = 0;
  uint64_t closed_for_timeout = 0, closed_for_line_length = 0, closed_for_slow_reader = 0;
};

class Server {
 public:
  using QueryFn = std::function<nlohmann::json(const nlohmann::json& args)>;
  using TaskFn = std::function<void(const nlohmann::json& args, Reply reply)>;
  using StreamFn = std::function<nlohmann::json(const nlohmann::json& args, int64_t tick)>;

  explicit Server(ServerOptions options);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  void on_query(const std::string& verb, QueryFn fn);
  void on_task(const std::string& verb, TaskFn fn);
  void on_stream(const std::string& verb, StreamFn fn);

  // Creates the socket and starts the control thread. Throws ControlError
  // (directory permissions, path too long, a live server at the path).
  void start();
  // Runs the queued tasks on the calling (trainer) thread; returns how many.
  int drain();
  // Answers queued tasks with "shutting_down", closes every client, removes
  // the socket file and joins the thread. Idempotent.
  void stop();

  const std::string& path() const { return path_; }
  ServerStats stats() const;

 private:
  struct Handler;
  struct Task;
  class ControlLoop;  // the control thread's clients and poll set (server_client.cpp)
  void serve();       // the control thread

  ServerOptions opt_;
  std::string path_;
  std::map<std::string, std::shared_ptr<Handler>> handlers_;
  std::shared_ptr<Outbox> outbox_;
  std::mutex tasks_mu_;
  std::vector<Task> tasks_;  // guarded by tasks_mu_
  std::atomic<bool> stopping_{false};
  int listen_fd_ = -1, wake_fd_[2] = {-1, -1};
  std::thread thread_;
  mutable std::mutex stats_mu_;
  ServerStats stats_;
  bool started_ = false;
};

}  // namespace loongforge::control
