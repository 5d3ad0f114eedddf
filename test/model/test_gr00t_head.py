"""The upstream-exact GR00T action head (scripts/model/gr00t_head.py) against
NVIDIA's own modules from the lerobot 0.6.1 wheel (test/lerobot_oracle.py):
random-initialised upstream GR00TN17ActionHead, its state dict converted by
scripts/gr00t_checkpoint_names.py's table (strict: every tensor maps, none is
left over), our head loaded with it; then, for the same backbone features,
masks, state, actions, noise and time, the predicted velocity and the loss
agree within 1e-5 relative and every parameter's gradient within 1e-4 relative
(fp32, CPU), in eval mode and in train mode with dropout and state dropout on
(both seeded identically: the dropout draws happen in the same order). Tiny
shapes here; the full N1.7 / N1.6 shapes are built on the meta device and must
have exactly upstream's tensors (names through the table, shapes, count)."""
import dataclasses
import os
import sys
from contextlib import contextmanager

import pytest
import torch

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, TEST_DIR)
sys.path.insert(0, os.path.join(TEST_DIR, "..", "scripts"))
import gr00t_checkpoint_names as ckpt_names  # noqa: E402
import lerobot_oracle  # noqa: E402
from model.gr00t_head import Gr00tHeadConfig, build_head, get_head_config, param_count  # noqa: E402

FWD_RTOL = 1e-5
GRAD_RTOL = 1e-4

# 6 DiT blocks: 0 text, 1 self, 2 image, 3 self, 4 text, 5 self (attend_text_every_n_blocks 2).
TINY = Gr00tHeadConfig(name="tiny", backbone_width=64, hidden_size=32, input_embedding_dim=48,
                       dit_layers=6, dit_heads=4, dit_head_dim=12, vl_layers=2, vl_heads=4, vl_head_dim=16,
                       max_seq_len=16, num_embodiments=3, max_state_dim=7, max_action_dim=6, action_horizon=5)


@pytest.fixture(scope="module")
def oracle():
    return lerobot_oracle.load()


upstream_config = lerobot_oracle.upstream_head_config
upstream_tensors = lerobot_oracle.upstream_head_tensors


def make_pair(oracle, cfg, seed=0, std=0.1, constant_only=False):
    """Upstream's head (random) and ours loaded with its converted state dict.

    Upstream starts some tensors at zero or one (category-linear biases, LayerNorm affines):
    they are randomised so that a swapped or transposed mapping cannot pass; with
    constant_only (the full-width test, where this is most of the time) only those are, the
    others keep upstream's random init, and ours is built on the meta device and takes
    copies of the converted tensors."""
    torch.manual_seed(seed)
    up = oracle.n17.GR00TN17ActionHead(upstream_config(oracle, cfg))
    with torch.no_grad():
        for p in up.parameters():
            if not constant_only or bool(p.min() == p.max()):
                p.copy_(torch.randn_like(p) * std)
    if constant_only:
        ours = build_head(cfg, torch.device("meta"))
        shapes = {n: torch.empty(p.shape) for n, p in ours.state_dict().items()}
        converted, report = ckpt_names.convert_tensors(upstream_tensors(up), shapes, strict=True)
        ours.load_state_dict({n: t.clone() for n, t in converted.items()}, strict=True, assign=True)
    else:
        ours = build_head(cfg)
        converted, report = ckpt_names.convert_tensors(upstream_tensors(up), dict(ours.state_dict()), strict=True)
        ours.load_state_dict(converted, strict=True)
    return up, ours, report


def make_inputs(cfg, S=10, seed=1):
    B = 3
    g = torch.Generator().manual_seed(seed)
    H, A = cfg.action_horizon, cfg.max_action_dim
    vl_mask = torch.ones(B, S, dtype=torch.bool)
    vl_mask[1, -3:] = False                         # padded tail
    vl_mask[2, -1:] = False
    image_mask = torch.zeros(B, S, dtype=torch.bool)
    image_mask[:, 1:5] = True                       # 4 image tokens, text around them
    image_mask[2, 5] = True
    action_mask = (torch.rand(B, H, A, generator=g) > 0.2).float()
    return {
        "vl": torch.randn(B, S, cfg.backbone_width, generator=g),
        "vl_mask": vl_mask, "image_mask": image_mask,
        "state": torch.randn(B, cfg.max_state_dim, generator=g),
        "actions": torch.randn(B, H, A, generator=g),
        "action_mask": action_mask,
        "embodiment_id": torch.tensor([cfg.num_embodiments - 1, 0, cfg.num_embodiments - 1]),
        "fm_t": torch.tensor([0.05, 0.5, 0.9987]),     # buckets 50, 500, 998
        "fm_noise": torch.randn(B, H, A, generator=g),
    }


@contextmanager
def upstream_draws(up, noise, t):
    """Upstream draws its noise (torch.randn) and time (Beta) inside forward; hand it ours instead,
    without touching the generator, so that the dropout draws line up with our module's."""
    real_randn = torch.randn

    def fixed_randn(*args, **kwargs):
        return noise.clone()

    up.sample_time = lambda batch_size, device, dtype: t.to(device, dtype)
    torch.randn = fixed_randn
    try:
        yield
    finally:
        torch.randn = real_randn
        del up.sample_time


def run_upstream(oracle, up, batch):
    BF = oracle.n17.BatchFeature
    captured = {}
    hook = up.action_decoder.register_forward_hook(lambda m, i, o: captured.__setitem__("pred", o))
    try:
        backbone = BF(data={"backbone_features": batch["vl"], "backbone_attention_mask": batch["vl_mask"],
                            "image_mask": batch["image_mask"]})
        action = BF(data={"state": batch["state"][:, None, :], "action": batch["actions"],
                          "embodiment_id": batch["embodiment_id"], "action_mask": batch["action_mask"]})
        with upstream_draws(up, batch["fm_noise"], batch["fm_t"]):
            out = up(backbone, action)
    finally:
        hook.remove()
    H = batch["actions"].shape[1]
    return out["loss"], captured["pred"][:, -H:]


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def compare(oracle, cfg, train: bool, seed=0, std=0.1, constant_only=False):
    """-> (forward rel diff, loss rel diff, worst grad rel diff and its tensor)."""
    up, ours, _ = make_pair(oracle, cfg, seed, std, constant_only)
    batch = make_inputs(cfg)
    up.train(train)
    ours.train(train)
    torch.manual_seed(1234)
    loss_up, pred_up = run_upstream(oracle, up, batch)
    torch.manual_seed(1234)
    res = ours(batch)
    assert torch.isfinite(loss_up) and torch.isfinite(res["loss"])
    loss_up.backward()
    res["loss"].backward()
    return rel(res["pred_velocity"], pred_up), rel(res["loss"], loss_up), worst_grad(up, ours)


def worst_grad(up, ours):
    """-> (largest relative gradient difference over upstream's tensors, its name); every
    tensor of both heads must have a gradient."""
    ours_params = dict(ours.named_parameters())
    worst = (0.0, "")
    for name, p in up.named_parameters():
        mine = ours_params[ckpt_names.to_loongforge("action_head." + name)]
        assert p.grad is not None and mine.grad is not None, name
        worst = max(worst, (rel(mine.grad, p.grad), name))
    return worst


def test_the_converted_upstream_head_maps_every_tensor_both_ways(oracle):
    up, ours, report = make_pair(oracle, TINY)
    assert report["mapped"] == len(up.state_dict()) == len(ours.state_dict())
    assert report["unmapped_upstream"] == [] and report["kept_from_model"] == []
    for name, t in upstream_tensors(up).items():
        assert torch.equal(ours.state_dict()[ckpt_names.to_loongforge(name)], t), name
        assert ckpt_names.to_upstream(ckpt_names.to_loongforge(name)) == name


@pytest.mark.parametrize("train", [False, True], ids=["eval", "train_dropout_seeded"])
def test_forward_loss_and_gradients_equal_upstream(oracle, train):
    fwd, loss, (grad, where) = compare(oracle, TINY, train)
    print(f"\n[{'train' if train else 'eval'}] max rel diff: forward {fwd:.2e}, loss {loss:.2e}, "
          f"grad {grad:.2e} ({where})")
    assert fwd <= FWD_RTOL and loss <= FWD_RTOL and grad <= GRAD_RTOL, (fwd, loss, grad, where)


def test_train_mode_really_drops(oracle):
    """The train-mode comparison means something: with dropout the loss differs from eval mode,
    and a different seed gives different drops."""
    up, ours, _ = make_pair(oracle, TINY)
    batch = make_inputs(cfg=TINY)
    ours.eval()
    eval_loss = ours(batch)["loss"].item()
    ours.train()
    torch.manual_seed(1)
    a = ours(batch)["loss"].item()
    torch.manual_seed(2)
    b = ours(batch)["loss"].item()
    assert a != eval_loss and a != b


def test_n16_shape_without_vl_self_attention_equals_upstream(oracle):
    cfg = dataclasses.replace(TINY, name="tiny-n1.6", vl_layers=0, state_dropout=0.0, action_horizon=4)
    fwd, loss, (grad, where) = compare(oracle, cfg, train=False)
    assert fwd <= FWD_RTOL and loss <= FWD_RTOL and grad <= GRAD_RTOL, (fwd, loss, grad, where)


def make_n16_mask_token_pair(oracle, cfg, seed=0):
    """N1.6's state dropout with its learned mask token, on upstream's modules. Isaac-GR00T's
    Gr00tN1d6ActionHead ships in no package, so its two state-dropout steps are transcribed here
    from its gr00t_n1d6.py onto lerobot's head (whose own, multiplicative, state dropout is off:
    state_dropout_prob 0): `mask_token = nn.Parameter(0.02 * randn(1, 1, input_embedding_dim))`, and
    right after the state encoder `d = rand(B) < state_dropout_prob; s = s * (1 - d) + mask_token * d`
    (a forward hook on state_encoder: the draw happens where upstream's does, before the noise and
    time); with cfg.state_noise_scale > 0 also its additive state noise right after the dropout,
    `s = s + randn_like(s) * state_additive_noise_scale`. -> (upstream head, ours, {"drop": the last
    drawn (B,) mask})."""
    torch.manual_seed(seed)
    up = oracle.n17.GR00TN17ActionHead(upstream_config(oracle, dataclasses.replace(cfg, state_dropout=0.0)))
    up.mask_token = torch.nn.Parameter(0.02 * torch.randn(1, 1, cfg.input_embedding_dim))
    drawn = {}

    def n16_state_dropout(module, inputs, out):
        d = torch.rand(out.shape[0], device=out.device) < cfg.state_dropout
        drawn["drop"] = d
        d = d[:, None, None].to(out.dtype)
        out = out * (1 - d) + up.mask_token * d
        if cfg.state_noise_scale > 0:
            out = out + torch.randn_like(out) * cfg.state_noise_scale
        return out

    up.state_encoder.register_forward_hook(n16_state_dropout)
    with torch.no_grad():
        for p in up.parameters():
            p.copy_(torch.randn_like(p) * 0.1)
    ours = build_head(cfg)
    converted, report = ckpt_names.convert_tensors(upstream_tensors(up), dict(ours.state_dict()), strict=True)
    ours.load_state_dict(converted, strict=True)
    return up, ours, drawn


def train_step_equals_upstream(oracle, up, ours, batch, label, seed=5):
    """One train-mode forward+backward of both heads seeded alike: velocity, loss and every gradient
    within tolerance (printed under `label`). -> our result."""
    up.train()
    ours.train()
    torch.manual_seed(seed)
    loss_up, pred_up = run_upstream(oracle, up, batch)
    torch.manual_seed(seed)
    res = ours(batch)
    loss_up.backward()
    res["loss"].backward()
    worst = worst_grad(up, ours)
    fwd, loss = rel(res["pred_velocity"], pred_up), rel(res["loss"], loss_up)
    print(f"\n[{label}] max rel diff: forward {fwd:.2e}, loss {loss:.2e}, grad {worst[0]:.2e} ({worst[1]})")
    assert fwd <= FWD_RTOL and loss <= FWD_RTOL and worst[0] <= GRAD_RTOL, (fwd, loss, worst)
    return res


def test_n16_state_mask_token_equals_upstream_with_the_same_drops(oracle):
    """N1.6 shape (no vl_self_attention) with state dropout 0.5 and the mask token: in train mode,
    seeded alike, the same samples are dropped (some, not all), and the velocity, loss and every
    gradient (the mask token's included) agree; the mask token really enters (changing it changes
    the loss)."""
    cfg = dataclasses.replace(TINY, name="tiny-n1.6-mask", vl_layers=0, state_dropout=0.5, action_horizon=4,
                              state_mask_token=True)
    up, ours, drawn = make_n16_mask_token_pair(oracle, cfg)
    assert tuple(ours.action_head.state_mask_token.shape) == (1, 1, cfg.input_embedding_dim)
    batch = make_inputs(cfg)
    res = train_step_equals_upstream(oracle, up, ours, batch, "N1.6 mask token, train")  # seed 5: drops sample 1
    drop = drawn["drop"]
    assert bool(drop.any()) and not bool(drop.all()), drop
    assert ours.action_head.state_mask_token.grad.abs().max() > 0
    # the dropped samples see the mask token: another token value gives another loss (a random
    # change: a constant one would vanish in the LayerNorms)
    with torch.no_grad():
        ours.action_head.state_mask_token.add_(torch.randn(1, 1, cfg.input_embedding_dim))
    torch.manual_seed(5)
    assert ours(batch)["loss"].item() != res["loss"].item()
    # forced drops (batch["state_drop"]) use the same token; forcing none equals dropout off
    ours.eval()
    forced = ours(dict(batch, state_drop=torch.zeros(3)))["loss"]
    assert torch.equal(forced, ours(batch)["loss"])


def test_n16_additive_state_noise_equals_upstream_with_the_same_draws(oracle):
    """N1.6's state_additive_noise_scale 0.3 beside state dropout 0.5: in train mode, seeded alike,
    velocity, loss and every gradient agree with the transcribed upstream steps; the noise really
    enters (the same seed without it gives another loss) and only in train mode."""
    cfg = dataclasses.replace(TINY, name="tiny-n1.6-noise", vl_layers=0, state_dropout=0.5, action_horizon=4,
                              state_mask_token=True, state_noise_scale=0.3)
    up, ours, _ = make_n16_mask_token_pair(oracle, cfg)
    batch = make_inputs(cfg)
    res = train_step_equals_upstream(oracle, up, ours, batch, "N1.6 additive state noise, train")
    ours.state_noise_scale = 0.0
    torch.manual_seed(5)
    assert ours(batch)["loss"].item() != res["loss"].item()
    ours.eval()
    quiet = ours(batch)["loss"]
    ours.state_noise_scale = 0.3
    assert torch.equal(ours(batch)["loss"], quiet)


def test_full_width_few_layers_equals_upstream(oracle):
    """N1.7 widths (backbone 2048, DiT 32 x 48, vl_self_attention 32 x 64, hidden 1024, state/action
    dims 132) with 3 DiT blocks (text, self, image), 1 vl_self_attention block, 2 embodiments and
    horizon 8 (the widths are what this adds over the tiny shapes)."""
    cfg = get_head_config("gr00t-n1.7-3b", dit_layers=3, vl_layers=1, num_embodiments=2, action_horizon=8)
    fwd, loss, (grad, where) = compare(oracle, cfg, train=True, std=0.02, constant_only=True)
    print(f"\n[full width, train] max rel diff: forward {fwd:.2e}, loss {loss:.2e}, grad {grad:.2e} ({where})")
    assert fwd <= FWD_RTOL and loss <= FWD_RTOL and grad <= GRAD_RTOL, (fwd, loss, grad, where)


def test_a_wrong_mapping_is_caught(oracle):
    """The equivalence check is sharp: a transposed (square) weight breaks it."""
    up, ours, _ = make_pair(oracle, TINY)
    with torch.no_grad():
        w = ours.action_head.blocks[1].attn.q.weight
        w.copy_(w.t().clone())
    batch = make_inputs(TINY)
    up.eval()
    ours.eval()
    loss_up, pred_up = run_upstream(oracle, up, batch)
    assert rel(ours(batch)["pred_velocity"], pred_up) > 1e-3


def test_scripted_head_equals_eager_also_with_seeded_dropout():
    """The TorchScript head (what export.py writes) computes the eager head's numbers, dropout
    draws included, so the upstream equality above carries over to the exported file."""
    torch.manual_seed(0)
    head = build_head(TINY)
    scripted = torch.jit.script(head)
    batch = make_inputs(TINY)
    for train in (False, True):
        head.train(train)
        scripted.train(train)
        torch.manual_seed(7)
        a = head(batch)
        torch.manual_seed(7)
        b = scripted(batch)
        assert torch.equal(a["loss"], b["loss"]) and torch.equal(a["pred_velocity"], b["pred_velocity"]), train


@pytest.mark.parametrize("name", ["gr00t-n1.7-3b", "gr00t-n1.6-3b"])
def test_full_size_tensors_match_upstream_exactly(oracle, name):
    """Full default shapes on the meta device: every upstream tensor maps to one of ours with the same
    shape, nothing is left over, and the parameter counts are equal."""
    cfg = get_head_config(name)
    with torch.device("meta"):
        up = oracle.n17.GR00TN17ActionHead(upstream_config(oracle, cfg))
    ours = build_head(cfg, torch.device("meta"))
    up_t = upstream_tensors(up)
    ours_shapes = {n: p.shape for n, p in ours.state_dict().items()}
    mapped = {ckpt_names.to_loongforge(n): tuple(t.shape) for n, t in up_t.items()}
    assert "" not in mapped
    assert mapped == {n: tuple(s) for n, s in ours_shapes.items()}
    assert param_count(ours) == param_count(up)
    if name == "gr00t-n1.7-3b":
        # upstream's default config, untouched, builds the same head
        with torch.device("meta"):
            default = oracle.n17.GR00TN17ActionHead(oracle.n17.GR00TN17Config())
        assert param_count(default) == param_count(ours)
        print(f"\n{name}: {param_count(ours) / 1e6:.3f} M parameters (upstream {param_count(default) / 1e6:.3f} M)")
