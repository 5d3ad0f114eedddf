# Proves the analytic FLOPs in model/flops.py are what the model executes: on
# n16-tiny (gr00t-tiny: test_gr00t_model.py), forward and freezing-aware backward FLOPs equal
# torch.utils.flop_counter's count of the real forward and backward (math SDPA
# backend, so attention matmuls are counted), across freezing settings, views,
# action horizons and the optional imu/audio encoders; and that the big configs
# get sane, positive numbers.
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import model
from model.batch import example_batch
from model.flops import flops_per_sample


def measured_flops(cfg: model.ModelConfig):
    torch.manual_seed(0)
    m = model.build_model(cfg)
    batch = example_batch(cfg, 1, seed=0)
    if cfg.use_imu:
        batch["imu"] = torch.randn(1, cfg.imu_len, cfg.imu_channels)
    if cfg.use_audio:
        batch["audio"] = torch.randn(1, cfg.audio_len, cfg.audio_features)
    with sdpa_kernel(SDPBackend.MATH):
        fwd = FlopCounterMode(display=False)
        with fwd:
            out = m(batch)
        bwd = FlopCounterMode(display=False)
        with bwd:
            out["loss"].backward()
    return fwd.get_total_flops(), bwd.get_total_flops()


@pytest.mark.parametrize("overrides", [
    {},
    {"tune_visual": True, "tune_llm": True},
    {"tune_top_llm_layers": 0},
    {"tune_visual": True},
    {"num_views": 2, "action_horizon": 8, "max_text_len": 12},
    {"use_imu": True, "use_audio": True, "imu_len": 33},
])
def test_analytic_flops_equal_the_counted_forward_and_backward_flops(overrides):
    cfg = model.get_config("n16-tiny", **overrides)
    fwd, bwd = measured_flops(cfg)
    analytic = flops_per_sample(cfg)
    assert analytic["forward_per_sample"] == fwd
    assert analytic["backward_per_sample"] == bwd


@pytest.mark.parametrize("name", list(model.CONFIGS))
def test_every_config_has_positive_flops_and_frozen_towers_cut_the_backward(name):
    cfg = model.get_config(name)
    f = flops_per_sample(cfg)
    print(f"{name}: forward {f['forward_per_sample'] / 1e9:.2f} GFLOP/sample, "
          f"backward {f['backward_per_sample'] / 1e9:.2f} GFLOP/sample")
    assert f["forward_per_sample"] > 0 and f["backward_per_sample"] > 0
    assert f["by_role"]["vision"]["backward"] < f["by_role"]["vision"]["forward"]  # ViT frozen by default
    assert sum(r["forward"] for r in f["by_role"].values()) == f["forward_per_sample"]
    full = flops_per_sample(model.get_config(name, tune_visual=True, tune_llm=True))
    assert full["forward_per_sample"] == f["forward_per_sample"]
    assert full["backward_per_sample"] > f["backward_per_sample"]
