"""Every named config's TorchScript forward and backward copies nothing from
the host to the model's device: such a copy (a tensor made from a Python list
or number, then moved; `x[...] = True` in TorchScript) cannot be captured in a
CUDA graph, so loongforge-train's fast step fell back to eager steps on a GPU
(gr00t-n1.6-3b in session 32: "Cannot copy between CPU and CUDA tensors
during CUDA graph capture", docs/benchmarks.md). Run on the meta device, where
a host tensor meeting a device one is easy to see: a dispatch mode records
every op that copies a host tensor into a device one or mixes a host tensor
of more than 0 dimensions with device ones (a 0-dim host tensor is a scalar
operand on any device, as upstream's own constants are). The step must not
need a device value on the host either (`.item()`, a boolean mask's
indexing: a synchronisation, which a capture refuses too): meta tensors have
no values, so such an op raises here and fails the test."""
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import model
from model.batch import example_batch

COPIES = ("copy_", "_to_copy", "index_put")


class HostToDevice(TorchDispatchMode):
    """ops: those that mix host tensors into device ones (above); called: every op's name."""

    def __init__(self):
        super().__init__()
        self.ops = set()
        self.called = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.called.add(func.__name__.split(".")[0])
        out = func(*args, **(kwargs or {}))
        ins = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        host = [t for t in ins if t.device.type == "cpu"]
        if any(t.device.type == "meta" for t in ins + outs) and any(
                t.dim() > 0 or func.__name__.startswith(COPIES) for t in host):
            self.ops.add(func.__name__)
        return out


# Every named config, and an N1.7 import's chat-template prompt (one view: head, image, text, tail).
CASES = sorted(model.CONFIGS) + [("gr00t-n1.7-tiny", (("chat_template_ids", "1,-1,4,-2,2"),))]  # hashable


@functools.lru_cache(maxsize=None)
def scripted_step(case) -> HostToDevice:
    """One forward and backward of the case's scripted model on the meta device, under HostToDevice."""
    name, overrides = (case, ()) if isinstance(case, str) else case
    cfg = model.get_config(name, **dict(overrides))
    net = torch.jit.script(model.build_model(cfg, torch.device("meta")))
    net.train()
    batch = {k: v.to("meta") for k, v in example_batch(cfg, 2, seed=0).items()}
    mode = HostToDevice()
    with mode:
        net(batch)["loss"].backward()
    return mode


def case_id(c) -> str:
    return c if isinstance(c, str) else c[0] + "-chat-template"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_scripted_step_copies_nothing_from_the_host_to_the_device(case):
    ops = scripted_step(case).ops
    assert not ops, f"{case_id(case)}: host-to-device copies in the step: {sorted(ops)}"


def masked(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0]


def read(x: torch.Tensor) -> torch.Tensor:
    return x * float(x.sum().item())


@pytest.mark.parametrize("f", [masked, read], ids=["boolean-mask", "item"])
def test_a_step_that_reads_a_device_value_on_the_host_fails_the_check(f):
    with pytest.raises(RuntimeError):
        with HostToDevice():
            torch.jit.script(f)(torch.ones(2, device="meta"))


def test_a_list_made_into_a_device_tensor_fails_the_check():
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.0, 2.0]).to(x.device)

    mode = HostToDevice()
    with mode:
        torch.jit.script(f)(torch.ones(2, device="meta"))
    assert mode.ops


# Ops that a compiled package (AOTInductor) could not run: with no C shim they go through its proxy
# executor, which failed on index_add's alpha argument at run time (gr00t-n1.7-3b, bf16, an H100,
# 2026-12-06: "Mismatch between ints consumed and num_ints"); model/backbones.py add_at_blocks replaced it.
PROXY_EXECUTOR_OPS = ("index_add",)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_scripted_step_calls_no_op_a_compiled_package_could_not_run(case):
    bad = scripted_step(case).called.intersection(PROXY_EXECUTOR_OPS)
    assert not bad, f"{case_id(case)}: {sorted(bad)}"
