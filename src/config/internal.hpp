// Private to the config room: typed values and per-key accessors generated
// from keys.def, shared by load.cpp, schema.cpp and validate.cpp.
#pragma once

#include <functional>  // std::function
#include <string>      // std::string
#include <variant>     // std::variant
#include <vector>      // std::vector

#include "loongforge/config/config.hpp"

namespace loongforge::config::detail {

using Value = std::variant<int64_t, double, bool, std::string>;

struct KeyAccess {
  const KeyDef* def;
  std::function<void(Config&, const Value&)> set;
  std::function<Value(const Config&)> get;
};

// In schema() order.
const std::vector<KeyAccess>& accessors();
const KeyAccess* find_access(const std::string& path);

// Parses `text` as a value of `def`'s type and checks its range or choices.
// On failure returns false and sets *error to the reason (no location).
// `plain` is false for quoted YAML scalars, which are strings only.
bool parse_value(const KeyDef& def, const std::string& text, bool plain, Value* out, std::string* error);

std::string format_value(const Value& v);
std::string allowed_text(const KeyDef& def);  // "an integer in [1, 65536]", "one of: simple, hybrid"

// Closest candidate by edit distance, or "" when nothing is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// Fills derived values (Note [Derived accumulation] in validate.cpp) and
// their origins; appends messages for values that cannot be derived.
void derive(Config* cfg, const ValidationContext& ctx, std::vector<std::string>* errors);

// Range, choice and cross-key rules over a loaded config; appends messages.
void validate(const Config& cfg, const ValidationContext& ctx, std::vector<std::string>* errors);

}  // namespace loongforge::config::detail
