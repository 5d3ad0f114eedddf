"""GR00T's per-embodiment layers (CategorySpecificLinear / CategorySpecificMLP),
shared by model/n16.py and the upstream-exact head in model/gr00t_head.py: one
weight (E, in, out) and bias (E, out) per layer, slot ids[b] for batch row b.

Two forms with the same parameters (checkpoints move between them): CategoryLinear
gathers B weight slots and runs bmm (upstream's code, the reference);
GroupedCategoryLinear calls loongforge::category_linear (model/ops.py), which on
CUDA with bf16 inputs runs segment GEMMs over the used slots without the gather
(config key category_linear: gather | grouped; group_category_linears swaps them)."""
from typing import List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import ops


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


class GroupedCategoryLinear(CategoryLinear):
    """CategoryLinear through loongforge::category_linear (include/loongforge/ops/ops.hpp); made
    from a CategoryLinear by sharing() (group_category_linears), which loads the operator library."""

    @classmethod
    def sharing(cls, linear: CategoryLinear) -> "GroupedCategoryLinear":
        """A GroupedCategoryLinear holding linear's parameter tensors themselves (no copy)."""
        ops.load()
        grouped = cls.__new__(cls)
        nn.Module.__init__(grouped)
        grouped.weight, grouped.bias = linear.weight, linear.bias
        return grouped

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        return torch.ops.loongforge.category_linear(x, self.weight, self.bias, ids)


def group_category_linears(model: nn.Module) -> List[str]:
    """Replaces every CategoryLinear of model by a GroupedCategoryLinear sharing its parameters
    (names, values and requires_grad unchanged); returns the replaced modules' names."""
    replaced = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is CategoryLinear:
                setattr(module, child_name, GroupedCategoryLinear.sharing(child))
                replaced.append(f"{name}.{child_name}" if name else child_name)
    return replaced


class CategoryMLP(nn.Module):
    """in -> hidden (ReLU) -> out, per embodiment (GR00T's CategorySpecificMLP)."""

    def __init__(self, num_categories: int, dim_in: int, hidden: int, dim_out: int):
        super().__init__()
        self.layer1 = CategoryLinear(num_categories, dim_in, hidden)
        self.layer2 = CategoryLinear(num_categories, hidden, dim_out)

    def forward(self, x: Tensor, ids: Tensor) -> Tensor:
        return self.layer2(F.relu(self.layer1(x, ids)), ids)
