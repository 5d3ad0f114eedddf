// Opening a LoongForge dataset: JSON metadata, mmap'd shards, integrity checks
// (docs/shard-format.md section 6).
#include "loongforge/data/dataset.hpp"

#include <fcntl.h>     // open
#include <sys/mman.h>  // mmap, munmap, madvise
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close

#include <array>    // std::array
#include <cerrno>   // errno
#include <cstring>  // std::memcmp, std::memcpy, std::strerror, strnlen
#include <fstream>  // std::ifstream
#include <mutex>    // std::mutex

#include <nlohmann/json.hpp>  // nlohmann::json

namespace loongforge::data {

// ---------------------------------------------------------------------------
// CRC32 (table-driven; same result as the bitwise version in the format doc)

uint32_t crc32(const void* data, size_t bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < bytes; ++i) c = table[(c ^ p[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

namespace {

template <typename T>
T read_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // little-endian host (x86-64, aarch64)
  return v;
}

constexpr uint64_t kHeaderBytes = 128, kColumnEntryBytes = 96, kIndexEntryBytes = 32, kAlign = 64;

struct Mapping {
  const uint8_t* base = nullptr;
  size_t size = 0;
  std::string path;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base) munmap(const_cast<uint8_t*>(base), size);
  }
};

std::unique_ptr<Mapping> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError("cannot open shard '" + path + "': " + std::strerror(errno) + "; re-run scripts/convert_lerobot.py");
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes)) {
    ::close(fd);
    throw DataError(path + ": file is shorter than the 128-byte shard header (truncated?); re-convert the dataset");
  }
  void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw DataError("cannot mmap shard '" + path + "': " + std::strerror(errno));
  madvise(p, static_cast<size_t>(st.st_size), MADV_WILLNEED);
  auto m = std::make_unique<Mapping>();
  m->base = static_cast<const uint8_t*>(p);
  m->size = static_cast<size_t>(st.st_size);
  m->path = path;
  return m;
}

DType dtype_from_name(const std::string& s, const std::string& where) {
  if (s == "float32") return DType::Float32;
  if (s == "float64") return DType::Float64;
  if (s == "int64") return DType::Int64;
  if (s == "uint8") return DType::UInt8;
  if (s == "int32") return DType::Int32;
  throw DataError(where + ": unknown dtype '" + s + "'");
}

uint32_t elem_bytes(DType d) {
  switch (d) {
    case DType::Float32: case DType::Int32: return 4;
    case DType::Float64: case DType::Int64: return 8;
    case DType::UInt8: return 1;
  }
  return 0;
}

}  // namespace

struct Dataset::Shards {
  std::vector<std::unique_ptr<Mapping>> files;
  std::mutex verify_mutex;
  std::vector<bool> verified;  // per episode position
};

Dataset::Dataset(Dataset&&) noexcept = default;
Dataset& Dataset::operator=(Dataset&&) noexcept = default;
Dataset::~Dataset() = default;

Dataset Dataset::open(const std::string& dir) {
  const std::string json_path = dir + "/loongforge_dataset.json";
  std::ifstream in(json_path);
  if (!in)
    throw DataError("cannot read '" + json_path + "': is '" + dir +
                    "' a dataset written by scripts/convert_lerobot.py? (convert a LeRobot dataset with it first)");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    throw DataError(json_path + ": not valid JSON (" + e.what() + "); re-convert the dataset");
  }
  Dataset ds;
  ds.dir_ = dir;
  try {
    if (j.at("format").get<std::string>() != "loongforge-dataset" || j.at("format_version").get<int>() != 1)
      throw DataError(json_path + ": format " + j.at("format").dump() + " version " + j.at("format_version").dump() +
                      " is not loongforge-dataset version 1; re-convert with this build's scripts/convert_lerobot.py");
    ds.fps_ = j.at("fps").get<double>();
    ds.tolerance_s_ = j.at("alignment").at("tolerance_s").get<double>();
    for (const auto& c : j.at("columns")) {
      ColumnInfo ci;
      ci.id = c.at("column_id").get<int>();
      ci.name = c.at("name").get<std::string>();
      ci.role = c.at("role").get<std::string>();
      ci.dtype = dtype_from_name(c.at("dtype").get<std::string>(), json_path + ": column '" + ci.name + "'");
      ci.width = c.at("width").get<int64_t>();
      ci.per_video_frame = c.at("rows").get<std::string>() == "per_video_frame";
      ci.camera_id = c.at("camera_id").is_null() ? -1 : c.at("camera_id").get<int>();
      ds.columns_.push_back(ci);
    }
    for (const auto& c : j.at("cameras")) {
      CameraInfo cam;
      cam.id = c.at("camera_id").get<int>();
      cam.key = c.at("key").get<std::string>();
      cam.modality_name = c.at("modality_name").get<std::string>();
      cam.height = c.at("height").get<int64_t>();
      cam.width = c.at("width").get<int64_t>();
      ds.cameras_.push_back(cam);
    }
    for (const auto& t : j.at("tasks")) {
      TaskInfo ti;
      ti.index = t.at("task_index").get<int64_t>();
      ti.text = t.at("text").get<std::string>();
      ti.token_ids = t.at("token_ids").get<std::vector<int64_t>>();
      ds.tasks_[ti.index] = ti;
    }
    for (const auto& kv : j.at("stats").items()) {
      Stats s;
      auto get = [&](const char* k) {
        return kv.value().contains(k) ? kv.value().at(k).get<std::vector<double>>() : std::vector<double>{};
      };
      s.min = get("min"), s.max = get("max"), s.mean = get("mean"), s.std = get("std");
      ds.stats_[kv.key()] = s;
    }
    {
      // A dataset converted before "kind" was recorded used the word hash.
      const auto& t = j.at("tokenizer");
      ds.tokenizer_.kind = t.value("kind", std::string("word_hash"));
      ds.tokenizer_.sha256 = t.value("sha256", std::string());
      ds.tokenizer_.text_form = t.value("text_form", std::string("raw"));
      ds.tokenizer_.file = t.value("file", t.value("module", std::string()));
    }
    for (const auto& e : j.at("episodes")) {
      EpisodeInfo ei;
      ei.index = e.at("episode_index").get<int64_t>();
      ei.length = e.at("length").get<int64_t>();
      ei.shard_id = e.at("shard_id").get<int>();
      ei.shard_file = e.at("shard").get<std::string>();
      ei.record_offset = e.at("record_offset").get<uint64_t>();
      ei.record_bytes = e.at("record_bytes").get<uint64_t>();
      ei.record_crc32 = e.at("record_crc32").get<uint32_t>();
      ei.video_paths.assign(ds.cameras_.size(), "");
      ei.videos.assign(ds.cameras_.size(), VideoInfo{});
      for (const auto& v : e.at("videos")) {
        const int cam = v.at("camera_id").get<int>();
        if (cam < 0 || cam >= static_cast<int>(ei.video_paths.size())) continue;
        VideoInfo& vi = ei.videos[cam];
        vi.file = v.at("file").get<std::string>();
        if (!v.contains("sha256"))
          throw DataError(json_path + ": episode " + std::to_string(ei.index) + " video '" + vi.file +
                          "' has no sha256: the dataset was converted by an older scripts/convert_lerobot.py, "
                          "before video sizes and hashes were recorded; re-run scripts/convert_lerobot.py "
                          "SRC " + dir + " --overwrite");
        vi.bytes = v.at("bytes").get<uint64_t>();
        vi.sha256 = v.at("sha256").get<std::string>();
        vi.frame_count = v.at("frame_count").get<int64_t>();
        vi.timestamp_offset_s = v.at("timestamp_offset_s").get<double>();
        ei.video_paths[cam] = dir + "/" + vi.file;
      }
      ds.total_rows_ += ei.length;
      ds.episodes_.push_back(std::move(ei));
    }
  } catch (const nlohmann::json::exception& e) {
    throw DataError(json_path + ": missing or malformed field (" + std::string(e.what()) +
                    "); re-convert the dataset with scripts/convert_lerobot.py");
  }

  // Map and check every shard.
  ds.shards_ = std::make_unique<Shards>();
  const auto& shard_list = j.at("shards");
  for (const auto& s : shard_list) {
    const std::string path = dir + "/" + s.at("file").get<std::string>();
    auto m = map_file(path);
    const uint8_t* h = m->base;
    auto bad = [&](const std::string& what) {
      return DataError(path + ": " + what + "; the shard is corrupt or truncated: re-convert the dataset");
    };
    if (std::memcmp(h, "LFSHARD\0", 8) != 0) throw bad("bad magic (not a LoongForge shard)");
    if (read_le<uint32_t>(h + 8) != 1) throw bad("shard format_version " + std::to_string(read_le<uint32_t>(h + 8)) + " is not 1");
    if (read_le<uint32_t>(h + 124) != crc32(h, 124)) throw bad("header CRC32 mismatch");
    if (read_le<uint64_t>(h + 32) != m->size)
      throw bad("header says " + std::to_string(read_le<uint64_t>(h + 32)) + " bytes, file has " + std::to_string(m->size));
    const uint32_t column_count = read_le<uint32_t>(h + 24);
    const uint64_t ct_off = read_le<uint64_t>(h + 40), ct_bytes = read_le<uint64_t>(h + 48);
    const uint64_t ix_off = read_le<uint64_t>(h + 56), ix_bytes = read_le<uint64_t>(h + 64);
    if (ct_off + ct_bytes > m->size || ix_off + ix_bytes > m->size || ix_off % kAlign != 0 ||
        ct_bytes != column_count * kColumnEntryBytes)
      throw bad("column table or index lies outside the file");
    if (read_le<uint32_t>(h + 80) != crc32(h + ct_off, ct_bytes)) throw bad("column table CRC32 mismatch");
    if (read_le<uint32_t>(h + 84) != crc32(h + ix_off, ix_bytes)) throw bad("index CRC32 mismatch");
    if (column_count != ds.columns_.size())
      throw bad("has " + std::to_string(column_count) + " columns, loongforge_dataset.json lists " +
                std::to_string(ds.columns_.size()));
    for (uint32_t c = 0; c < column_count; ++c) {
      const uint8_t* e = h + ct_off + c * kColumnEntryBytes;
      const std::string name(reinterpret_cast<const char*>(e), strnlen(reinterpret_cast<const char*>(e), 64));
      const auto& ci = ds.columns_[c];
      if (name != ci.name || read_le<uint32_t>(e + 64) != static_cast<uint32_t>(ci.dtype) ||
          read_le<uint32_t>(e + 72) != ci.width)
        throw bad("column " + std::to_string(c) + " ('" + name + "') differs from loongforge_dataset.json ('" + ci.name + "')");
    }
    ds.shards_->files.push_back(std::move(m));
  }
  for (const auto& e : ds.episodes_) {
    if (e.shard_id < 0 || e.shard_id >= static_cast<int>(ds.shards_->files.size()))
      throw DataError(json_path + ": episode " + std::to_string(e.index) + " names shard " + std::to_string(e.shard_id) + " which does not exist");
    const auto& m = *ds.shards_->files[e.shard_id];
    if (e.record_offset % kAlign != 0 || e.record_offset + e.record_bytes > m.size)
      throw DataError(m.path + ": episode " + std::to_string(e.index) + "'s record lies outside the file (truncated shard?)");
  }
  ds.shards_->verified.assign(ds.episodes_.size(), false);
  return ds;
}

int Dataset::column_by_name(const std::string& name) const {
  for (const auto& c : columns_)
    if (c.name == name) return c.id;
  return -1;
}

int Dataset::column_by_role(const std::string& role) const {
  for (const auto& c : columns_)
    if (c.role == role) return c.id;
  return -1;
}

const Stats& Dataset::stats(const std::string& column_name) const {
  auto it = stats_.find(column_name);
  if (it == stats_.end())
    throw DataError(dir_ + "/loongforge_dataset.json: no normalization stats for '" + column_name +
                    "' (meta/stats.json of the source lacks it)");
  return it->second;
}

ArrayView Dataset::array(size_t episode, int column) const {
  const EpisodeInfo& e = episodes_.at(episode);
  const Mapping& m = *shards_->files[e.shard_id];
  const uint8_t* rec = m.base + e.record_offset;
  {
    std::lock_guard<std::mutex> lock(shards_->verify_mutex);
    if (!shards_->verified[episode]) {
      if (crc32(rec, e.record_bytes) != e.record_crc32)
        throw DataError(m.path + ": episode " + std::to_string(e.index) +
                        ": record CRC32 mismatch (corrupt shard); re-convert the dataset");
      if (std::memcmp(rec, "LFEPISOD", 8) != 0 || read_le<int64_t>(rec + 8) != e.index ||
          read_le<uint64_t>(rec + 16) != static_cast<uint64_t>(e.length))
        throw DataError(m.path + ": episode " + std::to_string(e.index) + ": record header does not match the index");
      shards_->verified[episode] = true;
    }
  }
  const ColumnInfo& c = columns_.at(column);
  const uint8_t* dir_entry = rec + 64 + 32 * static_cast<size_t>(column);
  ArrayView v;
  v.data = rec + read_le<uint64_t>(dir_entry + 8);
  v.rows = static_cast<int64_t>(read_le<uint64_t>(dir_entry + 16));
  v.width = c.width;
  v.dtype = c.dtype;
  if (read_le<uint64_t>(dir_entry + 24) != static_cast<uint64_t>(v.rows * v.width) * elem_bytes(c.dtype))
    throw DataError(m.path + ": episode " + std::to_string(e.index) + ": array '" + c.name + "' has the wrong size");
  return v;
}

}  // namespace loongforge::data
