"""image_resample=bicubic_aa (training-semantics s3) is GR00T N1.7's default image transform:

- the reference trainer's frames (lf_dataset.bicubic_aa_to_model) are, before the normalisation,
  bit for bit what upstream's own function makes of the same uint8 frames: lerobot 0.6.1's
  `_transform_n1_7_image_for_vlm_torch`, its source taken unchanged from the wheel
  (test/lerobot_oracle.py) and run here on torch and torchvision;
- for random frames of the bundled cameras' size (256 x 256) and of other shapes (non-square,
  upscaled, already at the first size), with and without the crop, and with a shortest_image_edge
  of its own.

image_resample=cv2_area is the transform of N1.7 checkpoints saved with use_albumentations: the
reference trainer's frames (lf_dataset.cv2_area_to_model) equal upstream's
`_transform_n1_7_image_for_vlm_albumentations` (its eval form: the center crop), normalised, bit
for bit, letterboxed or not, on the cameras' size and others.

image_resample=bilinear_aa is Isaac-GR00T N1.6's torchvision transform: the reference trainer's
frames (lf_dataset.bilinear_aa_to_model) equal torchvision's Resize, CenterCrop, Resize composed as
Isaac-GR00T's image_augmentations.build_image_transformations composes them (read from its source:
it ships in no package), normalised as Eagle's processor does, bit for bit; its train form
(image_random_crop: RandomCrop, a window per frame) equals torchvision's crop at the offsets ours
draws, which take RandomCrop's values, each about equally often.

loongforge-train's frames equal the reference trainer's bit for bit through e2e_parity's
bicubic_resample, bilinear_resample and cv2_area_resample cases (the whole training run); its INTER_AREA resize equals
cv2's on its own cases (test_area_resize).
"""
import numpy as np
import pytest
import torch

import lf_dataset as lfd  # noqa: E402  (test/reference/conftest.py puts scripts/reference on the path)


def normalised(u8_chw: torch.Tensor) -> torch.Tensor:
    """Upstream's Qwen3-VL normalisation of the uint8 frame (test_n17_pixel_values.py)."""
    return (u8_chw.to(torch.float32) - 127.5) / 127.5


@pytest.mark.parametrize("shape,size,crop_size,edge", [
    ((256, 256), 224, 200, None),   # the bundled cameras' size, N1.7-like crop
    ((480, 640), 256, 230, None),   # non-square: upstream resizes to a square first
    ((480, 640), 256, 230, 288),    # shortest_image_edge of its own
    ((100, 77), 64, None, None),    # upscaled, no crop
    ((256, 256), 256, 230, None),   # already at the first size: upstream's resize is a no-op
])
def test_the_reference_frames_equal_upstream_n17_transform_bit_for_bit(upstream_transform, shape, size, crop_size, edge):
    g = torch.Generator().manual_seed(sum(shape) + size)
    frames = [torch.randint(0, 256, (*shape, 3), dtype=torch.uint8, generator=g).numpy() for _ in range(2)]
    fraction = crop_size / size if crop_size else 1.0
    ours = lfd.bicubic_aa_to_model(frames, size, fraction, edge or 0)
    for v, f in enumerate(frames):
        up = upstream_transform(torch.from_numpy(np.ascontiguousarray(f.transpose(2, 0, 1))),
                                image_crop_size=[crop_size, crop_size] if crop_size else None,
                                image_target_size=[size, size], shortest_image_edge=edge, crop_fraction=None)
        assert up.dtype == torch.uint8 and tuple(up.shape) == (3, size, size)
        assert torch.equal(ours[v], normalised(up)), f"view {v}"


@pytest.mark.parametrize("shape,size,crop_size,edge,letterboxed", [
    ((256, 256), 256, 230, None, False),   # the cameras' size, lerobot's default geometry: crop, back up
    ((256, 256), 224, 200, None, False),   # shrunk by area weights first
    ((512, 512), 256, None, None, False),  # 2 x 2 blocks, no crop
    ((480, 480), 256, 230, 288, False),    # shortest_image_edge: the transform ends at 288
    ((200, 256), 256, 243, None, True),    # letterboxed: padded to 256 x 256 first
    ((480, 640), 224, 212, None, True),    # letterboxed, then shrunk
])
def test_the_reference_cv2_area_frames_equal_upstream_albumentations_transform_bit_for_bit(
        upstream_albumentations_transform, shape, size, crop_size, edge, letterboxed):
    g = torch.Generator().manual_seed(sum(shape) + size + 1)
    frames = [torch.randint(0, 256, (*shape, 3), dtype=torch.uint8, generator=g).numpy() for _ in range(2)]
    target = edge or size                     # the transform's last resize goes to this size
    fraction = crop_size / size if crop_size else 1.0
    ours = lfd.cv2_area_to_model(frames, target, fraction, 0, letterboxed)
    for v, f in enumerate(frames):
        up = upstream_albumentations_transform(
            f, image_crop_size=[crop_size, crop_size] if crop_size else None, image_target_size=[size, size],
            shortest_image_edge=edge, crop_fraction=None, letter_box_transform=letterboxed)
        assert up.dtype == np.uint8 and up.shape == (target, target, 3)
        assert torch.equal(ours[v], normalised(torch.from_numpy(np.ascontiguousarray(up.transpose(2, 0, 1))))), \
            f"view {v}"


@pytest.mark.parametrize("position", [(0.0, 1.0), (0.5, 0.2), (0.31, 0.77), (0.999, 0.001)])
def test_the_reference_cv2_area_train_window_equals_upstreams_at_the_same_position(
        upstream_albumentations_transform, position):
    """image_random_crop: upstream's train-time crop (crop_position) and ours at the same (pos_y, pos_x),
    on the cameras' size with lerobot's default geometry; the position moves the window."""
    g = torch.Generator().manual_seed(11)
    frame = torch.randint(0, 256, (256, 256, 3), dtype=torch.uint8, generator=g).numpy()
    ours = lfd.cv2_area_to_model([frame], 256, 230 / 256, 0, False, position)
    up = upstream_albumentations_transform(frame, image_crop_size=[230, 230], image_target_size=[256, 256],
                                           shortest_image_edge=None, crop_fraction=None, crop_position=position)
    assert torch.equal(ours[0], normalised(torch.from_numpy(np.ascontiguousarray(up.transpose(2, 0, 1)))))
    assert not torch.equal(ours, lfd.cv2_area_to_model([frame], 256, 230 / 256))


def test_the_crop_position_is_drawn_per_stream_position_from_the_run_seed():
    """Section 4: (pos_y, pos_x) from a generator seeded with ((seed * 1000003 + p) mod 2^63) XOR CROP_SALT."""
    import types
    sb = types.SimpleNamespace(seed=5)

    def draw(p, count=1):
        return lfd.SampleBuilder.crop_positions(sb, p, count)
    g = torch.Generator().manual_seed(((5 * 1000003 + 42) % (1 << 63)) ^ 0x43524F505F504F53)
    u = [float(v) for v in torch.rand(4, generator=g)]
    assert draw(42) == [tuple(u[:2])] and draw(42, 2) == [tuple(u[:2]), tuple(u[2:])]
    assert draw(42) != draw(43)


@pytest.mark.parametrize("shape,target,crop", [
    ((256, 256), 224, 212),   # the bundled cameras' size, N1.6-like: offset round(6) = 6
    ((480, 640), 224, 209),   # non-square, resized to a square; offset round(7.5) = 8 (half to even)
    ((200, 256), 256, 243),   # offset round(6.5) = 6 (half to even)
    ((100, 77), 64, None),    # upscaled, no crop
    ((224, 224), 224, 200),   # already at the target: the first resize is a no-op
])
def test_the_reference_bilinear_aa_frames_equal_isaac_gr00t_n16_torchvision_transform_bit_for_bit(shape, target, crop):
    """image_resample=bilinear_aa: Isaac-GR00T N1.6's eval transform (gr00t/model/gr00t_n1d6/
    image_augmentations.py build_image_transformations: ToImage, Resize(image_target_size),
    CenterCrop(image_crop_size), Resize(image_target_size)), composed here from torchvision's own
    transforms, then Eagle's processor's normalisation (it does not resize)."""
    from torchvision.transforms import v2
    g = torch.Generator().manual_seed(sum(shape) + target + 2)
    frames = [torch.randint(0, 256, (*shape, 3), dtype=torch.uint8, generator=g).numpy() for _ in range(2)]
    size = [target, target]
    upstream = v2.Compose([v2.ToImage(), v2.Resize(size=size), v2.CenterCrop(size=[crop or target] * 2),
                           v2.Resize(size=size)])
    ours = lfd.bilinear_aa_to_model(frames, target, crop / target if crop else 1.0)
    for v, f in enumerate(frames):
        up = upstream(f)
        assert up.dtype == torch.uint8 and tuple(up.shape) == (3, target, target)
        assert torch.equal(ours[v], normalised(up.as_subclass(torch.Tensor))), f"view {v}"
    if crop:  # the crop changes the frames (the test can fail)
        assert not torch.equal(ours, lfd.bilinear_aa_to_model(frames, target, 1.0))


@pytest.mark.parametrize("positions", [[(0.0, 0.999), (0.5, 0.2)], [(0.79, 0.8), (0.31, 0.77)]])
def test_the_reference_bilinear_aa_train_windows_equal_torchvisions_crop_at_their_offsets(positions):
    """image_random_crop with bilinear_aa: Isaac-GR00T N1.6's train transform (Resize, RandomCrop,
    Resize) with RandomCrop's window at the offsets ours draws, min(floor((T - c + 1) pos), T - c), each
    view its own window, composed from torchvision's functional resize and crop."""
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as TF
    g = torch.Generator().manual_seed(23)
    frames = [torch.randint(0, 256, (256, 256, 3), dtype=torch.uint8, generator=g).numpy() for _ in range(2)]
    ours = lfd.bilinear_aa_to_model(frames, 224, 212 / 224, 0, False, positions)
    for v, (f, (py, px)) in enumerate(zip(frames, positions)):
        top, left = min(int(13 * py), 12), min(int(13 * px), 12)   # T - c + 1 = 13 offsets per side
        first = TF.resize(v2.ToImage()(f), [224, 224])
        up = TF.resize(TF.crop(first, top, left, 212, 212), [224, 224])
        assert torch.equal(ours[v], normalised(up.as_subclass(torch.Tensor))), f"view {v}"
    assert not torch.equal(ours[0], ours[1])   # the views' windows differ
    assert not torch.equal(ours, lfd.bilinear_aa_to_model(frames, 224, 212 / 224))   # not the center


def test_the_windows_offsets_are_those_torchvisions_random_crop_draws_each_equally_likely():
    """Over many samples our offsets take the same values as RandomCrop's (0 .. T - c), each about
    equally often (a chi-square bound), and the views of a sample draw their own windows."""
    import types
    from torchvision.transforms import v2
    x = torch.zeros(3, 224, 224, dtype=torch.uint8)
    theirs = {v2.RandomCrop(212).make_params([x])["top"] for _ in range(2000)}
    sb = types.SimpleNamespace(seed=3, resample="bilinear_aa", cameras=[0, 1])
    draws = [lfd.SampleBuilder.crop_positions(sb, p) for p in range(6500)]
    assert all(len(d) == 2 for d in draws) and sum(d[0] != d[1] for d in draws) == len(draws)
    tops = np.array([min(int(13 * d[0][0]), 12) for d in draws])
    counts = np.bincount(tops, minlength=13)
    assert set(tops.tolist()) == theirs == set(range(13))
    chi2 = float(((counts - 500.0) ** 2 / 500.0).sum())
    print(f"offset counts {counts.tolist()}, chi-square {chi2:.1f} (12 degrees of freedom)")
    assert chi2 < 32.9   # p = 0.001


def test_a_cv2_area_frame_that_stays_non_square_is_refused_naming_the_fix():
    frame = np.zeros((200, 256, 3), np.uint8)
    with pytest.raises(ValueError, match=r"a 200 x 256 frame becomes 256 x 328 .* letter_box_transform"):
        lfd.cv2_area_to_model([frame], 256, 1.0)


def test_a_box_model_with_a_target_size_of_its_own_is_refused_at_export():
    """image_target_size (the transform's size before upstream's processor resizes to image_size) is
    bicubic_aa's; the box resize goes to image_size directly."""
    import dataclasses
    from model.config import get_config
    tiny = get_config("n16-tiny")
    with pytest.raises(ValueError, match=r"image_target_size=48: must be 0 or image_size when image_resample is box"):
        dataclasses.replace(tiny, image_target_size=48).validate()
    dataclasses.replace(tiny, image_target_size=tiny.image_size).validate()
    dataclasses.replace(tiny, image_resample="bicubic_aa", image_target_size=48).validate()
    dataclasses.replace(tiny, image_resample="cv2_area", image_target_size=48).validate()
    dataclasses.replace(tiny, image_resample="bilinear_aa", image_target_size=48).validate()
    for resample in ("cv2_area", "bilinear_aa"):
        with pytest.raises(ValueError, match=rf"image_resize_edge=72: must be 0 when image_resample is {resample}"):
            dataclasses.replace(tiny, image_resample=resample, image_resize_edge=72).validate()
    for resample in ("cv2_area", "bilinear_aa"):
        dataclasses.replace(tiny, image_resample=resample, image_crop_fraction=0.9, image_random_crop=True).validate()
    for resample, crop in (("bicubic_aa", 0.9), ("cv2_area", 1.0), ("bilinear_aa", 1.0)):
        with pytest.raises(ValueError, match=r"image_random_crop=True: must be false unless image_resample is "
                                             r"cv2_area or bilinear_aa with an image_crop_fraction below 1"):
            dataclasses.replace(tiny, image_resample=resample, image_crop_fraction=crop,
                                image_random_crop=True).validate()
