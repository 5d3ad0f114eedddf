// Private to the checkpoint room: files written in fixed-size chunks by a pool
// of threads, hashed per chunk, from a bounded ring of host staging buffers
// (Note [Chunked writes] in chunks.cpp; Note [Bounded staging] in writer.cpp).
#pragma once

#include <atomic>              // std::atomic
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // size_t
#include <cstdint>             // uint64_t
#include <deque>               // std::deque
#include <functional>          // std::function
#include <map>                 // std::map
#include <memory>              // std::shared_ptr, std::enable_shared_from_this
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread
#include <vector>              // std::vector

#include <ATen/core/Tensor.h>  // at::Tensor

#include "loongforge/checkpoint/checkpoint.hpp"

namespace loongforge::checkpoint::detail {

// One file's bytes, front to back: `head` (host bytes: a safetensors file's
// length prefix and JSON header), then each tensor's bytes, which stay where
// they are (host or device) until copy() reads them.
struct FileImage {
  std::string rel;                  // path inside the checkpoint
  std::string head;
  std::vector<at::Tensor> tensors;  // contiguous, in file order
  std::vector<uint64_t> ends;       // file offset just past each tensor's bytes
  uint64_t bytes = 0;               // the file's size

  // Copies the file's bytes [offset, offset + n) to host memory at `dst`
  // (device tensors: one synchronous copy per tensor piece).
  void copy(uint64_t offset, uint64_t n, char* dst) const;
};

// The safetensors image of `tensors` (the layout write_safetensors writes).
// Throws CheckpointError for a dtype safetensors cannot store.
FileImage safetensors_image(std::string rel, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata = {});

// Host buffers of slot_bytes each (4 KiB aligned), allocated on demand up to
// bound_slots and reused by every later write.
class StagingRing {
 public:
  using Allocate = std::function<std::shared_ptr<void>(size_t)>;
  // bound_bytes == 0: no bound (as many slots as a write has chunks).
  StagingRing(uint64_t slot_bytes, uint64_t bound_bytes, Allocate allocate);
  // Allocates slots now, up to `slots` and the bound, and touches their pages
  // (safe beside acquire() on another thread).
  void reserve(uint64_t slots);
  // A free slot: one released earlier, else a new one while fewer than
  // min(bound, want) exist, else waits for release().
  char* acquire(uint64_t want);
  void release(char* slot);
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint64_t bound_slots() const { return bound_slots_; }  // 0: none
  uint64_t allocated_bytes() const;

 private:
  std::shared_ptr<void> allocate_slot(uint64_t held_slots) const;  // throws CheckpointError naming the key
  void allocate_one_locked();
  const uint64_t slot_bytes_, bound_slots_;
  Allocate allocate_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<void>> owned_;
  std::vector<char*> free_;
  uint64_t pending_ = 0;  // slots reserve() is preparing outside the lock
};

// Threads that run posted tasks in order of posting ("lf-ckpt-file", at
// kCheckpointThreadNice). The destructor runs what is queued, then joins.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  void post(std::function<void()> task);
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// The tensor files of one write: staged into the ring by stage() (the
// caller's thread) and hashed and written by the pool, chunk by chunk.
class ChunkedFiles : public std::enable_shared_from_this<ChunkedFiles> {
 public:
  // `paths[i]` is where images[i] is written. Nothing is opened yet.
  // crc_only: each chunk gets a CRC-32 instead of a SHA-256 (Note [Preemption saves] in writer.cpp).
  ChunkedFiles(std::vector<FileImage> images, std::vector<std::string> paths, uint64_t chunk_bytes, bool direct_io,
               bool crc_only = false);
  ~ChunkedFiles();
  ChunkedFiles(const ChunkedFiles&) = delete;
  ChunkedFiles& operator=(const ChunkedFiles&) = delete;

  // Creates every file (throws CheckpointError naming it).
  void open();
  // Copies chunk after chunk into ring slots, each posted to `pool` to be
  // hashed and written; returns once the last is staged (or the write
  // failed). The images' tensors are released before it returns.
  void stage(StagingRing& ring, WorkerPool& pool);
  // True once every staged chunk is done and each complete file is synced,
  // waiting at most `seconds`.
  bool wait_for(double seconds);

  std::string error() const;  // the first failure; empty while none
  size_t size() const { return files_.size(); }
  const std::string& rel(size_t i) const { return files_[i].rel; }
  FileEntry entry(size_t i) const;  // after wait_for() returned true without an error
  uint64_t chunks() const { return chunks_; }
  uint64_t bytes() const { return bytes_; }
  uint64_t bytes_staged() const { return staged_.load(); }
  uint64_t bytes_written() const { return written_.load(); }

 private:
  struct File {
    std::string rel, path;
    FileImage image;
    uint64_t chunks = 0;
    int fd = -1, fd_direct = -1;  // fd_direct: O_DIRECT, -1 where the file system refuses it
    std::vector<std::string> chunk_sha256;
    std::vector<uint32_t> chunk_crc32;
    std::atomic<uint64_t> done{0};
  };
  void write_chunk(size_t f, uint64_t k, char* slot, StagingRing& ring);
  void fail(const std::string& message);
  bool failed() const { return failed_.load(); }

  std::deque<File> files_;  // deque: File holds an atomic (not movable)
  const uint64_t chunk_bytes_;
  const bool direct_io_, crc_only_;
  uint64_t chunks_ = 0, bytes_ = 0;
  std::atomic<uint64_t> staged_{0}, written_{0};
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string error_;
  uint64_t in_flight_ = 0;
  bool staging_done_ = false;
};

// Test hook (io.hpp's family): LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS
// sleeps this long before each chunk is written, so a test can make a write
// slow (progress lines) or kill a process inside a chunked write.
void test_chunk_delay();

}  // namespace loongforge::checkpoint::detail
