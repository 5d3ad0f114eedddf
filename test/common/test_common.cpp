// Proves the common room's building blocks: SHA-256 against the FIPS 180-4
// and NIST test vectors (also when fed in odd pieces; OpenSSL's and the
// built-in code give the same digests), and the POSIX file
// helpers that replace std::filesystem (Note [No std::filesystem]).
#include <algorithm>  // std::min
#include <cstdint>    // uint32_t
#include <fstream>    // std::ofstream
#include <string>
#include <thread>     // std::thread
#include <chrono>     // std::chrono

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/common/threads.hpp"

using namespace loongforge;
using lf_catch::Contains;

TEST_CASE("common: sha256 matches the FIPS 180-4 test vectors") {
  REQUIRE(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  REQUIRE(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  REQUIRE(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  REQUIRE(sha256_hex(std::string(1000000, 'a')) ==
          "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("common: sha256 gives the same digest however the input is split") {
  const std::string text = "The quick brown fox jumps over the lazy dog, again and again and again, 0123456789.";
  for (size_t piece : {1u, 3u, 7u, 63u, 64u, 65u}) {
    Sha256 h;
    for (size_t i = 0; i < text.size(); i += piece) h.update(text.substr(i, piece));
    REQUIRE(h.hex() == sha256_hex(text));
  }
}

TEST_CASE("common: sha256's built-in code and the library it is built with (OpenSSL where found) agree") {
  INFO("best: " << Sha256::implementation());
  std::string data(3 << 20, '\0');
  uint32_t x = 12345;
  for (char& c : data) c = static_cast<char>((x = x * 1103515245u + 12345u) >> 24);
  for (size_t piece : {1u, 63u, 4096u, 1u << 20}) {
    Sha256 best, builtin(Sha256::Impl::builtin);
    for (size_t i = 0; i < data.size(); i += piece) {
      const size_t n = std::min(piece, data.size() - i);
      best.update(data.data() + i, n);
      builtin.update(data.data() + i, n);
    }
    REQUIRE(best.hex() == builtin.hex());
  }
  Sha256 abc(Sha256::Impl::builtin);
  abc.update("abc");
  REQUIRE(abc.hex() == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("common: files helpers make, copy, rename and remove trees") {
  const std::string root = std::string(LOONGFORGE_TEST_MODELS) + "/files-test";
  remove_tree(root);
  make_dirs(root + "/a/b/c");
  REQUIRE(is_directory(root + "/a/b/c"));
  std::ofstream(root + "/a/b/c/f.txt") << "hello";
  copy_tree(root + "/a", root + "/copy");
  REQUIRE(path_exists(root + "/copy/b/c/f.txt"));
  REQUIRE(sha256_file(root + "/copy/b/c/f.txt") == sha256_hex("hello"));
  rename_path(root + "/copy", root + "/moved");
  REQUIRE_FALSE(path_exists(root + "/copy"));
  resize_file(root + "/moved/b/c/f.txt", 2);
  REQUIRE(sha256_file(root + "/moved/b/c/f.txt") == sha256_hex("he"));
  remove_tree(root);
  REQUIRE_FALSE(path_exists(root));
  remove_tree(root);  // absent: no error
  REQUIRE_THROWS_WITH(sha256_file(root + "/nope"), Contains("cannot read '" + root + "/nope'"));
}

namespace {
// Spins the calling thread for `s` seconds of wall time; returns something the compiler must keep.
double spin(double s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
  double x = 0;
  while (std::chrono::steady_clock::now() < until) x += 1e-9 * x + 1;
  return x;
}
}  // namespace

TEST_CASE("common: a thread's usage counts its own CPU time, not another thread's") {
  const loongforge::ThreadUsage t0 = loongforge::ThreadUsage::now();
  CHECK(spin(0.3) > 0);
  const loongforge::ThreadUsage busy = loongforge::ThreadUsage::now() - t0;
  CHECK(busy.cpu_s >= 0.1);  // 0.3 s spun; a loaded 2-core machine may run it a third of the time
  CHECK(busy.major_faults >= 0);
  const loongforge::ThreadUsage t1 = loongforge::ThreadUsage::now();
  double other = 0;
  std::thread worker([&other] { other = spin(0.3); });
  worker.join();
  const loongforge::ThreadUsage idle = loongforge::ThreadUsage::now() - t1;
  CHECK(other > 0);
  CHECK(idle.cpu_s < 0.05);  // this thread only waited
  // The process's storage reads never go back; -1 only where the kernel keeps no I/O accounting.
  CHECK((idle.storage_read_bytes >= 0 || loongforge::ThreadUsage::now().storage_read_bytes == -1));
}
