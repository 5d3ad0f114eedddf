// Proves that a damaged checkpoint is never taken for a good one:
// validate_checkpoint names every file whose SHA-256 or size differs from the
// manifest, every missing file and a missing, corrupt (quoted only as a printable
// excerpt) or unreadable manifest;
// find_latest returns the newest checkpoint that validates and reports each
// newer one it skipped; compare_parameters lists name and shape differences.
#include <fstream>  // std::ofstream, std::fstream
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"
#include "snapshots.hpp"

using namespace loongforge;
using namespace loongforge::checkpoint;
using lf_catch::Contains;

namespace {

std::string write(const std::string& parent, int64_t step) {
  const WriteResult r = write_checkpoint_dir(parent, lf_test::make_snapshot(step));
  REQUIRE(r.error.empty());
  return r.path;
}

// Overwrites one byte in place (the size stays the same).
void flip_byte(const std::string& path, long offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x01));
}

}  // namespace

TEST_CASE("checkpoint: a freshly written checkpoint validates and its manifest lists every file") {
  lf_test::ScratchDir parent;
  const std::string dir = write(parent.path, 7);
  REQUIRE(dir == parent.path + "/epoch_0_step_7");
  const Report r = validate_checkpoint(dir);
  REQUIRE(r.problems.empty());
  REQUIRE(r.ok());
  REQUIRE(r.manifest.step == 7);
  REQUIRE(r.manifest.run_id == "test-run");
  REQUIRE(r.manifest.files.size() == 4);
  REQUIRE(r.manifest.files.at("scheduler.json").bytes == std::string("{\"lr\": 0.001}\n").size());
  REQUIRE(r.manifest.files.count("optimizer/rank_00000.safetensors") == 1);
  REQUIRE(lf_test::mark_of(dir) == 1.0f);
}

TEST_CASE("checkpoint: validate_checkpoint detects a changed byte, a truncated file and a missing file") {
  lf_test::ScratchDir parent;
  const std::string dir = write(parent.path, 1);

  flip_byte(dir + "/scheduler.json", 3);
  Report r = validate_checkpoint(dir);
  REQUIRE(r.problems.size() == 1);
  REQUIRE_THAT(r.problems[0], Contains(dir + "/scheduler.json: SHA-256 differs from the manifest"));

  resize_file(dir + "/model.safetensors", 40);
  remove_tree(dir + "/optimizer/rank_00000.safetensors");
  r = validate_checkpoint(dir);
  REQUIRE(r.problems.size() == 3);
  // The manifest's files are checked in name order.
  REQUIRE_THAT(r.problems[0], Contains(dir + "/model.safetensors: 40 bytes, the manifest says"));
  REQUIRE_THAT(r.problems[0], Contains("(truncated or replaced)"));
  REQUIRE(r.problems[1] == dir + "/optimizer/rank_00000.safetensors: missing");
  REQUIRE_THAT(r.problems[2], Contains(dir + "/scheduler.json: SHA-256 differs"));
}

TEST_CASE("checkpoint: validate_checkpoint refuses a directory whose manifest is missing, unreadable or incomplete") {
  lf_test::ScratchDir parent;
  const std::string dir = write(parent.path, 2);
  const std::string manifest = dir + "/MANIFEST.json";

  std::ofstream(manifest) << "{\"format\": \"loongforge-checkpoint\", truncated";
  Report r = validate_checkpoint(dir);
  REQUIRE(r.problems.size() == 1);
  REQUIRE(r.problems[0] == manifest + ": corrupt (not valid JSON: 45 bytes, the parse fails at byte 40; they begin "
                           "\"{\"format\": \"loongforge-checkpoint\", truncated\"); a checkpoint without a valid "
                           "manifest is never loaded: pick another checkpoint");

  std::ofstream(manifest) << nlohmann::json{{"format", "loongforge-checkpoint"}, {"format_version", "one"}}.dump();
  r = validate_checkpoint(dir);
  REQUIRE(r.problems.size() == 1);
  REQUIRE_THAT(r.problems[0], Contains(manifest + ": unreadable ("));

  nlohmann::json j = lf_test::make_snapshot(2).manifest.to_json();  // lists no files
  std::ofstream(manifest) << j.dump();
  r = validate_checkpoint(dir);
  REQUIRE(r.problems.size() == 3);
  REQUIRE(r.problems[0] == manifest + ": does not list model.safetensors");

  j["format_version"] = kNewestFormatVersion + 1;
  std::ofstream(manifest) << j.dump();
  REQUIRE_THAT(validate_checkpoint(dir).problems[0],
               Contains("format_version " + std::to_string(kNewestFormatVersion + 1) + " is not one this LoongForge reads"));

  remove_tree(manifest);
  r = validate_checkpoint(dir);
  REQUIRE(r.problems ==
          std::vector<std::string>{manifest + ": missing (an incomplete or foreign directory; never loaded)"});
}

TEST_CASE("checkpoint: find_latest skips damaged newer checkpoints and says why") {
  lf_test::ScratchDir parent;
  const std::string s10 = write(parent.path, 10);
  const std::string s20 = write(parent.path, 20);
  const std::string s30 = write(parent.path, 30);
  // Not checkpoints: ignored.
  make_dirs(parent.path + "/.epoch_0_step_40.tmp-1");
  make_dirs(parent.path + "/notes");
  make_dirs(parent.path + "/epoch_0_step_50x");
  REQUIRE(list_checkpoints(parent.path) == std::vector<std::string>{s30, s20, s10});

  std::vector<std::string> rejected;
  REQUIRE(find_latest(parent.path, &rejected) == s30);
  REQUIRE(rejected.empty());

  resize_file(s30 + "/trainer_state.json", 2);
  remove_tree(s20 + "/MANIFEST.json");
  REQUIRE(find_latest(parent.path, &rejected) == s10);
  REQUIRE(rejected.size() == 2);
  REQUIRE_THAT(rejected[0], Contains(s30 + ": " + s30 + "/trainer_state.json: 2 bytes"));
  REQUIRE_THAT(rejected[1], Contains(s20 + ": " + s20 + "/MANIFEST.json: missing"));

  flip_byte(s10 + "/model.safetensors", 100);
  rejected.clear();
  REQUIRE(find_latest(parent.path, &rejected).empty());
  REQUIRE(rejected.size() == 3);
  REQUIRE(find_latest(parent.path + "/absent").empty());
}

TEST_CASE("checkpoint: compare_parameters lists missing, extra and reshaped parameters") {
  lf_test::ScratchDir parent;
  const std::string dir = write(parent.path, 1);
  REQUIRE(compare_parameters(dir, {{"layer.weight", {4, 3}}, {"layer.bias", {3}}}).empty());
  const auto diffs = compare_parameters(dir, {{"layer.weight", {4, 5}}, {"head.weight", {2}}});
  REQUIRE(diffs == std::vector<std::string>{"parameter 'layer.weight': checkpoint [4, 3], model [4, 5]",
                                            "parameter 'head.weight' is in the model but not in the checkpoint",
                                            "parameter 'layer.bias' is in the checkpoint but not in the model"});
}

TEST_CASE("checkpoint: a manifest of binary bytes is reported as corrupt with a printable excerpt only") {
  lf_test::ScratchDir parent;
  const std::string dir = write(parent.path, 3);
  const std::string manifest = dir + "/MANIFEST.json";
  const char raw[] = "\x1b[2J\x00\xff\xfe{\"step\"";  // an escape sequence, NUL, invalid UTF-8
  std::string garbage(raw, sizeof raw - 1);
  garbage.resize(64, '\x07');  // then BEL bytes: 64 in all
  std::ofstream(manifest, std::ios::binary) << garbage;

  const Report r = validate_checkpoint(dir);
  REQUIRE(r.problems.size() == 1);
  std::string excerpt = "\\x1B[2J\\x00\\xFF\\xFE{\"step\"";  // the first 48 bytes: 14, then 34 BELs
  for (int i = 0; i < 34; ++i) excerpt += "\\x07";
  excerpt += "...";
  REQUIRE(r.problems[0] == manifest + ": corrupt (not valid JSON: 64 bytes, the parse fails at byte 1; they begin \"" +
                           excerpt + "\"); a checkpoint without a valid manifest is never loaded: pick another "
                           "checkpoint");
  for (const char c : r.problems[0]) REQUIRE((c >= 0x20 && c < 0x7F));  // nothing a terminal would act on
  REQUIRE_THROWS_AS(read_manifest(manifest), loongforge::CheckpointError);
}
