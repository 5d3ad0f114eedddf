# Proves that the fast forms of the model's layers (issue #11 item 3) compute
# the same function as the plain forms they replace, on the CPU in float32:
# - the language model without a key mask (causal flash attention with GQA) gives
#   the masked model's hidden states at every real position of right-padded text,
#   and the same n16 loss and gradients;
# - RMSNorm through F.rms_norm equals Qwen3's written-out RMSNorm;
# - RoPE rotating the float32 copy gives exactly Qwen3's values.
# The bf16 forms on a GPU are checked by test_fast_paths_gpu.py (label gpu).
import torch

import model
from model.batch import example_batch
from model.layers import RMSNorm, apply_rope, rope_cos_sin


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def lm_with_and_without_key_mask(device: torch.device, batch_size: int):
    """n16-tiny's LM on a random right-padded batch (under whatever autocast is on), with its
    key mask and without: -> (masked, causal, real), real marking the real positions."""
    torch.manual_seed(0)
    cfg = model.get_config("n16-tiny")
    m = model.build_model(cfg).to(device).eval()
    batch = {k: v.to(device) for k, v in example_batch(cfg, batch_size, seed=3).items()}
    assert not batch["text_mask"].all()                               # some rows are padded
    prefix = torch.randn(batch_size, 16, cfg.llm_width, device=device)
    ones = torch.ones(batch_size, 16, dtype=torch.bool, device=device)
    key_mask = torch.cat([ones, batch["text_mask"]], dim=1)           # (B, S)
    with torch.no_grad():
        masked = m.llm(prefix, batch["text_tokens"], key_mask)
        causal = m.llm(prefix, batch["text_tokens"], None)
    return masked, causal, key_mask.unsqueeze(-1).expand_as(masked)


def test_the_unmasked_causal_lm_equals_the_key_masked_lm_at_every_real_position():
    masked, causal, real = lm_with_and_without_key_mask(torch.device("cpu"), 6)
    assert rel(causal[real], masked[real]) < 1e-6
    assert (causal[~real] - masked[~real]).abs().max() > 1e-3          # padded positions do differ: the test sees them


def test_the_n16_loss_and_gradients_do_not_depend_on_the_lm_key_mask():
    torch.manual_seed(0)
    cfg = model.get_config("n16-tiny", tune_llm=True)
    m = model.build_model(cfg)
    batch = example_batch(cfg, 6, seed=5)

    def loss_and_grads(use_mask: bool):
        original = m.llm.forward
        if use_mask:  # the plain form: LanguageModel with the key mask N16Model used to pass
            key_mask = torch.cat([torch.ones(6, cfg.tokens_per_view, dtype=torch.bool), batch["text_mask"]], 1)
            m.llm.forward = lambda prefix, tokens, _: original(prefix, tokens, key_mask)
        m.zero_grad()
        loss = m(batch)["loss"]
        loss.backward()
        m.llm.forward = original
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    loss_fast, grads_fast = loss_and_grads(False)
    loss_plain, grads_plain = loss_and_grads(True)
    assert abs(loss_fast.item() - loss_plain.item()) <= 1e-6 * abs(loss_plain.item())
    assert grads_fast.keys() == grads_plain.keys() and any(n.startswith("llm.") for n in grads_fast)
    worst = max(rel(grads_fast[n], grads_plain[n]) for n in grads_plain if grads_plain[n].norm() > 0)
    assert worst < 1e-5


def test_rms_norm_equals_the_written_out_qwen3_rms_norm():
    torch.manual_seed(0)
    norm = RMSNorm(96, 1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(4, 7, 96, requires_grad=True)
    ours = norm(x)
    var = x.pow(2).mean(-1, keepdim=True)
    written = norm.weight * (x * torch.rsqrt(var + 1e-6))
    assert rel(ours, written) < 1e-6
    g = torch.randn_like(ours)
    assert rel(torch.autograd.grad(ours, x, g)[0], torch.autograd.grad(written, x, g)[0]) < 1e-6


def test_rope_on_the_float32_copy_gives_qwen3s_bits():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 32).to(torch.bfloat16)
    cos, sin = rope_cos_sin(9, 32, 1e6, x.device)
    half = 16
    qwen3 = (x.float() * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1).float() * sin).to(x.dtype)
    assert torch.equal(apply_rope(x, cos, sin), qwen3)
