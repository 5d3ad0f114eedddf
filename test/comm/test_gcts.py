"""GCTS on the CPU (Gloo, several processes, the real binaries): with one
global batch (8 samples), 1, 2 and 4 ranks under the plain path and GCTS's
`simple` and `hybrid` strategies, with and without the sharded optimizer, end
with the same parameters (fp32; the measured maximum relative difference is
printed); switching the strategy mid-run (sent to rank 1, applied by every
rank at one step) changes nothing: bitwise on two ranks; the sharded
optimizer's state gathered from its per-rank files equals the unsharded state;
a sharded checkpoint resumed on 2 -> 4 -> 2 ranks continues the run.

Relative difference of two parameter sets: the largest, over tensors, of
max|a - b| / max|a| (each tensor against its own scale, so elements near zero
do not dominate). Tensors whose scale is below 1e-6 are compared absolutely
(|a - b| <= 1e-6): n16-tiny's attention key biases get a gradient that is zero
in exact arithmetic (softmax ignores a constant added to every key score), so
AdamW turns float rounding into values of ~1e-8 whose relative difference
between any two summation orders is O(1) (measured: up to 1.2 between 1 and 2
ranks on the plain path too).
"""
import json
import os
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_multi_rank import Client, launch, losses, wait_all, wait_socket  # noqa: E402

# LOONGFORGE_GCTS_FAST=1 (the suite's form, comm_gcts): fewer steps and cases; the full form
# (comm_gcts_full, label long) runs every case for 30 steps (the issue asks 50).
FAST = os.environ.get("LOONGFORGE_GCTS_FAST") == "1"
STEPS = 12 if FAST else 30
REL_TOL = 1e-5
SHARDED = ("gcts.enable=true", "gcts.shard_optimizer=true")
# micro-batch 2: global batch 8 = 2 x 4 (1 rank) = 2 x 2 x 2 = 2 x 1 x 4.
BASE = ("trainer.micro_batch_size=2",)


def run(out, world, *sets, name, steps=STEPS):
    accum = 8 // (2 * world)
    wait_all(launch(out, world, *BASE, f"trainer.gradient_accumulation_steps={accum}", *sets, name=name, steps=steps),
             out)
    return out / name


def final(run_dir):
    ckpt = max((run_dir / "checkpoints").iterdir(), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    return ckpt, load_file(str(ckpt / "model.safetensors"))


TINY = 1e-6


def rel_diff(a, b):
    assert list(a) == list(b)
    worst = 0.0
    for k in a:
        scale, d = a[k].abs().max().item(), (a[k] - b[k]).abs().max().item()
        if scale < TINY:
            assert d <= TINY, (k, scale, d)
            continue
        worst = max(worst, d / scale)
    return worst


NOISE = ".attn.k.bias"  # the zero-gradient tensors of the docstring: their moments are rounding noise too


def state_diff(a, b):
    """Max relative difference of optimizer moments per tensor, the key biases' moments left out."""
    assert sorted(a) == sorted(b)
    return max((a[k].flatten() - b[k].flatten()).abs().max().item() / max(a[k].abs().max().item(), 1e-30)
               for k in a if NOISE not in k)


def loss_diff(a, b):
    assert len(a) == len(b)
    return max(abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """1 rank, plain path (GCTS off), accumulation 4."""
    out = tmp_path_factory.mktemp("ref")
    r = run(out, 1, name="plain1")
    return r, final(r)[1], losses(r)


CASES_FAST = [(2, "hybrid", True), (4, "simple", False)]
CASES = CASES_FAST if FAST else [
    # (world, strategy, sharded)
    (1, "hybrid", True),
    (2, "simple", False),
    (2, "hybrid", False),
    (2, "simple", True),
    (2, "hybrid", True),
    (4, "simple", False),
    (4, "hybrid", True),
]


@pytest.mark.parametrize("world,strategy,sharded", CASES)
def test_every_world_size_strategy_and_sharding_ends_with_the_parameters_of_one_rank(reference, tmp_path, world,
                                                                                    strategy, sharded):
    sets = ["gcts.enable=true", f"gcts.comm_strategy={strategy}", f"gcts.shard_optimizer={str(sharded).lower()}"]
    # Small buckets: several buckets and reduce-scatter slices even on n16-tiny.
    sets += ["gcts.bucket_mb=1", "gcts.first_bucket_mb=0.25"]
    r = run(tmp_path, world, *sets, name="gcts")
    _, w = final(r)
    d, dl = rel_diff(reference[1], w), loss_diff(reference[2], losses(r))
    print(f"{world} rank(s), {strategy}, {'sharded' if sharded else 'unsharded'}: {STEPS} steps, max relative "
          f"parameter difference {d:.2e}, loss {dl:.2e} (vs 1 rank, plain)")
    assert d <= REL_TOL and dl <= REL_TOL, (d, dl)
    log = (tmp_path / "rank0.log").read_text()
    assert f"gradient communication {strategy} (GCTS, fp32 reduction" in log
    if sharded and world > 1:
        ckpt, _ = final(r)
        files = json.loads((ckpt / "MANIFEST.json").read_text())["files"]
        shards = sorted(f for f in files if f.startswith("optimizer/"))
        assert shards == [f"optimizer/rank_{i:05d}.safetensors" for i in range(world)]
        total = sum(v.numel() for v in reference[1].values())
        for f in shards:  # each rank holds about 1/world of the moments
            held = load_file(str(ckpt / f))
            n = held["shard.exp_avg"].numel()
            assert 0 < n <= total // world + 1


def test_bf16_reduction_is_close_to_fp32_and_not_equal(reference, tmp_path):
    r = run(tmp_path, 2, "gcts.enable=true", "gcts.reduce_dtype=bf16", name="bf16", steps=10)
    ref10 = reference[2][:10]
    d = loss_diff(ref10, losses(r))
    print(f"2 ranks, hybrid, bf16 reduction: max relative loss difference over 10 steps {d:.2e}")
    assert 0 < d < 1e-2  # the key does something, and something sane


def two_rank_pair(tmp_path, *sets, name):
    """A 2-rank run that switches strategy at step 4 (sent to rank 1) next to one that does not."""
    straight = run(tmp_path / "straight", 2, *sets, "gcts.comm_strategy=hybrid", name=name, steps=20)
    out = tmp_path / "switched"
    procs = launch(out, 2, *BASE, "trainer.gradient_accumulation_steps=2", *sets, "gcts.comm_strategy=hybrid",
                   "trainer.max_steps=20", name=name, steps=20)
    try:
        sock1 = str(out / "ctl1" / "s.sock")
        wait_socket(sock1, procs)
        c = Client(sock1)
        while c.request("status")["result"].get("step", 0) < 3:
            time.sleep(0.05)
        r = c.request("switch-strategy", {"strategy": "simple"})
        assert r["ok"], r
        at = r["result"]["applied_at_step"]
        assert r["result"]["previous"] == "hybrid" and r["result"]["strategy"] == "simple"
        assert at < 20
        # status is republished after the next step (the reply may come first)
        t0 = time.time()
        while not c.request("status")["result"]["strategy"].startswith("simple (GCTS"):
            assert time.time() - t0 < 30
            time.sleep(0.05)
    finally:
        wait_all(procs, out, timeout=300)
    logs = [(out / f"rank{i}.log").read_text() for i in range(2)]
    for log in logs:
        assert f"switch-strategy (from rank 1) applied at step {at}" in log
        assert "gradient communication strategy hybrid -> simple" in log
    return straight, out / name


@pytest.mark.parametrize("sharded", [True] if FAST else [False, True])
def test_switching_strategy_mid_run_changes_nothing(tmp_path, sharded):
    sets = ["gcts.enable=true", "gcts.bucket_mb=1", "gcts.first_bucket_mb=0.25"]
    if sharded:
        sets.append("gcts.shard_optimizer=true")
    straight, switched = two_rank_pair(tmp_path, *sets, name="sw")
    a, b = final(straight)[1], final(switched)[1]
    assert losses(straight) == losses(switched)  # bitwise: with 2 ranks every element is (x + y) / 2
    assert all(a[k].equal(b[k]) for k in a)


def gathered_state(ckpt):
    """Full per-parameter moments assembled from a sharded checkpoint's rank files."""
    opt = json.loads((ckpt / "trainer_state.json").read_text())["optimizer"]
    sh = opt["sharded"]
    chunk, total = sh["chunk"], sh["total"]
    flat = {w: torch.cat([load_file(str(ckpt / f"optimizer/rank_{r:05d}.safetensors"))[f"shard.{w}"]
                          for r in range(sh["world"])]) for w in ("exp_avg", "exp_avg_sq")}
    assert flat["exp_avg"].numel() == total and chunk * sh["world"] >= total
    out = dict(load_file(str(ckpt / "optimizer/rank_00000.safetensors")))
    off = 0
    for name, n in sh["params"]:
        for w in ("exp_avg", "exp_avg_sq"):
            out[f"{name}.{w}"] = flat[w][off:off + n]
        off += n
    return {k: v for k, v in out.items() if not k.startswith("shard.")}


def test_sharded_state_gathered_equals_the_unsharded_state(tmp_path):
    a = run(tmp_path / "u", 2, "gcts.enable=true", name="u", steps=10)
    b = run(tmp_path / "s", 2, *SHARDED, name="s", steps=10)
    ca, cb = final(a)[0], final(b)[0]
    plain = load_file(str(ca / "optimizer/rank_00000.safetensors"))
    gathered = gathered_state(cb)
    assert sorted(plain) == sorted(gathered)
    worst = state_diff(plain, gathered)
    print(f"2 ranks, 10 steps: sharded state gathered vs unsharded state: max relative difference {worst:.2e}")
    assert worst <= REL_TOL
    steps = json.loads((cb / "trainer_state.json").read_text())["optimizer"]["steps"]
    assert set(steps.values()) == {10}


def test_a_sharded_checkpoint_resumed_on_4_then_2_ranks_continues_the_run(tmp_path):
    straight = run(tmp_path / "a", 2, *SHARDED, name="straight", steps=20)
    out = tmp_path / "b"
    common = (*BASE, *SHARDED, "trainer.max_steps=20")
    wait_all(launch(out, 2, *common, "trainer.gradient_accumulation_steps=2", "trainer.steps_per_run=8",
                    name="elastic", steps=20), out)
    logs = wait_all(launch(out, 4, *common, "trainer.gradient_accumulation_steps=1", "trainer.steps_per_run=6",
                           "checkpoint.resume=latest", name="elastic", steps=20), out)
    assert "resuming a checkpoint of 2 rank(s) on 4" in logs
    ckpt14 = out / "elastic/checkpoints/epoch_0_step_14"
    assert sorted(p.name for p in (ckpt14 / "optimizer").iterdir()) == [f"rank_{i:05d}.safetensors" for i in range(4)]
    logs = wait_all(launch(out, 2, *common, "trainer.gradient_accumulation_steps=2", "checkpoint.resume=latest",
                           name="elastic", steps=20), out)
    assert "resuming a checkpoint of 4 rank(s) on 2" in logs
    la, lb = losses(straight), losses(out / "elastic")
    assert len(la) == len(lb) == 20
    assert la[:8] == lb[:8]  # the same run until the first resume
    d, dl = rel_diff(final(straight)[1], final(out / "elastic")[1]), loss_diff(la, lb)
    print(f"sharded, 2 -> 4 -> 2 ranks vs 2 ranks straight (20 steps): max relative parameter difference {d:.2e}, "
          f"loss {dl:.2e}")
    assert d <= REL_TOL and dl <= REL_TOL
    # The state after 20 steps, gathered, matches too.
    ga, gb = gathered_state(final(straight)[0]), gathered_state(final(out / "elastic")[0])
    worst = state_diff(ga, gb)
    print(f"  optimizer state after 20 steps: max relative difference {worst:.2e} (key biases' moments left out)")
    assert worst <= 1e-4
