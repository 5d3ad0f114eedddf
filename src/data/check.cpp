// Checking a converted dataset offline (contract in check.hpp).
#include "loongforge/data/check.hpp"

#include <sys/stat.h>  // stat

#include <algorithm>  // std::max, std::min
#include <cmath>     // std::fabs
#include <cstdio>    // std::snprintf
#include <optional>  // std::optional
#include <set>       // std::set

#include "loongforge/common/error.hpp"
#include "loongforge/data/dataset.hpp"

namespace loongforge::data {

VideoCheck dataset_video_check(const Dataset& ds, size_t episode, int camera) {
  const EpisodeInfo& ep = ds.episodes().at(episode);
  const VideoInfo& info = ep.videos.at(static_cast<size_t>(camera));
  const CameraInfo& cam = ds.cameras().at(static_cast<size_t>(camera));
  VideoCheck check;
  check.bytes = info.bytes;
  check.sha256 = info.sha256;
  check.frame_count = info.frame_count;
  check.width = cam.width;
  check.height = cam.height;
  const int pts_col = ds.column_by_name("video_pts:" + cam.key);
  if (pts_col < 0) throw DataError(ds.dir() + ": no video_pts column for camera '" + cam.key + "'; re-run scripts/convert_lerobot.py");
  const ArrayView pts = ds.array(episode, pts_col);
  if (pts.rows != info.frame_count)
    throw DataError(ds.dir() + "/" + ep.shard_file + ": episode " + std::to_string(ep.index) + ": video_pts:" +
                    cam.key + " has " + std::to_string(pts.rows) + " rows but loongforge_dataset.json records " +
                    std::to_string(info.frame_count) + " frames; re-run scripts/convert_lerobot.py");
  check.pts_s = pts.as<double>();
  return check;
}

namespace {

double value_at(const ArrayView& a, int64_t i) {  // element i of a width-1 array, widened
  switch (a.dtype) {
    case DType::Float32: return a.as<float>()[i];
    case DType::Float64: return a.as<double>()[i];
    case DType::Int64: return static_cast<double>(a.as<int64_t>()[i]);
    case DType::Int32: return a.as<int32_t>()[i];
    case DType::UInt8: return a.as<uint8_t>()[i];
  }
  return 0;
}

uint64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f s", s);
  return buf;
}

// The rows of episode position i: record, arrays, timestamps, frame_index, and each video's alignment.
void check_rows(const Dataset& ds, size_t i, std::vector<std::string>& problems) {
  const EpisodeInfo& e = ds.episodes()[i];
  const std::string where = ds.dir() + "/" + e.shard_file + ": episode " + std::to_string(e.index);
  for (const ColumnInfo& c : ds.columns()) {
    const ArrayView a = ds.array(i, c.id);  // throws DataError on a bad record CRC, header or array size
    if (!c.per_video_frame && a.rows != e.length)
      problems.push_back(where + ": column '" + c.name + "' has " + std::to_string(a.rows) + " rows but the episode has " +
                         std::to_string(e.length) + "; re-run scripts/convert_lerobot.py");
  }
  const int ts_col = ds.column_by_role("timestamp");
  std::optional<ArrayView> ts;
  if (ts_col >= 0) {
    ts = ds.array(i, ts_col);
    for (int64_t t = 1; t < ts->rows; ++t)
      if (!(value_at(*ts, t) > value_at(*ts, t - 1))) {
        problems.push_back(where + ": timestamps are not increasing at row " + std::to_string(t) + " (" +
                           seconds(value_at(*ts, t)) + " after " + seconds(value_at(*ts, t - 1)) +
                           "); re-run scripts/convert_lerobot.py on a fixed source");
        break;
      }
  }
  const int fi_col = ds.column_by_role("frame_index");
  if (fi_col >= 0) {
    const ArrayView fi = ds.array(i, fi_col);
    for (int64_t t = 0; t < fi.rows; ++t)
      if (value_at(fi, t) != static_cast<double>(t)) {
        problems.push_back(where + ": frame_index is " + std::to_string(static_cast<int64_t>(value_at(fi, t))) +
                           " at row " + std::to_string(t) + ", not " + std::to_string(t) +
                           "; re-run scripts/convert_lerobot.py");
        break;
      }
  }
  for (const CameraInfo& cam : ds.cameras()) {
    const VideoInfo& v = e.videos.at(static_cast<size_t>(cam.id));
    if (v.file.empty()) continue;
    const std::string vwhere = where + " camera '" + cam.key + "'";
    if (v.frame_count != e.length)
      problems.push_back(vwhere + ": " + std::to_string(e.length) + " rows but loongforge_dataset.json records " +
                         std::to_string(v.frame_count) + " frames for its video " + v.file +
                         " (one frame per row); re-run scripts/convert_lerobot.py");
    const int frame_col = ds.column_by_name("video_frame:" + cam.key);
    const int pts_col = ds.column_by_name("video_pts:" + cam.key);
    if (frame_col < 0 || pts_col < 0) {
      problems.push_back(vwhere + ": no video_frame or video_pts column; re-run scripts/convert_lerobot.py");
      continue;
    }
    const ArrayView frame = ds.array(i, frame_col), pts = ds.array(i, pts_col);
    if (pts.rows != v.frame_count) continue;  // check_video reports it (dataset_video_check)
    for (int64_t t = 0; t < frame.rows; ++t) {
      const auto f = static_cast<int64_t>(value_at(frame, t));
      if (f < 0 || f >= pts.rows) {
        problems.push_back(vwhere + ": row " + std::to_string(t) + " names frame " + std::to_string(f) + " of a " +
                           std::to_string(pts.rows) + "-frame video; re-run scripts/convert_lerobot.py");
        break;
      }
      if (!ts) continue;
      const double residual = value_at(*ts, t) - v.timestamp_offset_s - pts.as<double>()[f];
      if (!(std::fabs(residual) <= ds.alignment_tolerance_s() + 1e-9)) {
        problems.push_back(vwhere + ": row " + std::to_string(t) + " (timestamp " + seconds(value_at(*ts, t)) +
                           ") is " + seconds(residual) + " from its frame " + std::to_string(f) + " (pts " +
                           seconds(pts.as<double>()[f]) + ", offset " + seconds(v.timestamp_offset_s) +
                           "), past the alignment tolerance " + seconds(ds.alignment_tolerance_s()) +
                           "; re-run scripts/convert_lerobot.py");
        break;
      }
    }
  }
}

// One video: file checks, packet scan, and the decode of some spans or every frame.
int64_t check_video(const Dataset& ds, size_t i, int camera, const CheckOptions& opt) {
  const std::string& path = ds.episodes()[i].video_paths.at(static_cast<size_t>(camera));
  const VideoCheck check = dataset_video_check(ds, i, camera);
  int64_t decoded = 0;
  const FrameSink count = [&](const DecodedFrame&) { ++decoded; };
  if (opt.full) {
    decode_video_checked(path, check, count);
    return decoded;
  }
  const VideoFile file = open_video_checked(path, check);  // size, SHA-256, packets against the index
  const auto spans = static_cast<int64_t>(file.key_frames.size());
  const int64_t want = std::max<int64_t>(1, std::min(opt.sample_spans, spans));
  std::set<int64_t> chosen;  // the first, the last and ones evenly between
  for (int64_t k = 0; k < want; ++k) chosen.insert(want == 1 ? 0 : k * (spans - 1) / (want - 1));
  for (const int64_t k : chosen) {
    const auto [first, end] = file.span_of(file.key_frames[static_cast<size_t>(k)]);
    decode_span_checked(file, check, first, end, count);
  }
  return decoded;
}

}  // namespace

DatasetReport validate_dataset(const std::string& dir, const CheckOptions& opt) {
  DatasetReport r;
  r.dir = dir;
  std::optional<Dataset> opened;
  try {
    opened.emplace(Dataset::open(dir));
  } catch (const Error& e) {
    r.problems.push_back(e.what());
    return r;
  }
  const Dataset& ds = *opened;
  r.opened = true;
  r.episodes = static_cast<int64_t>(ds.episodes().size());
  r.rows = ds.total_rows();
  r.cameras = static_cast<int64_t>(ds.cameras().size());
  std::set<std::string> shards;
  CheckProgress progress;
  progress.episodes = r.episodes;
  for (const EpisodeInfo& e : ds.episodes()) {
    if (shards.insert(e.shard_file).second) r.shard_bytes += file_size(ds.dir() + "/" + e.shard_file);
    for (const VideoInfo& v : e.videos)
      if (!v.file.empty()) ++progress.videos, progress.video_bytes += v.bytes;
  }
  r.shards = static_cast<int64_t>(shards.size());
  r.videos = progress.videos;
  r.video_bytes = progress.video_bytes;
  for (size_t i = 0; i < ds.episodes().size(); ++i) {
    const EpisodeInfo& e = ds.episodes()[i];
    bool rows_ok = true;  // the record could be read: the video checks need its video_pts
    try {
      check_rows(ds, i, r.problems);
    } catch (const Error& err) {
      r.problems.push_back(err.what());
      rows_ok = false;
    }
    for (const CameraInfo& cam : ds.cameras()) {
      const VideoInfo& v = e.videos.at(static_cast<size_t>(cam.id));
      if (v.file.empty()) continue;
      if (rows_ok) {
        try {
          r.frames_decoded += check_video(ds, i, cam.id, opt);
        } catch (const Error& err) {
          r.problems.push_back(std::string("episode ") + std::to_string(e.index) + " camera '" + cam.key +
                               "': " + err.what());
        }
      }
      ++progress.videos_done;
      progress.video_bytes_done += v.bytes;
    }
    ++progress.episodes_done;
    if (opt.progress) opt.progress(progress);
  }
  return r;
}

}  // namespace loongforge::data
