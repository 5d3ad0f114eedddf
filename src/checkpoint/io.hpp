// Private to the checkpoint room: synced file writes (POSIX), checkpoint names, test hooks.
#pragma once

#include <cstddef>     // size_t
#include <cstdint>     // int64_t
#include <functional>  // std::function
#include <string>      // std::string

namespace loongforge::checkpoint::detail {

// Note [Replacing a checkpoint] (writer.cpp): while `<name>` is absent,
// `<name>.replaced` is the checkpoint of its step.
constexpr const char* kReplacedSuffix = ".replaced";

// "epoch_3_step_120" -> 120; -1 when the name is not a checkpoint's.
int64_t step_of(const std::string& name);

// Test hooks (read at every call, so a test may set them at any time):
// LOONGFORGE_TEST_CHECKPOINT_DELAY_MS sleeps this long before each file of a
// checkpoint is written and between the steps that replace an existing
// checkpoint of the same step, so crash tests can land inside a write and
// readers can watch a replacement; LOONGFORGE_TEST_CHECKPOINT_NO_EXCHANGE=1
// makes the writer act as on a file system that refuses RENAME_EXCHANGE.
void test_delay();
bool test_no_exchange();

void write_all(int fd, const void* data, size_t bytes, const std::string& path);
// Creates/truncates `path`, runs `fill(fd)`, fsyncs, closes. Throws CheckpointError.
void write_file_synced(const std::string& path, const std::function<void(int)>& fill);
// Returns the SHA-256 of `text`.
std::string write_text_synced(const std::string& path, const std::string& text);

}  // namespace loongforge::checkpoint::detail
