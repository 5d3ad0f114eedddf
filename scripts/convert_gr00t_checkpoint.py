#!/usr/bin/env python3
"""Convert a GR00T-N1.6-style Hugging Face checkpoint to LoongForge names.

    python3 scripts/convert_gr00t_checkpoint.py SRC_DIR --out MODEL.pt [--strict] [--set KEY=VALUE ...]
        [--backbone-config CONFIG_JSON] [--tokenizer TOKENIZER_JSON] [--seed N]
        [--chat-template FILE | --no-chat-template] [--embodiment-tag TAG]
    python3 scripts/convert_gr00t_checkpoint.py SRC --model MODEL.pt --out OUT.safetensors [--strict]

Import (no --model): SRC_DIR is an upstream checkpoint folder (safetensors
shards + config.json, as `save_pretrained` writes it; GR00T N1.7 or N1.6).
The ModelConfig is picked from config.json (scripts/gr00t_upstream_config.py:
the head preset with the same shapes, the released backbone or the one named
by --backbone-config / a local `model_name` folder, upstream's freezing),
`--set` applies ModelConfig overrides (num_views, max_text_len: the data's
shape), the weights are converted onto it and MODEL.pt is written as
scripts/model/export.py writes exports, ready for `model.path`. The
tokenizer the export records is SRC_DIR/tokenizer.json when the checkpoint has
one (or --tokenizer): convert the dataset with the same file
(scripts/convert_lerobot.py --tokenizer); without one, the word hash. An N1.7
import, and an N1.6 import with a tokenizer (N1.6's is Eagle-Block2A-2B-v2's, in
Isaac-GR00T's gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2/, not in the
checkpoint: pass it with --tokenizer), also takes the tokenizer's chat template
(chat_template.jinja, chat_template.json or tokenizer_config.json next to that
tokenizer.json, or --chat-template) as upstream's prompt (scripts/chat_template.py,
scripts/model/prompt.py) and refuses without one unless --no-chat-template,
and reads processor_config.json's processor_kwargs as upstream's N1.7
processor does: formalize_language (the text form the export records) and
the image geometry (gr00t_upstream_config.n17_image_settings; a line says
what was taken and which config.json image fields upstream ignores). An N1.7
import also records how upstream's processor prepares state and actions for
--embodiment-tag (default new_embodiment, lerobot's default): its slot, the
checkpoint's statistics.json (or the dataset's) in float32 min-max with
clip_outliers, relative action groups, state dropout
(scripts/gr00t_processor.py; a line says what was taken). An N1.6 import
takes its image transform from processor_config.json's processor_kwargs as
Isaac-GR00T's Gr00tN1d6Processor builds it when they name an
image_target_size (gr00t_upstream_config.n16_image_settings), else
config.json's crop and the box resize (a line says which); with a
processor_config.json it also records Isaac-GR00T's N1.6 state/action
preparation for --embodiment-tag (gr00t_processor.n16_processor_record: its
slot table, float64 statistics, numpy's min-max, relative groups only with
use_relative_action) and formalize_language's N1.6 text form.

With --model, SRC is a safetensors file or a folder of them (sharded `model-0000X-of-0000N.safetensors`).
MODEL.pt is the exported LoongForge model the weights are for: its parameters
not found in SRC keep their values from MODEL.pt (and are listed), SRC tensors
with no LoongForge counterpart are listed and dropped, and a shape mismatch is
an error naming both keys. --strict turns any unmapped tensor into an error.
OUT loads with `safetensors.torch.load_file` into scripts/model and as
model.safetensors of a LoongForge checkpoint. A SRC folder holding a
tokenizer.json must match the tokenizer MODEL.pt was exported for (else an
error saying how to re-export).

The mapping (upstream name -> LoongForge name) is the table LAYOUT_MAPPING
below, one row per module kind and backbone layout, `{i}` a layer index and
`{p}` weight/bias; it is the single source of names and shapes (no tensor needs
a transpose: each LoongForge parameter has its upstream tensor's shape).
Layouts: "n1.7" (GR00T N1.7: `backbone.model.model.visual.*` Qwen3-VL ViT with
its merger and deepstack mergers, `backbone.model.model.language_model.*`),
"n1.6" (GR00T N1.6: `backbone.model.vision_model.vision_model.*` SigLIP-2,
`backbone.model.mlp1.*`, `backbone.model.language_model.model.*` Qwen3), and
"n16" (N1.5-style `backbone.eagle_model.*` names onto scripts/model/n16.py's
backbone, never checked against upstream code). The layout is read from the
target model's parameter names (`layout_of_model`). Tensors upstream's forward
never reads (the LM head, N1.7's final text norm, SigLIP's pooling head:
KNOWN_UNUSED) are reported as unused_known and never fail --strict.

test/scripts/test_gr00t_backbones.py converts random upstream backbones (the
lerobot 0.6.1 Qwen3Backbone for N1.7; transformers' Siglip2VisionModel and
Qwen3 for N1.6) with this table and checks features and gradients.

The action-head and embodiment rows are exact for the upstream-exact head of
scripts/model/gr00t_head.py (N1.6/N1.7: `vlln`, `vl_self_attention`,
AlternateVLDiT `action_head.model.*`, `position_embedding`, the
CategorySpecific MLPs; no tensor needs a transpose):
test/scripts/test_convert_gr00t_head.py converts a checkpoint written by
upstream's own GR00TN17ActionHead (lerobot 0.6.1) with --strict, and
test/model/test_gr00t_head.py uses `convert_tensors` to load upstream's
weights before comparing outputs and gradients. test/e2e/test_gr00t_import.py
(N1.7: lerobot's own save_pretrained) and test_gr00t_import_n16.py (the N1.6
layout) import whole checkpoints and train them with loongforge-train.
"""
import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import model` (scripts/model)

VIS = "backbone.eagle_model.vision_model.vision_model"
LM = "backbone.eagle_model.language_model.model"
DIT = "action_head.model"
VLSA = "action_head.vl_self_attention"
N16_VIS = "backbone.model.vision_model.vision_model"   # GR00T N1.6: EagleBackbone.model = Eagle3_VL
N16_LM = "backbone.model.language_model.model"
N17_VIS = "backbone.model.model.visual"                 # GR00T N1.7: Qwen3Backbone.model = Qwen3VLForConditionalGeneration
N17_LM = "backbone.model.model.language_model"

# Backbone layouts. "n16": Eagle-style (N1.5) names onto scripts/model/n16.py's backbone (gr00t-tiny,
# n16-*), never checked against upstream code. "n1.6": GR00T N1.6 (Eagle-Block2A-2B-v2) onto
# model/backbones.py's "eagle" backbone. "n1.7": GR00T N1.7 (Cosmos-Reason2-2B / Qwen3-VL) onto its
# "qwen3vl" backbone. The head rows are common to all. No backbone tensor needs a transpose: every
# LoongForge parameter has its upstream tensor's shape (Conv3d, Linear and Embedding layouts kept).
LAYOUTS = ("n16", "n1.6", "n1.7")

_QWEN3_LM_ROWS = [  # (upstream suffix, LoongForge suffix) of a Qwen3 decoder layer
    ("input_layernorm.weight", "input_norm.weight"), ("post_attention_layernorm.weight", "post_attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn.q_proj.weight"), ("self_attn.k_proj.weight", "attn.k_proj.weight"),
    ("self_attn.v_proj.weight", "attn.v_proj.weight"), ("self_attn.o_proj.weight", "attn.o_proj.weight"),
    ("self_attn.q_norm.weight", "attn.q_norm.weight"), ("self_attn.k_norm.weight", "attn.k_norm.weight"),
    ("mlp.gate_proj.weight", "mlp.gate_proj.weight"), ("mlp.up_proj.weight", "mlp.up_proj.weight"),
    ("mlp.down_proj.weight", "mlp.down_proj.weight"),
]
_SIGLIP_LAYER_ROWS = [  # (upstream suffix, LoongForge suffix) of a SigLIP encoder layer
    ("layer_norm1.{p}", "ln1.{p}"), ("layer_norm2.{p}", "ln2.{p}"), ("self_attn.q_proj.{p}", "attn.q.{p}"),
    ("self_attn.k_proj.{p}", "attn.k.{p}"), ("self_attn.v_proj.{p}", "attn.v.{p}"),
    ("self_attn.out_proj.{p}", "attn.o.{p}"), ("mlp.fc1.{p}", "mlp.fc1.{p}"), ("mlp.fc2.{p}", "mlp.fc2.{p}"),
]

# (layout or None for the head, upstream template, LoongForge template)
LAYOUT_MAPPING: List[Tuple[str, str, str]] = [
    ("n16", f"{VIS}.embeddings.patch_embedding.{{p}}", "vision.patch_embed.{p}"),
    ("n16", f"{VIS}.embeddings.position_embedding.weight", "vision.pos_embed"),
] + [("n16", f"{VIS}.encoder.layers.{{i}}.{u}", f"vision.blocks.{{i}}.{o}") for u, o in _SIGLIP_LAYER_ROWS] + [
    ("n16", f"{VIS}.post_layernorm.{{p}}", "vision.post_norm.{p}"),
    ("n16", "backbone.eagle_model.mlp1.0.{p}", "connector.norm.{p}"),
    ("n16", "backbone.eagle_model.mlp1.1.{p}", "connector.fc1.{p}"),
    ("n16", "backbone.eagle_model.mlp1.3.{p}", "connector.fc2.{p}"),
    ("n16", f"{LM}.embed_tokens.weight", "llm.embed_tokens.weight"),
] + [("n16", f"{LM}.layers.{{i}}.{u}", f"llm.layers.{{i}}.{o}") for u, o in _QWEN3_LM_ROWS] + [
    ("n16", f"{LM}.norm.weight", "llm.norm.weight"),
] + [
    # GR00T N1.6: SigLIP-2 (Linear patch embedding, 256-row position table), mlp1, Qwen3 with its norm.
    ("n1.6", f"{N16_VIS}.embeddings.patch_embedding.{{p}}", "vision.patch_embed.{p}"),
    ("n1.6", f"{N16_VIS}.embeddings.position_embedding.weight", "vision.pos_embed"),
] + [("n1.6", f"{N16_VIS}.encoder.layers.{{i}}.{u}", f"vision.blocks.{{i}}.{o}") for u, o in _SIGLIP_LAYER_ROWS] + [
    ("n1.6", f"{N16_VIS}.post_layernorm.{{p}}", "vision.post_norm.{p}"),
    ("n1.6", "backbone.model.mlp1.0.{p}", "vision.mlp1.norm.{p}"),
    ("n1.6", "backbone.model.mlp1.1.{p}", "vision.mlp1.fc1.{p}"),
    ("n1.6", "backbone.model.mlp1.3.{p}", "vision.mlp1.fc2.{p}"),
    ("n1.6", f"{N16_LM}.embed_tokens.weight", "llm.embed_tokens.weight"),
] + [("n1.6", f"{N16_LM}.layers.{{i}}.{u}", f"llm.layers.{{i}}.{o}") for u, o in _QWEN3_LM_ROWS] + [
    ("n1.6", f"{N16_LM}.norm.weight", "llm.norm.weight"),
] + [
    # GR00T N1.7: Qwen3-VL ViT (Conv3d patch embedding, 2304-row position table, fused qkv, mergers) and
    # text decoder (no final norm: upstream's features are taken before it, see KNOWN_UNUSED).
    ("n1.7", f"{N17_VIS}.patch_embed.proj.{{p}}", "vision.patch_embed.{p}"),
    ("n1.7", f"{N17_VIS}.pos_embed.weight", "vision.pos_embed"),
] + [("n1.7", f"{N17_VIS}.blocks.{{i}}.{u}.{{p}}", f"vision.blocks.{{i}}.{o}.{{p}}")
     for u, o in (("norm1", "norm1"), ("norm2", "norm2"), ("attn.qkv", "qkv"), ("attn.proj", "proj"),
                  ("mlp.linear_fc1", "fc1"), ("mlp.linear_fc2", "fc2"))] + [
    ("n1.7", f"{N17_VIS}.{up}.{u}.{{p}}", f"vision.{ours}.{o}.{{p}}")
    for up, ours in (("merger", "merger"), ("deepstack_merger_list.{i}", "deepstack_mergers.{i}"))
    for u, o in (("norm", "norm"), ("linear_fc1", "fc1"), ("linear_fc2", "fc2"))
] + [
    ("n1.7", f"{N17_LM}.embed_tokens.weight", "llm.embed_tokens.weight"),
] + [("n1.7", f"{N17_LM}.layers.{{i}}.{u}", f"llm.layers.{{i}}.{o}") for u, o in _QWEN3_LM_ROWS] + [
    (None, "action_head.position_embedding.weight", "action_head.pos_embed"),
    (None, "action_head.mask_token", "action_head.state_mask_token"),     # N1.6 with state dropout
    (None, "action_head.vlln.{p}", "action_head.vl_norm.{p}"),
    (None, f"{DIT}.timestep_encoder.timestep_embedder.linear_1.{{p}}", "action_head.timestep_encoder.fc1.{p}"),
    (None, f"{DIT}.timestep_encoder.timestep_embedder.linear_2.{{p}}", "action_head.timestep_encoder.fc2.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.norm1.linear.{{p}}", "action_head.blocks.{i}.norm1.linear.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.attn1.to_q.{{p}}", "action_head.blocks.{i}.attn.q.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.attn1.to_k.{{p}}", "action_head.blocks.{i}.attn.k.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.attn1.to_v.{{p}}", "action_head.blocks.{i}.attn.v.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.attn1.to_out.0.{{p}}", "action_head.blocks.{i}.attn.o.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.ff.net.0.proj.{{p}}", "action_head.blocks.{i}.ff.fc1.{p}"),
    (None, f"{DIT}.transformer_blocks.{{i}}.ff.net.2.{{p}}", "action_head.blocks.{i}.ff.fc2.{p}"),
    (None, f"{DIT}.proj_out_1.{{p}}", "action_head.proj_out_1.{p}"),
    (None, f"{DIT}.proj_out_2.{{p}}", "action_head.proj_out_2.{p}"),
] + [
    # N1.6/N1.7 vl_self_attention (SelfAttentionTransformer of diffusers-style blocks with affine
    # LayerNorms norm1/norm3) -> scripts/model/gr00t_head.py VLSelfAttentionBlock (norm1/norm2).
    (None, f"{VLSA}.transformer_blocks.{{i}}.{up}.{{p}}", f"action_head.vl_self_attention.{{i}}.{ours}.{{p}}")
    for up, ours in (("norm1", "norm1"), ("norm3", "norm2"), ("attn1.to_q", "attn.q"), ("attn1.to_k", "attn.k"),
                     ("attn1.to_v", "attn.v"), ("attn1.to_out.0", "attn.o"), ("ff.net.0.proj", "ff.fc1"),
                     ("ff.net.2", "ff.fc2"))
] + [
    # CategorySpecificLinear banks: upstream W/b, LoongForge weight/bias, same (32, in, out) layout.
    (None, f"action_head.{mlp}.{up}.{w}", f"embodiment.{mlp}.{ours}.{p}")
    for mlp, layers in (("state_encoder", ("layer1", "layer2")), ("action_decoder", ("layer1", "layer2")),
                        ("action_encoder", ("W1", "W2", "W3")))
    for up, ours in ((l, l if l.startswith("layer") else "w" + l[1:]) for l in layers)
    for w, p in (("W", "weight"), ("b", "bias"))
]

# (upstream template, LoongForge template) of every layout: the table the n16 tools have always used.
MAPPING: List[Tuple[str, str]] = [(u, o) for layout, u, o in LAYOUT_MAPPING if layout in (None, "n16")]

# Upstream tensors that exist in released checkpoints but that GR00T's forward never reads: listed as
# unused (report "unused_known"), never an error, also under --strict.
KNOWN_UNUSED: List[Tuple[str, str]] = [
    ("n1.6", "backbone.model.language_model.lm_head.weight"),      # LM head (features are hidden states)
    ("n1.6", f"{N16_VIS}.head.{{any}}"),                          # SigLIP pooling head (features are patches)
    ("n1.7", "backbone.model.lm_head.weight"),                     # tied LM head
    ("n1.7", f"{N17_LM}.norm.weight"),                             # features are taken before the final norm
]


def _regex(template: str) -> "re.Pattern":
    out = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(out + "$")


def _table(layout: str):
    rows = [(u, o) for lay, u, o in LAYOUT_MAPPING if lay in (None, layout)]
    return [(_regex(u), o) for u, o in rows], [(_regex(o), u) for u, o in rows]


_TABLES = {layout: _table(layout) for layout in LAYOUTS}
_KNOWN_UNUSED = [(lay, re.compile(re.escape(t).replace(r"\{any\}", r".+") + "$")) for lay, t in KNOWN_UNUSED]


def _apply(name: str, table) -> str:
    for rx, template in table:
        m = rx.match(name)
        if m:
            return template.format(**m.groupdict())
    return ""


def to_loongforge(upstream: str, layout: str = "") -> str:
    """LoongForge name of an upstream tensor, or '' when it has none. Without a layout every layout's
    rows are tried (upstream names of the three layouts are disjoint)."""
    for lay in ([layout] if layout else LAYOUTS):
        name = _apply(upstream, _TABLES[lay][0])
        if name:
            return name
    return ""


def to_upstream(ours: str, layout: str = "n16") -> str:
    """Upstream name of a LoongForge parameter in the given backbone layout, or '' when it has none."""
    return _apply(ours, _TABLES[layout][1])


def layout_of_model(names) -> str:
    """The backbone layout of a LoongForge parameter set: "n1.7" when it has the Qwen3-VL merger,
    "n1.6" when it has Eagle's mlp1 under vision, else "n16"."""
    names = list(names)
    if any(n.startswith("vision.merger.") for n in names):
        return "n1.7"
    if any(n.startswith("vision.mlp1.") for n in names):
        return "n1.6"
    return "n16"


def known_unused(upstream: str, layout: str) -> bool:
    return any(lay == layout and rx.match(upstream) for lay, rx in _KNOWN_UNUSED)


def head_config_from_upstream(config: Dict, name: str = "from-upstream"):
    """The scripts/model/gr00t_head.py Gr00tHeadConfig of an upstream GR00T N1.6/N1.7 config.json
    (GR00TN17Config / Gr00tN1d6Config fields). Raises ConversionError naming the field for any
    setting the upstream-exact head does not implement (the plain DiT, no vlln, a state history,
    a Beta beta other than 1, different dropouts in the DiT and vl_self_attention). model_type
    Gr00tN1d6 gives N1.6's state mask token (used when state_dropout_prob > 0); its
    state_additive_noise_scale becomes the head's state_noise_scale."""
    from model.gr00t_head import Gr00tHeadConfig

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


def load_source(src: Path) -> Dict:
    from safetensors.torch import load_file
    files = [src] if src.is_file() else sorted(src.glob("*.safetensors"))
    if not files:
        sys.exit(f"convert_gr00t_checkpoint: no .safetensors in {src}")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


class ConversionError(ValueError):
    """An upstream checkpoint that does not fit the target model (shapes, or --strict)."""


def convert_tensors(upstream: Dict, ours: Dict, strict: bool = False, layout: str = "") -> Tuple[Dict, Dict]:
    """Maps upstream tensors onto our parameter names through LAYOUT_MAPPING.

    upstream: {upstream name: tensor}; ours: {our name: tensor} (the target
    model's parameters: shapes, dtypes, and the values kept where upstream has
    no counterpart); layout: the backbone layout ("" = layout_of_model(ours)).
    Returns (converted {our name: tensor}, report) with report keys mapped
    (count), unmapped_upstream (no LoongForge counterpart), unused_known
    (tensors upstream's forward never reads: KNOWN_UNUSED), kept_from_model.
    Raises ConversionError naming each tensor whose shape differs (upstream
    name and shape -> our name and expected shape), and under strict any
    unmapped tensor or parameter left without a value from upstream."""
    layout = layout or layout_of_model(ours)
    out = dict(ours)
    report = {"layout": layout, "mapped": 0, "unmapped_upstream": [], "unused_known": [], "kept_from_model": [],
              "shape_errors": []}
    taken = set()
    for name, t in upstream.items():
        target = to_loongforge(name, layout)
        if not target or target not in ours:
            report["unused_known" if known_unused(name, layout) else "unmapped_upstream"].append(name)
            continue
        if tuple(t.shape) != tuple(ours[target].shape):
            report["shape_errors"].append(f"{name} {tuple(t.shape)} -> {target} {tuple(ours[target].shape)}")
            continue
        out[target] = t.to(ours[target].dtype).contiguous()
        taken.add(target)
        report["mapped"] += 1
    report["kept_from_model"] = sorted(set(ours) - taken)
    if report["shape_errors"]:
        raise ConversionError("convert_gr00t_checkpoint: shape mismatch (upstream name (found) -> LoongForge name "
                              "(expected); is --model the right config?):\n  " + "\n  ".join(report["shape_errors"]))
    if strict and (report["unmapped_upstream"] or report["kept_from_model"]):
        raise ConversionError("convert_gr00t_checkpoint: --strict and some tensors are unmapped:\n" +
                              json.dumps({k: report[k] for k in ("unmapped_upstream", "kept_from_model")}, indent=1))
    return out, report


def checkpoint_tokenizer(src: Path):
    """SRC's tokenizer.json (a folder's own), or None."""
    path = src / "tokenizer.json" if src.is_dir() else None
    return path if path is not None and path.is_file() else None


def check_tokenizer(src: Path, model_path: Path, spec_text: str) -> None:
    """A checkpoint's tokenizer.json must be the one the target model reads ids of."""
    from model import tokenizer as tokenizers_
    tok = checkpoint_tokenizer(src)
    if tok is None:
        return
    want = tokenizers_.load(str(tok))[1]
    have = json.loads(spec_text).get("tokenizer", {}) if spec_text else {}
    if (have.get("kind"), have.get("sha256")) != (want["kind"], want["sha256"]):
        raise SystemExit(f"convert_gr00t_checkpoint: {tok} (sha256 {want['sha256'][:16]}...) is not the tokenizer "
                         f"{model_path} was exported for ({have.get('kind', 'word_hash')} {have.get('file', '')}); "
                         f"re-export it with scripts/model/export.py --tokenizer {tok}, or import without --model")


def convert(src: Path, model_path: Path, out: Path, strict: bool = False) -> Dict:
    import torch
    from safetensors.torch import save_file
    extra = {"loongforge/batch_spec.json": ""}
    from model import ops
    ops.load_if_built()  # model files with category_linear=grouped call loongforge:: operators
    scripted = torch.jit.load(str(model_path), map_location="cpu", _extra_files=extra)
    check_tokenizer(src, model_path, extra["loongforge/batch_spec.json"])
    ours = {n: p.detach().clone() for n, p in scripted.named_parameters()}
    try:
        converted, report = convert_tensors(load_source(src), ours, strict)
    except ConversionError as e:
        raise SystemExit(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(converted, str(out), metadata={"converted_from": str(src)})
    return report


def formalizes_language(processor_kwargs: Optional[Dict]) -> bool:
    """Whether upstream formalizes the task text: processor_config.json's processor_kwargs.formalize_language
    (lerobot 0.6.1's N1.7 and Isaac-GR00T's N1.6 processor read it there), true when absent."""
    value = (processor_kwargs or {}).get("formalize_language", True)
    return value if isinstance(value, bool) else True


def image_note(cfg, config: Dict, image: Dict) -> str:
    """One line on the N1.7 image geometry taken, and config.json's image fields that upstream's
    processor does not read when they differ from it."""
    crop = "none" if cfg.image_crop_fraction >= 1.0 else f"{cfg.image_crop_fraction:.6g} of each side"
    line = (f"image geometry from {image['source']}: target {cfg.image_target_size}, crop {crop}, "
            f"resize edge {cfg.image_resize_edge or cfg.image_target_size}, letterbox "
            f"{'on' if cfg.image_letterbox else 'off'}; the ViT sees {cfg.image_size} x {cfg.image_size}")
    from gr00t_upstream_config import N17_IMAGE_KEYS
    ignored = [k for k in N17_IMAGE_KEYS if k in config and config[k] is not None and config[k] != image.get(k)]
    if ignored:
        line += ("\nnote: config.json's " + ", ".join(f"{k}={config[k]!r}" for k in ignored) +
                 " not used: upstream's N1.7 processor reads processor_config.json (or its defaults)")
    window = ("a window drawn per sample, as upstream trains" if cfg.image_random_crop else "the center")
    line += (f"\nimage transform: OpenCV's INTER_AREA (use_albumentations), the crop at {window}"
             if cfg.image_resample == "cv2_area" else "\nimage transform: antialiased bicubic (upstream's default)")
    return line


def n16_image_note(cfg, processor: Optional[Dict]) -> str:
    """One line on the N1.6 image transform taken (Isaac-GR00T's Gr00tN1d6Processor from processor_config.json,
    or config.json's crop with the box resize)."""
    crop = "none" if cfg.image_crop_fraction >= 1.0 else f"{cfg.image_crop_fraction:.6g} of each side"
    if cfg.image_resample == "box":
        why = ("processor_config.json names no image_target_size" if processor is not None
               else "no processor_config.json")
        return (f"image transform: config.json's crop ({crop}), then the box resize to {cfg.image_size} ({why}; "
                "Isaac-GR00T's N1.6 processor is reproduced from processor_config.json only)")
    kind = ("OpenCV's INTER_AREA (use_albumentations), the crop at a window drawn per sample, as upstream trains"
            if cfg.image_resample == "cv2_area" else
            "antialiased bilinear (torchvision's), the crop at a window drawn per view, as upstream's RandomCrop trains"
            if cfg.image_random_crop else "antialiased bilinear (torchvision's), the center crop")
    return (f"image transform from processor_config.json: {kind}; target {cfg.image_target_size}, crop {crop}; "
            f"the ViT sees {cfg.image_size} x {cfg.image_size} (Eagle's processor does not resize)")


def import_checkpoint(src: Path, out: Path, strict: bool = False, overrides=(), backbone_config=None,
                      tokenizer=None, seed: int = 0, chat_template=None, no_chat_template: bool = False,
                      embodiment_tag: str = None) -> Dict:
    """SRC_DIR (config.json + safetensors) -> our export at out (see the module docstring). Returns the
    conversion report plus "config" (the ModelConfig's name and gr00t_head) and "tokenizer" (the file
    recorded, or None for the word hash) and "chat_template" (its source, or None) and "processor" (the data
    processing record of embodiment_tag, scripts/gr00t_processor.py; None for an N1.6 checkpoint without
    processor_config.json)."""
    import dataclasses

    import torch

    import chat_template as chat
    from gr00t_upstream_config import (UpstreamConfigError, model_config_from_upstream, n17_image_settings,
                                       read_backbone_config, read_processor_kwargs)
    from model import tokenizer as tokenizers_
    from model.export import save_model
    from model.registry import build_model
    if not (src / "config.json").is_file():
        raise SystemExit(f"convert_gr00t_checkpoint: {src}/config.json not found; importing needs the checkpoint "
                         "folder (safetensors + config.json), or pass --model for a bare tensor file")
    config = json.loads((src / "config.json").read_text())
    try:
        processor = read_processor_kwargs(src)
    except UpstreamConfigError as e:
        raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    try:
        backbone = read_backbone_config(config, backbone_config)
        cfg = model_config_from_upstream(config, backbone, list(overrides), processor_kwargs=processor)
    except (UpstreamConfigError, ValueError) as e:
        where = "config.json and processor_config.json" if processor is not None else "config.json"
        raise SystemExit(f"convert_gr00t_checkpoint: {src}/{where}: {e}") from None
    images = (image_note(cfg, config, n17_image_settings(processor)) if cfg.backbone == "qwen3vl"
              else n16_image_note(cfg, processor))
    data_processor = None
    if cfg.backbone == "qwen3vl":
        # upstream N1.7's state/action preparation for this embodiment (statistics.json, processor_kwargs)
        from gr00t_processor import DEFAULT_TAG, ProcessorError, n17_processor_record
        try:
            data_processor = n17_processor_record(src, processor, embodiment_tag or DEFAULT_TAG)
        except ProcessorError as e:
            raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    elif processor is not None:
        # Isaac-GR00T N1.6's state/action preparation for this embodiment (statistics.json, processor_kwargs)
        from gr00t_processor import DEFAULT_TAG, ProcessorError, n16_processor_record
        try:
            data_processor = n16_processor_record(src, processor, embodiment_tag or DEFAULT_TAG)
        except ProcessorError as e:
            raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    elif embodiment_tag:
        raise SystemExit(f"convert_gr00t_checkpoint: --embodiment-tag picks the statistics of processor_config.json "
                         f"and statistics.json, which {src} does not have; the import keeps the dataset's "
                         "normalization (docs/models.md s5)")
    tok = Path(tokenizer) if tokenizer else checkpoint_tokenizer(src)
    text_form = tokenizers_.RAW
    if tok is not None and formalizes_language(processor):
        # upstream formalizes the task text (processor_config.json's processor_kwargs, default true; N1.6's
        # processor is reproduced only from its processor_config.json)
        if cfg.backbone == "qwen3vl":
            text_form = tokenizers_.GR00T_FORMALIZED
        elif processor is not None:
            text_form = tokenizers_.GR00T_N16_FORMALIZED
    template_source = None
    n16_prompt = cfg.backbone == "eagle" and tok is not None
    if (cfg.backbone == "qwen3vl" or n16_prompt) and not no_chat_template:
        # upstream's prompt: the tokenizer's chat template around the images and the text (N1.7: images
        # first; N1.6: the text first, each image in Eagle's markers)
        n16 = None
        if n16_prompt:
            image_token_id = (backbone or {}).get("image_token_index")
            n16 = {"tokens_per_view": cfg.tokens_per_view, "image_size": cfg.image_size,
                   "probe_text": tokenizers_.formalize(chat.PROBE_TEXT, text_form)
                   if text_form == tokenizers_.GR00T_N16_FORMALIZED else chat.PROBE_TEXT}
        else:
            image_token_id = int((backbone or {}).get("image_token_id", chat.QWEN3VL_IMAGE_TOKEN_ID))
        try:
            fields, template_source = chat.import_fields(tok, Path(chat_template) if chat_template else None,
                                                         None if image_token_id is None else int(image_token_id),
                                                         cfg.num_views, cfg.vocab_size, n16)
            cfg = dataclasses.replace(cfg, **fields).validate()
        except (chat.TemplateError, ValueError) as e:
            raise SystemExit(f"convert_gr00t_checkpoint: {src}: {e}") from None
    elif chat_template:
        raise SystemExit("convert_gr00t_checkpoint: --chat-template is for N1.7 imports and N1.6 imports with a "
                         "tokenizer, and cannot be combined with --no-chat-template")
    torch.manual_seed(seed)
    model = build_model(cfg)
    ours = {n: p.detach() for n, p in model.named_parameters()}
    try:
        converted, report = convert_tensors(load_source(src), ours, strict)
    except ConversionError as e:
        raise SystemExit(str(e)) from None
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(converted[n])
    try:
        save_model(cfg, model, str(out), str(tok) if tok else None, text_form, data_processor)
    except ValueError as e:
        raise SystemExit(f"convert_gr00t_checkpoint: {e}") from None
    return dict(report, config={"name": cfg.name, "gr00t_head": cfg.gr00t_head, "backbone": cfg.backbone},
                tokenizer=str(tok) if tok else None, chat_template=template_source, text_form=text_form,
                images=images, processor=data_processor)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("--model", type=Path, default=None,
                    help="an exported LoongForge model to convert onto (then --out is a .safetensors)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="import: a ModelConfig override (num_views, max_text_len, ...)")
    ap.add_argument("--backbone-config", type=Path, default=None,
                    help="import: the backbone's config.json when the checkpoint's model_name is not the released one")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="import: the tokenizer.json to record (default: SRC_DIR/tokenizer.json when present)")
    ap.add_argument("--seed", type=int, default=0, help="import: seed for parameters the checkpoint lacks")
    ap.add_argument("--chat-template", type=Path, default=None,
                    help="import (N1.7, N1.6 with a tokenizer): the chat template (.jinja, or a .json with "
                         "chat_template) instead of the one next to the tokenizer")
    ap.add_argument("--no-chat-template", action="store_true",
                    help="import (N1.7, N1.6 with a tokenizer): no chat template: the LM sees [images ; text] "
                         "(not upstream's prompt)")
    ap.add_argument("--embodiment-tag", default=None,
                    help="import: the embodiment whose statistics, slot and settings the data pipeline uses, "
                         "as lerobot's GrootConfig.embodiment_tag / Isaac-GR00T's embodiment tag (default "
                         "new_embodiment)")
    args = ap.parse_args(argv)
    if args.model is None:
        from model import tokenizer as tokenizers_
        r = import_checkpoint(args.src, args.out, args.strict, args.overrides, args.backbone_config, args.tokenizer,
                              args.seed, args.chat_template, args.no_chat_template, args.embodiment_tag)
        print(f"imported {args.src} as {r['config']} ({r['mapped']} tensors) -> {args.out}; tokenizer: "
              f"{r['tokenizer'] or 'word hash (no tokenizer.json in the checkpoint)'}"
              + (f"; chat template: {r['chat_template']}" if r["chat_template"] else "")
              + ("; task texts formalized as upstream N1.7's (convert the dataset with --formalize-language)"
                 if r["text_form"] == tokenizers_.GR00T_FORMALIZED else "")
              + ("; task texts formalized as Isaac-GR00T N1.6's (convert the dataset with --formalize-language n16)"
                 if r["text_form"] == tokenizers_.GR00T_N16_FORMALIZED else ""))
        if r["images"]:
            print(r["images"])
        if r["processor"]:
            from gr00t_processor import describe
            print(describe(r["processor"]))
    else:
        if (args.overrides or args.backbone_config or args.tokenizer or args.chat_template or args.no_chat_template
                or args.embodiment_tag):
            ap.error("--set, --backbone-config, --tokenizer, --(no-)chat-template and --embodiment-tag are for "
                     "importing (without --model)")
        r = convert(args.src, args.model, args.out, args.strict)
        print(f"mapped {r['mapped']} tensors -> {args.out}")
    if r["unused_known"]:
        print(f"dropped {len(r['unused_known'])} upstream tensors GR00T never reads: {r['unused_known']}")
    if r["unmapped_upstream"]:
        print(f"dropped {len(r['unmapped_upstream'])} upstream tensors without a LoongForge counterpart, e.g. "
              f"{r['unmapped_upstream'][:3]}")
    if r["kept_from_model"]:
        print(f"kept {len(r['kept_from_model'])} LoongForge parameters from "
              f"{args.model or 'the model built from config.json'}, e.g. {r['kept_from_model'][:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
