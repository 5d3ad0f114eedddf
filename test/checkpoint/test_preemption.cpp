// Proves preemption saves at the checkpoint room's level (Note [Preemption
// saves] in src/checkpoint/writer.cpp): a snapshot marked `preemption` is
// written with the ordinary writer's bytes but a CRC-32 per chunk instead of a
// SHA-256 (manifest format 3, "verified": false; the CRC-32s are zlib's, checked
// here against crc32 of each slice); it validates, and validate_checkpoint
// computes in the same pass the SHA-256s that an ordinary write of the same
// state lists; seal_checkpoint turns it into that ordinary checkpoint (format 2,
// identical file entries); a flipped byte is named by chunk as a CRC-32
// mismatch and nothing is sealed; and a preemption save prunes nothing, so the
// newest verified checkpoint stays beside it.
#include <zlib.h>  // crc32

#include <fstream>  // std::ifstream, std::fstream
#include <string>
#include <vector>

#include <ATen/ATen.h>  // at::arange

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "snapshots.hpp"

using namespace loongforge;
using namespace loongforge::checkpoint;
using lf_catch::Contains;

namespace {

constexpr uint64_t kChunk = 64 << 10;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// About 1.4 MB of tensors: 22 chunks of model.safetensors, chunk edges inside tensors.
Snapshot state(int64_t step, bool preemption) {
  Snapshot s = lf_test::make_snapshot(step);
  auto& model = s.tensor_files["model.safetensors"];
  for (int i = 0; i < 8; ++i) model.emplace_back("w" + std::to_string(i), at::arange(40009 + 31 * i, at::kFloat) / (i + 2));
  s.tensor_files["optimizer/rank_00000.safetensors"].emplace_back("m", at::arange(70001, at::kFloat) * 3);
  s.preemption = preemption;
  return s;
}

WriterOptions options() {
  WriterOptions o;
  o.threads = 4;
  o.chunk_bytes = kChunk;
  o.staging_bytes = 4 * kChunk;
  return o;
}

}  // namespace

TEST_CASE("checkpoint: a preemption save lists CRC-32s, validates, and seals into the ordinary checkpoint") {
  lf_test::ScratchDir fast, plain;
  const WriteResult p = write_checkpoint_dir(fast.path, state(5, true), options());
  const WriteResult q = write_checkpoint_dir(plain.path, state(5, false), options());
  REQUIRE(p.error.empty());
  REQUIRE(q.error.empty());
  REQUIRE(p.preemption);

  const Manifest written = read_manifest(p.path + "/" + kManifest);
  REQUIRE(written.format_version == kUnverifiedFormatVersion);
  REQUIRE_FALSE(written.verified);
  const Manifest ordinary = read_manifest(q.path + "/" + kManifest);
  for (const char* rel : {"model.safetensors", "optimizer/rank_00000.safetensors"}) {
    INFO(rel);
    const std::string bytes = read_bytes(p.path + "/" + rel);
    REQUIRE(bytes == read_bytes(q.path + "/" + rel));  // the same bytes as an ordinary write
    const FileEntry& e = written.files.at(rel);
    REQUIRE(e.unverified());
    REQUIRE(e.chunk_sha256.empty());
    REQUIRE(e.chunk_crc32.size() == (bytes.size() + kChunk - 1) / kChunk);
    for (size_t i = 0; i < e.chunk_crc32.size(); ++i) {
      const size_t off = i * kChunk, n = std::min<size_t>(kChunk, bytes.size() - off);
      REQUIRE(e.chunk_crc32[i] ==
              static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(bytes.data() + off), static_cast<uInt>(n))));
    }
  }
  REQUIRE(written.files.at("model.safetensors").chunk_crc32.size() >= 20);
  REQUIRE(written.files.at("trainer_state.json").sha256 == ordinary.files.at("trainer_state.json").sha256);

  const Report report = validate_checkpoint(p.path, /*threads=*/3);
  REQUIRE(report.ok());
  REQUIRE(report.sealed.size() == 2);
  for (const auto& [rel, e] : report.sealed) REQUIRE(e.chunk_sha256 == ordinary.files.at(rel).chunk_sha256);

  seal_checkpoint(report);
  const Manifest sealed = read_manifest(p.path + "/" + kManifest);
  REQUIRE(sealed.format_version == kFormatVersion);
  REQUIRE(sealed.verified);
  REQUIRE(sealed.files.size() == ordinary.files.size());
  for (const auto& [rel, e] : ordinary.files) REQUIRE(sealed.files.at(rel).to_json() == e.to_json());
  const Report again = validate_checkpoint(p.path);
  REQUIRE(again.ok());
  REQUIRE(again.sealed.empty());
  REQUIRE_THROWS_WITH(seal_checkpoint(again), Contains("not an unverified preemption save"));
}

TEST_CASE("checkpoint: a damaged preemption save is named by chunk and never sealed") {
  lf_test::ScratchDir parent;
  const WriteResult p = write_checkpoint_dir(parent.path, state(9, true), options());
  REQUIRE(p.error.empty());
  {
    std::fstream f(p.path + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(7 * kChunk + 100));
    char c = 0;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(7 * kChunk + 100));
    c = static_cast<char>(c ^ 0x10);
    f.write(&c, 1);
  }
  const Report report = validate_checkpoint(p.path);
  REQUIRE_FALSE(report.ok());
  REQUIRE(report.problems.size() == 1);
  REQUIRE_THAT(report.problems[0], Contains("model.safetensors: CRC-32 differs from the manifest in chunk 7 of"));
  REQUIRE_THAT(report.problems[0], Contains("an unverified preemption save"));
  REQUIRE(report.sealed.empty());
  REQUIRE_THROWS_WITH(seal_checkpoint(report), Contains("does not validate"));
  REQUIRE(find_latest(parent.path).empty());
}

TEST_CASE("checkpoint: a preemption save prunes nothing; the next ordinary write prunes to keep_last") {
  lf_test::ScratchDir parent;
  Writer w(parent.path, /*keep_last=*/1, /*async=*/false, /*leader=*/true, options());
  w.submit(state(10, false));
  w.submit(state(12, true));
  REQUIRE(list_checkpoints(parent.path).size() == 2);  // step 10, the newest verified one, stays
  REQUIRE(find_latest(parent.path) == parent.path + "/epoch_0_step_12");
  w.submit(state(14, false));
  REQUIRE(list_checkpoints(parent.path) == std::vector<std::string>{parent.path + "/epoch_0_step_14"});
  for (const auto& r : w.take_results()) REQUIRE(r.error.empty());
}

TEST_CASE("checkpoint: a manifest of format 3 that lists a malformed CRC-32 is unreadable, not valid") {
  lf_test::ScratchDir parent;
  const WriteResult p = write_checkpoint_dir(parent.path, state(3, true), options());
  REQUIRE(p.error.empty());
  const std::string path = p.path + "/" + kManifest;
  nlohmann::json j = nlohmann::json::parse(read_bytes(path));
  j["files"]["model.safetensors"]["chunk_crc32"][0] = "xyz";
  std::ofstream(path) << j.dump();
  const Report report = validate_checkpoint(p.path);
  REQUIRE_FALSE(report.ok());
  REQUIRE_THAT(report.problems[0], Contains("unreadable"));
  REQUIRE_THAT(report.problems[0], Contains("is not 8 hex digits"));
}
