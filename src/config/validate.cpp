// Derived values and cross-key rules: what no single key's range can say. Each
// message names every key involved, where it was set, and a value that would
// work.
#include <filesystem>  // std::filesystem::status
#include <sstream>     // std::ostringstream

#include "internal.hpp"
#include "loongforge/common/error.hpp"  // ConfigError

namespace loongforge::config::detail {

namespace {

std::string origin_of(const Config& cfg, const std::string& path) {
  auto it = cfg.origin.find(path);
  return it == cfg.origin.end() ? "default" : it->second;
}

// "set at bad.yaml:6", "set at --set", "default" or "derived from trainer.global_batch_size".
std::string how_set(const Config& cfg, const std::string& path) {
  const std::string o = origin_of(cfg, path);
  return o == "default" || o == kDerivedFromGlobalBatch ? o : "set at " + o;
}

std::string engine_names() {
  std::string s;
  for (const auto& sec : sections())
    if (!sec.engine.empty()) s += (s.empty() ? "" : ", ") + sec.name;
  return s;
}

// Note [Unbuilt engines]: an engine section whose engine is not compiled into
// the binary still exists in the schema (keys.def defines it once, the struct
// has its fields, --print-config prints it so readers such as the reference
// trainer see its defaults). Its defaults leave the engine off, so they are
// true to the build; any other value would be accepted and ignored, so it is
// an error naming the key and where it was set. A key written with its default
// value is accepted: that is what --print-config writes, and its output must
// load again.
void check_unbuilt_engines(const Config& cfg, const ValidationContext& ctx, std::vector<std::string>* errors) {
  for (const auto& name : ctx.built_engines) {
    bool known = false;
    for (const auto& sec : sections()) known = known || (!sec.engine.empty() && sec.name == name);
    if (!known)
      errors->push_back("this binary reports an unknown engine '" + name + "' as built (engines: " + engine_names() +
                        "): fix the trainer's engine registry");
  }
  for (const auto& sec : sections()) {
    if (sec.engine.empty() || ctx.built_engines.count(sec.name)) continue;
    for (const auto& a : accessors()) {
      const KeyDef& d = *a.def;
      if (d.section != sec.name || format_value(a.get(cfg)) == d.default_text) continue;
      errors->push_back(origin_of(cfg, d.path) + ": " + d.path + ": the " + sec.engine +
                        " engine is not in this build yet; remove the key (its default, " + d.default_text +
                        ", is what this binary does)");
    }
  }
}

// model.path must be a regular file and data.path a directory; the message
// names the key, where it was set, the path and the command that writes it.
void check_path(const Config& cfg, const std::string& key, const std::string& path, bool want_directory,
                const std::string& producer, std::vector<std::string>* errors) {
  const std::string what = want_directory ? "a directory" : "a file";
  const std::string make = "write it with `" + producer + "`";
  const std::string at = origin_of(cfg, key) + ": " + key;
  if (path.empty()) {
    errors->push_back(at + " is required: set it to " + what + " written by `" + producer + "`");
    return;
  }
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (st.type() == std::filesystem::file_type::not_found) {
    errors->push_back(at + ": '" + path + "' does not exist: " + make + " (or correct the path)");
  } else if (ec) {
    errors->push_back(at + ": cannot check '" + path + "': " + ec.message());
  } else if (want_directory ? !std::filesystem::is_directory(st) : !std::filesystem::is_regular_file(st)) {
    errors->push_back(at + ": '" + path + "' is not " + what + ": " + make);
  }
}

// Note [Micro-batch auto]: trainer.micro_batch_size: auto asks the trainer
// for the largest micro-batch that fits the GPU with the global batch kept
// (src/trainer/micro_batch.cpp, Note [Choosing the micro-batch]). The global
// batch is what it keeps, so it must be given (global_batch_size > 0), and the
// accumulation is what absorbs the choice (G / (B x W)), so it must be left
// to derive. Until resolved the field reads 0 (never a valid micro-batch), so
// every rule here that multiplies it is skipped and the accumulation keeps
// its default, unset; resolve_auto_micro_batch() then sets both at once and
// checks what derive() checks. Device facts (CPU, MLA) are the trainer's.
void check_auto_micro_batch(const Config& cfg, const ValidationContext& ctx, std::vector<std::string>* errors) {
  const auto& t = cfg.trainer;
  if (!t.micro_batch_size_auto) return;
  const std::string at = origin_of(cfg, "trainer.micro_batch_size") + ": trainer.micro_batch_size is auto";
  if (t.global_batch_size == 0)
    errors->push_back(at + ", which keeps trainer.global_batch_size (samples per optimizer step over all ranks) "
                           "while it chooses the micro-batch, but global_batch_size is 0 (" +
                      how_set(cfg, "trainer.global_batch_size") +
                      "): set trainer.global_batch_size to the global batch to keep, or set micro_batch_size to a "
                      "number");
  else if (t.global_batch_size % ctx.world_size != 0)
    errors->push_back(at + ": trainer.global_batch_size (" + std::to_string(t.global_batch_size) +
                      ") must be a multiple of the world size (" + std::to_string(ctx.world_size) +
                      ") for every rank to take an equal share: set global_batch_size to a multiple of " +
                      std::to_string(ctx.world_size));
  if (origin_of(cfg, "trainer.gradient_accumulation_steps") != "default")
    errors->push_back(at + ", which derives trainer.gradient_accumulation_steps from its choice (global_batch_size / "
                           "(micro_batch_size x world size)), but the accumulation is " +
                      how_set(cfg, "trainer.gradient_accumulation_steps") + " (" +
                      std::to_string(t.gradient_accumulation_steps) +
                      "): remove trainer.gradient_accumulation_steps, or set micro_batch_size to a number");
}

}  // namespace

// Note [Derived accumulation]: trainer.global_batch_size > 0 fixes the samples
// per optimizer step over all ranks. While gradient_accumulation_steps is not
// set it follows from the world size, G / (B x W), so the same config keeps the
// same global batch on any world size that divides it; set explicitly, it must
// agree (checked in validate()).
void derive(Config* cfg, const ValidationContext& ctx, std::vector<std::string>* errors) {
  auto& t = cfg->trainer;
  if (ctx.world_size < 1) {
    errors->push_back("world size " + std::to_string(ctx.world_size) + " must be at least 1");
    return;
  }
  if (t.global_batch_size == 0 || origin_of(*cfg, "trainer.gradient_accumulation_steps") != "default") return;
  if (t.micro_batch_size_auto) return;  // derived when the trainer resolves it (Note [Micro-batch auto])
  const int64_t per_step = t.micro_batch_size * ctx.world_size;
  const std::string G = std::to_string(t.global_batch_size), B = std::to_string(t.micro_batch_size),
                    W = std::to_string(ctx.world_size), BW = std::to_string(per_step);
  const std::string at = origin_of(*cfg, "trainer.global_batch_size") + ": ";
  if (t.global_batch_size % per_step != 0) {
    const int64_t below = t.global_batch_size / per_step * per_step;
    errors->push_back(at + "trainer.global_batch_size (" + G + ") is not a multiple of micro_batch_size (" + B +
                      ") x world size (" + W + ") = " + BW +
                      ", so gradient_accumulation_steps cannot be derived from it: set global_batch_size to " +
                      (below > 0 ? std::to_string(below) + " or " : "") + std::to_string(below + per_step) +
                      ", or a micro_batch_size that divides it");
    return;
  }
  const int64_t k = t.global_batch_size / per_step;
  const double k_max = find_key("trainer.gradient_accumulation_steps")->max;
  if (static_cast<double>(k) > k_max) {
    errors->push_back(at + "trainer.global_batch_size (" + G + ") / (micro_batch_size (" + B + ") x world size (" + W +
                      ")) = " + std::to_string(k) + " micro-batches per step, above the limit of " +
                      std::to_string(static_cast<int64_t>(k_max)) + ": raise micro_batch_size");
    return;
  }
  t.gradient_accumulation_steps = k;
  cfg->origin["trainer.gradient_accumulation_steps"] = kDerivedFromGlobalBatch;
}

void validate(const Config& cfg, const ValidationContext& ctx, std::vector<std::string>* errors) {
  auto add = [&](const std::string& path, const std::string& msg) {
    errors->push_back(origin_of(cfg, path) + ": " + msg);
  };
  const auto& t = cfg.trainer;

  check_unbuilt_engines(cfg, ctx, errors);

  if (ctx.require_paths) {
    check_path(cfg, "model.path", cfg.model.path, false,
               "python3 scripts/model/export.py --config n16-tiny --out " +
                   (cfg.model.path.empty() ? std::string("<path>") : cfg.model.path),
               errors);
    const bool mixture = cfg.data.path.size() > 5 && cfg.data.path.compare(cfg.data.path.size() - 5, 5, ".json") == 0;
    check_path(cfg, "data.path", cfg.data.path, /*dir=*/!mixture,
               mixture ? "echo '{\"datasets\": [{\"path\": \"a.lf\", \"embodiment_id\": 0}, ...]}' > " + cfg.data.path
                       : "python3 scripts/convert_lerobot.py <lerobot dataset> " +
                             (cfg.data.path.empty() ? std::string("<path>") : cfg.data.path),
               errors);
  }

  // Engine rules hold only for an engine that runs (built and enabled).
  auto runs = [&](const char* engine, bool enable) { return enable && ctx.built_engines.count(engine) > 0; };

  check_auto_micro_batch(cfg, ctx, errors);

  // Both set (a derived accumulation agrees by construction). Not while the micro-batch is auto: it reads 0.
  const int64_t derived = global_batch_size(cfg, ctx.world_size);
  if (!t.micro_batch_size_auto && t.global_batch_size != 0 && t.global_batch_size != derived) {
    const int64_t per_step = t.micro_batch_size * ctx.world_size;
    std::string fix = "set it to " + std::to_string(derived) + " or 0 (derived)";
    if (t.global_batch_size % per_step == 0)
      fix += ", or remove trainer.gradient_accumulation_steps (" + how_set(cfg, "trainer.gradient_accumulation_steps") +
             ") to derive it as " + std::to_string(t.global_batch_size) + " / (" + std::to_string(t.micro_batch_size) +
             " x " + std::to_string(ctx.world_size) + ") = " + std::to_string(t.global_batch_size / per_step);
    add("trainer.global_batch_size",
        "trainer.global_batch_size (" + std::to_string(t.global_batch_size) + ") must equal micro_batch_size (" +
            std::to_string(t.micro_batch_size) + ") x gradient_accumulation_steps (" +
            std::to_string(t.gradient_accumulation_steps) + ") x world size (" + std::to_string(ctx.world_size) +
            ") = " + std::to_string(derived) + ": " + fix);
  }

  if (cfg.schedule.warmup_steps >= t.max_steps) {
    add("schedule.warmup_steps", "schedule.warmup_steps (" + std::to_string(cfg.schedule.warmup_steps) +
                                     ") must be below trainer.max_steps (" + std::to_string(t.max_steps) + ")");
  }

  const auto& ck = cfg.checkpoint;
  if (ck.staging_mb != 0 && ck.staging_mb < ck.chunk_mb) {
    add("checkpoint.staging_mb", "checkpoint.staging_mb (" + std::to_string(ck.staging_mb) +
                                     ") is smaller than one chunk, checkpoint.chunk_mb (" + std::to_string(ck.chunk_mb) +
                                     "): staging holds whole chunks; raise staging_mb, lower chunk_mb, or set "
                                     "staging_mb to 0 (as large as the state)");
  }

  const auto& ft = cfg.fault;
  if (ft.heartbeat_timeout_s <= ft.heartbeat_s)
    add("fault.heartbeat_timeout_s", "fault.heartbeat_timeout_s (" + format_value(ft.heartbeat_timeout_s) +
                                         ") must exceed fault.heartbeat_s (" + format_value(ft.heartbeat_s) +
                                         "): a live rank would be taken for lost between two heartbeats");

  if (runs("mla", cfg.mla.enable) && ctx.device_memory_gb && cfg.mla.global_pool_gb >= *ctx.device_memory_gb) {
    std::ostringstream mem;
    mem.precision(4);
    mem << *ctx.device_memory_gb;
    add("mla.global_pool_gb", "mla.global_pool_gb (" + format_value(cfg.mla.global_pool_gb) +
                                  ") must be below the device memory (" + mem.str() +
                                  " GB) leaving room for weights and optimizer state: lower it, or set 0 (auto)");
  } else if (runs("mla", cfg.mla.enable) && ctx.device_memory_gb &&
             cfg.mla.persistent_gb + cfg.mla.global_pool_gb >= *ctx.device_memory_gb) {
    std::ostringstream mem;
    mem.precision(4);
    mem << *ctx.device_memory_gb;
    add("mla.persistent_gb", "mla.persistent_gb (" + format_value(cfg.mla.persistent_gb) +
                                 ") plus mla.global_pool_gb (" + format_value(cfg.mla.global_pool_gb) +
                                 ") must be below the device memory (" + mem.str() +
                                 " GB) leaving room for everything else: lower them, or set 0 (grown as needed)");
  }
}

}  // namespace loongforge::config::detail

namespace loongforge::config {

// Note [Keys of an engine that is off]: an engine built into the binary but
// switched off (<section>.enable=false) takes the plain path, so every other
// key of its section does nothing. Such a key set to a value other than its
// default is most often an intent lost ("gcts.shard_optimizer=true" with GCTS
// off shards nothing), so the engine's factory names each one in a warning.
// It is not an error: a config that tunes an engine and a --set that turns the
// engine off for one run is a normal way to compare the two paths.
std::vector<std::string> non_default_keys(const Config& cfg, const std::string& section) {
  std::vector<std::string> found;
  for (const auto& a : detail::accessors()) {
    const KeyDef& d = *a.def;
    if (d.section != section || d.name == "enable") continue;
    const std::string value = detail::format_value(a.get(cfg));
    if (value == d.default_text) continue;
    const auto it = cfg.origin.find(d.path);
    found.push_back((it == cfg.origin.end() ? std::string("default") : it->second) + ": " + d.path + "=" + value);
  }
  return found;
}

}  // namespace loongforge::config

namespace loongforge::config {

void resolve_auto_micro_batch(Config* cfg, int64_t micro_batch, int64_t world_size) {
  auto& t = cfg->trainer;
  const std::string key = "trainer.micro_batch_size";
  if (!t.micro_batch_size_auto)
    throw ConfigError(key + " is " + std::to_string(t.micro_batch_size) + ", not auto: there is nothing to resolve");
  const int64_t per_step = micro_batch * world_size;
  const auto* def = find_key(key);
  if (micro_batch < static_cast<int64_t>(def->min) || micro_batch > static_cast<int64_t>(def->max) ||
      world_size < 1 || t.global_batch_size % per_step != 0)
    throw ConfigError(key + " auto: " + std::to_string(micro_batch) + " x " + std::to_string(world_size) +
                      " rank(s) is outside " + detail::allowed_text(*def) +
                      " or does not divide trainer.global_batch_size (" + std::to_string(t.global_batch_size) +
                      "); every candidate does (a bug in the chooser)");
  const int64_t k = t.global_batch_size / per_step;
  if (static_cast<double>(k) > find_key("trainer.gradient_accumulation_steps")->max)
    throw ConfigError(key + " auto: " + std::to_string(micro_batch) + " needs an accumulation of " +
                      std::to_string(k) + ", above the key's limit (a bug in the chooser)");
  auto& origin = cfg->origin[key];
  origin = kChosenByAuto + (origin.empty() ? std::string("default") : origin);
  t.micro_batch_size = micro_batch;
  t.gradient_accumulation_steps = k;
  cfg->origin["trainer.gradient_accumulation_steps"] = kDerivedFromGlobalBatch;
}

}  // namespace loongforge::config
