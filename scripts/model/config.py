"""ModelConfig: every architecture, freezing and default batch-shape field of the
N1.6-style model family, defined once.

Contract
- `ModelConfig` is a flat dataclass of ints/floats/bools/str; `to_json()` and
  `from_json()` round-trip it exactly (the exported TorchScript file carries it as
  `loongforge/config.json`).
- `CONFIGS` holds the named configs (four n16-*, five gr00t-*: see below);
  `get_config(name, **overrides)` returns a validated copy;
  `apply_overrides(cfg, ["key=value", ...])` parses `--set` strings using each
  field's declared type.
- `validate()` raises ValueError naming the offending field and what to change.

Sizing notes (parameter counts are printed by `export.py` and pinned by
test/model/test_model_family.py):
- n16-tiny: CPU tests and the README demo. ViT 2x128 on 64 px / patch 8 (64
  patches -> 16 tokens per view after the 2x2 pixel shuffle), LM 2x128 (4 q /
  2 kv heads of 32), DiT 4x128, embodiment MLP hidden 128,
  tune_top_llm_layers 1 (it has only 2 LM layers). About 6.6 M parameters, 3.4 M
  of them in the 32-slot embodiment MLPs.
- n16-1b: ViT 12x768 (ViT-B/14 at 224 px: 256 patches -> 64 tokens per view),
  LM 12x1536 (12 q / 4 kv heads of 128, SwiGLU FFN 6144 = 4x width),
  tokenizer-sized vocab 8192, DiT 16x1024 (16 heads of 64, FFN 4096),
  embodiment MLP hidden 1024. About 0.97 B.
- n16-3b: the faithful N1.6 shape. SigLIP-2 so400m-like ViT 27x1152 (16 heads,
  FFN 4304), Qwen3-1.7B-like LM truncated to 16 layers (2048 wide, 16 q / 8 kv
  heads of 128, FFN 6144, vocab 151936), DiT 32x1536 (32 heads x 48, FFN 6144),
  embodiment MLP hidden 1024. About 3.08 B.
- n16-12b: hypothetical scale-up. ViT-g/14-like 40x1408 (16 heads of 88, FFN
  6144, about 1.0 B), LM 32x4096 (32 q / 8 kv heads of 128, FFN 14336 as in
  Llama-3-8B, vocab 151936), DiT 32x2048 (32 heads of 64, FFN 8192), embodiment
  MLP hidden 2048. About 11.5 B; the LM FFN is the knob that was tuned (12288
  gives 10.7 B, out of range; 16384 gives 12.3 B).
- Every config defaults to 1 view, max_text_len 32 and action_horizon 16 (the
  data defaults of configs/n16.yaml); flops.json is computed for that shape.
- Every DiT block carries two AdaLN modulations (2 x w x 2w parameters each),
  so a DiT block costs about 16 w^2 parameters.
"""

import dataclasses
import json
from dataclasses import dataclass, fields
from typing import Dict, List

from .gr00t_head import HEAD_CONFIGS, head_config_for  # the upstream-exact GR00T head's presets
from . import prompt
from .tokenizer import TOKENIZER_VOCAB  # the tokenizer's id space, fixed for every config


@dataclass
class ModelConfig:
    name: str = "custom"

    # ---- vision: SigLIP-2-style ViT + 2x2 pixel shuffle + 2-layer MLP connector
    image_size: int = 64          # square input, pixels
    # Center crop of each frame before the resize to image_size (1 = none): upstream GR00T's
    # crop_fraction (or image_crop_size / image_target_size), read from a checkpoint's config.json (N1.6)
    # or processor_config.json (N1.7)
    # by scripts/convert_gr00t_checkpoint.py; both trainers apply it (docs/training-semantics.md s3).
    image_crop_fraction: float = 1.0
    # How a frame becomes image_size x image_size (docs/training-semantics.md s3): "box" = the
    # center crop above, then a box average (adaptive_avg_pool2d); "bicubic_aa" = GR00T N1.7's
    # default transform (lerobot 0.6.1 _transform_n1_7_image_for_vlm_torch): an antialiased
    # bicubic resize of the uint8 frame to image_resize_edge x image_resize_edge (0 = the target
    # size), the center crop there (round(E * f) rows and columns), an antialiased bicubic resize
    # to image_target_size (0 = image_size), then, when that is not image_size, the same resize to
    # image_size: upstream's Qwen3-VL processor resizes the transform's frames again to its
    # smart_resize size (multiples of 32, at least 65,536 pixels: a 224 target becomes 256), which
    # is what the ViT sees. Imports of N1.7 checkpoints get bicubic_aa with image_target_size their
    # image_target_size and image_size the processor's (scripts/gr00t_upstream_config.py).
    # "cv2_area" = the transform of N1.7 checkpoints saved with use_albumentations (lerobot 0.6.1
    # _transform_n1_7_image_for_vlm_albumentations, at eval): OpenCV's INTER_AREA resize of the
    # uint8 frame's shorter side to image_target_size (0 = image_size; the aspect ratio kept, so
    # frames must be square or letterboxed), the center crop there (int(T * f) rows and columns),
    # INTER_AREA back to image_target_size, then the processor's antialiased bicubic to image_size
    # when that differs; image_resize_edge must be 0 (imports put shortest_image_edge in the target).
    # "bilinear_aa" = Isaac-GR00T N1.6's torchvision transform (at eval): an antialiased bilinear
    # resize of the uint8 frame to image_target_size x image_target_size (0 = image_size; the aspect
    # ratio not kept), torchvision's center crop there (round(T * f) rows and columns from
    # round((T - c) / 2)), the same resize back to image_target_size, then to image_size when that
    # differs (Eagle's processor does not resize: imports make them equal); image_resize_edge must be 0.
    image_resample: str = "box"
    image_resize_edge: int = 0
    image_target_size: int = 0
    # all but box: each frame is first padded with zeros (black) to a square of its longer
    # side, (square - w) // 2 columns on the left and (square - h) // 2 rows on top, the rest
    # right and below: upstream N1.7's letter_box_transform, which keeps the aspect ratio through
    # the square resizes. A square frame is unchanged.
    image_letterbox: bool = False
    # cv2_area or bilinear_aa with a crop only: the crop window at a position drawn per sample (both
    # trainers: docs/training-semantics.md s4) instead of the center, as upstream trains: cv2_area
    # one window per sample, shared by its views (albumentations' replay); bilinear_aa one per view
    # (Isaac-GR00T N1.6's torchvision RandomCrop). Imports of checkpoints with a crop set it.
    image_random_crop: bool = False
    patch_size: int = 8
    vit_layers: int = 2
    vit_width: int = 128
    vit_heads: int = 4
    vit_ffn: int = 512
    pixel_shuffle: int = 2        # merge pixel_shuffle^2 neighbouring patches into one token
    # "n16": N16Model's backbone (model/layers.py: ViT, connector, LM); "eagle": GR00T N1.6's exact backbone
    # (SigLIP-2 + Eagle pixel unshuffle and mlp1 + Qwen3 LM); "qwen3vl": GR00T N1.7's exact backbone
    # (Qwen3-VL ViT with deepstack + Qwen3-VL text with multimodal RoPE). The exact ones need a
    # gr00t_head (model/backbones.py, model/gr00t.py).
    backbone: str = "n16"
    vit_pos_grid: int = 0         # eagle / qwen3vl: side of the learned position table (16: SigLIP-2 256 rows; 48: Qwen3-VL 2304)
    vit_temporal_patch: int = 2   # qwen3vl: frames per Conv3d patch (a still image is repeated)
    # eagle: Isaac-GR00T's Eagle-Block2A-2B-v2 SigLIP-2 (its modeling_siglip2.py, not transformers'):
    # attention inside vit_window x vit_window patch windows (use_windows_attn; edge windows cropped;
    # 0 = every layer sees the whole image) except in the vit_full_layers ("7,14,21,26":
    # full_attention_indexes), and a 2-D rotary embedding of every layer's q and k at the patch's
    # (row, column) with base vit_rope_base (use_rope; upstream passes its window_size, 14, as the
    # base; 0 = none)
    vit_window: int = 0
    vit_full_layers: str = ""
    vit_rope_base: float = 0.0    # (qwen3vl's 2-D rotary base is vit_rope_theta)
    vit_rope_theta: float = 10000.0  # qwen3vl: the ViT's 2-D rotary base
    deepstack_layers: str = ""    # qwen3vl: ViT layers whose merged features join the first LM layers, "5,11,17"

    # ---- language model: Qwen3-style causal decoder used as a feature encoder
    llm_layers: int = 2
    llm_width: int = 128
    llm_heads: int = 4            # query heads
    llm_kv_heads: int = 2         # key/value heads (GQA)
    llm_head_dim: int = 32
    llm_ffn: int = 384            # SwiGLU hidden size
    vocab_size: int = TOKENIZER_VOCAB
    rope_theta: float = 1000000.0
    rms_eps: float = 1e-6
    mrope_section: str = ""       # qwen3vl: rotary frequencies per (t, h, w), interleaved, "24,20,20"
    # qwen3vl / eagle: the checkpoint's chat template as token ids with slots (model/prompt.py: -1 =
    # one view's image tokens, -2 = the task text), "" = none ([images ; text] as the dataset stores
    # it). Set by an N1.7 or N1.6 import from the tokenizer's chat template (scripts/chat_template.py).
    chat_template_ids: str = ""
    pad_token_id: int = 0         # with chat_template_ids: the tokenizer's pad id (upstream's padding)

    # ---- action head: DiT with alternating cross/self attention and AdaLN
    dit_layers: int = 4
    dit_width: int = 128
    dit_heads: int = 4
    dit_ffn: int = 512
    timestep_dim: int = 256       # sinusoidal features fed to the timestep MLP
    num_timestep_buckets: int = 1000
    max_action_horizon: int = 64  # rows of the learned action position embedding
    # "" = the n16 action head above; else a gr00t_head.HEAD_CONFIGS name: the upstream-exact
    # GR00T N1.6/N1.7 head (model/gr00t.py), whose shapes come from that entry (the dit_* and
    # timestep_dim fields above are then unused; backbone width, state/action dims, horizon,
    # embodiment slots and the flow-matching fields come from this config).
    gr00t_head: str = ""
    gr00t_dropout: float = -1.0        # >= 0: the head's attention/feed-forward dropout instead of the preset's
    gr00t_state_dropout: float = -1.0  # >= 0: the head's state dropout instead of the preset's
    gr00t_state_mask_token: bool = False  # N1.6: a dropped state token is a learned mask token (else zeroed)
    gr00t_state_noise_scale: float = -1.0  # >= 0: N1.6's additive state noise std (train mode) instead of the preset's

    # ---- per-embodiment MLPs (category-specific linears)
    num_embodiments: int = 32
    max_state_dim: int = 64
    max_action_dim: int = 64
    embodiment_hidden: int = 128  # hidden size of the state encoder / action decoder MLPs

    # ---- optional modality encoders (tokens join the VL sequence)
    use_imu: bool = False
    imu_channels: int = 6
    imu_tokens: int = 4
    use_audio: bool = False
    audio_features: int = 80      # log-mel bins (or samples per raw frame)
    audio_tokens: int = 8
    series_hidden: int = 64       # conv width of the imu/audio encoders

    # ---- flow matching: the trainers draw t = (noise_s - Beta(beta_alpha, 1)) / noise_s ("n16") or
    # t = (1 - Beta(beta_alpha, 1)) * noise_s ("upstream": GR00T N1.6/N1.7's sample_time), fm_time
    noise_s: float = 0.999
    beta_alpha: float = 1.5
    fm_time: str = "n16"

    # ---- per-embodiment linears: "gather" (upstream's W[ids] + bmm) or "grouped"
    # (loongforge::category_linear, model/embodiment.py; the model file then needs libloongforge_ops)
    category_linear: str = "gather"

    # ---- freezing (connector, action head, embodiment MLPs, imu/audio always train)
    tune_visual: bool = False
    tune_llm: bool = False
    tune_top_llm_layers: int = 4  # top k LM layers + final norm train even if tune_llm is False

    # ---- default batch shape (used for FLOPs and batch_spec.json)
    num_views: int = 1
    action_horizon: int = 16
    max_text_len: int = 32
    imu_len: int = 50
    audio_len: int = 100

    # ------------------------------------------------------------------ derived
    @property
    def patches_per_view(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def tokens_per_view(self) -> int:
        return self.patches_per_view // (self.pixel_shuffle ** 2)

    @property
    def dit_head_dim(self) -> int:
        return self.dit_width // self.dit_heads

    @property
    def vit_head_dim(self) -> int:
        return self.vit_width // self.vit_heads

    def vl_len(self, num_views: int = -1, text_len: int = -1) -> int:
        """Length of the VL sequence: vision tokens of all views, imu, audio, text and the chat
        template's own tokens."""
        v = self.num_views if num_views < 0 else num_views
        l = self.max_text_len if text_len < 0 else text_len
        n = v * self.tokens_per_view + l
        slots = prompt.parse_ids(self.chat_template_ids)
        n += sum(1 for i in slots if i not in (prompt.IMAGE_SLOT, prompt.TEXT_SLOT))
        if self.use_imu:
            n += self.imu_tokens
        if self.use_audio:
            n += self.audio_tokens
        return n

    # ------------------------------------------------------------------ checks
    def validate(self) -> "ModelConfig":
        def need(cond: bool, key: str, what: str):
            if not cond:
                raise ValueError(f"model config '{self.name}': {key}={getattr(self, key)!r}: {what}")

        need(self.image_size % self.patch_size == 0, "image_size", "must be a multiple of patch_size")
        need(0.0 < self.image_crop_fraction <= 1.0, "image_crop_fraction", "must be in (0, 1] (1 = no crop)")
        need(self.image_resample in ("box", "bicubic_aa", "bilinear_aa", "cv2_area"), "image_resample",
             "must be box, bicubic_aa, bilinear_aa or cv2_area")
        need(self.image_resize_edge >= 0, "image_resize_edge", "must be >= 0 (0 = the target size)")
        need(self.image_resize_edge == 0 or self.image_resample in ("box", "bicubic_aa"), "image_resize_edge",
             f"must be 0 when image_resample is {self.image_resample} (it resizes to image_target_size)")
        need(self.image_target_size >= 0, "image_target_size", "must be >= 0 (0 = image_size)")
        need(self.image_target_size in (0, self.image_size) or self.image_resample != "box",
             "image_target_size", "must be 0 or image_size when image_resample is box")
        need(not self.image_letterbox or self.image_resample != "box", "image_letterbox",
             "must be false when image_resample is box")
        need(not self.image_random_crop or (self.image_resample in ("cv2_area", "bilinear_aa")
                                            and self.image_crop_fraction < 1.0),
             "image_random_crop", "must be false unless image_resample is cv2_area or bilinear_aa with an "
             "image_crop_fraction below 1")
        grid = self.image_size // self.patch_size
        need(grid % self.pixel_shuffle == 0, "pixel_shuffle",
             f"must divide the patch grid side ({grid})")
        need(self.vit_width % self.vit_heads == 0, "vit_width", "must be a multiple of vit_heads")
        need(self.dit_width % self.dit_heads == 0, "dit_width", "must be a multiple of dit_heads")
        need(self.llm_heads % self.llm_kv_heads == 0, "llm_heads", "must be a multiple of llm_kv_heads")
        need(self.llm_head_dim % 2 == 0, "llm_head_dim", "must be even (RoPE)")
        need(self.vocab_size >= TOKENIZER_VOCAB, "vocab_size",
             f"must be >= the tokenizer vocabulary ({TOKENIZER_VOCAB})")
        need(0 <= self.tune_top_llm_layers <= self.llm_layers, "tune_top_llm_layers",
             f"must be in [0, llm_layers={self.llm_layers}]")
        need(1 <= self.action_horizon <= self.max_action_horizon, "action_horizon",
             f"must be in [1, max_action_horizon={self.max_action_horizon}]")
        need(self.max_text_len >= 2, "max_text_len", "must be >= 2 (bos + eos)")
        need(self.num_views >= 1, "num_views", "must be >= 1")
        need(self.num_embodiments >= 1, "num_embodiments", "must be >= 1")
        need(self.timestep_dim % 2 == 0, "timestep_dim", "must be even")
        need(self.dit_width % 2 == 0, "dit_width", "must be even (sinusoidal action-encoder features)")
        need(self.backbone in ("n16", "eagle", "qwen3vl"), "backbone", "must be n16, eagle or qwen3vl")
        need(self.category_linear in ("gather", "grouped"), "category_linear", "must be gather or grouped")
        need(self.fm_time in ("n16", "upstream"), "fm_time", "must be n16 or upstream")
        if self.backbone != "n16":
            need(bool(self.gr00t_head), "backbone", "the exact GR00T backbones need a gr00t_head")
            need(self.vit_pos_grid >= 1, "vit_pos_grid", "must be >= 1 (side of the learned position table)")
        if self.backbone == "eagle":
            need(self.vit_window >= 0, "vit_window", "must be >= 0 (0: no windows)")
            need(self.vit_rope_base >= 0, "vit_rope_base", "must be >= 0 (0: no 2-D rotary)")
            need(self.vit_rope_base == 0 or (self.vit_width // self.vit_heads) % 4 == 0, "vit_heads",
                 "vit_width / vit_heads must be a multiple of 4 (2-D rotary)")
            try:
                full = [int(x) for x in self.vit_full_layers.split(",") if x.strip()]
            except ValueError:
                full = [-1]
            need(full == sorted(set(full)) and all(i >= 0 for i in full), "vit_full_layers",
                 "must be ascending ViT layer indexes, comma-separated")
        else:
            need(self.vit_window == 0 and not self.vit_full_layers and self.vit_rope_base == 0, "vit_window",
                 "vit_window, vit_full_layers and vit_rope_base are the eagle backbone's")
        if self.backbone == "qwen3vl":
            need((self.vit_width // self.vit_heads) % 4 == 0, "vit_heads",
                 "vit_width / vit_heads must be a multiple of 4 (2-D rotary)")
            need(self.vit_temporal_patch >= 1, "vit_temporal_patch", "must be >= 1")
            try:
                deep = [int(x) for x in self.deepstack_layers.split(",") if x.strip()]
                sec = [int(x) for x in self.mrope_section.split(",") if x.strip()]
            except ValueError:
                deep, sec = [-1], []
            need(deep == sorted(set(deep)) and all(0 <= d < self.vit_layers for d in deep), "deepstack_layers",
                 f"must be ascending ViT layer indexes in [0, {self.vit_layers}), comma-separated")
            need(len(sec) == 3 and sum(sec) == self.llm_head_dim // 2 and sec[1] <= sec[0] and sec[2] <= sec[0],
                 "mrope_section", f"must be three comma-separated counts (t, h, w) summing to llm_head_dim/2 "
                 f"({self.llm_head_dim // 2})")
        if self.chat_template_ids:
            need(self.backbone in ("qwen3vl", "eagle"), "chat_template_ids",
                 "only the exact backbones (qwen3vl, eagle) take a chat template")
            need(not self.use_imu and not self.use_audio, "chat_template_ids",
                 "a chat template leaves no place for imu/audio tokens; set use_imu/use_audio false")
            try:
                ids, why = prompt.parse_ids(self.chat_template_ids), ""
            except ValueError:
                ids, why = [], "must be comma-separated integers"
            first = self.backbone == "qwen3vl"
            need(not why and not prompt.check(ids, self.num_views, self.vocab_size, first), "chat_template_ids",
                 why or prompt.check(ids, self.num_views, self.vocab_size, first))
            need(0 <= self.pad_token_id < self.vocab_size, "pad_token_id", f"must be in [0, {self.vocab_size})")
        if self.gr00t_head:
            need(self.gr00t_head in HEAD_CONFIGS, "gr00t_head", f"must be '' or one of {sorted(HEAD_CONFIGS)}")
            try:
                head_config_for(self)
            except ValueError as e:
                raise ValueError(f"model config '{self.name}': gr00t_head={self.gr00t_head!r}: {e}") from None
        return self

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> Dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> "ModelConfig":
        data = json.loads(text)
        known = {f.name for f in fields(ModelConfig)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model config JSON has unknown keys {unknown}")
        return ModelConfig(**data).validate()


def _parse_value(cfg: ModelConfig, key: str, text: str):
    types = {f.name: f.type for f in fields(ModelConfig)}
    if key not in types:
        raise ValueError(f"--set {key}=...: unknown model config key; known keys: {sorted(types)}")
    kind = types[key]
    kind = {"int": int, "float": float, "bool": bool, "str": str}.get(kind, kind)
    if kind is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"--set {key}={text}: expected a boolean (true/false)")
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"--set {key}={text}: expected a {kind.__name__}") from None


def apply_overrides(cfg: ModelConfig, overrides: List[str]) -> ModelConfig:
    """Returns a validated copy of cfg with each "key=value" applied."""
    changes = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set {item!r}: expected key=value")
        key, value = item.split("=", 1)
        key = key.strip()
        changes[key] = _parse_value(cfg, key, value)
    return dataclasses.replace(cfg, **changes).validate()


# ---------------------------------------------------------------------------- configs

CONFIGS: Dict[str, ModelConfig] = {
    # Only 2 LM layers, so the top 1 trains: the freezing tests see a frozen and a trainable layer.
    "n16-tiny": ModelConfig(name="n16-tiny", tune_top_llm_layers=1),
    "n16-1b": ModelConfig(
        name="n16-1b",
        image_size=224, patch_size=14, vit_layers=12, vit_width=768, vit_heads=12, vit_ffn=3072,
        llm_layers=12, llm_width=1536, llm_heads=12, llm_kv_heads=4, llm_head_dim=128, llm_ffn=6144,
        vocab_size=TOKENIZER_VOCAB,
        dit_layers=16, dit_width=1024, dit_heads=16, dit_ffn=4096,
        embodiment_hidden=1024, series_hidden=256,
    ),
    "n16-3b": ModelConfig(
        name="n16-3b",
        image_size=224, patch_size=14, vit_layers=27, vit_width=1152, vit_heads=16, vit_ffn=4304,
        llm_layers=16, llm_width=2048, llm_heads=16, llm_kv_heads=8, llm_head_dim=128, llm_ffn=6144,
        vocab_size=151936,
        dit_layers=32, dit_width=1536, dit_heads=32, dit_ffn=6144,
        embodiment_hidden=1024, series_hidden=256,
    ),
    "n16-12b": ModelConfig(
        name="n16-12b",
        image_size=224, patch_size=14, vit_layers=40, vit_width=1408, vit_heads=16, vit_ffn=6144,
        llm_layers=32, llm_width=4096, llm_heads=32, llm_kv_heads=8, llm_head_dim=128, llm_ffn=14336,
        vocab_size=151936,
        dit_layers=32, dit_width=2048, dit_heads=32, dit_ffn=8192,
        embodiment_hidden=2048, series_hidden=256,
    ),
}

# GR00T-named configs: the upstream-exact action head (gr00t_head.py).
# gr00t-tiny: n16-tiny's backbone (CPU parity tests). gr00t-n1.6-3b: GR00T N1.6's exact backbone
# (model/backbones.py "eagle": SigLIP-2 so400m 27 x 1152 patch 14 at 224 px, 16 x 16 position
# table, 2 x 2 pixel unshuffle + mlp1, Qwen3-1.7B truncated to select_layer 16, final norm kept),
# N1.6's head with Isaac-GR00T's code defaults (horizon 16, dims 29, top 4 LM layers train).
# gr00t-n1.7-3b: GR00T N1.7's exact backbone ("qwen3vl": Cosmos-Reason2-2B = Qwen3-VL-2B, ViT 24 x
# 1024 patch 16 at 256 px with 48 x 48 position table and deepstack at 5/11/17, text 2048 wide
# 16 q / 8 kv heads truncated at select_layer 16, rope theta 5e6, mrope 24/20/20), lerobot's N1.7
# head defaults (horizon 40, dims 132, backbone frozen). The *-tiny variants have the same
# structure at CPU-test sizes.
_EAGLE_3B = dict(backbone="eagle", image_size=224, patch_size=14, vit_layers=27, vit_width=1152, vit_heads=16,
                 vit_ffn=4304, vit_pos_grid=16, vit_window=14, vit_full_layers="7,14,21,26", vit_rope_base=14.0,
                 llm_layers=16, llm_width=2048, llm_heads=16, llm_kv_heads=8,
                 llm_head_dim=128, llm_ffn=6144, vocab_size=151936, rope_theta=1000000.0, series_hidden=256)
_QWEN3VL_3B = dict(backbone="qwen3vl", image_size=256, patch_size=16, vit_layers=24, vit_width=1024, vit_heads=16,
                   vit_ffn=4096, vit_pos_grid=48, vit_temporal_patch=2, deepstack_layers="5,11,17",
                   llm_layers=16, llm_width=2048, llm_heads=16, llm_kv_heads=8, llm_head_dim=128, llm_ffn=6144,
                   vocab_size=151936, rope_theta=5000000.0, mrope_section="24,20,20", series_hidden=256)
CONFIGS.update({
    "gr00t-tiny": ModelConfig(name="gr00t-tiny", tune_top_llm_layers=1, gr00t_head="gr00t-tiny"),
    "gr00t-n1.6-tiny": ModelConfig(name="gr00t-n1.6-tiny", backbone="eagle", vit_pos_grid=6, vit_window=3,
                                   vit_full_layers="1", vit_rope_base=3.0, tune_top_llm_layers=1,
                                   gr00t_head="gr00t-tiny", gr00t_state_mask_token=True),
    "gr00t-n1.7-tiny": ModelConfig(name="gr00t-n1.7-tiny", backbone="qwen3vl", vit_layers=3, vit_width=64,
                                   vit_heads=2, vit_ffn=128, vit_pos_grid=6, deepstack_layers="0,2",
                                   mrope_section="6,5,5", tune_top_llm_layers=1, gr00t_head="gr00t-tiny"),
    "gr00t-n1.6-3b": ModelConfig(name="gr00t-n1.6-3b", gr00t_head="gr00t-n1.6-3b", max_state_dim=29,
                                 max_action_dim=29, action_horizon=16, **_EAGLE_3B),
    "gr00t-n1.7-3b": ModelConfig(name="gr00t-n1.7-3b", gr00t_head="gr00t-n1.7-3b", max_state_dim=132,
                                 max_action_dim=132, action_horizon=40, tune_top_llm_layers=0, **_QWEN3VL_3B),
})
# The GR00T models train with upstream's flow-matching time, (1 - Beta(1.5, 1)) * 0.999.
for _name in [n for n in CONFIGS if n.startswith("gr00t-")]:
    CONFIGS[_name] = dataclasses.replace(CONFIGS[_name], fm_time="upstream")


def get_config(name: str, **overrides) -> ModelConfig:
    if name not in CONFIGS:
        raise ValueError(f"unknown model config '{name}'; choose one of {sorted(CONFIGS)}")
    return dataclasses.replace(CONFIGS[name], **overrides).validate()
