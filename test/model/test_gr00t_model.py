"""The gr00t-* model configs (n16 backbone + the upstream-exact head of
model/gr00t_head.py) fit the trainer's contract like n16-*: export.py writes
them with consistent metadata, the TorchScript file computes what the eager
module computes (loss and every gradient), freezing leaves gradients on exactly
the trainable parameters, the head's vision/text split follows the vision
tokens, the analytic FLOPs equal torch's count of the real forward and
backward, and a bad head name is refused naming the field."""
import json

import pytest
import torch

import model
from model import export
from model.batch import example_batch
from model.flops import flops_per_sample
from model.gr00t import Gr00tModel
from test_flops import measured_flops  # test/model is on pytest's path


def test_gr00t_configs_build_the_gr00t_model_with_n16_child_names():
    m = model.build_model(model.get_config("gr00t-tiny"), torch.device("meta"))
    assert isinstance(m, Gr00tModel)
    assert {n.split(".", 1)[0] for n, _ in m.named_parameters()} == {
        "vision", "connector", "llm", "action_head", "embodiment"}
    roles = {model.param_role(n) for n, _ in m.named_parameters()}
    assert roles == {"vision", "llm", "action", "embodiment"}


def test_export_of_gr00t_tiny_round_trips_and_trains_like_the_eager_module(tmp_path):
    out = tmp_path / "gr00t-tiny.pt"
    files = export.export("gr00t-tiny", str(out), seed=0)
    extras = {k: "" for k in files}
    scripted = torch.jit.load(str(out), _extra_files=extras)
    cfg = model.ModelConfig.from_json(extras["loongforge/config.json"])
    assert cfg.gr00t_head == "gr00t-tiny"
    params = json.loads(extras["loongforge/params.json"])
    assert [p["name"] for p in params] == [n for n, _ in scripted.named_parameters()]
    counts = json.loads(extras["loongforge/counts.json"])
    assert counts["total"] == sum(p.numel() for p in scripted.parameters())

    torch.manual_seed(0)
    eager = model.build_model(cfg)
    batch = example_batch(cfg, 2, seed=3)
    scripted.eval()
    eager.eval()
    a, b = eager(batch), scripted(batch)
    assert torch.equal(a["loss"], b["loss"]) and torch.equal(a["pred_velocity"], b["pred_velocity"])
    a["loss"].backward()
    b["loss"].backward()
    by_name = dict(scripted.named_parameters())
    for n, p in eager.named_parameters():
        assert (p.grad is None) == (not p.requires_grad), n
        if p.requires_grad:
            # autograd of the scripted graph may sum a reused tensor's gradients in another order
            torch.testing.assert_close(by_name[n].grad, p.grad, rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("overrides", [
    {},
    {"tune_visual": True, "tune_llm": True},
    {"num_views": 2, "action_horizon": 8, "max_text_len": 12, "use_imu": True, "use_audio": True},
])
def test_analytic_flops_of_the_gr00t_head_equal_the_counted_flops(overrides):
    cfg = model.get_config("gr00t-tiny", **overrides)
    fwd, bwd = measured_flops(cfg)
    analytic = flops_per_sample(cfg)
    assert (analytic["forward_per_sample"], analytic["backward_per_sample"]) == (fwd, bwd)


def test_vision_tokens_are_the_image_tokens_and_imu_audio_join_the_text_side():
    cfg = model.get_config("gr00t-tiny", use_imu=True, use_audio=True, num_views=2)
    m = model.build_model(cfg).eval()
    batch = example_batch(cfg, 1, seed=0)
    batch["imu"] = torch.randn(1, cfg.imu_len, cfg.imu_channels)
    batch["audio"] = torch.randn(1, cfg.audio_len, cfg.audio_features)
    vl, key_mask, image_mask = m.encode_vl(batch)
    n_img = 2 * cfg.tokens_per_view
    assert vl.shape[1] == cfg.vl_len() and image_mask.shape == key_mask.shape
    assert image_mask[0, :n_img].all() and not image_mask[0, n_img:].any()


def test_unknown_or_misfit_head_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="gr00t_head"):
        model.get_config("gr00t-tiny", gr00t_head="gr00t-n2")
    with pytest.raises(ValueError, match="vl_heads \\* vl_head_dim"):   # 32 x 64 != LM width 128
        model.get_config("gr00t-tiny", gr00t_head="gr00t-n1.7-3b")


def test_sampled_time_is_upstreams_one_minus_beta_times_s():
    cfg = model.get_config("gr00t-tiny")
    m = model.build_model(cfg).eval()
    batch = example_batch(cfg, 2, seed=7)
    torch.manual_seed(5)
    u = torch.rand(2)
    batch["fm_t"] = (1 - u ** (1 / 1.5)) * 0.999
    with torch.no_grad():
        pinned = m(batch)["loss"]
        del batch["fm_t"]
        torch.manual_seed(5)
        sampled = m(batch)["loss"]
    torch.testing.assert_close(pinned, sampled)


def test_dropout_overrides_reach_the_head_and_zero_makes_train_mode_deterministic():
    cfg = model.get_config("gr00t-tiny", gr00t_dropout=0.0, gr00t_state_dropout=0.0)
    m = model.build_model(cfg).train()
    assert m.action_head.blocks[0].dropout == 0.0 and m.state_dropout == 0.0
    batch = example_batch(cfg, 2, seed=1)
    torch.manual_seed(1)
    a = m(batch)["loss"]
    torch.manual_seed(2)
    assert torch.equal(a, m(batch)["loss"])
    assert model.build_model(model.get_config("gr00t-tiny")).action_head.blocks[0].dropout == 0.2


@pytest.mark.parametrize("name", ["gr00t-n1.6-tiny", "gr00t-n1.7-tiny"])
def test_state_dropout_and_noise_given_as_inputs_are_the_heads_own_draws_bit_for_bit(name):
    """What the compiled step relies on (scripts/compile_step.py): a trainer that draws the head's
    state dropout and state noise itself, from the same generator in the head's order
    (model.batch.head_draw_keys), and passes them as state_drop / state_noise gets the loss and
    gradients of the model drawing them in its forward, bit for bit; the draws matter (other drops,
    other loss)."""
    cfg = model.get_config(name, gr00t_dropout=0.0, gr00t_state_dropout=0.5, gr00t_state_noise_scale=0.1)
    from model.batch import head_draw_keys
    assert head_draw_keys(cfg) == ["state_drop", "state_noise"]
    torch.manual_seed(0)
    m = model.build_model(cfg).train()
    batch = example_batch(cfg, 4, seed=2)                      # fm_t, fm_noise given, as the trainers do
    own = {k: v for k, v in batch.items() if k not in ("state_drop", "state_noise")}

    def loss_and_grads(b):
        m.zero_grad()
        loss = m(b)["loss"]
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None]

    torch.manual_seed(11)
    drawn_by_model = loss_and_grads(own)
    torch.manual_seed(11)                                      # the trainer's draws, in the head's order
    drop = (torch.rand(4) < 0.5).float()                       # (B,)
    noise = torch.randn(4, 1, m.action_head.pos_embed.shape[1])  # (B, 1, w)
    assert 0 < drop.sum() < 4                                  # seed 11 drops some samples, not all
    given = loss_and_grads(dict(own, state_drop=drop, state_noise=noise))
    assert torch.equal(drawn_by_model[0], given[0])
    assert all(torch.equal(a, b) for a, b in zip(drawn_by_model[1], given[1]))
    other = loss_and_grads(dict(own, state_drop=1 - drop, state_noise=noise))
    assert not torch.equal(other[0], given[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepstack_added_at_blocks_equals_index_add_bit_for_bit_forward_and_backward(dtype):
    from model.backbones import add_at_blocks, index_blocks
    positions = [0, 1, 2, 5, 6, 9]
    blocks = index_blocks(positions)
    assert blocks == [(0, 3), (5, 2), (9, 1)]
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(2, 11, 4, generator=g).to(dtype)
    s0 = torch.randn(2, len(positions), 4, generator=g).to(dtype)
    up = torch.randn(2, 11, 4, generator=g).to(dtype)
    outs = []
    for f in (lambda x, s: x.index_add(1, torch.tensor(positions), s), lambda x, s: add_at_blocks(x, blocks, s)):
        x, s = x0.clone().requires_grad_(), s0.clone().requires_grad_()
        y = f(x, s)
        (y.float() * up.float()).sum().backward()
        outs.append((y, x.grad, s.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert torch.equal(add_at_blocks(x0, [(0, 11)], x0), x0 + x0)  # one block over the whole sequence
