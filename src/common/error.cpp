// Breadcrumbs for typed errors: rethrow the same type with context prepended.
#include "loongforge/common/error.hpp"

#include <algorithm>  // std::min
#include <vector>     // std::vector

namespace loongforge {

namespace {
template <typename T>
void rethrow_if(const std::exception& e, const std::string& message) {
  if (dynamic_cast<const T*>(&e) != nullptr) throw T(message);
}

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(' ');
  return a == std::string::npos ? "" : s.substr(a, s.find_last_not_of(' ') - a + 1);
}
}  // namespace

void rethrow_with_context(const std::exception& e, const std::string& context) {
  const std::string message = context + ": " + e.what();
  rethrow_if<ConfigError>(e, message);
  rethrow_if<ModelError>(e, message);
  rethrow_if<DataError>(e, message);
  rethrow_if<CommError>(e, message);
  rethrow_if<CheckpointError>(e, message);
  rethrow_if<ControlError>(e, message);
  rethrow_if<TrainingError>(e, message);
  throw Error(message);
}

std::string short_libtorch_message(const std::string& what) {
  std::string msg = what;
  if (const auto cut = msg.find("\nException raised from"); cut != std::string::npos) msg.resize(cut);
  if (msg.find("TorchScript interpreter") == std::string::npos) return msg;
  std::vector<std::string> lines;
  for (size_t start = 0; start <= msg.size();) {
    const size_t end = std::min(msg.find('\n', start), msg.size());
    lines.push_back(msg.substr(start, end - start));
    start = end + 1;
  }
  std::string error, where;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto colon = lines[i].find("Error: ");
    if (colon != std::string::npos && lines[i].find(' ') > colon) error = lines[i];
    if (lines[i].rfind("  File \"", 0) == 0 && i + 1 < lines.size()) where = trim(lines[i]) + ": " + trim(lines[i + 1]);
  }
  if (error.empty()) return msg;
  return error + (where.empty() ? "" : " (in the model's forward: " + where + ")");
}

}  // namespace loongforge
