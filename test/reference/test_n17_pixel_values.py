"""GR00T N1.7's model input (image_resample bicubic_aa, training-semantics s3) is upstream's
`pixel_values` bit for bit.

Upstream (lerobot 0.6.1, processor_groot.py) hands each (C, H, W) uint8 frame that
`_transform_n1_7_image_for_vlm_torch` returns to transformers' `Qwen2VLImageProcessor`
(`_build_n1_7_processor`: `from_pretrained` of nvidia/Cosmos-Reason2-2B, whose
preprocessor_config.json is Qwen3-VL's, PREPROCESSOR below). Its `_preprocess` (transformers
5.5.4, the torchvision backend) makes `pixel_values`:
  1. smart_resize to multiples of patch * merge = 32 with at least shortest_edge = 65,536 pixels:
     256 x 256 stays (torchvision's resize returns a same-size tensor unchanged); 224 x 224 is
     resized again, to 256 x 256, by antialiased bicubic on uint8 (torchvision's CPU kernel; ours
     with image_target_size 224 and image_size 256 does the same);
  2. the rescale fused into the normalisation: mean and std become 0.5 * (1 / (1/255)) = 127.5,
     and torchvision's normalize computes (v - 127.5) / 127.5 on the float32 frame;
  3. the still frame repeated to temporal_patch_size 2, and each 16 x 16 patch flattened as
     (C, t, p, p) in 2 x 2 merge-window order: the layout of the Conv3d patch embedding's
     weight (w, 3, 2, 16, 16).

Ours (lf_dataset.bicubic_aa_to_model, and src/data/frames.cpp's resize_frames_bicubic_aa with
the same ATen ops: test_frames, e2e_parity bicubic_resample) ends in (v - 127.5) / 127.5 in
float32, the model patchifies it itself (scripts/model/backbones.py PatchEmbed3d: conv2d with the
weight summed over time, then the merge-window order).

Checked here, upstream's code taken from the wheel (test/lerobot_oracle.py) and the installed
transformers, never copied:
- real frames (the bundled robot_sim.PickNPlace ego view, 256 x 256) through upstream's transform
  and processor equal our tensor, at the default 256 target and at a 224 target that the
  processor resizes to 256, patchified by the processor with resize, rescale and
  normalisation off (a pure rearrangement, checked by undoing it), bit for bit in float32;
- letterboxed (image_letterbox, upstream's letter_box_transform), non-square real frames equal
  upstream's pixel_values too, bit for bit;
- checkpoints saved with use_albumentations (image_resample cv2_area): upstream's cv2 INTER_AREA
  transform and the processor give our tensor's pixel_values, bit for bit, at the 256 target and
  at 224 (resized by the processor to 256);
- the importer's processor size (gr00t_upstream_config.qwen3vl_processor_side) is transformers'
  smart_resize for square sides 32-1199 and a few above its pixel maximum;
- for every uint8 value, upstream's normalisation equals ours and IEEE float32 division; the
  former formula ((v / 255) - 0.5) / 0.5 differs from it by up to 2^-24 (counted, printed);
- upstream's Conv3d patch embedding of `pixel_values` equals our PatchEmbed3d of our tensor in
  the merge-window order within float rounding (the sum over the two frames; printed).
"""
import json
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import lf_dataset as lfd  # noqa: E402  (test/reference/conftest.py puts scripts/reference on the path)

REPO = Path(__file__).resolve().parents[2]
# nvidia/Cosmos-Reason2-2B's preprocessor_config.json (the released Qwen3-VL processor: patch 16,
# temporal 2, merge 2, mean and std 0.5, shortest_edge 65,536 / longest_edge 16,777,216 pixels).
# The repository is gated and not readable here; these are the Qwen3-VL values it inherits.
PREPROCESSOR = {"size": {"longest_edge": 16777216, "shortest_edge": 65536}, "patch_size": 16,
                "temporal_patch_size": 2, "merge_size": 2, "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5], "processor_class": "Qwen3VLProcessor",
                "image_processor_type": "Qwen2VLImageProcessorFast"}
TARGET, CROP = 256, 230  # lerobot's N1_7_DEFAULT_IMAGE_TARGET_SIZE / _CROP_SIZE
DATA = Path(os.environ.get("LOONGFORGE_TEST_DATASET", REPO / "build" / "test-data" / "robot_sim.PickNPlace.lf"))
torch.set_num_threads(2)


@pytest.fixture(scope="module")
def processor(tmp_path_factory):
    """The image processor as upstream builds it: Qwen2VLImageProcessor.from_pretrained of a folder
    holding the backbone's preprocessor_config.json."""
    from transformers import Qwen2VLImageProcessor
    folder = tmp_path_factory.mktemp("cosmos-reason2-2b")
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    proc = Qwen2VLImageProcessor.from_pretrained(str(folder))
    assert proc.backend == "torchvision" and proc.do_resize and proc.do_rescale and proc.do_normalize
    return proc


@pytest.fixture(scope="module")
def frames():
    """Every 4th frame of episode 0's ego view, (h, w, 3) uint8, from the converted dataset the
    trainers read (ctest's pick_dataset fixture makes it)."""
    assert DATA.exists(), f"no converted dataset at {DATA}: run it through ctest (fixture pick_dataset) or convert one"
    ds = lfd.LFDataset(DATA)
    path, info = ds.video_file(0, ds.cameras[0]["camera_id"])
    count = int(info["frame_count"])
    video = lfd.decode_video(path, count)
    out = [video.rgb(i) for i in range(0, video.frames.shape[0], 4)]
    assert len(out) >= 50 and out[0].shape == (256, 256, 3)
    return out


def chw(frame: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(frame.transpose(2, 0, 1)))


def unpatchify(pv: torch.Tensor, n: int, g: int, m: int = 2, t: int = 2, p: int = 16) -> torch.Tensor:
    """The processor's layout undone: (n * g * g, 3 * t * p * p) -> (n, t, 3, g * p, g * p)."""
    x = pv.reshape(n, 1, g // m, g // m, m, m, 3, t, p, p)        # (b, T, bh, bw, mh, mw, C, t, ph, pw)
    x = x.permute(0, 1, 7, 6, 2, 4, 8, 3, 5, 9)                   # (b, T, t, C, bh, mh, ph, bw, mw, pw)
    return x.reshape(n, t, 3, g * p, g * p)


def test_n17_model_input_equals_upstreams_pixel_values_bit_for_bit(upstream_transform, processor, frames):
    ours = lfd.bicubic_aa_to_model(frames, TARGET, CROP / TARGET, 0)             # (n, 3, 256, 256) float32
    u8 = [upstream_transform(chw(f), image_crop_size=[CROP, CROP], image_target_size=[TARGET, TARGET],
                             shortest_image_edge=None, crop_fraction=None) for f in frames]
    up = processor(images=u8, return_tensors="pt")
    n, g = len(frames), TARGET // 16
    assert up["pixel_values"].dtype == torch.float32 and tuple(up["pixel_values"].shape) == (n * g * g, 3 * 2 * 16 * 16)
    assert up["image_grid_thw"].tolist() == [[1, g, g]] * n                      # no resize at 256 x 256
    mine = processor(images=list(ours), do_resize=False, do_rescale=False, do_normalize=False, return_tensors="pt")
    assert torch.equal(unpatchify(mine["pixel_values"], n, g), ours[:, None].expand(n, 2, 3, TARGET, TARGET))
    assert torch.equal(mine["pixel_values"], up["pixel_values"])
    # the former normalisation differs in float rounding only, on the same frames
    old = ((torch.stack(u8).to(torch.float32) / 255) - 0.5) / 0.5
    diff = (unpatchify(up["pixel_values"], n, g)[:, 0] - old).abs()
    print(f"\nformer ((v / 255) - 0.5) / 0.5 vs upstream on {n} frames: max |diff| {diff.max().item():.3g}, "
          f"{int((diff > 0).sum())} of {diff.numel()} values differ")
    assert 0 < diff.max().item() <= 2 ** -24


@pytest.mark.parametrize("target,crop", [(TARGET, CROP), (224, 200)])
def test_a_use_albumentations_model_input_equals_upstreams_pixel_values_bit_for_bit(
        upstream_albumentations_transform, processor, frames, target, crop):
    """image_resample cv2_area: upstream's albumentations transform hands the processor (h, w, 3)
    uint8 arrays made by OpenCV's INTER_AREA; at a 224 target the processor resizes them to 256."""
    frames = frames[:16]
    ours = lfd.cv2_area_to_model(frames, TARGET, crop / target, target)            # (n, 3, 256, 256) float32
    u8 = [upstream_albumentations_transform(f, image_crop_size=[crop, crop], image_target_size=[target, target],
                                            shortest_image_edge=None, crop_fraction=None) for f in frames]
    assert all(u.shape == (target, target, 3) for u in u8)
    up = processor(images=u8, return_tensors="pt")
    n, g = len(frames), TARGET // 16
    assert up["image_grid_thw"].tolist() == [[1, g, g]] * n
    mine = processor(images=list(ours), do_resize=False, do_rescale=False, do_normalize=False, return_tensors="pt")
    assert torch.equal(mine["pixel_values"], up["pixel_values"])
    # not the default transform's input: the two resamplers differ on the same frames
    assert not torch.equal(ours, lfd.bicubic_aa_to_model(frames, TARGET, crop / target, 0, target))


def test_every_uint8_value_is_normalised_as_upstream_and_ieee_division(processor):
    v = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16).repeat(3, 2, 2)     # each value 12 times
    up = processor(images=[v], do_resize=False, return_tensors="pt")["pixel_values"]
    ours = lfd.bicubic_aa_to_model([v.permute(1, 2, 0).contiguous().numpy()], 32, 1.0, 0)
    mine = processor(images=list(ours), do_resize=False, do_rescale=False, do_normalize=False,
                     return_tensors="pt")["pixel_values"]
    assert torch.equal(mine, up)
    ieee = (np.arange(256, dtype=np.float32) - np.float32(127.5)) / np.float32(127.5)
    assert np.array_equal(ours[0, 0, :16, :16].reshape(-1).numpy(), ieee)
    old = ((np.arange(256, dtype=np.float32) / np.float32(255)) - np.float32(0.5)) / np.float32(0.5)
    diff = np.abs(old - ieee)
    ulp = diff / np.spacing(np.abs(ieee))
    print(f"\nformer formula: {int((old != ieee).sum())} of 256 values differ, max |diff| {diff.max():.3g} "
          f"(at most {ulp.max():.0f} ulp of the value, near v = 127.5)")
    assert (old != ieee).any() and diff.max() <= 2 ** -24


def test_the_importers_processor_side_is_transformers_smart_resize():
    """scripts/gr00t_upstream_config.py's qwen3vl_processor_side (the size an N1.7 import feeds the ViT)
    against transformers' smart_resize for square images: below 65,536 pixels scaled up (224 -> 256),
    rounded to multiples of 32 (half to even), above 16,777,216 pixels scaled down."""
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize
    import gr00t_upstream_config as guc
    pixels = PREPROCESSOR["size"]
    assert (guc.QWEN3VL_MIN_PIXELS, guc.QWEN3VL_MAX_PIXELS) == (pixels["shortest_edge"], pixels["longest_edge"])
    factor = PREPROCESSOR["patch_size"] * PREPROCESSOR["merge_size"]
    sides = list(range(32, 1200)) + [4080, 4096, 4112, 5000, 6007]
    for s in sides:
        want = smart_resize(s, s, factor, pixels["shortest_edge"], pixels["longest_edge"])
        assert (guc.qwen3vl_processor_side(s, factor),) * 2 == want, s
    assert [guc.qwen3vl_processor_side(s, factor) for s in (224, 240, 256, 272, 288, 5000)] == [256, 256, 256, 256, 288,
                                                                                                 4096]


def test_a_224_target_reaches_the_vit_as_upstreams_256_pixel_values_bit_for_bit(upstream_transform, processor,
                                                                                  frames):
    """image_target_size 224 (crop 202): upstream's transform makes 224 x 224 frames, which its
    processor resizes to 256 x 256 (antialiased bicubic on uint8, on the CPU) before normalising;
    ours (image_target_size 224, image_size 256) is the same tensor."""
    few = frames[:24]
    ours = lfd.bicubic_aa_to_model(few, 256, 202 / 224, 0, target=224)              # (n, 3, 256, 256)
    u8 = [upstream_transform(chw(f), image_crop_size=[202, 202], image_target_size=[224, 224],
                             shortest_image_edge=None, crop_fraction=None) for f in few]
    assert tuple(u8[0].shape) == (3, 224, 224)
    up = processor(images=u8, return_tensors="pt")
    n, g = len(few), 256 // 16
    assert up["image_grid_thw"].tolist() == [[1, g, g]] * n                          # resized to 256 x 256
    mine = processor(images=list(ours), do_resize=False, do_rescale=False, do_normalize=False, return_tensors="pt")
    assert torch.equal(mine["pixel_values"], up["pixel_values"])
    # the former data path (the target fed as it is) gives another grid: 14 x 14 patches, 49 tokens
    fed = lfd.bicubic_aa_to_model(few, 224, 202 / 224, 0)
    assert tuple(fed.shape[-2:]) == (224, 224)


def test_letterboxed_non_square_frames_reach_the_vit_as_upstreams_pixel_values_bit_for_bit(upstream_transform,
                                                                                          processor, frames):
    """image_letterbox (upstream's letter_box_transform): real frames cut to 256 x 200 and 181 x 256
    (an odd padding: the extra row goes below) are padded with black to a square before the
    transform's resizes, upstream's and ours; without the padding the frames are squashed, and the
    values differ."""
    for cut in (lambda f: f[:, 28:228], lambda f: f[40:221, :]):
        few = [np.ascontiguousarray(cut(f)) for f in frames[:12]]
        ours = lfd.bicubic_aa_to_model(few, TARGET, CROP / TARGET, 0, letterboxed=True)
        u8 = [upstream_transform(chw(f), image_crop_size=[CROP, CROP], image_target_size=[TARGET, TARGET],
                                 shortest_image_edge=None, crop_fraction=None, letter_box_transform=True) for f in few]
        up = processor(images=u8, return_tensors="pt")
        mine = processor(images=list(ours), do_resize=False, do_rescale=False, do_normalize=False,
                         return_tensors="pt")
        assert torch.equal(mine["pixel_values"], up["pixel_values"])
        squashed = lfd.bicubic_aa_to_model(few, TARGET, CROP / TARGET, 0)
        assert not torch.equal(squashed, ours)


def test_upstreams_conv3d_patch_embedding_equals_ours_within_rounding(upstream_transform, processor, frames):
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionPatchEmbed
    from model.backbones import PatchEmbed3d, Qwen3VLVision
    few = frames[:4]
    ours = lfd.bicubic_aa_to_model(few, TARGET, CROP / TARGET, 0)
    u8 = [upstream_transform(chw(f), image_crop_size=[CROP, CROP], image_target_size=[TARGET, TARGET],
                             shortest_image_edge=None, crop_fraction=None) for f in few]
    pv = processor(images=u8, return_tensors="pt")["pixel_values"]
    width = 1024
    up = Qwen3VLVisionPatchEmbed(SimpleNamespace(patch_size=16, temporal_patch_size=2, in_channels=3,
                                                 hidden_size=width))
    torch.manual_seed(0)
    torch.nn.init.normal_(up.proj.weight, std=0.02)
    torch.nn.init.normal_(up.proj.bias, std=0.02)
    mine = PatchEmbed3d(width, 2, 16)
    with torch.no_grad():
        mine.weight.copy_(up.proj.weight)        # the converter copies (w, 3, 2, 16, 16) unchanged
        mine.bias.copy_(up.proj.bias)
        want = up(pv)                                                              # (n * 256, w)
        x = mine(ours).permute(0, 2, 3, 1)                                         # (n, g, g, w)
        got = Qwen3VLVision.window_order(SimpleNamespace(grid=TARGET // 16, merge=2), x).reshape(-1, width)
    rel = ((got - want).abs().max() / want.abs().max()).item()
    print(f"\npatch embedding, Conv3d over two frames vs conv2d of the time-summed weight: max rel {rel:.3g}")
    assert rel < 1e-5
