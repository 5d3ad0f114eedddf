// Proves the comm room's plain path: world_from_env() reads torchrun's and
// Slurm's variables and refuses bad ones naming the variable; two ranks in one
// process (two threads, Gloo over a TCPStore on a free port) sum with
// all-reduce, GradientSync averages gradients (a parameter without a gradient
// on one rank counts as zeros there and gets the average), and a rendezvous
// nobody joins fails with a CommError naming the address and rank.
#include <netinet/in.h>  // sockaddr_in
#include <signal.h>      // signal, sigaction, SIGPIPE
#include <stdlib.h>      // setenv, unsetenv
#include <sys/socket.h>  // socket, bind
#include <unistd.h>      // close, write

#include <cerrno>  // errno, EPIPE

#include <exception>   // std::exception_ptr
#include <functional>  // std::function
#include <map>
#include <string>
#include <thread>  // std::thread
#include <vector>

#include <ATen/ATen.h>  // at::full, at::arange

#include "catch_compat.hpp"
#include "ranks.hpp"
#include "loongforge/comm/reducer.hpp"
#include "loongforge/comm/shard.hpp"
#include "loongforge/comm/world.hpp"
#include "loongforge/comm/world_info.hpp"
#include "loongforge/common/error.hpp"

using namespace loongforge;
using namespace loongforge::comm;
using lf_catch::Contains;
using loongforge::comm::test::free_port;
using loongforge::comm::test::two_ranks;

namespace {

// Clears every variable world_from_env() reads, then sets `vars`; restores on exit.
struct Env {
  static constexpr const char* kNames[] = {"RANK",         "WORLD_SIZE",   "LOCAL_RANK",    "MASTER_ADDR",
                                           "MASTER_PORT",  "SLURM_PROCID", "SLURM_NTASKS",  "SLURM_LOCALID",
                                           "LOCAL_WORLD_SIZE"};
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* n : kNames) ::unsetenv(n);
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const char* n : kNames) ::unsetenv(n);
  }
};

}  // namespace

TEST_CASE("comm: without launcher variables the process is a one-rank world") {
  Env env({});
  const WorldInfo w = world_from_env();
  REQUIRE(w.rank == 0);
  REQUIRE(w.world_size == 1);
  REQUIRE(w.local_rank == 0);
  REQUIRE(w.master_addr == "127.0.0.1");
  REQUIRE(w.master_port == 29500);
  REQUIRE(w.source == "single process");
}

TEST_CASE("comm: torchrun variables give rank, world, local rank and the rendezvous address") {
  Env env({{"WORLD_SIZE", "4"},
           {"RANK", "2"},
           {"LOCAL_RANK", "1"},
           {"MASTER_ADDR", "10.1.2.3"},
           {"MASTER_PORT", "29511"},
           {"SLURM_NTASKS", "8"},
           {"SLURM_PROCID", "7"}});  // torchrun wins
  const WorldInfo w = world_from_env();
  REQUIRE(w.rank == 2);
  REQUIRE(w.world_size == 4);
  REQUIRE(w.local_rank == 1);
  REQUIRE(w.master_addr == "10.1.2.3");
  REQUIRE(w.master_port == 29511);
  REQUIRE(w.source == "torchrun environment");
}

TEST_CASE("comm: Slurm variables give rank, world and local rank") {
  Env env({{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}, {"MASTER_PORT", "29400"}});
  const WorldInfo w = world_from_env();
  REQUIRE(w.rank == 5);
  REQUIRE(w.world_size == 8);
  REQUIRE(w.local_rank == 1);
  REQUIRE(w.master_port == 29400);
  REQUIRE(w.source == "Slurm environment");
}

TEST_CASE("comm: bad launcher variables are refused naming the variable") {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>> cases = {
      {{{"WORLD_SIZE", "2"}, {"RANK", "one"}, {"MASTER_PORT", "1"}},
       "environment variable RANK='one' is not a non-negative integer"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "-1"}, {"MASTER_PORT", "1"}},
       "environment variable RANK='-1' is not a non-negative integer"},
      {{{"WORLD_SIZE", "2x"}}, "environment variable WORLD_SIZE='2x' is not a non-negative integer"},
      {{{"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}, "WORLD_SIZE is set but RANK is not"},
      {{{"WORLD_SIZE", "0"}, {"RANK", "0"}}, "world size 0"},
      {{{"WORLD_SIZE", "4"}, {"RANK", "4"}, {"MASTER_PORT", "1"}},
       "rank 4 is not below the world size 4 (torchrun environment)"},
      {{{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "3"}, {"MASTER_PORT", "1"}},
       "rank 3 is not below the world size 2 (Slurm environment)"},
      {{{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}}, "MASTER_PORT is not set"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_PORT", "70000"}}, "MASTER_PORT=70000 is not a TCP port"},
      {{{"MASTER_PORT", "0"}}, "MASTER_PORT=0 is not a TCP port"},
      {{{"RANK", "1"}, {"MASTER_PORT", "1"}}, "RANK is set but WORLD_SIZE is not"},
      {{{"SLURM_NTASKS", "4"}, {"MASTER_PORT", "1"}}, "SLURM_NTASKS is set but SLURM_PROCID is not"},
      {{{"WORLD_SIZE", "4"}, {"RANK", "1"}, {"LOCAL_RANK", "3"}, {"MASTER_PORT", "1"}},
       "LOCAL_RANK=3 is above RANK=1 (torchrun environment)"},
      {{{"WORLD_SIZE", "4"}, {"RANK", "3"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}},
       "LOCAL_WORLD_SIZE=2 does not fit LOCAL_RANK=3 and WORLD_SIZE=4"},
      {{{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_ADDR", "no-such-host.invalid"}, {"MASTER_PORT", "29500"}},
       "MASTER_ADDR='no-such-host.invalid' does not resolve"},
  };
  for (const auto& [vars, message] : cases) {
    INFO(message);
    Env env(vars);
    REQUIRE_THROWS_AS(world_from_env(), ConfigError);
    REQUIRE_THROWS_WITH(world_from_env(), Contains(message));
  }
}

TEST_CASE("comm: all-reduce over two ranks sums the tensor in place on both") {
  at::Tensor results[2][2];
  two_ranks([&](World& world) {
    const double k = static_cast<double>(world.rank() + 1);  // rank 0: 1, rank 1: 2
    // Gloo reduces one tensor per call (a vector holds one tensor per device).
    std::vector<at::Tensor> a = {at::full({3}, k, at::kFloat)};
    std::vector<at::Tensor> b = {at::arange(4, at::kDouble) * k};
    world.allreduce_sum(a);
    world.allreduce_sum(b);
    results[world.rank()][0] = a[0];
    results[world.rank()][1] = b[0];
  });
  for (const auto& t : results) {
    REQUIRE(at::equal(t[0], at::full({3}, 3.0f)));
    REQUIRE(at::equal(t[1], at::tensor({0.0, 3.0, 6.0, 9.0}, at::kDouble)));
  }
}

TEST_CASE("comm: GradientSync averages gradients over ranks, a missing gradient counting as zeros") {
  struct Out {
    at::Tensor w_grad, b_grad, only0_grad;
    double loss = 0, bytes = 0;
    std::string agreed;
    int64_t valid = 0;
  } out[2];
  two_ranks([&](World& world) {
    const int64_t r = world.rank();
    at::Tensor w = at::zeros({2, 3}).set_requires_grad(true);
    at::Tensor b = at::zeros({3}).set_requires_grad(true);
    at::Tensor only0 = at::zeros({2}).set_requires_grad(true);  // used by rank 0's batch only
    w.mutable_grad() = at::arange(6, at::kFloat).reshape({2, 3}) * static_cast<float>(r + 1);
    b.mutable_grad() = at::full({3}, r == 0 ? 1.0f : 3.0f);
    if (r == 0) only0.mutable_grad() = at::tensor({4.0f, -8.0f});
    GradientSync sync(world);
    const SyncStats s = sync.average({w, b, only0});
    // The trainer's seam over the same world: the loss and the valid counts are sums over ranks.
    auto reducer = make_plain_reducer(&world);
    const double loss = reducer->sum_scalar(at::scalar_tensor(r == 0 ? 1.0 : 2.0, at::kDouble)).item<double>();
    const int64_t valid = reducer->agree_counts({r == 0 ? 5 : 7, {r}}).valid;
    out[r] = {w.grad(), b.grad(), only0.grad(), loss, s.bytes, world.agree("run_dir", r == 0 ? "runs/a" : "ignored"),
              valid};
  });
  for (const auto& o : out) {
    REQUIRE(at::allclose(o.w_grad, at::arange(6, at::kFloat).reshape({2, 3}) * 1.5f));
    REQUIRE(at::equal(o.b_grad, at::full({3}, 2.0f)));
    REQUIRE(o.only0_grad.defined());
    REQUIRE(at::equal(o.only0_grad, at::tensor({2.0f, -4.0f})));
    REQUIRE(o.loss == 3.0);
    REQUIRE(o.valid == 12);
    REQUIRE(o.bytes == 11 * 4);  // one fp32 bucket of every parameter
    REQUIRE(o.agreed == "runs/a");
  }
}

TEST_CASE("comm: a rank whose rendezvous store is unreachable fails naming the address and the rank") {
  WorldInfo info;
  info.rank = 1;
  info.world_size = 2;
  info.master_port = free_port();  // nobody serves it
  REQUIRE_THROWS_WITH(World::connect(info, /*timeout_ms=*/500),
                      Contains("rank 1: rendezvous at 127.0.0.1:" + std::to_string(info.master_port) + " failed"));
}

TEST_CASE("comm: reduce-scatter gives each rank the sum of its piece, all-gather puts every rank's tensor in order") {
  at::Tensor scattered[2], gathered[2];
  two_ranks([&](World& world) {
    const int64_t r = world.rank();
    REQUIRE(world.backend() == Backend::Gloo);
    REQUIRE(world.device() == c10::Device(c10::kCPU));
    // Rank r contributes (r + 1) * [0..5]; piece k is elements [3k, 3k + 3).
    at::Tensor in = at::arange(6, at::kFloat) * static_cast<float>(r + 1);
    at::Tensor out = at::empty({3}, at::kFloat);
    world.reduce_scatter_sum_async(out, {in.narrow(0, 0, 3), in.narrow(0, 3, 3)}).wait();
    at::Tensor all = at::empty({4}, at::kFloat);
    world.all_gather_async(all, at::full({2}, static_cast<float>(10 * (r + 1)))).wait();
    scattered[r] = out, gathered[r] = all;
  });
  REQUIRE(at::equal(scattered[0], at::tensor({0.0f, 3.0f, 6.0f})));
  REQUIRE(at::equal(scattered[1], at::tensor({9.0f, 12.0f, 15.0f})));
  for (const auto& g : gathered) REQUIRE(at::equal(g, at::tensor({10.0f, 10.0f, 20.0f, 20.0f})));
}

TEST_CASE("comm: the flat shard layout splits the big tensors over ranks and keeps tiny ones replicated") {
  const ShardLayout l0 = ShardLayout::make({1000, 8, 3001}, /*tiny_numel=*/16, /*world=*/2, /*rank=*/0);
  const ShardLayout l1 = ShardLayout::make({1000, 8, 3001}, 16, 2, 1);
  REQUIRE(l0.sharded == std::vector<size_t>{0, 2});
  REQUIRE(l0.replicated == std::vector<size_t>{1});
  REQUIRE(l0.total == 4001);
  REQUIRE(l0.chunk == 2001);
  REQUIRE((l0.begin() == 0 && l0.end() == 2001 && l1.begin() == 2001 && l1.end() == 4001));
  // Rank 0: all of tensor 0 and the first 1001 elements of tensor 2; rank 1: the other 2000.
  REQUIRE(l0.segments.size() == 2);
  REQUIRE((l0.segments[1].param == 2 && l0.segments[1].param_offset == 0 && l0.segments[1].shard_offset == 1000 &&
           l0.segments[1].numel == 1001));
  REQUIRE(l1.segments.size() == 1);
  REQUIRE((l1.segments[0].param == 2 && l1.segments[0].param_offset == 1001 && l1.segments[0].shard_offset == 0 &&
           l1.segments[0].numel == 2000));
  // More ranks than elements: the last ranks own nothing.
  const ShardLayout l3 = ShardLayout::make({5}, 0, 8, 7);
  REQUIRE((l3.chunk == 1 && l3.owned() == 0 && l3.segments.empty()));
}

TEST_CASE("comm: a rendezvous that no peer joins fails naming the address and the rank") {
  WorldInfo info;
  info.rank = 0;
  info.world_size = 2;
  info.master_port = free_port();
  REQUIRE_THROWS_WITH(World::connect(info, /*timeout_ms=*/500),
                      Contains("rank 0: rendezvous at 127.0.0.1:" + std::to_string(info.master_port) + " failed"));
}

TEST_CASE("comm: a process that connects a World ignores SIGPIPE, so a write to a dead peer fails instead of ending it") {
  ::signal(SIGPIPE, SIG_DFL);  // the default: a write to a closed socket ends the process
  two_ranks([](World& world) { REQUIRE(world.size() == 2); });
  struct sigaction now {};
  ::sigaction(SIGPIPE, nullptr, &now);
  REQUIRE(now.sa_handler == SIG_IGN);
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  ::close(fds[1]);  // the peer is gone
  const char byte = 1;
  REQUIRE(::write(fds[0], &byte, 1) == -1);  // Gloo and TCPStore write without MSG_NOSIGNAL
  REQUIRE(errno == EPIPE);
  ::close(fds[0]);
}
