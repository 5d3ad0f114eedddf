# Proves the N1.6-style model family is what the trainer is promised: every named
# config has its intended size (big ones built on the meta device), the
# TorchScript export computes exactly what the eager module computes (full
# n16-tiny and n16-1b; depth-reduced n16-3b and n16-12b), freezing leaves
# gradients on exactly the trainable parameters, the loss is the masked
# flow-matching MSE with an exact num_valid, and the optional imu/audio
# encoders join the VL sequence (or fail loudly when their input is missing).
import dataclasses

import pytest
import torch

import model
from model.batch import example_batch
from model.registry import is_trainable

PARAM_RANGES = {  # name -> (min, max) parameters
    "n16-tiny": (2e6, 10e6),
    "n16-1b": (0.9e9, 1.1e9),
    "n16-3b": (2.7e9, 3.3e9),
    "n16-12b": (10.8e9, 13.2e9),
    "gr00t-tiny": (2e6, 10e6),
    "gr00t-n1.6-tiny": (2e6, 10e6),
    "gr00t-n1.7-tiny": (2e6, 10e6),
    "gr00t-n1.6-3b": (2.7e9, 3.3e9),
    "gr00t-n1.7-3b": (2.7e9, 3.3e9),
}


def numel(m: torch.nn.Module, trainable_only: bool = False) -> int:
    return sum(p.numel() for p in m.parameters() if p.requires_grad or not trainable_only)


def depth_reduced(cfg: model.ModelConfig) -> model.ModelConfig:
    """Same widths, heads and vocabulary; 1 ViT layer, 1 LM layer, 2 DiT layers
    (one cross-attention, one self-attention block)."""
    return dataclasses.replace(cfg, vit_layers=1, llm_layers=1, dit_layers=2, tune_top_llm_layers=1)


def build(cfg: model.ModelConfig, seed: int = 0) -> model.N16Model:
    torch.manual_seed(seed)
    return model.build_model(cfg)


# ---------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("name", list(model.CONFIGS))
def test_each_config_has_its_intended_parameter_count(name):
    cfg = model.get_config(name)
    m = model.build_model(cfg, torch.device("meta"))
    total = numel(m)
    by_role = {}
    for n, p in m.named_parameters():
        by_role[model.param_role(n)] = by_role.get(model.param_role(n), 0) + p.numel()
    print(f"{name}: {total / 1e6:.2f} M params, {numel(m, True) / 1e6:.2f} M trainable, "
          + ", ".join(f"{k} {v / 1e6:.1f} M" for k, v in by_role.items()))
    lo, hi = PARAM_RANGES[name]
    assert lo <= total <= hi
    assert sum(by_role.values()) == total


def test_meta_device_and_cpu_builds_have_identical_parameter_shapes():
    cfg = model.get_config("n16-tiny", use_imu=True, use_audio=True)
    meta = model.build_model(cfg, torch.device("meta"))
    cpu = build(cfg)
    assert [(n, p.shape) for n, p in meta.named_parameters()] == [(n, p.shape) for n, p in cpu.named_parameters()]
    assert all(p.is_meta for p in meta.parameters())


# ---------------------------------------------------------------------------- TorchScript == eager

def assert_scripted_matches_eager(cfg: model.ModelConfig, batch_size: int, tol: float):
    m = build(cfg).eval()
    batch = example_batch(cfg, batch_size, seed=1)
    with torch.no_grad():
        eager = m(batch)
        scripted = torch.jit.script(m)(batch)
    diff = (eager["pred_velocity"] - scripted["pred_velocity"]).abs().max().item()
    print(f"{cfg.name}: max |eager - scripted| pred_velocity = {diff:.3g}, "
          f"loss {eager['loss'].item():.6f} vs {scripted['loss'].item():.6f}")
    assert diff <= tol
    assert abs(eager["loss"].item() - scripted["loss"].item()) <= tol
    assert eager["num_valid"].item() == scripted["num_valid"].item()
    assert torch.isfinite(eager["pred_velocity"]).all()


# The large configs take minutes on 2 cores: full forms only (ctest -L long).
@pytest.mark.parametrize("name", ["n16-tiny", pytest.param("n16-1b", marks=pytest.mark.long)])
def test_scripted_forward_equals_eager_forward_on_the_full_model(name):
    cfg = model.get_config(name)
    assert_scripted_matches_eager(cfg, batch_size=2 if name == "n16-tiny" else 1, tol=1e-5)


@pytest.mark.parametrize("name", [pytest.param("n16-3b", marks=pytest.mark.long),
                                  pytest.param("n16-12b", marks=pytest.mark.long)])
def test_scripted_forward_equals_eager_forward_on_a_depth_reduced_copy(name):
    assert_scripted_matches_eager(depth_reduced(model.get_config(name)), batch_size=1, tol=1e-5)


def test_scripted_backward_gives_the_same_gradients_as_eager():
    cfg = model.get_config("n16-tiny")
    eager, scripted_src = build(cfg), build(cfg)
    scripted = torch.jit.script(scripted_src)
    batch = example_batch(cfg, 2, seed=2)
    eager(batch)["loss"].backward()
    for _ in range(3):  # the profiling executor optimizes after a few runs; all must agree
        scripted_src.zero_grad(set_to_none=True)
        scripted(batch)["loss"].backward()
        worst = max((a.grad - b.grad).abs().max().item()
                    for a, b in zip(eager.parameters(), scripted_src.parameters()) if a.requires_grad)
        assert worst <= 1e-6


# ---------------------------------------------------------------------------- freezing

def test_default_freezing_trains_connector_top_lm_layers_action_head_and_embodiment_mlps():
    cfg = model.get_config("n16-tiny")  # 2 LM layers, tune_top_llm_layers = 1
    m = build(cfg)
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    for n, _ in m.named_parameters():
        expected = (n.startswith(("connector.", "llm.layers.1.", "llm.norm.", "action_head.", "embodiment.")))
        assert (n in trainable) == expected, n
    assert any(n.startswith("vision.") for n, _ in m.named_parameters())


@pytest.mark.parametrize("overrides,frozen_prefixes", [
    ({"tune_visual": True, "tune_llm": True}, ()),
    ({"tune_top_llm_layers": 0}, ("vision.", "llm.")),
    ({"tune_top_llm_layers": 2}, ("vision.", "llm.embed_tokens.")),
    ({"tune_visual": True}, ("llm.embed_tokens.", "llm.layers.0.")),
])
def test_freezing_flags_select_the_trainable_set(overrides, frozen_prefixes):
    cfg = model.get_config("n16-tiny", **overrides)
    m = build(cfg)
    for n, p in m.named_parameters():
        assert p.requires_grad == (not n.startswith(frozen_prefixes)), n
        assert p.requires_grad == is_trainable(n, cfg), n


def test_backward_gives_gradients_on_exactly_the_trainable_parameters():
    cfg = model.get_config("n16-tiny")
    m = build(cfg)
    m(example_batch(cfg, 2, seed=3))["loss"].backward()
    for n, p in m.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, n
        else:
            assert p.grad is None, n


# ---------------------------------------------------------------------------- loss contract

def test_loss_is_the_masked_mse_of_the_velocity_and_num_valid_counts_valid_elements():
    cfg = model.get_config("n16-tiny")
    m = build(cfg)
    batch = example_batch(cfg, 2, seed=4)
    out = m(batch)
    target = batch["actions"] - batch["fm_noise"]
    mask = batch["action_mask"]
    manual = (((out["pred_velocity"] - target) ** 2) * mask).sum() / mask.sum()
    assert out["loss"].dim() == 0 and out["num_valid"].dim() == 0
    assert out["num_valid"].dtype == torch.float32
    assert out["num_valid"].item() == mask.sum().item() == (2 * 16 - 8) * 44
    torch.testing.assert_close(out["loss"], manual, rtol=1e-6, atol=0)


def test_all_masked_batch_gives_zero_num_valid_and_a_finite_loss():
    cfg = model.get_config("n16-tiny")
    m = build(cfg)
    batch = example_batch(cfg, 2, seed=5)
    batch["action_mask"] = torch.zeros_like(batch["action_mask"])
    out = m(batch)
    assert out["num_valid"].item() == 0.0
    assert torch.isfinite(out["loss"]) and out["loss"].item() == 0.0


def test_fm_t_and_fm_noise_make_the_forward_deterministic_and_their_absence_samples():
    cfg = model.get_config("n16-tiny")
    m = build(cfg).eval()
    fixed = example_batch(cfg, 2, seed=6)
    with torch.no_grad():
        a, b = m(fixed), m(fixed)
        assert torch.equal(a["pred_velocity"], b["pred_velocity"]) and torch.equal(a["loss"], b["loss"])
        sampled = example_batch(cfg, 2, seed=6, with_fm=False)
        c, d = m(sampled), m(sampled)
    assert not torch.equal(c["loss"], d["loss"])


def test_sampled_flow_matching_time_follows_groots_shifted_beta():
    # t = (s - u^(1/1.5)) / s: the pinned time equals what the model samples from the same u.
    cfg = model.get_config("n16-tiny")
    m = build(cfg).eval()
    batch = example_batch(cfg, 2, seed=7)
    noise = batch["fm_noise"]
    torch.manual_seed(123)
    u = torch.rand(2)
    batch["fm_t"] = (0.999 - u ** (1 / 1.5)) / 0.999
    with torch.no_grad():
        pinned = m(batch)["loss"]
        del batch["fm_t"]
        torch.manual_seed(123)
        sampled = m(batch)["loss"]
    assert torch.equal(noise, batch["fm_noise"])
    torch.testing.assert_close(pinned, sampled)


# ---------------------------------------------------------------------------- imu / audio

def test_enabled_imu_and_audio_lengthen_the_vl_sequence_by_their_tokens():
    base_cfg = model.get_config("n16-tiny")
    base = build(base_cfg)
    batch = example_batch(base_cfg, 2, seed=8)
    batch["imu"] = torch.randn(2, base_cfg.imu_len, base_cfg.imu_channels)
    batch["audio"] = torch.randn(2, base_cfg.audio_len, base_cfg.audio_features)
    base_len = base.encode_vl(batch)[0].shape[1]
    assert base_len == base_cfg.vl_len()
    for over, extra in [({"use_imu": True}, base_cfg.imu_tokens), ({"use_audio": True}, base_cfg.audio_tokens),
                        ({"use_imu": True, "use_audio": True}, base_cfg.imu_tokens + base_cfg.audio_tokens)]:
        cfg = model.get_config("n16-tiny", **over)
        m = build(cfg)
        vl, vl_mask = m.encode_vl(batch)
        assert vl.shape[1] == vl_mask.shape[1] == base_len + extra == cfg.vl_len()
        out = torch.jit.script(m)(batch)
        assert torch.isfinite(out["loss"])


@pytest.mark.parametrize("key", ["imu", "audio"])
def test_an_enabled_encoder_whose_input_is_missing_raises_a_clear_error(key):
    cfg = model.get_config("n16-tiny", **{f"use_{key}": True})
    m = build(cfg)
    batch = example_batch(cfg, 1, seed=9)
    del batch[key]
    with pytest.raises(RuntimeError, match=f"batch has no '{key}'.*use_{key}=true"):
        m(batch)
    with pytest.raises(torch.jit.Error, match=f"batch has no '{key}'.*use_{key}=true"):  # not a RuntimeError
        torch.jit.script(m)(batch)
