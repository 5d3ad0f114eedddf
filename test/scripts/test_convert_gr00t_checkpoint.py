"""The GR00T -> LoongForge checkpoint converter, on a synthetic checkpoint that
uses the upstream names: every parameter with an upstream counterpart is
carried over exactly and lands under its LoongForge name, upstream tensors
without a counterpart are reported and dropped, LoongForge parameters without
one keep the model file's values, and a shape mismatch is an error."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import convert_gr00t_checkpoint as conv  # noqa: E402
import gr00t_checkpoint_names as ckpt_names  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("m") / "tiny.pt"
    subprocess.run([sys.executable, str(REPO / "scripts/model/export.py"), "--config", "n16-tiny", "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(REPO / "scripts")))
    return out


@pytest.mark.parametrize("layout", ckpt_names.LAYOUTS)
def test_the_name_table_round_trips_in_every_layout(layout):
    rows = [(u, o) for lay, u, o in ckpt_names.LAYOUT_MAPPING if lay in (None, layout)]
    assert len({o for _, o in rows}) == len(rows)  # one upstream name per LoongForge name in a layout
    for upstream, ours in rows:
        u = upstream.replace("{i}", "3").replace("{p}", "weight")
        o = ours.replace("{i}", "3").replace("{p}", "weight")
        assert ckpt_names.to_loongforge(u) == o and ckpt_names.to_upstream(o, layout) == u
        assert ckpt_names.to_loongforge(u, layout) == o


def test_a_synthetic_upstream_checkpoint_converts_exactly(tiny, tmp_path):
    params = {n: p.detach() for n, p in torch.jit.load(str(tiny)).named_parameters()}
    gen = torch.Generator().manual_seed(0)
    upstream, expected = {}, {}
    for name, p in params.items():
        up = ckpt_names.to_upstream(name)
        if up:
            upstream[up] = torch.randn(p.shape, generator=gen)
            expected[name] = upstream[up]
    upstream["backbone.eagle_model.language_model.lm_head.weight"] = torch.zeros(4, 4)  # no counterpart
    src = tmp_path / "model-00001-of-00001.safetensors"
    save_file(upstream, str(src))
    report = conv.convert(tmp_path, tiny, tmp_path / "out.safetensors")
    out = load_file(str(tmp_path / "out.safetensors"))
    assert set(out) == set(params)
    assert report["mapped"] == len(expected) and len(expected) > 0.8 * len(params)
    for name, t in expected.items():
        assert torch.equal(out[name], t), name
    for name in report["kept_from_model"]:
        assert torch.equal(out[name], params[name])
    assert report["unmapped_upstream"] == ["backbone.eagle_model.language_model.lm_head.weight"]


def test_a_shape_mismatch_is_an_error_naming_both_keys(tiny, tmp_path):
    src = tmp_path / "bad.safetensors"
    save_file({"action_head.vlln.weight": torch.zeros(7)}, str(src))
    with pytest.raises(SystemExit, match=r"action_head.vlln.weight \(7,\) -> action_head.vl_norm.weight"):
        conv.convert(src, tiny, tmp_path / "out.safetensors")
