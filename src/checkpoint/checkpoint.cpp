// safetensors read/write and atomic checkpoint directories.
#include "loongforge/checkpoint/checkpoint.hpp"

#include <fcntl.h>     // open
#include <sys/stat.h>  // mkdir
#include <unistd.h>    // fsync, close

#include <cerrno>      // errno
#include <cstring>     // std::strerror, std::memcpy
#include <fstream>     // std::ifstream

#include <ATen/ATen.h>        // at::empty
#include <nlohmann/json.hpp>  // nlohmann::ordered_json

#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"

namespace loongforge::checkpoint {

namespace {

const char* st_dtype(at::ScalarType t, const std::string& name) {
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

// Writes `chunks` to `path` and fsyncs it.
template <typename Fn>
void write_file_synced(const std::string& path, Fn&& write_chunks) {
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

}  // namespace

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", st_dtype(c.scalar_type(), name)},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(c));
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data 8-byte aligned
  write_file_synced(path, [&](int fd) {
    const uint64_t n = h.size();
    write_all(fd, &n, 8, path);
    write_all(fd, h.data(), h.size(), path);
    for (const auto& c : cpu) write_all(fd, c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size(), path);
  });
}

NamedTensors read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("cannot read '" + path + "'");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in || n > (1ull << 30)) throw CheckpointError(path + ": not a safetensors file (bad header length)");
  std::string h(n, '\0');
  in.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(h);
  } catch (const std::exception& e) {
    throw CheckpointError(path + ": corrupt safetensors header (" + e.what() + ")");
  }
  const auto data_start = static_cast<std::streamoff>(8 + n);
  NamedTensors out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const auto offs = entry.at("data_offsets").get<std::vector<uint64_t>>();
    at::Tensor t = at::empty(entry.at("shape").get<std::vector<int64_t>>(),
                             from_st_dtype(entry.at("dtype").get<std::string>(), path));
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    if (offs.size() != 2 || offs[1] - offs[0] != bytes)
      throw CheckpointError(path + ": tensor '" + name + "' has inconsistent offsets");
    in.seekg(data_start + static_cast<std::streamoff>(offs[0]));
    in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes));
    if (!in) throw CheckpointError(path + ": truncated while reading tensor '" + name + "'");
    out.emplace_back(name, t);
  }
  return out;
}

std::string write_checkpoint(const std::string& parent, const std::string& name,
                             const std::map<std::string, NamedTensors>& tensor_files,
                             const std::map<std::string, std::string>& text_files) {
  const std::string final_dir = parent + "/" + name;
  const std::string tmp_dir = parent + "/." + name + ".tmp-" + std::to_string(::getpid());
  try {
    make_dirs(parent);
    remove_tree(tmp_dir);
    make_dirs(tmp_dir);
    for (const auto& [file, tensors] : tensor_files) write_safetensors(tmp_dir + "/" + file, tensors);
    for (const auto& [file, text] : text_files)
      write_file_synced(tmp_dir + "/" + file, [&](int fd) { write_all(fd, text.data(), text.size(), file); });
    fsync_directory(tmp_dir);
    remove_tree(final_dir);
    rename_path(tmp_dir, final_dir);
    fsync_directory(parent);
  } catch (const CheckpointError&) {
    try { remove_tree(tmp_dir); } catch (...) {}
    throw;
  } catch (const Error& e) {
    try { remove_tree(tmp_dir); } catch (...) {}
    throw CheckpointError("cannot write checkpoint '" + final_dir + "': " + e.what());
  }
  return final_dir;
}

}  // namespace loongforge::checkpoint
