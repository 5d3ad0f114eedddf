// SHA-256: OpenSSL's libcrypto when the build has it (LOONGFORGE_WITH_OPENSSL),
// and the FIPS 180-4 section 6.2 reference code below, always built (sha256.hpp).
#include "loongforge/common/sha256.hpp"

#include <algorithm>  // std::min
#include <array>      // std::array
#include <cerrno>     // errno
#include <cstdint>    // uint8_t, uint32_t
#include <cstdio>     // std::fopen, std::fread
#include <cstring>    // std::memcpy, std::strerror

#if LOONGFORGE_WITH_OPENSSL
#include <openssl/crypto.h>  // OpenSSL_version
#include <openssl/evp.h>     // EVP_MD_CTX, EVP_sha256, EVP_Digest*
#endif

#include "loongforge/common/error.hpp"

namespace loongforge {

namespace {

constexpr const char* kHexDigits = "0123456789abcdef";

#if LOONGFORGE_WITH_OPENSSL

// OpenSSL's EVP digest. Its context is the whole state.
struct OpenSslEngine {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  OpenSslEngine() {
    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) throw Error("OpenSSL: cannot start a SHA-256 digest");
  }
  ~OpenSslEngine() { EVP_MD_CTX_free(ctx); }
  void update(const uint8_t* p, size_t bytes) {
    if (EVP_DigestUpdate(ctx, p, bytes) != 1) throw Error("OpenSSL: SHA-256 update failed");
  }
  std::array<uint8_t, 32> finish() {
    std::array<uint8_t, 32> md{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx, md.data(), &len) != 1 || len != 32) throw Error("OpenSSL: SHA-256 final failed");
    return md;
  }
};

#endif

// ---------------------------------------------------------------------------
// FIPS 180-4 section 6.2, one 64-byte block at a time.

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

struct BuiltinEngine {
  std::array<uint32_t, 8> h{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                            0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::array<uint8_t, 64> buf{};
  size_t buf_len = 0;
  uint64_t total = 0;

  void block(const uint8_t* p) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = (uint32_t(p[4 * i]) << 24) | (uint32_t(p[4 * i + 1]) << 16) | (uint32_t(p[4 * i + 2]) << 8) | p[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
  }

  void update(const uint8_t* p, size_t bytes) {
    total += bytes;
    if (buf_len > 0) {
      const size_t take = std::min(bytes, 64 - buf_len);
      std::memcpy(buf.data() + buf_len, p, take);
      buf_len += take, p += take, bytes -= take;
      if (buf_len < 64) return;  // the block is still partial (and all input taken)
      block(buf.data());
      buf_len = 0;
    }
    for (; bytes >= 64; p += 64, bytes -= 64) block(p);
    std::memcpy(buf.data(), p, bytes);
    buf_len = bytes;
  }

  std::array<uint8_t, 32> finish() {
    const uint64_t bits = total * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (buf_len != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
    update(len, 8);
    std::array<uint8_t, 32> md{};
    for (int i = 0; i < 8; ++i)
      for (int k = 0; k < 4; ++k) md[4 * i + k] = static_cast<uint8_t>(h[i] >> (24 - 8 * k));
    return md;
  }
};

}  // namespace

struct Sha256::State {
  BuiltinEngine builtin;
#if LOONGFORGE_WITH_OPENSSL
  std::unique_ptr<OpenSslEngine> openssl;  // null: the built-in code
#endif
};

Sha256::Sha256(Impl impl) : s_(std::make_unique<State>()) {
#if LOONGFORGE_WITH_OPENSSL
  if (impl == Impl::best) s_->openssl = std::make_unique<OpenSslEngine>();
#endif
  (void)impl;
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
#if LOONGFORGE_WITH_OPENSSL
  if (s_->openssl) return s_->openssl->update(p, bytes);
#endif
  s_->builtin.update(p, bytes);
}

std::string Sha256::hex() {
#if LOONGFORGE_WITH_OPENSSL
  const std::array<uint8_t, 32> md = s_->openssl ? s_->openssl->finish() : s_->builtin.finish();
#else
  const std::array<uint8_t, 32> md = s_->builtin.finish();
#endif
  std::string out;
  for (const uint8_t b : md) out += kHexDigits[b >> 4], out += kHexDigits[b & 0xF];
  return out;
}

std::string Sha256::implementation(Impl impl) {
#if LOONGFORGE_WITH_OPENSSL
  if (impl == Impl::best) return OpenSSL_version(OPENSSL_VERSION);
#endif
  (void)impl;
  return "built-in (FIPS 180-4 reference code)";
}

std::string sha256_hex(const std::string& data) {
  Sha256 h;
  h.update(data);
  return h.hex();
}

std::string sha256_file(const std::string& path, uint64_t* bytes) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw Error("cannot read '" + path + "': " + std::strerror(errno));
  Sha256 h;
  static thread_local char buf[1 << 20];
  size_t n;
  uint64_t total = 0;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) h.update(buf, n), total += n;
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) throw Error("read error in '" + path + "'");
  if (bytes) *bytes = total;
  return h.hex();
}

}  // namespace loongforge
