// Test helper of the comm room: two Gloo ranks in one process (two threads,
// a TCPStore on a free loopback port).
#pragma once

#include <netinet/in.h>  // sockaddr_in
#include <sys/socket.h>  // socket, bind
#include <unistd.h>      // close

#include <cstdint>     // int64_t
#include <cstdlib>     // setenv
#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <mutex>       // std::call_once
#include <random>      // std::mt19937, std::random_device
#include <stdexcept>   // std::runtime_error
#include <thread>      // std::thread
#include <vector>      // std::vector

#include <ATen/ATen.h>  // at::tanh, at::linspace (warm_up_vector_math)

#include "loongforge/comm/world.hpp"

namespace loongforge::comm::test {

// Note [Two process groups in one process]
// libtorch 2.11's flight recorder (one per process, c10d/FlightRecorderDetail.hpp)
// records every collective a process group enqueues, and registers a group it
// has not seen in a std::map before taking its mutex. Two ranks as two
// threads of one process register their groups while the other thread's
// group records: an unsynchronised map insert, which segfaulted this file's
// tests about once in 6 runs under AddressSanitizer (inside
// FlightRecorder::recordWithResetEnabled, from ProcessGroupGloo::enqueue)
// and once in two clean-clone CI runs. A trainer process has one group, so
// this is the tests' setup only; their binaries turn the recorder off
// (TORCH_FR_BUFFER_SIZE=0, read when the recorder is first used) before main.
inline const bool kFlightRecorderOff = [] { return ::setenv("TORCH_FR_BUFFER_SIZE", "0", 1) == 0; }();

// A TCP port nobody listens on now and no connection holds: a port below the
// kernel's ephemeral range (32768 up by default) that binds without
// SO_REUSEADDR. The kernel's choice for port 0 is an ephemeral port, which a
// closed client connection of an earlier test (in TIME_WAIT) may hold still,
// and the TCPStore's listen on it then failed with EADDRINUSE (the GPU
// machine, 2026-12-05).
inline int64_t free_port() {
  static std::mt19937 pick(std::random_device{}());
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const uint16_t port = static_cast<uint16_t>(20000 + pick() % 12000);  // [20000, 32000)
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  throw std::runtime_error("no free loopback port in [20000, 32000) after 1000 tries");
}

// MKL's vector math set up on one thread, once, before two rank threads can
// make the process's first calls at once (Note [First use of MKL on two
// threads] in test/engines/gcts/gcts_step.hpp: one thread's tanh can then
// come from MKL's low-accuracy kernel for a few calls, and two runs compared
// bit for bit differ). A precaution for every two-rank test; the GCTS cases
// that showed it also warm up with their own model.
inline void warm_up_vector_math() {
  static std::once_flag once;
  std::call_once(once, [] {
    const at::Tensor x = at::linspace(-2.0, 2.0, 256).reshape({16, 16}).requires_grad_(true);
    (at::tanh(x.matmul(x)) + at::sigmoid(x) + at::exp(x) + at::log1p(x.abs())).pow(2).mean().backward();
  });
}

// Runs `body(world)` for ranks 0 and 1 on two threads; rethrows a rank's
// exception on the calling thread (Catch assertions stay on this thread).
inline void two_ranks(const std::function<void(World&)>& body) {
  warm_up_vector_math();
  const int64_t port = free_port();
  std::exception_ptr errors[2];
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        WorldInfo info;
        info.rank = r;
        info.world_size = 2;
        info.master_port = port;
        auto world = World::connect(info, /*timeout_ms=*/30000);
        body(*world);
        world->barrier();  // neither rank tears down while the other still talks
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace loongforge::comm::test
