// StagedLoad (loongforge/model/staged_load.hpp, Note [Staged model load]):
// - without a GPU it stages nothing, leaves the CPU allocator as it was, and
//   a load goes as torch::jit::load alone (test_staged_load, label cpu);
// - onto a GPU every record of at least 1 MiB passes through the one pinned
//   slab, sized for the largest record, and the loaded tensors equal those of
//   a plain load bit for bit; afterwards the CPU allocator is the one before
//   (test_staged_load_gpu, label gpu: the same file built with
//   LOONGFORGE_TEST_ON_GPU).
#include <fstream>  // std::ofstream
#include <string>   // std::string

#include <c10/core/CPUAllocator.h>  // c10::GetCPUAllocator
#include <torch/script.h>           // torch::jit::Module, torch::jit::load

#include "catch_compat.hpp"
#include "loongforge/model/staged_load.hpp"

using namespace loongforge;

namespace {

// A TorchScript file with records of 3, 5 and 8 MiB, two of 8 MiB, and a small one.
std::string write_module(const std::string& name) {
  torch::jit::Module m("m");
  at::manual_seed(0);
  const int64_t mib = (1 << 20) / 4;  // float elements per MiB
  int i = 0;
  for (const int64_t n : {3 * mib, 5 * mib, 8 * mib, 8 * mib, int64_t{25}})
    m.register_parameter("p" + std::to_string(i++), at::randn({n}), false);
  const std::string path = std::string(LOONGFORGE_TEST_MODELS) + "/" + name;
  m.save(path);
  return path;
}

}  // namespace

#if LOONGFORGE_TEST_ON_GPU
TEST_CASE("a model loaded onto a GPU through the pinned slab holds the same tensors as a plain load") {
  const std::string path = write_module("staged-gpu.pt");
  c10::Allocator* before = c10::GetCPUAllocator();
  const torch::jit::Module plain = torch::jit::load(path, c10::Device(c10::kCUDA));
  model::StagedLoad::Counts counts;
  torch::jit::Module staged;
  {
    model::StagedLoad load(path);
    REQUIRE(c10::GetCPUAllocator() != before);  // installed for the load
    staged = torch::jit::load(path, c10::Device(c10::kCUDA));
    counts = load.counts();
  }
  REQUIRE(c10::GetCPUAllocator() == before);
  CHECK(counts.slab_bytes == 8 << 20);
  CHECK(counts.staged == 4);  // every record of at least 1 MiB, one after the other
  const auto a = plain.named_parameters(), b = staged.named_parameters();
  REQUIRE(a.size() == b.size());
  auto ib = b.begin();
  for (const auto& p : a) {
    const auto& q = *ib++;
    CAPTURE(p.name);
    REQUIRE(p.name == q.name);
    REQUIRE(q.value.is_cuda());
    REQUIRE(p.value.equal(q.value));
  }
}
#else
TEST_CASE("without a GPU a staged load stages nothing and leaves the CPU allocator as it was") {
  const std::string path = write_module("staged-cpu.pt");
  c10::Allocator* before = c10::GetCPUAllocator();
  const torch::jit::Module plain = torch::jit::load(path);
  torch::jit::Module loaded;
  {
    model::StagedLoad load(path);  // the host allocator for CUDA refuses: logged, nothing staged
    REQUIRE(c10::GetCPUAllocator() == before);
    loaded = torch::jit::load(path);
    CHECK(load.counts().staged == 0);
    CHECK(load.counts().slab_bytes == 0);
  }
  REQUIRE(c10::GetCPUAllocator() == before);
  for (const auto& p : plain.named_parameters()) REQUIRE(p.value.equal(loaded.attr(p.name).toTensor()));
}

TEST_CASE("a staged load of a file that is not an archive stages nothing and lets torch::jit::load say why") {
  const std::string path = std::string(LOONGFORGE_TEST_MODELS) + "/staged-garbage.pt";
  std::ofstream(path) << "not a zip archive";
  c10::Allocator* before = c10::GetCPUAllocator();
  model::StagedLoad load(path);
  REQUIRE(c10::GetCPUAllocator() == before);
  CHECK(load.counts().staged == 0);
  REQUIRE_THROWS(torch::jit::load(path));
}
#endif
