# loongforge::category_linear (include/loongforge/ops/ops.hpp, issue #11 item 4) on the CPU:
# - it equals GR00T's gather + bmm exactly in float32, forward and every gradient, for
#   batches with one, some and all-distinct embodiment ids (unused slots get zero gradients);
# - bad arguments are refused with a message naming the argument;
# - an n16-tiny built with category_linear=grouped has the gather model's parameters and
#   loss, and its gradients within 1e-6 relative, also as the TorchScript module export.py
#   writes (the gather model's weight gradients themselves differ between two backward passes
#   of one process by up to 1e-7 relative on this CPU: measured, MKL_CBWR=COMPATIBLE too).
# The bf16 segment GEMMs on a GPU: test_category_linear_gpu.py (label gpu).
import pytest
import torch

import model
from model import ops
from model.batch import example_batch
from model.embodiment import CategoryLinear, GroupedCategoryLinear

ops.load()


def layer_and_input(E=6, B=9, T=4, dim_in=10, dim_out=7, ids=None, seed=0):
    torch.manual_seed(seed)
    ref = CategoryLinear(E, dim_in, dim_out)
    with torch.no_grad():
        ref.bias.normal_()
    x = torch.randn(B, T, dim_in, requires_grad=True)
    if ids is None:
        ids = torch.randint(0, E, (B,))
    return ref, GroupedCategoryLinear.sharing(ref), x, ids


@pytest.mark.parametrize("ids", [[2] * 9, [4, 1, 4, 4, 0, 1, 4, 0, 1], [8, 7, 6, 5, 4, 3, 2, 1, 0]],
                         ids=["one id", "three ids", "all distinct"])
def test_the_op_equals_the_gather_and_bmm_exactly_in_float32(ids):
    ids = torch.tensor(ids)
    ref, grouped, x, ids = layer_and_input(E=9, ids=ids)
    y_ref, y = ref(x, ids), grouped(x, ids)
    assert torch.equal(y, y_ref)
    g = torch.randn_like(y_ref)
    want = torch.autograd.grad(y_ref, [x, ref.weight, ref.bias], g)
    got = torch.autograd.grad(y, [x, ref.weight, ref.bias], g)
    for name, a, b in zip(["x", "weight", "bias"], got, want):
        assert torch.equal(a, b), name
    unused = sorted(set(range(9)) - set(ids.tolist()))
    if unused:
        assert got[1][unused].abs().max() == 0 and got[2][unused].abs().max() == 0


def test_the_backward_op_is_what_autograd_calls():
    ref, grouped, x, ids = layer_and_input()
    g = torch.randn(x.shape[0], x.shape[1], ref.weight.shape[2])
    gx, gw, gb = torch.ops.loongforge.category_linear_backward(g, x.detach(), ref.weight.detach(), ids)
    y = grouped(x, ids)
    want = torch.autograd.grad(y, [x, ref.weight, ref.bias], g)
    assert torch.equal(gx, want[0]) and torch.equal(gw, want[1]) and torch.equal(gb, want[2])


def test_bad_arguments_are_refused_naming_the_argument():
    ref, _, x, ids = layer_and_input()
    op = torch.ops.loongforge.category_linear
    with pytest.raises(RuntimeError, match="ids must be a \\(B,\\) int64"):
        op(x, ref.weight, ref.bias, ids.int())
    with pytest.raises(RuntimeError, match="ids has 3 entries for a batch of 9"):
        op(x, ref.weight, ref.bias, ids[:3])
    with pytest.raises(RuntimeError, match="x has 9 features, weight expects 10"):
        op(x[..., :9], ref.weight, ref.bias, ids)
    with pytest.raises(RuntimeError, match="bias must be \\(E, out\\)"):
        op(x, ref.weight, ref.bias[:, :3], ids)
    with pytest.raises(RuntimeError, match="x is BFloat16 but weight is Float"):
        op(x.bfloat16(), ref.weight, ref.bias, ids)
    with pytest.raises(IndexError):
        op(x, ref.weight, ref.bias, torch.full_like(ids, 6))      # slot 6 of 6: out of range


def tiny(kind: str):
    torch.manual_seed(0)
    return model.build_model(model.apply_overrides(model.get_config("n16-tiny"), [f"category_linear={kind}"]))


def test_a_grouped_model_has_the_gather_models_parameters_loss_and_gradients():
    gather, grouped = tiny("gather"), tiny("grouped")
    assert [n for n, _ in gather.named_parameters()] == [n for n, _ in grouped.named_parameters()]
    assert any(isinstance(m, GroupedCategoryLinear) for m in grouped.modules())
    for (n, p), (_, q) in zip(gather.named_parameters(), grouped.named_parameters()):
        assert torch.equal(p, q) and p.requires_grad == q.requires_grad, n
    cfg = model.get_config("n16-tiny")
    batch = example_batch(cfg, 6, seed=1)
    batch["embodiment_id"] = torch.tensor([0, 3, 3, 1, 0, 3])
    scripted = torch.jit.script(grouped)
    losses = []
    for m in (gather, grouped, scripted):
        loss = m(batch)["loss"]
        grads = torch.autograd.grad(loss, [p for p in m.parameters() if p.requires_grad])
        losses.append((loss, grads))
    for loss, grads in losses[1:]:
        assert torch.equal(loss, losses[0][0])
        for a, b in zip(grads, losses[0][1]):
            assert ((a - b).norm() / b.norm().clamp(min=1e-30)).item() <= 1e-6
