// TensorBoard event files (tensorboard.hpp): TFRecord framing and a
// hand-written encoder for the three protobuf messages we need.
//
// Note [Event encoding]
// tensorflow.Event: wall_time = 1 (double), step = 2 (int64),
// file_version = 3 (string), summary = 5 (Summary). Summary: repeated Value
// value = 1. Summary.Value: tag = 1 (string), simple_value = 2 (float).
// Wire types: 1 = 64-bit, 0 = varint, 2 = length-delimited, 5 = 32-bit.
#include "loongforge/trainer/tensorboard.hpp"

#include <unistd.h>  // gethostname, getpid

#include <chrono>   // std::chrono::system_clock
#include <cstring>  // std::memcpy

#include "loongforge/common/error.hpp"
#include "loongforge/common/files.hpp"

namespace loongforge::trainer {

// ---------------------------------------------------------------------------
// CRC32C

uint32_t crc32c(const void* data, size_t size) {
  static const auto table = [] {
    struct T {
      uint32_t v[256];
    } t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
      t.v[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) crc = table.v[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

// ---------------------------------------------------------------------------
// Protobuf encoding (Note [Event encoding])

namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as protobuf requires (x86/ARM hosts)
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event(double wall_time, int64_t step) {
  std::string e;
  put_varint(e, 1 << 3 | 1), put_fixed(e, wall_time);
  put_varint(e, 2 << 3 | 0), put_varint(e, static_cast<uint64_t>(step));
  return e;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

// ---------------------------------------------------------------------------
// Writer

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  make_dirs(dir);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(now_s())) + "." + host + "." +
          std::to_string(::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw Error("cannot write the TensorBoard event file " + path_ + " (set logging.tensorboard=false to skip)");
  std::string e = event(now_s(), 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    put_varint(v, 2 << 3 | 5), put_fixed(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event(now_s(), step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& payload) {
  std::string rec;
  const uint64_t len = payload.size();
  put_fixed(rec, len);
  put_fixed(rec, masked_crc32c(&len, sizeof len));
  rec += payload;
  put_fixed(rec, masked_crc32c(payload.data(), payload.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size() || std::fflush(file_) != 0)
    throw Error("writing the TensorBoard event file " + path_ + " failed (disk full?)");
}

}  // namespace loongforge::trainer
