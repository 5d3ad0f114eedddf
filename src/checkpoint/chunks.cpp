// Chunked, parallel, hashed file writes from a bounded staging ring (chunks.hpp).
#include "chunks.hpp"

#include <fcntl.h>   // open, O_DIRECT
#include <unistd.h>  // pwrite, fsync, close

#include <algorithm>  // std::min, std::upper_bound
#include <cerrno>     // errno
#include <chrono>     // std::chrono::milliseconds
#include <cstdlib>    // std::aligned_alloc, std::getenv
#include <cstring>    // std::memcpy, std::strerror

#include <zlib.h>  // crc32

#include <ATen/ATen.h>        // at::from_blob
#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "io.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/sha256.hpp"
#include "loongforge/common/threads.hpp"

namespace loongforge::checkpoint::detail {

// Note [Chunked writes]
// A checkpoint's tensor files are most of its bytes (3B full fine-tuning:
// 37.7 GB of fp32 weights and AdamW moments). One thread hashing and writing
// each file front to back ran at 0.22 GB/s on the GPU host, about what the
// built-in SHA-256 hashes on one core (0.2 GB/s on the CPU development
// machine, docs/benchmarks.md 2026-12-05): the hash, not the storage, was
// the likely limit.
// So every tensor file is cut into chunks of chunk_bytes (checkpoint.chunk_mb,
// the last one shorter) and:
//  1. the caller's thread copies chunk after chunk of the file's image (its
//     safetensors header, then the tensors' bytes, from wherever they live)
//     into a free slot of the staging ring (Note [Bounded staging] in
//     writer.cpp) and posts it to the pool;
//  2. a pool thread hashes the slot (SHA-256 of that chunk alone, so chunks
//     are hashed in parallel) and writes it with pwrite at its offset,
//     straight from the slot: with O_DIRECT (checkpoint.direct_io) a full
//     chunk goes from the slot to the device with no copy through the page
//     cache; without it (tmpfs before Linux 6.6 refuses O_DIRECT; the last, shorter chunk of
//     a file) it is hashed and written 1 MiB at a time, so the write copies
//     bytes the hash has just brought into the cache;
//  3. the thread that finishes a file's last chunk fsyncs and closes it, then
//     the slot goes back to the ring.
// The manifest lists each chunk's SHA-256 (FileEntry), so validation reads
// and hashes chunks in parallel too (inspect.cpp), and `sha256sum` still
// checks a file of one chunk. Files are created at their final size first,
// so chunks may land in any order. Nothing here decides whether the write is
// complete: the writer publishes the directory only after every file is
// synced and the manifest written (Note [Replacing a checkpoint]).

namespace {

constexpr uint64_t kPiece = 1ull << 20;  // buffered writes: hash then write this much at a time
constexpr uint64_t kDirectAlign = 4096;  // O_DIRECT: address, offset and length multiple of this

const char* st_dtype_name(at::ScalarType t, const std::string& name) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    case at::kLong: return "I64";
    case at::kInt: return "I32";
    case at::kByte: return "U8";
    case at::kBool: return "BOOL";
    default: throw CheckpointError("tensor '" + name + "' has a dtype safetensors cannot store");
  }
}

// Writes all `n` bytes at `offset`; returns 0, or the errno that stopped it.
int pwrite_all(int fd, const char* p, uint64_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w, n -= static_cast<uint64_t>(w), offset += static_cast<uint64_t>(w);
  }
  return 0;
}

[[noreturn]] void write_failed(const std::string& path, int err) {
  throw CheckpointError("cannot write '" + path + "': " + std::strerror(err));
}

long env_ms(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atol(v) : 0L;
}

}  // namespace

void test_chunk_delay() {
  const long ms = env_ms("LOONGFORGE_TEST_CHECKPOINT_CHUNK_DELAY_MS");
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---------------------------------------------------------------------------
// File images

FileImage safetensors_image(std::string rel, const NamedTensors& tensors,
                            const std::map<std::string, std::string>& metadata) {
  FileImage f;
  f.rel = std::move(rel);
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().contiguous();  // stays on its device
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", st_dtype_name(c.scalar_type(), name)},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    f.tensors.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  const uint64_t n = h.size();
  f.head.assign(reinterpret_cast<const char*>(&n), 8);  // little-endian length (x86, aarch64)
  f.head += h;
  uint64_t end = f.head.size();
  for (const auto& c : f.tensors) {
    end += static_cast<uint64_t>(c.numel()) * c.element_size();
    f.ends.push_back(end);
  }
  f.bytes = end;
  return f;
}

void FileImage::copy(uint64_t offset, uint64_t n, char* dst) const {
  const uint64_t end = offset + n;
  uint64_t pos = offset;
  if (pos < head.size()) {
    const uint64_t m = std::min<uint64_t>(end, head.size()) - pos;
    std::memcpy(dst, head.data() + pos, m);
    dst += m, pos += m;
  }
  // The first tensor whose bytes end past `pos` (empty tensors are skipped).
  size_t i = static_cast<size_t>(std::upper_bound(ends.begin(), ends.end(), pos) - ends.begin());
  for (; pos < end && i < tensors.size(); ++i) {
    const uint64_t start = i == 0 ? head.size() : ends[i - 1];
    const uint64_t m = std::min(end, ends[i]) - pos;
    const at::Tensor& t = tensors[i];
    const uint64_t from = pos - start;
    if (t.is_cpu()) {
      std::memcpy(dst, static_cast<const char*>(t.data_ptr()) + from, m);
    } else {
      const int64_t total = static_cast<int64_t>(ends[i] - start);
      at::Tensor src = at::from_blob(t.data_ptr(), {total}, at::TensorOptions().dtype(at::kByte).device(t.device()));
      at::Tensor out = at::from_blob(dst, {static_cast<int64_t>(m)}, at::TensorOptions().dtype(at::kByte));
      out.copy_(src.slice(0, static_cast<int64_t>(from), static_cast<int64_t>(from + m)));  // synchronous
    }
    dst += m, pos += m;
  }
  if (pos != end) throw CheckpointError(rel + ": internal error: a chunk reaches past the file's end");
}

// ---------------------------------------------------------------------------
// Staging ring

StagingRing::StagingRing(uint64_t slot_bytes, uint64_t bound_bytes, Allocate allocate)
    : slot_bytes_(slot_bytes),
      bound_slots_(bound_bytes == 0 ? 0 : std::max<uint64_t>(1, bound_bytes / slot_bytes)),
      allocate_(std::move(allocate)) {
  if (!allocate_)
    allocate_ = [](size_t bytes) {
      void* p = std::aligned_alloc(kDirectAlign, (bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
      return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
    };
}

namespace {
std::string mib_or_kib(uint64_t bytes) {
  return bytes >= (1u << 20) && bytes % (1u << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                                        : std::to_string(bytes >> 10) + " KiB";
}
}  // namespace

std::shared_ptr<void> StagingRing::allocate_slot(uint64_t held_slots) const {
  const std::string what = "cannot allocate " + mib_or_kib(slot_bytes_) + " of checkpoint staging (" +
                           mib_or_kib(held_slots * slot_bytes_) + " held)";
  std::shared_ptr<void> p;
  try {
    p = allocate_(slot_bytes_);
  } catch (const std::exception& e) {
    throw CheckpointError(what + ": " + e.what() + "; lower checkpoint.staging_mb");
  }
  if (!p) throw CheckpointError(what + "; lower checkpoint.staging_mb");
  return p;
}

void StagingRing::allocate_one_locked() {
  std::shared_ptr<void> p = allocate_slot(owned_.size());
  free_.push_back(static_cast<char*>(p.get()));
  owned_.push_back(std::move(p));
}

// Slots reserved ahead are also touched, one byte per page, before anyone can
// take them: an untouched slot's page faults would land in the first
// checkpoint's copy, that is in the training stall (on the CPU machine the
// first write of a 3.2 GB state, unbounded staging: stall 2.50 s before,
// 0.49 s after; bench_checkpoint --gb 3 --threads 2 --staging-mb 0).
// Page-locked slots (GPUs) are resident already; touching them costs little.
void StagingRing::reserve(uint64_t slots) {
  const uint64_t want = bound_slots_ ? std::min(slots, bound_slots_) : slots;
  for (;;) {
    uint64_t held = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (owned_.size() + pending_ >= want) return;
      held = owned_.size();
      ++pending_;  // counted against the bound while it is prepared outside the lock
    }
    std::shared_ptr<void> p;
    try {
      p = allocate_slot(held);
      volatile char* bytes = static_cast<char*>(p.get());
      for (uint64_t at = 0; at < slot_bytes_; at += kDirectAlign) bytes[at] = 0;  // 4 KiB pages
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      --pending_;
      free_.push_back(static_cast<char*>(p.get()));
      owned_.push_back(std::move(p));
    }
    cv_.notify_one();
  }
}

char* StagingRing::acquire(uint64_t want) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t limit = std::max<uint64_t>(1, bound_slots_ ? std::min(want, bound_slots_) : want);
  while (free_.empty()) {
    if (owned_.size() + pending_ < limit) {
      allocate_one_locked();
      break;
    }
    cv_.wait(lock);
  }
  char* slot = free_.back();
  free_.pop_back();
  return slot;
}

void StagingRing::release(char* slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
  }
  cv_.notify_one();
}

uint64_t StagingRing::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return owned_.size() * slot_bytes_;
}

// ---------------------------------------------------------------------------
// Worker pool

WorkerPool::WorkerPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i)
    threads_.emplace_back([this] {
      set_thread_name("lf-ckpt-file");
      lower_thread_priority(kCheckpointThreadNice);  // below the data path (common/threads.hpp)
      for (;;) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
          if (tasks_.empty()) return;  // stopping, nothing left
          task = std::move(tasks_.front());
          tasks_.pop_front();
        }
        task();
      }
    });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

// ---------------------------------------------------------------------------
// Chunked files

ChunkedFiles::ChunkedFiles(std::vector<FileImage> images, std::vector<std::string> paths, uint64_t chunk_bytes,
                           bool direct_io, bool crc_only)
    : chunk_bytes_(chunk_bytes), direct_io_(direct_io), crc_only_(crc_only) {
  for (size_t i = 0; i < images.size(); ++i) {
    File& f = files_.emplace_back();
    f.rel = images[i].rel;
    f.path = paths[i];
    f.image = std::move(images[i]);
    f.chunks = (f.image.bytes + chunk_bytes_ - 1) / chunk_bytes_;
    if (crc_only_)
      f.chunk_crc32.resize(f.chunks);
    else
      f.chunk_sha256.resize(f.chunks);
    chunks_ += f.chunks;
    bytes_ += f.image.bytes;
  }
}

ChunkedFiles::~ChunkedFiles() {
  for (File& f : files_) {
    if (f.fd >= 0) ::close(f.fd);
    if (f.fd_direct >= 0) ::close(f.fd_direct);
  }
}

void ChunkedFiles::open() {
  for (File& f : files_) {
    f.fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f.fd < 0) throw CheckpointError("cannot create '" + f.path + "': " + std::strerror(errno));
    // Sized first, so that chunks may land in any order (a sparse file until they do).
    if (::ftruncate(f.fd, static_cast<off_t>(f.image.bytes)) != 0)
      throw CheckpointError("cannot size '" + f.path + "': " + std::strerror(errno));
    // A second descriptor for whole chunks; some file systems (tmpfs before Linux 6.6) refuse O_DIRECT (EINVAL).
    if (direct_io_) f.fd_direct = ::open(f.path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  }
}

void ChunkedFiles::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = message;
  }
  failed_ = true;
  cv_.notify_all();
}

std::string ChunkedFiles::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void ChunkedFiles::stage(StagingRing& ring, WorkerPool& pool) {
  auto self = shared_from_this();
  for (size_t f = 0; f < files_.size() && !failed(); ++f) {
    File& file = files_[f];
    for (uint64_t k = 0; k < file.chunks && !failed(); ++k) {
      char* slot = nullptr;
      try {
        slot = ring.acquire(chunks_);
        const uint64_t off = k * chunk_bytes_;
        const uint64_t n = std::min(chunk_bytes_, file.image.bytes - off);
        file.image.copy(off, n, slot);
        staged_ += n;
      } catch (const std::exception& e) {
        if (slot) ring.release(slot);
        fail(file.path + ": staging failed: " + e.what());
        break;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++in_flight_;
      }
      pool.post([self, f, k, slot, &ring] { self->write_chunk(f, k, slot, ring); });
    }
  }
  for (File& file : files_) file.image.tensors.clear();  // the caller may change them now
  {
    std::lock_guard<std::mutex> lock(mu_);
    staging_done_ = true;
  }
  cv_.notify_all();
}

void ChunkedFiles::write_chunk(size_t f, uint64_t k, char* slot, StagingRing& ring) {
  File& file = files_[f];
  const uint64_t off = k * chunk_bytes_;
  const uint64_t n = std::min(chunk_bytes_, file.image.bytes - off);
  try {
    if (k == 0) test_delay();  // io.hpp: "before each file"
    test_chunk_delay();
    if (!failed()) {
      // A SHA-256 of the chunk, or (a preemption save) its CRC-32.
      Sha256 sha;
      uLong crc = ::crc32(0L, Z_NULL, 0);
      auto digest = [&](const char* p, uint64_t m) {
        if (!crc_only_) return sha.update(p, m);
        crc = ::crc32_z(crc, reinterpret_cast<const Bytef*>(p), static_cast<z_size_t>(m));
      };
      bool hashed = false;
      int err = EINVAL;
      if (file.fd_direct >= 0 && n % kDirectAlign == 0) {  // a whole aligned chunk: O_DIRECT, no page-cache copy
        digest(slot, n);
        hashed = true;
        err = pwrite_all(file.fd_direct, slot, n, off);
        if (err == 0) written_ += n;
      }
      // Buffered (no O_DIRECT descriptor; a file's last, shorter chunk; EINVAL: the file system wants another
      // alignment): a piece at a time, so the write copies bytes the hash has just brought into the cache.
      for (uint64_t at = 0; err == EINVAL && at < n; at += kPiece) {
        const uint64_t m = std::min(kPiece, n - at);
        if (!hashed) digest(slot + at, m);
        const int e = pwrite_all(file.fd, slot + at, m, off + at);
        if (e != 0) write_failed(file.path, e);
        written_ += m;
      }
      if (err != 0 && err != EINVAL) write_failed(file.path, err);
      if (crc_only_)
        file.chunk_crc32[k] = static_cast<uint32_t>(crc);
      else
        file.chunk_sha256[k] = sha.hex();
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  ring.release(slot);
  if (++file.done == file.chunks && !failed()) {
    try {
      if (::fsync(file.fd) != 0) throw CheckpointError("cannot fsync '" + file.path + "': " + std::strerror(errno));
    } catch (const std::exception& e) {
      fail(e.what());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    --in_flight_;
  }
  cv_.notify_all();
}

bool ChunkedFiles::wait_for(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return staging_done_ && in_flight_ == 0; });
}

FileEntry ChunkedFiles::entry(size_t i) const {
  const File& f = files_[i];
  FileEntry e;
  e.bytes = f.image.bytes;
  e.chunk_bytes = chunk_bytes_;
  e.chunk_sha256 = f.chunk_sha256;
  e.chunk_crc32 = f.chunk_crc32;
  return e;
}

}  // namespace loongforge::checkpoint::detail
