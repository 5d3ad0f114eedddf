// Proves the memory seam's lifetime marks (memory/memory.hpp): a
// LifetimeScope sets what this thread's allocations live for, scopes nest and
// restore, another thread keeps its own (kOther); and that without a reporter
// (MLA off) stats() on the CPU names the host allocator and has no detail.
#include <thread>  // std::thread

#include "catch_compat.hpp"
#include "loongforge/memory/memory.hpp"

using namespace loongforge::memory;

TEST_CASE("memory: lifetime scopes nest, restore, and belong to their thread") {
  REQUIRE(current_lifetime() == Lifetime::kOther);
  {
    LifetimeScope whole_run(Lifetime::kPersistent);
    REQUIRE(current_lifetime() == Lifetime::kPersistent);
    Lifetime seen_elsewhere = Lifetime::kPersistent;
    std::thread([&] { seen_elsewhere = current_lifetime(); }).join();
    REQUIRE(seen_elsewhere == Lifetime::kOther);
    {
      LifetimeScope step(Lifetime::kActivation);
      REQUIRE(current_lifetime() == Lifetime::kActivation);
    }
    REQUIRE(current_lifetime() == Lifetime::kPersistent);
  }
  REQUIRE(current_lifetime() == Lifetime::kOther);
}

TEST_CASE("memory: without a reporter the CPU's stats name the host allocator and carry no detail") {
  step_done(1);  // no reporter: nothing to tell
  const Stats s = stats(c10::Device(c10::kCPU));
  REQUIRE(s.allocator == "host malloc");
  REQUIRE(s.peak_host_mb > 0);
  REQUIRE(s.detail.is_null());
  REQUIRE(s.scalars.empty());
  REQUIRE_FALSE(to_json(s).contains("detail"));
}
