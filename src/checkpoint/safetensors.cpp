// safetensors read/write (https://github.com/huggingface/safetensors format).
#include "loongforge/checkpoint/checkpoint.hpp"

#include <fcntl.h>     // open
#include <sys/stat.h>  // mkdir
#include <unistd.h>    // fsync, close

#include <cerrno>      // errno
#include <chrono>      // std::chrono::milliseconds
#include <cstdlib>     // std::getenv
#include <thread>      // std::this_thread
#include <cstring>     // std::strerror, std::memcpy
#include <fstream>     // std::ifstream

#include <ATen/ATen.h>        // at::empty
#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "chunks.hpp"
#include "io.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/common/sha256.hpp"

namespace loongforge::checkpoint {

namespace {

at::ScalarType from_st_dtype(const std::string& s, const std::string& path) {
  if (s == "F32") return at::kFloat;
  if (s == "BF16") return at::kBFloat16;
  if (s == "F16") return at::kHalf;
  if (s == "F64") return at::kDouble;
  if (s == "I64") return at::kLong;
  if (s == "I32") return at::kInt;
  if (s == "U8") return at::kByte;
  if (s == "BOOL") return at::kBool;
  throw CheckpointError(path + ": unsupported safetensors dtype '" + s + "'");
}

}  // namespace

namespace detail {

void test_delay() {
  const char* v = std::getenv("LOONGFORGE_TEST_CHECKPOINT_DELAY_MS");
  const long ms = v ? std::atol(v) : 0L;
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

bool test_no_exchange() {
  const char* v = std::getenv("LOONGFORGE_TEST_CHECKPOINT_NO_EXCHANGE");
  return v && std::string(v) == "1";
}

void write_all(int fd, const void* data, size_t bytes, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError("cannot write '" + path + "': " + std::strerror(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void write_file_synced(const std::string& path, const std::function<void(int)>& write_chunks) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError("cannot create '" + path + "': " + std::strerror(errno));
  try {
    write_chunks(fd);
    if (::fsync(fd) != 0) throw CheckpointError("cannot fsync '" + path + "': " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::string write_text_synced(const std::string& path, const std::string& text) {
  write_file_synced(path, [&](int fd) { write_all(fd, text.data(), text.size(), path); });
  return sha256_hex(text);
}

}  // namespace detail

using detail::write_all;
using detail::write_file_synced;

std::string write_safetensors(const std::string& path, const NamedTensors& tensors,
                              const std::map<std::string, std::string>& metadata, uint64_t* bytes_out) {
  // The same bytes Writer writes in chunks (chunks.cpp), front to back on this thread.
  const detail::FileImage image = detail::safetensors_image(path, tensors, metadata);
  Sha256 sha;
  write_file_synced(path, [&](int fd) {
    auto put = [&](const void* p, size_t len) {
      write_all(fd, p, len, path);
      sha.update(p, len);
    };
    put(image.head.data(), image.head.size());
    for (const auto& t : image.tensors) {
      const at::Tensor c = t.to(at::kCPU);
      put(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
    }
  });
  if (bytes_out) *bytes_out = image.bytes;
  return sha.hex();
}

namespace {
// Reads and parses the JSON header; `data_start` receives the data offset.
nlohmann::ordered_json read_header(std::ifstream& in, const std::string& path, uint64_t* data_start) {
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || n > (1ull << 30)) throw CheckpointError(path + ": not a safetensors file (bad header length)");
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  if (!in) throw CheckpointError(path + ": truncated safetensors header");
  *data_start = 8 + n;
  try {
    return nlohmann::ordered_json::parse(h);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": corrupt safetensors header (" + e.what() + ")");
  }
}
}  // namespace

std::vector<TensorHeader> read_safetensors_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read '" + path + "'");
  uint64_t data_start = 0;
  const auto header = read_header(in, path, &data_start);
  std::vector<TensorHeader> out;
  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") continue;
      out.push_back({name, entry.at("dtype").get<std::string>(), entry.at("shape").get<std::vector<int64_t>>()});
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path + ": malformed safetensors header (" + e.what() + ")");
  }
  return out;
}

NamedTensors read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read '" + path + "'");
  uint64_t data_start = 0;
  const auto header = read_header(in, path, &data_start);
  NamedTensors out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
    at::Tensor t = at::empty(entry.at("shape").get<std::vector<int64_t>>(),
                             from_st_dtype(entry.at("dtype").get<std::string>(), path));
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (offs.size() != 2 || offs[1] - offs[0] != bytes)
      throw CheckpointError(path + ": tensor '" + name + "' has inconsistent offsets");
    in.seekg(static_cast<std::streamoff>(data_start + offs[0]));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
    if (!in) throw CheckpointError(path + ": truncated while reading tensor '" + name + "'");
    out.emplace_back(name, t);
  }
  return out;
}

}  // namespace loongforge::checkpoint
