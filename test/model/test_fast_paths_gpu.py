# GPU form of test_fast_paths.py (label gpu; scripts/dev/gpu/*.sh run it): under CUDA bf16
# autocast the causal LM without a key mask (flash attention, GQA) gives the masked
# LM's hidden states at every real position within bf16 tolerance, and the fused
# RMSNorm kernel equals the written-out one.
import torch

from model.layers import RMSNorm
from test_fast_paths import lm_with_and_without_key_mask, rel

# Registered only with label gpu (ctest -L gpu): without a GPU it fails, it does not skip.
assert torch.cuda.is_available(), "test_fast_paths_gpu.py needs a CUDA GPU (it runs with ctest -L gpu)"
DEV = torch.device("cuda")
BF16_REL = 1e-2


def test_the_unmasked_causal_lm_equals_the_key_masked_lm_in_bf16():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        masked, causal, real = lm_with_and_without_key_mask(DEV, 8)
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
