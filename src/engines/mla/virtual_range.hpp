// MLA's virtual ranges (room-private): one reserved device address range whose
// granules (2 MiB on current GPUs) are backed by physical memory only while a
// block over them is in use, through the CUDA driver's virtual memory
// management (cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap, cuMemRelease; reached through cudaGetDriverEntryPointByVersion,
// so nothing links libcuda). Note [Virtual pools] in device_allocator.cpp says
// why a pool sits on one.
//
// Contract:
//  - The constructor reserves `bytes` (rounded up to the granule) of address
//    space on `device`, nothing physical; it throws std::runtime_error naming
//    the call when the driver refuses. supported(device) says beforehand
//    whether the device has virtual memory management at all.
//  - map(addr, bytes) backs every granule that [addr, addr + bytes) touches
//    and is not backed yet, and makes it readable and writable from `device`;
//    it returns false (what it backed stays backed) when the device has no
//    physical memory left, and throws on any other driver error.
//  - unmap_inside(addr, bytes) gives back the physical memory of every backed
//    granule lying entirely inside [addr, addr + bytes) and returns how many
//    bytes that was. The caller guarantees no work in flight uses them.
//  - Not thread-safe: the device allocator's mutex serialises calls.
//  - The destructor unmaps and releases everything and frees the address range.
#pragma once

#include <cstdint>  // uint64_t
#include <utility>  // std::pair
#include <vector>   // std::vector

namespace loongforge::mla {

class VirtualRange {
 public:
  static bool supported(int device);

  VirtualRange(int device, uint64_t bytes);
  ~VirtualRange();
  VirtualRange(const VirtualRange&) = delete;
  VirtualRange& operator=(const VirtualRange&) = delete;

  uint64_t base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t granule() const { return granule_; }
  uint64_t mapped_bytes() const { return mapped_granules_ * granule_; }
  uint64_t map_calls() const { return map_calls_; }      // granules backed so far (cuMemCreate calls)
  uint64_t unmapped_bytes() const { return unmapped_; }  // given back so far

  bool map(uint64_t addr, uint64_t bytes);
  uint64_t unmap_inside(uint64_t addr, uint64_t bytes);
  // Bytes of backed granules entirely inside [addr, addr + bytes) (what unmap_inside would give back).
  uint64_t mapped_inside(uint64_t addr, uint64_t bytes) const;
  // Granules that [addr, addr + bytes) touches and that are not backed (0: all backed).
  uint64_t unbacked_touched(uint64_t addr, uint64_t bytes) const;

 private:
  // The granules [first, end) lying wholly inside [addr, addr + bytes) and the range.
  std::pair<uint64_t, uint64_t> granules_inside(uint64_t addr, uint64_t bytes) const;

  int device_ = 0;
  uint64_t base_ = 0, bytes_ = 0, granule_ = 0;
  std::vector<unsigned long long> handles_;  // per granule: its CUmemGenericAllocationHandle, 0 = not backed
  uint64_t mapped_granules_ = 0, map_calls_ = 0, unmapped_ = 0;
};

}  // namespace loongforge::mla
