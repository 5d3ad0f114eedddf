// Proves the writer's promises: replacing a checkpoint of the same step never
// leaves the step without a complete checkpoint (a reader watches while it is
// replaced, with RENAME_EXCHANGE), the fallback for file systems without it
// survives a crash at its one unsafe moment, keep_last prunes the oldest, and
// a failed write is reported by take_results without harming the checkpoints
// already written or leaving a temporary behind.
#include <dirent.h>  // opendir
#include <stdlib.h>  // setenv, unsetenv
#include <unistd.h>  // getpid

#include <algorithm>  // std::min
#include <atomic>   // std::atomic
#include <chrono>   // std::chrono::milliseconds
#include <cstdio>   // std::snprintf
#include <fstream>  // std::ifstream
#include <sstream>  // std::istringstream
#include <string>
#include <thread>  // std::thread
#include <vector>

#include <ATen/ATen.h>  // at::zeros

#include "catch_compat.hpp"
#include "loongforge/checkpoint/checkpoint.hpp"
#include "loongforge/common/files.hpp"
#include "loongforge/common/threads.hpp"
#include "snapshots.hpp"

using namespace loongforge;
using namespace loongforge::checkpoint;
using lf_catch::Contains;

namespace {

// Sets an environment variable for one scope (the writer's test hooks).
struct ScopedEnv {
  std::string name;
  ScopedEnv(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// Entries of `dir` that are not checkpoints: temporaries and old copies.
std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (name[0] == '.' || name.find(".replaced") != std::string::npos) out.push_back(name);
  }
  ::closedir(d);
  return out;
}

// Nice values of this process's threads whose name starts with `prefix` (/proc/self/task).
std::vector<int> nice_of_threads(const std::string& prefix) {
  std::vector<int> out;
  DIR* d = ::opendir("/proc/self/task");
  while (dirent* e = ::readdir(d)) {
    const std::string tid = e->d_name;
    if (tid[0] == '.') continue;
    std::string comm;
    std::getline(std::ifstream("/proc/self/task/" + tid + "/comm"), comm);
    if (comm.rfind(prefix, 0) != 0) continue;
    std::string stat;
    std::getline(std::ifstream("/proc/self/task/" + tid + "/stat"), stat);
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));  // after "pid (comm) "
    std::string f;
    for (int i = 3; i <= 19 && fields >> f; ++i) {  // field 19 of stat(5) is the nice value
    }
    out.push_back(std::stoi(f));
  }
  ::closedir(d);
  return out;
}

}  // namespace

TEST_CASE("checkpoint: the writer and its file threads run nicer than the data path, so a write never takes its core") {
  lf_test::ScratchDir parent;
  const ScopedEnv slow("LOONGFORGE_TEST_CHECKPOINT_DELAY_MS", "300");  // each file waits: the threads are alive
  Writer writer(parent.path, /*keep_last=*/3, /*async=*/true);
  writer.submit(lf_test::make_snapshot(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const std::vector<int> writer_nice = nice_of_threads("lf-ckpt-writer");
  const std::vector<int> file_nice = nice_of_threads("lf-ckpt-file");
  writer.wait();
  const int base = nice_of_threads("")[0];  // the main thread's (the first task)
  const int want = std::min(19, base + kCheckpointThreadNice);
  REQUIRE(kCheckpointThreadNice > kDataThreadNice);
  REQUIRE(writer_nice == std::vector<int>{want});
  REQUIRE_FALSE(file_nice.empty());
  for (const int n : file_nice) REQUIRE(n == want);
  REQUIRE(validate_checkpoint(parent.path + "/epoch_0_step_5").ok());
}

TEST_CASE("checkpoint: replacing a checkpoint of the same step never leaves the step without one") {
  lf_test::ScratchDir parent;
  const std::string final_path = parent.path + "/epoch_0_step_5";
  Writer writer(parent.path, /*keep_last=*/3, /*async=*/true);
  writer.submit(lf_test::make_snapshot(5, 0.0f));
  writer.wait();
  REQUIRE(validate_checkpoint(final_path).ok());

  // The delay hook sleeps before each file and between the steps of a
  // replacement, so the watcher gets many looks at every moment of it.
  ScopedEnv delay("LOONGFORGE_TEST_CHECKPOINT_DELAY_MS", "15");
  std::atomic<bool> done{false};
  std::atomic<long> looks{0}, misses{0};
  std::string first_miss;
  std::thread watcher([&] {
    while (!done.load()) {
      // One open per look: whichever directory is at the path, its manifest
      // must be there, parse and name step 5.
      std::ifstream in(final_path + "/MANIFEST.json");
      bool seen = false;
      if (in) {
        try {
          nlohmann::json j;
          in >> j;
          seen = Manifest::from_json(j).step == 5;
        } catch (const std::exception&) {
        }
      }
      if (!seen && misses++ == 0) first_miss = "look " + std::to_string(looks.load());
      ++looks;
    }
  });
  constexpr int kReplacements = 6;
  for (int i = 1; i <= kReplacements; ++i) {
    writer.submit(lf_test::make_snapshot(5, static_cast<float>(i)));
    writer.wait();
    REQUIRE(lf_test::mark_of(final_path) == static_cast<float>(i));  // the new one is in place
  }
  done = true;
  watcher.join();
  INFO("first miss at " << first_miss);
  REQUIRE(misses.load() == 0);
  REQUIRE(looks.load() > 100);  // the watcher really watched
  const auto results = writer.take_results();
  REQUIRE(results.size() == kReplacements + 1);
  for (const auto& r : results) REQUIRE(r.error.empty());
  REQUIRE(validate_checkpoint(final_path).ok());
  REQUIRE(list_checkpoints(parent.path) == std::vector<std::string>{final_path});
  REQUIRE(leftovers(parent.path).empty());  // the old copies are gone
}

TEST_CASE("checkpoint: without RENAME_EXCHANGE a replacement still ends with the new checkpoint and nothing else") {
  ScopedEnv no_exchange("LOONGFORGE_TEST_CHECKPOINT_NO_EXCHANGE", "1");
  lf_test::ScratchDir parent;
  const std::string final_path = parent.path + "/epoch_0_step_5";
  Writer writer(parent.path, /*keep_last=*/3, /*async=*/false);
  writer.submit(lf_test::make_snapshot(5, 1.0f));
  writer.submit(lf_test::make_snapshot(5, 2.0f));
  for (const auto& r : writer.take_results()) REQUIRE(r.error.empty());
  REQUIRE(validate_checkpoint(final_path).ok());
  REQUIRE(lf_test::mark_of(final_path) == 2.0f);
  REQUIRE(leftovers(parent.path).empty());
}

TEST_CASE("checkpoint: a replacement cut short between its renames loses nothing and is finished at the next start") {
  lf_test::ScratchDir parent;
  const std::string s3 = write_checkpoint_dir(parent.path, lf_test::make_snapshot(3)).path;
  const std::string s5 = write_checkpoint_dir(parent.path, lf_test::make_snapshot(5, 1.0f)).path;
  // The crash left the old copy aside and the new one not yet in place.
  rename_path(s5, s5 + ".replaced");
  REQUIRE(list_checkpoints(parent.path) == std::vector<std::string>{s5 + ".replaced", s3});
  REQUIRE(find_latest(parent.path) == s5 + ".replaced");

  { Writer writer(parent.path, 3, false); }  // start-up recovery
  REQUIRE(find_latest(parent.path) == s5);
  REQUIRE(lf_test::mark_of(s5) == 1.0f);
  REQUIRE(leftovers(parent.path).empty());

  // A crash after the new one was in place: the old copy beside it is dropped
  // (never listed), and the new one stays.
  copy_tree(s5, s5 + ".replaced");
  write_checkpoint_dir(parent.path, lf_test::make_snapshot(5, 2.0f));
  REQUIRE(list_checkpoints(parent.path) == std::vector<std::string>{s5, s3});
  { Writer writer(parent.path, 3, false); }
  REQUIRE(lf_test::mark_of(s5) == 2.0f);
  REQUIRE(leftovers(parent.path).empty());

  // A temporary of a dead process (pid 0x7fffffff never runs) is removed; a live one's is kept.
  make_dirs(parent.path + "/.epoch_0_step_9.tmp-2147483647");
  make_dirs(parent.path + "/.epoch_0_step_9.tmp-" + std::to_string(::getpid()));
  recover_interrupted_writes(parent.path);
  REQUIRE_FALSE(path_exists(parent.path + "/.epoch_0_step_9.tmp-2147483647"));
  REQUIRE(path_exists(parent.path + "/.epoch_0_step_9.tmp-" + std::to_string(::getpid())));
}

TEST_CASE("checkpoint: keep_last keeps the newest checkpoints and removes the older ones") {
  lf_test::ScratchDir parent;
  Writer writer(parent.path, /*keep_last=*/2, /*async=*/true);
  for (int64_t step : {10, 20, 30, 40}) writer.submit(lf_test::make_snapshot(step));
  writer.wait();
  const auto results = writer.take_results();
  REQUIRE(results.size() == 4);
  REQUIRE(results[3].path == parent.path + "/epoch_0_step_40");
  REQUIRE(results[3].step == 40);
  REQUIRE(results[3].bytes > 0);
  REQUIRE(list_checkpoints(parent.path) ==
          std::vector<std::string>{parent.path + "/epoch_0_step_40", parent.path + "/epoch_0_step_30"});
}

TEST_CASE("checkpoint: a failed write is reported by take_results and leaves earlier checkpoints intact") {
  lf_test::ScratchDir parent;
  Writer writer(parent.path, /*keep_last=*/1, /*async=*/true);
  writer.submit(lf_test::make_snapshot(10));
  auto bad = lf_test::make_snapshot(20);
  bad.tensor_files["model.safetensors"].emplace_back("broken", at::zeros({2}, at::kComplexFloat));
  writer.submit(std::move(bad));
  writer.wait();
  const auto results = writer.take_results();
  REQUIRE(results.size() == 2);
  REQUIRE(results[0].error.empty());
  REQUIRE(results[1].path == parent.path + "/epoch_0_step_20");
  REQUIRE_THAT(results[1].error, Contains("tensor 'broken' has a dtype safetensors cannot store"));
  REQUIRE(writer.take_results().empty());  // taken once
  // keep_last=1 pruned nothing for the failed write; step 10 is whole, nothing half-written is left.
  REQUIRE(find_latest(parent.path) == parent.path + "/epoch_0_step_10");
  REQUIRE_FALSE(path_exists(parent.path + "/epoch_0_step_20"));
  REQUIRE(leftovers(parent.path).empty());
}

namespace {
// Rank `rank`'s shard of step `step`, written as a peer (Note [Peer files]) into `parent`.
void write_peer_shard(const std::string& parent, int64_t step, int64_t rank) {
  Snapshot s;
  s.name = "epoch_0_step_" + std::to_string(step);
  s.peer = true;
  s.manifest.step = step;
  char rel[64];
  std::snprintf(rel, sizeof rel, "optimizer/rank_%05lld.safetensors", static_cast<long long>(rank));
  s.tensor_files[rel] = {{"layer.weight.exp_avg", at::full({4, 3}, static_cast<float>(rank))}};
  Writer peer(parent, /*keep_last=*/0, /*async=*/false, /*leader=*/false);
  peer.submit(std::move(s));
  REQUIRE(peer.take_results().at(0).error.empty());
}
}  // namespace

TEST_CASE("checkpoint: a write waiting for a lost rank's shard fails at once when the rank is declared lost") {
  lf_test::ScratchDir parent;
  Writer writer(parent.path, /*keep_last=*/5, /*async=*/true);
  auto s = lf_test::make_snapshot(9);
  s.peer_files = {"optimizer/rank_00001.safetensors", "optimizer/rank_00002.safetensors"};  // peer_timeout_s: 600
  write_peer_shard(parent.path, 9, 1);  // rank 2's never comes
  writer.submit(std::move(s));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the writer is waiting for rank 2's file
  const auto t0 = std::chrono::steady_clock::now();
  writer.peers_lost({"optimizer/rank_00002.safetensors"}, "rank(s) 2 were lost");
  writer.wait();
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  const auto results = writer.take_results();
  REQUIRE(results.size() == 1);
  REQUIRE_THAT(results[0].error, Contains("will not arrive: rank(s) 2 were lost"));
  REQUIRE(results[0].abandoned);
  REQUIRE(list_checkpoints(parent.path).empty());
  // The next checkpoint, with every shard, is written as usual: the declaration held for that write only.
  auto next = lf_test::make_snapshot(12);
  next.peer_files = {"optimizer/rank_00001.safetensors", "optimizer/rank_00002.safetensors"};
  write_peer_shard(parent.path, 12, 1);
  write_peer_shard(parent.path, 12, 2);
  writer.submit(std::move(next));
  writer.wait();
  REQUIRE(writer.take_results().at(0).error.empty());
  REQUIRE(validate_checkpoint(parent.path + "/epoch_0_step_12").ok());
}

TEST_CASE("checkpoint: a lost rank's shard that arrived before it was lost still completes the write") {
  lf_test::ScratchDir parent;
  Writer writer(parent.path, /*keep_last=*/5, /*async=*/true);
  const ScopedEnv slow("LOONGFORGE_TEST_CHECKPOINT_DELAY_MS", "300");  // the write is still in flight below
  auto s = lf_test::make_snapshot(9);
  s.peer_files = {"optimizer/rank_00001.safetensors"};
  write_peer_shard(parent.path, 9, 1);
  writer.submit(std::move(s));
  writer.peers_lost({"optimizer/rank_00001.safetensors"}, "rank(s) 1 were lost");
  writer.wait();
  REQUIRE(writer.take_results().at(0).error.empty());
  REQUIRE(validate_checkpoint(parent.path + "/epoch_0_step_9").ok());
}
