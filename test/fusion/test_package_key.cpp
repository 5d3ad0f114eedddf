// The package cache's key (include/loongforge/fusion/package_cache.hpp): a
// package compiled with bf16 working copies is another entry than one of fp32
// weights, and the key of fp32 weights is what it was before the field.
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "loongforge/fusion/package_cache.hpp"
#include "loongforge/model/model.hpp"

using namespace loongforge;

TEST_CASE("package cache: working copies are part of the key, and a key without them reads as before them") {
  const model::Model net = model::Model::load(std::string(LOONGFORGE_TEST_MODELS) + "/n16-tiny.pt", c10::kCPU);
  fusion::CompileTools tools;
  tools.script = std::string(LOONGFORGE_SOURCE_DIR) + "/scripts/compile_step.py";
  const fusion::PackageKey fp32 = fusion::package_key(net, 2, 16, false, c10::kCPU, tools);
  const fusion::PackageKey copies =
      fusion::package_key(net, 2, 16, false, c10::kCPU, tools, {"connector.fc1.weight"});
  REQUIRE_FALSE(fp32.to_json().contains("bf16_weights"));  // the digests of existing entries stay theirs
  REQUIRE(copies.to_json().at("bf16_weights") == std::vector<std::string>{"connector.fc1.weight"});
  REQUIRE(fp32.digest() != copies.digest());
  REQUIRE(fp32.file_name() != copies.file_name());
  nlohmann::json without = copies.to_json();
  without.erase("bf16_weights");
  REQUIRE(without == fp32.to_json());  // nothing else differs
}
