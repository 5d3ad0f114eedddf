// loongforge/config/config.hpp — the typed configuration and how it is loaded.
//
// Contract:
//  - Owns: the Config struct, generated from keys.def (one definition per key:
//    name, type, default, range or choices, help).
//  - load_config() reads YAML, applies `--set section.key=value` overrides in
//    order, then validates ranges and cross-key rules. Every problem found is
//    reported at once in one ConfigError, one line each, naming the file and
//    line (or "--set"), the key path, what is allowed and, for unknown keys, a
//    did-you-mean.
//  - Engines (GCTS, MLA, ADFE, DMF) own the section of their name. The caller
//    says which are in this binary (ValidationContext::built_engines); a key of
//    any other engine set to a value other than its default is an error naming
//    the key and the line (Note [Unbuilt engines] in validate.cpp).
//  - trainer.gradient_accumulation_steps is derived from
//    trainer.global_batch_size when that is > 0 and the accumulation is not
//    set (origin "derived from trainer.global_batch_size").
//  - trainer.micro_batch_size: auto is accepted only with
//    trainer.global_batch_size > 0 and an unset accumulation; it loads as
//    micro_batch_size 0 with micro_batch_size_auto set, and nothing here
//    multiplies it (the accumulation stays unset, derived when the trainer
//    resolves it: resolve_auto_micro_batch; Note [Micro-batch auto] in
//    validate.cpp).
//  - Pure: no threads, no I/O except reading the given file and, when
//    require_paths is set, checking that model.path and data.path exist.
//  - Never: guesses a type, silently ignores a key, or clamps a value.
//
// Example:
//   ValidationContext ctx; ctx.world_size = 8;
//   Config cfg = load_config("configs/n16.yaml", {"trainer.max_steps=200"}, ctx);
//   int64_t mb = cfg.trainer.micro_batch_size;
//   std::cout << print_config(cfg);   // commented YAML, loadable again
#pragma once

#include <cstdint>   // int64_t
#include <map>       // std::map
#include <optional>  // std::optional
#include <set>       // std::set
#include <string>    // std::string
#include <vector>    // std::vector

#include "loongforge/config/keys.def"

namespace loongforge::config {

// ---------------------------------------------------------------------------
// The typed configuration (fields generated from keys.def).

#define LF_FIELD_INT(s, name, def, lo, hi, help) int64_t name = def;
#define LF_FIELD_FLOAT(s, name, def, lo, hi, help) double name = def;
#define LF_FIELD_BOOL(s, name, def, help) bool name = def;
#define LF_FIELD_STR(s, name, def, help) std::string name = def;
#define LF_FIELD_CHOICE(s, name, def, choices, help) std::string name = def;
// An INT_AUTO key set to `auto` reads 0 (never a valid value) with name##_auto true until resolved; the
// resolved value keeps name##_auto true (what the key said) beside the number that was chosen.
#define LF_FIELD_INT_AUTO(s, name, def, lo, hi, help) \
  int64_t name = def;                                 \
  bool name##_auto = false;
#define LF_SECTION_STRUCT(section, help, KEYS)                                                                    \
  struct section##_section {                                                                                     \
    KEYS(section, LF_FIELD_INT, LF_FIELD_FLOAT, LF_FIELD_BOOL, LF_FIELD_STR, LF_FIELD_CHOICE, LF_FIELD_INT_AUTO) \
  } section;

struct Config {
  LF_CONFIG_SECTIONS(LF_SECTION_STRUCT)

  // Where each key's value came from: "file.yaml:12", "--set", "default",
  // kDerivedFromGlobalBatch, or for an INT_AUTO key resolved from `auto`
  // kChosenByAuto followed by where `auto` was set.
  std::map<std::string, std::string> origin;
  // The engines of the binary that validated it (ValidationContext::built_engines);
  // print_config marks the sections of the others as not in this build.
  std::set<std::string> built_engines;
};

// The origin of trainer.gradient_accumulation_steps when it was derived.
inline constexpr const char* kDerivedFromGlobalBatch = "derived from trainer.global_batch_size";
// The origin's prefix of an INT_AUTO key resolved from `auto` ("chosen for auto, set at run.yaml:7").
inline constexpr const char* kChosenByAuto = "chosen for auto, set at ";

#undef LF_SECTION_STRUCT
#undef LF_FIELD_INT
#undef LF_FIELD_FLOAT
#undef LF_FIELD_BOOL
#undef LF_FIELD_STR
#undef LF_FIELD_CHOICE
#undef LF_FIELD_INT_AUTO

// ---------------------------------------------------------------------------
// The schema (one entry per key, in keys.def order).

enum class KeyKind { Int, Float, Bool, Str, Choice, IntAuto };  // IntAuto: Int or the word auto

struct KeyDef {
  std::string section;
  std::string name;
  std::string path;  // "section.name"
  KeyKind kind;
  std::string default_text;  // as it would be written in YAML
  double min = 0;            // Int/Float/IntAuto only
  double max = 0;
  std::vector<std::string> choices;  // Choice only
  std::string help;
};

struct SectionDef {
  std::string name;
  std::string help;
  std::string engine;  // display name ("GCTS") when an engine owns the section, else ""
};

const std::vector<SectionDef>& sections();
const std::vector<KeyDef>& schema();
const KeyDef* find_key(const std::string& path);

// ---------------------------------------------------------------------------
// Loading and validation.

// Facts about the environment that some rules need; unknown ones are skipped.
struct ValidationContext {
  int64_t world_size = 1;
  std::optional<double> device_memory_gb;  // of the smallest visible GPU
  // model.path must name an existing regular file and data.path an existing
  // directory (relative paths from the current directory).
  bool require_paths = true;
  // Section names of the engines compiled into this binary ("gcts", "mla",
  // "adfe", "dmf"); empty = none. The trainer fills it from its engine registry.
  std::set<std::string> built_engines;
};

// Reads `path`, applies overrides ("section.key=value"), validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const ValidationContext& ctx = {});
// The same from text; `display_name` stands for the file in messages.
Config parse_config_text(const std::string& yaml_text, const std::string& display_name,
                         const std::vector<std::string>& overrides = {},
                         const ValidationContext& ctx = {});
// Defaults only (plus overrides), validated.
Config default_config(const std::vector<std::string>& overrides = {},
                      const ValidationContext& ctx = {});

// Commented YAML of every key (help, allowed values, origin); loads again.
std::string print_config(const Config& cfg);
// A key's current value as YAML text ("8", "true", "hybrid").
std::string value_text(const Config& cfg, const std::string& path);

// Derived values.
int64_t global_batch_size(const Config& cfg, int64_t world_size);

// trainer.micro_batch_size: auto, resolved to `micro_batch` on `world_size`
// ranks: sets the micro-batch (origin kChosenByAuto + where auto was set) and
// derives the accumulation G / (B x W) (Note [Micro-batch auto] in
// validate.cpp). Throws ConfigError when the key is not auto or `micro_batch`
// x `world_size` does not divide the global batch.
void resolve_auto_micro_batch(Config* cfg, int64_t micro_batch, int64_t world_size);

// The keys of `section` other than `<section>.enable` whose value is not
// their default, each as "<origin>: <key>=<value>" (origin as in
// print_config: "bad.yaml:6", "--set"). An engine whose section has
// enable=false warns about them: they would do nothing (Note [Keys of an engine
// that is off] in validate.cpp).
std::vector<std::string> non_default_keys(const Config& cfg, const std::string& section);

}  // namespace loongforge::config
