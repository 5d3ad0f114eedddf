#!/usr/bin/env python3
"""Write LoongForge weights back under upstream GR00T names (the inverse of
scripts/convert_gr00t_checkpoint.py, through the same table: scripts/gr00t_checkpoint_names.py).

    python3 scripts/export_gr00t_checkpoint.py SRC --out OUT.safetensors [--strict]

SRC is a LoongForge safetensors file (the converter's output, or a
checkpoint's model.safetensors) or a checkpoint folder holding
model.safetensors. Every tensor with an upstream counterpart is written
unchanged under its upstream name, in the backbone layout its names show
(N1.7 Qwen3-VL, N1.6 Eagle, or the n16 backbone's N1.5-style names); the
others are listed and left out (--strict makes them an error). The table
covers the upstream-exact head and embodiment MLPs of
scripts/model/gr00t_head.py and the exact N1.6 / N1.7 backbones completely, so
an imported checkpoint comes back bit for bit, less the tensors upstream never
reads (test/scripts/test_convert_gr00t_head.py, test_gr00t_backbones.py).
"""
import argparse
import sys
from pathlib import Path
from typing import Dict, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gr00t_checkpoint_names import ConversionError, layout_of_model, to_upstream  # noqa: E402


def export_tensors(ours: Dict, strict: bool = False, layout: str = "") -> Tuple[Dict, Dict]:
    """{our name: tensor} -> ({upstream name: tensor}, report {layout, exported, no_upstream_name});
    layout "" = read from the names (gr00t_checkpoint_names.layout_of_model)."""
    layout = layout or layout_of_model(ours)
    out, missing = {}, []
    for name, t in ours.items():
        up = to_upstream(name, layout)
        if not up:
            missing.append(name)
            continue
        if up in out:
            raise ConversionError(f"export_gr00t_checkpoint: two tensors map to {up}")
        out[up] = t.contiguous()
    report = {"layout": layout, "exported": len(out), "no_upstream_name": sorted(missing)}
    if strict and missing:
        raise ConversionError("export_gr00t_checkpoint: --strict and these tensors have no upstream name:\n  " +
                              "\n  ".join(report["no_upstream_name"]))
    return out, report


def export(src: Path, out: Path, strict: bool = False) -> Dict:
    from safetensors.torch import load_file, save_file
    path = src / "model.safetensors" if src.is_dir() else src
    if not path.is_file():
        raise SystemExit(f"export_gr00t_checkpoint: no {path}")
    try:
        tensors, report = export_tensors(load_file(str(path)), strict)
    except ConversionError as e:
        raise SystemExit(str(e)) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={"exported_from": str(path), "format": "pt"})
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--strict", action="store_true")
    args = ap.parse_args(argv)
    r = export(args.src, args.out, args.strict)
    print(f"exported {r['exported']} tensors -> {args.out}")
    if r["no_upstream_name"]:
        print(f"left out {len(r['no_upstream_name'])} tensors without an upstream name, e.g. "
              f"{r['no_upstream_name'][:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
