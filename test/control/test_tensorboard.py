"""Observability of a run: the TensorBoard event file loongforge-train writes
natively is read back by the tensorboard package's own reader (record CRCs
checked) and its scalars equal metrics.jsonl step for step; plot_metrics.py
renders loss and throughput PNGs from the run directory.
"""
import json
import subprocess
import sys
from pathlib import Path

from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2  # noqa: F401  (the reader yields these)

from trainer_harness import REPO, Trainer

STEPS = 12


def run_short(tmp_path):
    t = Trainer(tmp_path, steps=STEPS)
    assert t.proc.wait(timeout=300) == 0, t.output()
    t.kill()
    return t.run_dir


def test_event_file_scalars_equal_metrics_jsonl(tmp_path):
    run = run_short(tmp_path)
    files = list((run / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1
    loader = event_file_loader.RawEventFileLoader(str(files[0]), detect_file_replacement=False)
    raw = list(loader.Load())
    assert len(raw) == 1 + STEPS  # the file_version record, then one per step
    events = [event_pb2.Event.FromString(r) for r in raw]
    assert events[0].file_version == "brain.Event:2"
    metrics = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e.step for e in events[1:]] == [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for e, m in zip(events[1:], metrics):
        values = {v.tag: v.simple_value for v in e.summary.value}
        assert {"train/loss", "train/lr", "train/grad_norm", "perf/samples_per_s", "perf/tokens_per_s", "perf/mfu",
                "perf/data_wait_ms", "perf/exposed_comm_ms", "memory/peak_mem_mb"} <= set(values)
        for tag, v in values.items():
            key = tag.split("/", 1)[1]
            assert abs(v - m[key]) <= 1e-6 * max(1.0, abs(m[key])), (tag, v, m[key])  # float32 in the file
        assert e.wall_time > 1.7e9


def test_the_event_file_loads_through_tensorboards_multiplexer(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator
    run = run_short(tmp_path)
    acc = event_accumulator.EventAccumulator(str(run / "tb"))
    acc.Reload()
    tags = acc.Tags()["tensors"] or acc.Tags()["scalars"]
    assert "train/loss" in tags


def test_plot_metrics_renders_loss_and_throughput_pngs_from_a_run_directory(tmp_path):
    run = run_short(tmp_path)
    r = subprocess.run([sys.executable, str(REPO / "scripts/plot_metrics.py"), str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for name in ("loss.png", "throughput.png"):
        png = (run / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert "samples/s" in r.stdout
