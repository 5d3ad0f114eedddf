// The schema and accessors generated from keys.def, and value parsing.
#include <algorithm>     // std::min
#include <charconv>      // std::from_chars, std::to_chars
#include <cctype>        // std::isalnum
#include <cmath>         // std::isfinite
#include <cstring>       // std::strchr
#include <cstdlib>       // std::strtod
#include <sstream>       // std::ostringstream
#include <type_traits>   // std::is_same_v
#include <variant>       // std::holds_alternative

#include "internal.hpp"

namespace loongforge::config {

namespace {

constexpr const char* kAuto = "auto";  // the word an INT_AUTO key takes

std::vector<std::string> split_choices(const char* text) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* p = text; *p; ++p) {
    if (*p == '|') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *p;
    }
  }
  out.push_back(cur);
  return out;
}

std::string number_text(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, res.ptr);
  // Keep floats recognisable as floats to every YAML reader: YAML 1.1
  // (PyYAML) wants a '.' in the mantissa ("1.0", "1.0e-08", not "1e-08").
  if (s.find_first_of("n") != std::string::npos) return s;  // nan/inf never reach here
  const auto e = s.find_first_of("eE");
  if (s.find('.') == std::string::npos) s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

// Strings are written plain when YAML would read them back as the same
// string, double-quoted otherwise (empty, special characters, or text that
// YAML would take for a number, boolean or null).
std::string yaml_quote(const std::string& s) {
  bool plain = !s.empty();
  for (char c : s) plain = plain && (std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_./-", c));
  char* end = nullptr;
  if (plain) std::strtod(s.c_str(), &end);
  const bool numeric = plain && end == s.c_str() + s.size();
  if (plain && !numeric && s != "true" && s != "false" && s != "null" && s != "yes" && s != "no") return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

// Every engine owns a section of its name with an `enable` key: a BOOL, or a
// CHOICE of auto|true|false that the engine resolves for the run's device
// (adfe.enable: adfe::resolve).
#define LF_ENGINE_CHECK(s, display)                                                       \
  static_assert(std::is_same_v<decltype(Config::s##_section::enable), bool> ||            \
                    std::is_same_v<decltype(Config::s##_section::enable), std::string>,   \
                "engine " display " needs a section '" #s "' with an enable key (BOOL, or CHOICE auto|true|false)");
LF_ENGINES(LF_ENGINE_CHECK)
#undef LF_ENGINE_CHECK

// The display name of the engine owning `section` ("GCTS"), or "".
std::string engine_of(const std::string& section) {
#define LF_ENGINE_NAME(s, display) \
  if (section == #s) return display;
  LF_ENGINES(LF_ENGINE_NAME)
#undef LF_ENGINE_NAME
  return "";
}

struct Tables {
  std::vector<SectionDef> sections;
  std::vector<KeyDef> keys;
  std::vector<detail::KeyAccess> access;
};

// Note [Schema tables]: keys.def expands once into KeyDefs (for messages and
// printing) and once into accessors (typed get/set on the Config struct). The
// two vectors are index-aligned; `access[i].def` points into `keys`.
const Tables& tables() {
  static const Tables t = [] {
    Tables out;
#define LF_DEF(s, name_, kind_, deftext, lo, hi, choices_, help_) \
  out.keys.push_back(KeyDef{#s, #name_, #s "." #name_, kind_, deftext, lo, hi, choices_, help_});
#define LF_DEF_INT(s, name, def, lo, hi, help) \
  LF_DEF(s, name, KeyKind::Int, std::to_string(static_cast<int64_t>(def)), static_cast<double>(lo), static_cast<double>(hi), {}, help)
#define LF_DEF_FLOAT(s, name, def, lo, hi, help) LF_DEF(s, name, KeyKind::Float, number_text(def), lo, hi, {}, help)
#define LF_DEF_BOOL(s, name, def, help) LF_DEF(s, name, KeyKind::Bool, (def) ? "true" : "false", 0, 0, {}, help)
#define LF_DEF_STR(s, name, def, help) LF_DEF(s, name, KeyKind::Str, yaml_quote(def), 0, 0, {}, help)
#define LF_DEF_CHOICE(s, name, def, choices, help) LF_DEF(s, name, KeyKind::Choice, def, 0, 0, split_choices(choices), help)
#define LF_DEF_INT_AUTO(s, name, def, lo, hi, help) \
  LF_DEF(s, name, KeyKind::IntAuto, std::to_string(static_cast<int64_t>(def)), static_cast<double>(lo), static_cast<double>(hi), {}, help)
#define LF_DEF_SECTION(section, help, KEYS)          \
  out.sections.push_back(SectionDef{#section, help, engine_of(#section)}); \
  KEYS(section, LF_DEF_INT, LF_DEF_FLOAT, LF_DEF_BOOL, LF_DEF_STR, LF_DEF_CHOICE, LF_DEF_INT_AUTO)
    LF_CONFIG_SECTIONS(LF_DEF_SECTION)
#undef LF_DEF_SECTION

    using detail::Value;
#define LF_ACC(s, name, T)                                                                  \
  out.access.push_back(detail::KeyAccess{                                                   \
      nullptr, [](Config& c, const Value& v) { c.s.name = std::get<T>(v); },                \
      [](const Config& c) { return Value(c.s.name); }});
#define LF_ACC_INT(s, name, def, lo, hi, help) LF_ACC(s, name, int64_t)
#define LF_ACC_FLOAT(s, name, def, lo, hi, help) LF_ACC(s, name, double)
#define LF_ACC_BOOL(s, name, def, help) LF_ACC(s, name, bool)
#define LF_ACC_STR(s, name, def, help) LF_ACC(s, name, std::string)
#define LF_ACC_CHOICE(s, name, def, choices, help) LF_ACC(s, name, std::string)
// An INT_AUTO key holds an int64 or the word auto (the string "auto" as a Value; the field then reads 0).
#define LF_ACC_INT_AUTO(s, name, def, lo, hi, help)                                                      \
  out.access.push_back(detail::KeyAccess{                                                                \
      nullptr,                                                                                           \
      [](Config& c, const Value& v) {                                                                    \
        c.s.name##_auto = std::holds_alternative<std::string>(v);                                        \
        c.s.name = c.s.name##_auto ? 0 : std::get<int64_t>(v);                                           \
      },                                                                                                 \
      [](const Config& c) { return c.s.name##_auto && c.s.name == 0 ? Value(std::string(kAuto)) : Value(c.s.name); }});
#define LF_ACC_SECTION(section, help, KEYS) \
  KEYS(section, LF_ACC_INT, LF_ACC_FLOAT, LF_ACC_BOOL, LF_ACC_STR, LF_ACC_CHOICE, LF_ACC_INT_AUTO)
    LF_CONFIG_SECTIONS(LF_ACC_SECTION)
#undef LF_ACC_SECTION
    for (size_t i = 0; i < out.keys.size(); ++i) out.access[i].def = &out.keys[i];
    return out;
  }();
  return t;
}

}  // namespace

const std::vector<SectionDef>& sections() { return tables().sections; }
const std::vector<KeyDef>& schema() { return tables().keys; }

const KeyDef* find_key(const std::string& path) {
  for (const auto& k : schema())
    if (k.path == path) return &k;
  return nullptr;
}

namespace detail {

const std::vector<KeyAccess>& accessors() { return tables().access; }

const KeyAccess* find_access(const std::string& path) {
  for (const auto& a : accessors())
    if (a.def->path == path) return &a;
  return nullptr;
}

std::string format_value(const Value& v) {
  if (auto i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto d = std::get_if<double>(&v)) return number_text(*d);
  if (auto b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return yaml_quote(std::get<std::string>(v));
}

std::string allowed_text(const KeyDef& def) {
  auto range = [&](bool integer) {
    auto bound = [&](double x) {
      if (integer) {
        if (x >= 9.2e18) return std::string("inf");
        return std::to_string(static_cast<int64_t>(x));
      }
      return number_text(x);
    };
    return "[" + bound(def.min) + ", " + bound(def.max) + "]";
  };
  switch (def.kind) {
    case KeyKind::Int: return "an integer in " + range(true);
    case KeyKind::Float: return "a number in " + range(false);
    case KeyKind::Bool: return "true or false";
    case KeyKind::Str: return "a string";
    case KeyKind::IntAuto: return "an integer in " + range(true) + ", or " + kAuto;
    case KeyKind::Choice: {
      std::string s = "one of: ";
      for (size_t i = 0; i < def.choices.size(); ++i) s += (i ? ", " : "") + def.choices[i];
      return s;
    }
  }
  return "";
}

bool parse_value(const KeyDef& def, const std::string& text, bool plain, Value* out, std::string* error) {
  const std::string got = "got '" + text + "'";
  auto fail = [&](const std::string& why) {
    *error = def.path + ": " + why;
    return false;
  };
  switch (def.kind) {
    case KeyKind::IntAuto:
      if (text == kAuto) return *out = std::string(kAuto), true;  // a word: quoted or not
      [[fallthrough]];
    case KeyKind::Int: {
      int64_t v = 0;
      auto res = std::from_chars(text.data(), text.data() + text.size(), v);
      if (!plain || text.empty() || res.ec != std::errc() || res.ptr != text.data() + text.size())
        return fail("expected " + allowed_text(def) + ", " + got);
      if (static_cast<double>(v) < def.min || static_cast<double>(v) > def.max)
        return fail(text + " is out of range: allowed " + allowed_text(def));
      *out = v;
      return true;
    }
    case KeyKind::Float: {
      char* end = nullptr;
      const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
      if (!plain || text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
        return fail("expected " + allowed_text(def) + ", " + got);
      if (v < def.min || v > def.max) return fail(text + " is out of range: allowed " + allowed_text(def));
      *out = v;
      return true;
    }
    case KeyKind::Bool:
      if (plain && text == "true") return *out = true, true;
      if (plain && text == "false") return *out = false, true;
      return fail("expected true or false, " + got);
    case KeyKind::Str:
      *out = text;
      return true;
    case KeyKind::Choice:
      for (const auto& c : def.choices)
        if (c == text) return *out = text, true;
      return fail("'" + text + "' is not allowed: use " + allowed_text(def));
  }
  return fail("unsupported key kind");
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      }
      std::swap(prev, cur);
    }
    return prev[b.size()];
  };
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace detail

std::string value_text(const Config& cfg, const std::string& path) {
  const auto* a = detail::find_access(path);
  return a ? detail::format_value(a->get(cfg)) : std::string();
}

int64_t global_batch_size(const Config& cfg, int64_t world_size) {
  return cfg.trainer.micro_batch_size * cfg.trainer.gradient_accumulation_steps * world_size;
}

std::string print_config(const Config& cfg) {
  std::ostringstream out;
  out << "# LoongForge configuration (loongforge-train --print-config).\n"
      << "# Every key with its help, allowed values and where its value came from.\n";
  std::string section;
  for (const auto& a : detail::accessors()) {
    const KeyDef& d = *a.def;
    if (d.section != section) {
      section = d.section;
      for (const auto& s : sections()) {
        if (s.name != section) continue;
        out << "\n# " << s.help << "\n";
        if (!s.engine.empty() && !cfg.built_engines.count(s.name))
          out << "# Not in this build: the " << s.engine << " engine is not in this binary yet; these keys keep\n"
              << "# their defaults and do nothing (any other value is an error).\n";
        out << section << ":\n";
      }
    }
    auto it = cfg.origin.find(d.path);
    const std::string origin = it == cfg.origin.end() ? "default" : it->second;
    const bool chosen = origin.rfind(kChosenByAuto, 0) == 0;  // an INT_AUTO key resolved from auto
    const std::string source = origin == "default"                           ? ""
                               : origin == kDerivedFromGlobalBatch || chosen ? ". Value " + origin
                                                                              : ". Set by " + origin;
    out << "  # " << d.help << ". Allowed: " << detail::allowed_text(d) << ". Default: " << d.default_text
        << source << "\n";
    // Unset while trainer.micro_batch_size auto waits for its choice (Note [Micro-batch auto] in validate.cpp):
    // written, it would be an explicit accumulation, which auto refuses.
    if (d.path == "trainer.gradient_accumulation_steps" && cfg.trainer.micro_batch_size_auto &&
        cfg.trainer.micro_batch_size == 0) {
      out << "  # " << d.name << ": derived from trainer.global_batch_size when trainer.micro_batch_size auto is "
          << "resolved\n";
      continue;
    }
    out << "  " << d.name << ": " << detail::format_value(a.get(cfg)) << "\n";
  }
  return out.str();
}

}  // namespace loongforge::config
