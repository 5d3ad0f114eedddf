// Proves Note [Virtual pools] (src/engines/mla/device_allocator.cpp) on a GPU:
// with mla.virtual_memory, the memory under a pool's free blocks serves a
// request larger than any of them once the device is full (the pool gives it
// back and backs the request where it lands), where pools over cudaMalloc'd
// ranges run out of memory with the same bytes free in the pool. The device
// is first filled with a plain cudaMalloc so that only a little is left.
#include <cuda_runtime_api.h>  // cudaMalloc, cudaMemGetInfo

#include <string>  // std::string
#include <vector>  // std::vector

#include <c10/util/Exception.h>  // c10::OutOfMemoryError

#include "catch_compat.hpp"
#include "device_allocator.hpp"

using namespace loongforge::mla;

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

// Holds all but `left` of the device's free memory until destroyed.
struct DeviceFill {
  void* p = nullptr;
  explicit DeviceFill(uint64_t left) {
    size_t free_b = 0, total_b = 0;
    REQUIRE(cudaMemGetInfo(&free_b, &total_b) == cudaSuccess);
    REQUIRE(free_b > left + 512 * kMiB);
    REQUIRE(cudaMalloc(&p, free_b - left) == cudaSuccess);
  }
  ~DeviceFill() { (void)cudaFree(p); }
};

// Twelve blocks of 150 MiB, every other one freed again: 900 MiB free in the
// pool in holes of 152 MiB (the size class), about 250 MiB left on the device.
std::vector<void*> fragment(DeviceAllocator& a, cudaStream_t s) {
  std::vector<void*> kept;
  std::vector<void*> blocks;
  for (int i = 0; i < 12; ++i) blocks.push_back(a.allocate(150 * kMiB, 0, s));
  for (int i = 0; i < 12; ++i) {
    if (i % 2) {
      a.release(blocks[static_cast<size_t>(i)], s);
    } else {
      kept.push_back(blocks[static_cast<size_t>(i)]);
    }
  }
  return kept;
}

}  // namespace

TEST_CASE("mla device: a virtual pool gives the memory under its free blocks to a request larger than any of them") {
  REQUIRE(VirtualRange::supported(0));
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  DeviceOptions o;
  o.virtual_memory = true;
  DeviceAllocator a(o, 0);
  DeviceFill fill(2048 * kMiB);
  const std::vector<void*> kept = fragment(a, s);
  void* big = a.allocate(600 * kMiB, 0, s);
  REQUIRE(big != nullptr);
  REQUIRE(cudaMemsetAsync(big, 7, 600 * kMiB, s) == cudaSuccess);  // backed: the device may write all of it
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  const nlohmann::json j = a.stats_json();
  INFO(j.dump());
  REQUIRE(j["virtual_memory"].get<bool>());
  REQUIRE(j["reclaims"].get<int>() >= 1);
  REQUIRE(j["reclaimed_mb"].get<double>() >= 6 * 150.0);
  REQUIRE(j["pools"]["other"]["in_use_mb"].get<double>() <= j["pools"]["other"]["reserved_mb"].get<double>());
  a.release(big, s);
  for (void* p : kept) a.release(p, s);
}

TEST_CASE("mla device: pools over cudaMalloc'd ranges run out of memory there, with the bytes free in the pool") {
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t s = nullptr;
  REQUIRE(cudaStreamCreate(&s) == cudaSuccess);
  DeviceOptions o;
  o.virtual_memory = false;
  DeviceAllocator a(o, 0);
  DeviceFill fill(2048 * kMiB);
  const std::vector<void*> kept = fragment(a, s);
  std::string message;
  try {
    (void)a.allocate(600 * kMiB, 0, s);
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what();
  }
  INFO(message);
  REQUIRE(message.find("does not fit in the other pool") != std::string::npos);
  for (void* p : kept) a.release(p, s);
}
