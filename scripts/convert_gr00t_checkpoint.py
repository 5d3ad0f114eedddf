#!/usr/bin/env python3
"""Convert a GR00T-N1.6-style Hugging Face checkpoint to LoongForge names.

    python3 scripts/convert_gr00t_checkpoint.py SRC --model MODEL.pt --out OUT.safetensors [--strict]

SRC is a safetensors file or a folder of them (sharded `model-0000X-of-0000N.safetensors`).
MODEL.pt is the exported LoongForge model the weights are for: its parameters
not found in SRC keep their values from MODEL.pt (and are listed), SRC tensors
with no LoongForge counterpart are listed and dropped, and a shape mismatch is
an error naming both keys. --strict turns any unmapped tensor into an error.
OUT loads with `safetensors.torch.load_file` into scripts/model and as
model.safetensors of a LoongForge checkpoint.

The mapping (upstream name -> LoongForge name) is the table MAPPING below,
one row per module kind, `{i}` a layer index and `{p}` weight/bias. Upstream
names follow the public Isaac-GR00T code (Eagle backbone with a SigLIP vision
tower, `mlp1` connector, Qwen-style language model; the flow-matching action
head with `CategorySpecificLinear` weight banks `W`/`b` of shape
(32, in, out), a diffusers-style DiT `transformer_blocks`). Rows for parts that
LoongForge shapes differently (e.g. its AdaLN before the feed-forward, its
`vl_proj`) are absent on purpose: those tensors are reported, never guessed.
"""
import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, List, Tuple

VIS = "backbone.eagle_model.vision_model.vision_model"
LM = "backbone.eagle_model.language_model.model"
DIT = "action_head.model"

# (upstream template, LoongForge template)
MAPPING: List[Tuple[str, str]] = [
    (f"{VIS}.embeddings.patch_embedding.{{p}}", "vision.patch_embed.{p}"),
    (f"{VIS}.embeddings.position_embedding.weight", "vision.pos_embed"),
    (f"{VIS}.encoder.layers.{{i}}.layer_norm1.{{p}}", "vision.blocks.{i}.ln1.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.layer_norm2.{{p}}", "vision.blocks.{i}.ln2.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.self_attn.q_proj.{{p}}", "vision.blocks.{i}.attn.q.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.self_attn.k_proj.{{p}}", "vision.blocks.{i}.attn.k.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.self_attn.v_proj.{{p}}", "vision.blocks.{i}.attn.v.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.self_attn.out_proj.{{p}}", "vision.blocks.{i}.attn.o.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.mlp.fc1.{{p}}", "vision.blocks.{i}.mlp.fc1.{p}"),
    (f"{VIS}.encoder.layers.{{i}}.mlp.fc2.{{p}}", "vision.blocks.{i}.mlp.fc2.{p}"),
    (f"{VIS}.post_layernorm.{{p}}", "vision.post_norm.{p}"),
    ("backbone.eagle_model.mlp1.0.{p}", "connector.norm.{p}"),
    ("backbone.eagle_model.mlp1.1.{p}", "connector.fc1.{p}"),
    ("backbone.eagle_model.mlp1.3.{p}", "connector.fc2.{p}"),
    (f"{LM}.embed_tokens.weight", "llm.embed_tokens.weight"),
    (f"{LM}.layers.{{i}}.input_layernorm.weight", "llm.layers.{i}.input_norm.weight"),
    (f"{LM}.layers.{{i}}.post_attention_layernorm.weight", "llm.layers.{i}.post_attn_norm.weight"),
    (f"{LM}.layers.{{i}}.self_attn.q_proj.{{p}}", "llm.layers.{i}.attn.q_proj.{p}"),
    (f"{LM}.layers.{{i}}.self_attn.k_proj.{{p}}", "llm.layers.{i}.attn.k_proj.{p}"),
    (f"{LM}.layers.{{i}}.self_attn.v_proj.{{p}}", "llm.layers.{i}.attn.v_proj.{p}"),
    (f"{LM}.layers.{{i}}.self_attn.o_proj.{{p}}", "llm.layers.{i}.attn.o_proj.{p}"),
    (f"{LM}.layers.{{i}}.self_attn.q_norm.weight", "llm.layers.{i}.attn.q_norm.weight"),
    (f"{LM}.layers.{{i}}.self_attn.k_norm.weight", "llm.layers.{i}.attn.k_norm.weight"),
    (f"{LM}.layers.{{i}}.mlp.gate_proj.weight", "llm.layers.{i}.mlp.gate_proj.weight"),
    (f"{LM}.layers.{{i}}.mlp.up_proj.weight", "llm.layers.{i}.mlp.up_proj.weight"),
    (f"{LM}.layers.{{i}}.mlp.down_proj.weight", "llm.layers.{i}.mlp.down_proj.weight"),
    (f"{LM}.norm.weight", "llm.norm.weight"),
    ("action_head.position_embedding.weight", "action_head.pos_embed"),
    ("action_head.vlln.{p}", "action_head.vl_norm.{p}"),
    (f"{DIT}.timestep_encoder.timestep_embedder.linear_1.{{p}}", "action_head.timestep_encoder.fc1.{p}"),
    (f"{DIT}.timestep_encoder.timestep_embedder.linear_2.{{p}}", "action_head.timestep_encoder.fc2.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.norm1.linear.{{p}}", "action_head.blocks.{i}.norm1.linear.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.attn1.to_q.{{p}}", "action_head.blocks.{i}.attn.q.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.attn1.to_k.{{p}}", "action_head.blocks.{i}.attn.k.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.attn1.to_v.{{p}}", "action_head.blocks.{i}.attn.v.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.attn1.to_out.0.{{p}}", "action_head.blocks.{i}.attn.o.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.ff.net.0.proj.{{p}}", "action_head.blocks.{i}.ff.fc1.{p}"),
    (f"{DIT}.transformer_blocks.{{i}}.ff.net.2.{{p}}", "action_head.blocks.{i}.ff.fc2.{p}"),
    (f"{DIT}.proj_out_1.{{p}}", "action_head.proj_out_1.{p}"),
    (f"{DIT}.proj_out_2.{{p}}", "action_head.proj_out_2.{p}"),
] + [
    # CategorySpecificLinear banks: upstream W/b, LoongForge weight/bias, same (32, in, out) layout.
    (f"action_head.{mlp}.{up}.{w}", f"embodiment.{mlp}.{ours}.{p}")
    for mlp, layers in (("state_encoder", ("layer1", "layer2")), ("action_decoder", ("layer1", "layer2")),
                        ("action_encoder", ("W1", "W2", "W3")))
    for up, ours in ((l, l if l.startswith("layer") else "w" + l[1:]) for l in layers)
    for w, p in (("W", "weight"), ("b", "bias"))
]


def _regex(template: str) -> "re.Pattern":
    out = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(out + "$")


_FORWARD = [(_regex(u), o) for u, o in MAPPING]
_BACKWARD = [(_regex(o), u) for u, o in MAPPING]


def _apply(name: str, table) -> str:
    for rx, template in table:
        m = rx.match(name)
        if m:
            return template.format(**m.groupdict())
    return ""


def to_loongforge(upstream: str) -> str:
    """LoongForge name of an upstream tensor, or '' when it has none."""
    return _apply(upstream, _FORWARD)


def to_upstream(ours: str) -> str:
    """Upstream name of a LoongForge parameter, or '' when it has none."""
    return _apply(ours, _BACKWARD)


def load_source(src: Path) -> Dict:
    from safetensors.torch import load_file
    files = [src] if src.is_file() else sorted(src.glob("*.safetensors"))
    if not files:
        sys.exit(f"convert_gr00t_checkpoint: no .safetensors in {src}")
    tensors = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def convert(src: Path, model_path: Path, out: Path, strict: bool = False) -> Dict:
    import torch
    from safetensors.torch import save_file
    scripted = torch.jit.load(str(model_path), map_location="cpu")
    ours = {n: p.detach().clone() for n, p in scripted.named_parameters()}
    upstream = load_source(src)
    report = {"mapped": 0, "unmapped_upstream": [], "kept_from_model": [], "shape_errors": []}
    taken = set()
    for name, t in upstream.items():
        target = to_loongforge(name)
        if not target or target not in ours:
            report["unmapped_upstream"].append(name)
            continue
        if tuple(t.shape) != tuple(ours[target].shape):
            report["shape_errors"].append(f"{name} {tuple(t.shape)} -> {target} {tuple(ours[target].shape)}")
            continue
        ours[target] = t.to(ours[target].dtype).contiguous()
        taken.add(target)
        report["mapped"] += 1
    report["kept_from_model"] = sorted(set(ours) - taken)
    if report["shape_errors"]:
        raise SystemExit("convert_gr00t_checkpoint: shape mismatch (is --model the right config?):\n  " +
                         "\n  ".join(report["shape_errors"]))
    if strict and (report["unmapped_upstream"] or report["kept_from_model"]):
        raise SystemExit("convert_gr00t_checkpoint: --strict and some tensors are unmapped:\n" +
                         json.dumps({k: report[k] for k in ("unmapped_upstream", "kept_from_model")}, indent=1))
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(ours, str(out), metadata={"converted_from": str(src)})
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args(argv)
    r = convert(args.src, args.model, args.out, args.strict)
    print(f"mapped {r['mapped']} tensors -> {args.out}")
    if r["unmapped_upstream"]:
        print(f"dropped {len(r['unmapped_upstream'])} upstream tensors without a LoongForge counterpart, e.g. "
              f"{r['unmapped_upstream'][:3]}")
    if r["kept_from_model"]:
        print(f"kept {len(r['kept_from_model'])} LoongForge parameters from {args.model}, e.g. "
              f"{r['kept_from_model'][:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
