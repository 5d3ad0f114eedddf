// The package cache's key (include/loongforge/fusion/package_cache.hpp): a
// package compiled with bf16 working copies, or for a text slot DMF cut, is
// another entry, and a key without them is what it was before the fields; the
// CUDA driver's JIT cache is placed beside the packages unless the user chose.
#include <unistd.h>  // getpid

#include <cstdlib>     // setenv, unsetenv, getenv
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/fusion/package_cache.hpp"
#include "loongforge/model/model.hpp"

using namespace loongforge;

TEST_CASE("package cache: working copies are part of the key, and a key without them reads as before them") {
  const model::Model net = model::Model::load(std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", c10::kCPU);
  fusion::CompileTools tools;
  tools.script = std::string(LOONGFORGE_SOURCE_DIR) + "/scripts/compile_step.py";
  const fusion::PackageKey fp32 = fusion::package_key(net, 2, 16, 32, false, c10::kCPU, tools);
  const fusion::PackageKey copies =
      fusion::package_key(net, 2, 16, 32, false, c10::kCPU, tools, {"connector.fc1.weight"});
  REQUIRE_FALSE(fp32.to_json().contains("bf16_weights"));  // the digests of existing entries stay theirs
  REQUIRE(copies.to_json().at("bf16_weights") == std::vector<std::string>{"connector.fc1.weight"});
  REQUIRE(fp32.digest() != copies.digest());
  REQUIRE(fp32.file_name() != copies.file_name());
  nlohmann::json without = copies.to_json();
  without.erase("bf16_weights");
  REQUIRE(without == fp32.to_json());  // nothing else differs
}

TEST_CASE("package cache: a text slot cut by DMF is part of the key, and the model's own slot reads as before") {
  const model::Model net = model::Model::load(std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", c10::kCPU);
  fusion::CompileTools tools;
  tools.script = std::string(LOONGFORGE_SOURCE_DIR) + "/scripts/compile_step.py";
  REQUIRE(net.info().text_slot == 32);
  const fusion::PackageKey whole = fusion::package_key(net, 2, 16, 32, false, c10::kCPU, tools);
  const fusion::PackageKey cut = fusion::package_key(net, 2, 16, 14, false, c10::kCPU, tools);
  REQUIRE_FALSE(whole.to_json().contains("text_width"));  // the digests of existing entries stay theirs
  REQUIRE(cut.to_json().at("text_width") == 14);
  REQUIRE(cut.digest() != whole.digest());
  nlohmann::json without = cut.to_json();
  without.erase("text_width");
  REQUIRE(without == whole.to_json());  // nothing else differs
}

TEST_CASE("package cache: the driver's JIT cache goes beside the packages unless the user chose its place") {
  const std::string root = "/tmp/lf-jit-cache-" + std::to_string(getpid());
  config::Config cfg;
  cfg.trainer.compile_cache = root;
  unsetenv("CUDA_CACHE_PATH");
  unsetenv("CUDA_CACHE_DISABLE");
  SECTION("a CPU run leaves the driver alone") {
    cfg.run.device = "cpu";
    REQUIRE(fusion::share_cuda_jit_cache(cfg).empty());
    REQUIRE(std::getenv("CUDA_CACHE_PATH") == nullptr);
  }
  SECTION("the user's CUDA_CACHE_PATH or CUDA_CACHE_DISABLE is kept") {
    setenv("CUDA_CACHE_PATH", "/somewhere/else", 1);
    REQUIRE(fusion::share_cuda_jit_cache(cfg).empty());
    REQUIRE(std::string(std::getenv("CUDA_CACHE_PATH")) == "/somewhere/else");
    unsetenv("CUDA_CACHE_PATH");
    setenv("CUDA_CACHE_DISABLE", "1", 1);
    REQUIRE(fusion::share_cuda_jit_cache(cfg).empty());
    REQUIRE(std::getenv("CUDA_CACHE_PATH") == nullptr);
  }
  SECTION("otherwise <cache>/cuda-jit, made") {
    const std::string dir = fusion::share_cuda_jit_cache(cfg);
    REQUIRE(dir == root + "/cuda-jit");
    REQUIRE(std::string(std::getenv("CUDA_CACHE_PATH")) == dir);
    REQUIRE(is_directory(dir));
  }
  SECTION("a cache directory that cannot be made leaves the driver's default") {
    cfg.trainer.compile_cache = "/proc/no-such-place/cache";
    REQUIRE(fusion::share_cuda_jit_cache(cfg).empty());
    REQUIRE(std::getenv("CUDA_CACHE_PATH") == nullptr);
  }
  unsetenv("CUDA_CACHE_PATH");
  unsetenv("CUDA_CACHE_DISABLE");
  remove_tree(root);
}
