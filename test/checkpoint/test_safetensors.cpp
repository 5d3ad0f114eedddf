// Proves the safetensors writer and reader: tensors of every stored dtype,
// bf16 included, come back bit for bit with their names, shapes and order; the
// bytes on disk follow the Hugging Face layout (little-endian header length,
// JSON header, 8-byte aligned data); the returned size and SHA-256 are the
// file's; damaged files are refused with the path named.
#include <cstdint>  // uint64_t
#include <cstring>  // std::memcpy
#include <fstream>  // std::ifstream
#include <string>

#include <ATen/ATen.h>  // at::tensor, at::equal

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/sha256.hpp"
#include "snapshots.hpp"

using namespace loongforge;
using namespace loongforge::checkpoint;
using lf_catch::Contains;

namespace {
std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST_CASE("checkpoint: safetensors round trip keeps names, order, shapes, dtypes and bits") {
  lf_test::ScratchDir dir;
  const std::string path = dir.path + "/t.safetensors";
  const NamedTensors tensors = {
      {"z.f32", at::tensor({1.5f, -0.25f, 3e-8f, 65504.f, -1e30f, 0.f}).reshape({2, 3})},
      {"a.bf16", at::tensor({1.0f, -2.0f, 0.1f, 3.14159f}).to(at::kBFloat16)},
      {"m.f16", at::tensor({0.5f, -7.0f}).to(at::kHalf)},
      {"m.f64", at::tensor({1.0 / 3.0})},
      {"i.i64", at::tensor({int64_t{-9}, int64_t{1} << 40})},
      {"i.i32", at::tensor({7, -7}, at::kInt)},
      {"b.u8", at::tensor({0, 255}, at::kByte)},
      {"b.bool", at::tensor({1, 0, 1}, at::kByte).to(at::kBool)},
      {"s.scalar", at::full({}, 42.0f)},
  };
  uint64_t bytes = 0;
  const std::string sha = write_safetensors(path, tensors, {{"format", "pt"}}, &bytes);
  uint64_t file_bytes = 0;
  REQUIRE(sha256_file(path, &file_bytes) == sha);
  REQUIRE(file_bytes == bytes);

  const NamedTensors back = read_safetensors(path);
  REQUIRE(back.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    INFO(tensors[i].first);
    REQUIRE(back[i].first == tensors[i].first);
    REQUIRE(back[i].second.scalar_type() == tensors[i].second.scalar_type());
    REQUIRE(back[i].second.sizes() == tensors[i].second.sizes());
    REQUIRE(at::equal(back[i].second, tensors[i].second));
  }
  const auto header = read_safetensors_header(path);
  REQUIRE(header.size() == tensors.size());
  REQUIRE(header[1].name == "a.bf16");
  REQUIRE(header[1].dtype == "BF16");
  REQUIRE(header[1].shape == std::vector<int64_t>{4});
  REQUIRE(header[0].shape == std::vector<int64_t>{2, 3});
  REQUIRE(header[8].shape.empty());
}

TEST_CASE("checkpoint: safetensors files have the Hugging Face byte layout, bf16 stored as its two bytes") {
  lf_test::ScratchDir dir;
  const std::string path = dir.path + "/bf16.safetensors";
  write_safetensors(path, {{"w", at::tensor({1.0f, -2.0f}).to(at::kBFloat16)}});
  const std::string raw = read_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);  // little-endian on the machines we run on
  REQUIRE(n % 8 == 0);
  REQUIRE(raw.size() == 8 + n + 4);
  const auto header = nlohmann::json::parse(raw.substr(8, n));
  REQUIRE(header.at("w").at("dtype") == "BF16");
  REQUIRE(header.at("w").at("data_offsets") == nlohmann::json::array({0, 4}));
  // bf16 1.0 = 0x3F80, -2.0 = 0xC000, each little-endian
  REQUIRE(raw.substr(8 + n) == std::string("\x80\x3F\x00\xC0", 4));
}

TEST_CASE("checkpoint: truncated or foreign safetensors files are refused with their path") {
  lf_test::ScratchDir dir;
  const std::string path = dir.path + "/t.safetensors";
  write_safetensors(path, {{"w", at::ones({256})}});
  resize_file(path, 100);
  REQUIRE_THROWS_WITH(read_safetensors(path), Contains(path + ": truncated while reading tensor 'w'"));
  resize_file(path, 20);
  REQUIRE_THROWS_WITH(read_safetensors(path), Contains(path + ": truncated safetensors header"));
  std::ofstream(dir.path + "/foreign.bin") << "not a safetensors file at all";
  REQUIRE_THROWS_WITH(read_safetensors(dir.path + "/foreign.bin"), Contains("not a safetensors file"));
  REQUIRE_THROWS_AS(read_safetensors(dir.path + "/absent"), CheckpointError);
  REQUIRE_THROWS_WITH(write_safetensors(dir.path + "/c.safetensors", {{"cplx", at::zeros({2}, at::kComplexFloat)}}),
                      Contains("tensor 'cplx' has a dtype safetensors cannot store"));
}
