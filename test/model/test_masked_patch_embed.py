# loongforge::masked_patch_embed (include/loongforge/ops/ops.hpp, issue #46 item 1) against plain
# tensor ops, on LOONGFORGE_TEST_DEVICE (cpu here; cuda in the gpu-labelled form):
# - each image of a padded micro-batch gets what F.conv2d gives that image alone with its pixels
#   outside its valid region zeroed, and zero tokens (no bias) where a patch has no valid pixel;
# - gradcheck in float64 for images, weight and bias, over images of different valid sizes;
# - edge cases: an all-masked image, a 1 x N grid, the largest aspect ratio (one row of pixels);
# - an image's tokens do not depend on the grid it is padded into;
# - bad arguments are refused naming the argument;
# - TorchScript calls it (an exported model can), and torch.export sees ATen ops, not the op
#   (a compiled package runs no opaque call).
import os

import pytest
import torch
import torch.nn.functional as F

from model import ops

ops.load()
DEVICE = torch.device(os.environ.get("LOONGFORGE_TEST_DEVICE", "cpu"))
op = torch.ops.loongforge.masked_patch_embed


def reference(images, weight, bias, valid):
    """Per image: zero outside its valid region, conv2d with stride p, zero the tokens of patches without a
    valid pixel."""
    p = weight.shape[2]
    outs = []
    for img, (h, w) in zip(images, valid.tolist()):
        masked = torch.zeros_like(img)
        masked[:, :h, :w] = img[:, :h, :w]
        tok = F.conv2d(masked[None], weight, bias, stride=p)[0]           # (D, gh, gw)
        keep = torch.zeros(tok.shape[1:], dtype=tok.dtype, device=tok.device)
        keep[:(h + p - 1) // p, :(w + p - 1) // p] = 1
        outs.append((tok * keep).flatten(1).t())                          # (gh * gw, D)
    return torch.stack(outs)


def case(N=3, C=3, H=12, W=16, p=4, D=5, valid=((12, 16), (7, 9), (4, 13)), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(N, C, H, W, generator=g, dtype=dtype).to(DEVICE)
    weight = torch.randn(D, C, p, p, generator=g, dtype=dtype).to(DEVICE)
    bias = torch.randn(D, generator=g, dtype=dtype).to(DEVICE)
    return images, weight, bias, torch.tensor(valid, dtype=torch.long, device=DEVICE)


def test_each_image_gets_its_own_conv2d_with_the_padding_zeroed_and_empty_patches_zero():
    images, weight, bias, valid = case()
    got = op(images, weight, bias, valid)
    assert got.shape == (3, 12, 5)
    torch.testing.assert_close(got, reference(images, weight, bias, valid), rtol=1e-5, atol=1e-5)
    # the second image (7 x 9 pixels of 12 x 16) has tokens in 2 of 3 patch rows and 3 of 4 patch columns
    nonzero = got[1].abs().sum(1).reshape(3, 4) > 0
    assert nonzero.tolist() == [[True, True, True, False], [True, True, True, False], [False] * 4]


def test_gradients_pass_gradcheck_in_float64():
    images, weight, bias, valid = case(N=2, C=2, H=6, W=9, p=3, D=3, valid=((6, 9), (4, 2)), dtype=torch.float64)
    for t in (images, weight, bias):
        t.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b, c: op(a, b, c, valid), (images, weight, bias))


def test_the_gradients_are_the_references_and_padding_gets_none():
    images, weight, bias, valid = case()
    ours = [t.clone().requires_grad_(True) for t in (images, weight, bias)]
    theirs = [t.clone().requires_grad_(True) for t in (images, weight, bias)]
    up = torch.randn(3, 12, 5, device=DEVICE)
    (op(*ours, valid) * up).sum().backward()
    (reference(*theirs, valid) * up).sum().backward()
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
    assert ours[0].grad[1, :, 7:, :].abs().sum() == 0 and ours[0].grad[1, :, :, 9:].abs().sum() == 0


@pytest.mark.parametrize("name,shape,valid", [
    ("an all-masked image", (2, 3, 8, 8, 4), ((8, 8), (0, 0))),
    ("a 1 x N grid", (2, 3, 4, 40, 4), ((4, 40), (4, 17))),
    ("the largest ratio", (2, 3, 32, 32, 4), ((1, 32), (32, 1))),
])
def test_edge_cases_equal_the_reference(name, shape, valid):
    N, C, H, W, p = shape
    images, weight, bias, valid = case(N=N, C=C, H=H, W=W, p=p, valid=valid)
    images.requires_grad_(True)
    got = op(images, weight, bias, valid)
    torch.testing.assert_close(got, reference(images.detach(), weight, bias, valid), rtol=1e-5, atol=1e-5)
    got.sum().backward()
    if name == "an all-masked image":
        assert got[1].abs().sum() == 0 and images.grad[1].abs().sum() == 0  # no token, no bias, no gradient


def test_an_images_tokens_do_not_depend_on_the_grid_it_is_padded_into():
    """Bit for bit on the CPU; on a GPU within 1e-5 (H100, 2026-12-07: the padded grid's GEMM sums in another
    order than the image's own, 1.4e-6 apart at most), the padding's tokens exactly 0 on both."""
    tol = 0 if DEVICE.type == "cpu" else 1e-5
    images, weight, bias, _ = case(N=1, H=8, W=12)
    alone = op(images, weight, bias, torch.tensor([[8, 12]], device=DEVICE))        # its own 2 x 3 patches
    big = torch.randn(2, 3, 16, 20, device=DEVICE)
    big[0, :, :8, :12] = images[0]
    padded = op(big, weight, bias, torch.tensor([[8, 12], [16, 20]], device=DEVICE))
    grid = padded[0].reshape(4, 5, -1)
    torch.testing.assert_close(grid[:2, :3].reshape(6, -1), alone[0], rtol=tol, atol=tol)
    assert grid[2:].abs().sum() == 0 and grid[:, 3:].abs().sum() == 0


@pytest.mark.parametrize("what,args,message", [
    ("images", lambda i, w, b, v: (i[0], w, b, v), "images must be (N, C, H, W)"),
    ("grid", lambda i, w, b, v: (i[..., :10], w, b, v), "must be whole patches of 4 x 4"),
    ("valid", lambda i, w, b, v: (i, w, b, v.int()), "valid must be an (N, 2) int64 tensor"),
    ("bias", lambda i, w, b, v: (i, w, b[:2], v), "bias must be (D,) = (5)"),
    ("channels", lambda i, w, b, v: (i[:, :2], w, b, v), "images have 2 channels, weight expects 3"),
])
def test_bad_arguments_are_refused_naming_the_argument(what, args, message):
    with pytest.raises(RuntimeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        op(*args(*case()))


def test_torchscript_calls_it_and_torch_export_sees_aten_ops():
    images, weight, bias, valid = case()

    @torch.jit.script
    def embed(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return torch.ops.loongforge.masked_patch_embed(images, weight, bias, valid)

    assert torch.equal(embed(images, weight, bias, valid), op(images, weight, bias, valid))

    class M(torch.nn.Module):
        def forward(self, images, weight, bias, valid):
            return op(images, weight, bias, valid)

    graph = str(torch.export.export(M(), (images, weight, bias, valid)).run_decompositions().graph)
    assert "masked_patch_embed" not in graph, graph
    assert "aten.mm" in graph or "aten.bmm" in graph, graph
