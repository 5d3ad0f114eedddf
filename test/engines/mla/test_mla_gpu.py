"""MLA's device allocator on a GPU, through the real binaries (label gpu: the GPU
machine's `ctest -L gpu`; passed on an H100 on 2026-12-06).

- 50 fp32 steps of n16-tiny with mla.enable=true give the caching allocator's
  losses and gradient norms bit for bit (CUDA graphs on, as on any CUDA run);
  MLA made no cudaMalloc after step 1; its statistics are sane (persistent
  bytes held, every category within what is reserved, fragmentation in
  [0, 1], allocation time per step recorded).
- The same with the pools on virtual ranges (mla.virtual_memory=true): bit for
  bit, and no page backed after step 1.
- `loongforge mla-stats` and `status` answer MLA's statistics while it trains,
  the persistent bytes under the trainer's labels ("model", ...).
- A persistent arena too small for the model stops the run with MLA's
  out-of-memory message naming the pool, the request and the arena's key;
  with mla.fallback_cudamalloc=true the same run trains, with its warning.

Environment as in test/control/trainer_harness.py (set by ctest).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "control"))

from trainer_harness import DATA, MODEL, REPO, TRAIN, Trainer, cli, status  # noqa: E402

STEPS = 50
CUDA_FP32 = ["run.device=cuda", "precision.mode=fp32", "run.deterministic=true", "data.shuffle=false"]


def train(out, *sets):
    cmd = [TRAIN, "--config", str(REPO / "configs/n16-tiny.yaml"), "--set", f"model.path={MODEL}",
           "--set", f"data.path={DATA}", "--set", f"run.output_dir={out}", "--set", "logging.progress=off",
           "--set", f"trainer.max_steps={STEPS}", "--set", "checkpoint.interval_steps=1000",
           "--set", "trainer.compiled_step=off"]  # the TorchScript step (the default on CUDA compiles a package)
    for s in [*CUDA_FP32, *sets]:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def records(out):
    return [json.loads(line) for line in (out / "n16-tiny-demo/metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def caching(tmp_path_factory):
    """The caching allocator's run, which both bitwise cases compare with: its records."""
    out = tmp_path_factory.mktemp("caching")
    plain = train(out)
    assert plain.returncode == 0, plain.stderr[-3000:]
    return records(out)


def losses(recs):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in recs]


def test_mla_trains_to_the_caching_allocators_losses_bit_for_bit_with_no_cudamalloc_after_step_1(tmp_path, caching):
    mla = train(tmp_path / "mla", "mla.enable=true")
    assert mla.returncode == 0, mla.stderr[-3000:]
    got = records(tmp_path / "mla")
    assert len(got) == STEPS
    assert losses(got) == losses(caching)
    assert all("mla_fragmentation" not in r for r in caching)  # the caching allocator has no such fields
    last = got[-1]
    assert last["mla_cuda_malloc_after_step_1"] == 0
    assert last["mla_persistent_mb"] > 0  # the model's weights and the optimizer's state
    assert 0 <= last["mla_fragmentation"] <= 1
    assert last["mla_persistent_mb"] + last["mla_activation_mb"] + last["mla_other_mb"] <= last["mla_reserved_mb"]
    assert all(r["mla_alloc_ms"] >= 0 for r in got) and any(r["mla_alloc_ms"] > 0 for r in got)


def test_mla_on_virtual_ranges_trains_bit_for_bit_and_backs_no_page_after_step_1(tmp_path, caching):
    # Note [Backing a segment at a time]: with memory to spare, the blocks of later steps land on pages
    # backed during step 1.
    mla = train(tmp_path / "mla", "mla.enable=true", "mla.virtual_memory=true")
    assert mla.returncode == 0, mla.stderr[-3000:]
    got = records(tmp_path / "mla")
    assert len(got) == STEPS
    assert losses(got) == losses(caching)
    assert got[-1]["mla_cuda_malloc_after_step_1"] == 0


def test_mla_stats_and_status_answer_while_it_trains(tmp_path):
    # the TorchScript step: the default on CUDA compiles a package first (minutes on a fresh machine)
    t = Trainer(tmp_path, *CUDA_FP32, "mla.enable=true", "trainer.compiled_step=off")
    try:
        t.wait_for_socket()
        t.wait_for_step(5)
        s = json.loads(cli("mla-stats", "--socket", t.socket).stdout)
        assert s["allocator"] == "MLA"
        assert set(s["pools"]) == {"persistent", "activation", "other"}
        assert s["in_use_mb"]["persistent"] > 0 and s["reserved_mb"] >= s["allocated_mb"] > 0
        assert s["persistent_mb_by_label"]["model"] > 0  # the trainer's labels (Trainer::open)
        assert abs(sum(s["persistent_mb_by_label"].values()) - s["in_use_mb"]["persistent"]) < 1e-6
        assert s["cuda_malloc_calls"] >= 1 and s["cuda_malloc_calls_after_step_1"] == 0
        assert s["steps"] >= 5 and s["alloc_ms_per_step"]["p99"] >= s["alloc_ms_per_step"]["p50"] >= 0
        for p in s["pools"].values():
            assert 0 <= p["fragmentation"] <= 1 and p["in_use_mb"] <= p["reserved_mb"]
        st = status(t.socket)
        assert st["engines"]["mla"]["state"] == "on" and st["engines"]["mla"]["allocator"] == "MLA"
    finally:
        t.kill()


def test_a_persistent_arena_too_small_is_an_explained_out_of_memory_and_the_fallback_trains(tmp_path):
    small = ["mla.enable=true", "mla.persistent_gb=0.001", "trainer.max_steps=3"]
    r = train(tmp_path / "oom", *small)
    assert r.returncode != 0
    assert "MLA: out of memory: a request of" in r.stderr and "(persistent) does not fit in the persistent pool" in r.stderr
    assert "In use by category: persistent" in r.stderr
    ok = train(tmp_path / "fallback", *small, "mla.fallback_cudamalloc=true")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "served by plain cudaMalloc (mla.fallback_cudamalloc=true)" in ok.stderr
