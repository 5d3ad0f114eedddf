"""GR00T's per-embodiment layers (CategorySpecificLinear / CategorySpecificMLP),
shared by model/n16.py and the upstream-exact head in model/gr00t_head.py: one
weight (E, in, out) and bias (E, out) per layer, slot ids[b] for batch row b."""
import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CategoryLinear(nn.Module):
    """One linear layer per embodiment: weight (E, in, out), bias (E, out).

    forward(x (B, T, in), ids (B,)) -> (B, T, out) using slot ids[b] for row b."""

    def __init__(self, num_categories: int, dim_in: int, dim_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_categories, dim_in, dim_out) * 0.02)
        self.bias = nn.Parameter(torch.zeros(num_categories, dim_out))

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
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
