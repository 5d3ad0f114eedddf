// MLA's virtual ranges (virtual_range.hpp).
#include "virtual_range.hpp"

#include <cuda.h>              // CUmem* types
#include <cudaTypedefs.h>      // PFN_cu* (the driver functions' types)
#include <cuda_runtime_api.h>  // cudaGetDriverEntryPointByVersion

#include <algorithm>  // std::min
#include <mutex>      // std::once_flag
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string
#include <utility>    // std::pair

namespace loongforge::mla {

namespace {

// The driver functions, looked up once through the runtime (CUDA 12.0's signatures).
struct Driver {
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuDeviceGetAttribute_v2000 attribute = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  std::string problem;  // empty when every function was found
};

template <typename F>
void look_up(const char* name, F& fn, std::string& problem) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    if (problem.empty()) problem = std::string("the CUDA driver has no ") + name;
    return;
  }
  fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    look_up("cuMemAddressReserve", d.reserve, d.problem);
    look_up("cuMemAddressFree", d.address_free, d.problem);
    look_up("cuMemCreate", d.create, d.problem);
    look_up("cuMemRelease", d.release, d.problem);
    look_up("cuMemMap", d.map, d.problem);
    look_up("cuMemUnmap", d.unmap, d.problem);
    look_up("cuMemSetAccess", d.set_access, d.problem);
    look_up("cuMemGetAllocationGranularity", d.granularity, d.problem);
    look_up("cuDeviceGetAttribute", d.attribute, d.problem);
    look_up("cuGetErrorString", d.error_string, d.problem);
  });
  return d;
}

void check(CUresult r, const char* call) {
  if (r == CUDA_SUCCESS) return;
  const char* text = nullptr;
  if (driver().error_string == nullptr || driver().error_string(r, &text) != CUDA_SUCCESS || text == nullptr)
    text = "unknown error";
  throw std::runtime_error(std::string("MLA: ") + call + " failed: " + text + " (CUresult " + std::to_string(r) + ")");
}

CUmemAllocationProp prop_for(int device) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  return p;
}

}  // namespace

bool VirtualRange::supported(int device) {
  const Driver& d = driver();
  if (!d.problem.empty()) return false;
  int yes = 0;
  return d.attribute(&yes, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) == CUDA_SUCCESS && yes;
}

VirtualRange::VirtualRange(int device, uint64_t bytes) : device_(device) {
  const Driver& d = driver();
  if (!d.problem.empty()) throw std::runtime_error("MLA: virtual memory is unavailable: " + d.problem);
  const CUmemAllocationProp prop = prop_for(device);
  size_t g = 0;
  check(d.granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), "cuMemGetAllocationGranularity");
  granule_ = g;
  bytes_ = (bytes + granule_ - 1) / granule_ * granule_;
  CUdeviceptr p = 0;
  check(d.reserve(&p, bytes_, granule_, 0, 0), "cuMemAddressReserve");
  base_ = p;
  handles_.assign(bytes_ / granule_, 0);
}

VirtualRange::~VirtualRange() {
  const Driver& d = driver();
  for (size_t i = 0; i < handles_.size(); ++i)
    if (handles_[i] != 0) {
      (void)d.unmap(base_ + i * granule_, granule_);
      (void)d.release(handles_[i]);
    }
  if (base_ != 0) (void)d.address_free(base_, bytes_);
}

bool VirtualRange::map(uint64_t addr, uint64_t bytes) {
  if (bytes == 0) return true;
  if (addr < base_ || addr + bytes > base_ + bytes_) throw std::runtime_error("MLA: map outside the virtual range");
  const Driver& d = driver();
  const CUmemAllocationProp prop = prop_for(device_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const uint64_t first = (addr - base_) / granule_, last = (addr + bytes - 1 - base_) / granule_;
  uint64_t run_start = 0, run_len = 0;  // granules backed by this call and not yet given access
  auto flush = [&] {
    if (run_len == 0) return;
    check(d.set_access(base_ + run_start * granule_, run_len * granule_, &access, 1), "cuMemSetAccess");
    run_len = 0;
  };
  for (uint64_t i = first; i <= last; ++i) {
    if (handles_[i] != 0) {
      flush();
      continue;
    }
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = d.create(&h, granule_, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      flush();
      return false;
    }
    check(r, "cuMemCreate");
    const CUresult m = d.map(base_ + i * granule_, granule_, 0, h, 0);
    if (m != CUDA_SUCCESS) {
      (void)d.release(h);
      flush();
      if (m == CUDA_ERROR_OUT_OF_MEMORY) return false;
      check(m, "cuMemMap");
    }
    handles_[i] = h;
    ++mapped_granules_, ++map_calls_;
    if (run_len == 0) run_start = i;
    ++run_len;
  }
  flush();
  return true;
}

std::pair<uint64_t, uint64_t> VirtualRange::granules_inside(uint64_t addr, uint64_t bytes) const {
  const uint64_t lo = std::max(addr, base_), hi = std::min(addr + bytes, base_ + bytes_);
  if (hi <= lo) return {0, 0};
  const uint64_t first = (lo - base_ + granule_ - 1) / granule_, end = (hi - base_) / granule_;
  return {first, std::max(first, end)};
}

uint64_t VirtualRange::mapped_inside(uint64_t addr, uint64_t bytes) const {
  const auto [first, end] = granules_inside(addr, bytes);
  uint64_t n = 0;
  for (uint64_t i = first; i < end; ++i) n += handles_[i] != 0;
  return n * granule_;
}

uint64_t VirtualRange::unbacked_touched(uint64_t addr, uint64_t bytes) const {
  if (bytes == 0 || addr < base_ || addr + bytes > base_ + bytes_) return 0;
  uint64_t n = 0;
  for (uint64_t i = (addr - base_) / granule_, last = (addr + bytes - 1 - base_) / granule_; i <= last; ++i)
    n += handles_[i] == 0;
  return n;
}

uint64_t VirtualRange::unmap_inside(uint64_t addr, uint64_t bytes) {
  const Driver& d = driver();
  const auto [first, end] = granules_inside(addr, bytes);
  uint64_t n = 0;
  for (uint64_t i = first; i < end; ++i) {
    if (handles_[i] == 0) continue;
    check(d.unmap(base_ + i * granule_, granule_), "cuMemUnmap");
    check(d.release(handles_[i]), "cuMemRelease");
    handles_[i] = 0;
    --mapped_granules_, ++n;
  }
  unmapped_ += n * granule_;
  return n * granule_;
}

}  // namespace loongforge::mla
