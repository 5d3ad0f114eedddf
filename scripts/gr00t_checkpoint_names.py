"""The name table between upstream GR00T checkpoints and LoongForge parameters, shared by
scripts/convert_gr00t_checkpoint.py (upstream -> LoongForge), scripts/export_gr00t_checkpoint.py
(LoongForge -> upstream) and scripts/gr00t_upstream_config.py (ConversionError).

- LAYOUT_MAPPING: one row per module kind and backbone layout (upstream template, LoongForge
  template; `{i}` a layer index, `{p}` weight/bias), the single source of names and shapes: no
  tensor needs a transpose, each LoongForge parameter has its upstream tensor's shape.
  Layouts (LAYOUTS): "n1.7" (GR00T N1.7: `backbone.model.model.visual.*` Qwen3-VL ViT with its
  merger and deepstack mergers, `backbone.model.model.language_model.*`), "n1.6" (GR00T N1.6:
  `backbone.model.vision_model.vision_model.*` SigLIP-2, `backbone.model.mlp1.*`,
  `backbone.model.language_model.model.*` Qwen3) and "n16" (N1.5-style `backbone.eagle_model.*`
  names onto the n16 backbone, never checked against upstream code); the head rows (layout None)
  are common to all.
- to_loongforge(upstream, layout="") / to_upstream(ours, layout="n16"): one name through the table,
  '' when it has none; layout_of_model(names): the layout a parameter set's names show.
- KNOWN_UNUSED / known_unused(upstream, layout): tensors released checkpoints hold that upstream's
  forward never reads (reported as unused_known, never an error, also under --strict).
- convert_tensors(upstream, ours, strict, layout): {upstream name: tensor} -> {our name: tensor} and
  a report; ConversionError (a checkpoint that does not fit the target model) names each tensor.

Pure Python: no torch import (the tensors are only moved and cast by their own methods).
"""
import json
import re
from typing import Dict, List, Tuple

VIS = "backbone.eagle_model.vision_model.vision_model"
LM = "backbone.eagle_model.language_model.model"
DIT = "action_head.model"
VLSA = "action_head.vl_self_attention"
N16_VIS = "backbone.model.vision_model.vision_model"   # GR00T N1.6: EagleBackbone.model = Eagle3_VL
N16_LM = "backbone.model.language_model.model"
N17_VIS = "backbone.model.model.visual"                 # GR00T N1.7: Qwen3Backbone.model = Qwen3VLForConditionalGeneration
N17_LM = "backbone.model.model.language_model"

# Backbone layouts. "n16": Eagle-style (N1.5) names onto scripts/model/layers.py's n16 backbone (gr00t-tiny,
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
