# GPU form of test_category_linear.py (label gpu; scripts/dev/gpu/*.sh run it): under CUDA bf16
# autocast loongforge::category_linear's segment GEMMs give, at n16-1b's embodiment shapes and
# with one, four and 32 distinct ids in a batch of 32,
# - the output and the x, weight and bias gradients of the gather + bmm reference computed in
#   float64 from the same bf16-rounded inputs, within bf16 tolerance, and upstream's bf16
#   gather + bmm within the same tolerance; zero gradients for the unused slots;
# - the same with bf16 weights (frozen layers);
# - float32 inputs (no autocast): the gather + bmm composition;
# - inside one CUDA graph, replayed after the ids change in place, what an eager call gives for
#   the new ids (the slot plan is made on the device: nothing of the batch is baked in).
import pytest
import torch

from model import ops
from model.embodiment import CategoryLinear, GroupedCategoryLinear

ops.load()
# Registered only with label gpu (ctest -L gpu): without a GPU it fails, it does not skip.
assert torch.cuda.is_available(), "test_category_linear_gpu.py needs a CUDA GPU (it runs with ctest -L gpu)"
DEV = torch.device("cuda")
BF16_REL = 1e-2
E, B = 32, 32
# (T, in, out): the action encoder's W2, the state encoder's first layer, the decoder's last layer
SHAPES = [(16, 2048, 1024), (1, 64, 1024), (16, 1024, 32)]
MIXES = {"one id": [5] * B, "four ids": [i % 4 * 7 for i in range(B)], "32 ids": list(range(B))[::-1]}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30)).item()


def layer(T, dim_in, dim_out, weight_dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    ref = CategoryLinear(E, dim_in, dim_out).to(DEV)
    with torch.no_grad():
        ref.bias.normal_(std=0.1)
    ref = ref.to(weight_dtype)
    x = torch.randn(B, T, dim_in, device=DEV, requires_grad=True)
    return ref, GroupedCategoryLinear.sharing(ref), x


def float64_reference(x, ref, ids, g):
    """Output and gradients of gather + bmm in float64 from the bf16-rounded x and weights."""
    xd = x.detach().bfloat16().double().requires_grad_()
    wd = ref.weight.detach().bfloat16().double().requires_grad_()
    bd = ref.bias.detach().double().requires_grad_()
    y = torch.bmm(xd, wd[ids]) + bd[ids].unsqueeze(1)
    return [y.detach(), *torch.autograd.grad(y, [xd, wd, bd], g.double())]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T%d-%dx%d" % s)
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["fp32 weights", "bf16 weights"])
def test_the_segment_gemms_equal_the_gather_reference_in_bf16(shape, mix, weight_dtype):
    ref, grouped, x = layer(*shape, weight_dtype=weight_dtype)
    ids = torch.tensor(MIXES[mix], device=DEV)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = grouped(x, ids)
        y_up = ref(x, ids)                                      # upstream's bf16 gather + bmm
    assert y.dtype == weight_dtype
    g = torch.randn(y.shape, device=DEV)
    got = [y, *torch.autograd.grad(y, [x, ref.weight, ref.bias], g.to(y.dtype))]
    want = float64_reference(x, ref, ids, g.to(y.dtype).float())
    for name, a, b in zip(["y", "dx", "dweight", "dbias"], got, want):
        assert rel(a, b) < BF16_REL, name
    assert rel(y, y_up) < BF16_REL
    unused = sorted(set(range(E)) - set(MIXES[mix]))
    if unused:
        assert got[2][unused].abs().max() == 0 and got[3][unused].abs().max() == 0


def test_float32_inputs_run_the_gather_composition():
    ref, grouped, x = layer(16, 1024, 1024)
    ids = torch.tensor(MIXES["four ids"], device=DEV)
    y, y_ref = grouped(x, ids), ref(x, ids)
    assert y.dtype == torch.float32 and rel(y, y_ref) < 1e-6
    g = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, [x, ref.weight, ref.bias], g),
                    torch.autograd.grad(y_ref, [x, ref.weight, ref.bias], g)):
        assert rel(a, b) < 1e-6


def test_a_captured_graph_follows_ids_changed_in_place():
    ref, grouped, x = layer(16, 1024, 1024)
    ids = torch.tensor(MIXES["one id"], device=DEV)
    g = torch.randn(B, 16, 1024, device=DEV)
    params = [x, ref.weight, ref.bias]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = grouped(x, ids)
        return [y, *torch.autograd.grad(y, params, g)]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()                                              # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for mix in ("32 ids", "four ids"):
        ids.copy_(torch.tensor(MIXES[mix], device=DEV))
        graph.replay()
        eager = step()
        for a, b in zip(captured, eager):
            assert rel(a, b) < 1e-6, mix
