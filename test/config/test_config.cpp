// Proves the config room: every key comes from one schema; YAML and --set
// overrides load into typed fields; and every bad config is rejected with a
// message naming the file and line (or --set), the key path and what is
// allowed — including unknown keys (did-you-mean) and cross-key rules.
#include <fstream>  // std::ofstream
#include <set>      // std::set
#include <string>

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/config/config.hpp"

using namespace loongforge;
using namespace loongforge::config;
using lf_catch::Contains;

namespace {

const char* kPaths = "model:\n  path: m.pt\ndata:\n  path: d\n";

// The error message of loading `yaml` (with paths set), or "" if it loads.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {},
                     ValidationContext ctx = {}) {
  try {
    parse_config_text(std::string(kPaths) + yaml, "bad.yaml", overrides, ctx);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
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
  REQUIRE(cfg.dmf.fusion_batch_size == 1);
  REQUIRE(schema().size() >= 50);
  for (const auto& k : schema()) REQUIRE(value_text(cfg, k.path) == k.default_text);
}

TEST_CASE("config: yaml values and --set overrides land in typed fields, overrides last") {
  const Config cfg = parse_config_text(std::string(kPaths) +
                                           "trainer:\n  micro_batch_size: 4\n  grad_clip_norm: 0.5\n"
                                           "gcts:\n  comm_strategy: simple\ndmf:\n  enable: false\n",
                                       "good.yaml", {"trainer.micro_batch_size=16", "optimizer.lr=3e-4"});
  REQUIRE(cfg.trainer.micro_batch_size == 16);
  REQUIRE(cfg.trainer.grad_clip_norm == 0.5);
  REQUIRE(cfg.gcts.comm_strategy == "simple");
  REQUIRE_FALSE(cfg.dmf.enable);
  REQUIRE(cfg.optimizer.lr == 3e-4);
  REQUIRE(cfg.origin.at("trainer.micro_batch_size") == "--set");
  REQUIRE(cfg.origin.at("trainer.grad_clip_norm") == "good.yaml:7");
}

TEST_CASE("config: print-config output loads back to the same values") {
  const Config a = parse_config_text(std::string(kPaths) + "run:\n  name: \"a: b # c\"\ntrainer:\n  max_steps: 7\n",
                                     "a.yaml");
  const std::string printed = print_config(a);
  REQUIRE_THAT(printed, Contains("# Samples per micro-batch per rank. Allowed: an integer in [1, 65536]"));
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

TEST_CASE("config: configs/n16.yaml documents every key of the schema") {
  std::ifstream in(std::string(LOONGFORGE_SOURCE_DIR) + "/configs/n16.yaml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& s : sections()) REQUIRE_THAT(text, Contains("\n" + s.name + ":"));
  for (const auto& k : schema()) REQUIRE_THAT(text, Contains("  " + k.name + ":"));
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
               Contains("unknown key 'mla.qqqqqqqqqq'; keys of section 'mla': enable, global_pool_gb"));
}

TEST_CASE("config: a word where an integer belongs is a type error with the range") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: eight\n"),
               Contains("bad.yaml:6: trainer.micro_batch_size: expected an integer in [1, 65536], got 'eight'"));
}

TEST_CASE("config: a fraction where an integer belongs is a type error") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: 1.5\n"),
               Contains("trainer.max_steps: expected an integer in [1, inf], got '1.5'"));
}

TEST_CASE("config: a quoted number is a string, not an integer") {
  REQUIRE_THAT(error_of("trainer:\n  micro_batch_size: \"8\"\n"),
               Contains("trainer.micro_batch_size: expected an integer in [1, 65536], got '8'"));
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

TEST_CASE("config: fusion batch size that does not divide accumulation is a config error") {
  const auto e = error_of("trainer:\n  gradient_accumulation_steps: 4\ndmf:\n  fusion_batch_size: 3\n");
  REQUIRE_THAT(e, Contains("bad.yaml:8: dmf.fusion_batch_size (3) must divide trainer.gradient_accumulation_steps "
                           "(4, set at bad.yaml:6): use one of 1, 2, 4"));
}

TEST_CASE("config: the fusion rule does not apply when DMF is off") {
  REQUIRE(error_of("trainer:\n  gradient_accumulation_steps: 4\ndmf:\n  enable: false\n  fusion_batch_size: 3\n") == "");
}

TEST_CASE("config: a global batch that is not micro x accumulation x world is rejected with the right value") {
  ValidationContext ctx;
  ctx.world_size = 2;
  const auto e = error_of("trainer:\n  micro_batch_size: 8\n  gradient_accumulation_steps: 2\n  global_batch_size: 64\n",
                          {}, ctx);
  REQUIRE_THAT(e, Contains("bad.yaml:8: trainer.global_batch_size (64) must equal micro_batch_size (8) x "
                           "gradient_accumulation_steps (2) x world size (2) = 32: set it to 32 or 0 (derived)"));
}

TEST_CASE("config: a zero checkpoint interval is rejected") {
  REQUIRE_THAT(error_of("checkpoint:\n  interval_steps: 0\n"),
               Contains("checkpoint.interval_steps: 0 is out of range: allowed an integer in [1, inf]"));
}

TEST_CASE("config: a memory pool as large as the GPU is rejected when the GPU size is known") {
  ValidationContext ctx;
  ctx.device_memory_gb = 139.8;
  REQUIRE_THAT(error_of("mla:\n  global_pool_gb: 200\n", {}, ctx),
               Contains("bad.yaml:6: mla.global_pool_gb (200.0) must be below the device memory (139.8 GB)"));
  REQUIRE(error_of("mla:\n  global_pool_gb: 200\n") == "");  // unknown device memory: not checked
}

TEST_CASE("config: warmup longer than the run is rejected") {
  REQUIRE_THAT(error_of("trainer:\n  max_steps: 10\nschedule:\n  warmup_steps: 10\n"),
               Contains("schedule.warmup_steps (10) must be below trainer.max_steps (10)"));
}

TEST_CASE("config: a missing model path says how to make one") {
  try {
    parse_config_text("data:\n  path: d\n", "nomodel.yaml");
    FAIL("expected ConfigError");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Contains("model.path is required: set it to a file written by scripts/model/export.py"));
  }
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
