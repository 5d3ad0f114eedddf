// The control server's lifecycle (server.hpp): registration, the socket
// (created, listening, removed), drain() on the trainer thread and stop(). The
// control thread itself, a poll() loop over the listening socket, a wake pipe
// and the clients, each a small state machine, is in server_client.cpp.
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
#include <fcntl.h>       // O_NONBLOCK, O_CLOEXEC
#include <sys/socket.h>  // socket, bind, listen, connect
#include <sys/stat.h>    // chmod, umask, lstat
#include <sys/un.h>      // sockaddr_un
#include <unistd.h>      // close, unlink, link, pipe2, getpid, write

#include <cerrno>   // errno
#include <cstring>  // std::strerror, std::memcpy

#include "loongforge/common/error.hpp"
#include "loongforge/control/protocol.hpp"
#include "server_common.hpp"  // Outbox, Reply::State, Server::Handler, Server::Task

namespace loongforge::control {

using nlohmann::json;

// ---------------------------------------------------------------------------
// Answers to tasks (Outbox and Reply::State: server_common.hpp)

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
// The socket: created by start(), removed by stop()

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

// ---------------------------------------------------------------------------
// The trainer thread's side

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

}  // namespace loongforge::control
