"""GR00T's per-embodiment layers (CategorySpecificLinear / CategorySpecificMLP),
shared by model/n16.py and the upstream-exact head in model/gr00t_head.py: one
weight (E, in, out) and bias (E, out) per layer, slot ids[b] for batch row b.

Note [Grouped embodiment linear]
Upstream computes bmm(x, W[ids]): it gathers B copies of the (in, out) weight
(for n16-1b's 7 layers at batch 32 that is 173 M elements gathered, cast to
bf16, and scattered back into the weight gradient) although a batch holds only a
few distinct embodiments. On CUDA under bf16 autocast the layer instead sorts
the rows by slot and runs one grouped GEMM over the slots (ATen's
torch._grouped_mm, CUTLASS on sm90, group offsets on the device: no host
synchronisation), so each used weight is read once and the weight gradient is
one grouped GEMM. It computes the same function: on the CPU (float32) both
paths give the same forward exactly and the same gradients within float32
rounding (test/model/test_embodiment.py); on the GPU within bf16 tolerance
(test/model/test_embodiment_gpu.py). Elsewhere (CPU, float32 CUDA, shapes the
grouped kernel does not take) the layer keeps upstream's gather.
"""
import torch
import torch.nn.functional as F
from torch import Tensor, nn


def grouped_path_applies(x: Tensor, weight: Tensor) -> bool:
    """The grouped GEMM path runs on CUDA under autocast (bf16 operands) when in and out
    are multiples of 8 (the kernel's 16-byte row alignment)."""
    return (x.is_cuda and torch.is_autocast_enabled() and weight.shape[1] % 8 == 0
            and weight.shape[2] % 8 == 0)


def category_linear_grouped(x: Tensor, ids: Tensor, weight: Tensor, bias: Tensor, dtype: torch.dtype) -> Tensor:
    """bmm(x, weight[ids]) + bias[ids] as one grouped GEMM (Note [Grouped embodiment linear]).

    x (B, T, in), ids (B,) int64, weight (E, in, out), bias (E, out) -> (B, T, out), with the
    GEMM's operands in `dtype` (bf16 under autocast, as upstream's autocast bmm) and the bias
    added after it (type promotion as in upstream's bmm + bias)."""
    B, T, K = x.shape[0], x.shape[1], x.shape[2]
    E, N = weight.shape[0], weight.shape[2]
    order = torch.argsort(ids, stable=True)                                       # (B,) rows by slot
    slots = torch.arange(E, device=ids.device, dtype=ids.dtype)                   # (E,)
    rows = (ids.unsqueeze(1) == slots.unsqueeze(0)).sum(0)                        # (E,) rows per slot
    offs = (torch.cumsum(rows, 0) * T).to(torch.int32)                            # (E,) end row of each group
    xs = x.index_select(0, order).reshape(B * T, K).to(dtype)            # (B*T, in) grouped by slot
    ys = torch._grouped_mm(xs, weight.to(dtype), offs)                   # (B*T, out)
    inverse = torch.argsort(order)                                                # (B,) back to batch order
    y = ys.view(B, T, N).index_select(0, inverse)                                 # (B, T, out)
    return y + bias.index_select(0, ids).unsqueeze(1)


class CategoryLinear(nn.Module):
    """One linear layer per embodiment: weight (E, in, out), bias (E, out).

    forward(x (B, T, in), ids (B,)) -> (B, T, out) using slot ids[b] for row b."""

    def __init__(self, num_categories: int, dim_in: int, dim_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_categories, dim_in, dim_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(num_categories, dim_out))

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        if grouped_path_applies(x, self.weight):
            return category_linear_grouped(x, ids, self.weight, self.bias, torch.bfloat16)
        w = self.weight[ids]                    # (B, in, out)
        b = self.bias[ids]                      # (B, out)
        return torch.bmm(x, w) + b.unsqueeze(1)


class CategoryMLP(nn.Module):
    """in -> hidden (ReLU) -> out, per embodiment (GR00T's CategorySpecificMLP)."""

    def __init__(self, num_categories: int, dim_in: int, hidden: int, dim_out: int):
        super().__init__()
        self.layer1 = CategoryLinear(num_categories, dim_in, hidden)
        self.layer2 = CategoryLinear(num_categories, hidden, dim_out)

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        return self.layer2(F.relu(self.layer1(x, ids)), ids)
