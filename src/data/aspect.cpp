// What the model's image resize does with each camera's aspect (contract in aspect.hpp).
#include "loongforge/data/aspect.hpp"

#include <algorithm>  // std::max, std::min
#include <cstdio>     // std::snprintf
#include <numeric>    // std::gcd

#include "loongforge/data/batch.hpp"  // SampleOptions, cropped_size
#include "loongforge/data/dataset.hpp"

namespace loongforge::data {

const char* aspect_outcome_name(AspectOutcome outcome) {
  switch (outcome) {
    case AspectOutcome::kept: return "kept";
    case AspectOutcome::squashed: return "squashed";
    case AspectOutcome::padded: return "padded";
    case AspectOutcome::refused: return "refused";
  }
  return "?";
}

namespace {
std::string fixed3(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

// "4:3 = 1.333"; only the value when the reduced ratio has a term over 32.
std::string ratio_text(int64_t width, int64_t height) {
  const int64_t g = std::max<int64_t>(1, std::gcd(width, height));
  const int64_t w = width / g, h = height / g;
  const std::string value = fixed3(static_cast<double>(width) / static_cast<double>(height));
  return std::max(w, h) <= 32 ? std::to_string(w) + ":" + std::to_string(h) + " = " + value : value;
}
}  // namespace

CameraAspect camera_aspect(int64_t height, int64_t width, const SampleOptions& opt) {
  CameraAspect a;
  if (height == width) {
    a.text = "kept (square)";
    return a;
  }
  const bool wide = width > height;
  if (opt.image_letterbox && opt.image_resample != "box") {  // frames.hpp: padded to q x q, q = max(h, w)
    const int64_t q = std::max(height, width);
    a.outcome = AspectOutcome::padded;
    a.pad = q - std::min(height, width);
    a.pad_share = static_cast<double>(a.pad) / static_cast<double>(q);
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.1f", 100.0 * a.pad_share);
    a.text = "padded to " + std::to_string(q) + "x" + std::to_string(q) + " (" + std::to_string(a.pad) + " zero " +
             (wide ? "rows" : "columns") + ", " + pct + "% of the square)";
    return a;
  }
  if (opt.image_resample == "cv2_area") {  // its shorter-side resize keeps the aspect: BatchBuilder refuses it
    a.outcome = AspectOutcome::refused;
    a.text = "refused (image_resample cv2_area keeps the aspect, the model takes square images: import the "
             "checkpoint with letter_box_transform, or use a square camera)";
    return a;
  }
  // box crops image_crop_fraction of both sides first (the aspect stays, up to rounding); the others resize
  // the whole frame to a square before their crop
  const bool box = opt.image_resample == "box";
  const int64_t h = box ? cropped_size(height, opt.image_crop_fraction) : height;
  const int64_t w = box ? cropped_size(width, opt.image_crop_fraction) : width;
  a.outcome = AspectOutcome::squashed;
  a.squash = wide ? static_cast<double>(h) / static_cast<double>(w) : static_cast<double>(w) / static_cast<double>(h);
  a.text = std::string("squashed (") + (wide ? "width x" : "height x") + fixed3(a.squash) + " relative to " +
           (wide ? "height)" : "width)");
  return a;
}

std::string camera_aspect_line(const Dataset& ds, const SampleOptions& opt) {
  const int64_t S = opt.image_size;
  std::string line = "cameras (image_resample " + opt.image_resample +
                     (opt.image_letterbox && opt.image_resample != "box" ? ", image_letterbox" : "") + ", " +
                     std::to_string(S) + "x" + std::to_string(S) + " input):";
  bool any = false;
  for (const CameraInfo& cam : ds.cameras()) {
    if (cam.modality_name.empty()) continue;  // not used by the batches
    int64_t frames = 0, episodes = 0;
    for (const EpisodeInfo& e : ds.episodes()) {
      if (cam.id >= static_cast<int>(e.videos.size()) || e.videos[cam.id].file.empty()) continue;
      frames += e.videos[cam.id].frame_count;
      ++episodes;
    }
    const CameraAspect a = camera_aspect(cam.height, cam.width, opt);
    line += std::string(any ? ";" : "") + " '" + cam.key + "' " + std::to_string(cam.width) + "x" +
            std::to_string(cam.height) +
            (cam.height == cam.width ? " " : " (" + ratio_text(cam.width, cam.height) + ") ") + a.text + ", " +
            std::to_string(frames) + " frames in " + std::to_string(episodes) + " episode(s)";
    any = true;
  }
  return any ? line : line + " none used";
}

}  // namespace loongforge::data
