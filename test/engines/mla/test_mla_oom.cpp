// Proves MLA's out-of-memory message (include/loongforge/engines/mla/oom.hpp)
// names the request, the refusing pool's use, free bytes and largest free
// block, what the persistent arena holds by label, and the keys that would
// make it fit: a smaller trainer.micro_batch_size that divides the samples per
// optimizer step, with the trainer.gradient_accumulation_steps that keeps them;
// precision.mode=bf16 for an fp32 run; mla.global_pool_gb for a fixed pool the
// device has room to grow; mla.fallback_cudamalloc; and for a persistent
// request, no batch key but the sharded optimizer.
#include <string>  // std::string

#include "catch_compat.hpp"
#include "loongforge/engines/mla/oom.hpp"

using namespace loongforge::mla;
using lf_catch::Contains;

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// An 80 GB-class device: 40 GiB persistent, an activation pool of 30 GiB
// with 28 GiB in use and 2 GiB free (1.5 GiB in one block), asked for 6 GiB.
OomReport activation_report() {
  OomReport r;
  r.request_bytes = 6 * kGiB;
  r.category = Category::kActivation;
  r.pool_name = "activation pool";
  r.pool.reserved_bytes = 30 * kGiB;
  r.pool.in_use_bytes = 28 * kGiB;
  r.pool.free_bytes = 2 * kGiB;
  r.pool.largest_free_bytes = 3 * kGiB / 2;
  r.pool_fixed = true;
  r.global_pool_gb = 30;
  r.in_use_by_category = {40 * kGiB, 28 * kGiB, kGiB};
  r.persistent_by_label = {{"weights", 10 * kGiB}, {"optimizer state", 20 * kGiB}, {"gradients", 10 * kGiB}};
  r.device_free_bytes = kGiB / 2;
  r.device_total_bytes = 80 * kGiB;
  r.micro_batch_size = 16;
  r.gradient_accumulation_steps = 1;
  r.precision_mode = "bf16";
  return r;
}

}  // namespace

TEST_CASE("mla oom: the message names the request, the pool, its largest free block and the persistent arena") {
  const std::string m = explain_out_of_memory(activation_report());
  REQUIRE_THAT(m, Contains("MLA: out of memory: a request of 6.00 GiB (activation) does not fit in the "
                           "activation pool: 30.00 GiB reserved, 28.00 GiB in use, 2.00 GiB free, largest free "
                           "block 1.50 GiB (fragmentation 25.0%)"));
  REQUIRE_THAT(m, Contains("the device has 512.0 MiB free of 80.00 GiB"));
  REQUIRE_THAT(m, Contains("In use by category: persistent 40.00 GiB (weights 10.00 GiB, optimizer state 20.00 GiB, "
                           "gradients 10.00 GiB), activation 28.00 GiB, other 1.00 GiB."));
}

TEST_CASE("mla oom: the proposed micro-batch divides the samples per step and its estimated activations fit") {
  OomReport r = activation_report();
  // Demand 28 + 6 = 34 GiB, 1.5 GiB available: 4.5 GiB short, so at most
  // 16 x 29.5 / 34 = 13.9 samples; 8 is the largest divisor of 16 below it.
  REQUIRE(proposed_micro_batch(r) == 8);
  REQUIRE_THAT(explain_out_of_memory(r),
               Contains("lower trainer.micro_batch_size (now 16) to 8 and set trainer.gradient_accumulation_steps "
                        "(now 1) to 2 to keep 16 samples per rank per optimizer step"));
  r.micro_batch_size = 12;
  r.gradient_accumulation_steps = 2;  // 24 samples per step: 12 x 29.5 / 34 = 10.4 -> 8 (divides 24)
  REQUIRE(proposed_micro_batch(r) == 8);
  REQUIRE_THAT(explain_out_of_memory(r), Contains("to 8 and set trainer.gradient_accumulation_steps (now 2) to 3"));
  r.micro_batch_size = 1;
  REQUIRE(proposed_micro_batch(r) == 0);
  REQUIRE_THAT(explain_out_of_memory(r), Contains("trainer.micro_batch_size is already 1"));
}

TEST_CASE("mla oom: an fp32 run is told bf16, and a fixed pool on a device with room is told mla.global_pool_gb") {
  OomReport r = activation_report();
  REQUIRE_THAT(explain_out_of_memory(r), !Contains("precision.mode"));
  r.precision_mode = "fp32";
  REQUIRE_THAT(explain_out_of_memory(r), Contains("precision.mode=bf16 (now fp32)"));
  REQUIRE_THAT(explain_out_of_memory(r), !Contains("mla.global_pool_gb"));  // the device has 0.5 GiB only
  r.device_free_bytes = 20 * kGiB;
  const std::string m = explain_out_of_memory(r);
  REQUIRE_THAT(m, Contains("raise mla.global_pool_gb (now 30.00 GiB): the device still has 20.00 GiB free"));
  REQUIRE_THAT(m, Contains("mla.fallback_cudamalloc=true"));
  r.fallback_cudamalloc = true;
  REQUIRE_THAT(explain_out_of_memory(r), !Contains("mla.fallback_cudamalloc"));
}

TEST_CASE("mla oom: a persistent request is not told to change the batch") {
  OomReport r = activation_report();
  r.category = Category::kPersistent;
  r.pool_name = "persistent arena";
  const std::string m = explain_out_of_memory(r);
  REQUIRE(proposed_micro_batch(r) == 0);
  REQUIRE_THAT(m, !Contains("trainer.micro_batch_size"));
  REQUIRE_THAT(m, Contains("gcts.shard_optimizer=true"));
}

TEST_CASE("mla oom: bytes are formatted in the largest whole unit") {
  REQUIRE(format_bytes(100) == "100 B");
  REQUIRE(format_bytes(4096) == "4.0 KiB");
  REQUIRE(format_bytes(3 * (uint64_t{1} << 19)) == "1.5 MiB");
  REQUIRE(format_bytes(3 * kGiB / 2) == "1.50 GiB");
}
