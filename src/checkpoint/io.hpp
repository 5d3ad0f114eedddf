// Private to the checkpoint room: synced file writes (POSIX).
#pragma once

#include <cstddef>     // size_t
#include <functional>  // std::function
#include <string>      // std::string

namespace loongforge::checkpoint::detail {

// Test hook: LOONGFORGE_TEST_CHECKPOINT_DELAY_MS sleeps this long before each
// file of a checkpoint is written, so crash tests can land inside a write.
void test_delay();

void write_all(int fd, const void* data, size_t bytes, const std::string& path);
// Creates/truncates `path`, runs `fill(fd)`, fsyncs, closes. Throws CheckpointError.
void write_file_synced(const std::string& path, const std::function<void(int)>& fill);
// Returns the SHA-256 of `text`.
std::string write_text_synced(const std::string& path, const std::string& text);

}  // namespace loongforge::checkpoint::detail
