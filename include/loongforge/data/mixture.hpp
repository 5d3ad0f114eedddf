// loongforge/data/mixture.hpp — what data.path names: one LoongForge dataset
// folder, or a mixture file listing several, each with its embodiment.
//
// Contract:
//  - open_data(path, embodiment_id) opens a dataset folder as a mixture of
//    one part whose samples carry `embodiment_id` (data.embodiment_id), or a
//    mixture file (a path ending in .json; docs/training-semantics.md s1):
//        {"datasets": [{"path": "pick.lf", "embodiment_id": 0},
//                      {"path": "one_arm.lf", "embodiment_id": 3}]}
//    Relative paths are read from the file's folder. Every dataset is opened
//    and checked as Dataset::open checks one.
//  - Samples are numbered part by part, in the file's order: part k's come
//    after parts 0..k-1's (the sampler's ids, training-semantics s2).
//  - Errors name the file, the entry and the fix: an unreadable or invalid
//    file, an empty list, an unknown key, a missing path or embodiment_id,
//    a dataset listed twice.
//  - A Mixture owns its datasets; DataPart pointers into it are valid while
//    it lives (and it is movable without invalidating them).
//
// Example:
//   data::Mixture mix = data::open_data("mix.json", 0);
//   data::BatchBuilder builder(mix.parts(), options);
#pragma once

#include <cstdint>  // int64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "loongforge/data/dataset.hpp"

namespace loongforge::data {

// One dataset of a mixture and the embodiment slot of its samples.
struct DataPart {
  const Dataset* dataset = nullptr;
  int64_t embodiment_id = 0;
};

struct Mixture {
  std::string path;        // what data.path named
  bool from_file = false;  // a mixture file (else one dataset folder)
  std::vector<std::unique_ptr<Dataset>> datasets;
  std::vector<int64_t> embodiment_ids;  // by dataset

  std::vector<DataPart> parts() const;
  int64_t episodes() const;    // summed over the datasets
  int64_t total_rows() const;  // summed over the datasets
};

// True when `path` names a mixture file (ends in .json) rather than a dataset folder.
bool is_mixture_file(const std::string& path);

// data.path opened: a folder as one part with `embodiment_id`, or a mixture file (above).
Mixture open_data(const std::string& path, int64_t embodiment_id);

}  // namespace loongforge::data
