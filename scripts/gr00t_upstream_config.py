"""The LoongForge ModelConfig of an upstream GR00T checkpoint's config.json.

    model_config_from_upstream(config, backbone_config=None, overrides=(), name="",
                               processor_kwargs=None) -> ModelConfig

config is the checkpoint's config.json (lerobot's GR00TN17Config, model_type
"Gr00tN1d7"; Isaac-GR00T's Gr00tN1d6Config, "Gr00tN1d6"); backbone_config the
backbone's own config.json (Qwen3-VL for N1.7, Eagle for N1.6) when the
checkpoint names a backbone other than the released one (`model_name`):
upstream builds its backbone from `model_name`'s config, which is not in the
GR00T config.json. scripts/convert_gr00t_checkpoint.py uses this to import a
checkpoint folder without --model.

How each part is chosen
- The head: head_config_from_upstream (refuses what the head does not
  implement, ConversionError), then the gr00t_head.HEAD_CONFIGS preset with the
  same shapes (HEAD_SHAPE_FIELDS); no preset -> UpstreamConfigError listing the
  fields that differ from the nearest one. The fields a ModelConfig owns (state /
  action dims, horizon, embodiment slots, timestep buckets, noise_s, Beta alpha,
  dropouts, N1.6's state mask token) come from config.json.
- The backbone: the released configs gr00t-n1.7-3b / gr00t-n1.6-3b when
  model_name is the released backbone (nvidia/Cosmos-Reason2-2B,
  nvidia/Eagle-Block2A-2B-v2), else the fields read from backbone_config (or
  `model_name`/config.json when model_name is a local folder). The LM keeps
  `select_layer` layers. Settings our backbones do not implement (another
  activation, attention bias) are refused naming the field.
- Freezing: tune_visual, tune_llm, tune_top_llm_layers from config.json.
- The image settings: N1.7 from processor_kwargs (the checkpoint's
  processor_config.json, read_processor_kwargs) as upstream's processor takes
  them (n17_image_settings: its image_target_size, image_crop_size,
  shortest_image_edge, crop_fraction when it names an image_target_size, else
  lerobot's defaults 256 / 230; config.json's image fields are not read, as
  upstream does not read them); N1.6 from processor_kwargs too when they name
  an image_target_size (n16_image_settings: Isaac-GR00T's Gr00tN1d6Processor),
  else from config.json.
  image_size: N1.7: the size upstream's Qwen3-VL processor resizes the
  transform's image_target_size (must be square) to (qwen3vl_processor_side:
  224 becomes 256), with image_target_size the target; N1.6: the Eagle
  vision config's image_size (force_image_size) or the released 224.
  image_crop_fraction: crop_fraction, else image_crop_size / image_target_size
  (crop_fraction_of). N1.7: image_resample bicubic_aa, upstream's default
  transform (antialiased bicubic to shortest_image_edge or the target size,
  the crop, bicubic to the target, and the processor's bicubic to image_size;
  docs/training-semantics.md s3), letter_box_transform as image_letterbox
  (zero padding to a square first); with use_albumentations, image_resample
  cv2_area (OpenCV's INTER_AREA to shortest_image_edge or the target size,
  keeping the aspect ratio, the crop, INTER_AREA back to that size, which is
  then image_target_size; image_random_crop: the crop's window drawn per
  sample, as lerobot trains such checkpoints). N1.6 with processor_kwargs:
  image_resample bilinear_aa (Isaac-GR00T's torchvision transform: antialiased
  bilinear to image_target_size, torchvision's crop of image_crop_size, at a
  window drawn per view as its RandomCrop trains (image_random_crop), back to
  the target) or, with use_albumentations, cv2_area (as N1.7's, to
  shortest_image_edge, with image_random_crop); image_size is the transform's
  size (Eagle's processor does not resize). N1.6 without: the box resize after
  config.json's crop.
- overrides: ModelConfig `key=value` strings applied last (num_views,
  max_text_len: the data's shape, which no checkpoint records).
"""
import dataclasses
import json
import math
from pathlib import Path
from typing import Dict, List, Optional

from gr00t_checkpoint_names import ConversionError
from model.config import ModelConfig, apply_overrides, get_config
from model.gr00t_head import HEAD_CONFIGS, Gr00tHeadConfig, head_config_for

RELEASED = {  # model_type -> (our config of the released model, layout, upstream's released backbone name)
    "Gr00tN1d7": ("gr00t-n1.7-3b", "n1.7", "nvidia/Cosmos-Reason2-2B"),
    "Gr00tN1d6": ("gr00t-n1.6-3b", "n1.6", "nvidia/Eagle-Block2A-2B-v2"),
}
HEAD_SHAPE_FIELDS = ("hidden_size", "input_embedding_dim", "dit_layers", "dit_heads", "dit_head_dim", "vl_layers",
                     "vl_heads", "vl_head_dim", "attend_text_every_n_blocks", "timestep_dim", "max_seq_len")


class UpstreamConfigError(ValueError):
    """A config.json (or backbone config) this importer cannot represent; the message names the field."""


# The Qwen3-VL image processor's pixel bounds (its published preprocessor_config.json "size":
# shortest_edge / longest_edge are pixel counts; nvidia/Cosmos-Reason2-2B's own file is gated and
# was not read: test/reference/test_n17_pixel_values.py).
QWEN3VL_MIN_PIXELS, QWEN3VL_MAX_PIXELS = 65536, 16777216


def qwen3vl_processor_side(side: int, factor: int, min_pixels: int = QWEN3VL_MIN_PIXELS,
                           max_pixels: int = QWEN3VL_MAX_PIXELS) -> int:
    """The side a square side x side image has after the Qwen3-VL processor's resize: the nearest
    multiple of factor (patch x merge; Python's round, half to even), scaled up to at least
    min_pixels or down to at most max_pixels in multiples of factor (transformers' smart_resize for a
    square image)."""
    out = round(side / factor) * factor
    if out * out > max_pixels:
        beta = math.sqrt(side * side / max_pixels)
        out = max(factor, math.floor(side / beta / factor) * factor)
    elif out * out < min_pixels:
        beta = math.sqrt(min_pixels / (side * side))
        out = math.ceil(side * beta / factor) * factor
    return out


def _need(cond: bool, field: str, value, what: str):
    if not cond:
        raise UpstreamConfigError(f"upstream config {field}={value!r}: {what}")


def head_config_from_upstream(config: Dict, name: str = "from-upstream") -> Gr00tHeadConfig:
    """The scripts/model/gr00t_head.py Gr00tHeadConfig of an upstream GR00T N1.6/N1.7 config.json
    (GR00TN17Config / Gr00tN1d6Config fields). Raises ConversionError naming the field for any
    setting the upstream-exact head does not implement (the plain DiT, no vlln, a state history,
    a Beta beta other than 1, different dropouts in the DiT and vl_self_attention). model_type
    Gr00tN1d6 gives N1.6's state mask token (used when state_dropout_prob > 0); its
    state_additive_noise_scale becomes the head's state_noise_scale."""
    def need(cond: bool, field: str, what: str):
        if not cond:
            raise ConversionError(f"convert_gr00t_checkpoint: upstream config {field}={get(field)!r}: {what}")

    def get(field: str, default=None):
        node = config
        for part in field.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    dit = get("diffusion_model_cfg", {}) or {}
    vl = get("vl_self_attention_cfg", {}) or {}
    need(get("use_alternate_vl_dit", False) is True, "use_alternate_vl_dit", "only AlternateVLDiT is implemented")
    need(dit.get("interleave_self_attention", False) is True, "diffusion_model_cfg.interleave_self_attention",
         "must be true (AlternateVLDiT)")
    need(dit.get("norm_type", "ada_norm") == "ada_norm", "diffusion_model_cfg.norm_type", "must be ada_norm")
    need(dit.get("positional_embeddings") is None, "diffusion_model_cfg.positional_embeddings", "must be null")
    need(dit.get("output_dim") == get("hidden_size"), "diffusion_model_cfg.output_dim", "must equal hidden_size")
    need(get("use_vlln", True) is True, "use_vlln", "must be true")
    need(get("add_pos_embed", True) is True, "add_pos_embed", "must be true")
    need(get("state_history_length", 1) == 1, "state_history_length", "must be 1")
    need(float(get("noise_beta_beta", 1.0)) == 1.0, "noise_beta_beta", "must be 1.0")
    vl_layers = int(vl.get("num_layers", 0))
    if vl_layers > 0:
        need(vl.get("positional_embeddings") is None, "vl_self_attention_cfg.positional_embeddings", "must be null")
        need(float(vl.get("dropout", 0.0)) == float(dit.get("dropout", 0.0)), "vl_self_attention_cfg.dropout",
             "must equal diffusion_model_cfg.dropout (the head has one dropout)")
    state_dropout = float(get("state_dropout_prob", 0.0))
    cfg = Gr00tHeadConfig(
        name=name, backbone_width=int(get("backbone_embedding_dim")), hidden_size=int(get("hidden_size")),
        input_embedding_dim=int(get("input_embedding_dim")), dit_layers=int(dit["num_layers"]),
        dit_heads=int(dit["num_attention_heads"]), dit_head_dim=int(dit["attention_head_dim"]),
        vl_layers=vl_layers, vl_heads=int(vl.get("num_attention_heads", 1)),
        vl_head_dim=int(vl.get("attention_head_dim", 1)),
        attend_text_every_n_blocks=int(get("attend_text_every_n_blocks", 2)),
        num_timestep_buckets=int(get("num_timestep_buckets", 1000)), max_seq_len=int(get("max_seq_len", 1024)),
        num_embodiments=int(get("max_num_embodiments", 32)), max_state_dim=int(get("max_state_dim")),
        max_action_dim=int(get("max_action_dim")), action_horizon=int(get("action_horizon")),
        dropout=float(dit.get("dropout", 0.0)), state_dropout=state_dropout,
        state_noise_scale=float(get("state_additive_noise_scale", 0.0) or 0.0),
        noise_s=float(get("noise_s", 0.999)), beta_alpha=float(get("noise_beta_alpha", 1.5)),
        state_mask_token=get("model_type") == "Gr00tN1d6")
    try:
        return cfg.validate()
    except ValueError as e:
        raise ConversionError(f"convert_gr00t_checkpoint: upstream config: {e}") from None


def head_preset_of(head) -> str:
    """The HEAD_CONFIGS name whose shapes equal head's (vl_heads / vl_head_dim only when vl_layers > 0)."""
    def diff(p):
        keys = [f for f in HEAD_SHAPE_FIELDS if p.vl_layers > 0 or not f.startswith("vl_h")]
        return [f"{f}={getattr(head, f)} (preset {getattr(p, f)})" for f in keys if getattr(p, f) != getattr(head, f)]
    diffs = {name: diff(p) for name, p in HEAD_CONFIGS.items()}
    for name, d in diffs.items():
        if not d:
            return name
    near = min(diffs, key=lambda n: len(diffs[n]))
    raise UpstreamConfigError(f"the action head's shapes match no preset of scripts/model/gr00t_head.py "
                              f"HEAD_CONFIGS; nearest '{near}' differs in {', '.join(diffs[near])}; add a preset")


def qwen3vl_fields(b: Dict) -> Dict:
    """ModelConfig backbone fields of a Qwen3-VL config.json (Qwen3VLConfig.to_dict())."""
    t, v = b.get("text_config", {}), b.get("vision_config", {})
    rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
    _need(t.get("hidden_act", "silu") == "silu", "text_config.hidden_act", t.get("hidden_act"), "must be silu")
    _need(not t.get("attention_bias", False), "text_config.attention_bias", t.get("attention_bias"), "must be false")
    _need(v.get("hidden_act") == "gelu_pytorch_tanh", "vision_config.hidden_act", v.get("hidden_act"),
          "must be gelu_pytorch_tanh")
    _need(rope.get("mrope_interleaved", True) is True, "text_config.rope_parameters.mrope_interleaved",
          rope.get("mrope_interleaved"), "must be true")
    grid = math.isqrt(int(v["num_position_embeddings"]))
    _need(grid * grid == int(v["num_position_embeddings"]), "vision_config.num_position_embeddings",
          v["num_position_embeddings"], "must be a square")
    _need(int(v["out_hidden_size"]) == int(t["hidden_size"]), "vision_config.out_hidden_size", v["out_hidden_size"],
          "must equal text_config.hidden_size")
    return dict(backbone="qwen3vl", patch_size=int(v["patch_size"]), vit_layers=int(v["depth"]),
                vit_width=int(v["hidden_size"]), vit_heads=int(v["num_heads"]), vit_ffn=int(v["intermediate_size"]),
                vit_pos_grid=grid, vit_temporal_patch=int(v.get("temporal_patch_size", 2)),
                pixel_shuffle=int(v.get("spatial_merge_size", 2)),
                deepstack_layers=",".join(str(int(i)) for i in v.get("deepstack_visual_indexes", [])),
                llm_width=int(t["hidden_size"]), llm_heads=int(t["num_attention_heads"]),
                llm_kv_heads=int(t["num_key_value_heads"]), llm_head_dim=int(t["head_dim"]),
                llm_ffn=int(t["intermediate_size"]), vocab_size=int(t["vocab_size"]),
                rope_theta=float(rope.get("rope_theta", t.get("rope_theta", 5000000.0))),
                rms_eps=float(t.get("rms_norm_eps", 1e-6)),
                mrope_section=",".join(str(int(s)) for s in rope.get("mrope_section", [])))


def eagle_fields(b: Dict) -> Dict:
    """ModelConfig backbone fields of an Eagle (N1.6) config.json: vision_config (SigLIP-2) and
    text_config (Qwen3)."""
    t, v = b.get("text_config", {}), b.get("vision_config", {})
    _need(t.get("hidden_act", "silu") == "silu", "text_config.hidden_act", t.get("hidden_act"), "must be silu")
    _need(not t.get("attention_bias", False), "text_config.attention_bias", t.get("attention_bias"), "must be false")
    _need(float(b.get("downsample_ratio", 0.5)) == 0.5, "downsample_ratio", b.get("downsample_ratio"),
          "must be 0.5 (2 x 2 pixel unshuffle)")
    grid = math.isqrt(int(v["num_patches"]))
    _need(grid * grid == int(v["num_patches"]), "vision_config.num_patches", v["num_patches"], "must be a square")
    # Eagle3_VL's select_layer (default -4): -1 takes the ViT's last hidden state after post_layernorm;
    # another reads an earlier, un-normed hidden state in the encoder's window order as if it were in
    # raster order, which is not reproduced
    _need(int(b.get("select_layer", -4)) == -1, "select_layer", b.get("select_layer", "absent (Eagle3_VLConfig's -4)"),
          "must be -1 (the ViT's last hidden state); Eagle's hidden_states[select_layer] path is not reproduced")
    # Eagle-Block2A-2B-v2's own SigLIP-2 (modeling_siglip2.py Siglip2VisionConfig defaults): windows of
    # window_size patches except in full_attention_indexes, 2-D rotary with window_size as its base
    window = int(v.get("window_size", 14))
    full = v.get("full_attention_indexes", [7, 14, 21, 26])
    _need(isinstance(full, list) and all(isinstance(i, int) and i >= 0 for i in full), "vision_config.full_attention_indexes",
          full, "must be a list of layer indexes")
    fields = dict(backbone="eagle", patch_size=int(v["patch_size"]), vit_layers=int(v["num_hidden_layers"]),
                  vit_window=window if v.get("use_windows_attn", True) else 0,
                  vit_full_layers=",".join(str(i) for i in sorted(set(full))),
                  vit_rope_base=float(window) if v.get("use_rope", True) else 0.0,
                  vit_width=int(v["hidden_size"]), vit_heads=int(v["num_attention_heads"]),
                  vit_ffn=int(v["intermediate_size"]), vit_pos_grid=grid, pixel_shuffle=2,
                  llm_width=int(t["hidden_size"]), llm_heads=int(t["num_attention_heads"]),
                  llm_kv_heads=int(t["num_key_value_heads"]), llm_head_dim=int(t.get("head_dim", 128)),
                  llm_ffn=int(t["intermediate_size"]), vocab_size=int(t["vocab_size"]),
                  rope_theta=float((t.get("rope_parameters") or {}).get("rope_theta", t.get("rope_theta", 1000000.0))),
                  rms_eps=float(t.get("rms_norm_eps", 1e-6)))
    size = b.get("force_image_size") or v.get("image_size")
    if size:
        fields["image_size"] = int(size)
    return fields


def crop_fraction_of(config: Dict) -> float:
    """Upstream's center-crop fraction: crop_fraction, else image_crop_size / image_target_size (the
    rule of lerobot's N1.7 image transform), else 1 (no crop)."""
    fraction = config.get("crop_fraction")
    crop, target = config.get("image_crop_size"), config.get("image_target_size")
    if fraction is None and crop and target:
        _need(crop[0] == crop[1], "image_crop_size", crop, "must be square")
        fraction = crop[0] / float(target[0])
    if fraction is None or not 0.0 < float(fraction) < 1.0:
        return 1.0
    return float(fraction)


# lerobot 0.6.1's N1_7_DEFAULT_IMAGE_TARGET_SIZE / _CROP_SIZE: the geometry of a raw N1.7 checkpoint
# whose processor_config.json names no image_target_size.
N17_DEFAULT_IMAGE = {"image_target_size": [256, 256], "image_crop_size": [230, 230], "shortest_image_edge": None,
                     "crop_fraction": None}
N17_IMAGE_KEYS = tuple(N17_DEFAULT_IMAGE)


def read_processor_kwargs(folder: Path) -> Optional[Dict]:
    """processor_config.json's processor_kwargs in folder (Isaac-GR00T's N1.7 processor settings),
    or None when the file is absent."""
    p = Path(folder) / "processor_config.json"
    if not p.is_file():
        return None
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UpstreamConfigError(f"{p}: not JSON ({e})") from None
    kwargs = data.get("processor_kwargs", {}) if isinstance(data, dict) else {}
    return kwargs if isinstance(kwargs, dict) else {}


def n17_image_settings(processor_kwargs: Optional[Dict]) -> Dict:
    """The image geometry upstream's N1.7 processor uses for a raw checkpoint (lerobot 0.6.1
    make_groot_n1_7_pre_post_processors): processor_config.json's image_crop_size,
    image_target_size, shortest_image_edge and crop_fraction when it names an image_target_size,
    else N17_DEFAULT_IMAGE; use_albumentations and letter_box_transform from it (false when absent
    or not booleans, as upstream reads them). config.json's image fields are not read: upstream
    does not read them either."""
    kw = processor_kwargs or {}
    src = kw if kw.get("image_target_size") is not None else N17_DEFAULT_IMAGE
    out = {k: src.get(k) for k in N17_IMAGE_KEYS}
    for k in ("use_albumentations", "letter_box_transform"):
        out[k] = kw.get(k) if isinstance(kw.get(k), bool) else False
    out["source"] = "processor_config.json" if src is kw else "upstream's N1.7 default"
    return out


# Isaac-GR00T's Gr00tN1d6Processor constructor defaults (gr00t/model/gr00t_n1d6/processing_gr00t_n1d6.py): what
# a processor_config.json without the key gets.
N16_PROCESSOR_DEFAULTS = {"shortest_image_edge": 512, "crop_fraction": 0.95, "use_albumentations": False}
# Eagle-Block2A-2B-v2's process_vision_info (processing_eagle3_vl.py fetch_image, smart_resize): images whose
# sides are multiples of this, at least twice it, keep their size; others are resized with PIL.
EAGLE_SIZE_FACTOR = 28


def _eagle_keeps(side: int, field: str, value) -> None:
    _need(side % EAGLE_SIZE_FACTOR == 0 and side >= 2 * EAGLE_SIZE_FACTOR, field, value,
          f"gives {side} x {side} images, which Eagle's process_vision_info resizes (its smart_resize keeps only "
          f"multiples of {EAGLE_SIZE_FACTOR} of at least {2 * EAGLE_SIZE_FACTOR}) with PIL, which is not "
          "reproduced; import a checkpoint whose transform ends at such a size")


def n16_image_settings(processor_kwargs: Optional[Dict]) -> Optional[Dict]:
    """The image transform Isaac-GR00T's N1.6 processor (Gr00tN1d6Processor) builds from processor_config.json's
    processor_kwargs, or None when they name no image_target_size (the import then keeps config.json's crop and
    the box resize). Its eval transform (gr00t/model/gr00t_n1d6/image_augmentations.py):
    - use_albumentations false: torchvision's Resize to image_target_size, CenterCrop of image_crop_size, Resize
      back (image_resample bilinear_aa; crop_fraction and shortest_image_edge are not read; trained with
      RandomCrop, a window per frame: image_random_crop);
    - true: INTER_AREA of the shorter side to shortest_image_edge (else the target), the fractional crop
      (crop_fraction, else image_crop_size / image_target_size), INTER_AREA back (cv2_area; trained with a random
      window shared by a sample's views: image_random_crop).
    Eagle's image processor then only normalises, so the ViT sees the transform's size; before it, Isaac-GR00T's
    collator passes the images through Eagle's process_vision_info, whose smart_resize resizes (with PIL) any
    side that is not a multiple of 28 of at least 56: such sizes are refused (EAGLE_SIZE_FACTOR).
    Keys absent from the file take the constructor's defaults (N16_PROCESSOR_DEFAULTS)."""
    kw = dict(N16_PROCESSOR_DEFAULTS, **(processor_kwargs or {}))
    target = kw.get("image_target_size")
    if processor_kwargs is None or not target:
        return None
    _need(len(target) == 2 and target[0] == target[1], "image_target_size", target, "must be square")
    crop = kw.get("image_crop_size")
    if crop is not None:
        _need(len(crop) == 2 and crop[0] == crop[1], "image_crop_size", crop, "must be square")
    if kw.get("use_albumentations") is True:
        side = int(kw.get("shortest_image_edge") or target[0])
        _need(kw.get("crop_fraction") is not None or crop is not None, "image_crop_size", crop,
              "is needed when crop_fraction is null")
        fraction = crop_fraction_of(kw)   # crop_fraction, else image_crop_size / image_target_size
        _eagle_keeps(side, "shortest_image_edge" if kw.get("shortest_image_edge") else "image_target_size",
                     kw.get("shortest_image_edge") or target)
        return {"image_resample": "cv2_area", "image_target_size": side, "image_size": side,
                "image_crop_fraction": fraction, "image_random_crop": fraction < 1.0}
    _need(crop is not None, "image_crop_size", crop,
          "is needed without use_albumentations (Isaac-GR00T's torchvision transform center-crops to it)")
    _eagle_keeps(int(target[0]), "image_target_size", target)
    return {"image_resample": "bilinear_aa", "image_target_size": int(target[0]), "image_size": int(target[0]),
            "image_crop_fraction": crop_fraction_of({"image_crop_size": crop, "image_target_size": target}),
            "image_random_crop": crop[0] < target[0]}


def read_backbone_config(config: Dict, given: Optional[Path] = None) -> Optional[Dict]:
    """The backbone config to use: `given` (a config.json or a folder holding one); else model_name's
    config.json when model_name is a local folder; None for the released backbone."""
    base = RELEASED.get(config.get("model_type"))
    path = given
    name = str(config.get("model_name", ""))
    if path is None:
        if base is not None and name.rstrip("/") == base[2]:
            return None
        if (Path(name) / "config.json").is_file():
            path = Path(name)
        else:
            raise UpstreamConfigError(f"upstream config model_name={name!r}: not the released backbone "
                                      f"({base[2] if base else '?'}) and not a local folder with config.json; "
                                      "pass --backbone-config with the backbone's config.json")
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UpstreamConfigError(f"--backbone-config {path}: no such file")
    return json.loads(path.read_text())


def model_config_from_upstream(config: Dict, backbone_config: Optional[Dict] = None,
                               overrides: List[str] = (), name: str = "",
                               processor_kwargs: Optional[Dict] = None) -> ModelConfig:
    model_type = config.get("model_type")
    _need(model_type in RELEASED, "model_type", model_type, f"must be one of {sorted(RELEASED)}")
    base_name, layout, _ = RELEASED[model_type]
    try:
        head = head_config_from_upstream(config, name=name or base_name)
    except ConversionError as e:
        raise UpstreamConfigError(str(e)) from None
    preset = head_preset_of(head)
    fields: Dict = {}
    if backbone_config is not None:
        fields.update(qwen3vl_fields(backbone_config) if layout == "n1.7" else eagle_fields(backbone_config))
    # N1.7: the processor's settings (processor_config.json), as upstream's processor reads them
    n16_image = n16_image_settings(processor_kwargs) if layout == "n1.6" else None
    image = n17_image_settings(processor_kwargs) if layout == "n1.7" else config
    target = image.get("image_target_size")
    if target:
        _need(len(target) == 2 and target[0] == target[1], "image_target_size", target, "must be square")
        fields["image_size"] = int(target[0])
    fields["image_crop_fraction"] = crop_fraction_of(image)
    if layout == "n1.7":  # lerobot's N1.7 transforms: the default (torch) one, or cv2's with use_albumentations
        fields["image_letterbox"] = image["letter_box_transform"]
        base = get_config(base_name)
        side = int(fields.get("image_size", base.image_size))
        if image["use_albumentations"]:  # INTER_AREA to shortest_image_edge (else the target), crop, back to it
            fields["image_resample"] = "cv2_area"
            fields["image_resize_edge"] = 0
            fields["image_random_crop"] = fields["image_crop_fraction"] < 1.0  # lerobot trains with a random window
            side = int(image.get("shortest_image_edge") or side)
        else:
            fields["image_resample"] = "bicubic_aa"
            fields["image_resize_edge"] = int(image.get("shortest_image_edge") or 0)
        # upstream's processor resizes the transform's frames again, to its smart_resize size
        factor = int(fields.get("patch_size", base.patch_size)) * int(fields.get("pixel_shuffle", base.pixel_shuffle))
        fields["image_target_size"] = side
        fields["image_size"] = qwen3vl_processor_side(side, factor)
    elif n16_image is not None:  # Isaac-GR00T's N1.6 processor, from processor_config.json
        fields.update(n16_image)
    select = int(config.get("select_layer", 16))
    _need(select >= 1, "select_layer", select, "must be >= 1 (the LM layers kept)")
    fields.update(
        name=name or f"{base_name}-import", llm_layers=select, gr00t_head=preset,
        max_state_dim=head.max_state_dim, max_action_dim=head.max_action_dim, action_horizon=head.action_horizon,
        max_action_horizon=max(head.action_horizon, 64), num_embodiments=head.num_embodiments,
        num_timestep_buckets=head.num_timestep_buckets, noise_s=head.noise_s, beta_alpha=head.beta_alpha,
        gr00t_dropout=head.dropout, gr00t_state_dropout=head.state_dropout,
        gr00t_state_noise_scale=head.state_noise_scale,
        gr00t_state_mask_token=head.state_mask_token, tune_visual=bool(config.get("tune_visual", False)),
        tune_llm=bool(config.get("tune_llm", False)),
        tune_top_llm_layers=min(int(config.get("tune_top_llm_layers", 0)), select))
    _need(int(config.get("backbone_embedding_dim", 0)) == int(fields.get("llm_width", get_config(base_name).llm_width)),
          "backbone_embedding_dim", config.get("backbone_embedding_dim"), "must equal the LM width")
    try:
        cfg = dataclasses.replace(get_config(base_name), **fields).validate()
        cfg = apply_overrides(cfg, list(overrides))
    except ValueError as e:
        raise UpstreamConfigError(f"the imported config is invalid: {e}") from None
    got = head_config_for(cfg)
    want = dataclasses.replace(head, name=got.name)
    if want.vl_layers == 0:   # no vl_self_attention: its head counts are unused
        want = dataclasses.replace(want, vl_heads=got.vl_heads, vl_head_dim=got.vl_head_dim)
    _need(got == want, "(head)", preset, f"rebuilds as {got}, config.json says {want} (a bug: report it)")
    return cfg


__all__ = ["model_config_from_upstream", "head_config_from_upstream", "read_backbone_config", "read_processor_kwargs",
           "n17_image_settings", "n16_image_settings", "head_preset_of", "qwen3vl_fields", "eagle_fields", "UpstreamConfigError", "RELEASED"]
