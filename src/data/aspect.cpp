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
    case AspectOutcome::cropped: return "cropped";
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

std::string percent1(int64_t part, int64_t whole) {
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f", 100.0 * (static_cast<double>(part) / static_cast<double>(whole)));
  return pct;
}

// An h x w frame padded with zeros to a q x q square, q = max(h, w) (image_letterbox, or box's image_aspect pad).
CameraAspect padded(int64_t height, int64_t width) {
  CameraAspect a;
  const int64_t q = std::max(height, width);
  a.outcome = AspectOutcome::padded;
  a.pad = q - std::min(height, width);
  a.pad_share = static_cast<double>(a.pad) / static_cast<double>(q);
  a.text = "padded to " + std::to_string(q) + "x" + std::to_string(q) + " (" + std::to_string(a.pad) + " zero " +
           (width > height ? "rows" : "columns") + ", " + percent1(a.pad, q) + "% of the square)";
  return a;
}

// An h x w frame cut to its center m x m square, m = min(h, w) (box's image_aspect crop: box_window).
CameraAspect cropped(int64_t height, int64_t width) {
  CameraAspect a;
  const int64_t side = std::min(height, width), longer = std::max(height, width);
  const bool wide = width > height;
  a.outcome = AspectOutcome::cropped;
  a.cut = longer - side;
  a.cut_share = static_cast<double>(a.cut) / static_cast<double>(longer);
  a.text = "cropped to " + std::to_string(side) + "x" + std::to_string(side) + " (" + std::to_string(a.cut) +
           (wide ? " columns cut, " : " rows cut, ") + percent1(a.cut, longer) + "% of the " +
           (wide ? "width)" : "height)");
  return a;
}

// An h x w frame resized whole to a square: its longer side scaled by the shorter one's ratio.
CameraAspect squashed(int64_t height, int64_t width) {
  CameraAspect a;
  const bool wide = width > height;
  a.outcome = AspectOutcome::squashed;
  a.squash = wide ? static_cast<double>(height) / static_cast<double>(width)
                  : static_cast<double>(width) / static_cast<double>(height);
  a.text = std::string("squashed (") + (wide ? "width x" : "height x") + fixed3(a.squash) + " relative to " +
           (wide ? "height)" : "width)");
  return a;
}

// Whether data.image_aspect applies: the box resize of a model without an upstream processor record.
bool aspect_key_applies(const SampleOptions& opt) { return opt.image_resample == "box" && !opt.processor.upstream(); }

// box: the crop of image_crop_fraction on both sides first (the aspect stays, up to rounding), then
// data.image_aspect on what is left (where the key applies; squash otherwise).
CameraAspect box_aspect(int64_t height, int64_t width, const SampleOptions& opt) {
  const int64_t h = cropped_size(height, opt.image_crop_fraction), w = cropped_size(width, opt.image_crop_fraction);
  const std::string aspect = aspect_key_applies(opt) ? opt.image_aspect : "squash";
  if (h == w) {
    CameraAspect a;
    a.text = "kept (square after its center crop)";
    return a;
  }
  if (aspect == "crop") return cropped(h, w);
  if (aspect == "pad") return padded(h, w);  // box_window, then resize_frames' pad_square
  return squashed(h, w);
}
}  // namespace

CameraAspect camera_aspect(int64_t height, int64_t width, const SampleOptions& opt) {
  if (height == width) {
    CameraAspect a;
    a.text = "kept (square)";
    return a;
  }
  if (opt.image_resample == "box") return box_aspect(height, width, opt);
  if (opt.image_letterbox) return padded(height, width);  // frames.hpp: padded to q x q, q = max(h, w)
  if (opt.image_resample == "cv2_area") {  // its shorter-side resize keeps the aspect: BatchBuilder refuses it
    CameraAspect a;
    a.outcome = AspectOutcome::refused;
    a.text = "refused (image_resample cv2_area keeps the aspect, the model takes square images: import the "
             "checkpoint with letter_box_transform, or use a square camera)";
    return a;
  }
  return squashed(height, width);  // bicubic_aa, bilinear_aa: the whole frame to a square before their crop
}

std::string camera_aspect_line(const Dataset& ds, const SampleOptions& opt) {
  const int64_t S = opt.image_size;
  const std::string settings =
      (opt.image_letterbox && opt.image_resample != "box" ? ", image_letterbox" : "") +
      std::string(aspect_key_applies(opt) && opt.image_aspect != "squash" ? ", image_aspect " + opt.image_aspect : "");
  const std::string upstream = opt.processor.upstream()
                                   ? std::string("; upstream GR00T ") + opt.processor.upstream_name() + "'s preprocessing"
                                   : "";
  std::string line = "cameras (image_resample " + opt.image_resample + settings + ", " + std::to_string(S) + "x" +
                     std::to_string(S) + " input" + upstream + "):";
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
