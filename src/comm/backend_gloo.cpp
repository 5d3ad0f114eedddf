// The Gloo backend behind World (backends.hpp): CPU tensors over TCP.
// ProcessGroupGloo.hpp includes gloo's own headers, which the torch wheel does
// not ship; Debian's libgloo-dev provides them (docs/architecture.md s9). Only
// this file needs them: without them, open_gloo() says how to get them.
#include <arpa/inet.h>   // inet_ntop
#include <netdb.h>       // getaddrinfo
#include <sys/socket.h>  // socket, connect, getsockname
#include <unistd.h>      // close

#include <algorithm>  // std::min
#include <cstdlib>    // std::getenv
#include <vector>     // std::vector

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#if LOONGFORGE_WITH_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // needs gloo's headers (Debian libgloo-dev)
#endif

#include "backends.hpp"
#include "loongforge/common/error.hpp"

namespace loongforge::comm::detail {

#if LOONGFORGE_WITH_GLOO
// ---------------------------------------------------------------------------
// Gloo's interface
//
// Note [Gloo interface]
// Gloo binds one TCP address per rank and publishes it through the store; the
// peers connect to it. libtorch's C++ default (createDefaultDevice) takes the
// address the hostname resolves to, and falls back to 127.0.0.1 with only a
// warning when it does not resolve: on several hosts every rank then tries to
// reach its peers on its own loopback (seen in separate network namespaces:
// "SO_ERROR: Connection refused, remote=[127.0.0.1]:..."), and
// GLOO_SOCKET_IFNAME is read only by torch's Python bindings. So the choice is
// made here: GLOO_SOCKET_IFNAME (comma-separated interface names, as in
// PyTorch) when set, else the local address of the route to MASTER_ADDR (the
// interface that already reaches rank 0; a UDP connect sends nothing). Tested
// across network namespaces by test/comm/test_multi_host.py.

namespace {

// The local address this host uses to reach `host` ("" when there is no route).
std::string local_address_towards(const std::string& host, int64_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return "";
  std::string out;
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_DGRAM, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* addr = local.ss_family == AF_INET6
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (inet_ntop(local.ss_family, addr, buf, sizeof(buf))) out = buf;
    }
    ::close(fd);
  }
  freeaddrinfo(res);
  return out;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = std::min(s.find(',', start), s.size());
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace

#endif  // LOONGFORGE_WITH_GLOO

// ---------------------------------------------------------------------------
// Opening the process group

c10::intrusive_ptr<c10d::Backend> open_gloo(const c10::intrusive_ptr<c10d::Store>& store, const WorldInfo& info,
                                            std::chrono::milliseconds timeout, std::string* on) {
#if !LOONGFORGE_WITH_GLOO
  (void)store, (void)timeout, (void)on;
  throw CommError("rank " + std::to_string(info.rank) +
                  ": this build has no Gloo (its headers, Debian/Ubuntu package libgloo-dev, were missing at build "
                  "time): multi-rank training on CPUs is unavailable; install libgloo-dev and rebuild, train on GPUs "
                  "(NCCL), or run one process");
#else
  std::string gloo_on;
  try {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    // Note [Gloo interface]
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (ifname && *ifname) {
      for (const auto& iface : split_commas(ifname)) {
        try {
          opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
        } catch (const std::exception& e) {
          throw CommError("rank " + std::to_string(info.rank) + ": GLOO_SOCKET_IFNAME='" + ifname + "': interface '" +
                          iface + "' is unusable: " + e.what() +
                          " (name an interface of this host that has an address, see `ip -brief address`, or unset "
                          "GLOO_SOCKET_IFNAME to use the route to MASTER_ADDR)");
        }
      }
      gloo_on = "interface(s) " + std::string(ifname) + " (GLOO_SOCKET_IFNAME)";
    } else if (const std::string addr = local_address_towards(info.master_addr, info.master_port); !addr.empty()) {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
      gloo_on = addr + " (the route to MASTER_ADDR; GLOO_SOCKET_IFNAME picks another)";
    } else {
      opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      gloo_on = "the hostname's address (no route to MASTER_ADDR " + info.master_addr + " was found)";
    }
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gloo", store);
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, static_cast<int>(info.rank),
                                                          static_cast<int>(info.world_size), opts);
    *on = "Gloo on " + gloo_on;
    return pg;
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError("rank " + std::to_string(info.rank) + ": opening the Gloo process group on " + gloo_on +
                    " failed: " + e.what() +
                    " (every rank must reach every other rank's Gloo address; on hosts with several networks set "
                    "GLOO_SOCKET_IFNAME to the interface they share)");
  }
#endif
}

}  // namespace loongforge::comm::detail
