# GPU form of test_fast_paths.py (label gpu; scripts/gpu/*.sh run it): under CUDA bf16
# autocast the per-embodiment linear takes the grouped-GEMM path (Note [Grouped
# embodiment linear]), which must
# - equal upstream's W[ids] gather + bmm within bf16 tolerance, forward and every
#   gradient, for 1, 4 and 32 distinct slots;
# - make no synchronising CUDA call (sync-debug mode "error") and be capturable in a
#   CUDA graph whose replay gives the eager result;
# and the causal LM without a key mask (flash attention, GQA) must give the masked
# LM's hidden states at every real position within bf16 tolerance.
import pytest
import torch

import model
from model.batch import example_batch
from model.embodiment import CategoryLinear, grouped_path_applies

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEV = torch.device("cuda")
BF16_REL = 1e-2


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def gather_reference(layer: CategoryLinear, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.bmm(x, layer.weight[ids]) + layer.bias[ids].unsqueeze(1)


@pytest.mark.parametrize("distinct", [1, 4, 32])
def test_the_grouped_embodiment_linear_equals_the_gather_in_bf16(distinct):
    torch.manual_seed(distinct)
    layer = CategoryLinear(32, 1024, 512).to(DEV)
    with torch.no_grad():
        layer.bias.normal_()
    ids = (torch.arange(32, device=DEV) % distinct)[torch.randperm(32, device=DEV)]
    x = torch.randn(32, 16, 1024, device=DEV, requires_grad=True)
    g = torch.randn(32, 16, 512, device=DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert grouped_path_applies(x, layer.weight)
        fast = layer(x, ids)
        plain = gather_reference(layer, x, ids)
    assert fast.dtype == plain.dtype
    assert rel(fast, plain) < BF16_REL
    got = torch.autograd.grad(fast, [x, layer.weight, layer.bias], g)
    want = torch.autograd.grad(plain, [x, layer.weight, layer.bias], g)
    for name, a, b in zip(("x", "weight", "bias"), got, want):
        assert rel(a, b) < BF16_REL, name


def test_the_grouped_embodiment_linear_never_synchronises_and_replays_in_a_cuda_graph():
    torch.manual_seed(0)
    layer = CategoryLinear(32, 256, 128).to(DEV)
    x = torch.randn(32, 16, 256, device=DEV, requires_grad=True)
    ids = torch.randint(0, 32, (32,), device=DEV)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x, ids)
        y.float().square().mean().backward()
        return y

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()                                            # warm-up: handles, workspaces, .grad buffers
        torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    for p in (x, layer.weight, layer.bias):
        p.grad.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    eager_w = layer.weight.grad.clone()                   # capture does not run the work: this is zero
    graph.replay()
    torch.cuda.synchronize()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = gather_reference(layer, x, ids)
    assert rel(out, want) < BF16_REL
    assert eager_w.abs().max() == 0 and layer.weight.grad.abs().max() > 0


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
