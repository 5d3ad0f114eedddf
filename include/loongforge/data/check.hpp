// loongforge/data/check.hpp — checking a converted dataset before a long run
// (`loongforge validate-dataset PATH`).
//
// Contract:
//  - validate_dataset() opens the dataset with Dataset::open (loongforge_dataset.json,
//    every shard's header, column table and index with their CRC32s, record bounds;
//    dataset.hpp) and then, episode by episode: each record's CRC32 and header
//    (Dataset::array), each array's row count, timestamps strictly increasing,
//    frame_index 0, 1, 2, ..., and for each camera video: the row count against the
//    frames the index records, video_frame values inside the video, each row's
//    timestamp within alignment.tolerance_s of its frame's (docs/shard-format.md s5),
//    then the file: size and SHA-256 against the index, a packet scan (count and
//    presentation times against video_pts), and a decode with the trainer's checks
//    (video.hpp, Note [Checked video]): of `sample_spans` keyframe spans (the first,
//    the last and ones evenly between) by default, of every frame with `full`.
//  - It reuses the data room's reader and decoder: what it accepts is what training
//    reads. Every problem is one line naming the file (shard, video) or the episode
//    and what to do; it goes on after a problem where it can (a problem in one
//    video does not hide one in another). A dataset that cannot be opened (a
//    missing or damaged shard, malformed JSON) has that one problem: the other
//    checks need the shards.
//  - `progress` (optional) is called after each episode (its videos included), on
//    the calling thread; single-threaded, no logging of its own (FFmpeg's log lines
//    go to the "data" logger as in training).
//
// Example:
//   CheckOptions opt;
//   opt.full = true;
//   const DatasetReport r = validate_dataset("build/datasets/robot_sim.PickNPlace.lf", opt);
//   for (const auto& p : r.problems) std::cout << "PROBLEM: " << p << "\n";
#pragma once

#include <cstddef>     // size_t
#include <cstdint>     // int64_t, uint64_t
#include <functional>  // std::function
#include <string>      // std::string
#include <vector>      // std::vector

#include "loongforge/data/video.hpp"  // VideoCheck

namespace loongforge::data {

class Dataset;

struct CheckProgress {
  int64_t episodes_done = 0, episodes = 0;
  int64_t videos_done = 0, videos = 0;
  uint64_t video_bytes_done = 0, video_bytes = 0;
};

struct CheckOptions {
  bool full = false;          // decode every frame of every video
  int64_t sample_spans = 3;   // keyframe spans decoded per video otherwise (>= 1)
  std::function<void(const CheckProgress&)> progress;
};

struct DatasetReport {
  std::string dir;
  bool opened = false;  // Dataset::open succeeded
  int64_t episodes = 0, rows = 0, shards = 0, cameras = 0, videos = 0;
  uint64_t shard_bytes = 0, video_bytes = 0;
  int64_t frames_decoded = 0;
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
};

DatasetReport validate_dataset(const std::string& dir, const CheckOptions& opt = {});

// What the index says about the video of camera `camera` of episode position `episode`
// (size, SHA-256, frame count, the camera's size, the shard's video_pts column), for
// decode_video_checked / open_video_checked. Throws DataError when video_pts has
// another row count than the recorded frame count.
VideoCheck dataset_video_check(const Dataset& ds, size_t episode, int camera);

}  // namespace loongforge::data
