# DMF cuts a micro-batch's text slot to a width that still holds its longest
# text (src/engines/dmf). This proves which models allow it: for the n16 family
# and a chat-templated GR00T N1.7 import (batch_spec text_slot_cut) the loss and
# every gradient with the slot cut equal those with the whole slot (fp32, CPU);
# the loss of a GR00T head without a template, and of an N1.6 template (its
# images after the text), moves when the slot is cut, so those models say they
# do not allow it; and the FLOPs the trainer counts for a cut slot are the
# analytic FLOPs of that width.
import dataclasses

import pytest
import torch

import model
from model.batch import batch_spec, example_batch
from model.flops import flops_per_sample


def loss_and_grads(m, batch):
    m.zero_grad(set_to_none=True)
    torch.manual_seed(5)  # the same draws in both runs (the batch carries fm_t and fm_noise)
    out = m(batch)
    out["loss"].backward()
    return out["loss"].detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


def cut(batch, width):
    b = dict(batch)
    b["text_tokens"] = batch["text_tokens"][:, :width].contiguous()
    b["text_mask"] = batch["text_mask"][:, :width].contiguous()
    return b


def build(cfg):
    torch.manual_seed(0)
    m = model.build_model(cfg)
    m.eval()  # no dropout: the two runs differ only by the slot
    return m


N17_TEMPLATE = {"chat_template_ids": "1,-1,4,-2,2"}  # an N1.7 import's prompt: head, image, text, tail
N16_TEMPLATE = {"chat_template_ids": "1,-2,5,-1,2"}  # an N1.6 import's: the text before the image


@pytest.mark.parametrize("name, overrides", [("n16-tiny", {}), ("n16-tiny", {"num_views": 2, "use_imu": True}),
                                             ("gr00t-n1.7-tiny", N17_TEMPLATE)])
def test_a_model_that_allows_the_cut_gives_the_same_loss_and_gradients_with_its_text_slot_cut(name, overrides):
    cfg = model.get_config(name, **overrides)
    assert batch_spec(cfg)["text_slot_cut"] is True
    m = build(cfg)
    batch = example_batch(cfg, 6, seed=3)
    longest = int(batch["text_mask"].sum(1).max())
    assert longest < cfg.max_text_len  # the example has padding to cut
    loss0, grads0 = loss_and_grads(m, batch)
    for width in (longest, (longest + cfg.max_text_len) // 2):
        loss1, grads1 = loss_and_grads(m, cut(batch, width))
        assert torch.allclose(loss1, loss0, rtol=1e-6, atol=0), (width, loss0.item(), loss1.item())
        assert grads1.keys() == grads0.keys()
        for n, g in grads0.items():
            # every gradient within 1e-5 of its own largest element (the bound); atol 1e-10 for the
            # attention key biases, whose exact gradient is 0 (their entries are rounding noise, about 1e-13)
            assert (grads1[n] - g).abs().max().item() <= 1e-5 * g.abs().max().item() + 1e-10, (width, n)


@pytest.mark.parametrize("name", ["gr00t-tiny", "gr00t-n1.6-tiny", "gr00t-n1.7-tiny"])
def test_a_gr00t_model_without_a_template_says_its_result_depends_on_the_slot_and_it_does(name):
    cfg = model.get_config(name)
    assert batch_spec(cfg)["text_slot_cut"] is False
    m = build(cfg)
    batch = example_batch(cfg, 4, seed=1)
    longest = int(batch["text_mask"].sum(1).max())
    loss0, _ = loss_and_grads(m, batch)
    loss1, _ = loss_and_grads(m, cut(batch, longest))
    assert abs(loss1.item() - loss0.item()) > 1e-6 * abs(loss0.item())  # the head attends every pad of the slot


def test_an_n16_template_with_its_images_after_the_text_says_it_does_not_allow_the_cut():
    cfg = model.get_config("gr00t-n1.6-tiny", **N16_TEMPLATE)
    assert batch_spec(cfg)["text_slot_cut"] is False
    batch = example_batch(cfg, 2, seed=1)
    with pytest.raises(IndexError, match="out of bounds"):  # its images' positions are the whole slot's
        build(cfg)(cut(batch, int(batch["text_mask"].sum(1).max())))


@pytest.mark.parametrize("name", ["n16-tiny", "n16-1b", "gr00t-n1.7-3b"])
def test_the_flops_of_each_text_width_are_those_of_the_model_exported_at_that_width(name):
    cfg = model.get_config(name)
    f = flops_per_sample(cfg)
    table = f["by_text_len"]
    assert len(table) == cfg.max_text_len + 1
    assert table[-1] == [f["forward_per_sample"], f["backward_per_sample"]]
    assert table[0] == table[1]  # a batch keeps one text column
    for width in (1, 7, cfg.max_text_len // 2):
        g = flops_per_sample(dataclasses.replace(cfg, max_text_len=width))
        assert table[width] == [g["forward_per_sample"], g["backward_per_sample"]]
    totals = [fw + bw for fw, bw in table]
    assert all(a < b for a, b in zip(totals[1:], totals[2:]))  # each text token costs FLOPs
