// loongforge/common/sha256.hpp — SHA-256 (FIPS 180-4), for checkpoint
// manifests and model/config identity hashes. Incremental; not thread-safe
// per instance (one instance per thread: checkpoint chunks are hashed by
// several threads at once, each with its own).
//
// The digest comes from OpenSSL's libcrypto (EVP, with its SHA-NI/AVX2 code
// paths) when the build found it (libssl-dev), else from the FIPS 180-4
// reference code in sha256.cpp, which is always built (Impl::builtin asks for
// it: tests compare the two, scripts/bench/checkpoint.sh times both). Both
// give the same digests.
//
// Example:
//   Sha256 h; h.update(data, n); std::string hex = h.hex();   // 64 hex digits
//   sha256_file("model.safetensors");
#pragma once

#include <cstddef>  // size_t
#include <cstdint>  // uint64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

namespace loongforge {

class Sha256 {
 public:
  enum class Impl { best, builtin };  // best: OpenSSL where built, else builtin
  explicit Sha256(Impl impl = Impl::best);
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::string hex();  // finalizes; call once

  // "OpenSSL 3.0.19 ..." or "built-in (FIPS 180-4 reference code)".
  static std::string implementation(Impl impl = Impl::best);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

std::string sha256_hex(const std::string& data);
// Throws Error naming the file when it cannot be read.
std::string sha256_file(const std::string& path, uint64_t* bytes = nullptr);

}  // namespace loongforge
