// Proves that resize_area is OpenCV's INTER_AREA resize bit for bit: on 75 cases that
// make_cv2_area_cases.py resizes with cv2 itself (the version scripts/requirements-test.txt pins)
// — every path of Note [INTER_AREA arithmetic], upstream's geometries, random shapes and frames
// full of exact halves — each output value equals cv2's. And that the cv2_area transform
// (resize_frames_cv2_area) crops with upstream's floor and refuses what it cannot take, and
// under image_random_crop puts each sample's window where its drawn position says.
#include <cstdint>  // uint32_t
#include <fstream>  // std::ifstream
#include <string>   // std::string
#include <vector>   // std::vector

#include <ATen/ATen.h>  // at::from_blob, at::randint

#include "catch_compat.hpp"
#include "loongforge/common/error.hpp"
#include "loongforge/data/area_resize.hpp"
#include "loongforge/data/frames.hpp"

using namespace loongforge::data;
using lf_catch::Contains;

namespace {
struct Case {
  uint32_t h, w, oh, ow, c;
  std::vector<uint8_t> src, want;
};

std::vector<Case> read_cases(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  char magic[8];
  uint32_t n = 0;
  in.read(magic, 8);
  REQUIRE(std::string(magic, 8) == "LFAREA01");
  in.read(reinterpret_cast<char*>(&n), 4);
  std::vector<Case> cases(n);
  for (Case& k : cases) {
    in.read(reinterpret_cast<char*>(&k.h), 20);
    k.src.resize(static_cast<size_t>(k.h) * k.w * k.c);
    k.want.resize(static_cast<size_t>(k.oh) * k.ow * k.c);
    in.read(reinterpret_cast<char*>(k.src.data()), static_cast<std::streamsize>(k.src.size()));
    in.read(reinterpret_cast<char*>(k.want.data()), static_cast<std::streamsize>(k.want.size()));
  }
  REQUIRE(in.good());
  return cases;
}
}  // namespace

TEST_CASE("area resize: every value equals OpenCV's INTER_AREA resize of the same frame") {
  const std::vector<Case> cases = read_cases(LOONGFORGE_TEST_CV2_AREA_CASES);
  REQUIRE(cases.size() == 75);
  for (const Case& k : cases) {
    const at::Tensor src = at::from_blob(const_cast<uint8_t*>(k.src.data()), {k.h, k.w, k.c}, at::kByte);
    const at::Tensor got = resize_area(src, k.oh, k.ow);
    const at::Tensor want = at::from_blob(const_cast<uint8_t*>(k.want.data()), {k.oh, k.ow, k.c}, at::kByte);
    INFO(k.h << " x " << k.w << " -> " << k.oh << " x " << k.ow);
    REQUIRE(at::equal(got, want));
  }
}

TEST_CASE("area resize: the same size is a copy, and a size below 1 is refused") {
  const at::Tensor u8 = at::randint(0, 256, {5, 7, 3}, at::kByte);
  REQUIRE(at::equal(resize_area(u8, 5, 7), u8));
  REQUIRE_THROWS_WITH(resize_area(u8, 0, 7), Contains("cannot resize 5 x 7 to 0 x 7"));
  REQUIRE_THROWS_WITH(resize_area(u8.to(at::kFloat), 2, 2), Contains("expected a uint8 (h, w, c) CPU tensor"));
}

TEST_CASE("cv2_area transform: the crop is int(side * f) from (side - crop) / 2, then INTER_AREA back to the "
          "target, then the processor's bicubic to the model size") {
  const at::Tensor u8 = at::randint(0, 256, {2, 40, 40, 3}, at::kByte);
  const at::Tensor got = resize_frames_cv2_area(u8, 40, 0.93, 40);  // int(37.2) = 37 rows from 1
  REQUIRE(got.sizes() == at::IntArrayRef({2, 3, 40, 40}));
  for (int64_t i = 0; i < 2; ++i) {
    const at::Tensor crop = u8[i].narrow(0, 1, 37).narrow(1, 1, 37);
    const at::Tensor want = (resize_area(crop, 40, 40).permute({2, 0, 1}).to(at::kFloat) - 127.5) / 127.5;
    REQUIRE(at::equal(got[i], want));
  }
  const at::Tensor to32 = resize_frames_cv2_area(u8, 40, 0.93, 32);  // T 40, then the model's 32
  const at::Tensor t40 = ((got * 127.5) + 127.5).round().to(at::kByte);
  const at::Tensor want32 = at::_upsample_bicubic2d_aa(t40, {32, 32}, false).to(at::kFloat);
  REQUIRE(at::equal(to32, (want32 - 127.5) / 127.5));
}

TEST_CASE("cv2_area transform: a frame that stays non-square is refused, a letterboxed one is padded first") {
  const at::Tensor wide = at::randint(0, 256, {1, 20, 30, 3}, at::kByte);
  REQUIRE_THROWS_WITH(resize_frames_cv2_area(wide, 16, 1.0, 16),
                      Contains("a 20 x 30 frame becomes 16 x 24") && Contains("letter_box_transform"));
  const at::Tensor padded = at::constant_pad_nd(wide, {0, 0, 0, 0, 5, 5}, 0);  // (1, 30, 30, 3)
  REQUIRE(at::equal(resize_frames_cv2_area(wide, 16, 1.0, 16, /*letterbox=*/true),
                    resize_frames_cv2_area(padded, 16, 1.0, 16)));
}

TEST_CASE("cv2_area transform: a drawn crop window sits at round((T - crop) * pos), corners at 0 and 1, and the "
          "two stages make the whole transform") {
  const at::Tensor u8 = at::randint(0, 256, {1, 40, 40, 3}, at::kByte);
  const at::Tensor first = cv2_area_first(u8, 40);  // (1, 40, 40, 3): already at the target
  REQUIRE(at::equal(first, u8));
  REQUIRE(at::equal(cv2_area_rest(first, 0.93, 40), resize_frames_cv2_area(u8, 40, 0.93, 40)));
  const auto window = [&](int64_t top, int64_t left) {  // crop 37 at (top, left), back to 40
    const at::Tensor crop = u8[0].narrow(0, top, 37).narrow(1, left, 37);
    return (resize_area(crop, 40, 40).permute({2, 0, 1}).to(at::kFloat) - 127.5) / 127.5;
  };
  REQUIRE(at::equal(cv2_area_rest(first, 0.93, 40, 0.0, 1.0)[0], window(0, 3)));
  REQUIRE(at::equal(cv2_area_rest(first, 0.93, 40, 0.5, 0.2)[0], window(2, 1)));  // 1.5 -> 2 (half to even), 0.6 -> 1
  REQUIRE(at::equal(cv2_area_rest(first, 0.93, 40, 0.9, 7.0)[0], window(3, 3)));  // 2.7 -> 3; clamped to 1
}

TEST_CASE("cv2_area transform: the crop position is the same for the same seed and stream position, in [0, 1), "
          "and another at another position") {
  const auto a = crop_positions(7, 1234, 1)[0], b = crop_positions(7, 1234, 1)[0], c = crop_positions(7, 1235, 1)[0];
  REQUIRE((a.first == b.first && a.second == b.second));
  REQUIRE((a.first != c.first || a.second != c.second));
  for (uint64_t p = 0; p < 200; ++p) {
    const auto [y, x] = crop_positions(3, p, 1)[0];
    REQUIRE((y >= 0.0 && y < 1.0 && x >= 0.0 && x < 1.0));
  }
}
