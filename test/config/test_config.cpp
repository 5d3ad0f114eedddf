// Proves the config room: every key comes from one schema; YAML and --set
// overrides load into typed fields; and every bad config is rejected with a
// message naming the file and line (or --set), the key path and what is
// allowed — including unknown keys (did-you-mean), cross-key rules, keys of
// engines that are not in the build, and model/data paths that do not exist.
// The global batch derives the accumulation when only it is set.
#include <unistd.h>  // getpid

#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <set>         // std::set
#include <string>

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/config/config.hpp"

using namespace loongforge;
using namespace loongforge::config;
using lf_catch::Contains;

namespace {

namespace fs = std::filesystem;

// A real model file (<dir>/m.pt) and dataset directory (<dir>/d), removed at exit.
struct FakeInputs {
  fs::path dir = fs::temp_directory_path() / ("loongforge-test-config-" + std::to_string(::getpid()));
  std::string model = (dir / "m.pt").string();
  std::string data = (dir / "d").string();
  FakeInputs() {
    fs::create_directories(data);
    std::ofstream(model) << "not a model; only its existence is checked";
  }
  ~FakeInputs() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

const FakeInputs& inputs() {
  static const FakeInputs in;
  return in;
}

// Four lines setting model.path and data.path to existing paths.
std::string paths_yaml() { return "model:\n  path: " + inputs().model + "\ndata:\n  path: " + inputs().data + "\n"; }

// The error message of loading `yaml` (with paths set), or "" if it loads.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {},
                     ValidationContext ctx = {}) {
  try {
    parse_config_text(paths_yaml() + yaml, "bad.yaml", overrides, ctx);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

ValidationContext with_engines(std::set<std::string> engines) {
  ValidationContext ctx;
  ctx.built_engines = std::move(engines);
  return ctx;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The lines of `text` from the line `header` to the next blank line, or "" when
// `header` is not a line of `text`.
std::string block_of(const std::string& text, const std::string& header) {
  const auto at = text.find("\n" + header + "\n");
  if (at == std::string::npos) return "";
  const auto end = text.find("\n\n", at + 1);
  return text.substr(at, end == std::string::npos ? std::string::npos : end - at) + "\n";
}

}  // namespace

// ---------------------------------------------------------------------------
// Good configs

TEST_CASE("config: defaults come from the schema and validate") {
  ValidationContext ctx;
  ctx.require_paths = false;
  const Config cfg = default_config({}, ctx);
  REQUIRE(cfg.trainer.micro_batch_size == 8);
  REQUIRE(cfg.gcts.comm_strategy == "hybrid");
  REQUIRE(cfg.dmf.text_buckets == 4);
  REQUIRE(schema().size() >= 50);
  for (const auto& k : schema()) REQUIRE(value_text(cfg, k.path) == k.default_text);
}

TEST_CASE("config: yaml values and --set overrides land in typed fields, overrides last") {
  const Config cfg = parse_config_text(paths_yaml() +
                                           "trainer:\n  micro_batch_size: 4\n  grad_clip_norm: 0.5\n"
                                           "gcts:\n  comm_strategy: simple\ndmf:\n  enable: false\n",
                                       "good.yaml", {"trainer.micro_batch_size=16", "optimizer.lr=3e-4"},
                                       with_engines({"gcts", "dmf"}));
  REQUIRE(cfg.trainer.micro_batch_size == 16);
  REQUIRE(cfg.trainer.grad_clip_norm == 0.5);
  REQUIRE(cfg.gcts.comm_strategy == "simple");
  REQUIRE_FALSE(cfg.dmf.enable);
  REQUIRE(cfg.optimizer.lr == 3e-4);
  REQUIRE(cfg.origin.at("trainer.micro_batch_size") == "--set");
  REQUIRE(cfg.origin.at("trainer.grad_clip_norm") == "good.yaml:7");
}

TEST_CASE("config: print-config output loads back to the same values") {
  const Config a = parse_config_text(paths_yaml() + "run:\n  name: \"a: b # c\"\ntrainer:\n  max_steps: 7\n",
                                     "a.yaml");
  const std::string printed = print_config(a);
  REQUIRE_THAT(printed, Contains("# Samples per micro-batch per rank; auto = the largest micro-batch"));
  const Config b = parse_config_text(printed, "printed.yaml");
  for (const auto& k : schema()) REQUIRE(value_text(a, k.path) == value_text(b, k.path));
}

TEST_CASE("config: the documented configs in configs/ load and validate") {
  for (const char* name : {"n16.yaml", "n16-tiny.yaml"}) {
    ValidationContext ctx;
    ctx.require_paths = false;
    const Config cfg = load_config(std::string(LOONGFORGE_SOURCE_DIR) + "/configs/" + name, {}, ctx);
    REQUIRE(cfg.trainer.max_steps > 0);
  }
}

TEST_CASE("config: configs/n16.yaml documents every key of the schema in its own section") {
  // Sections of engines not in this build are commented out ("# gcts:",
  // "#   enable: false"); the others are live, where a key may be a comment
  // ("  # gradient_accumulation_steps: 1") to leave it unset.
  const std::string text = read_file(std::string(LOONGFORGE_SOURCE_DIR) + "/configs/n16.yaml");
  const ValidationContext built_now;
  for (const auto& s : sections()) {
    const bool commented = !s.engine.empty() && !built_now.built_engines.count(s.name);
    const std::string block = block_of(text, commented ? "# " + s.name + ":" : s.name + ":");
    INFO("section " << s.name);
    REQUIRE_FALSE(block.empty());
    if (commented) REQUIRE(block_of(text, s.name + ":").empty());
    for (const auto& k : schema()) {
      if (k.section != s.name) continue;
      INFO("key " << k.path);
      if (commented)
        REQUIRE_THAT(block, Contains("\n#   " + k.name + ":"));
      else
        REQUIRE((block.find("\n  " + k.name + ":") != std::string::npos ||
                 block.find("\n  # " + k.name + ":") != std::string::npos));
    }
  }
}

TEST_CASE("config: the engine sections commented out in configs/n16.yaml hold the defaults") {
  const std::string text = read_file(std::string(LOONGFORGE_SOURCE_DIR) + "/configs/n16.yaml");
  std::string engines_yaml;
  std::set<std::string> all;
  for (const auto& s : sections()) {
    if (s.engine.empty()) continue;
    all.insert(s.name);
    std::string block = block_of(text, "# " + s.name + ":");
    for (size_t at = 0; (at = block.find("\n#", at)) != std::string::npos;) block.erase(at + 1, 2);
    engines_yaml += block;
  }
  ValidationContext ctx = with_engines(all);
  ctx.require_paths = false;
  const Config cfg = parse_config_text(engines_yaml, "n16-engines.yaml", {}, ctx);
  size_t engine_keys = 0;
  for (const auto& k : schema()) {
    if (!all.count(k.section)) continue;
    ++engine_keys;
    INFO("key " << k.path);
    REQUIRE(cfg.origin.count(k.path) == 1);
    REQUIRE(value_text(cfg, k.path) == k.default_text);
  }
  REQUIRE(engine_keys == 24);  // gcts 10, mla 6, adfe 5, dmf 3
}

// ---------------------------------------------------------------------------
// Bad configs: each message names where, which key, and what is allowed.

TEST_CASE("config: an unknown key is rejected with its line and a did-you-mean") {
  const auto e = error_of("trainer:\n  micro_batch: 4\n");
  REQUIRE_THAT(e, Contains("bad.yaml:6: unknown key 'trainer.micro_batch' (did you mean 'trainer.micro_batch_size'?)"));
}

TEST_CASE("config: a key placed in the wrong section points to the right one") {
  const auto e = error_of("trainer:\n  comm_strategy: simple\n");
  REQUIRE_THAT(e, Contains("bad.yaml:6: unknown key 'trainer.comm_strategy' (did you mean 'gcts.comm_strategy'?)"));
}

TEST_CASE("config: an unknown section is rejected with a did-you-mean") {
  REQUIRE_THAT(error_of("trainr:\n  max_steps: 3\n"),
               Contains("bad.yaml:5: unknown section 'trainr' (did you mean 'trainer'?)"));
}

TEST_CASE("config: a far-off unknown section lists the valid sections") {
  REQUIRE_THAT(error_of("zzzzzzzz:\n  a: 1\n"), Contains("unknown section 'zzzzzzzz'; sections are: run, model, data"));
}

TEST_CASE("config: a far-off unknown key lists the section's keys") {
  REQUIRE_THAT(error_of("mla:\n  qqqqqqqqqq: 1\n"),
               Contains("unknown key 'mla.qqqqqqqqqq'; keys of section 'mla': enable, persistent_gb, global_pool_gb, "
                        "segment_mb, virtual_memory, fallback_cudamalloc"));
}

TEST_CASE("config: a word where an integer belongs is a type error with the range") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: eight\n"),
               Contains("bad.yaml:6: trainer.max_steps: expected an integer in [1, inf], got 'eight'"));
}

TEST_CASE("config: a fraction where an integer belongs is a type error") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: 1.5\n"),
               Contains("trainer.max_steps: expected an integer in [1, inf], got '1.5'"));
}

TEST_CASE("config: a quoted number is a string, not an integer") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: \"8\"\n"),
               Contains("trainer.micro_batch_size: expected an integer in [1, 65536], or auto, got '8'"));
}

TEST_CASE("config: zero micro-batch size is out of range") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: 0\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size: 0 is out of range: allowed an integer in [1, 65536]"));
}

TEST_CASE("config: a negative learning rate is out of range") {
  REQUIRE_THAT(error_of("optimizer:\n  lr: -0.1\n"),
               Contains("optimizer.lr: -0.1 is out of range: allowed a number in [0.0, 10.0]"));
}

TEST_CASE("config: a non-finite number is rejected") {
  REQUIRE_THAT(error_of("optimizer:\n  lr: nan\n"), Contains("optimizer.lr: expected a number in [0.0, 10.0], got 'nan'"));
}

TEST_CASE("config: an unknown strategy lists the allowed ones") {
  REQUIRE_THAT(error_of("gcts:\n  comm_strategy: ring\n"),
               Contains("bad.yaml:6: gcts.comm_strategy: 'ring' is not allowed: use one of: simple, hybrid"));
}

TEST_CASE("config: yes is not a boolean here") {
  REQUIRE_THAT(error_of("dmf:\n  enable: yes\n"), Contains("bad.yaml:6: dmf.enable: expected true or false, got 'yes'"));
}

TEST_CASE("config: a list where a scalar belongs is rejected") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: [1, 2]\n"),
               Contains("bad.yaml:6: trainer.max_steps: expected an integer in [1, inf], got a list"));
}

TEST_CASE("config: a key without a value says what to write") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps:\n"),
               Contains("bad.yaml:6: trainer.max_steps: has no value: write an integer in [1, inf]"));
}

TEST_CASE("config: a section that is not a mapping is rejected") {
  REQUIRE_THAT(error_of("trainer: 5\n"), Contains("bad.yaml:5: section 'trainer' must be a mapping of keys, got a scalar"));
}

TEST_CASE("config: a duplicate key names both lines") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: 5\n  max_steps: 6\n"),
               Contains("bad.yaml:7: duplicate key 'trainer.max_steps' (first set at line 6)"));
}

TEST_CASE("config: a top level that is not a mapping is rejected") {
  try {
    parse_config_text("- a\n- b\n", "list.yaml");
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Contains("list.yaml:1: the top level must be a mapping of sections (run, model"));
  }
}

TEST_CASE("config: a YAML syntax error names line and column") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: [1,\n"), Contains("bad.yaml:7:1: YAML syntax error"));
}

TEST_CASE("config: a global batch and an accumulation both set must agree, and the message shows the derivable one") {
  ValidationContext ctx;
  ctx.world_size = 2;
  const auto e = error_of("trainer:\n  micro_batch_size: 8\n  gradient_accumulation_steps: 2\n  global_batch_size: 64\n",
                          {}, ctx);
  REQUIRE_THAT(e, Contains("bad.yaml:8: trainer.global_batch_size (64) must equal micro_batch_size (8) x "
                           "gradient_accumulation_steps (2) x world size (2) = 32: set it to 32 or 0 (derived), "
                           "or remove trainer.gradient_accumulation_steps (set at bad.yaml:7) to derive it as "
                           "64 / (8 x 2) = 4"));
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: 8\n  global_batch_size: 40\n", {"trainer.gradient_accumulation_steps=2"}, ctx),
               Contains("bad.yaml:7: trainer.global_batch_size (40) must equal micro_batch_size (8) x "
                        "gradient_accumulation_steps (2) x world size (2) = 32: set it to 32 or 0 (derived)\n"));
  const Config agree = parse_config_text(paths_yaml() + "trainer:\n  gradient_accumulation_steps: 2\n  global_batch_size: 32\n",
                                         "ok.yaml", {}, ctx);
  REQUIRE(agree.trainer.gradient_accumulation_steps == 2);
  REQUIRE(agree.origin.at("trainer.gradient_accumulation_steps") == "ok.yaml:6");
}

TEST_CASE("config: a global batch alone derives the accumulation from the world size, keeping the global batch") {
  const std::string yaml = paths_yaml() + "trainer:\n  micro_batch_size: 8\n  global_batch_size: 64\n";
  for (const auto& [world, accumulation] : std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {2, 4}, {4, 2}, {8, 1}}) {
    ValidationContext ctx;
    ctx.world_size = world;
    const Config cfg = parse_config_text(yaml, "g.yaml", {}, ctx);
    INFO("world size " << world);
    REQUIRE(cfg.trainer.gradient_accumulation_steps == accumulation);
    REQUIRE(cfg.origin.at("trainer.gradient_accumulation_steps") == "derived from trainer.global_batch_size");
    REQUIRE(global_batch_size(cfg, world) == 64);
  }
  ValidationContext two;
  two.world_size = 2;
  const Config cfg = parse_config_text(yaml, "g.yaml", {}, two);
  REQUIRE_THAT(print_config(cfg), Contains("Value derived from trainer.global_batch_size\n  gradient_accumulation_steps: 4\n"));
  REQUIRE(parse_config_text(print_config(cfg), "printed.yaml", {}, two).trainer.gradient_accumulation_steps == 4);
}

TEST_CASE("config: a global batch that micro-batch x world does not divide names the numbers and the nearest fits") {
  ValidationContext ctx;
  ctx.world_size = 2;
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: 8\n  global_batch_size: 100\n", {}, ctx),
               Contains("bad.yaml:7: trainer.global_batch_size (100) is not a multiple of micro_batch_size (8) x "
                        "world size (2) = 16, so gradient_accumulation_steps cannot be derived from it: set "
                        "global_batch_size to 96 or 112, or a micro_batch_size that divides it"));
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: 8\n", {"trainer.global_batch_size=8"}, ctx),
               Contains("--set: trainer.global_batch_size (8) is not a multiple of micro_batch_size (8) x world size "
                        "(2) = 16, so gradient_accumulation_steps cannot be derived from it: set global_batch_size "
                        "to 16, or a micro_batch_size that divides it"));
}

TEST_CASE("config: a derived accumulation above its range is rejected") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: 1\n  global_batch_size: 65537\n"),
               Contains("bad.yaml:7: trainer.global_batch_size (65537) / (micro_batch_size (1) x world size (1)) = "
                        "65537 micro-batches per step, above the limit of 65536: raise micro_batch_size"));
}

// ---- trainer.micro_batch_size: auto (Note [Micro-batch auto] in src/config/validate.cpp)

TEST_CASE("config: micro_batch_size auto with a global batch loads unresolved, the accumulation left to derive") {
  ValidationContext two;
  two.world_size = 2;
  const Config cfg =
      parse_config_text(paths_yaml() + "trainer:\n  micro_batch_size: auto\n  global_batch_size: 384\n", "a.yaml", {}, two);
  REQUIRE(cfg.trainer.micro_batch_size_auto);
  REQUIRE(cfg.trainer.micro_batch_size == 0);  // never a valid micro-batch: nothing may size by it yet
  REQUIRE(cfg.trainer.gradient_accumulation_steps == 1);
  REQUIRE(cfg.origin.count("trainer.gradient_accumulation_steps") == 0);  // still unset
  REQUIRE(value_text(cfg, "trainer.micro_batch_size") == "auto");
  // --print-config writes auto, which loads again; the key's allowed values name it.
  const std::string printed = print_config(cfg);
  REQUIRE_THAT(printed, Contains("Allowed: an integer in [1, 65536], or auto. Default: 8. Set by a.yaml:6\n"
                                 "  micro_batch_size: auto\n"));
  // The accumulation is written as a comment while it waits for the choice, so the output loads again.
  REQUIRE_THAT(printed, Contains("\n  # gradient_accumulation_steps: derived from trainer.global_batch_size when "
                                 "trainer.micro_batch_size auto is resolved\n"));
  REQUIRE(parse_config_text(printed, "printed.yaml", {}, two).trainer.micro_batch_size_auto);
  // --set takes it too, and a number set after it wins.
  ValidationContext no_paths;
  no_paths.require_paths = false;
  REQUIRE(default_config({"trainer.global_batch_size=64", "trainer.micro_batch_size=auto"}, no_paths)
              .trainer.micro_batch_size_auto);
  const Config number = default_config(
      {"trainer.global_batch_size=64", "trainer.micro_batch_size=auto", "trainer.micro_batch_size=16"}, no_paths);
  REQUIRE(!number.trainer.micro_batch_size_auto);
  REQUIRE(number.trainer.micro_batch_size == 16);
  REQUIRE(number.trainer.gradient_accumulation_steps == 4);
}

TEST_CASE("config: micro_batch_size auto resolved derives the accumulation and prints as the chosen number") {
  ValidationContext two;
  two.world_size = 2;
  Config cfg =
      parse_config_text(paths_yaml() + "trainer:\n  micro_batch_size: auto\n  global_batch_size: 384\n", "a.yaml", {}, two);
  resolve_auto_micro_batch(&cfg, 48, 2);
  REQUIRE(cfg.trainer.micro_batch_size == 48);
  REQUIRE(cfg.trainer.micro_batch_size_auto);  // what the key said is kept beside the choice
  REQUIRE(cfg.trainer.gradient_accumulation_steps == 4);
  REQUIRE(global_batch_size(cfg, 2) == 384);
  REQUIRE(cfg.origin.at("trainer.micro_batch_size") == "chosen for auto, set at a.yaml:6");
  REQUIRE(value_text(cfg, "trainer.micro_batch_size") == "48");
  // The run directory's config.yaml: the choice, loadable as a fixed micro-batch of the same global batch.
  const std::string printed = print_config(cfg);
  REQUIRE_THAT(printed, Contains("Value chosen for auto, set at a.yaml:6\n  micro_batch_size: 48\n"));
  const Config again = parse_config_text(printed, "printed.yaml", {}, two);
  REQUIRE(again.trainer.micro_batch_size == 48);
  REQUIRE(again.trainer.gradient_accumulation_steps == 4);
  // A choice that does not divide the global batch is a bug, refused by name.
  Config other =
      parse_config_text(paths_yaml() + "trainer:\n  micro_batch_size: auto\n  global_batch_size: 384\n", "a.yaml", {}, two);
  REQUIRE_THROWS_WITH(resolve_auto_micro_batch(&other, 7, 2), Contains("trainer.micro_batch_size auto: 7 x 2 rank(s)"));
}

TEST_CASE("config: micro_batch_size auto without a global batch is refused, naming both keys and the fix") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: auto\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size is auto, which keeps trainer.global_batch_size (samples "
                        "per optimizer step over all ranks) while it chooses the micro-batch, but global_batch_size is "
                        "0 (default): set trainer.global_batch_size to the global batch to keep, or set "
                        "micro_batch_size to a number"));
}

TEST_CASE("config: micro_batch_size auto with an explicit accumulation is refused, naming where it was set") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: auto\n  global_batch_size: 64\n  gradient_accumulation_steps: 2\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size is auto, which derives "
                        "trainer.gradient_accumulation_steps from its choice (global_batch_size / (micro_batch_size x "
                        "world size)), but the accumulation is set at bad.yaml:8 (2): remove "
                        "trainer.gradient_accumulation_steps, or set micro_batch_size to a number"));
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: auto\n  global_batch_size: 64\n",
                        {"trainer.gradient_accumulation_steps=1"}),
               Contains("but the accumulation is set at --set (1)"));
}

TEST_CASE("config: micro_batch_size auto with a global batch the world size does not divide is refused") {
  ValidationContext three;
  three.world_size = 3;
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: auto\n  global_batch_size: 64\n", {}, three),
               Contains("bad.yaml:6: trainer.micro_batch_size is auto: trainer.global_batch_size (64) must be a "
                        "multiple of the world size (3) for every rank to take an equal share"));
}

TEST_CASE("config: micro_batch_size takes only a positive integer or the word auto") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: Auto\n  global_batch_size: 64\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size: expected an integer in [1, 65536], or auto, got 'Auto'"));
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: max\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size: expected an integer in [1, 65536], or auto, got 'max'"));
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: -4\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size: -4 is out of range: allowed an integer in [1, 65536], "
                        "or auto"));
  REQUIRE_THAT(error_of("", {"trainer.micro_batch_size=autos"}),
               Contains("--set: trainer.micro_batch_size: expected an integer in [1, 65536], or auto, got 'autos'"));
  // Quoted, auto is still the word (a quoted number is still not a number: above).
  REQUIRE(error_of("trainer:\n  micro_batch_size: \"auto\"\n  global_batch_size: 64\n").empty());
}

TEST_CASE("config: only micro_batch_size takes auto among the integer keys") {
  for (const auto& k : schema())
    if (k.kind == KeyKind::IntAuto) REQUIRE(k.path == "trainer.micro_batch_size");
  REQUIRE_THAT(error_of("trainer:\n  max_steps: auto\n"),
               Contains("trainer.max_steps: expected an integer in [1, inf], got 'auto'"));
}

TEST_CASE("config: a zero checkpoint interval is rejected") {
  REQUIRE_THAT(error_of("checkpoint:\n  interval_steps: 0\n"),
               Contains("checkpoint.interval_steps: 0 is out of range: allowed an integer in [1, inf]"));
}

TEST_CASE("config: checkpoint staging smaller than one chunk is rejected, naming both keys and the fixes") {
  REQUIRE_THAT(error_of("checkpoint:\n  chunk_mb: 64\n  staging_mb: 32\n"),
               Contains("checkpoint.staging_mb (32) is smaller than one chunk, checkpoint.chunk_mb (64): staging holds "
                        "whole chunks; raise staging_mb, lower chunk_mb, or set staging_mb to 0"));
  REQUIRE(error_of("checkpoint:\n  chunk_mb: 64\n  staging_mb: 64\n") == "");
  REQUIRE(error_of("checkpoint:\n  chunk_mb: 64\n  staging_mb: 0\n") == "");  // 0: as large as the state
}

TEST_CASE("config: a heartbeat timeout not above the heartbeat interval is rejected, naming both keys") {
  REQUIRE_THAT(error_of("fault:\n  heartbeat_s: 2.0\n  heartbeat_timeout_s: 2.0\n"),
               Contains("fault.heartbeat_timeout_s (2.0) must exceed fault.heartbeat_s (2.0): a live rank would be "
                        "taken for lost between two heartbeats"));
  REQUIRE(error_of("fault:\n  heartbeat_s: 2.0\n  heartbeat_timeout_s: 2.5\n") == "");
}

TEST_CASE("config: a memory pool as large as the GPU is rejected when the GPU size is known") {
  ValidationContext ctx = with_engines({"mla"});
  ctx.device_memory_gb = 139.8;
  REQUIRE_THAT(error_of("mla:\n  enable: true\n  global_pool_gb: 200\n", {}, ctx),
               Contains("bad.yaml:7: mla.global_pool_gb (200.0) must be below the device memory (139.8 GB)"));
  // unknown device memory: not checked
  REQUIRE(error_of("mla:\n  enable: true\n  global_pool_gb: 200\n", {}, with_engines({"mla"})) == "");
  // The persistent arena and the activation arena together must leave room too.
  REQUIRE_THAT(error_of("mla:\n  enable: true\n  persistent_gb: 100\n  global_pool_gb: 50\n", {}, ctx),
               Contains("mla.persistent_gb (100.0) plus mla.global_pool_gb (50.0) must be below the device memory "
                        "(139.8 GB)"));
  REQUIRE(error_of("mla:\n  enable: true\n  persistent_gb: 80\n  global_pool_gb: 50\n", {}, ctx) == "");
}

TEST_CASE("config: warmup longer than the run is rejected") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: 10\nschedule:\n  warmup_steps: 10\n"),
               Contains("schedule.warmup_steps (10) must be below trainer.max_steps (10)"));
}

TEST_CASE("config: a missing model path says how to make one") {
  try {
    parse_config_text("data:\n  path: " + inputs().data + "\n", "nomodel.yaml");
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Contains("invalid configuration:\n  default: model.path is required: set it to a file "
                                    "written by `python3 scripts/model/export.py --config n16-tiny --out <path>`\n"));
  }
}

TEST_CASE("config: a model file that does not exist names the line, the key, the path and the export command") {
  try {
    parse_config_text("model:\n  path: /nonexistent/m.pt\ndata:\n  path: " + inputs().data + "\n", "run.yaml");
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Contains("invalid configuration:\n  run.yaml:2: model.path: '/nonexistent/m.pt' does not "
                                    "exist: write it with `python3 scripts/model/export.py --config n16-tiny --out "
                                    "/nonexistent/m.pt` (or correct the path)\n"));
  }
}

TEST_CASE("config: a dataset set by --set that does not exist names --set, the key, the path and the converter") {
  REQUIRE_THAT(error_of("", {"data.path=/nonexistent/d.lf"}),
               Contains("invalid configuration:\n  --set: data.path: '/nonexistent/d.lf' does not exist: write it with "
                        "`python3 scripts/convert_lerobot.py <lerobot dataset> /nonexistent/d.lf` (or correct the "
                        "path)\n"));
}

TEST_CASE("config: a directory as model.path and a file as data.path are rejected") {
  const auto e = error_of("", {"model.path=" + inputs().data, "data.path=" + inputs().model});
  REQUIRE_THAT(e, Contains("2 problems in the configuration:\n"));
  REQUIRE_THAT(e, Contains("  --set: model.path: '" + inputs().data + "' is not a file: write it with `python3 "
                           "scripts/model/export.py --config n16-tiny --out " + inputs().data + "`\n"));
  REQUIRE_THAT(e, Contains("  --set: data.path: '" + inputs().model + "' is not a directory: write it with `python3 "
                           "scripts/convert_lerobot.py <lerobot dataset> " + inputs().model + "`\n"));
}

TEST_CASE("config: paths are not checked when require_paths is off (--print-config)") {
  ValidationContext ctx;
  ctx.require_paths = false;
  const Config cfg = parse_config_text("model:\n  path: /nonexistent/m.pt\n", "p.yaml", {}, ctx);
  REQUIRE(cfg.model.path == "/nonexistent/m.pt");
}

// ---------------------------------------------------------------------------
// Engines not in this build, and removed keys

TEST_CASE("config: GCTS, MLA and DMF default to off, ADFE to auto (on for CUDA runs), and none is built unless the "
          "binary says so") {
  ValidationContext ctx;
  ctx.require_paths = false;
  REQUIRE(ctx.built_engines.empty());
  const Config cfg = default_config({}, ctx);
  REQUIRE_FALSE(cfg.gcts.enable);
  REQUIRE_FALSE(cfg.mla.enable);
  REQUIRE(cfg.adfe.enable == "auto");
  REQUIRE(cfg.adfe.decode_threads == 0);  // the process's CPUs less two, when ADFE runs
  REQUIRE_FALSE(cfg.dmf.enable);
  std::vector<std::string> engines;
  for (const auto& s : sections())
    if (!s.engine.empty()) engines.push_back(s.name + "=" + s.engine);
  REQUIRE(engines == std::vector<std::string>{"gcts=GCTS", "mla=MLA", "adfe=ADFE", "dmf=DMF"});
}

TEST_CASE("config: an engine key set in YAML for an engine not in this build names the line, the key and the fix") {
  REQUIRE_THAT(error_of("gcts:\n  enable: true\n"),
               Contains("invalid configuration:\n  bad.yaml:6: gcts.enable: the GCTS engine is not in this build "
                        "yet; remove the key (its default, false, is what this binary does)\n"));
}

TEST_CASE("config: an engine key set by --set for an engine not in this build names --set") {
  REQUIRE_THAT(error_of("", {"adfe.decode_threads=8"}),
               Contains("invalid configuration:\n  --set: adfe.decode_threads: the ADFE engine is not in this build "
                        "yet; remove the key (its default, 0, is what this binary does)\n"));
}

TEST_CASE("config: the old n16.yaml with all four engines enabled is rejected, one line per engine") {
  const auto e = error_of("gcts:\n  enable: true\nmla:\n  enable: true\nadfe:\n  enable: true\n"
                          "dmf:\n  enable: true\n  text_buckets: 2\n");
  REQUIRE_THAT(e, Contains("5 problems in the configuration:\n"
                           "  bad.yaml:6: gcts.enable: the GCTS engine is not in this build yet; remove the key"));
  REQUIRE_THAT(e, Contains("  bad.yaml:8: mla.enable: the MLA engine is not in this build yet; remove the key"));
  REQUIRE_THAT(e, Contains("  bad.yaml:10: adfe.enable: the ADFE engine is not in this build yet; remove the key"));
  REQUIRE_THAT(e, Contains("  bad.yaml:12: dmf.enable: the DMF engine is not in this build yet; remove the key"));
  REQUIRE_THAT(e, Contains("  bad.yaml:13: dmf.text_buckets: the DMF engine is not in this build yet; remove "
                           "the key (its default, 4, is what this binary does)\n"));
}

TEST_CASE("config: an engine's keys load when the binary reports the engine as built") {
  const Config cfg = parse_config_text(paths_yaml() + "gcts:\n  enable: true\n  bucket_mb: 50\n", "g.yaml", {},
                                       with_engines({"gcts"}));
  REQUIRE(cfg.gcts.enable);
  REQUIRE(cfg.gcts.bucket_mb == 50.0);
  REQUIRE_THAT(error_of("gcts:\n  enable: true\nmla:\n  enable: true\n", {}, with_engines({"gcts"})),
               Contains("invalid configuration:\n  bad.yaml:8: mla.enable: the MLA engine is not in this build yet"));
}

TEST_CASE("config: an unbuilt engine's key written with its default value is accepted, as print-config writes it") {
  REQUIRE(error_of("mla:\n  enable: false\n  global_pool_gb: 0.0\nadfe:\n  decode_threads: 0\n") == "");
}

TEST_CASE("config: an unknown engine reported as built is named") {
  REQUIRE_THAT(error_of("", {}, with_engines({"gcts", "gctz"})),
               Contains("invalid configuration:\n  this binary reports an unknown engine 'gctz' as built (engines: "
                        "gcts, mla, adfe, dmf): fix the trainer's engine registry\n"));
}

TEST_CASE("config: print-config marks the sections of engines not in this build, and its output loads again") {
  ValidationContext ctx = with_engines({"mla"});
  ctx.require_paths = false;
  const Config cfg = default_config({"mla.enable=true"}, ctx);
  const std::string printed = print_config(cfg);
  REQUIRE_THAT(printed, Contains("\n# GCTS: gradient communication scheduling\n# Not in this build: the GCTS engine is "
                                 "not in this binary yet; these keys keep\n# their defaults and do nothing (any "
                                 "other value is an error).\ngcts:\n  # "));
  for (const char* engine : {"ADFE", "DMF"})
    REQUIRE_THAT(printed, Contains(std::string("# Not in this build: the ") + engine + " engine"));
  REQUIRE(printed.find("the MLA engine") == std::string::npos);
  REQUIRE_THAT(printed, Contains("\nmla:\n"));
  const Config again = parse_config_text(printed, "printed.yaml", {}, ctx);
  REQUIRE(again.mla.enable);
  REQUIRE_FALSE(again.gcts.enable);
  REQUIRE(again.built_engines == std::set<std::string>{"mla"});
}

TEST_CASE("config: precision.fp32_master_weights, read by nothing, is no longer a key") {
  REQUIRE(find_key("precision.fp32_master_weights") == nullptr);
  REQUIRE_THAT(error_of("precision:\n  fp32_master_weights: true\n"),
               Contains("bad.yaml:6: unknown key 'precision.fp32_master_weights'; keys of section 'precision': mode"));
}

TEST_CASE("config: a malformed --set is explained") {
  REQUIRE_THAT(error_of("", {"max_steps"}), Contains("--set 'max_steps': expected section.key=value"));
}

TEST_CASE("config: an unknown --set key gets a did-you-mean") {
  REQUIRE_THAT(error_of("", {"trainer.max_step=5"}),
               Contains("--set: unknown key 'trainer.max_step' (did you mean 'trainer.max_steps'?)"));
}

TEST_CASE("config: a bad --set value names --set as its origin") {
  REQUIRE_THAT(error_of("", {"adfe.prefetch_factor=0"}),
               Contains("--set: adfe.prefetch_factor: 0 is out of range: allowed an integer in [1, 64]"));
}

TEST_CASE("config: every problem is reported at once") {
  const auto e = error_of("trainer:\n  micro_batch_size: 0\n  max_stepz: 3\ngcts:\n  comm_strategy: x\n");
  REQUIRE_THAT(e, Contains("3 problems in the configuration"));
  REQUIRE_THAT(e, Contains("bad.yaml:6:"));
  REQUIRE_THAT(e, Contains("bad.yaml:7:"));
  REQUIRE_THAT(e, Contains("bad.yaml:9:"));
}

TEST_CASE("config: a missing config file names the path") {
  REQUIRE_THROWS_WITH(load_config("/nonexistent/n16.yaml", {}), Contains("cannot read config file '/nonexistent/n16.yaml'"));
}
