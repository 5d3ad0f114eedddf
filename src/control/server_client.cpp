// The control thread (server.hpp; Note [Control thread ownership] in
// server.cpp): one poll() loop over the listening socket, the wake pipe and
// the clients, each client a small state machine (Note [Client states]).
// The loop asks each piece in turn to do its part:
//
//   run()                   wait for the earliest timer or event, then:
//     deliver_answers()     replies the trainer thread posted to the Outbox
//     accept_clients()      new connections: peer uid (SO_PEERCRED), max_clients
//     read_from()           recv; frame_lines() cuts lines, handle_line() answers:
//       handle_handshake()    in AwaitingHandshake
//       dispatch()            in Ready: a query at once, a task posted, a stream opened
//     flush_to()            send the queued replies
//     advance()             stream ticks, line and idle timeouts, slow readers, closes
//   shut_down()             on stop(): last replies, "shutting_down", flush for 1 s
//
// Note [Client states]
// A client's phase only moves forward:
//
//   AwaitingHandshake --hello--> Ready
//          |                       |
//          +-----> Closing <-------+   a broken handshake, a line too long, a timeout
//
// Only AwaitingHandshake and Ready are polled for input. Closing flushes the
// queued replies, then closes the client; it handles no more lines (what a
// POLLHUP or POLLERR still reads is discarded). Orthogonal to the phase,
// `peer_done` records that the peer sends nothing more (EOF, or a socket
// error, which also drops the unsent replies): its streams stop, it is no
// longer polled for input, and it stays until every task it has in flight is
// answered and its replies are flushed (finished()). Whatever its phase, a
// client whose unsent replies pass max_outbox_bytes is closed at once.
#include <poll.h>        // poll
#include <sys/socket.h>  // accept4, getsockopt, recv, send, ucred
#include <unistd.h>      // close, read, getpid, getuid

#include <algorithm>  // std::min, std::max
#include <cerrno>     // errno
#include <chrono>     // std::chrono::steady_clock
#include <cstring>    // std::strerror
#include <deque>      // std::deque
#include <map>        // std::map
#include <memory>     // std::shared_ptr, std::make_shared
#include <mutex>      // std::mutex, std::lock_guard
#include <string>     // std::string
#include <vector>     // std::vector

#include "loongforge/common/log.hpp"
#include "loongforge/common/version.hpp"
#include "loongforge/control/protocol.hpp"
#include "loongforge/control/server.hpp"
#include "server_common.hpp"  // Outbox, Reply::State, Server::Handler, Server::Task

namespace loongforge::control {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------
// A client and its state

namespace {

constexpr size_t kReadChunkBytes = 16384;                    // one recv()
constexpr size_t kMaxReadBytesPerRound = 4 * kMaxLineBytes;  // per client per poll() round
constexpr size_t kMaxStreamsPerClient = 4;
constexpr int64_t kMaxWaitMs = 1000;  // poll() wakes at least this often (idle timeouts)
constexpr auto kShutdownFlush = std::chrono::seconds(1);
constexpr int kShutdownPollMs = 50;

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
  enum class Phase { AwaitingHandshake, Ready, Closing };  // Note [Client states]
  int fd = -1;
  uid_t uid = 0;
  Phase phase = Phase::AwaitingHandshake;
  bool peer_done = false;  // EOF or a socket error: the peer sends nothing more
  std::string in;          // the line being received (its first bytes)
  std::string out;         // replies not yet sent
  Clock::time_point line_started, last_activity;
  int in_flight = 0;  // tasks posted and not yet answered
  std::vector<Stream> streams;

  bool wants_input() const { return phase != Phase::Closing && !peer_done; }
  bool idle() const { return in_flight == 0 && streams.empty() && out.empty(); }
  // Nothing left to send and nothing more to come: close it.
  bool finished() const { return out.empty() && (phase == Phase::Closing || (peer_done && in_flight == 0)); }
  // The peer sends nothing more; `lost` (a socket error): nothing reaches it either.
  void hang_up(bool lost) {
    peer_done = true;
    streams.clear();  // nobody listens any more
    if (lost) out.clear();
  }
};

int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

bool would_block(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

}  // namespace

// ---------------------------------------------------------------------------
// The control thread

class Server::ControlLoop {
 public:
  explicit ControlLoop(Server& server) : s_(server), log_(logger("control")) {}
  void run();

 private:
  // Clients by id; an id is never reused (Note [Control thread ownership]).
  using Clients = std::map<uint64_t, Client>;
  // Slots of fds_: the listening socket, the wake pipe, then one per client.
  static constexpr size_t kListenSlot = 0, kWakeSlot = 1, kFirstClientSlot = 2;
  // Why a connection is refused: a wire error {code, message}; no message = admitted.
  struct Refusal {
    std::string code, message;
  };

  // Waiting
  int64_t wait_ms(Clock::time_point now) const;
  void fill_poll_set();
  // Events
  void deliver_answers();
  void accept_clients();
  Refusal refusal_of(int fd, ucred& cred) const;
  void serve_traffic();
  void read_from(uint64_t cid, Client& c);
  void frame_lines(uint64_t cid, Client& c, const char* bytes, size_t n);
  void handle_line(uint64_t cid, Client& c, const std::string& line);
  void handle_handshake(Client& c, const Request& req);
  void dispatch(uint64_t cid, Client& c, Request& req);
  void post_task(uint64_t cid, Client& c, const std::shared_ptr<Handler>& handler, Request& req);
  void open_stream(Client& c, const std::shared_ptr<Handler>& handler, Request& req);
  void flush_to(Client& c);
  // Timers and ends
  void advance(Clock::time_point now);
  void tick_streams(Client& c, Clock::time_point now);
  void enforce_timeouts(Client& c, Clock::time_point now);
  Clients::iterator close_client(Clients::iterator it);
  void shut_down();
  // Replies and counters
  void count(uint64_t ServerStats::*counter);
  void send_error(Client& c, uint64_t id, const char* code_name, const std::string& message);
  void refuse_long_line(Client& c);

  Server& s_;
  const Logger& log_;
  Clients clients_;
  uint64_t next_client_ = 1;
  std::vector<pollfd> fds_;
  std::vector<uint64_t> fd_owner_;  // the client id of each fds_ slot (0 for the listening socket and wake pipe)
};

void Server::serve() {
  ControlLoop(*this).run();
}

void Server::ControlLoop::run() {
  while (!s_.stopping_) {
    const int64_t timeout_ms = wait_ms(Clock::now());
    fill_poll_set();
    const int ready = ::poll(fds_.data(), fds_.size(), static_cast<int>(timeout_ms));
    if (ready < 0 && errno != EINTR) {
      LF_LOG(log_, error) << "control socket poll() failed: " << std::strerror(errno) << "; control plane stops";
      break;
    }
    if (s_.stopping_) break;
    if (fds_[kWakeSlot].revents & POLLIN) deliver_answers();
    if (fds_[kListenSlot].revents & POLLIN) accept_clients();
    serve_traffic();
    advance(Clock::now());
  }
  shut_down();
}

// ---------------------------------------------------------------------------
// Waiting

// The earliest stream tick or line deadline bounds the wait.
int64_t Server::ControlLoop::wait_ms(Clock::time_point now) const {
  int64_t wait = kMaxWaitMs;
  for (const auto& kv : clients_) {
    const Client& c = kv.second;
    for (const auto& s : c.streams) wait = std::min(wait, std::max<int64_t>(0, ms_between(now, s.next)));
    if (!c.in.empty())
      wait = std::min(wait, std::max<int64_t>(0, s_.opt_.line_timeout_ms - ms_between(c.line_started, now)));
  }
  return wait;
}

void Server::ControlLoop::fill_poll_set() {
  fds_.clear();
  fd_owner_.clear();
  fds_.push_back({s_.listen_fd_, POLLIN, 0});
  fds_.push_back({s_.wake_fd_[0], POLLIN, 0});
  fd_owner_.push_back(0), fd_owner_.push_back(0);
  for (const auto& kv : clients_) {
    const Client& c = kv.second;
    short ev = 0;
    if (c.wants_input()) ev |= POLLIN;
    if (!c.out.empty()) ev |= POLLOUT;
    // Nothing to wait for on this fd (the peer closed while a task is in flight): leave it out, since poll()
    // reports POLLHUP whatever `events` asks and would spin this thread until the task is answered.
    fds_.push_back({ev != 0 ? c.fd : -1, ev, 0});
    fd_owner_.push_back(kv.first);
  }
}

// ---------------------------------------------------------------------------
// Events: answers, new clients, traffic

// Replies from the trainer thread; one to a client that has gone is dropped.
void Server::ControlLoop::deliver_answers() {
  char buf[256];
  while (::read(s_.wake_fd_[0], buf, sizeof buf) > 0) {
  }
  std::deque<Outbox::Item> items;
  {
    std::lock_guard<std::mutex> lock(s_.outbox_->mu);
    items.swap(s_.outbox_->items);
  }
  for (auto& item : items) {
    auto it = clients_.find(item.client);
    if (it == clients_.end()) continue;
    it->second.out += item.line;
    --it->second.in_flight;
    if (item.is_error) count(&ServerStats::error_replies);
  }
}

// Admits each waiting connection, or answers it one error line and closes it.
void Server::ControlLoop::accept_clients() {
  for (;;) {
    const int fd = ::accept4(s_.listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    ucred cred{};
    const Refusal refusal = refusal_of(fd, cred);
    count(&ServerStats::connections);
    if (!refusal.message.empty()) {
      const std::string line = reply_error(0, refusal.code, refusal.message);
      [[maybe_unused]] auto n = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      count(&ServerStats::rejected_connections);
      count(&ServerStats::error_replies);
      if (refusal.code == code::kPermissionDenied)
        LF_LOG(log_, warn) << "refused a control client of uid " << cred.uid << " (pid " << cred.pid << ")";
      continue;
    }
    Client c;
    c.fd = fd;
    c.uid = cred.uid;
    c.last_activity = Clock::now();
    clients_.emplace(next_client_++, std::move(c));
  }
}

// Why a new connection is refused (no message: it is admitted): another user
// (SO_PEERCRED, read into `cred`; root only with allow_root), or max_clients
// are connected.
Server::ControlLoop::Refusal Server::ControlLoop::refusal_of(int fd, ucred& cred) const {
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return {code::kPermissionDenied, "cannot read the peer's credentials"};
  if (cred.uid != ::getuid() && !(cred.uid == 0 && s_.opt_.allow_root))
    return {code::kPermissionDenied, "permission denied: this trainer belongs to uid " + std::to_string(::getuid()) +
                                         " and accepts only that user" +
                                         (cred.uid == 0 ? " (root needs control.allow_root=true)" : "")};
  if (static_cast<int>(clients_.size()) >= s_.opt_.max_clients)
    return {code::kBusy,
            "trainer busy: " + std::to_string(clients_.size()) + " control clients are connected; retry shortly"};
  return {};
}

// Reads from and writes to each client that poll() found ready.
void Server::ControlLoop::serve_traffic() {
  for (size_t i = kFirstClientSlot; i < fds_.size(); ++i) {
    auto it = clients_.find(fd_owner_[i]);
    if (it == clients_.end()) continue;
    if (fds_[i].revents & (POLLIN | POLLHUP | POLLERR)) read_from(it->first, it->second);
    if (!it->second.out.empty() && (fds_[i].revents & POLLOUT)) flush_to(it->second);
  }
}

void Server::ControlLoop::read_from(uint64_t cid, Client& c) {
  char buf[kReadChunkBytes];
  size_t read_bytes = 0;
  for (;;) {
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n == 0) {
      c.hang_up(/*lost=*/false);  // EOF
      return;
    }
    if (n < 0) {
      if (!would_block(errno)) c.hang_up(/*lost=*/true);
      return;
    }
    read_bytes += static_cast<size_t>(n);
    frame_lines(cid, c, buf, static_cast<size_t>(n));
    if (c.phase == Client::Phase::Closing) return;
    // Bounded work per round: a client that pipelines faster than it reads must not grow its replies
    // past max_outbox_bytes (it is closed in advance() as a slow reader) nor starve the other clients.
    if (c.out.size() > s_.opt_.max_outbox_bytes || read_bytes >= kMaxReadBytesPerRound) return;
  }
}

// Appends `n` received bytes to the client's line and handles each complete
// line; a line over kMaxLineBytes (newline included) ends the connection.
void Server::ControlLoop::frame_lines(uint64_t cid, Client& c, const char* bytes, size_t n) {
  c.last_activity = Clock::now();
  if (c.in.empty()) c.line_started = c.last_activity;  // a line's first byte
  c.in.append(bytes, n);
  size_t start = 0;
  for (size_t nl; c.phase != Client::Phase::Closing && (nl = c.in.find('\n', start)) != std::string::npos;
       start = nl + 1) {
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
  if (c.in.size() >= kMaxLineBytes) refuse_long_line(c);             // no newline can come in time
  if (c.phase == Client::Phase::Closing) c.in.clear();
}

// One complete line from a client in AwaitingHandshake or Ready.
void Server::ControlLoop::handle_line(uint64_t cid, Client& c, const std::string& line) {
  count(&ServerStats::requests);
  Request req;
  try {
    req = parse_request(line);
  } catch (const ProtocolError& e) {
    send_error(c, e.id, e.code.c_str(), e.message);
    if (c.phase == Client::Phase::AwaitingHandshake) c.phase = Client::Phase::Closing;
    return;
  }
  if (c.phase == Client::Phase::AwaitingHandshake) {
    handle_handshake(c, req);
  } else {
    dispatch(cid, c, req);
  }
}

// The first line must be a hello: answered with the server's identity and its
// verbs; anything else gets an error and a close.
void Server::ControlLoop::handle_handshake(Client& c, const Request& req) {
  if (req.verb != "hello") {
    send_error(c, req.id, code::kHandshakeRequired,
               "the first line must be the handshake {\"v\":" + std::to_string(kProtocolVersion) +
                   ",\"id\":0,\"verb\":\"hello\"}");
    c.phase = Client::Phase::Closing;
    return;
  }
  json who = s_.opt_.identity;
  who["server"] = "loongforge-train";
  who["version"] = version_string();
  who["protocol"] = kProtocolVersion;
  who["pid"] = static_cast<int64_t>(::getpid());
  json verbs = json::array();
  for (const auto& kv : s_.handlers_) verbs.push_back(kv.first);
  who["verbs"] = verbs;
  c.out += reply_ok(req.id, who);
  c.phase = Client::Phase::Ready;
}

// A request of a greeted client, by its verb's kind (server.hpp): a query is
// answered now, a task waits for drain(), a stream ticks in advance().
void Server::ControlLoop::dispatch(uint64_t cid, Client& c, Request& req) {
  auto h = s_.handlers_.find(req.verb);
  if (h == s_.handlers_.end()) {
    send_error(c, req.id, code::kUnknownVerb, "unknown verb '" + req.verb.substr(0, 64) + "'");
    return;
  }
  const auto& handler = h->second;
  try {
    switch (handler->kind) {
      case Handler::Kind::Query:
        c.out += reply_ok(req.id, handler->query(req.args));
        break;
      case Handler::Kind::Task:
        post_task(cid, c, handler, req);
        break;
      case Handler::Kind::Stream:
        open_stream(c, handler, req);
        break;
    }
  } catch (const VerbError& e) {
    send_error(c, req.id, e.code.c_str(), e.what());
  } catch (const std::exception& e) {
    send_error(c, req.id, code::kInternal, e.what());
  }
}

// Queues a task for drain(); its Reply posts the answer to the Outbox. "busy"
// beyond max_pending (all clients) or max_pending_per_client.
void Server::ControlLoop::post_task(uint64_t cid, Client& c, const std::shared_ptr<Handler>& handler, Request& req) {
  std::lock_guard<std::mutex> lock(s_.tasks_mu_);
  if (static_cast<int>(s_.tasks_.size()) >= s_.opt_.max_pending || c.in_flight >= s_.opt_.max_pending_per_client) {
    send_error(c, req.id, code::kBusy,
               "trainer busy: " + std::to_string(s_.tasks_.size()) +
                   " requests wait for the next step boundary; retry shortly");
    return;
  }
  auto st = std::make_shared<Reply::State>();
  st->outbox = s_.outbox_, st->client = cid, st->id = req.id;
  s_.tasks_.push_back(Task{handler, std::move(req.args), Reply(st)});
  ++c.in_flight;
}

// Checks interval_s and count, asks the handler to validate (tick -1; throws
// VerbError) and opens the stream; its first line goes out in advance().
void Server::ControlLoop::open_stream(Client& c, const std::shared_ptr<Handler>& handler, Request& req) {
  double interval_s = 1.0;
  int64_t count_lines = 0;
  if (auto it = req.args.find("interval_s"); it != req.args.end()) {
    if (!it->is_number() || it->get<double>() < 0.05 || it->get<double>() > 3600)
      throw VerbError(code::kBadArgs, "interval_s must be a number of seconds in [0.05, 3600]");
    interval_s = it->get<double>();
  }
  if (auto it = req.args.find("count"); it != req.args.end()) {
    if (!it->is_number_integer()) throw VerbError(code::kBadArgs, "count must be an integer");
    count_lines = it->get<int64_t>();
  }
  if (c.streams.size() >= kMaxStreamsPerClient)
    throw VerbError(code::kBusy, "at most " + std::to_string(kMaxStreamsPerClient) + " streams per connection");
  handler->stream(req.args, -1);  // validates the arguments; throws VerbError
  c.streams.push_back(Stream{req.id, std::move(req.args), handler->stream, interval_s, count_lines, 0, Clock::now()});
}

void Server::ControlLoop::flush_to(Client& c) {
  const ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n > 0) {
    c.out.erase(0, static_cast<size_t>(n));
    c.last_activity = Clock::now();
  } else if (n < 0 && !would_block(errno)) {
    c.hang_up(/*lost=*/true);  // the peer is gone
  }
}

// ---------------------------------------------------------------------------
// Timers and ends: streams, timeouts, slow readers, closes

void Server::ControlLoop::advance(Clock::time_point now) {
  for (auto it = clients_.begin(); it != clients_.end();) {
    Client& c = it->second;
    tick_streams(c, now);
    enforce_timeouts(c, now);
    if (c.out.size() > s_.opt_.max_outbox_bytes) {
      count(&ServerStats::closed_for_slow_reader);
      it = close_client(it);
      continue;
    }
    it = c.finished() ? close_client(it) : std::next(it);
  }
}

// Sends each stream's line that is due; the last one (count reached, or an
// error) is sent with stream=false and ends the stream.
void Server::ControlLoop::tick_streams(Client& c, Clock::time_point now) {
  for (auto s = c.streams.begin(); s != c.streams.end();) {
    if (now < s->next) {
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
    s->next = now + std::chrono::milliseconds(static_cast<int64_t>(s->interval_s * 1000));
    s = last ? c.streams.erase(s) : s + 1;
  }
}

// A line not finished within line_timeout_ms of its first byte, or a client
// with no traffic and nothing pending for idle_timeout_ms: "timeout" and close.
void Server::ControlLoop::enforce_timeouts(Client& c, Clock::time_point now) {
  if (!c.in.empty() && ms_between(c.line_started, now) > s_.opt_.line_timeout_ms && c.phase != Client::Phase::Closing) {
    send_error(c, 0, code::kTimeout,
               "no newline within " + std::to_string(s_.opt_.line_timeout_ms) + " ms of the line's first byte");
    c.in.clear();
    c.phase = Client::Phase::Closing;
    count(&ServerStats::closed_for_timeout);
  }
  if (c.idle() && c.wants_input() && ms_between(c.last_activity, now) > s_.opt_.idle_timeout_ms) {
    send_error(c, 0, code::kTimeout, "idle for " + std::to_string(s_.opt_.idle_timeout_ms / 1000) + " s; closing");
    c.phase = Client::Phase::Closing;
    count(&ServerStats::closed_for_timeout);
  }
}

Server::ControlLoop::Clients::iterator Server::ControlLoop::close_client(Clients::iterator it) {
  ::close(it->second.fd);
  return clients_.erase(it);
}

// Shutting down: deliver replies already produced (a `stop` reply is posted
// just before stop()), tell everyone, flush for at most kShutdownFlush.
void Server::ControlLoop::shut_down() {
  {
    std::lock_guard<std::mutex> lock(s_.outbox_->mu);
    for (auto& item : s_.outbox_->items)
      if (auto it = clients_.find(item.client); it != clients_.end()) it->second.out += item.line;
    s_.outbox_->items.clear();
  }
  for (auto& kv : clients_) kv.second.out += reply_error(0, code::kShuttingDown, "the trainer is exiting");
  const auto deadline = Clock::now() + kShutdownFlush;
  while (!clients_.empty() && Clock::now() < deadline) {
    fds_.clear();
    fd_owner_.clear();
    for (auto& kv : clients_) fds_.push_back({kv.second.fd, POLLOUT, 0}), fd_owner_.push_back(kv.first);
    if (::poll(fds_.data(), fds_.size(), kShutdownPollMs) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds_.size(); ++i) {
      auto it = clients_.find(fd_owner_[i]);
      Client& c = it->second;
      const ssize_t n =
          (fds_[i].revents & POLLOUT) ? ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
      if (n > 0) c.out.erase(0, static_cast<size_t>(n));
      if (c.out.empty() || n < 0 || (fds_[i].revents & (POLLERR | POLLHUP))) close_client(it);
    }
  }
  for (auto& kv : clients_) ::close(kv.second.fd);
}

// ---------------------------------------------------------------------------
// Replies and counters

void Server::ControlLoop::count(uint64_t ServerStats::*counter) {
  std::lock_guard<std::mutex> lock(s_.stats_mu_);
  ++(s_.stats_.*counter);
}

void Server::ControlLoop::send_error(Client& c, uint64_t id, const char* code_name, const std::string& message) {
  c.out += reply_error(id, code_name, message);
  count(&ServerStats::error_replies);
}

void Server::ControlLoop::refuse_long_line(Client& c) {
  send_error(c, 0, code::kLineTooLong, "line longer than " + std::to_string(kMaxLineBytes) + " bytes");
  c.phase = Client::Phase::Closing;
  count(&ServerStats::closed_for_line_length);
}

}  // namespace loongforge::control
