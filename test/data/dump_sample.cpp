// Not a test: the harness of test_lerobot_reader_oracle.py. For each global sample
// index given (samples numbered episode by episode, rows in order: LeRobot's `index`
// for a dataset whose episodes are 0..N-1), it writes what the data room reads for
// that sample: the row's stored values (every per-row column), its task text, and,
// per camera, the frame the row names (its video_frame column) decoded with the
// trainer's checks (decode_video_checked: size, SHA-256, per-frame timestamps and
// decoder error detection) as raw RGB bytes (height, width, 3).
//
//   dump_sample DATASET OUT_DIR INDEX...  ->  OUT_DIR/samples.json, OUT_DIR/<index>_<camera id>.rgb
#include <cstdint>   // int64_t
#include <fstream>   // std::ofstream
#include <iostream>  // std::cerr
#include <map>       // std::map
#include <string>    // std::string
#include <utility>   // std::pair

#include <nlohmann/json.hpp>  // nlohmann::json

#include "loongforge/common/error.hpp"
#include "loongforge/data/check.hpp"  // dataset_video_check
#include "loongforge/data/dataset.hpp"
#include "loongforge/data/video.hpp"

using namespace loongforge::data;

namespace {
double value_at(const ArrayView& a, int64_t i) {
  switch (a.dtype) {
    case DType::Float32: return a.as<float>()[i];
    case DType::Float64: return a.as<double>()[i];
    case DType::Int64: return static_cast<double>(a.as<int64_t>()[i]);
    case DType::Int32: return a.as<int32_t>()[i];
    case DType::UInt8: return a.as<uint8_t>()[i];
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: dump_sample DATASET OUT_DIR INDEX...\n";
    return 2;
  }
  try {
    const Dataset ds = Dataset::open(argv[1]);
    const std::string out = argv[2];
    std::map<std::pair<size_t, int>, RgbFrames> decoded;  // (episode position, camera) -> every frame
    nlohmann::json samples = nlohmann::json::array();
    for (int a = 3; a < argc; ++a) {
      int64_t index = std::stoll(argv[a]), row = index;
      size_t e = 0;
      while (e < ds.episodes().size() && row >= ds.episodes()[e].length) row -= ds.episodes()[e++].length;
      if (e == ds.episodes().size()) throw loongforge::DataError("index " + std::string(argv[a]) + " is past the dataset");
      nlohmann::json s = {{"index", index}, {"episode_index", ds.episodes()[e].index}, {"row", row}};
      for (const ColumnInfo& c : ds.columns()) {
        if (c.per_video_frame) continue;
        const ArrayView v = ds.array(e, c.id);
        nlohmann::json values = nlohmann::json::array();
        for (int64_t k = 0; k < c.width; ++k) values.push_back(value_at(v, row * c.width + k));
        s["columns"][c.name] = values;
      }
      const int task_col = ds.column_by_name("task_index");
      if (task_col >= 0)
        s["task"] = ds.tasks().at(static_cast<int64_t>(value_at(ds.array(e, task_col), row))).text;
      for (const CameraInfo& cam : ds.cameras()) {
        const int frame_col = ds.column_by_name("video_frame:" + cam.key);
        const auto frame = static_cast<int64_t>(value_at(ds.array(e, frame_col), row));
        auto it = decoded.find({e, cam.id});
        if (it == decoded.end())
          it = decoded
                   .emplace(std::make_pair(e, cam.id),
                            decode_video_checked(ds.episodes()[e].video_paths.at(cam.id), dataset_video_check(ds, e, cam.id)))
                   .first;
        const RgbFrames& f = it->second;
        const std::string file = std::to_string(index) + "_" + std::to_string(cam.id) + ".rgb";
        const size_t bytes = static_cast<size_t>(f.height * f.width * 3);
        std::ofstream(out + "/" + file, std::ios::binary)
            .write(reinterpret_cast<const char*>(f.pixels.data() + static_cast<size_t>(frame) * bytes),
                   static_cast<std::streamsize>(bytes));
        s["frames"][cam.key] = {{"file", file}, {"frame", frame}, {"height", f.height}, {"width", f.width},
                                {"decoder", f.decoder}, {"pts_s", f.pts_s.at(static_cast<size_t>(frame))}};
      }
      samples.push_back(s);
    }
    std::ofstream(out + "/samples.json") << samples.dump(1) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "dump_sample: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
