// loongforge/common/sha256.hpp — SHA-256 (FIPS 180-4), for checkpoint
// manifests and model/config identity hashes. Incremental; not thread-safe
// per instance.
//
// Example:
//   Sha256 h; h.update(data, n); std::string hex = h.hex();   // 64 hex digits
//   sha256_file("model.safetensors");
#pragma once

#include <array>    // std::array
#include <cstddef>  // size_t
#include <cstdint>  // uint8_t, uint32_t, uint64_t
#include <string>   // std::string

namespace loongforge {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t bytes);
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::string hex();  // finalizes; call once

 private:
  void block(const uint8_t* p);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, 64> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

std::string sha256_hex(const std::string& data);
// Throws Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace loongforge
