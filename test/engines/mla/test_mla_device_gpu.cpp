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

// A device with about 2 GiB free, and an allocator on it whose other pool
// holds twelve blocks of 150 MiB, every other one freed again: 900 MiB free
// in the pool in holes of 152 MiB (the size class), about 250 MiB left on
// the device. The kept blocks go back when it ends.
struct FragmentedPool {
  cudaStream_t stream = nullptr;
  DeviceAllocator allocator;
  DeviceFill fill{2048 * kMiB};
  std::vector<void*> kept;

  explicit FragmentedPool(bool virtual_memory) : allocator(options(virtual_memory), 0) {
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    std::vector<void*> blocks;
    for (int i = 0; i < 12; ++i) blocks.push_back(allocator.allocate(150 * kMiB, 0, stream));
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i % 2)
        allocator.release(blocks[i], stream);
      else
        kept.push_back(blocks[i]);
    }
  }
  ~FragmentedPool() {
    for (void* p : kept) allocator.release(p, stream);
    (void)cudaStreamDestroy(stream);
  }
  static DeviceOptions options(bool virtual_memory) {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    DeviceOptions o;
    o.virtual_memory = virtual_memory;
    return o;
  }
};

}  // namespace

TEST_CASE("mla device: a virtual pool gives the memory under its free blocks to a request larger than any of them") {
  REQUIRE(VirtualRange::supported(0));
  FragmentedPool f(/*virtual_memory=*/true);
  void* big = f.allocator.allocate(600 * kMiB, 0, f.stream);
  REQUIRE(big != nullptr);
  REQUIRE(cudaMemsetAsync(big, 7, 600 * kMiB, f.stream) == cudaSuccess);  // backed: the device may write all of it
  REQUIRE(cudaStreamSynchronize(f.stream) == cudaSuccess);
  const nlohmann::json j = f.allocator.stats_json();
  INFO(j.dump());
  REQUIRE(j["virtual_memory"].get<bool>());
  REQUIRE(j["reclaims"].get<int>() >= 1);
  REQUIRE(j["reclaimed_mb"].get<double>() >= 6 * 150.0);
  REQUIRE(j["pools"]["other"]["in_use_mb"].get<double>() <= j["pools"]["other"]["reserved_mb"].get<double>());
  f.allocator.release(big, f.stream);
}

TEST_CASE("mla device: pools over cudaMalloc'd ranges run out of memory there, with the bytes free in the pool") {
  FragmentedPool f(/*virtual_memory=*/false);
  std::string message;
  try {
    (void)f.allocator.allocate(600 * kMiB, 0, f.stream);
  } catch (const c10::OutOfMemoryError& e) {
    message = e.what();
  }
  INFO(message);
  REQUIRE(message.find("does not fit in the other pool") != std::string::npos);
}
