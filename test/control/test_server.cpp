// Proves a real control::Server on a temporary socket: the handshake answers
// with the server's identity and refuses a client that skips it or speaks
// another protocol version; a query is answered on the control thread; a task
// waits for drain() on the calling (trainer) thread; handler errors and
// unknown verbs become error replies; a line over kMaxLineBytes is refused
// and the connection closed; stop() removes the socket and runs no queued task;
// the socket file, once it exists, accepts connections; a path another server
// serves is refused, with a hint about {rank} where the job has several ranks.
#include <dirent.h>      // opendir, readdir
#include <poll.h>        // poll
#include <stdlib.h>      // mkdtemp
#include <sys/socket.h>  // socket, connect
#include <sys/un.h>      // sockaddr_un
#include <unistd.h>      // close, read, write, rmdir

#include <atomic>   // std::atomic
#include <chrono>   // std::chrono::steady_clock
#include <cstring>  // std::memcpy
#include <string>
#include <thread>  // std::thread
#include <vector>

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"  // loongforge::ControlError
#include "loongforge/control/protocol.hpp"
#include "loongforge/control/server.hpp"

using namespace loongforge::control;
using lf_catch::Contains;
using nlohmann::json;

namespace {

// A Server on <fresh private dir>/c.sock with a query, a task and a failing verb.
struct Fixture {
  std::string dir, path;
  Server server;
  int drained_tasks = 0;
  static ServerOptions options(const std::string& path) {
    ServerOptions o;
    o.socket_path = path;
    o.identity = {{"rank", 0}, {"world", 1}};
    return o;
  }
  static std::string make_dir() {
    char name[] = "/tmp/lf-control-XXXXXX";
    return ::mkdtemp(name);
  }
  Fixture() : dir(make_dir()), path(dir + "/c.sock"), server(options(path)) {
    server.on_query("echo", [](const json& args) { return json{{"got", args}}; });
    server.on_query("refuse", [](const json&) -> json { throw VerbError(code::kBadArgs, "refuse always refuses"); });
    server.on_task("double", [this](const json& args, Reply reply) {
      ++drained_tasks;
      reply.ok({{"x2", args.at("x").get<int>() * 2}});
    });
    server.on_task("forget", [](const json&, Reply) {});  // drops its Reply unanswered
    server.start();
  }
  ~Fixture() {
    server.stop();
    ::rmdir(dir.c_str());
  }
};

// A blocking client that reads whole lines.
struct Client {
  int fd = -1;
  std::string buffered;
  explicit Client(const std::string& path) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
  }
  ~Client() { ::close(fd); }
  void send(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server closed on us
      done += static_cast<size_t>(n);
    }
  }
  // The next line as JSON; null on EOF. `server` (optional) is drained while
  // waiting, as the trainer thread would at its step boundaries.
  json line(Server* server = nullptr, int timeout_ms = 5000) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (buffered.find('\n') == std::string::npos) {
      if (server) server->drain();
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 10) == 1) {
        char buf[4096];
        const ssize_t n = ::read(fd, buf, sizeof buf);
        if (n <= 0) return nullptr;
        buffered.append(buf, static_cast<size_t>(n));
      }
      if (std::chrono::steady_clock::now() > until) FAIL("no reply within " << timeout_ms << " ms");
    }
    const auto nl = buffered.find('\n');
    const std::string l = buffered.substr(0, nl);
    buffered.erase(0, nl + 1);
    return json::parse(l);
  }
  json hello() {
    send(request_line(0, "hello", {{"client", "test"}}));
    return line();
  }
};

}  // namespace

TEST_CASE("control: the handshake answers with the server's identity and its verbs") {
  Fixture f;
  Client c(f.path);
  const json r = c.hello();
  REQUIRE(r.at("ok") == true);
  REQUIRE(r.at("id") == 0);
  const json& who = r.at("result");
  REQUIRE(who.at("server") == "loongforge-train");
  REQUIRE(who.at("protocol") == kProtocolVersion);
  REQUIRE(who.at("pid") == static_cast<int64_t>(::getpid()));
  REQUIRE(who.at("rank") == 0);  // identity merged in
  REQUIRE(who.at("world") == 1);
  REQUIRE(who.at("verbs") == json::array({"double", "echo", "forget", "refuse"}));
}

TEST_CASE("control: a client that skips the handshake or speaks another version is refused and closed") {
  Fixture f;
  {
    Client c(f.path);
    c.send(request_line(1, "echo", json::object()));
    const json r = c.line();
    REQUIRE(r.at("ok") == false);
    REQUIRE(r.at("error").at("code") == code::kHandshakeRequired);
    REQUIRE(c.line().is_null());  // closed
  }
  {
    Client c(f.path);
    c.send(R"({"v":2,"id":0,"verb":"hello"})"
           "\n");
    const json r = c.line();
    REQUIRE(r.at("error").at("code") == code::kVersionMismatch);
    REQUIRE_THAT(r.at("error").at("message").get<std::string>(), Contains("client speaks protocol 2"));
    REQUIRE(c.line().is_null());
  }
  {
    Client c(f.path);
    c.send("not json\n");
    REQUIRE(c.line().at("error").at("code") == code::kBadRequest);
    REQUIRE(c.line().is_null());
  }
}

TEST_CASE("control: a query is answered at once and a task when the trainer thread drains") {
  Fixture f;
  Client c(f.path);
  c.hello();
  c.send(request_line(3, "echo", {{"a", 1}}));
  REQUIRE(c.line() == json{{"v", 1}, {"id", 3}, {"ok", true}, {"result", {{"got", {{"a", 1}}}}}});

  c.send(request_line(4, "double", {{"x", 21}}));
  // Without drain() the task waits.
  pollfd p{c.fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 200) == 0);
  REQUIRE(f.drained_tasks == 0);
  const json r = c.line(&f.server);
  REQUIRE(f.drained_tasks == 1);
  REQUIRE(r.at("id") == 4);
  REQUIRE(r.at("result") == json{{"x2", 42}});

  // Errors: a handler's VerbError, an unknown verb, a task dropped unanswered.
  c.send(request_line(5, "refuse", json::object()));
  REQUIRE(c.line().at("error") == json{{"code", "bad_args"}, {"message", "refuse always refuses"}});
  c.send(request_line(6, "no-such-verb", json::object()));
  REQUIRE(c.line().at("error") == json{{"code", "unknown_verb"}, {"message", "unknown verb 'no-such-verb'"}});
  c.send(request_line(7, "forget", json::object()));
  const json dropped = c.line(&f.server);
  REQUIRE(dropped.at("id") == 7);
  REQUIRE(dropped.at("error").at("code") == code::kInternal);
  // The connection is still usable after errors.
  c.send(request_line(8, "echo", {{"b", 2}}));
  REQUIRE(c.line().at("result") == json{{"got", {{"b", 2}}}});

  const ServerStats s = f.server.stats();
  REQUIRE(s.connections == 1);
  REQUIRE(s.requests == 7);
  REQUIRE(s.error_replies == 3);
}

TEST_CASE("control: a line over the limit is refused and its connection closed") {
  Fixture f;
  Client c(f.path);
  c.hello();
  c.send(std::string(R"({"v":1,"id":2,"verb":"echo","args":{"pad":")") + std::string(kMaxLineBytes, 'x') + "\"}}\n");
  const json r = c.line();
  REQUIRE(r.at("ok") == false);
  REQUIRE(r.at("error").at("code") == code::kLineTooLong);
  REQUIRE(r.at("error").at("message") == "line longer than " + std::to_string(kMaxLineBytes) + " bytes");
  REQUIRE(c.line().is_null());
  REQUIRE(f.server.stats().closed_for_line_length == 1);

  // A line just under the limit is served.
  Client ok(f.path);
  ok.hello();
  const std::string head = R"({"v":1,"id":3,"verb":"echo","args":{"pad":")";
  ok.send(head + std::string(kMaxLineBytes - head.size() - 4, 'y') + "\"}}\n");
  REQUIRE(ok.line().at("result").at("got").at("pad").get<std::string>().size() == kMaxLineBytes - head.size() - 4);
}

TEST_CASE("control: stop removes the socket file and runs no task still waiting for drain") {
  Fixture f;
  Client c(f.path);
  c.hello();
  c.send(request_line(2, "double", {{"x", 1}}));
  // Wait until the server has queued the task (it answers echo after reading both lines in order).
  c.send(request_line(3, "echo", json::object()));
  REQUIRE(c.line().at("id") == 3);
  f.server.stop();
  REQUIRE(::access(f.path.c_str(), F_OK) != 0);
  REQUIRE(f.drained_tasks == 0);
}

// Note [A socket file that exists answers] (server.cpp): a client that sees the
// file connects; a watcher polling for it across many starts is never refused.
TEST_CASE("control: once the socket file exists it accepts connections, and the server leaves nothing else in its directory") {
  const std::string dir = Fixture::make_dir(), path = dir + "/c.sock";
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int refused = 0;
  for (int round = 0; round < 300; ++round) {
    std::atomic<bool> go{false};
    int connect_errno = 0;
    std::thread watcher([&] {
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      go = true;
      while (::access(path.c_str(), F_OK) != 0) {}
      if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) connect_errno = errno;
      ::close(fd);
    });
    while (!go) {}
    Server server(Fixture::options(path));
    server.start();
    watcher.join();
    if (connect_errno != 0) ++refused;
    if (round == 0) {
      std::vector<std::string> names;
      DIR* d = ::opendir(dir.c_str());
      while (dirent* e = ::readdir(d))
        if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.emplace_back(e->d_name);
      ::closedir(d);
      REQUIRE(names == std::vector<std::string>{"c.sock"});
    }
    server.stop();
  }
  ::rmdir(dir.c_str());
  REQUIRE(refused == 0);
}

TEST_CASE("control: a path another server serves is refused, and where the job has several ranks the error says to put "
          "{rank} in control.socket") {
  const std::string dir = Fixture::make_dir(), path = dir + "/c.sock";
  Server first(Fixture::options(path));
  first.start();
  const auto refusal = [&](int64_t world) {
    ServerOptions o = Fixture::options(path);
    o.identity = {{"rank", 1}, {"world", world}};
    Server second(o);
    try {
      second.start();
    } catch (const loongforge::ControlError& e) {
      return std::string(e.what());
    }
    return std::string("(started)");
  };
  const std::string alone = refusal(1), of_two = refusal(2);
  CHECK_THAT(alone, Contains("another trainer already serves " + path));
  CHECK_THAT(of_two, Contains("another trainer already serves " + path));
  CHECK_THAT(of_two, Contains("this job has 2 ranks") && Contains("put {rank} in control.socket"));
  CHECK(alone.find("{rank}") == std::string::npos);
  first.stop();
  ::rmdir(dir.c_str());
}
