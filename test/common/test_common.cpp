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
// Spins the calling thread until it has run `cpu_s` seconds of CPU time by its own ThreadUsage (or
// 60 s of wall time pass, so that a broken ThreadUsage fails the test instead of hanging it).
// On a loaded machine the wall time this takes has no bound worth writing; the CPU time does.
struct Spun {
  double cpu_s = 0;
  double wall_s = 0;
};
Spun spin_cpu(double cpu_s) {
  const auto t0 = std::chrono::steady_clock::now();
  const loongforge::ThreadUsage u0 = loongforge::ThreadUsage::now();
  double x = 0;
  Spun spun;
  while (spun.cpu_s < cpu_s && spun.wall_s < 60) {
    for (int i = 0; i < 100000; ++i) x += 1e-9 * x + 1;
    spun.cpu_s = (loongforge::ThreadUsage::now() - u0).cpu_s;
    spun.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (x < 0) spun.cpu_s = -1;  // keeps the loop's arithmetic
  return spun;
}
}  // namespace

TEST_CASE("common: a thread's usage counts its own CPU time, not another thread's") {
  const Spun busy = spin_cpu(0.2);
  CHECK(busy.cpu_s >= 0.2);
  CHECK(busy.cpu_s <= busy.wall_s + 0.02);  // a thread runs at most one core's worth (tick slack)
  const loongforge::ThreadUsage t1 = loongforge::ThreadUsage::now();
  Spun other;
  std::thread worker([&other] { other = spin_cpu(0.2); });
  worker.join();
  const loongforge::ThreadUsage idle = loongforge::ThreadUsage::now() - t1;
  CHECK(other.cpu_s >= 0.2);
  CHECK(idle.cpu_s < 0.05);  // this thread only waited while the other ran 0.2 s of CPU
  CHECK(idle.major_faults >= 0);
  // The process's storage reads never go back; -1 only where the kernel keeps no I/O accounting.
  CHECK((idle.storage_read_bytes >= 0 || loongforge::ThreadUsage::now().storage_read_bytes == -1));
}
