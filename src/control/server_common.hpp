// Private to the control room: what server.cpp (the server's lifecycle:
// registration, socket, drain, stop) and server_client.cpp (the control
// thread and its per-client state machine) share: the registered verbs and
// the two queues between the trainer thread and the control thread
// (Note [Control thread ownership], server.cpp).
#pragma once

#include <unistd.h>  // write

#include <cstdint>  // uint64_t
#include <deque>    // std::deque
#include <memory>   // std::shared_ptr
#include <mutex>    // std::mutex
#include <string>   // std::string

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/control/protocol.hpp"
#include "loongforge/control/server.hpp"

namespace loongforge::control {

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
    if (!sent)
      outbox->post(client, reply_error(id, code::kInternal, "the trainer dropped this request unanswered"), true);
  }
};

// ---------------------------------------------------------------------------
// Registered verbs and the tasks waiting for drain()

struct Server::Handler {
  enum class Kind { Query, Task, Stream } kind;
  QueryFn query;
  TaskFn task;
  StreamFn stream;
};

struct Server::Task {
  std::shared_ptr<Handler> handler;
  nlohmann::json args;
  Reply reply;
};

}  // namespace loongforge::control
