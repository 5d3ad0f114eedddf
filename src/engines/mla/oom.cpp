// MLA's out-of-memory message (oom.hpp).
#include "loongforge/engines/mla/oom.hpp"

#include <algorithm>  // std::max
#include <cstdio>     // std::snprintf
#include <sstream>    // std::ostringstream

namespace loongforge::mla {

std::string format_bytes(uint64_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (uint64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  else if (bytes >= (uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1 << 20));
  else if (bytes >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  return buf;
}

namespace {

// What the refusing pool could still give: its largest free block, or, for a
// pool that grows, also what the device has left.
uint64_t available_bytes(const OomReport& r) {
  uint64_t avail = r.pool.largest_free_bytes;
  if (!r.pool_fixed && r.device_free_bytes) avail = std::max(avail, *r.device_free_bytes);
  return avail;
}

// Bytes of one step's memory the micro-batch scales: the activations in use
// plus the request (unless the request is persistent, which no batch key changes).
uint64_t step_bytes(const OomReport& r) {
  return r.in_use_by_category[static_cast<size_t>(Category::kActivation)] + r.request_bytes;
}

}  // namespace

int64_t proposed_micro_batch(const OomReport& r) {
  if (r.category == Category::kPersistent || r.micro_batch_size <= 1) return 0;
  const uint64_t avail = available_bytes(r);
  if (r.request_bytes <= avail) return 0;  // not a shortage of bytes (see the message)
  const uint64_t shortfall = r.request_bytes - avail;
  const uint64_t demand = step_bytes(r);
  if (shortfall >= demand) return 0;
  const double fits =
      static_cast<double>(r.micro_batch_size) * static_cast<double>(demand - shortfall) / static_cast<double>(demand);
  const int64_t samples = r.micro_batch_size * r.gradient_accumulation_steps;  // per rank per optimizer step
  for (int64_t m = r.micro_batch_size - 1; m >= 1; --m)
    if (samples % m == 0 && static_cast<double>(m) <= fits) return m;
  return 0;
}

std::string explain_out_of_memory(const OomReport& r) {
  std::ostringstream o;
  const PoolStats& p = r.pool;
  o << "MLA: out of memory: a request of " << format_bytes(r.request_bytes) << " (" << category_name(r.category)
    << ") does not fit in the " << r.pool_name << ": " << format_bytes(p.reserved_bytes) << " reserved, "
    << format_bytes(p.in_use_bytes) << " in use, " << format_bytes(p.free_bytes) << " free, largest free block "
    << format_bytes(p.largest_free_bytes);
  char frag[32];
  std::snprintf(frag, sizeof frag, "%.1f%%", 100.0 * p.fragmentation());
  o << " (fragmentation " << frag << ")";
  if (p.pending_bytes != 0) o << ", " << format_bytes(p.pending_bytes) << " waiting for other streams";
  if (r.device_free_bytes) {
    o << "; the device has " << format_bytes(*r.device_free_bytes) << " free";
    if (r.device_total_bytes) o << " of " << format_bytes(*r.device_total_bytes);
  }
  o << ". In use by category: persistent "
    << format_bytes(r.in_use_by_category[static_cast<size_t>(Category::kPersistent)]);
  if (!r.persistent_by_label.empty()) {
    o << " (";
    for (size_t i = 0; i < r.persistent_by_label.size(); ++i)
      o << (i ? ", " : "") << r.persistent_by_label[i].first << " " << format_bytes(r.persistent_by_label[i].second);
    o << ")";
  }
  o << ", activation " << format_bytes(r.in_use_by_category[static_cast<size_t>(Category::kActivation)]) << ", other "
    << format_bytes(r.in_use_by_category[static_cast<size_t>(Category::kOther)]) << ".";

  // What would make it fit.
  std::vector<std::string> fixes;
  auto mentions = [&](const std::string& key) {
    for (const auto& f : fixes)
      if (f.find(key) != std::string::npos) return true;
    return false;
  };
  const uint64_t avail = available_bytes(r);
  if (r.request_bytes <= p.free_bytes && r.request_bytes > p.largest_free_bytes && r.pool_fixed)
    fixes.push_back("the pool has the bytes but not in one block (fragmentation): raise mla.global_pool_gb (now " +
                    format_bytes(static_cast<uint64_t>(r.global_pool_gb * (1 << 30))) + ")");
  if (r.category == Category::kPersistent) {
    fixes.push_back(
        "the request is persistent (weights, optimizer state, gradients), which no batch key changes: "
        "with several ranks, gcts.enable=true and gcts.shard_optimizer=true keep 1/world of the "
        "optimizer state per rank");
  } else {
    const int64_t m = proposed_micro_batch(r);
    const int64_t samples = r.micro_batch_size * r.gradient_accumulation_steps;
    if (m > 0) {
      fixes.push_back("lower trainer.micro_batch_size (now " + std::to_string(r.micro_batch_size) + ") to " +
                      std::to_string(m) + " and set trainer.gradient_accumulation_steps (now " +
                      std::to_string(r.gradient_accumulation_steps) + ") to " + std::to_string(samples / m) +
                      " to keep " + std::to_string(samples) +
                      " samples per rank per optimizer step (estimated assuming activation memory grows "
                      "linearly with the micro-batch)");
    } else if (r.micro_batch_size > 1 && r.request_bytes > avail) {
      fixes.push_back("lower trainer.micro_batch_size (now " + std::to_string(r.micro_batch_size) +
                      ") and raise trainer.gradient_accumulation_steps to keep the global batch: even a "
                      "micro-batch of 1 is estimated not to fit, so the model's persistent state must shrink too");
    } else if (r.micro_batch_size <= 1) {
      fixes.push_back(
          "trainer.micro_batch_size is already 1: the model and its optimizer state leave no room for "
          "one sample's activations on this device");
    }
    if (r.precision_mode == "fp32")
      fixes.push_back("precision.mode=bf16 (now fp32) stores activations in half the bytes");
    if (r.pool_fixed && r.device_free_bytes && *r.device_free_bytes >= r.request_bytes &&
        !mentions("mla.global_pool_gb"))
      fixes.push_back("raise mla.global_pool_gb (now " +
                      format_bytes(static_cast<uint64_t>(r.global_pool_gb * (1 << 30))) + "): the device still has " +
                      format_bytes(*r.device_free_bytes) + " free");
  }
  if (!r.fallback_cudamalloc && r.device_free_bytes && *r.device_free_bytes >= r.request_bytes)
    fixes.push_back("or mla.fallback_cudamalloc=true serves such requests with plain cudaMalloc (with a warning)");
  if (fixes.empty()) {
    o << " No key of this run would make it fit.";
    return o.str();
  }
  o << " To fit: ";
  for (size_t i = 0; i < fixes.size(); ++i) o << (i ? "; " : "") << fixes[i];
  o << ".";
  return o.str();
}

}  // namespace loongforge::mla
