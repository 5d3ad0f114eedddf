# GPU form of test_fast_paths.py (label gpu; scripts/gpu/*.sh run it): under CUDA bf16
# autocast the causal LM without a key mask (flash attention, GQA) gives the masked
# LM's hidden states at every real position within bf16 tolerance, and the fused
# RMSNorm kernel equals the written-out one.
import pytest
import torch

import model
from model.batch import example_batch
from model.n16 import RMSNorm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEV = torch.device("cuda")
BF16_REL = 1e-2


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def test_the_unmasked_causal_lm_equals_the_key_masked_lm_in_bf16():
    torch.manual_seed(0)
    cfg = model.get_config("n16-tiny")
    m = model.build_model(cfg).to(DEV).eval()
    batch = {k: v.to(DEV) for k, v in example_batch(cfg, 8, seed=3).items()}
    prefix = torch.randn(8, 16, cfg.llm_width, device=DEV)
    key_mask = torch.cat([torch.ones(8, 16, dtype=torch.bool, device=DEV), batch["text_mask"]], dim=1)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        masked = m.llm(prefix, batch["text_tokens"], key_mask)
        causal = m.llm(prefix, batch["text_tokens"], None)
    real = key_mask.unsqueeze(-1).expand_as(masked)
    assert rel(causal[real], masked[real]) < BF16_REL


def test_the_fused_rms_norm_equals_the_written_out_one_in_bf16():
    torch.manual_seed(0)
    norm = RMSNorm(1536, 1e-6).to(DEV)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(32, 96, 1536, device=DEV).to(torch.bfloat16).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ours = norm(x)
    xf = x.float()
    written = norm.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert rel(ours, written) < BF16_REL
    g = torch.randn_like(written)
    assert rel(torch.autograd.grad(ours, x, g.to(ours.dtype))[0], torch.autograd.grad(written, x, g)[0]) < BF16_REL
