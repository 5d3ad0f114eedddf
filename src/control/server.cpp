// The control thread (server.hpp): a poll() loop over the listening socket,
// a wake pipe and the clients.
//
// Note [Control thread ownership]
// Everything about clients (buffers, timers, streams) belongs to the control
// thread alone. The trainer thread meets it in two queues only: tasks_
// (requests for drain(), guarded by tasks_mu_) and the Outbox (replies
// produced by drain() or later, guarded by its own mutex, with a byte written
// to the wake pipe so poll() returns). Client ids are never reused, so a late
// reply to a client that has gone is simply dropped.
#include "loongforge/control/server.hpp"

#include <dirent.h>      // opendir, readdir
#include <fcntl.h>       // fcntl, O_NONBLOCK
#include <poll.h>        // poll
#include <sys/socket.h>  // socket, bind, listen, accept4, getsockopt
#include <sys/stat.h>    // chmod, umask
#include <sys/un.h>      // sockaddr_un
#include <unistd.h>      // close, unlink, pipe2, getpid, getuid

#include <cerrno>   // errno
#include <chrono>   // std::chrono::steady_clock
#include <cstring>  // std::strerror, std::memcpy
#include <deque>    // std::deque

#include "loongforge/common/error.hpp"
#include "loongforge/common/log.hpp"
#include "loongforge/common/version.hpp"
#include "loongforge/control/protocol.hpp"

namespace loongforge::control {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// Replies from the trainer thread

struct Outbox {
  struct Item {
    uint64_t client;
    std::string line;
    bool is_error;
  };
  std::mutex mu;
  std::deque<Item> items;  // guarded by mu
  int wake_fd = -1;        // write end of the wake pipe; -1 once the server stopped
  void post(uint64_t client, std::string line, bool is_error) {
    std::lock_guard<std::mutex> lock(mu);
    if (wake_fd < 0) return;  // the server is gone: drop
    items.push_back({client, std::move(line), is_error});
    const char b = 1;
    [[maybe_unused]] auto n = ::write(wake_fd, &b, 1);  // a full pipe already means "wake up"
  }
};

struct Reply::State {
  std::shared_ptr<Outbox> outbox;
  uint64_t client = 0, id = 0;
  std::mutex mu;
  bool sent = false;
  bool claim() {
    std::lock_guard<std::mutex> lock(mu);
    if (sent) return false;
    sent = true;
    return true;
  }
  ~State() {
    if (!sent) outbox->post(client, reply_error(id, code::kInternal, "the trainer dropped this request unanswered"), true);
  }
};

void Reply::ok(const json& result) const {
  if (s_->claim()) s_->outbox->post(s_->client, reply_ok(s_->id, result), false);
}
void Reply::error(const std::string& code_name, const std::string& message) const {
  if (s_->claim()) s_->outbox->post(s_->client, reply_error(s_->id, code_name, message), true);
}
bool Reply::answered() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->sent;
}

// ---------------------------------------------------------------------------
// Registration

struct Server::Handler {
  enum class Kind { Query, Task, Stream } kind;
  QueryFn query;
  TaskFn task;
  StreamFn stream;
};

struct Server::Task {
  std::shared_ptr<Handler> handler;
  json args;
  Reply reply;
};

Server::Server(ServerOptions options) : opt_(std::move(options)), outbox_(std::make_shared<Outbox>()) {}
Server::~Server() { stop(); }

void Server::on_query(const std::string& verb, QueryFn fn) {
  handlers_[verb] = std::make_shared<Handler>(Handler{Handler::Kind::Query, std::move(fn), {}, {}});
}
void Server::on_task(const std::string& verb, TaskFn fn) {
  handlers_[verb] = std::make_shared<Handler>(Handler{Handler::Kind::Task, {}, std::move(fn), {}});
}
void Server::on_stream(const std::string& verb, StreamFn fn) {
  handlers_[verb] = std::make_shared<Handler>(Handler{Handler::Kind::Stream, {}, {}, std::move(fn)});
}

ServerStats Server::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

// ---------------------------------------------------------------------------
// Socket creation

namespace {

// The address of the socket file at `path` (at most kMaxSocketPathBytes long).
sockaddr_un unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

bool someone_answers(const sockaddr_un& addr) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return live;
}

// Removes sockets in `dir` that nobody answers (their trainer was killed):
// refused connections only, so a live trainer in another pid namespace that
// shares the directory is never touched.
void remove_stale_sockets(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() < 6 || name.compare(name.size() - 5, 5, ".sock") != 0) continue;
    const std::string path = dir + "/" + name;
    if (path.size() > kMaxSocketPathBytes) continue;
    const sockaddr_un addr = unix_address(path);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) break;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 && errno == ECONNREFUSED)
      ::unlink(path.c_str());
    ::close(fd);
  }
  ::closedir(d);
}

// For a path that is taken: where the identity says the job has several
// ranks, they may all have been given the same control.socket.
std::string several_ranks_hint(const nlohmann::json& identity) {
  const auto world = identity.value("world", int64_t{1});
  if (world <= 1) return "";
  return " (this job has " + std::to_string(world) +
         " ranks, and every rank serves its own socket: put {rank} in control.socket, which each rank replaces "
         "by its number, or leave it empty for one <pid>.sock per process)";
}

std::string dirname_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

}  // namespace

void Server::start() {
  if (started_) return;
  path_ = opt_.socket_path.empty() ? socket_path(::getpid()) : opt_.socket_path;
  if (path_.size() > kMaxSocketPathBytes)
    throw ControlError("control socket path " + path_ + " is " + std::to_string(path_.size()) +
                       " bytes; Unix sockets allow " + std::to_string(kMaxSocketPathBytes) +
                       ": set control.socket (or XDG_RUNTIME_DIR) to a shorter path");
  ensure_private_dir(dirname_of(path_));
  if (opt_.socket_path.empty()) remove_stale_sockets(dirname_of(path_));  // our own directory of <pid>.sock files

  const sockaddr_un addr = unix_address(path_);
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw ControlError("control socket path " + path_ + " exists and is not a socket: remove it or choose another control.socket");
    if (someone_answers(addr))
      throw ControlError("another trainer already serves " + path_ + ": stop it or choose another control.socket" +
                         several_ranks_hint(opt_.identity));
    ::unlink(path_.c_str());  // stale: its server died
  }

  // Note [A socket file that exists answers]
  // bind() creates the file and listen() comes after it; in between, connect()
  // is refused. A client that waits for the file (the tests, a script) would
  // fail there, and another trainer starting in the same directory would take
  // the file for a killed trainer's and unlink it (remove_stale_sockets). So
  // the socket is bound under a hidden name of this process, listens, and only
  // then is linked at its path: link() fails if the path was taken meanwhile,
  // as bind() would. Where the hidden name would not fit, it binds in place.
  std::string bound = dirname_of(path_) + "/." + std::to_string(::getpid()) + ".binding";
  if (bound.size() > kMaxSocketPathBytes) bound = path_;
  const sockaddr_un bind_addr = unix_address(bound);
  if (bound != path_) ::unlink(bound.c_str());  // ours, left by a killed process that had our pid
  const auto fail = [&](const std::string& what, int err) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (bound != path_) ::unlink(bound.c_str());
    throw ControlError(what + ": " + std::strerror(err));
  };
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd_ < 0) throw ControlError(std::string("control socket: socket(): ") + std::strerror(errno));
  const mode_t old_mask = ::umask(0177);  // the socket file is born 0600: no window where others may connect
  const int rc = ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&bind_addr), sizeof bind_addr);
  const int bind_errno = errno;
  ::umask(old_mask);
  if (rc != 0) fail("cannot bind the control socket " + bound, bind_errno);
  ::chmod(bound.c_str(), 0600);
  if (::listen(listen_fd_, 128) != 0) fail("control socket: listen()", errno);
  if (bound != path_) {
    if (::link(bound.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      if (err == EEXIST)
        fail("another trainer took " + path_ + " while this one started; stop it or choose another control.socket" +
                 several_ranks_hint(opt_.identity), err);
      fail("cannot place the control socket at " + path_, err);
    }
    ::unlink(bound.c_str());
  }
  if (::pipe2(wake_fd_, O_CLOEXEC | O_NONBLOCK) != 0)
    throw ControlError(std::string("control socket: pipe2(): ") + std::strerror(errno));
  outbox_->wake_fd = wake_fd_[1];
  started_ = true;
  thread_ = std::thread([this] { serve(); });
}

void Server::stop() {
  if (!started_) return;
  started_ = false;
  stopping_ = true;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    for (auto& t : tasks_) t.reply.error(code::kShuttingDown, "the trainer is exiting");
    tasks_.clear();
  }
  const char b = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_[1], &b, 1);
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard<std::mutex> lock(outbox_->mu);
    outbox_->wake_fd = -1;
    outbox_->items.clear();
  }
  ::close(listen_fd_);
  ::close(wake_fd_[0]);
  ::close(wake_fd_[1]);
  listen_fd_ = wake_fd_[0] = wake_fd_[1] = -1;
  ::unlink(path_.c_str());
}

int Server::drain() {
  std::vector<Task> tasks;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) {
    try {
      t.handler->task(t.args, t.reply);
    } catch (const VerbError& e) {
      t.reply.error(e.code, e.what());
    } catch (const std::exception& e) {
      t.reply.error(code::kInternal, e.what());
    }
  }
  return static_cast<int>(tasks.size());
}

// ---------------------------------------------------------------------------
// The control thread

namespace {

struct Stream {
  uint64_t id;
  json args;
  Server::StreamFn fn;
  double interval_s;
  int64_t count;  // lines to send; <= 0 = until the client goes away
  int64_t tick = 0;
  Clock::time_point next;
};

struct Client {
  int fd = -1;
  uid_t uid = 0;
  bool greeted = false;
  bool read_closed = false;
  bool close_after_flush = false;
  std::string in, out;
  Clock::time_point line_started, last_activity;
  int in_flight = 0;  // tasks not yet answered
  std::vector<Stream> streams;
};

int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

}  // namespace

void Server::serve() {
  const auto& log = logger("control");
  std::map<uint64_t, Client> clients;
  uint64_t next_client = 1;
  std::vector<pollfd> fds;
  std::vector<uint64_t> fd_owner;
  auto count = [this](auto member) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++(stats_.*member);
  };
  auto send_error = [&](Client& c, uint64_t id, const char* code_name, const std::string& msg) {
    c.out += reply_error(id, code_name, msg);
    count(&ServerStats::error_replies);
  };

  // One complete line from a client.
  auto handle_line = [&](uint64_t cid, Client& c, const std::string& line) {
    count(&ServerStats::requests);
    Request req;
    try {
      req = parse_request(line);
    } catch (const ProtocolError& e) {
      send_error(c, e.id, e.code.c_str(), e.message);
      if (!c.greeted) c.close_after_flush = true;
      return;
    }
    if (!c.greeted) {
      if (req.verb != "hello") {
        send_error(c, req.id, code::kHandshakeRequired,
                   "the first line must be the handshake {\"v\":" + std::to_string(kProtocolVersion) +
                       ",\"id\":0,\"verb\":\"hello\"}");
        c.close_after_flush = true;
        return;
      }
      json who = opt_.identity;
      who["server"] = "loongforge-train";
      who["version"] = version_string();
      who["protocol"] = kProtocolVersion;
      who["pid"] = static_cast<int64_t>(::getpid());
      json verbs = json::array();
      for (const auto& kv : handlers_) verbs.push_back(kv.first);
      who["verbs"] = verbs;
      c.out += reply_ok(req.id, who);
      c.greeted = true;
      return;
    }
    auto h = handlers_.find(req.verb);
    if (h == handlers_.end()) {
      send_error(c, req.id, code::kUnknownVerb, "unknown verb '" + req.verb.substr(0, 64) + "'");
      return;
    }
    const auto& handler = h->second;
    try {
      switch (handler->kind) {
        case Handler::Kind::Query:
          c.out += reply_ok(req.id, handler->query(req.args));
          break;
        case Handler::Kind::Task: {
          std::lock_guard<std::mutex> lock(tasks_mu_);
          if (static_cast<int>(tasks_.size()) >= opt_.max_pending || c.in_flight >= opt_.max_pending_per_client) {
            send_error(c, req.id, code::kBusy,
                       "trainer busy: " + std::to_string(tasks_.size()) +
                           " requests wait for the next step boundary; retry shortly");
            break;
          }
          auto st = std::make_shared<Reply::State>();
          st->outbox = outbox_, st->client = cid, st->id = req.id;
          tasks_.push_back(Task{handler, std::move(req.args), Reply(st)});
          ++c.in_flight;
          break;
        }
        case Handler::Kind::Stream: {
          double interval = 1.0;
          int64_t n = 0;
          if (auto it = req.args.find("interval_s"); it != req.args.end()) {
            if (!it->is_number() || it->get<double>() < 0.05 || it->get<double>() > 3600)
              throw VerbError(code::kBadArgs, "interval_s must be a number of seconds in [0.05, 3600]");
            interval = it->get<double>();
          }
          if (auto it = req.args.find("count"); it != req.args.end()) {
            if (!it->is_number_integer()) throw VerbError(code::kBadArgs, "count must be an integer");
            n = it->get<int64_t>();
          }
          if (c.streams.size() >= 4) throw VerbError(code::kBusy, "at most 4 streams per connection");
          handler->stream(req.args, -1);  // validates the arguments; throws VerbError
          c.streams.push_back(Stream{req.id, std::move(req.args), handler->stream, interval, n, 0, Clock::now()});
          break;
        }
      }
    } catch (const VerbError& e) {
      send_error(c, req.id, e.code.c_str(), e.what());
    } catch (const std::exception& e) {
      send_error(c, req.id, code::kInternal, e.what());
    }
  };

  auto refuse_long_line = [&](Client& c) {
    send_error(c, 0, code::kLineTooLong, "line longer than " + std::to_string(kMaxLineBytes) + " bytes");
    c.close_after_flush = true;
    count(&ServerStats::closed_for_line_length);
  };

  auto close_client = [&](std::map<uint64_t, Client>::iterator it) {
    ::close(it->second.fd);
    return clients.erase(it);
  };

  while (!stopping_) {
    // Timers: the earliest stream tick or client deadline bounds the wait.
    const auto now = Clock::now();
    int64_t wait_ms = 1000;
    for (auto& kv : clients) {
      for (const auto& s : kv.second.streams) wait_ms = std::min(wait_ms, std::max<int64_t>(0, ms_between(now, s.next)));
      if (!kv.second.in.empty()) wait_ms = std::min(wait_ms, std::max<int64_t>(0, opt_.line_timeout_ms - ms_between(kv.second.line_started, now)));
    }
    fds.clear();
    fd_owner.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({wake_fd_[0], POLLIN, 0});
    fd_owner.push_back(0), fd_owner.push_back(0);
    for (auto& kv : clients) {
      short ev = 0;
      if (!kv.second.read_closed && !kv.second.close_after_flush) ev |= POLLIN;
      if (!kv.second.out.empty()) ev |= POLLOUT;
      // Nothing to wait for on this fd (the peer closed while a task is in flight): leave it out, since poll()
      // reports POLLHUP whatever `events` asks and would spin this thread until the task is answered.
      fds.push_back({ev != 0 ? kv.second.fd : -1, ev, 0});
      fd_owner.push_back(kv.first);
    }
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (ready < 0 && errno != EINTR) {
      LF_LOG(log, error) << "control socket poll() failed: " << std::strerror(errno) << "; control plane stops";
      break;
    }
    if (stopping_) break;

    // Replies from the trainer thread.
    if (fds[1].revents & POLLIN) {
      char buf[256];
      while (::read(wake_fd_[0], buf, sizeof buf) > 0) {
      }
      std::deque<Outbox::Item> items;
      {
        std::lock_guard<std::mutex> lock(outbox_->mu);
        items.swap(outbox_->items);
      }
      for (auto& item : items) {
        auto it = clients.find(item.client);
        if (it == clients.end()) continue;
        it->second.out += item.line;
        --it->second.in_flight;
        if (item.is_error) count(&ServerStats::error_replies);
      }
    }

    // New clients.
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        ucred cred{};
        socklen_t len = sizeof cred;
        std::string refuse_code, refuse;
        if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
          refuse_code = code::kPermissionDenied, refuse = "cannot read the peer's credentials";
        } else if (cred.uid != ::getuid() && !(cred.uid == 0 && opt_.allow_root)) {
          refuse_code = code::kPermissionDenied;
          refuse = "permission denied: this trainer belongs to uid " + std::to_string(::getuid()) +
                   " and accepts only that user" + (cred.uid == 0 ? " (root needs control.allow_root=true)" : "");
        } else if (static_cast<int>(clients.size()) >= opt_.max_clients) {
          refuse_code = code::kBusy;
          refuse = "trainer busy: " + std::to_string(clients.size()) + " control clients are connected; retry shortly";
        }
        count(&ServerStats::connections);
        if (!refuse.empty()) {
          const std::string line = reply_error(0, refuse_code, refuse);
          [[maybe_unused]] auto n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          ::close(fd);
          count(&ServerStats::rejected_connections);
          count(&ServerStats::error_replies);
          if (refuse_code == code::kPermissionDenied)
            LF_LOG(log, warn) << "refused a control client of uid " << cred.uid << " (pid " << cred.pid << ")";
          continue;
        }
        Client c;
        c.fd = fd;
        c.uid = cred.uid;
        c.last_activity = Clock::now();
        clients.emplace(next_client++, std::move(c));
      }
    }

    // Client traffic.
    for (size_t i = 2; i < fds.size(); ++i) {
      auto it = clients.find(fd_owner[i]);
      if (it == clients.end()) continue;
      Client& c = it->second;
      const uint64_t cid = it->first;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[16384];
        size_t read_now = 0;
        for (;;) {
          const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            read_now += static_cast<size_t>(n);
            c.last_activity = Clock::now();
            if (c.in.empty()) c.line_started = c.last_activity;  // a line's first byte
            c.in.append(buf, static_cast<size_t>(n));
            // Complete lines.
            size_t start = 0;
            for (size_t nl; !c.close_after_flush && (nl = c.in.find('\n', start)) != std::string::npos; start = nl + 1) {
              std::string line = c.in.substr(start, nl - start);
              if (!line.empty() && line.back() == '\r') line.pop_back();
              if (line.size() + 1 > kMaxLineBytes) {
                refuse_long_line(c);
              } else if (!line.empty()) {
                handle_line(cid, c, line);
              }
            }
            c.in.erase(0, start);
            if (start > 0 && !c.in.empty()) c.line_started = c.last_activity;  // a new partial line began now
            if (c.in.size() >= kMaxLineBytes) refuse_long_line(c);  // no newline can come in time
            if (c.close_after_flush) c.in.clear();
            if (c.close_after_flush) break;
            // Bounded work per round: a client that pipelines faster than it reads must not grow its replies
            // past max_outbox_bytes (it is closed below as a slow reader) nor starve the other clients.
            if (c.out.size() > opt_.max_outbox_bytes || read_now >= 4 * kMaxLineBytes) break;
            continue;
          }
          if (n == 0) {
            c.read_closed = true;
            c.streams.clear();  // nobody listens any more
          } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            c.read_closed = true;
            c.streams.clear();
            c.out.clear();
          }
          break;
        }
      }
      if (!c.out.empty() && (fds[i].revents & POLLOUT)) {
        const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          c.out.erase(0, static_cast<size_t>(n));
          c.last_activity = Clock::now();
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          c.out.clear();  // the peer is gone
          c.read_closed = true;
          c.streams.clear();
        }
      }
    }

    // Streams, timeouts, closing.
    const auto t = Clock::now();
    for (auto it = clients.begin(); it != clients.end();) {
      Client& c = it->second;
      for (auto s = c.streams.begin(); s != c.streams.end();) {
        if (t < s->next) {
          ++s;
          continue;
        }
        bool last = s->count > 0 && s->tick + 1 >= s->count;
        try {
          c.out += reply_ok(s->id, s->fn(s->args, s->tick), /*stream=*/!last);
        } catch (const VerbError& e) {
          send_error(c, s->id, e.code.c_str(), e.what());
          last = true;
        } catch (const std::exception& e) {
          send_error(c, s->id, code::kInternal, e.what());
          last = true;
        }
        ++s->tick;
        s->next = t + std::chrono::milliseconds(static_cast<int64_t>(s->interval_s * 1000));
        s = last ? c.streams.erase(s) : s + 1;
      }
      if (!c.in.empty() && ms_between(c.line_started, t) > opt_.line_timeout_ms && !c.close_after_flush) {
        send_error(c, 0, code::kTimeout,
                   "no newline within " + std::to_string(opt_.line_timeout_ms) + " ms of the line's first byte");
        c.in.clear();
        c.close_after_flush = true;
        count(&ServerStats::closed_for_timeout);
      }
      const bool idle = c.in_flight == 0 && c.streams.empty() && c.out.empty();
      if (idle && !c.read_closed && !c.close_after_flush && ms_between(c.last_activity, t) > opt_.idle_timeout_ms) {
        send_error(c, 0, code::kTimeout, "idle for " + std::to_string(opt_.idle_timeout_ms / 1000) + " s; closing");
        c.close_after_flush = true;
        count(&ServerStats::closed_for_timeout);
      }
      if (c.out.size() > opt_.max_outbox_bytes) {
        count(&ServerStats::closed_for_slow_reader);
        it = close_client(it);
        continue;
      }
      const bool finished = c.out.empty() && ((c.close_after_flush) || (c.read_closed && c.in_flight == 0));
      it = finished ? close_client(it) : std::next(it);
    }
  }
  // Shutting down: deliver replies already produced (a `stop` reply is
  // posted just before stop()), tell everyone, flush for at most 1 s.
  {
    std::lock_guard<std::mutex> lock(outbox_->mu);
    for (auto& item : outbox_->items)
      if (auto it = clients.find(item.client); it != clients.end()) it->second.out += item.line;
    outbox_->items.clear();
  }
  for (auto& kv : clients) kv.second.out += reply_error(0, code::kShuttingDown, "the trainer is exiting");
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  while (!clients.empty() && Clock::now() < deadline) {
    fds.clear();
    fd_owner.clear();
    for (auto& kv : clients) fds.push_back({kv.second.fd, POLLOUT, 0}), fd_owner.push_back(kv.first);
    if (::poll(fds.data(), fds.size(), 50) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      auto it = clients.find(fd_owner[i]);
      Client& c = it->second;
      const ssize_t n = (fds[i].revents & POLLOUT) ? ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
      if (n > 0) c.out.erase(0, static_cast<size_t>(n));
      if (c.out.empty() || n < 0 || (fds[i].revents & (POLLERR | POLLHUP))) close_client(it);
    }
  }
  for (auto& kv : clients) ::close(kv.second.fd);
}

}  // namespace loongforge::control
