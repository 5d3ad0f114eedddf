// Breadcrumbs for typed errors: rethrow the same type with context prepended.
#include "loongforge/common/error.hpp"

namespace loongforge {

namespace {
template <typename T>
void rethrow_if(const std::exception& e, const std::string& message) {
  if (dynamic_cast<const T*>(&e) != nullptr) throw T(message);
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

}  // namespace loongforge
